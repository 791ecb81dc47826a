/* W8A8 linears of one row (a one-stream decode step) by every thread of a team: a share of the panels each, in
 * GQ groups of streams (gemm_w8a8_tile.h); the fused layers' gate/up projection with silu(gate) * up in its epilogue. */
#include <stdint.h>

#include "gemm_w8a8_tile.h"
#include "layers_f32.h"
#include "quantize_rows.h"
#include "team_sync.h"
/* pair pp's single-row tile c scaled into y */
static void pair_store(const int32_t *c, int64_t pp, int64_t N, const float *xs, const int32_t *comp, const float *ws,
                       const float *bias, float *y, int add) {
    const int64_t n0 = 2 * pp * ANR, ncols = N - n0 < TW ? N - n0 : TW;
    epilogue(c, 1, xs, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL, y + n0, N, ncols,
             add);
}

/* One row: this thread's share of the panel pairs (split by hand, balanced to one pair), GQ pairs at a time. */
void w8a8_row(const int8_t *xr, const float *xs, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                     const float *bias, float *y, const int8_t *zero, int add) {
    const int64_t K4 = k4_of(K), np = npanels(N), npair = (np + 1) / 2, psz = K4 * ANR * 4;
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * psz) : NULL;
    int64_t q0, q1;
    team_share(npair, &q0, &q1);
    int32_t c[GQ * TW];
    /* GQ pairs at a time, one from each GQ-th of the share (streams far apart: gemm.c's row_panels); a last
     * pair with an odd panel (zero for its second) goes with the rest, one by one */
    const int64_t whole = q1 == npair && np % 2 ? q1 - 1 : q1, q = whole > q0 ? (whole - q0) / GQ : 0;
    for (int64_t i = 0; i < q; ++i) {
        const int8_t *bp[2 * GQ];
        for (int g = 0; g < GQ; ++g) bp[2 * g] = wp + 2 * (q0 + g * q + i) * psz, bp[2 * g + 1] = bp[2 * g] + psz;
        arow_multi(xr, bp, K4, c);
        for (int g = 0; g < GQ; ++g) pair_store(c + g * TW, q0 + g * q + i, N, xs, comp, ws, bias, y, add);
    }
    for (int64_t pp = q0 + GQ * q; pp < q1; ++pp) {
        const int8_t *b0 = wp + 2 * pp * psz, *b1 = 2 * pp + 1 < np ? b0 + psz : zero;
        atile(1, xr, K4 * 4, b0, b1, K4, c);
        pair_store(c, pp, N, xs, comp, ws, bias, y, add);
    }
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

void gate_up_silu_w8a8_team(const float *x, int64_t K, const int8_t *wp, const float *ws, int64_t inter,
                            const float *bias, float *h, int8_t *xq, float *xs) {
    const int64_t K4 = k4_of(K), half = inter / ANR, psz = K4 * ANR * 4;
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + npanels(2 * inter) * psz) : NULL;
    quantize_row_i8(x, K, K4 * 4, xq, xs, W8A8_VNNI ? (int8_t)0x80 : 0);
    int64_t p0, p1;
    team_share(half, &p0, &p1);
    int32_t c[GQ * TW];
    /* GQ pairs at a time, one from each GQ-th of the share: a pair is gate panel p and up panel half + p */
    const int64_t q = (p1 - p0) / GQ;
    for (int64_t i = 0; i < q; ++i) {
        const int8_t *bp[2 * GQ];
        for (int g = 0; g < GQ; ++g) bp[2 * g] = wp + (p0 + g * q + i) * psz, bp[2 * g + 1] = bp[2 * g] + half * psz;
        arow_multi(xq, bp, K4, c);
        for (int g = 0; g < GQ; ++g) gate_up_store(c + g * TW, p0 + g * q + i, inter, xs, comp, ws, bias, h);
    }
    for (int64_t p = p0 + GQ * q; p < p1; ++p) {
        atile(1, xq, K4 * 4, wp + p * psz, wp + (half + p) * psz, K4, c);
        gate_up_store(c, p, inter, xs, comp, ws, bias, h);
    }
    team_barrier();
}
