/* GGUF's 4-bit simple blocks (Q4_0, Q4_1 and our Q4_1F) against int8 activations: these types' int8-activation
 * entry points, 8 weight rows a vector from FEW_ROWS rows of x on (a batch of decode rows, a prefill piece under
 * ggufActivations int8-all), gemm_gguf_q8.c's 4-row passes below. x is quantized as gemm_gguf_q8.c does it (per 16 columns, fp32 scales d0 and d1
 * a block, the block's sum xs of the dequantized values).
 *
 * Why 8 rows in lanes: a batch of decode rows is a small GEMM, bound by the arithmetic, not the weight bytes. The
 * scales are per block of 32 (d_w) and per 16 (x's d), so each (weight row, x row, block) needs its integer sum
 * turned to fp32 and scaled: done a row a lane, the cvt / mul / fma cost as much as the maddubs, and summing 4 rows'
 * lanes together (gemm_gguf_q8.c's hadd) costs shuffles. Here a weight block's 8 rows are transposed once into 8
 * vectors (vector c, lane r: row r's values 4c..4c+3, its nibbles unpacked) and each x row meets them through 8
 * broadcasts of its own 4 bytes (dot_u8s8.h's lanes_isum16: 4 vpdpbusd a half on VNNI; on AVX2 the 4 maddubs sum
 * into int16, |q| <= 15, |x| <= 127: at most 15240, then one madd), and the scaling is 8 rows a vector. The transposed block serves every row of x in the
 * chunk, its accumulators in L1 (acc[2 i + h], lane r). 1.3x gemm_gguf_q8.c's rate at 16 and 32 rows on 1.7B's
 * shapes, one core (tools/bench_gguf_kernels.py --batch); below FEW_ROWS rows, where the weight bytes bound the
 * call, the transposes cost more than they save and gemm_gguf_q8.c's passes run it.
 *
 * Numerics: quant_gguf.matmul_q8_ref is the reference (within 1e-6 of |x_q| . |W|: exact integer sums, only the
 * order of fp32 operations differs). Each output's fp32 operations are gemm_gguf_q8.c's, in its order (per half:
 * acc += (d_w d_x) * sum; off += mn * xs; then the halves added, the offset last), on the same exact integer sums:
 * its bits are the same whatever the row count (either file), the chunk or the thread split.
 * Threads: as gemm_gguf_q8.c (inside any team the calling thread runs the whole call; else groups of 8 weight rows
 * shared by team_share). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "dot_u8s8.h"
#include "fp16_lanes.h"
#include "gemm_gguf_q4_q8.h"
#include "gemm_gguf_q8.h"
#include "gguf_x4.h"
#include "gguf_xq.h"
#include "kernels.h"
#include "stream_ahead.h"
#include "team_sync.h"
#include "vec_math.h"

#define QK 32
#define RW 8                        /* weight rows a group: a vector's lanes */
#define FEW_ROWS GGUF_LANES_ROWS /* fewer rows of x: gemm_gguf_q8.c's passes (dot_u8s8.h says why) */
#define XC 64                       /* most rows of x a chunk (their accumulators: 2 KiB) */
#define X_CHUNK_BYTES (384 * 1024)  /* a chunk's quantized x (bytes, scales) stays in L2 while a share's groups pass */

enum { T_Q4_0 = 0, T_Q4_1 = 1, T_Q4_1F = 2 };
#ifdef __AVX2__
static const int64_t BLOCK_BYTES[3] = {18, 20, 24};
static const int QS_AT[3] = {2, 4, 8};
#endif

/* x's per-block numbers a kernel reads: d0, d1 (the halves' scales), xs (the block's sum), a pad */
typedef struct { float d0, d1, xs, pad; } xblock;

