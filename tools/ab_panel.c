/* The fp32-activation K-quant kernels (npu_ops/csrc/gemm_kquant.c) before / after a change, in one binary: the old
 * file (from a commit) compiled with its entry points renamed, the tree's as it is. Shapes: the head of a llama.cpp
 * mix ([49152, 2048], Q6_K) and SmolLM2-1.7B's layers ([2048, 2048], [8192, 2048], [2048, 8192]) for Q4_K and
 * Q5_K; random blocks, M rows of x (M > 4: the panel path), one thread, old and new alternating, best of REPS each,
 * timed by the thread's CPU clock (a shared machine's other work does not count; its cache and SMT effects still
 * do). Every call's output bits are compared (BITS DIFFER), and first the panels themselves: the tree's
 * kquant_decode_panel against the old way (each row's super-block by the old file's decode, then
 * f32_panel_from_rows), byte for byte, on every type with a short last panel (PANEL BYTES DIFFER).
 *
 *   mkdir -p /tmp/ab && git show REV:npu_ops/csrc/gemm_kquant.c > /tmp/ab/kq.c && cd npu_ops/csrc && \
 *   F="-O3 -march=native -fopenmp -std=gnu11 -I." && \
 *   gcc $F -c /tmp/ab/kq.c -o /tmp/ab/kq.o -Dgguf_matmul_q4_k=old_q4_k -Dgguf_matmul_q5_k=old_q5_k \
 *       -Dgguf_matmul_q6_k=old_q6_k -Dgguf_kquant_decode_block=old_decode_block \
 *       -Dgguf_matmul_kquant_team=old_team -Dgguf_dequant_q4_k=old_dq4 -Dgguf_dequant_q5_k=old_dq5 \
 *       -Dgguf_dequant_q6_k=old_dq6 && \
 *   gcc $F -o /tmp/ab/ab ../../tools/ab_panel.c /tmp/ab/kq.o *.c -lm && \
 *   OMP_NUM_THREADS=1 /tmp/ab/ab 16 5 k56        # M REPS KINDS (k Q4_K, 5 Q5_K, 6 Q6_K)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ab_common.h"
#include "gemm_kquant_panel.h"
#include "gemm_tile.h"
#include "kernels.h"
#include "kquant_block.h"

void old_q4_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_q5_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_q6_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y);
void old_decode_block(int type, const uint8_t *block, float *out);

/* random blocks, a small fp16 d (and Q4_K / Q5_K's dmin) in every block, with the sign bit now and then */
static uint8_t *random_blocks(int type, int64_t n, int64_t nb) {
    return ab_random_blocks(n, nb, KQ_BLOCK_BYTES(type), type == GGUF_KQ_Q6_K ? 208 : 0, type != GGUF_KQ_Q6_K, 0x1ff);
}

/* the old decode_panel: each row's super-block decoded alone, then 8 x 8 float transposes; zeros past n_out */
static void old_panel(int type, const uint8_t *w, int64_t p, int64_t n_out, int64_t k, float *panel) {
    const int64_t nb = k / 256, bb = KQ_BLOCK_BYTES(type);
    float tmp[16 * 256];
    for (int64_t i = 0; i < nb; ++i) {
        for (int64_t j = 0; j < 16; ++j) {
            if (p * 16 + j < n_out) old_decode_block(type, w + ((p * 16 + j) * nb + i) * bb, tmp + j * 256);
            else memset(tmp + j * 256, 0, 256 * sizeof(float));
        }
        f32_panel_from_rows(tmp, 256, 256, panel + i * 256 * 16);
    }
}

static int panels_equal(int type) {
    const int64_t n = 37, k = 1024, np = (n + 15) / 16;
    uint8_t *w = random_blocks(type, n, k / 256);
    float *a = malloc(sizeof(float) * (size_t)(k * 16)), *b = malloc(sizeof(float) * (size_t)(k * 16));
    int same = 1;
    for (int64_t p = 0; p < np; ++p) {
        old_panel(type, w, p, n, k, a);
        kquant_decode_panel(type, w, p, n, k, b);
        same &= !memcmp(a, b, sizeof(float) * (size_t)(k * 16));
    }
    free(w), free(a), free(b);
    return same;
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? atoi(argv[1]) : 16, reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *kinds = argc > 3 ? argv[3] : "k56";
    const int64_t layers[3][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}}, head[1][2] = {{49152, 2048}};
    for (int t = 0; t < 3; ++t)
        if (!panels_equal(t)) printf("PANEL BYTES DIFFER: type %d\n", t);
    float *x = malloc(sizeof(float) * (size_t)m * 8192), *y0 = malloc(sizeof(float) * (size_t)m * 49152),
          *y1 = malloc(sizeof(float) * (size_t)m * 49152);
    for (int64_t i = 0; i < (int64_t)m * 8192; ++i) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (const char *kc = kinds; *kc; ++kc) {
        const int type = *kc == 'k' ? GGUF_KQ_Q4_K : *kc == '5' ? GGUF_KQ_Q5_K : GGUF_KQ_Q6_K;
        const ab_fn fo = type == GGUF_KQ_Q4_K ? old_q4_k : type == GGUF_KQ_Q5_K ? old_q5_k : old_q6_k;
        const ab_fn fw = type == GGUF_KQ_Q4_K   ? gguf_matmul_q4_k
                      : type == GGUF_KQ_Q5_K ? gguf_matmul_q5_k
                                             : gguf_matmul_q6_k;
        const int64_t(*shp)[2] = type == GGUF_KQ_Q6_K ? head : layers;
        const int ns = type == GGUF_KQ_Q6_K ? 1 : 3;
        double to = 0, tn = 0, fl = 0;
        for (int s = 0; s < ns; ++s) {
            const int64_t n = shp[s][0], k = shp[s][1];
            uint8_t *w = random_blocks(type, n, k / 256);
            double bo = 1e9, bn = 1e9;
            for (int r = 0; r < reps; ++r) {
                bo = ab_best(fo, w, n, k, x, m, y0, bo);
                bn = ab_best(fw, w, n, k, x, m, y1, bn);
            }
            if (memcmp(y0, y1, sizeof(float) * (size_t)(m * n))) printf("BITS DIFFER: kind %c, shape %d\n", *kc, s);
            to += bo, tn += bn, fl += 2.0 * m * (double)(n * k);
            free(w);
        }
        printf("kind %c, %d rows: old %.1f new %.1f GFLOP/s, new/old %.3f\n", *kc, m, fl / to / 1e9, fl / tn / 1e9,
               to / tn);
    }
    return 0;
}
