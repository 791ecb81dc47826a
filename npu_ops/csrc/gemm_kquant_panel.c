/* The 16-row k-major panels gemm_kquant.c's many-row path hands to f32_tile (panel[kk * 16 + j] = W[16p + j, kk]),
 * decoded from GGUF Q4_K / Q5_K / Q6_K super-blocks. With AVX2 the panel is written where it lies, 8 weight rows
 * in a vector's lanes: a quarter or sub-block's 32 quants of each of the 8 rows are put together byte-wise in one
 * register (as gemm_kquant.c's few-row paths do), those 8 registers transposed byte-wise (three unpack stages: 24
 * shuffles for 256 weights), and each element's 8 bytes widened, converted and scaled by the 8 rows' factors (also
 * transposed once a super-block): one vector of the panel, stored once. The old way (each row's super-block decoded
 * into a buffer, then 8 x 8 float transposes) spent more on the decode than a 16-row tile spends on its FMAs.
 * The values are gguf.quants.dequantize's, bit for bit: Q6_K fl(fl(d * sc) * (q - 32)), Q4_K / Q5_K
 * fl(fl(d * sc) * q - fl(dmin * m)) (one fmsub: d * sc * q is exact in fp32, see gemm_kquant.c's scale_min). */
#include <stdint.h>
#include <string.h>

#include "gemm_kquant_panel.h"

#ifdef __AVX2__
#include <immintrin.h>

#include "gemm_tile.h"
#include "kquant_block.h"

#define QK 256
#define NR F32_TILE_NR

/* Where transpose8x32 leaves element e's (0..31) 8 row bytes: register 4X + 2Y + Z of its output, lane L, half u,
 * for e = 16L + 8X + 4Y + 2Z + u (the three unpack stages' order; no lane-crossing fix-up). */
#define POS(e) (128 * (((e) >> 3) & 1) + 64 * (((e) >> 2) & 1) + 32 * (((e) >> 1) & 1) + 16 * ((e) >> 4) + 8 * ((e)&1))

/* r[j] byte e -> out[POS(e) + j]: 8 rows of 32 bytes to 32 elements of 8 bytes. */
static inline __attribute__((always_inline)) void transpose8x32(const __m256i r[8], uint8_t *out) {
    __m256i u[8], v[8];
    for (int p = 0; p < 4; ++p) { /* u[2p + X]: 16-bit units, element 16L + 8X + unit, rows 2p, 2p + 1 */
        u[2 * p] = _mm256_unpacklo_epi8(r[2 * p], r[2 * p + 1]);
        u[2 * p + 1] = _mm256_unpackhi_epi8(r[2 * p], r[2 * p + 1]);
    }
    for (int x = 0; x < 2; ++x)
        for (int q = 0; q < 2; ++q) { /* v[4X + 2Y + q]: 32-bit units, element 16L + 8X + 4Y + unit, rows 4q.. */
            v[4 * x + q] = _mm256_unpacklo_epi16(u[4 * q + x], u[4 * q + 2 + x]);
            v[4 * x + 2 + q] = _mm256_unpackhi_epi16(u[4 * q + x], u[4 * q + 2 + x]);
        }
    for (int xy = 0; xy < 4; ++xy) { /* 64-bit units: element 16L + 8X + 4Y + 2Z + unit, rows 0..7 */
        _mm256_storeu_si256((__m256i *)(out + 64 * xy), _mm256_unpacklo_epi32(v[2 * xy], v[2 * xy + 1]));
        _mm256_storeu_si256((__m256i *)(out + 64 * xy + 32), _mm256_unpackhi_epi32(v[2 * xy], v[2 * xy + 1]));
    }
    /* read back from memory, 8 bytes a load into vpmovsx/zx: kept in registers, gcc extracts them by shuffles */
    __asm__ volatile("" ::: "memory");
}

/* The 8 rows' fp16 at byte `at` of their blocks, as 8 floats (lane j: row j). */
static inline __m256 halves8(const uint8_t *const b[8], int at) {
    uint16_t h[8];
    for (int j = 0; j < 8; ++j) memcpy(h + j, b[j] + at, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Lane j of element e's vector: byte POS(e) + j of t, sign- or zero-extended, as a float (exact). */
static inline __m256 lanes_i8(const uint8_t *t, int e) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(t + POS(e)))));
}
static inline __m256 lanes_u8(const uint8_t *t, int e) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t + POS(e)))));
}

/* Q6_K, 8 rows' super-blocks b[j] into out[e * 16 + j]: quarter i of half h is elements 128h + 32i + l, its quants
 * the low (i < 2) or high nibbles of ql[64h + 32(i & 1) + l] with bits 2i, 2i + 1 of qh[32h + l] above them. */
