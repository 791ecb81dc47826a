/* How close a lone-row (M = 1) int8 GEMV gets to the bandwidth bound (issue 44), per GGUF block type, in one
 * process. For each type, the kernel's real entry point (kernels.h's gguf_matmul_<type>_q8) is timed:
 *  - in cache: each thread of a team calls it on its own weights (about 192 KiB: resident in its L2) against one
 *    row of x, timed by the thread's CPU clock (a shared machine's other work does not count): what the kernel's
 *    instructions allow, per thread and for the team (their sum);
 *  - streamed: SmolLM2-1.7B's decoder layers (qkv [6144, 2048], o [2048, 2048], gate/up [16384, 2048], down
 *    [2048, 8192]) in order, as many layers as pass 256 MB, on 2 MiB pages (membw.c's probe_alloc, as the engine's
 *    packed weights are), through gguf_linear_team in a team that meets at team_sync's barrier: the fused decoder's
 *    call path (layers_f32.c) with nothing else in the step; wall clock;
 *  - the bounds in the same process, alternating with the streamed passes: membw.c's STREAM triad (3 x 128 MiB,
 *    STREAM's byte count; the bound of issue 44) and its read pass (AVX2 sums, 8 prefetched streams a thread,
 *    256 MiB): what memory gives a reader.
 * GB/s count weight bytes only (x, y and the scales of x are a few KiB a call). Each figure is the best of ROUNDS
 * (in cache too, measured once a round); the streamed share is also shown against the triad of its own round (the
 * median of the rounds' ratios).
 *
 *   cd npu_ops/csrc && gcc -O3 -march=native -fopenmp -std=gnu11 -I. -o /tmp/ab_ceiling \
 *       ../../tools/ab_ceiling.c ../../tools/membw.c *.c -lm && \
 *   /tmp/ab_ceiling 2 5 0185k6xy       # THREADS ROUNDS KINDS (0 Q4_0, 1 Q4_1, 8 Q8_0, 5 Q5_0, k Q4_K, 6 Q6_K;
 *                                       # x, y: Q4_0, Q4_1 repacked 4 rows interleaved, as the engine runs them)
 *
 * THREADS: runs at 1 thread and, when THREADS is 2 or more, at THREADS too. MB=256 sets the streamed size.
 * The thread CPU clock leaves out time the thread did not run, not a busy neighbour's effect on the time it ran
 * (this VM's two vCPUs at load 4: the in-cache rates 0.6x their load-1 ones): in-cache figures at load <= 1 only. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include <immintrin.h>

#include "ab_common.h"
#include "gemm_gguf_q8.h"
#include "gguf_linear.h"
#include "kernels.h"
#include "team_sync.h"

float *probe_alloc(int64_t floats);
void probe_free(float *p);
double read_pass(const float *x, int64_t floats, int nthreads);
void triad_pass(float *a, const float *b, const float *c, int64_t floats, float s, int nthreads);

typedef struct kind {
    char key;
    const char *name;
    ab_fn fn;
    int vals, bytes, d_at, two_scales, x4; /* x4: the blocks repacked 4 rows interleaved (csrc/gguf_x4.h) */
} kind;


static const kind KINDS[] = {
    {'0', "Q4_0", gguf_matmul_q4_0_q8, 32, 18, 0, 0, 0},   {'1', "Q4_1", gguf_matmul_q4_1_q8, 32, 20, 0, 1, 0},
    {'8', "Q8_0", gguf_matmul_q8_0_q8, 32, 34, 0, 0, 0},   {'5', "Q5_0", gguf_matmul_q5_0_q8, 32, 22, 0, 0, 0},
    {'k', "Q4_K", gguf_matmul_q4_k_q8, 256, 144, 0, 1, 0}, {'6', "Q6_K", gguf_matmul_q6_k_q8, 256, 210, 208, 0, 0},
    {'x', "Q4_0x4", gguf_matmul_q4_0x4_q8, 32, 18, 0, 0, 1}, {'y', "Q4_1x4", gguf_matmul_q4_1x4_q8, 32, 20, 0, 1, 1},
};


/* Q4_0 / Q4_1 repacked 4 rows interleaved (csrc/gguf_x4.h: the engine's Q4_0x4 / Q4_1x4, at load): the kernel
 * is the engine's entry point; this repack is npu_ops/quant_gguf_x4.py's, the bits checked against GGUF's layout. */
static uint8_t *repack_x4(const uint8_t *w, int64_t n, int64_t k, int bb) {
    const int64_t nb = k / 32, sb = bb - 16; /* a block's scale bytes */
    uint8_t *o = malloc((size_t)(n * nb * bb));
    for (int64_t g = 0; g < n / 4; ++g)
        for (int64_t b = 0; b < nb; ++b)
            for (int r = 0; r < 4; ++r) {
                const uint8_t *src = w + ((g * 4 + r) * nb + b) * bb;
                uint8_t *dst = o + (g * nb + b) * 4 * bb;
                memcpy(dst + sb * r, src, (size_t)sb);
                memcpy(dst + 4 * sb + 16 * r, src + sb, 16);
            }
    return o;
}

