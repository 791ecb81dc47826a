/* Memory bandwidth probes for tools/membw.py (built there with -O3 -march=native -fopenmp).
 *
 * read_pass: sums a buffer with AVX2 loads, each thread's share read as 8 interleaved streams with both cache
 * lines of each 128-byte step prefetched into L2 2 KiB ahead. One sequential stream a thread left the memory
 * system idle part of the time: measured here, interleaved rounds, 2 threads, 512 MiB: 1 stream 43 GB/s,
 * 2: 48, 4: 53, 8 with the prefetch: 57. It is what a decode step does with its weights (every projection's
 * panels), so it is the bound a decode step is held to. triad_pass: STREAM's a = b + s * c. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

/* On 2 MiB pages where Linux gives them (transparent huge pages on madvise): the engine's packed weights and
 * KV pool are there (npu_ops/memory.py), and a probe on 4 KiB pages reads slower (a TLB miss and a prefetcher
 * halt every page), which would flatter the engine's share of the bound. */
float *probe_alloc(int64_t floats) {
    const size_t huge = (size_t)2 << 20, n = ((size_t)floats * 4 + huge - 1) / huge * huge;
    float *p = aligned_alloc(huge, n);
    if (p == NULL) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    for (int64_t i = 0; i < floats; ++i) p[i] = (float)(i & 7);
    return p;
}

void probe_free(float *p) { free(p); }

#define STREAMS 8
#define PF_AHEAD 512 /* floats: 2 KiB */

double read_pass(const float *x, int64_t floats, int nthreads) {
    double total = 0.0;
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t sub = floats / nt / STREAMS / 32 * 32;
        const float *base = x + (int64_t)me * sub * STREAMS;
#ifdef __AVX2__
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t i = 0; i < sub; i += 32)
            for (int s = 0; s < STREAMS; ++s) {
                const float *p = base + s * sub + i;
                _mm_prefetch((const char *)(p + PF_AHEAD), _MM_HINT_T1);
                _mm_prefetch((const char *)(p + PF_AHEAD + 16), _MM_HINT_T1);
                s0 = _mm256_add_ps(s0, _mm256_load_ps(p));
                s1 = _mm256_add_ps(s1, _mm256_load_ps(p + 8));
                s2 = _mm256_add_ps(s2, _mm256_load_ps(p + 16));
                s3 = _mm256_add_ps(s3, _mm256_load_ps(p + 24));
            }
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
        for (int j = 0; j < 8; ++j) total += lanes[j];
#else
        float s = 0.f;
        for (int64_t i = 0; i < sub * STREAMS; ++i) s += base[i];
        total += s;
#endif
    }
    return total;
}

void triad_pass(float *a, const float *b, const float *c, int64_t floats, float s, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < floats; ++i) a[i] = b[i] + s * c[i];
}
