/* The all-greedy sampler's C pass (engine/sample/sampler.py and the fused decode steps of decode_f32.c): each row's first
 * largest logit and its log-probability x[a] - (max + log(sum exp(x - max))) (torch's logsumexp formula). Rows are
 * shared over the threads; a lone row (one stream's step: SmolLM2's 49,152 logits, ~1% of its step on one thread)
 * is cut into one span a thread, whose maxima and sums meet in span order. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "greedy_rows.h"
#include "kernels.h"
#include "vec_math.h"

#define PAR_MIN_ELEMS 65536
#define SPLIT_MIN 16384 /* a lone row's logits worth a team */

typedef struct {
    float m;   /* the span's largest logit */
    int64_t a; /* its first index (in the row) */
    int finite;
} span_max;

/* the first largest of x[0:n) (indices from base) and whether every logit is finite */
static span_max max_of(const float *restrict x, int64_t n, int64_t base) {
    span_max r = {x[0], base, 1};
    int64_t i = 0;
#ifdef __AVX2__
    if (n >= 8) {
        const __m256 inf = _mm256_set1_ps(INFINITY), absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 vm = _mm256_loadu_ps(x), ok = _mm256_cmp_ps(_mm256_and_ps(vm, absmask), inf, _CMP_LT_OQ);
        __m256i vi = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), cur = vi;
        const __m256i step = _mm256_set1_epi32(8);
        for (i = 8; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            cur = _mm256_add_epi32(cur, step);
            ok = _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_LT_OQ));
            const __m256 gt = _mm256_cmp_ps(v, vm, _CMP_GT_OQ); /* strict: each lane keeps its first max */
            vm = _mm256_blendv_ps(vm, v, gt);
            vi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(vi), _mm256_castsi256_ps(cur), gt));
        }
        r.finite = _mm256_movemask_ps(ok) == 0xff;
        float lm[8];
        int32_t li[8];
        _mm256_storeu_ps(lm, vm);
        _mm256_storeu_si256((__m256i *)li, vi);
        int64_t a = li[0];
        r.m = lm[0];
        for (int l = 1; l < 8; ++l)
            if (lm[l] > r.m || (lm[l] == r.m && li[l] < a)) r.m = lm[l], a = li[l];
        r.a = base + a;
    }
#endif
    for (; i < n; ++i) {
        r.finite &= isfinite(x[i]) != 0;
        if (x[i] > r.m) r.m = x[i], r.a = base + i;
    }
    return r;
}

/* sum exp(x - m) over x[0:n) */
static float sum_exp(const float *restrict x, int64_t n, float m) {
    float sum = 0.f;
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
    sum = hsum256(acc);
#endif
    for (; i < n; ++i) sum += expf(x[i] - m);
    return sum;
}

/* One row on the calling thread; returns 0 if a logit is NaN or infinite. */
static int greedy_row(const float *restrict x, int64_t n, int64_t *restrict idx, float *restrict lp) {
    const span_max r = max_of(x, n, 0);
    if (!r.finite) return 0;
    *idx = r.a;
    *lp = x[r.a] - (r.m + logf(sum_exp(x, n, r.m)));
    return 1;
}

/* One row by a team of nt threads, a span of whole vectors each: the spans' maxima combine in span order (the first
 * index wins a tie, as on one thread), then each sums its span against the row's maximum. */
static int greedy_row_team(const float *restrict x, int64_t n, int64_t *restrict idx, float *restrict lp, int nt) {
    span_max *part = malloc(sizeof(span_max) * (size_t)nt);
    float *sums = malloc(sizeof(float) * (size_t)nt);
    if (part == NULL || sums == NULL) {
        free(part);
        free(sums);
        return greedy_row(x, n, idx, lp);
    }
    span_max all = {0.f, 0, 1};
    int used = 1;
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), k = omp_get_num_threads();
        const int64_t vecs = n / 8, lo = t == 0 ? 0 : vecs * t / k * 8, hi = t == k - 1 ? n : vecs * (t + 1) / k * 8;
        part[t] = max_of(x + lo, hi - lo, lo);
#pragma omp barrier
#pragma omp single
        {
            used = k;
            all = part[0];
            for (int s = 1; s < k; ++s) {
                all.finite &= part[s].finite;
                if (part[s].m > all.m) all.m = part[s].m, all.a = part[s].a; /* later spans: strictly larger only */
            }
        } /* single's barrier: every thread sees all */
        if (all.finite) sums[t] = sum_exp(x + lo, hi - lo, all.m);
    }
    float sum = 0.f;
    for (int s = 0; s < used && all.finite; ++s) sum += sums[s];
    free(part);
    free(sums);
    if (!all.finite) return 0;
    *idx = all.a;
    *lp = x[all.a] - (all.m + logf(sum));
    return 1;
}

/* The all-greedy sampler's rows (engine/sample/sampler.py): idx [M] int64, lp [M]. Returns 1 if any row had a logit
 * that is NaN or infinite (the caller then takes its general path, which names those rows), else 0. */
int greedy_rows_f32(const float *restrict logits, int64_t rows, int64_t n, int64_t *restrict idx,
                    float *restrict lp, int nthreads) {
    if (rows == 1 && n >= SPLIT_MIN && nthreads > 1) return !greedy_row_team(logits, n, idx, lp, nthreads);
    int bad = 0;
#pragma omp parallel for num_threads(nthreads) if (rows * n >= PAR_MIN_ELEMS && rows > 1) schedule(static) reduction(| : bad)
    for (int64_t r = 0; r < rows; ++r) bad |= !greedy_row(logits + r * n, n, idx + r, lp + r);
    return bad;
}
