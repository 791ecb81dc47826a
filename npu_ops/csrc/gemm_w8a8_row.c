/* W8A8 linears of one row (a one-stream decode step) by every thread of a team: a share of the panels each, in
 * GQ groups of streams (gemm_w8a8_tile.h); the fused layers' gate/up projection with silu(gate) * up in its epilogue. */
#include <omp.h>
#include <stdint.h>

#include "elementwise.h"
#include "gemm_w8a8_row.h"
#include "gemm_w8a8_tile.h"
#include "quantize_rows.h"
#include "team_sync.h"
/* pair pp's single-row tile c scaled into y */
static void pair_store(const int32_t *c, int64_t pp, int64_t N, const float *xs, const int32_t *comp, const float *ws,
                       const float *bias, float *y, int add) {
    const int64_t n0 = 2 * pp * ANR, ncols = N - n0 < TW ? N - n0 : TW;
    epilogue(c, 1, xs, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL, y + n0, N, ncols,
             add);
}

/* at(ctx, p, b) points b[0], b[1] at pair p's two panels, put(ctx, p, c) takes its sums. */
typedef void (*pair_at)(const void *ctx, int64_t p, const int8_t **b);
typedef void (*pair_put)(const void *ctx, int64_t p, const int32_t *c);

/* unit u of a share of n pairs from q0: the units in round order (gemm_w8a8_tile.h's row_rounds), round i's
 * stream g unit i * W + g, so that the front of a share is whole rounds and its back single pairs */
static int64_t unit_pair(int64_t q0, int64_t n, int64_t u) {
    const int64_t W = row_width(n), R = row_rounds(n), i = u / W < R - 1 ? u / W : R - 1;
    return q0 + row_pair(n, (int)(u - i * W), i);
}

/* thread t's share of the pairs: its first and how many */
static void share_of(int64_t total, int t, int64_t *q0, int64_t *n) {
    int64_t q1;
    team_share_of(total, t, q0, &q1);
    *n = q1 - *q0;
}

/* The total pairs of one row over the team (team_work_*): this thread's share in rounds of up to GQ streams, each
 * round asking ahead for the next round's streams, then single pairs from the ends of the others' shares. */
static void row_pairs(const int8_t *xr, int64_t K4, int64_t total, pair_at at, pair_put put, const void *ctx) {
    int32_t c[GQ * TW];
    const int8_t *bp[2 * GQ], *nbp[2 * GQ];
    int64_t q0, n, got;
    share_of(total, omp_get_thread_num(), &q0, &n);
    team_work_open(n);
    const int64_t rounds = row_rounds(n);
    int64_t u = team_work_front(rounds > 0 ? row_streams(n, 0) : 0, &got);
    for (int64_t i = 0; got > 0; ++i) {
        const int G = (int)got, nG = i + 1 < rounds ? row_streams(n, i + 1) : 0;
        for (int g = 0; g < G; ++g) at(ctx, unit_pair(q0, n, u + g), bp + 2 * g);
        for (int g = 0; g < nG; ++g) at(ctx, unit_pair(q0, n, u + G + g), nbp + 2 * g);
        arow_multi(G, xr, bp, nG > 0 ? nbp : NULL, nG, K4, c);
        for (int g = 0; g < G; ++g) put(ctx, unit_pair(q0, n, u + g), c + g * TW);
        got = 0;
        if (nG > 0) u = team_work_front(nG, &got);
    }
    int who;
    int64_t unit;
    while (team_work_steal(&who, &unit)) {
        share_of(total, who, &q0, &n);
        const int64_t p = unit_pair(q0, n, unit);
        at(ctx, p, bp);
        arow_multi(1, xr, bp, NULL, 0, K4, c);
        put(ctx, p, c);
    }
}

typedef struct {
    const int8_t *wp, *zero;
    const float *xs, *ws, *bias;
    const int32_t *comp;
    float *y;
    int64_t np, psz, N; /* gate/up: np is gate's panels (the `half`) */
    int add;
} row_job;

/* pair p of a linear: panels 2 p and the next (zero past an odd last one) */
static void linear_pair_at(const void *ctx, int64_t p, const int8_t **b) {
    const row_job *j = ctx;
    b[0] = j->wp + 2 * p * j->psz;
    b[1] = 2 * p + 1 < j->np ? b[0] + j->psz : j->zero;
}

static void linear_pair_put(const void *ctx, int64_t p, const int32_t *c) {
    const row_job *j = ctx;
    pair_store(c, p, j->N, j->xs, j->comp, j->ws, j->bias, j->y, j->add);
}

/* One row: the panel pairs over the team (row_pairs). */
void w8a8_row(const int8_t *xr, const float *xs, int64_t K, const int8_t *wp, const float *ws, int64_t N,
              const float *bias, float *y, const int8_t *zero, int add) {
    const int64_t K4 = k4_of(K), np = npanels(N), psz = K4 * ANR * 4;
    const row_job job = {wp, zero, xs, ws, bias, W8A8_VNNI ? (const int32_t *)(wp + np * psz) : NULL, y, np, psz, N,
                         add};
    row_pairs(xr, K4, (np + 1) / 2, linear_pair_at, linear_pair_put, &job);
}

/* gate/up panel pair p's single-row sums c (gate's ANR columns, then up's) -> silu(gate) * up into h's columns
 * p * ANR ...: each element through the W8A8 linear's epilogue, then silu_mul_row_f32 (whole vectors: the bits it
 * gives the element over the whole row) */
static void gate_up_store(const int32_t *c, int64_t p, int64_t inter, const float *xs, const int32_t *comp,
                          const float *ws, const float *bias, float *h) {
    const int64_t n0 = p * ANR, u0 = inter + n0;
    float g[ANR], u[ANR];
    epilogue(c, 1, xs, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL, g, ANR, ANR, 0);
    epilogue(c + ANR, 1, xs, comp != NULL ? comp + u0 : NULL, ws + u0, bias != NULL ? bias + u0 : NULL, u, ANR, ANR,
             0);
    silu_mul_row_f32(g, u, h + n0, ANR);
}

/* gate/up pair p: gate panel p and up panel half + p */
static void gate_up_pair_at(const void *ctx, int64_t p, const int8_t **b) {
    const row_job *j = ctx;
    b[0] = j->wp + p * j->psz;
    b[1] = b[0] + j->np * j->psz;
}

static void gate_up_pair_put(const void *ctx, int64_t p, const int32_t *c) {
    const row_job *j = ctx;
    gate_up_store(c, p, j->N, j->xs, j->comp, j->ws, j->bias, j->y);
}

void gate_up_silu_w8a8_team(const float *x, int64_t K, const int8_t *wp, const float *ws, int64_t inter,
                            const float *bias, float *h, int8_t *xq, float *xs) {
    const int64_t K4 = k4_of(K), half = inter / ANR, psz = K4 * ANR * 4;
    quantize_row_i8(x, K, K4 * 4, xq, xs, W8A8_VNNI ? (int8_t)0x80 : 0);
    /* N: inter (gate_up_store's); np: gate's panels */
    const row_job job = {wp, NULL, xs, ws, bias,
                         W8A8_VNNI ? (const int32_t *)(wp + npanels(2 * inter) * psz) : NULL, h, half, psz, inter, 0};
    row_pairs(xq, K4, half, gate_up_pair_at, gate_up_pair_put, &job);
    team_barrier();
}
