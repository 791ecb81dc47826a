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
 * ~M x N x 4 bytes resident for good after the first long prefill). NULL scratch: each thread mallocs its own.
 * The tiles' panels (gemm_gguf_tile.c, 272 KB a thread) come from the caller's work for the same reason.
 *
 * x quantized once for the team: where the segments' int8-activation kernels read one of gguf_xq.h's GGUF_XQ_*
 * layouts and x has XQ_SHARE_ROWS rows or more, the team quantizes x into the caller's work (each thread its
 * team_share of x's rows), meets at the team's barrier, and every thread's kernel finds it (gguf_xq_find) instead
 * of quantizing all of x itself: one barrier instead of every thread quantizing (and mallocing) all of x for its
 * share of the weight rows, a 16-row step's k x 16 values per projection per thread. A lone row keeps its own (its
 * quantization costs less than the barrier). */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "gemm_gguf_q8.h"
#include "gemm_gguf_tile.h"
#include "gemm_kquant_q8.h"
#include "gguf_linear.h"
#include "gguf_xq.h"
#include "kernels.h"
#include "team_sync.h"

#define UNIT 16
#define XQ_SHARE_ROWS 2 /* fewest rows of x the team quantizes once for all its threads */
#define ALIGN(n) (((n) + 63) / 64 * 64)

static _Atomic long xq_rows;                 /* rows of x quantized by teams, all calls (a test's hook) */

static _Atomic int xq_share = 1;             /* 0: each thread quantizes x itself (an A/B's "before") */

long gguf_xq_team_rows(void) { return xq_rows; }
void gguf_xq_share(int on) { xq_share = on; }


/* bytes of the quantized x: GGUF_XQ_Q8's layout, the larger (q, d, s, qb, xb: 1 + 1 + 1/8 + 1 + 1/2 bytes a value) */
static int64_t xq_bytes(int64_t M, int64_t K) {
    const int64_t nb = K / 32;
    return ALIGN(M * K) + ALIGN(4 * 8 * M * nb) + ALIGN(4 * M * nb) + ALIGN(M * K) + ALIGN(16 * M * nb);
}

static int64_t work_bytes(int64_t M, int64_t K, int64_t threads) {
    return xq_bytes(M, K) + threads * ALIGN(4 * gguf_tile_work_floats(K));
}

int64_t gguf_team_work_bytes(int64_t M, int64_t K) { return work_bytes(M, K, GGUF_TEAM_THREADS); }

/* the thread's tile panels in the team's work, or NULL (gemm_gguf_tile.c mallocs its own) */
static float *tile_work(uint8_t *work, int64_t M, int64_t K) {
    const int t = omp_get_thread_num();
    return work == NULL || t >= GGUF_TEAM_THREADS ? NULL
                                                  : (float *)(work + xq_bytes(M, K) + t * ALIGN(4 * gguf_tile_work_floats(K)));
}

/* the x layout a kernel reads (GGUF_XQ_*), 0 for one that quantizes x its own way */
static int xq_format(gguf_matmul_fn fn) {
    if (fn == gguf_matmul_q4_0_q8 || fn == gguf_matmul_q4_1_q8 || fn == gguf_matmul_q4_1f_q8 || fn == gguf_matmul_q8_0_q8 ||
        fn == gguf_matmul_q5_0_q8 || fn == gguf_matmul_q5_1_q8 || fn == gguf_matmul_q4_0x4_q8 ||
        fn == gguf_matmul_q4_1x4_q8 || fn == gguf_matmul_q4_1fx4_q8)
        return GGUF_XQ_Q8;
    if (fn == gguf_matmul_q4_k_q8 || fn == gguf_matmul_q5_k_q8 || fn == gguf_matmul_q6_k_q8) return GGUF_XQ_Q8K;
    return 0;
}

static gguf_matmul_fn seg_fn(const gguf_seg *s, int step) {
    return s->fn_q8 != NULL && ((s->q8_steps >> step) & 1) ? s->fn_q8 : s->fn;
}

