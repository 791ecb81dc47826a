/* fp32 linear layer for the CPU: y[M, N] = x[M, K] . W[N, K]^T (+ bias), W pre-packed into panels
 * of 16 output columns, k-major (Wp[N/16][K][16], the last panel zero-padded).
 *
 * oneDNN's and MKL's sgemm on this kind of CPU (AVX2) leave the FMA units half idle on the skinny
 * matrices of decoding (a few to a few dozen rows) and do not overlap streaming the weights from
 * memory with the arithmetic. This is the classic register-blocked kernel: a 6 x 16 tile of y in
 * twelve ymm accumulators, one broadcast of x and two loads of the panel per k; the first tile of
 * each panel prefetches the next panel. Rows are taken in chunks of MC that stay in L2 while every
 * panel passes. Without AVX2 a plain loop computes the same tiles.
 * Threads come from the OpenMP runtime the process already has loaded (PyTorch's libgomp). */
#include <stdint.h>
#include <string.h>

#define NR 16
#define MR 6
#define MC 96

#ifdef __AVX2__
#include <immintrin.h>

/* tileR: c[R, 16] = a[R, K] (rows lda apart) . panel b[K, 16]; pf: where to prefetch, pf_step floats per k */
static void tile1(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
}

static void tile2(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 1 * lda + k);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
    _mm256_storeu_ps(c + 1 * NR, c10);
    _mm256_storeu_ps(c + 1 * NR + 8, c11);
}

static void tile3(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 1 * lda + k);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 2 * lda + k);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
    _mm256_storeu_ps(c + 1 * NR, c10);
    _mm256_storeu_ps(c + 1 * NR + 8, c11);
    _mm256_storeu_ps(c + 2 * NR, c20);
    _mm256_storeu_ps(c + 2 * NR + 8, c21);
}

static void tile4(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 1 * lda + k);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 2 * lda + k);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 3 * lda + k);
            c30 = _mm256_fmadd_ps(av, b0, c30);
            c31 = _mm256_fmadd_ps(av, b1, c31);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
    _mm256_storeu_ps(c + 1 * NR, c10);
    _mm256_storeu_ps(c + 1 * NR + 8, c11);
    _mm256_storeu_ps(c + 2 * NR, c20);
    _mm256_storeu_ps(c + 2 * NR + 8, c21);
    _mm256_storeu_ps(c + 3 * NR, c30);
    _mm256_storeu_ps(c + 3 * NR + 8, c31);
}

static void tile5(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 1 * lda + k);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 2 * lda + k);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 3 * lda + k);
            c30 = _mm256_fmadd_ps(av, b0, c30);
            c31 = _mm256_fmadd_ps(av, b1, c31);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 4 * lda + k);
            c40 = _mm256_fmadd_ps(av, b0, c40);
            c41 = _mm256_fmadd_ps(av, b1, c41);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
    _mm256_storeu_ps(c + 1 * NR, c10);
    _mm256_storeu_ps(c + 1 * NR + 8, c11);
    _mm256_storeu_ps(c + 2 * NR, c20);
    _mm256_storeu_ps(c + 2 * NR + 8, c21);
    _mm256_storeu_ps(c + 3 * NR, c30);
    _mm256_storeu_ps(c + 3 * NR + 8, c31);
    _mm256_storeu_ps(c + 4 * NR, c40);
    _mm256_storeu_ps(c + 4 * NR + 8, c41);
}

static void tile6(const float *restrict a, int64_t lda, const float *restrict b, int64_t K, float *restrict c,
                  const float *restrict pf, int64_t pf_step) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
        {
            const __m256 av = _mm256_broadcast_ss(a + 0 * lda + k);
            c00 = _mm256_fmadd_ps(av, b0, c00);
            c01 = _mm256_fmadd_ps(av, b1, c01);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 1 * lda + k);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 2 * lda + k);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 3 * lda + k);
            c30 = _mm256_fmadd_ps(av, b0, c30);
            c31 = _mm256_fmadd_ps(av, b1, c31);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 4 * lda + k);
            c40 = _mm256_fmadd_ps(av, b0, c40);
            c41 = _mm256_fmadd_ps(av, b1, c41);
        }
        {
            const __m256 av = _mm256_broadcast_ss(a + 5 * lda + k);
            c50 = _mm256_fmadd_ps(av, b0, c50);
            c51 = _mm256_fmadd_ps(av, b1, c51);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
    _mm256_storeu_ps(c + 0 * NR, c00);
    _mm256_storeu_ps(c + 0 * NR + 8, c01);
    _mm256_storeu_ps(c + 1 * NR, c10);
    _mm256_storeu_ps(c + 1 * NR + 8, c11);
    _mm256_storeu_ps(c + 2 * NR, c20);
    _mm256_storeu_ps(c + 2 * NR + 8, c21);
    _mm256_storeu_ps(c + 3 * NR, c30);
    _mm256_storeu_ps(c + 3 * NR + 8, c31);
    _mm256_storeu_ps(c + 4 * NR, c40);
    _mm256_storeu_ps(c + 4 * NR + 8, c41);
    _mm256_storeu_ps(c + 5 * NR, c50);
    _mm256_storeu_ps(c + 5 * NR + 8, c51);
}

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *, const float *, int64_t);
static const tile_fn TILES[MR + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

static void tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
                 int64_t pf_step) {
    TILES[mr](a, lda, b, K, c, pf, pf_step);
}
#else
static void tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
                 int64_t pf_step) {
    (void)pf;
    (void)pf_step;
    memset(c, 0, sizeof(float) * (size_t)(mr * NR));
    for (int r = 0; r < mr; ++r)
        for (int64_t k = 0; k < K; ++k)
            for (int j = 0; j < NR; ++j) c[r * NR + j] += a[r * lda + k] * b[k * NR + j];
}
#endif

int64_t packed_weight_numel(int64_t N, int64_t K) { return (N + NR - 1) / NR * NR * K; }

void pack_weight_f32(const float *w, int64_t N, int64_t K, float *wp) {
    const int64_t np = (N + NR - 1) / NR;
    for (int64_t p = 0; p < np; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < NR; ++j) {
                const int64_t n = p * NR + j;
                wp[(p * K + k) * NR + j] = n < N ? w[n * K + k] : 0.f;
            }
}

void linear_f32(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                int nthreads) {
    const int64_t np = (N + NR - 1) / NR;
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t p = 0; p < np; ++p) {
            const float *w = wp + p * K * NR;
            const float *next = p + 1 < np ? wp + (p + 1) * K * NR : w;
            const int64_t n0 = p * NR, ncols = N - n0 < NR ? N - n0 : NR;
            float c[MR * NR];
            for (int64_t m = m0; m < m1; m += MR) {
                const int mr = m1 - m < MR ? (int)(m1 - m) : MR;
                /* the first tile walks the panel once from memory: let it pull the next panel in too */
                tile(mr, x + m * K, K, w, K, c, m == m0 ? next : w, m == m0 ? NR : 0);
                for (int r = 0; r < mr; ++r) {
                    float *yr = y + (m + r) * N + n0;
                    const float *cr = c + r * NR;
                    if (bias != NULL)
                        for (int64_t j = 0; j < ncols; ++j) yr[j] = cr[j] + bias[n0 + j];
                    else
                        memcpy(yr, cr, sizeof(float) * (size_t)ncols);
                }
            }
        }
    }
}
