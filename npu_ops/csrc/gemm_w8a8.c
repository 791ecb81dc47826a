/* W8A8 linears for the CPU (npu_ops/quant.py holds the PyTorch reference they are tested against).
 *
 * Every row of x is quantized on the fly to int8 with its own scale (amax / 127, rounded to nearest even,
 * as torch.round does), products accumulate in int32 and y = acc * x_scale[m] * w_scale[n] (+ bias).
 * Wq is packed in panels of ANR columns by groups of 4 k: Wp[N/ANR][K4][ANR][4] (K padded to K4 * 4 with
 * zeros), followed by one int32 per padded column: 128 * sum_k Wq[n, k] (the offset correction below).
 * The layout is this build's: pack and kernels come from the same library.
 *
 * Two integer cores, picked at build time:
 * - AVX512-VNNI (vpdpbusd: u8 x s8, four products summed into int32 with no int16 step): activations are
 *   stored offset, u = x + 128 in [1, 255], so the instruction takes them as they are;
 *   sum_k u * w = sum_k x * w + 128 * sum_k w, and the packed column sums take the second term back out
 *   exactly. Panels of 16 columns (one zmm), a tile of up to 8 rows x 32 columns in 16 accumulators.
 * - AVX2 (no VNNI): vpmaddubsw multiplies unsigned by signed bytes and adds pairs with int16 *saturation*,
 *   so offsets overflow (2 * 255 * 127 > 32767). The sign trick avoids it: maddubs(|x|, sign(w, x)) has the
 *   same products with |x| <= 127 (x is clamped to [-127, 127]), a pair sums to at most 32258;
 *   vpmaddwd against ones widens pairs to int32. Panels of 8 columns, tiles of 4 rows x 16 columns.
 * Without AVX2 plain loops compute the same integers. Threads: the OpenMP runtime PyTorch loaded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_w8a8.h"
#include "gemm_w8a8_row.h"
#include "gemm_w8a8_tile.h"
#include "kernels.h"
#include "quantize_rows.h"
#include "team_sync.h"

int64_t packed_w8a8_numel(int64_t N, int64_t K) { return npanels(N) * ANR * (k4_of(K) * 4 + 4); }

int w8a8_panel_width(void) { return ANR; }

void pack_w8a8(const int8_t *w, int64_t N, int64_t K, int8_t *wp) {
    const int64_t np = npanels(N), K4 = k4_of(K);
    int32_t *comp = (int32_t *)(wp + np * ANR * K4 * 4);
    for (int64_t p = 0; p < np; ++p)
        for (int64_t q = 0; q < K4; ++q)
            for (int64_t j = 0; j < ANR; ++j)
                for (int64_t i = 0; i < 4; ++i) {
                    const int64_t n = p * ANR + j, k = q * 4 + i;
                    wp[((p * K4 + q) * ANR + j) * 4 + i] = (n < N && k < K) ? w[n * K + k] : 0;
                }
    for (int64_t n = 0; n < np * ANR; ++n) {
        int32_t s = 0;
        for (int64_t k = 0; n < N && k < K; ++k) s += w[n * K + k];
        comp[n] = 128 * s;
    }
}

/* y = rows . Wq^T, scaled: xr rows (lda = K4 * 4 bytes) already in this core's activation format. Called by
 * every thread of a team (orphaned `omp for`); ends on the team's barrier. */
static void w8a8_rows_team(const int8_t *xr, const float *xs, int64_t M, int64_t K, const int8_t *wp,
                           const float *ws, int64_t N, const float *bias, float *y, const int8_t *zero, int add) {
    const int64_t K4 = k4_of(K), lda = K4 * 4, np = npanels(N), npair = (np + 1) / 2;
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * ANR * K4 * 4) : NULL;
    if (M == 1) {
        w8a8_row(xr, xs, K, wp, ws, N, bias, y, zero, add);
        team_barrier();
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp for schedule(static)
        for (int64_t pp = 0; pp < npair; ++pp) {
            const int64_t p0 = 2 * pp, n0 = p0 * ANR, ncols = N - n0 < TW ? N - n0 : TW;
            const int8_t *b0 = wp + p0 * K4 * ANR * 4, *b1 = p0 + 1 < np ? b0 + K4 * ANR * 4 : zero;
            int32_t c[AMR * TW];
            for (int64_t m = m0; m < m1; m += AMR) {
                const int mr = m1 - m < AMR ? (int)(m1 - m) : AMR;
                atile(mr, xr + m * lda, lda, b0, b1, K4, c);
                epilogue(c, mr, xs + m, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL,
                         y + m * N + n0, N, ncols, add);
            }
        }
    }
}

static void w8a8_rows(const int8_t *xr, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                      int64_t N, const float *bias, float *y, int nthreads, const int8_t *zero) {
#pragma omp parallel num_threads(nthreads)
    w8a8_rows_team(xr, xs, M, K, wp, ws, N, bias, y, zero, 0);
}

