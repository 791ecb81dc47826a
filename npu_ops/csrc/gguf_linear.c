/* A projection over GGUF block-quantized weights, shared by a team: its output rows are one or more segments (a
 * packed qkv or gate/up whose parts hold different block types, e.g. Q4_K_M's q/k in Q4_K and v in Q6_K), each
 * run by its type's kernel (void gguf_matmul_<type>(w, n_out, k, x, m, y), y[m, n_out] = x . W^T, W as GGUF
 * stores it) reached through the function pointer npu_ops/quant_gguf.py's type table puts in the segment: its
 * int8-activation kernel (fn_q8) for a call of a step kind the segment's q8_steps names (a decode step, a prefill
 * piece: the caller says which), else its fp32-activation one (fn), or for a prefill piece gemm_gguf_tile.c's tiles
 * over the type's row kernel where the segment says (tile_block). The
 * kernels are the table's, so a type added there runs here (and in the fused decoder) without a line of C.
 *
 * The rows are cut into units of UNIT rows per segment, the units split over the team by team_share; each thread
 * calls a segment's kernel once on its consecutive units (inside the team: the kernel runs on the calling thread
 * alone) and writes the result, plus the bias, into y's columns, or adds it (add: the residual stream, the
 * rounding of PyTorch's `x + linear(h)`). The standalone entry point (gguf_linear_f32) is this team half in a team
 * of its own, so the op-by-op path and the fused decoder give the same bits at the same thread count.
 *
 * A thread's results go through a temporary [M, its rows] before they reach y's columns: its part of the caller's
 * scratch [M, N] (the threads' rows partition N), allocated by the calling thread. A temporary a worker thread
 * mallocs itself outlives its free: glibc keeps a freed block in that thread's arena, whose top malloc_trim(0) never
 * gives back, and the dynamic mmap threshold (raised by every large free) sends the next one there too (issue 44:
 * ~M x N x 4 bytes resident for good after the first long prefill). NULL scratch: each thread mallocs its own. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "gemm_gguf_tile.h"
#include "gguf_linear.h"
#include "kernels.h"
#include "team_sync.h"

#define UNIT 16

static int64_t units_of(const gguf_seg *s) { return (s->rows + UNIT - 1) / UNIT; }

/* rows [r0, r1) of segment s (its columns start at col) for every row of x */
static int seg_rows(const gguf_seg *s, int64_t col, int64_t r0, int64_t r1, const float *x, int64_t M, int64_t K,
                    const float *bias, float *part, float *y, int64_t N, int add, int step) {
    const int64_t nr = r1 - r0;
    const uint8_t *w = s->w + r0 * s->row_bytes;
    const gguf_matmul_fn fn = s->fn_q8 != NULL && ((s->q8_steps >> step) & 1) ? s->fn_q8 : s->fn;
    /* a prompt piece on fp32 activations: the tiles, at every row count (a row's bits must not depend on how much
     * of its prompt was cached: the step kind chooses, never the rows) */
    const int tiles = step == GGUF_STEP_PREFILL && fn == s->fn && s->tile_block > 0 && s->row_fn != NULL;
    if (M == 1 && !add && bias == NULL && !tiles) {
        fn(w, nr, K, x, 1, y + col + r0);
        return 0;
    }
    float stack[1024], *tmp = M * nr <= 1024 ? stack : part != NULL ? part : malloc(sizeof(float) * (size_t)(M * nr));
    if (tmp == NULL) return 3;
    if (!tiles)
        fn(w, nr, K, x, M, tmp);
    else if (gguf_tile_matmul(s->row_fn, s->tile_block, s->row_bytes, w, nr, K, x, M, tmp) != 0) {
        if (tmp != stack && tmp != part) free(tmp);
        return 3;
    }
    for (int64_t m = 0; m < M; ++m) {
        float *yr = y + m * N + col + r0;
        const float *t = tmp + m * nr, *b = bias == NULL ? NULL : bias + col + r0;
        for (int64_t j = 0; j < nr; ++j) {
            const float v = b == NULL ? t[j] : t[j] + b[j];
            yr[j] = add ? yr[j] + v : v;
        }
    }
    if (tmp != stack && tmp != part) free(tmp);
    return 0;
}

int64_t gguf_seg_count(const gguf_seg *segs) {
    int64_t n = 0;
    while (segs[n].fn != NULL) ++n;
    return n;
}

int gguf_linear_team(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                     float *scratch, float *y, int64_t N, int add, int step) {
    int64_t total = 0;
    for (int64_t i = 0; i < nseg; ++i) total += units_of(segs + i);
    int64_t u0, u1;
    team_share(total, &u0, &u1);
    int rc = 0;
    float *part = NULL; /* the thread's own part of scratch: M x its rows, from its first row's column on */
    for (int64_t i = 0, first = 0, col = 0; i < nseg && rc == 0; first += units_of(segs + i), col += segs[i].rows, ++i) {
        const int64_t n = units_of(segs + i), a = u0 > first ? u0 - first : 0, b = u1 - first < n ? u1 - first : n;
        if (a >= b) continue;
        if (part == NULL && scratch != NULL) part = scratch + M * (col + a * UNIT);
        const int64_t r1 = b * UNIT < segs[i].rows ? b * UNIT : segs[i].rows;
        rc = seg_rows(segs + i, col, a * UNIT, r1, x, M, K, bias, part, y, N, add, step);
    }
    team_barrier();
    return rc;
}

int gguf_linear_run(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                    float *scratch, float *y, int64_t N, int nthreads, int step) {
    int rc = 0;
#pragma omp parallel num_threads(nthreads)
    {
        const int mine = gguf_linear_team(segs, nseg, x, M, K, bias, scratch, y, N, 0, step);
        if (mine) {
#pragma omp atomic write
            rc = mine;
        }
    }
    return rc;
}

int gguf_linear_f32(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                    float *y, int64_t N, int nthreads, int step) {
    /* the team's scratch from the calling thread's heap, not each thread's: a worker's freed temporary stays in its
     * own arena's top, which malloc_trim does not give back (what fits seg_rows' stack needs none) */
    const int need = M * N > 1024;
    float *scratch = need ? malloc(sizeof(float) * (size_t)(M * N)) : NULL;
    if (need && scratch == NULL) return 3;
    const int rc = gguf_linear_run(segs, nseg, x, M, K, bias, scratch, y, N, nthreads, step);
    free(scratch);
    return rc;
}
