/* Prompt pieces over GGUF block-quantized weights through fp32 tiles (issue 44): y[m, n_out] = x[m, k] . W^T, W as
 * a GGUF file stores it. The packed kernels (gemm_gguf.c, gemm_kquant.c) decode a few weight rows at a time and
 * stream every row of x past them; for a prompt that left the FMA units waiting on x (fp32 sgemm over the same
 * weights dequantized ran a 512-token prefill ~2x faster). Here, GotoBLAS-style: a thread takes NC of its weight
 * rows and a K-chunk of KC columns, dequantizes that tile once with the type's own row kernel (gguf_dequant_<type>,
 * the values gguf.quants.dequantize gives, bit for bit) into 16-row k-major panels (NC x KC fp32, in L2), then runs
 * a 6 x 16 register tile (twelve ymm accumulators, one broadcast of x and two panel loads per k) over every 6 rows
 * of x, each panel in turn. The next K-chunk reloads the tile's partial sums from y. KC and NC measured on this CPU
 * (one core, Q4_0 [5120, 960] and Q4_K [960, 2560] at 512 rows, [2048, 8192] at 256): KC 256 x NC 128 gave 71-75
 * GFLOP/s, 1024 x 32 68-91, 4096 x 16 88-95, as gemm_kquant.c's whole-K panels (92-95) and our fp32 sgemm (~90).
 *
 * Numerics: each output is one FMA chain, fma(x[k], w[k], acc) for k ascending from acc = 0; spilling acc to y
 * between K-chunks stores an fp32 exactly, so the chain, and its bits, do not depend on m, the row's place in the
 * tile, the K-chunking or the thread split: a row's result is its own. It differs from `x @ dequantize(W).T`
 * only in the order of the fp32 sums. Without AVX2 a plain fmaf loop makes the same chain. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_gguf_tile.h"
#include "gemm_tile.h"
#include "gguf_x4.h"
#include "kernels.h"

#define NR F32_TILE_NR /* weight rows a panel (the register tile's width) */
#define MR F32_TILE_MR /* rows of x a register tile */
#define KC 4096        /* columns a tile (whole blocks of every type: 32, 256); most projections' whole K */
#define NC 16          /* weight rows a tile: one panel, NC x KC fp32 = 256 KB, half this CPU's L2 */
#define DC 256         /* columns decoded at a time into the transposing scratch (16 x DC: 16 KB) */

typedef void (*row_dequant_fn)(const uint8_t *w, int64_t k, float *out);

#ifdef __AVX2__
#include <immintrin.h>

/* c[R, 16] += a[R, kc] (rows lda apart) . panel b[kc, 16]; inlined with a constant R so c lives in registers */
static inline __attribute__((always_inline)) void tile_acc_r(const int R, const float *restrict a, int64_t lda,
                                                             const float *restrict b, int64_t kc, float *restrict c) {
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        c0[r] = _mm256_loadu_ps(c + r * NR);
        c1[r] = _mm256_loadu_ps(c + r * NR + 8);
    }
    for (int64_t k = 0; k < kc; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(c + r * NR, c0[r]);
        _mm256_storeu_ps(c + r * NR + 8, c1[r]);
    }
}

#define TILE(R)                                                                                \
    static void tile_acc##R(const float *a, int64_t lda, const float *b, int64_t kc, float *c) { \
        tile_acc_r(R, a, lda, b, kc, c);                                                       \
    }
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)
typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *);
static const tile_fn TILES[MR + 1] = {0, tile_acc1, tile_acc2, tile_acc3, tile_acc4, tile_acc5, tile_acc6};
#define TILE_ACC(R, a, lda, b, kc, c) TILES[R](a, lda, b, kc, c)

#else
static void tile_acc(int R, const float *a, int64_t lda, const float *b, int64_t kc, float *c) {
    for (int r = 0; r < R; ++r)
        for (int64_t k = 0; k < kc; ++k)
            for (int j = 0; j < NR; ++j) c[r * NR + j] = fmaf(a[r * lda + k], b[k * NR + j], c[r * NR + j]);
}
#define TILE_ACC(R, a, lda, b, kc, c) tile_acc(R, a, lda, b, kc, c)

#endif

/* Weight rows [n0, n0 + nc) x columns [k0, k0 + kc) dequantized into ceil(nc / 16) k-major panels (rows past nc:
 * zeros), DC columns at a time through rows (16 x DC floats of scratch, in L1). */