/* The fused layers' W8A8 linear (layers_f32.c), by every thread of a team: x's rows quantized into xq
 * (k4 * 4 bytes a row) and xs, then the tiles; zero: w8a8_zero_bytes(K) zero bytes; add: y += the result.
 * Same math as linear_w8a8_f32. One row (a one-stream decode step) is quantized by every thread into the
 * xq / xs it was given, which must then be its own: no barrier between quantizing and the tiles. */
void linear_w8a8_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                          const float *bias, float *y, int8_t *xq, float *xs, const int8_t *zero, int add) {
    const int64_t KP = k4_of(K) * 4;
    const int8_t flip = W8A8_VNNI ? (int8_t)0x80 : 0;
    if (M == 1) {
        quantize_row_i8(x, K, k4_of(K) * 4, xq, xs, flip);
    } else {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) quantize_row_i8(x + m * K, K, KP, xq + m * KP, xs + m, flip);
    }
    w8a8_rows_team(xq, xs, M, K, wp, ws, N, bias, y, zero, add);
}

int64_t w8a8_zero_bytes(int64_t K) { return k4_of(K) * ANR * 4; }

/* An odd last panel pairs with zeros: the scratch for it (NULL when N's panels pair up or none is had). */
static int8_t *zero_panel(int64_t N, int64_t K, int *failed) {
    if (npanels(N) % 2 == 0) return NULL;
    int8_t *z = calloc((size_t)(k4_of(K) * ANR * 4), 1);
    *failed = z == NULL;
    return z;
}

/* Rows quantized by quantize_rows_i8 (signed) into this core's format: a copy with offset bytes (VNNI), else
 * the rows as they are (*owned stays NULL). */
static const int8_t *core_rows(const int8_t *xq, int64_t M, int64_t K, int8_t **owned) {
    *owned = NULL;
    if (!W8A8_VNNI) return xq;
    const int64_t n = M * k4_of(K) * 4;
    *owned = malloc((size_t)n);
    if (*owned == NULL) return NULL;
    for (int64_t i = 0; i < n; ++i) (*owned)[i] = (int8_t)(xq[i] ^ (int8_t)0x80);
    return *owned;
}

/* y = (xq . Wq^T) * xs[m] * ws[n] (+ bias): xq, xs from quantize_rows_i8. Returns 0, or 3 without scratch. */
int linear_w8a8_i8(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                   int64_t N, const float *bias, float *y, int nthreads) {
    int failed = 0;
    int8_t *zero = zero_panel(N, K, &failed), *owned;
    const int8_t *rows = core_rows(xq, M, K, &owned);
    if (!failed && rows != NULL) w8a8_rows(rows, xs, M, K, wp, ws, N, bias, y, nthreads, zero);
    free(zero);
    free(owned);
    return failed || rows == NULL ? 3 : 0;
}

/* Raw int32 GEMM of already quantized rows (tests hold it to the exact integers at the +-127 extremes):
 * the same tiles with unit scales. */
int gemm_i8_i32(const int8_t *xq, int64_t M, int64_t K, const int8_t *wp, int64_t N, int32_t *acc) {
    const int64_t K4 = k4_of(K), np = npanels(N);
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * ANR * K4 * 4) : NULL;
    int failed = 0;
    int8_t *zero = zero_panel(N, K, &failed), *owned;
    const int8_t *rows = core_rows(xq, M, K, &owned);
    for (int64_t p0 = 0; !failed && rows != NULL && p0 < np; p0 += 2) {
        const int8_t *b0 = wp + p0 * K4 * ANR * 4, *b1 = p0 + 1 < np ? b0 + K4 * ANR * 4 : zero;
        const int64_t n0 = p0 * ANR, ncols = N - n0 < TW ? N - n0 : TW;
        int32_t c[AMR * TW];
        for (int64_t m = 0; m < M; m += AMR) {
            const int mr = M - m < AMR ? (int)(M - m) : AMR;
            atile(mr, rows + m * K4 * 4, K4 * 4, b0, b1, K4, c);
            for (int r = 0; r < mr; ++r)
                for (int64_t j = 0; j < ncols; ++j)
                    acc[(m + r) * N + n0 + j] = c[r * TW + j] - (comp != NULL ? comp[n0 + j] : 0);
        }
    }
    free(zero);
    free(owned);
    return failed || rows == NULL ? 3 : 0;
}

/* fp32 rows in, fp32 out: the rows quantized straight into this core's format in scratch of its own, then
 * the tiles (one call from Python per linear, no int8 tensors allocated by the caller). Returns 0, or 3 when
 * the scratch cannot be had. */
int linear_w8a8_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                    const float *bias, float *y, int nthreads) {
    int failed = 0;
    int8_t *xq = malloc((size_t)(M * k4_of(K) * 4)), *zero = zero_panel(N, K, &failed);
    float *xs = malloc(sizeof(float) * (size_t)M);
    if (xq != NULL && xs != NULL && !failed) {
        quantize_rows_offset(x, M, K, k4_of(K) * 4, xq, xs, nthreads, W8A8_VNNI);
        w8a8_rows(xq, xs, M, K, wp, ws, N, bias, y, nthreads, zero);
    }
    const int rc = xq == NULL || xs == NULL || failed ? 3 : 0;
    free(xq);
    free(xs);
    free(zero);
    return rc;
}
