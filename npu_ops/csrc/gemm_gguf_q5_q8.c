/* GGUF's Q5_0 and Q5_1 blocks (gguf_q5_block.h) against int8 activations: gemm_gguf_q8.c's scheme for its 4-bit
 * types. Each row of x is quantized per 16 columns by gemm_gguf_q8.c's gguf_q8_quantize_row, or once for the whole
 * team (gguf_xq.h: the same bits) (d = max|x| / 127, q = round-half-even(x * (1 / d)) in fp32: llama.cpp's Q8_0 rule
 * on half its block, fp32 scale) with each block's sum of q * d (llama.cpp's Q8_1 s, for Q5_1's min and Q5_0's
 * -16); then each weight block's product is an exact integer sum per half: maddubs of the unsigned 5-bit quants
 * (0-31: a pair's sum stays within int16) against the int8 x, madd to int32; 4 weight rows share one x block, their
 * sums reduced together by hadd (the two halves land in the two 128-bit lanes) and scaled once by d_w * d_x: one
 * stream's decode (bandwidth-bound), any row count without AVX2. From FEW_ROWS rows of x on (a batch of decode
 * rows, a prefill under ggufActivations int8-all) 8 weight rows go in a vector's lanes (groups8).
 *
 * Numerics: quant_gguf.matmul_q8_ref is the reference (the quantized rows, dequantized, times the dequantized W);
 * the kernel differs from it only in the order of fp32 operations. A row's result depends on nothing but its own
 * row of x and of W: not the tile, the row count or the thread split.
 * Threads: as gemm_gguf_q5.c (inside any team the calling thread runs the whole call; x quantized once per call
 * unless the team quantized it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gemm_gguf_q5_q8.h"
#include "dot_u8s8.h"
#include "fp16_lanes.h"
#include "gemm_gguf_q8.h"
#include "gguf_xq.h"
#include "gguf_q5_block.h"
#include "kernels.h"
#include "stream_ahead.h"
#include "team_sync.h"

#define NR 4  /* weight rows a pass (below FEW_ROWS rows of x) */
#define RW 8  /* weight rows a group from FEW_ROWS rows of x on: a vector's lanes */
#define FEW_ROWS 3 /* fewer rows of x than this: the 4-row passes (one row: 1.15x / 1.4x the lanes in cache / from
                    * memory; two: even; three, which the passes read as 2 + 1: the lanes 1.4-1.5x; tools/ab_q5.c) */
#define XC 64 /* most rows of x a lanes chunk (their accumulators: 2 KiB) */
#define MR 4  /* rows of x a tile (a prefill's GEMM: each weight block unpacked once for MR rows) */
#define X_CHUNK_BYTES (96 * 1024) /* a GEMM's rows of x in chunks of about this many quantized bytes (L2) */
#define STACK_K 16384 /* x's quantized rows live on the stack up to this many values */

#ifdef __AVX2__
/* y[i * ldy + r] = W row r . x row i (dequantized) for the 4 rows w[r] (rows past the last repeat it: their results
 * unused) and mr (1, 2 or MR) rows of x: a block's quants unpacked once for all of them. The sequence of operations
 * that makes each output is the same whatever mr, so are its bits. */
