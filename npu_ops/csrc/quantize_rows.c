/* Per-row (per-token) dynamic, symmetric quantization of fp32 activations, as npu_ops/quant.py's references do
 * it: scale = amax / QMAX (1 for a zero row), q = round(x / scale) to nearest even, clamped to [-QMAX, QMAX].
 * Division, not multiplication by the reciprocal, so that the rounding matches the reference. Rows are zero
 * padded from K to KP. */
#include <math.h>
#include <stdint.h>
#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels.h"
#include "quantize_rows.h"

static float row_amax(const float *xr, int64_t K) {
    float amax = 0.f;
    int64_t k = 0;
#ifdef __AVX2__
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xr + k), nosign));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, lanes[i]);
#endif
    for (; k < K; ++k) amax = fmaxf(amax, fabsf(xr[k]));
    return amax;
}

/* int8, QMAX 127. With ``flip`` 0x80 every byte is stored + 128 (x ^ 0x80: the VNNI core's unsigned operand). */
void quantize_row_i8(const float *xr, int64_t K, int64_t KP, int8_t *qr, float *xs, int8_t flip) {
    const float amax = row_amax(xr, K), s = amax > 0.f ? amax / 127.f : 1.f;
    *xs = s;
    int64_t k = 0;
#ifdef __AVX2__
    const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    const __m128i fv = _mm_set1_epi8(flip);
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(xr + k), sv), lo), hi);
        const __m256i i32 = _mm256_cvtps_epi32(v); /* round to nearest even (MXCSR default) */
        const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64((__m128i *)(qr + k), _mm_xor_si128(_mm_packs_epi16(i16, i16), fv));
    }
#endif
    for (; k < K; ++k) {
        float v = nearbyintf(xr[k] / s);
        qr[k] = (int8_t)((int8_t)(v > 127.f ? 127.f : v < -127.f ? -127.f : v) ^ flip);
    }
    for (; k < KP; ++k) qr[k] = flip;
}

void quantize_rows_offset(const float *x, int64_t M, int64_t K, int64_t KP, int8_t *xq, float *xs, int nthreads,
                          int offset) {
    const int8_t flip = offset ? (int8_t)0x80 : 0;
    /* a decode step's few rows stay on the calling thread: waking the team costs more than the work */
#pragma omp parallel for num_threads(nthreads) if (M * K >= 65536) schedule(static)
    for (int64_t m = 0; m < M; ++m) quantize_row_i8(x + m * K, K, KP, xq + m * KP, xs + m, flip);
}

void quantize_rows_i8(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, int nthreads) {
    quantize_rows_offset(x, M, K, (K + 3) / 4 * 4, xq, xs, nthreads, 0);
}

/* int16, QMAX I16_QMAX (the W8I16 head's activations). */
void quantize_row_i16(const float *xr, int64_t K, int64_t KP, int16_t *qr, float *xs) {
    const float qmax = (float)I16_QMAX, amax = row_amax(xr, K), s = amax > 0.f ? amax / qmax : 1.f;
    *xs = s;
    int64_t k = 0;
#ifdef __AVX2__
    const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(xr + k), sv), lo), hi);
        const __m256i i32 = _mm256_cvtps_epi32(v);
        _mm_storeu_si128((__m128i *)(qr + k),
                         _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1)));
    }
#endif
    for (; k < K; ++k) {
        float v = nearbyintf(xr[k] / s);
        qr[k] = (int16_t)(v > qmax ? qmax : v < -qmax ? -qmax : v);
    }
    for (; k < KP; ++k) qr[k] = 0;
}