/* the 8 rows' scales d and offset factors mn (Q4_1's min, Q4_0's d: its -8 applied at the end) of block b */
static inline __attribute__((always_inline)) void scales8(const int t, const uint8_t *p[RW], float *d, float *mn) {
    for (int r = 0; r < RW; ++r) {
        if (t == T_Q4_1F) {
            memcpy(d + r, p[r], 4);
            memcpy(mn + r, p[r] + 4, 4);
        } else {
            d[r] = f16_to_f32(p[r]);
            mn[r] = t == T_Q4_1 ? f16_to_f32(p[r] + 2) : d[r];
        }
    }
}

#ifdef __AVX2__
/* v[c] lane r: row r's quants 4c..4c+3 as bytes (a block's packed byte j holds quant j low, j + 16 high) */
static inline __attribute__((always_inline)) void quants8(const uint8_t *qp[RW], __m256i v[8]) {
    __m256i y[4]; /* y[r]: row r's 16 packed bytes (at qp[r]), row r + 4's in the high lane */
    for (int r = 0; r < 4; ++r)
        y[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qp[r])),
                                       _mm_loadu_si128((const __m128i *)qp[r + 4]), 1);
    const __m256i a = _mm256_unpacklo_epi32(y[0], y[1]), b = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i c = _mm256_unpacklo_epi32(y[2], y[3]), e = _mm256_unpackhi_epi32(y[2], y[3]);
    const __m256i pk[4] = {_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c), _mm256_unpacklo_epi64(b, e),
                           _mm256_unpackhi_epi64(b, e)}; /* pk[j] lane r: row r's packed bytes 4j..4j+3 */
    const __m256i lo = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_and_si256(pk[j], lo);
        v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(pk[j], 4), lo);
    }
}

/* scales8 as vectors: the fp16 fields by fp16_lanes.h, Q4_1F's fp32 ones through scales8 */
static inline __attribute__((always_inline)) void scales8v(const int t, const uint8_t *p[RW], __m256 *dv,
                                                           __m256 *mv) {
    if (t == T_Q4_1F) {
        float d[RW], mn[RW];
        scales8(t, p, d, mn);
        *dv = _mm256_loadu_ps(d);
        *mv = _mm256_loadu_ps(mn);
        return;
    }
    fp16_lanes8(p, t == T_Q4_1, dv, mv);
}

/* scales8v of two interleaved groups' block steps (gguf_x4.h): rows 0-3's fields side by side at a, 4-7's at b */
static inline __attribute__((always_inline)) void scales8_x4(const int t, const uint8_t *a, const uint8_t *b,
                                                             __m256 *dv, __m256 *mv) {
    if (t == T_Q4_0) {
        *dv = *mv = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                       _mm_loadl_epi64((const __m128i *)b)));
        return;
    }
    const __m256 fa = t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a))
                                  : _mm256_loadu_ps((const float *)a); /* d0 m0 d1 m1 ... (Q4_1F: fp32) */
    const __m256 fb = t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b))
                                  : _mm256_loadu_ps((const float *)b);
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); /* (a0 a1 b0 b1 | a2 a3 b2 b3) -> a0-3 b0-3 */
    *dv = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(fa, fb, 0x88), order); /* d: even lanes of each */
    *mv = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(fa, fb, 0xdd), order); /* min: odd lanes */
}

/* block b of the 8 rows (scale fields at p[r], quants at qp[r]) against x rows [0, mr) of a chunk (their block b's
 * quants side by side at xq, QK bytes a row, their numbers at xb): acc[i] lane r += row r . x row i over the block */
static inline __attribute__((always_inline)) void block8(const int t, const int x4, const uint8_t *p[RW],
                                                         const uint8_t *qp[RW], const int8_t *xq, const xblock *xb,
                                                         int64_t mr, __m256 *acc, __m256 *off) {
    __m256i v[8];
    quants8(qp, v);
    __m256 dv, mv;
    if (x4)
        scales8_x4(t, p[0], p[4], &dv, &mv);
    else
        scales8v(t, p, &dv, &mv);
#pragma GCC unroll 2 /* as GCC unrolled it for the stored layout, not for x4's until asked (x4 0.92x at 64 rows) */
    for (int64_t i = 0; i < mr; ++i) {
        const int8_t *x = xq + i * QK;
        const __m256i s[2] = {lanes_isum16(v, x), lanes_isum16(v + 4, x + 16)}; /* lane r: row r's halves */
        const xblock *e = xb + i;
        for (int h = 0; h < 2; ++h)
            acc[2 * i + h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(h ? e->d1 : e->d0)),
                                             _mm256_cvtepi32_ps(s[h]), acc[2 * i + h]);
        off[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(e->xs), off[i]);
    }
}