static inline __attribute__((always_inline)) void tile_q8(const int t, const int mr, const uint8_t *w[NR],
                                                          int64_t nb, const int8_t *xq, const float *xd,
                                                          const float *xs, int64_t k, float *y, int64_t ldy, int nr,
                                                          int64_t ahead) {
    __m256 acc[MR]; /* lanes r: values 0-15 of row r, r + 4: 16-31 */
    __m128 off[MR];
    for (int i = 0; i < mr; ++i) {
        acc[i] = _mm256_setzero_ps();
        off[i] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *p[NR];
        for (int r = 0; r < NR; ++r) p[r] = w[r] + b * Q5_BYTES(t);
        /* a group's NR rows further on (ahead: stream_ahead.h's groups_ahead; contiguous) asked for as one
         * stream, a step's share of it (NR blocks' bytes) a step: each row asking 2 KiB past itself (4 streams
         * 660 bytes apart at 360M's k 960) read slower (tools/ab_q5.c; gemm_gguf_q8.c found the same) */
        for (int64_t o = 0; o < NR * Q5_BYTES(t); o += 64) stream_at(w[0] + ahead + b * NR * Q5_BYTES(t) + o);
        __m256i q[NR];
        for (int r = 0; r < NR; ++r) q[r] = q5_quants(t, p[r]);
        __m128 mn = _mm_setzero_ps();
        const __m128 d = fp16_lanes4(p, t == T_Q5_1, &mn); /* the 4 rows' scales and, Q5_1, mins */
        const __m256 d8 = _mm256_set_m128(d, d);
        for (int i = 0; i < mr; ++i) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * k + b * Q5_QK));
            const __m256i h = rows4_isum(q, xv);
            const __m256 scale = _mm256_mul_ps(d8, _mm256_loadu_ps(xd + 8 * (i * nb + b)));
            acc[i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(h), acc[i]);
            /* sum w x = d_w d_x sum q xq + off_w xs: Q5_1's off is its min, Q5_0's -16 d_w (the -16 applied below) */
            off[i] = _mm_fmadd_ps(t == T_Q5_1 ? mn : d, _mm_set1_ps(xs[i * nb + b]), off[i]);
        }
    }
    for (int i = 0; i < mr; ++i) {
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
        v = t == T_Q5_0 ? _mm_fnmadd_ps(_mm_set1_ps(16.0f), off[i], v) : _mm_add_ps(v, off[i]);
        float out[NR];
        _mm_storeu_ps(out, v);
        memcpy(y + i * ldy, out, sizeof(float) * (size_t)nr);
    }
}
#else
/* the same sums without AVX2, a row at a time */
static void tile_q8(const int t, const int mr, const uint8_t *w[NR], int64_t nb, const int8_t *xq, const float *xd,
                    const float *xs, int64_t k, float *y, int64_t ldy, int nr, int64_t ahead) {
    (void)ahead;
    for (int i = 0; i < mr; ++i)
        for (int r = 0; r < nr; ++r) {
            float acc = 0.0f, off = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *p = w[r] + b * Q5_BYTES(t);
                const int8_t *x = xq + i * k + b * Q5_QK;
                uint8_t q[Q5_QK];
                q5_quants_scalar(t, p, q);
                int s[2] = {0, 0}; /* values 0-15, 16-31: each half of x has its own scale */
                for (int e = 0; e < Q5_QK; ++e) s[e / 16] += q[e] * x[e];
                const float d = f16_to_f32(p), mn = t == T_Q5_1 ? q5_min(t, p) : d;
                const float *xdb = xd + 8 * (i * nb + b);
                acc = fmaf(d * xdb[0], (float)s[0], fmaf(d * xdb[4], (float)s[1], acc));
                off = fmaf(mn, xs[i * nb + b], off);
            }
            y[i * ldy + r] = t == T_Q5_0 ? fmaf(-16.0f, off, acc) : acc + off;
        }
}
#endif

#ifdef __AVX2__
/* FEW_ROWS rows of x on (a batch of decode rows, a prefill piece): gemm_gguf_q4_q8.c's scheme, 8 weight rows in a
 * vector's lanes. A block's 8 rows are transposed once (v[c] lane r: row r's quants 4c..4c+3 as bytes, fifth bits
 * in) and each x row meets them through 8 broadcasts of its own 4 bytes; the 4 maddubs of a half sum in int16 (8
 * products: at most 31496) before one madd, and the scaling is 8 rows a vector. Each output's fp32 operations are
 * tile_q8's in its order (per half acc += (d_w d_x) sum; off += mn xs; the halves added, the offset last) on the
 * same exact integer sums: the same bits whatever the row count. */
static inline __attribute__((always_inline)) void quants8(const int t, const uint8_t *p[RW], __m256i v[8]) {
    __m256i y[4]; /* y[r]: row r's 16 nibble bytes, row r + 4's in the high lane */
    for (int r = 0; r < 4; ++r)
        y[r] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[r] + Q5_QH_AT(t) + 4))),
            _mm_loadu_si128((const __m128i *)(p[r + 4] + Q5_QH_AT(t) + 4)), 1);
    const __m256i a = _mm256_unpacklo_epi32(y[0], y[1]), b = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i c = _mm256_unpacklo_epi32(y[2], y[3]), e = _mm256_unpackhi_epi32(y[2], y[3]);
    const __m256i pk[4] = {_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c), _mm256_unpacklo_epi64(b, e),
                           _mm256_unpackhi_epi64(b, e)}; /* pk[j] lane r: row r's nibble bytes 4j..4j+3 */
    uint32_t qh[RW]; /* lane r: row r's fifth bits (quant j: bit j) */
    for (int r = 0; r < RW; ++r) memcpy(qh + r, p[r] + Q5_QH_AT(t), 4);
    const __m256i hv = _mm256_setr_epi32((int)qh[0], (int)qh[1], (int)qh[2], (int)qh[3], (int)qh[4], (int)qh[5],
                                         (int)qh[6], (int)qh[7]);
    const __m256i lo = _mm256_set1_epi8(0x0f);
    const __m256i dw = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808,
                                         0x0c0c0c0c); /* each lane byte's own dword (row), byte 0 */
    for (int j = 0; j < 8; ++j) {
        /* quant 4j + i (j < 4) or 16 + 4 (j - 4) + i sits in lane byte i; its bit is in qh's byte (j / 2) (j < 4)
         * or 2 + (j - 4) / 2, at 4 (j % 2) + i: that byte spread to the lane's 4 bytes, every other bit forced on */
        const int qb = j < 4 ? j / 2 : 2 + (j - 4) / 2, sh = 4 * (j % 2);
        const __m256i spread = _mm256_shuffle_epi8(hv, _mm256_add_epi8(_mm256_set1_epi8((char)qb), dw));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi32((int)~(0x08040201u << sh))),
                                              _mm256_set1_epi8(-1));
        const __m256i nib = j < 4 ? _mm256_and_si256(pk[j], lo) : _mm256_and_si256(_mm256_srli_epi16(pk[j - 4], 4), lo);
        v[j] = _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
}

