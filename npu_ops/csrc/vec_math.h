/* Vector math shared by the CPU kernels. With AVX2, exp256 is Cephes' expf (Cody-Waite reduction,
 * degree-6 polynomial, about 1 ulp) eight lanes at a time: libm's expf is a scalar call per element. */
#ifndef MINDIE_VEC_MATH_H
#define MINDIE_VEC_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* An IEEE half at p (any alignment) as a float: F16C's conversion, or the same value bit by bit. */
static inline float f16_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0 && m == 0) bits = sign;
    else if (e == 0) { /* subnormal: renormalize */
        int s = -1;
        uint32_t mm = m;
        do { ++s; mm <<= 1; } while (!(mm & 0x400));
        bits = sign | ((uint32_t)(112 - s) << 23) | ((mm & 0x3ff) << 13);
    } else if (e == 31) bits = sign | 0x7f800000u | (m << 13);
    else bits = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

#ifdef __AVX2__
#include <immintrin.h>

static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f)); /* 2^n stays normal */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    static const float c[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                              5.0000001201e-1f};
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    for (int i = 0; i < 5; ++i) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c[i]));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
#endif

/* s[0:n] = softmax(s[0:n]) in place (the attention kernels' score rows, fp32 and int8 KV alike). */
static inline void softmax_inplace(float *restrict s, int64_t n) {
    float m = s[0], sum = 0.f;
    int64_t t = 1;
#ifdef __AVX2__
    if (n >= 16) { /* the max is exact in any order (scores are finite): eight lanes, then across them */
        __m256 mv = _mm256_loadu_ps(s);
        for (t = 8; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
        float lanes[8];
        _mm256_storeu_ps(lanes, mv);
        for (int i = 0; i < 8; ++i) m = lanes[i] > m ? lanes[i] : m;
    }
#endif
    for (; t < n; ++t) m = s[t] > m ? s[t] : m;
    t = 0;
#ifdef __AVX2__
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; ++i) sum += lanes[i];
#endif
    for (; t < n; ++t) {
        s[t] = expf(s[t] - m);
        sum += s[t];
    }
    const float inv = 1.f / sum;
    for (t = 0; t < n; ++t) s[t] *= inv;
}

#endif