/* weight row groups [g0, g1) of RW rows (the last maybe fewer: its missing rows repeat its first, their lanes unused)
 * against m quantized rows of x in gguf_xq.h's block-major lanes layout (block b of row i at xq + (b m + i) QK, its
 * numbers at xb[b m + i]: a chunk's rows of a block are one run of bytes, where rows k bytes apart put k = 2048's or
 * 8192's 16 rows in one or two L1 sets, 1.2x at 16 to 64 rows), in chunks of x rows */
static inline __attribute__((always_inline)) void groups8(const int t, const int x4, const uint8_t *w, int64_t n_out,
                                                          int64_t k, const int8_t *xq, const xblock *xb, int64_t m,
                                                          float *y, int64_t g0, int64_t g1) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[t], rb = nb * bb;
    int64_t chunk = X_CHUNK_BYTES / (k + nb * (int64_t)sizeof(xblock));
    chunk = chunk > XC ? XC : chunk < 1 ? 1 : chunk;
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t mr = m - c0 < chunk ? m - c0 : chunk;
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t r0 = g * RW;
            const int nr = n_out - r0 < RW ? (int)(n_out - r0) : RW;
            const uint8_t *p[RW], *qp[RW]; /* block b's scale fields and quants, row by row */
            __m256 acc[2 * XC], off[XC];   /* acc[2 i + h]: x row i's half h */
            for (int64_t i = 0; i < mr; ++i) acc[2 * i] = acc[2 * i + 1] = off[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
                if (x4) { /* two groups' block steps: every field at a constant offset from one of two bases */
                    const uint8_t *ga = w + r0 * rb + b * 4 * bb, *gb = nr > 4 ? ga + 4 * rb : ga;
                    for (int r = 0; r < RW; ++r) {
                        const uint8_t *step = r < 4 ? ga : gb;
                        p[r] = gguf_x4_scales_at(step, bb, r & 3), qp[r] = gguf_x4_quants_at(step, bb, r & 3);
                    }
                    for (int64_t o = 0; (b & 1) == 0 && o < 8 * bb; o += 64) /* the next groups' 2 streams, 2 blocks */
                        stream_at(ga + RW * rb + o), stream_at(gb + RW * rb + o);
                } else {
                    for (int r = 0; r < RW; ++r)
                        p[r] = w + (r0 + (r < nr ? r : 0)) * rb + b * bb, qp[r] = p[r] + QS_AT[t];
                    if ((b & 1) == 0) /* the next group's rows, a 64-byte line (2 blocks) at a time */
                        for (int r = 0; r < RW; ++r) stream_at(p[r] + RW * rb);
                }
                block8(t, x4, p, qp, xq + (b * m + c0) * QK, xb + b * m + c0, mr, acc, off);
            }
            for (int64_t i = 0; i < mr; ++i) {
                float o[RW];
                const __m256 v = _mm256_add_ps(acc[2 * i], acc[2 * i + 1]);
                _mm256_storeu_ps(o, t == T_Q4_0 ? _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), off[i], v)
                                                : _mm256_add_ps(v, off[i]));
                memcpy(y + (c0 + i) * n_out + r0, o, sizeof(float) * (size_t)nr);
            }
        }
    }
}

/* each type's groups8 compiled for it (a parallel region's body is outlined before inlining gives it its type) */
typedef void (*groups_fn)(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const xblock *xb, int64_t m,
                          float *y, int64_t g0, int64_t g1);
#define GROUPS_OF(T, X4)                                                                                           \
    static void groups_##T##_##X4(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const xblock *xb, \
                                  int64_t m, float *y, int64_t g0, int64_t g1) {                                 \
        groups8(T, X4, w, n_out, k, xq, xb, m, y, g0, g1);                                                        \
    }