/* The layout for x [M, K] in work: its pointers, the format the first int8-activation segment reads (0: none) */
static gguf_xq xq_layout(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, uint8_t *work,
                         int step) {
    gguf_xq q = {x, M, K, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    for (int64_t i = 0; i < nseg && q.format == 0; ++i)
        if (seg_fn(segs + i, step) == segs[i].fn_q8) q.format = xq_format(segs[i].fn_q8);
    if (work == NULL || !xq_share || M < XQ_SHARE_ROWS || K % (q.format == GGUF_XQ_Q8K ? 256 : 32) != 0) q.format = 0;
    const int64_t nb = K / 32;
    q.q = (int8_t *)work;
    uint8_t *p = work + ALIGN(M * K); /* each array after the last, in xq_bytes' order */
    if (q.format == GGUF_XQ_Q8) {
        q.d = (float *)p, p += ALIGN(4 * 8 * M * nb);
        q.s = (float *)p, p += ALIGN(4 * M * nb);
        q.qb = (int8_t *)p, p += ALIGN(M * K);
        q.xb = (float *)p;
    } else if (q.format == GGUF_XQ_Q8K) {
        q.d = (float *)p, p += ALIGN(4 * M * (K / 256));
        q.bs = (int16_t *)p, p += ALIGN(2 * M * (K / 16));
        q.b32 = (int16_t *)p, p += ALIGN(2 * M * nb);
        q.qb = (int8_t *)p;
    }
    return q;
}

/* this thread's team_share of x's rows quantized into q's layout (the kernels' own row quantizers, so their bits) */
static void xq_rows_share(const gguf_xq *q) {
    int64_t r0, r1;
    team_share(q->m, &r0, &r1);
    const int64_t k = q->k, nb = k / 32;
    for (int64_t i = r0; i < r1; ++i) {
        if (q->format == GGUF_XQ_Q8) {
            float *d = q->d + 8 * i * nb, *s = q->s + i * nb;
            gguf_q8_quantize_row(q->x + i * k, k, q->q + i * k, d, s);
            gguf_q8_lanes_row(q->q + i * k, d, s, nb, q->m, i, q->qb, q->xb);
        } else {
            int16_t *bs = q->bs + i * (k / 16), *b32 = q->b32 + i * nb;
            gguf_q8k_quantize_row(q->x + i * k, k, q->q + i * k, q->d + i * (k / 256), bs);
            gguf_q8k_sums32(bs, nb, b32);
            gguf_xq_blocks(q->q + i * k, k / 256, 256, q->m, i, q->qb);
        }
    }
    if (r1 > r0) xq_rows += r1 - r0;
}

static int64_t units_of(const gguf_seg *s) { return (s->rows + UNIT - 1) / UNIT; }

/* rows [r0, r1) of segment s (its columns start at col) for every row of x */
static int seg_rows(const gguf_seg *s, int64_t col, int64_t r0, int64_t r1, const float *x, int64_t M, int64_t K,
                    const float *bias, float *part, float *panels, float *y, int64_t N, int add, int step) {
    const int64_t nr = r1 - r0;
    const uint8_t *w = s->w + r0 * s->row_bytes;
    const gguf_matmul_fn fn = seg_fn(s, step);
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
    else if (gguf_tile_matmul(s->row_fn, s->tile_block, s->interleave, s->row_bytes, w, nr, K, x, M, tmp, panels) != 0) {
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
                     float *scratch, void *work, float *y, int64_t N, int add, int step) {
    const gguf_xq q = xq_layout(segs, nseg, x, M, K, work, step);
    if (q.format != 0) {
        xq_rows_share(&q);
        team_barrier(); /* every row of x quantized before any thread's kernel reads one */
        gguf_xq_set(&q);
    }
    int64_t total = 0;
    for (int64_t i = 0; i < nseg; ++i) total += units_of(segs + i);
    int64_t u0, u1;
    team_share(total, &u0, &u1);
    int rc = 0;
    float *part = NULL;                            /* the thread's M x its rows of scratch, from its first row's column on */
    float *const panels_at = tile_work(work, M, K); /* its tiles' panels */
    for (int64_t i = 0, first = 0, col = 0; i < nseg && rc == 0; first += units_of(segs + i), col += segs[i].rows, ++i) {
        const int64_t n = units_of(segs + i), a = u0 > first ? u0 - first : 0, b = u1 - first < n ? u1 - first : n;
        if (a >= b) continue;
        if (part == NULL && scratch != NULL) part = scratch + M * (col + a * UNIT);
        const int64_t r1 = b * UNIT < segs[i].rows ? b * UNIT : segs[i].rows;
        rc = seg_rows(segs + i, col, a * UNIT, r1, x, M, K, bias, part, panels_at, y, N, add, step);
    }
    gguf_xq_set(NULL);
    team_barrier(); /* also: no thread quantizes the next x into work while another still reads this one */
    return rc;
}

int gguf_linear_run(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                    float *scratch, void *work, float *y, int64_t N, int nthreads, int step) {
    int rc = 0;
#pragma omp parallel num_threads(nthreads)
    {
        const int mine = gguf_linear_team(segs, nseg, x, M, K, bias, scratch, work, y, N, 0, step);
        if (mine) {
#pragma omp atomic write
            rc = mine;
        }
    }
    return rc;
}

int gguf_linear_f32(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                    float *y, int64_t N, int nthreads, int step) {
    /* the team's scratch and work from the calling thread's heap, not each thread's: a worker's freed temporary stays
     * in its own arena's top, which malloc_trim does not give back (what fits seg_rows' stack needs no scratch; a
     * lone decode row, no work: none at all) */
    const int64_t floats = M * N > 1024 ? M * N : 0, threads = nthreads < GGUF_TEAM_THREADS ? nthreads : GGUF_TEAM_THREADS;
    const int64_t work = step == GGUF_STEP_PREFILL || M >= XQ_SHARE_ROWS ? work_bytes(M, K, threads) : 0; /* all or none */
    uint8_t *buf = floats + work > 0 ? aligned_alloc(64, (size_t)(ALIGN(4 * floats) + work)) : NULL;
    if (floats + work > 0 && buf == NULL) return 3;
    const int rc = gguf_linear_run(segs, nseg, x, M, K, bias, floats ? (float *)buf : NULL,
                                   work ? buf + ALIGN(4 * floats) : NULL, y, N, nthreads, step);
    free(buf);
    return rc;
}