/* block b of the 8 rows p[r] against x rows [0, mr) of a chunk: acc[2 i + h] lane r += row r . x row i's half h */
static inline __attribute__((always_inline)) void block8(const int t, const uint8_t *p[RW], const int8_t *xq,
                                                         const float *xd, const float *xs, int64_t k, int64_t nb,
                                                         int64_t mr, __m256 *acc, __m256 *off) {
    __m256i v[8];
    quants8(t, p, v);
    __m256 dv, mv; /* the 8 rows' scales and offset factors (Q5_1's min, Q5_0's d: its -16 applied at the end) */
    fp16_lanes8(p, t == T_Q5_1, &dv, &mv);
    for (int64_t i = 0; i < mr; ++i) {
        const int8_t *x = xq + i * k;
        for (int h = 0; h < 2; ++h) {
            acc[2 * i + h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(xd[8 * i * nb + 4 * h])),
                                             _mm256_cvtepi32_ps(lanes_isum16(v + 4 * h, x + 16 * h)),
                                             acc[2 * i + h]);
        }
        off[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xs[i * nb]), off[i]);
    }
}

/* weight row groups [g0, g1) of RW rows (the last maybe fewer: its missing rows repeat its first, their lanes unused)
 * against m quantized rows of x, in chunks of XC rows */
static inline __attribute__((always_inline)) void groups8(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                          const int8_t *xq, const float *xd, const float *xs,
                                                          int64_t m, float *y, int64_t g0, int64_t g1) {
    const int64_t nb = k / Q5_QK, rb = nb * Q5_BYTES(t);
    for (int64_t c0 = 0; c0 < m; c0 += XC) {
        const int64_t mr = m - c0 < XC ? m - c0 : XC;
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t r0 = g * RW;
            const int nr = n_out - r0 < RW ? (int)(n_out - r0) : RW;
            const uint8_t *p[RW];
            __m256 acc[2 * XC], off[XC];
            for (int64_t i = 0; i < mr; ++i) acc[2 * i] = acc[2 * i + 1] = off[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
                for (int r = 0; r < RW; ++r) p[r] = w + (r0 + (r < nr ? r : 0)) * rb + b * Q5_BYTES(t);
                for (int64_t o = 0; o < RW * Q5_BYTES(t); o += 64) /* the next group's rows as one stream (tile_q8) */
                    stream_at(w + (r0 + RW) * rb + b * RW * Q5_BYTES(t) + o);
                block8(t, p, xq + c0 * k + b * Q5_QK, xd + 8 * (c0 * nb + b), xs + c0 * nb + b, k, nb, mr, acc, off);
            }
            for (int64_t i = 0; i < mr; ++i) {
                float o[RW];
                const __m256 v = _mm256_add_ps(acc[2 * i], acc[2 * i + 1]);
                _mm256_storeu_ps(o, t == T_Q5_0 ? _mm256_fnmadd_ps(_mm256_set1_ps(16.0f), off[i], v)
                                                : _mm256_add_ps(v, off[i]));
                memcpy(y + (c0 + i) * n_out + r0, o, sizeof(float) * (size_t)nr);
            }
        }
    }
}
#endif

/* weight row groups [g0, g1) (NR rows each, the last maybe fewer) against m quantized rows of x: chunks of x rows
 * (X_CHUNK_BYTES) outermost, each group's blocks then unpacked once per MR rows of the chunk (a decode step's few
 * rows: one chunk, so each weight byte is read once) */
