/* Unsigned-by-signed byte dot products into int32 lanes, for the GGUF int8-activation kernels: each int32 lane gets
 * the sum of its 4 byte products u[4l + j] * s[4l + j] added. Where the build has VNNI (AVX512-VNNI with VL, or
 * AVX-VNNI) that is one vpdpbusd; without it, maddubs + madd by ones + add, three operations. The sums are exact
 * integers either way (the kernels' operands keep maddubs' int16 pair sums far from saturation), so both builds give
 * the kernels the same values and the same output bits; tests/unit/test_gguf_vnni.py holds them equal. dot_s16:
 * int16 pair products added into int32 lanes, one vpdpwssd on VNNI, else madd + add (the same exact sums). */
#ifndef MINDIE_DOT_U8S8_H
#define MINDIE_DOT_U8S8_H
#ifndef __AVX2__
#define GGUF_VNNI 0 /* a build without AVX2: the kernels' scalar code */
#else
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

/* From how many rows of x the 8-row lanes kernels (gemm_gguf_q4_q8.c, gemm_kquant_q8_lanes.c) beat the row passes
 * (bandwidth-bound at fewer rows). With VNNI, 3 rows of x run Q4_0 1.5x, Q4_1 1.35x, Q4_K 1.16x, Q5_K 1.27x, Q6_K
 * 0.99x the passes' rate, 2 rows 0.7-1.18x (one Zen 4 core, 2048 x 2048, tools/ab_lanes.py); AVX2's lanes pay from
 * 4. tools/ab_lanes.py builds others (-DGGUF_LANES_ROWS=N). */
#ifndef GGUF_LANES_ROWS
#if GGUF_VNNI
#define GGUF_LANES_ROWS 3
#else
#define GGUF_LANES_ROWS 4
#endif
#endif

/* the 4 bytes at x in every int32 lane: a broadcast load (the load port alone; through a general register it cost
 * two vector operations more) */
static inline __attribute__((always_inline)) __m256i bytes4_bcast(const void *x) {
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *)x));
}

/* The 8-row lanes' half block (gemm_gguf_q4_q8.c, gemm_gguf_q5_q8.c): v[c] lane r holds weight row r's quants
 * 4c..4c+3 (unsigned, at most 31), x the half's 16 int8 values; lane r of the result: row r . x, exact. VNNI: 4
 * vpdpbusd straight to int32; AVX2: the 4 maddubs summed in int16 first (8 products a lane: at most 31 x 127 x 8 =
 * 31496), then one widening madd. */
static inline __attribute__((always_inline)) __m256i lanes_isum16(const __m256i v[4], const int8_t *x) {
#if GGUF_VNNI
    __m256i s = dot_u8s8(_mm256_setzero_si256(), v[0], bytes4_bcast(x));
    for (int c = 1; c < 4; ++c) s = dot_u8s8(s, v[c], bytes4_bcast(x + 4 * c));
    return s;
#else
    __m256i p = _mm256_maddubs_epi16(v[0], bytes4_bcast(x));
    for (int c = 1; c < 4; ++c) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[c], bytes4_bcast(x + 4 * c)));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* The 4-row passes' block (gemm_gguf_q8.c's 4-bit types, gemm_gguf_q5_q8.c): q[r] holds weight row r's 32 quants
 * of a block (unsigned, at most 31; values 0-15 in the low 128-bit lane, 16-31 in the high), xv the block's 32 int8
 * x in the same order; lane r of the result: row r's sum over values 0-15, lane 4 + r: over 16-31, exact. VNNI: a
 * vpdpbusd a row, two levels of hadd_epi32; AVX2: each row's maddubs, their int16 pair sums (at most 31 x 127 x 2 =
 * 7874) added in int16 by two levels of hadd_epi16 (at most 31496) before the one widening madd: 5 multiplies
 * instead of 8. */
static inline __attribute__((always_inline)) __m256i rows4_isum(const __m256i q[4], __m256i xv) {
#if GGUF_VNNI
    const __m256i z = _mm256_setzero_si256();
    const __m256i p01 = _mm256_hadd_epi32(dot_u8s8(z, q[0], xv), dot_u8s8(z, q[1], xv));
    const __m256i p23 = _mm256_hadd_epi32(dot_u8s8(z, q[2], xv), dot_u8s8(z, q[3], xv));
    return _mm256_hadd_epi32(p01, p23);
#else
    const __m256i p01 = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[0], xv), _mm256_maddubs_epi16(q[1], xv));
    const __m256i p23 = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[2], xv), _mm256_maddubs_epi16(q[3], xv));
    return _mm256_madd_epi16(_mm256_hadd_epi16(p01, p23), _mm256_set1_epi16(1));
#endif
}

#endif
#endif