static void decode_tile(row_dequant_fn row_fn, int64_t block_vals, int x4, int64_t row_bytes, const uint8_t *w,
                        int64_t n0, int64_t nc, int64_t k0, int64_t k, int64_t kc, float *panels, int64_t ps,
                        float *rows) {
    const int64_t bb = row_bytes / (k / block_vals), cb = DC / block_vals * bb; /* x4: a row's bytes in own[] */
    uint8_t own[GGUF_X4_ROWS * (DC / 32) * GGUF_X4_MAX_BLOCK]; /* x4: a group's dc columns as GGUF stores them */
    for (int64_t p = 0; p * NR < nc; ++p)
        for (int64_t d0 = 0; d0 < kc; d0 += DC) {
            const int64_t dc = kc - d0 < DC ? kc - d0 : DC, off = (k0 + d0) / block_vals * bb;
            for (int64_t j = 0; j < NR; ++j) {
                const int64_t row = n0 + p * NR + j;
                if (p * NR + j < nc && x4) { /* n0, p * NR: whole groups */
                    if (j % GGUF_X4_ROWS == 0)
                        gguf_x4_rows(w + row * row_bytes, bb, (k0 + d0) / block_vals, dc / block_vals, own, cb);
                    row_fn(own + (j % GGUF_X4_ROWS) * cb, dc, rows + j * DC);
                } else if (p * NR + j < nc)
                    row_fn(w + row * row_bytes + off, dc, rows + j * DC);
                else
                    memset(rows + j * DC, 0, sizeof(float) * (size_t)dc);
            }
            f32_panel_from_rows(rows, DC, dc, panels + p * ps + d0 * NR);
        }
}

/* y's rows [m0, m0 + mr) against the tile's panels, columns n0 ...: each 6 x 16 tile of sums loaded from y (zeros
 * on the first K-chunk), carried on over this chunk's kc columns, stored back (only the nc real columns). */
static void tile_rows(const float *x, int64_t k, int64_t k0, int64_t kc, int64_t m0, int mr, const float *panels,
                      int64_t ps, int64_t n0, int64_t nc, float *y, int64_t n_out) {
    float c[MR * NR];
    for (int64_t p = 0; p * NR < nc; ++p) {
        const int64_t cols = nc - p * NR < NR ? nc - p * NR : NR;
        float *yt = y + m0 * n_out + n0 + p * NR;
        for (int r = 0; r < mr; ++r) {
            if (k0 == 0)
                memset(c + r * NR, 0, sizeof(float) * NR);
            else
                memcpy(c + r * NR, yt + r * n_out, sizeof(float) * (size_t)cols);
        }
        TILE_ACC(mr, x + m0 * k + k0, k, panels + p * ps, kc, c);
        for (int r = 0; r < mr; ++r) memcpy(yt + r * n_out, c + r * NR, sizeof(float) * (size_t)cols);
    }
}

/* a panel's floats: KC columns, or all of a shorter k (a K-chunk is never longer) */
static int64_t panel_floats(int64_t k) { return (k < KC ? k : KC) * NR; }

int64_t gguf_tile_work_floats(int64_t k) { return (NC + NR - 1) / NR * panel_floats(k) + NR * DC; }

static _Atomic long own_panels; /* calls that malloc'd their panels (no caller's work), all threads: a test's hook */

long gguf_tile_own_panels(void) { return own_panels; }

int gguf_tile_matmul(row_dequant_fn row_fn, int64_t block_vals, int64_t interleave, int64_t row_bytes,
                     const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y, float *work) {
    if (block_vals <= 0 || block_vals % 8 != 0 || DC % block_vals != 0 || k % block_vals != 0) return 3; /* never read past a row */
    const int x4 = interleave == GGUF_X4_ROWS;
    if (x4 && (n_out % GGUF_X4_ROWS != 0 || block_vals != 32 || row_bytes / (k / 32) > GGUF_X4_MAX_BLOCK))
        return 3; /* whole groups of an interleaved type's blocks */
    const int64_t ps = panel_floats(k);
    float *own = work != NULL ? NULL : malloc(sizeof(float) * (size_t)gguf_tile_work_floats(k));
    if (work == NULL) ++own_panels;
    float *panels = work != NULL ? work : own, *rows = panels == NULL ? NULL : panels + (NC + NR - 1) / NR * ps;
    if (panels == NULL) return 3;
    for (int64_t n0 = 0; n0 < n_out; n0 += NC) {
        const int64_t nc = n_out - n0 < NC ? n_out - n0 : NC;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            const int64_t kc = k - k0 < KC ? k - k0 : KC;
            decode_tile(row_fn, block_vals, x4, row_bytes, w, n0, nc, k0, k, kc, panels, ps, rows);
            for (int64_t m0 = 0; m0 < m; m0 += MR)
                tile_rows(x, k, k0, kc, m0, m - m0 < MR ? (int)(m - m0) : MR, panels, ps, n0, nc, y, n_out);
        }
    }
    free(own);
    return 0;
}