static void q6k_lanes(const uint8_t *const b[8], float *out) {
    uint8_t t[256] __attribute__((aligned(32)));
    float dsc[16][8] __attribute__((aligned(32)));
    __m256i r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b[j] + 192)));
    transpose8x32(r, t);
    const __m256 d = halves8(b, 208);
    for (int s = 0; s < 16; ++s) _mm256_store_ps(dsc[s], _mm256_mul_ps(d, lanes_i8(t, s)));
    const __m256i nib = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            for (int j = 0; j < 8; ++j) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)(b[j] + 64 * h + 32 * (i & 1)));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b[j] + 128 + 32 * h));
                const __m256i lo = _mm256_and_si256(i < 2 ? a : _mm256_srli_epi16(a, 4), nib);
                const __m256i hi = i == 0   ? _mm256_slli_epi16(qh, 4)
                                   : i == 1 ? _mm256_slli_epi16(qh, 2)
                                   : i == 2 ? qh
                                            : _mm256_srli_epi16(qh, 2);
                r[j] = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hi, two)), off);
            }
            transpose8x32(r, t);
            float *o = out + (128 * h + 32 * i) * NR;
            const float *sc = dsc[8 * h + 2 * i];
#pragma GCC unroll 32
            for (int l = 0; l < 32; ++l)
                _mm256_storeu_ps(o + l * NR, _mm256_mul_ps(_mm256_load_ps(sc + 8 * (l >> 4)), lanes_i8(t, l)));
        }
}

/* Q4_K / Q5_K, 8 rows' super-blocks b[j] into out[e * 16 + j]: sub-block s = 2j' + half is the low (half 0) or high
 * nibbles of qs[32j' + l], Q5_K's fifth bit bit s of qh[l] (qh at byte 16, qs at 48; Q4_K's qs at 16). */
static inline __attribute__((always_inline)) void q45k_lanes(const int five, const uint8_t *const b[8], float *out) {
    uint8_t t[256] __attribute__((aligned(32)));
    float dsc[8][8] __attribute__((aligned(32))), dm[8][8] __attribute__((aligned(32)));
    __m256i r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_castsi128_si256(kq_scales_mins_v(b[j]));
    transpose8x32(r, t);
    const __m256 d = halves8(b, 0), dmin = halves8(b, 2);
    for (int s = 0; s < 8; ++s) {
        _mm256_store_ps(dsc[s], _mm256_mul_ps(d, lanes_u8(t, s)));
        _mm256_store_ps(dm[s], _mm256_mul_ps(dmin, lanes_u8(t, 8 + s)));
    }
    const __m256i nib = _mm256_set1_epi8(0x0F), bit = _mm256_set1_epi8(0x10);
    const int qs = five ? 48 : 16;
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        for (int j = 0; j < 8; ++j) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b[j] + qs + 32 * (s >> 1)));
            r[j] = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(v, 4) : v, nib);
            if (five) { /* bit s of qh[l] to bit 4 of the byte */
                const __m256i h = _mm256_loadu_si256((const __m256i *)(b[j] + 16));
                r[j] = _mm256_or_si256(r[j], _mm256_and_si256(s <= 4 ? _mm256_slli_epi16(h, 4 - s)
                                                                     : _mm256_srli_epi16(h, s - 4), bit));
            }
        }
        transpose8x32(r, t);
        const __m256 sc = _mm256_load_ps(dsc[s]), mn = _mm256_load_ps(dm[s]);
        float *o = out + 32 * s * NR;
#pragma GCC unroll 32
        for (int l = 0; l < 32; ++l) _mm256_storeu_ps(o + l * NR, _mm256_fmsub_ps(sc, lanes_u8(t, l), mn));
    }
}

static void q4k_lanes(const uint8_t *const b[8], float *out) { q45k_lanes(0, b, out); }
static void q5k_lanes(const uint8_t *const b[8], float *out) { q45k_lanes(1, b, out); }
typedef void (*lanes_fn)(const uint8_t *const b[8], float *out);
static const lanes_fn LANES_FNS[3] = {q4k_lanes, q5k_lanes, q6k_lanes};

void kquant_decode_panel(int type, const uint8_t *w, int64_t p, int64_t n_out, int64_t k, float *panel) {
    const int64_t nb = k / QK, bb = KQ_BLOCK_BYTES(type);
    /* a row past n_out reads a block whose every weight is +0 (the old memset's zeros): Q6_K's quants 32 there */
    uint8_t zero[256] = {0};
    if (type == GGUF_KQ_Q6_K) memset(zero + 128, 0xAA, 64);
    for (int64_t i = 0; i < nb; ++i)
        for (int g = 0; g < 2; ++g) {
            const uint8_t *b[8];
            for (int j = 0; j < 8; ++j) {
                const int64_t row = p * NR + 8 * g + j;
                b[j] = row < n_out ? w + (row * nb + i) * bb : zero;
            }
            LANES_FNS[type](b, panel + i * QK * NR + 8 * g);
        }
}
#endif
