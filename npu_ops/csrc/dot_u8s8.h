/* Unsigned-by-signed byte dot products into int32 lanes, for the GGUF int8-activation kernels: each int32 lane gets
 * the sum of its 4 byte products u[4l + j] * s[4l + j] added. Where the build has VNNI (AVX512-VNNI with VL, or
 * AVX-VNNI) that is one vpdpbusd; without it, maddubs + madd by ones + add, three operations. The sums are exact
 * integers either way (the kernels' operands keep maddubs' int16 pair sums far from saturation), so both builds give
 * the kernels the same values and the same output bits; tests/unit/test_gguf_vnni.py holds them equal. dot_s16:
 * int16 pair products added into int32 lanes, one vpdpwssd on VNNI, else madd + add (the same exact sums). */
#ifndef MINDIE_DOT_U8S8_H
#define MINDIE_DOT_U8S8_H
#ifdef __AVX2__
#include <immintrin.h>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define GGUF_VNNI 1
/* acc + the 4-byte dot products of u (unsigned) and s (signed) a lane */
static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
}
/* acc + the int16 pair products of a and b a lane (madd + add) */
static inline __attribute__((always_inline)) __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_epi32(acc, a, b);
}
#elif defined(__AVXVNNI__)
#define GGUF_VNNI 1
static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
}
static inline __attribute__((always_inline)) __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_avx_epi32(acc, a, b);
}
#else
#define GGUF_VNNI 0
static inline __attribute__((always_inline)) __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline)) __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#endif

#endif
#endif