#define K_IN 2048
#define CACHE_BYTES (192 * 1024)
#define CALLS 100 /* in-cache calls a timing, best of REPS timings */
#define REPS 15
#define NPROJ 4
static const int64_t PROJ[NPROJ][2] = {{6144, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}}; /* rows, k */

static void fill_blocks(const kind *kd, uint8_t *w, int64_t blocks) {
    for (int64_t b0 = 0; b0 < blocks; b0 += 1 << 16) { /* in pieces: no second copy of 256 MB */
        const int64_t nb = blocks - b0 < (1 << 16) ? blocks - b0 : 1 << 16;
        uint8_t *r = ab_random_blocks(1, nb, kd->bytes, kd->d_at, kd->two_scales, 0xff);
        memcpy(w + b0 * kd->bytes, r, (size_t)(nb * kd->bytes));
        free(r);
    }
}

/* GB/s of weight bytes a thread's own in-cache weights give, per thread (*each: the slowest thread) and summed */
static double in_cache(const kind *kd, int nt, const float *x, double *each) {
    double sum = 0, low = 1e30;
#pragma omp parallel num_threads(nt) reduction(+ : sum) reduction(min : low)
    {
        const int64_t row = K_IN / kd->vals * kd->bytes, n = CACHE_BYTES / row / 16 * 16;
        uint8_t *w = malloc((size_t)(n * row));
        float y[1024];
        fill_blocks(kd, w, n * (K_IN / kd->vals));
        if (kd->x4) { /* the same values as the type's kernel gives on the blocks as GGUF stores them */
            float y0[1024];
            uint8_t *o = repack_x4(w, n, K_IN, kd->bytes);
            (kd->bytes == 18 ? gguf_matmul_q4_0_q8 : gguf_matmul_q4_1_q8)(w, n, K_IN, x, 1, y0);
            kd->fn(o, n, K_IN, x, 1, y);
            if (memcmp(y0, y, sizeof(float) * (size_t)n)) printf("%s: BITS DIFFER from GGUF's layout\n", kd->name);
            memcpy(w, o, (size_t)(n * row));
            free(o);
        }
        double best = 1e30;
        for (int rep = 0; rep < REPS; ++rep) {
            const double t = ab_now();
            for (int c = 0; c < CALLS; ++c) kd->fn(w, n, K_IN, x, 1, y);
            const double d = ab_now() - t;
            best = d < best ? d : best;
        }
        const double rate = (double)(n * row) * CALLS / best / 1e9;
        sum += rate;
        low = rate;
        free(w);
    }
    *each = low;
    return sum;
}

typedef struct layers {
    uint8_t *base;
    int64_t nl, bytes;
    gguf_seg seg[NPROJ][2]; /* one segment and the table's end, a projection; w set per layer */
} layers;

static int64_t layer_bytes(const kind *kd) {
    int64_t b = 0;
    for (int p = 0; p < NPROJ; ++p) b += PROJ[p][0] * (PROJ[p][1] / kd->vals) * kd->bytes;
    return b;
}

static int layers_new(const kind *kd, int64_t min_bytes, layers *L) {
    memset(L, 0, sizeof *L);
    const int64_t lb = layer_bytes(kd);
    L->nl = (min_bytes + lb - 1) / lb;
    L->bytes = L->nl * lb;
    L->base = (uint8_t *)probe_alloc((L->bytes + 3) / 4);
    if (L->base == NULL) return 1;
    fill_blocks(kd, L->base, L->nl * lb / kd->bytes); /* random scales in every block (a real file's are finite) */
    for (int64_t l = 0, at = 0; kd->x4 && l < L->nl; ++l)
        for (int p = 0; p < NPROJ; at += PROJ[p][0] * (PROJ[p][1] / 32 * kd->bytes), ++p) {
            uint8_t *o = repack_x4(L->base + at, PROJ[p][0], PROJ[p][1], kd->bytes);
            memcpy(L->base + at, o, (size_t)(PROJ[p][0] * (PROJ[p][1] / 32 * kd->bytes)));
            free(o);
        }
    for (int p = 0; p < NPROJ; ++p) {
        gguf_seg *s = &L->seg[p][0];
        s->fn = s->fn_q8 = (gguf_matmul_fn)kd->fn;
        s->rows = PROJ[p][0];
        s->row_bytes = PROJ[p][1] / kd->vals * kd->bytes;
        s->q8_steps = 1 << GGUF_STEP_DECODE;
    }
    return 0;
}

