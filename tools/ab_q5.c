/* The Q5_0 / Q5_1 int8-activation lone row (npu_ops/csrc/gemm_gguf_q5_q8.c, M = 1: one stream's decode GEMV) before /
 * after a change, in one binary: the old file (from a commit) compiled with its entry points renamed, the tree's as
 * it is; SmolLM2-360M's shapes (960 -> 960 q / o, 960 -> 320 k / v, 960 -> 2560 gate / up; 2560 -> 960 down is Q6_K
 * or Q8_0 in its Q4_K_M file), random blocks, one thread, old and new alternating, timed by the thread's CPU clock (a
 * shared machine's other work does not count; its cache and SMT effects still do):
 * - in cache: one matrix, best of REPS calls;
 * - from memory: copies of the matrix filling more than 64 MB, each called once in turn (a step's layers), the best
 *   of REPS such passes.
 * Both run inside a team of one (as the fused decode step calls the kernel: omp_get_level() > 0) and, with
 * STANDALONE=1, outside any team (a ctypes call's own team). Every call's output bits are compared (a change that
 * moved a bit prints BITS DIFFER). KINDS: 0 Q5_0, 1 Q5_1. M: rows of x (1: one stream's decode; 16: a batch of decode
 * rows, the GEMM path).
 *
 *   mkdir -p /tmp/ab && git show REV:npu_ops/csrc/gemm_gguf_q5_q8.c > /tmp/ab/q5.c && cd npu_ops/csrc && \
 *   F="-O3 -march=native -fopenmp -std=gnu11 -I." && \
 *   gcc $F -c /tmp/ab/q5.c -o /tmp/ab/q5.o -Dgguf_matmul_q5_0_q8=old_q5_0 -Dgguf_matmul_q5_1_q8=old_q5_1 && \
 *   gcc $F -o /tmp/ab/ab5 ../../tools/ab_q5.c /tmp/ab/q5.o *.c -lm && \
 *   OMP_NUM_THREADS=1 /tmp/ab/ab5 5 01 1        # REPS KINDS M
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab_common.h"
#include "kernels.h"

void old_q5_0(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_q5_1(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);

#define MEM_BYTES (72LL << 20) /* past any last-level cache here */

/* one call of f, inside a team of one when team (the fused step's way) */
static double timed(ab_fn f, const uint8_t *w, int64_t n, int64_t k, const float *x, int m, float *y, int team) {
    double d = 0;
    if (team) {
#pragma omp parallel num_threads(1)
        d = ab_best(f, w, n, k, x, m, y, 1e9);
    } else {
        d = ab_best(f, w, n, k, x, m, y, 1e9);
    }
    return d;
}

/* best of reps passes over the copies (1: in cache) of each kernel, alternating; *diff set where bits differ */
static void ab(const ab_fn f[2], const uint8_t *w, int64_t copies, int64_t n, int64_t k, int64_t rb, const float *x,
               int m, float *y0, float *y1, int reps, int team, double best[2], int *diff) {
    best[0] = best[1] = 1e9;
    for (int r = 0; r < reps; ++r)
        for (int v = 0; v < 2; ++v) {
            double t = 0;
            for (int64_t c = 0; c < copies; ++c) {
                t += timed(f[v], w + c * n * rb, n, k, x, m, v ? y1 + c * n * m : y0 + c * n * m, team);
                if (copies == 1) { /* in cache: each call its own best */
                    best[v] = t < best[v] ? t : best[v];
                    t = 1e9;
                }
            }
            best[v] = t < best[v] ? t : best[v];
        }
    if (memcmp(y0, y1, sizeof(float) * (size_t)(copies * n * m))) *diff = 1;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *kinds = argc > 2 ? argv[2] : "01";
    const int m = argc > 3 ? atoi(argv[3]) : 1;
    const int64_t shp[3][2] = {{960, 960}, {320, 960}, {2560, 960}};
    const int k = 960;
    float *x = malloc(sizeof(float) * (size_t)(k * m));
    for (int64_t i = 0; i < k * m; ++i) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (const char *kc = kinds; *kc; ++kc) {
        const int bb = *kc == '0' ? 22 : 24;
        const ab_fn f[2] = {*kc == '0' ? old_q5_0 : old_q5_1, *kc == '0' ? gguf_matmul_q5_0_q8 : gguf_matmul_q5_1_q8};
        for (int team = 1; team >= (getenv("STANDALONE") != NULL ? 0 : 1); --team)
            for (int s = 0; s < 3; ++s) {
                const int64_t n = shp[s][0], rb = (k / 32) * bb, copies = MEM_BYTES / (n * rb) + 1;
                uint8_t *w = ab_random_blocks(n * copies, k / 32, bb, 0, *kc == '1', 0xff);
                const size_t ny = sizeof(float) * (size_t)(copies * n * m);
                float *y0 = malloc(ny), *y1 = malloc(ny);
                double tc[2], tm[2];
                int diff = 0;
                ab(f, w, 1, n, k, rb, x, m, y0, y1, reps * 4, team, tc, &diff);
                ab(f, w, copies, n, k, rb, x, m, y0, y1, reps, team, tm, &diff);
                const double gb = (double)(n * rb) / 1e9;
                printf("Q5_%c %4lld x %lld, %d rows %s: cache old %5.1f new %5.1f GB/s (new/old %.3f); memory old %5.1f new "
                       "%5.1f GB/s (new/old %.3f)%s\n",
                       *kc, (long long)n, (long long)k, m, team ? "team" : "solo", gb / tc[0], gb / tc[1], tc[0] / tc[1],
                       gb * copies / tm[0], gb * copies / tm[1], tm[0] / tm[1], diff ? "  BITS DIFFER" : "");
                free(w), free(y0), free(y1);
            }
    }
    free(x);
    return 0;
}
