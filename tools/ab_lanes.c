/* The 8-lane int8 batch kernels (npu_ops/csrc/gemm_gguf_q4_q8.c, gemm_kquant_q8_lanes.c) before / after a change,
 * in one binary: the old files (from a commit) compiled with their entry points renamed, the tree's as they are;
 * SmolLM2-1.7B's layer shapes ([2048, 2048], [8192, 2048], [2048, 8192]), random blocks, M rows of x, one thread,
 * old and new alternating, best of REPS each, timed by the thread's CPU clock (a shared machine's other work does
 * not count; its cache and SMT effects still do). Every call's output bits are compared (a blocking that changed a
 * bit prints BITS DIFFER). TILES=1 adds gemm_gguf_tile.c's fp32 tiles (a prefill piece's default path) on the same
 * weights. KINDS: 0 Q4_0, k Q4_K, 6 Q6_K.
 *
 *   mkdir -p /tmp/ab && git show REV:npu_ops/csrc/gemm_gguf_q4_q8.c > /tmp/ab/q4.c && \
 *   git show REV:npu_ops/csrc/gemm_kquant_q8_lanes.c > /tmp/ab/kq.c && cd npu_ops/csrc && \
 *   F="-O3 -march=native -fopenmp -std=gnu11 -I." && \
 *   gcc $F -c /tmp/ab/q4.c -o /tmp/ab/q4.o -Dgguf_matmul_q4_0_q8=old_q4_0 -Dgguf_matmul_q4_1_q8=old_q4_1 \
 *       -Dgguf_matmul_q4_1f_q8=old_q4_1f && \
 *   gcc $F -c /tmp/ab/kq.c -o /tmp/ab/kq.o -Dgguf_matmul_q4_k_q8=old_q4_k -Dgguf_matmul_q5_k_q8=old_q5_k \
 *       -Dgguf_matmul_q6_k_q8=old_q6_k && \
 *   gcc $F -o /tmp/ab/ab ../../tools/ab_lanes.c /tmp/ab/q4.o /tmp/ab/kq.o *.c -lm && \
 *   OMP_NUM_THREADS=1 /tmp/ab/ab 16 7 0k6        # M REPS KINDS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ab_common.h"
#include "gemm_gguf_tile.h"
#include "kernels.h"

void old_q4_0(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_q4_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_q6_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);

/* random blocks, a small fp16 d (and a K-quant's dmin) in every block: Q6_K's d is its last 2 bytes (208) */
static uint8_t *random_blocks(char kind, int64_t n, int64_t nb, int bb) {
    return ab_random_blocks(n, nb, bb, kind == '6' ? 208 : 0, kind == 'k', 0xff);
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? atoi(argv[1]) : 16, reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *kinds = argc > 3 ? argv[3] : "0k6";
    const int64_t shp[3][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
    float *x = malloc(sizeof(float) * (size_t)m * 8192), *y0 = malloc(sizeof(float) * (size_t)m * 8192),
          *y1 = malloc(sizeof(float) * (size_t)m * 8192);
    for (int64_t i = 0; i < (int64_t)m * 8192; ++i) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (const char *kc = kinds; *kc; ++kc) {
        const int bv = *kc == '0' ? 32 : 256, bb = *kc == '0' ? 18 : *kc == 'k' ? 144 : 210;
        const ab_fn fo = *kc == '0' ? old_q4_0 : *kc == 'k' ? old_q4_k : old_q6_k;
        const ab_fn fw = *kc == '0' ? gguf_matmul_q4_0_q8 : *kc == 'k' ? gguf_matmul_q4_k_q8 : gguf_matmul_q6_k_q8;
        void (*deq)(const uint8_t *, int64_t, float *) = *kc == '0' ? gguf_dequant_q4_0 : *kc == 'k' ? gguf_dequant_q4_k
                                                                                                    : gguf_dequant_q6_k;
        double to = 0, tn = 0, tt = 0, fl = 0;
        for (int s = 0; s < 3; ++s) {
            const int64_t n = shp[s][0], k = shp[s][1], nb = k / bv;
            uint8_t *w = random_blocks(*kc, n, nb, bb);
            double bo = 1e9, bn = 1e9, bt = 1e9;
            for (int r = 0; r < reps; ++r) {
                bo = ab_best(fo, w, n, k, x, m, y0, bo);
                bn = ab_best(fw, w, n, k, x, m, y1, bn);
            }
            if (memcmp(y0, y1, sizeof(float) * (size_t)(m * n))) printf("BITS DIFFER: kind %c, shape %d\n", *kc, s);
            for (int r = 0; getenv("TILES") != NULL && r < reps; ++r) {
                const double t = ab_now();
                gguf_tile_matmul(deq, bv, 1, nb * bb, w, n, k, x, m, y0, NULL);
                const double d = ab_now() - t;
                bt = d < bt ? d : bt;
            }
            to += bo, tn += bn, tt += bt, fl += 2.0 * m * (double)(n * k);
            free(w);
        }
        printf("kind %c, %d rows: old %.1f new %.1f GFLOP/s, new/old %.3f", *kc, m, fl / to / 1e9, fl / tn / 1e9, to / tn);
        if (getenv("TILES") != NULL) printf("; fp32 tiles %.1f GFLOP/s", fl / tt / 1e9);
        printf("\n");
    }
    return 0;
}
