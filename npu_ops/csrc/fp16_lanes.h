/* 4 or 8 blocks' fp16 fields in a vector's lanes (the int8 kernels' weight rows: gemm_gguf_q8.c's and
 * gemm_gguf_q5_q8.c's 4-row passes, gemm_gguf_q4_q8.c's and gemm_gguf_q5_q8.c's 8-row lanes; their scales and, for
 * the types with one, mins): gathered by the integer ports 64 bits at a time, then one conversion each (16 scalar
 * conversions and a store-to-load trip through memory cost more than a lone row's dot products; _mm_setr_epi16's
 * inserts took the vector ports the dot products need). */
#ifndef MINDIE_FP16_LANES_H
#define MINDIE_FP16_LANES_H
#ifdef __AVX2__
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* lane r (r < 4) of the result: the fp16 at p[r]; with_second, lane r of *second: the fp16 after it (untouched
 * without) */
static inline __attribute__((always_inline)) __m128 fp16_lanes4(const uint8_t *p[4], const int with_second,
                                                                __m128 *second) {
    if (!with_second) {
        uint64_t h = 0;
        for (int r = 0; r < 4; ++r) {
            uint16_t u;
            memcpy(&u, p[r], 2);
            h |= (uint64_t)u << (16 * r);
        }
        return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
    }
    uint32_t u[4];
    for (int r = 0; r < 4; ++r) memcpy(u + r, p[r], 4);
    __m256 dm = _mm256_cvtph_ps(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3])); /* d0 m0 d1 m1 ... */
    dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *second = _mm256_extractf128_ps(dm, 1);
    return _mm256_castps256_ps128(dm);
}

/* lane r of *first: the fp16 at p[r]; with_second, lane r of *second: the fp16 after it (else *second = *first) */
static inline __attribute__((always_inline)) void fp16_lanes8(const uint8_t *p[8], const int with_second,
                                                              __m256 *first, __m256 *second) {
    uint64_t h[2] = {0, 0}, m[2] = {0, 0};
    for (int r = 0; r < 8; ++r) {
        uint16_t u[2];
        memcpy(u, p[r], with_second ? 4 : 2);
        h[r / 4] |= (uint64_t)u[0] << (16 * (r % 4));
        if (with_second) m[r / 4] |= (uint64_t)u[1] << (16 * (r % 4));
    }
    *first = _mm256_cvtph_ps(_mm_set_epi64x((long long)h[1], (long long)h[0]));
    *second = with_second ? _mm256_cvtph_ps(_mm_set_epi64x((long long)m[1], (long long)m[0])) : *first;
}
#endif
#endif