GROUPS_OF(T_Q4_0, 0)
GROUPS_OF(T_Q4_1, 0)
GROUPS_OF(T_Q4_1F, 0)
GROUPS_OF(T_Q4_0, 1)
GROUPS_OF(T_Q4_1, 1)
GROUPS_OF(T_Q4_1F, 1)
#undef GROUPS_OF
static const groups_fn GROUPS[2][3] = {{groups_T_Q4_0_0, groups_T_Q4_1_0, groups_T_Q4_1F_0},
                                       {groups_T_Q4_0_1, groups_T_Q4_1_1, groups_T_Q4_1F_1}}; /* [x4][type] */

/* y = x . W^T for m >= FEW_ROWS rows of x */
static void many_q4_q8(const int t, const int x4, const uint8_t *w, int64_t n_out, int64_t k, const float *x,
                       int64_t m, float *y) {
    const int64_t nb = k / QK, groups = (n_out + RW - 1) / RW;
    const gguf_xq *team = gguf_xq_find(x, m, k, GGUF_XQ_Q8); /* x quantized by the team (gguf_linear.c) */
    int8_t *xq = team != NULL ? team->qb : malloc((size_t)(m * k));
    xblock *xb = team != NULL ? (xblock *)team->xb : malloc(sizeof(xblock) * (size_t)(m * nb));
    float *xd = team != NULL ? NULL : malloc(sizeof(float) * (size_t)(8 * nb));
    float *xs = team != NULL ? NULL : malloc(sizeof(float) * (size_t)nb);
    int8_t *row = team != NULL ? NULL : malloc((size_t)k);
    if (team != NULL || (xq != NULL && xb != NULL && xd != NULL && xs != NULL && row != NULL)) {
        for (int64_t i = 0; team == NULL && i < m; ++i) {
            gguf_q8_quantize_row(x + i * k, k, row, xd, xs);
            gguf_q8_lanes_row(row, xd, xs, nb, m, i, xq, (float *)xb);
        }
        const groups_fn run = GROUPS[x4][t];
        if (omp_get_level() > 0 || groups == 1) { /* inside any team, a team of 1 included */
            run(w, n_out, k, xq, xb, m, y, 0, groups);
        } else {
#pragma omp parallel
            {
                int64_t g0, g1;
                team_share(groups, &g0, &g1);
                run(w, n_out, k, xq, xb, m, y, g0, g1);
            }
        }
    }
    if (team == NULL) {
        free(xq);
        free(xb);
    }
    free(xd);
    free(xs);
    free(row);
}
#endif

static void matmul_q4_q8(const int t, const int x4, const uint8_t *w, int64_t n_out, int64_t k, const float *x,
                         int64_t m, float *y) {
    if (k % QK != 0 || m <= 0 || (x4 && n_out % 4 != 0)) return; /* the Python side refuses these first */
#ifdef __AVX2__
    if (m >= FEW_ROWS) {
        many_q4_q8(t, x4, w, n_out, k, x, m, y);
        return;
    }
#endif
    /* a few rows (or no AVX2): gemm_gguf_q8.c's 4-row passes, the same bits as block8's */
    const int type = t == T_Q4_0 ? GGUF_Q8_Q4_0 : t == T_Q4_1 ? GGUF_Q8_Q4_1 : GGUF_Q8_Q4_1F;
    gguf_q8_matmul(type + (x4 ? GGUF_Q8_X4 : 0), w, n_out, k, x, m, y);
}

int gguf_int8_vnni(void) { return GGUF_VNNI; }

void gguf_matmul_q4_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_0, 0, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_1, 0, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1f_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_1F, 0, w, n_out, k, x, m, y);
}
/* gguf_x4.h's interleaved layout */
void gguf_matmul_q4_0x4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_0, 1, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1x4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_1, 1, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1fx4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q4_q8(T_Q4_1F, 1, w, n_out, k, x, m, y);
}