static inline __attribute__((always_inline)) void groups_q8(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                            const int8_t *xq, const float *xd, const float *xs,
                                                            int64_t m, float *y, int64_t g0, int64_t g1) {
    const int64_t nb = k / Q5_QK, rb = nb * Q5_BYTES(t);
    int64_t chunk = X_CHUNK_BYTES / k / MR * MR;
    chunk = chunk < MR ? MR : chunk;
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t c1 = m - c0 < chunk ? m : c0 + chunk;
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t r0 = g * NR;
            const int nr = n_out - r0 < NR ? (int)(n_out - r0) : NR;
            const uint8_t *rows[NR];
            for (int r = 0; r < NR; ++r) rows[r] = w + (r0 + (r < nr ? r : 0)) * rb;
            int64_t i = c0;
#define TILE(mr) \
    tile_q8(t, mr, rows, nb, xq + i * k, xd + 8 * i * nb, xs + i * nb, k, y + i * n_out + r0, n_out, nr, \
            groups_ahead(NR * rb))
            for (; i + MR <= c1; i += MR) TILE(MR);
            if (i + 2 <= c1) {
                TILE(2);
                i += 2;
            }
            if (i < c1) TILE(1);
#undef TILE
        }
    }
}

/* each type's groups_q8 compiled for it: a parallel region's body is outlined once per function, before inlining
 * gives it its type (gemm_gguf_q8.c: the standalone call's team ran the type-generic code) */
typedef void (*groups_fn)(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,
                          const float *xs, int64_t m, float *y, int64_t g0, int64_t g1);
#define GROUPS_OF(T)                                                                                               \
    static void groups_##T(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,        \
                           const float *xs, int64_t m, float *y, int64_t g0, int64_t g1) {                       \
        groups_q8(T, w, n_out, k, xq, xd, xs, m, y, g0, g1);                                                      \
    }
GROUPS_OF(T_Q5_0)
GROUPS_OF(T_Q5_1)
#ifdef __AVX2__
#define GROUPS8_OF(T)                                                                                              \
    static void groups8_##T(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,       \
                            const float *xs, int64_t m, float *y, int64_t g0, int64_t g1) {                      \
        groups8(T, w, n_out, k, xq, xd, xs, m, y, g0, g1);                                                        \
    }
GROUPS8_OF(T_Q5_0)
GROUPS8_OF(T_Q5_1)
#undef GROUPS8_OF
#endif
#undef GROUPS_OF

static inline __attribute__((always_inline)) void matmul_q8(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                            const float *x, int64_t m, float *y) {
    if (k % Q5_QK != 0 || m <= 0) return; /* the Python side refuses a bad k first */
#ifdef __AVX2__
    const int lanes = m >= FEW_ROWS; /* 8 weight rows in lanes (groups8), else the 4-row passes */
#else
    const int lanes = 0;
#endif
    const int64_t nb = k / Q5_QK, rows = lanes ? RW : NR, groups = (n_out + rows - 1) / rows;
    int8_t sq[STACK_K];
    float sd[STACK_K / Q5_QK * 8], ss[STACK_K / Q5_QK];
    /* x quantized by the team (gguf_linear.c) in gemm_gguf_q8.c's layout, which is this kernel's: per 16 values */
    const gguf_xq *team = gguf_xq_find(x, m, k, GGUF_XQ_Q8);
    const int heap = team == NULL && m * k > STACK_K;
    int8_t *xq = team != NULL ? team->q : heap ? malloc((size_t)(m * k)) : sq;
    float *xd = team != NULL ? team->d : heap ? malloc(sizeof(float) * (size_t)(8 * m * nb)) : sd;
    float *xs = team != NULL ? team->s : heap ? malloc(sizeof(float) * (size_t)(m * nb)) : ss;
    if (xq != NULL && xd != NULL && xs != NULL) {
        for (int64_t i = 0; team == NULL && i < m; ++i)
            gguf_q8_quantize_row(x + i * k, k, xq + i * k, xd + 8 * i * nb, xs + i * nb);
        groups_fn run = t == T_Q5_1 ? groups_T_Q5_1 : groups_T_Q5_0;
#ifdef __AVX2__
        if (lanes) run = t == T_Q5_1 ? groups8_T_Q5_1 : groups8_T_Q5_0;
#endif
        if (omp_get_level() > 0 || groups == 1) { /* inside any team, a team of 1 included */
            run(w, n_out, k, xq, xd, xs, m, y, 0, groups);
        } else {
#pragma omp parallel
            {
                int64_t g0, g1;
                team_share(groups, &g0, &g1); /* this thread's consecutive groups of rows */
                run(w, n_out, k, xq, xd, xs, m, y, g0, g1);
            }
        }
    }
    if (heap) {
        free(xq);
        free(xd);
        free(xs);
    }
}

void gguf_matmul_q5_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q8(T_Q5_0, w, n_out, k, x, m, y);
}
void gguf_matmul_q5_1_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q8(T_Q5_1, w, n_out, k, x, m, y);
}
