/* The fp32 register tile's shape (gemm.c's f32_tile, declared in gemm.h): gemm_int8.c's W8A16 panels take its
 * width, so that a widened panel runs the fp32 tile, and layers_f32.c fuses gate/up where `inter` is a multiple
 * of it. */
#ifndef MINDIE_GEMM_TILE_H
#define MINDIE_GEMM_TILE_H

#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define F32_TILE_NR 16
#define F32_TILE_MR 6

/* 16 rows of kc floats, `stride` apart, into the k-major panel the tile reads: panel[k * 16 + j] = rows[j][k]
 * (gemm_kquant.c's super-block panels, gemm_gguf_tile.c's tiles). With AVX2, 8 x 8 blocks in registers, so kc is
 * a multiple of 8 there. */
static inline void f32_panel_from_rows(const float *rows, int64_t stride, int64_t kc, float *panel) {
#ifdef __AVX2__
    for (int h = 0; h < 2; ++h)
        for (int64_t c = 0; c < kc / 8; ++c) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (8 * h + i) * stride + 8 * c);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; ++i) {
                t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
                t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
            }
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (8 * c + i) * F32_TILE_NR + 8 * h, t[i]);
        }
#else
    for (int64_t k = 0; k < kc; ++k)
        for (int j = 0; j < F32_TILE_NR; ++j) panel[k * F32_TILE_NR + j] = rows[j * stride + k];
#endif
}

#endif
