/* The fp32-activation entry points of gguf_x4.h's interleaved 4-bit types (the int8 ones are gemm_gguf_q4_q8.c's):
 * each group of 4 rows un-interleaved into a buffer on the stack and run by the type's own kernel (gemm_gguf.c) on
 * the calling thread, its [m, 4] results put in y's columns. That kernel's outputs sum in one order whatever its rows
 * or the thread split, so these are its bits. These run a decode step under ggufActivations fp32 and the kernels'
 * own tests; a prefill piece takes the tiles (gemm_gguf_tile.c un-interleaves its panels' rows itself).
 * Threads: groups split over a team of their own, or the calling thread alone inside any team. */
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "gguf_x4.h"
#include "kernels.h"
#include "team_sync.h"

#define QK 32
#define MY 256           /* rows of x a pass (its [MY, 4] results on the stack) */
#define STACK_ROWS 65536 /* a group's un-interleaved bytes on the stack up to this (k 16384 of Q4_1F: 48 KiB) */

typedef void (*x4_base_fn)(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);

static void x4_groups(x4_base_fn base, int64_t bb, const uint8_t *w, int64_t n_out, int64_t k, const float *x,
                      int64_t m, float *y, int64_t g0, int64_t g1) {
    const int64_t rb = k / QK * bb;
    uint8_t stack[STACK_ROWS], *rows = GGUF_X4_ROWS * rb <= STACK_ROWS ? stack : malloc((size_t)(GGUF_X4_ROWS * rb));
    if (rows == NULL) return;
    float yt[MY * GGUF_X4_ROWS];
    for (int64_t g = g0; g < g1; ++g) {
        gguf_x4_rows(w + g * GGUF_X4_ROWS * rb, bb, 0, k / QK, rows, rb);
        for (int64_t i0 = 0; i0 < m; i0 += MY) {
            const int64_t mi = m - i0 < MY ? m - i0 : MY;
            base(rows, GGUF_X4_ROWS, k, x + i0 * k, mi, yt);
            for (int64_t i = 0; i < mi; ++i)
                memcpy(y + (i0 + i) * n_out + g * GGUF_X4_ROWS, yt + i * GGUF_X4_ROWS, sizeof(float) * GGUF_X4_ROWS);
        }
    }
    if (rows != stack) free(rows);
}

static void matmul_x4(x4_base_fn base, int64_t bb, const uint8_t *w, int64_t n_out, int64_t k, const float *x,
                      int64_t m, float *y) {
    if (k % QK != 0 || m <= 0 || n_out % GGUF_X4_ROWS != 0) return; /* the Python side refuses these first */
    const int64_t groups = n_out / GGUF_X4_ROWS;
    if (omp_get_level() > 0 || groups == 1) { /* inside any team: the base kernel runs on this thread alone too */
        x4_groups(base, bb, w, n_out, k, x, m, y, 0, groups);
        return;
    }
#pragma omp parallel
    {
        int64_t g0, g1;
        team_share(groups, &g0, &g1);
        x4_groups(base, bb, w, n_out, k, x, m, y, g0, g1);
    }
}

void gguf_matmul_q4_0x4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_x4(gguf_matmul_q4_0, 18, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1x4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_x4(gguf_matmul_q4_1, 20, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1fx4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_x4(gguf_matmul_q4_1f, 24, w, n_out, k, x, m, y);
}