/* seconds one pass over every layer's projections takes, the team of nt threads meeting at team_sync's barrier */
static double streamed(layers *L, int nt, const float *x, float *y) {
    team_sync *sync = team_sync_new(nt);
    double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(nt)
    {
        team_sync_join(omp_get_num_threads() == nt ? sync : NULL);
        team_barrier();
        if (omp_get_thread_num() == 0) t0 = omp_get_wtime();
        const uint8_t *w = L->base;
        for (int64_t l = 0; l < L->nl; ++l)
            for (int p = 0; p < NPROJ; ++p) {
                gguf_seg seg[2] = {L->seg[p][0], L->seg[p][1]};
                seg[0].w = w;
                gguf_linear_team(seg, 1, x, 1, PROJ[p][1], NULL, NULL, NULL, y, PROJ[p][0], 0, GGUF_STEP_DECODE);
                w += PROJ[p][0] * seg[0].row_bytes;
            }
        if (omp_get_thread_num() == 0) t1 = omp_get_wtime();
        team_sync_leave();
    }
    team_sync_free(sync);
    return t1 - t0;
}

static int cmp_double(const void *a, const void *b) {
    const double u = *(const double *)a, v = *(const double *)b;
    return u < v ? -1 : u > v;
}

/* one thread count's rows: in cache, then ROUNDS of triad / read / streamed alternating, a type at a time */
static int run_threads(int nt, int rounds, const char *keys, int64_t mb, const float *x, float *y) {
    const int64_t tn = (128 << 20) / 4, rn = (256 << 20) / 4;
    float *a = probe_alloc(tn), *b = probe_alloc(tn), *c = probe_alloc(tn), *r = probe_alloc(rn);
    if (a == NULL || b == NULL || c == NULL || r == NULL) return 1;
    double tri = 0, rd = 0;
    printf("\n%d thread(s)\n%-6s %9s %10s %8s %10s %8s %8s %8s\n", nt, "type", "cache/thr", "cache", "/triad",
           "streamed", "/triad", "/read", "rnd/tri");
    for (const char *kc = keys; *kc; ++kc) {
        const kind *kd = NULL;
        for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; ++i) kd = KINDS[i].key == *kc ? &KINDS[i] : kd;
        if (kd == NULL) continue;
        double each = 0, cache = 0, best = 0, ratio[64];
        layers L;
        if (layers_new(kd, mb << 20, &L) != 0) return 1;
        streamed(&L, nt, x, y); /* pages touched, team warm */
        for (int i = 0; i < rounds && i < 64; ++i) {
            double e; /* in cache each round too: a neighbour's burst on a shared core spoils one, not all */
            const double hot = in_cache(kd, nt, x, &e);
            cache = hot > cache ? hot : cache, each = e > each ? e : each;
            double t = omp_get_wtime();
            triad_pass(a, b, c, tn, 3.0f, nt);
            const double tr = 12.0 * (double)tn / (omp_get_wtime() - t) / 1e9;
            t = omp_get_wtime();
            read_pass(r, rn, nt);
            const double rr = 4.0 * (double)rn / (omp_get_wtime() - t) / 1e9;
            const double sr = (double)L.bytes / streamed(&L, nt, x, y) / 1e9;
            tri = tr > tri ? tr : tri, rd = rr > rd ? rr : rd, best = sr > best ? sr : best;
            ratio[i] = sr / tr;
        }
        qsort(ratio, (size_t)(rounds < 64 ? rounds : 64), sizeof(double), cmp_double);
        printf("%-6s %9.1f %10.1f %7.0f%% %10.1f %7.0f%% %7.0f%% %7.0f%%\n", kd->name, each, cache,
               100 * cache / tri, best, 100 * best / tri, 100 * best / rd, 100 * ratio[(rounds < 64 ? rounds : 64) / 2]);
        probe_free((float *)L.base);
    }
    printf("triad %.1f GB/s, read %.1f GB/s (best of the rounds); GB/s of weight bytes, in cache by thread CPU time "
           "(cache/thr: the slowest thread), streamed by wall clock; rnd/tri: the median round's streamed / triad\n",
           tri, rd);
    probe_free(a), probe_free(b), probe_free(c), probe_free(r);
    return 0;
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 5;
    const char *keys = argc > 3 ? argv[3] : "0185k6xy";
    const int64_t mb = getenv("MB") != NULL ? atoll(getenv("MB")) : 256;
    float *x = malloc(sizeof(float) * 8192), *y = malloc(sizeof(float) * 16384);
    for (int i = 0; i < 8192; ++i) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    double load[1] = {-1};
    getloadavg(load, 1);
    printf("lone-row int8 GEMV against the bandwidth bound: %d round(s), %lld MB streamed a type, load average %.2f\n",
           rounds, (long long)mb, load[0]);
    if (run_threads(1, rounds, keys, mb, x, y) != 0) return 1;
    if (nt > 1 && run_threads(nt, rounds, keys, mb, x, y) != 0) return 1;
    getloadavg(load, 1);
    printf("load average at the end %.2f\n", load[0]);
    return 0;
}
