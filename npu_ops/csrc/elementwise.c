/* Fused elementwise ops for the CPU, fp32, each one pass over memory where PyTorch's eager
 * reference makes several (and allocates a temporary per step). Each mirrors its reference in
 * npu_ops/ops.py operation for operation: built with -std=c11, so no multiply-add contraction,
 * and the roundings are those of the separate multiplies and adds. Rows are shared out over the
 * threads of the OpenMP runtime that PyTorch has loaded; small inputs stay on the calling thread. */
#include <math.h>
#include <stdint.h>

#include "elementwise.h"
#include "kernels.h"
#include "vec_math.h"

#define PAR_MIN_ELEMS 65536

/* o = w * (x * rsqrt(mean(x^2) + eps)) for one row (Hugging Face's LlamaRMSNorm) */
void rms_norm_row_f32(const float *restrict xr, const float *restrict w, float *restrict o, int64_t dim, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) o[i] = w[i] * (xr[i] * inv);
}

void rms_norm_f32(const float *restrict x, const float *restrict w, float *restrict out, int64_t rows,
                  int64_t dim, float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (rows * dim >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t r = 0; r < rows; ++r) rms_norm_row_f32(x + r * dim, w, out + r * dim, dim, eps);
}

/* silu(g) * u for one row; exp256 (vec_math.h) does eight lanes at a time where AVX2 is there. */
void silu_mul_row_f32(const float *restrict g, const float *restrict u, float *restrict o, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; ++i) o[i] = (g[i] / (1.f + expf(-g[i]))) * u[i];
}

/* gu: [rows, 2 * inter] (gate then up); out[r] = silu(gate) * up, silu(g) = g / (1 + exp(-g)) */
void silu_mul_f32(const float *restrict gu, float *restrict out, int64_t rows, int64_t inter, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (rows * inter >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t r = 0; r < rows; ++r) silu_mul_row_f32(gu + r * 2 * inter, gu + r * 2 * inter + inter, out + r * inter, inter);
}

void rotary_head_f32(const float *restrict x, const float *restrict c, const float *restrict s,
                        float *restrict o, int64_t half) {
    for (int64_t i = 0; i < half; ++i) o[i] = x[i] * c[i] + (-x[i + half]) * s[i];
    for (int64_t i = 0; i < half; ++i) o[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
}

/* Rotary embedding (rotate-half layout) of the first `heads` heads of each row of x (row stride
 * `stride` floats, heads of `d` floats) into out [rows, heads, d]:
 * out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1); cos, sin: [rows, d]. */
void rotary_f32(const float *restrict x, int64_t stride, const float *restrict cos_, const float *restrict sin_,
                float *restrict out, int64_t rows, int64_t heads, int64_t d, int nthreads) {
    const int64_t half = d / 2;
#pragma omp parallel for num_threads(nthreads) if (rows * heads * d >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos_ + r * d, *s = sin_ + r * d;
        for (int64_t h = 0; h < heads; ++h) rotary_head_f32(x + r * stride + h * d, c, s, out + (r * heads + h) * d, half);
    }
}
