/* GGUF's Q4_K, Q5_K and Q6_K against int8 activations (Q8_K rows, gemm_kquant_q8.c's quantization): these types'
 * int8-activation entry points, 8 weight rows a vector from FEW_ROWS rows of x on (a batch of decode rows, a prefill
 * piece under ggufActivations int8-all), gemm_kquant_q8.c's row passes below.
 *
 * Why: a row pass applies each sub-block's 6-bit scale by a madd per (weight row, x row) and 32 values, as many
 * multiplies as the maddubs of the products. Here a super-block's 8 rows are transposed once (vector c, lane r: row
 * r's bytes 4c..4c+3 of a 32-byte run of quants) for every x row of the chunk: each x row's 4 bytes broadcast into 8
 * maddubs summed in int16 (Q4_K: 8 chunks, at most 30480; Q5_K: 4, at most 31496), then one madd by the 8 rows'
 * scales (a lane each): 1 multiply in 8 instead of 1 in 2. The mins: 4 madds of the rows' mins against x's sums of
 * 32 (Q6_K: 2 chunks fill int16, a madd by each 16 values' int8 scale; its -32 through x's sums of 16). The sums
 * are exact int32 a super-block, then fp32: acc += (d d_x) * S, acc_m += (dmin d_x) * M, y = acc - acc_m,
 * the row passes' order: the same bits at every row count, chunk and thread split.
 * On VNNI (dot_u8s8.h) Q5_K and Q6_K chain vpdpbusd straight to int32 a sub-block, then one vpmulld by the scales
 * (a Zen 4 core, 4-64 rows: 1.04-1.13x the AVX2 build); Q4_K keeps its int16 sums: its 8 maddubs and 1 madd are as
 * many multiplies as 8 vpdpbusd and 1 vpmulld, and measured no faster (0.94-1.06x).
 * Threads: groups of 8 weight rows shared by team_share (inside a team: the calling thread alone). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "dot_u8s8.h"
#include "gemm_kquant.h"
#include "gemm_kquant_q8.h"
#include "gemm_kquant_q8_lanes.h"
#include "gguf_xq.h"
#include "kernels.h"
#include "team_sync.h"
#include "vec_math.h"

#define QK 256
#define RW 8                       /* weight rows a group: a vector's lanes */
#define FEW_ROWS GGUF_LANES_ROWS /* fewer rows of x: gemm_kquant_q8.c's row passes (dot_u8s8.h says why) */
#define XC 64                      /* most rows of x a chunk */
#define X_CHUNK_BYTES (384 * 1024) /* a chunk's quantized x stays in L2 while a share's groups pass */

#if defined(__AVX2__) && defined(__F16C__)
static const int64_t BLOCK_BYTES[3] = {144, 176, 210}; /* Q4_K, Q5_K, Q6_K (t: 0, 1, 2) */

/* what a super-block's 8 rows give every x row: scl[s] lane r = row r's scale of sub-block s (both int16 halves),
 * mn[p] lane r = its mins of sub-blocks 2p, 2p + 1; d, dmin a lane a row; qh (Q5_K) as the quants' vectors */
typedef struct {
    __m256i scl[8], mn[4], qh[8];
    __m256 d, dmin;
} sb8;

/* out[c] lane r (rows r < 4 low lane, r + 4 high): dword c of the 16 bytes at p[r] + off */
static inline __attribute__((always_inline)) void transpose8x4(const uint8_t *p[RW], int off, __m256i out[4]) {
    __m256i y[4];
    for (int r = 0; r < 4; ++r)
        y[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[r] + off))),
                                       _mm_loadu_si128((const __m128i *)(p[r + 4] + off)), 1);
    const __m256i a = _mm256_unpacklo_epi32(y[0], y[1]), b = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i c = _mm256_unpacklo_epi32(y[2], y[3]), e = _mm256_unpackhi_epi32(y[2], y[3]);
    out[0] = _mm256_unpacklo_epi64(a, c);
    out[1] = _mm256_unpackhi_epi64(a, c);
    out[2] = _mm256_unpacklo_epi64(b, e);
    out[3] = _mm256_unpackhi_epi64(b, e);
}

/* A super-block's d, dmin and kq_scales_mins for the 8 rows at once, on one transpose of their first 16 bytes (lane
 * r: row r; bytewise through 16-bit shifts, each mask keeping bits of its own byte): sc[s] as the pair (sc, sc), the
 * mins paired (2p, 2p + 1). A row's scalar unpacking, its 24 stores and the fp16 fields gathered by scalar shifts
 * had cost ~10% of a 16-row call (tools/bench_gguf_kernels.py --batch). */
static inline __attribute__((always_inline)) void kq_scales8(const uint8_t *p[RW], __m256i scl[8], __m256i mn[4],
                                                           __m256 *d, __m256 *dmin) {
    __m256i t[4];
    transpose8x4(p, 0, t); /* t[0] lane r: row r's d | dmin << 16; t[1 + c]: its scale bytes 4c..4c+3 */
    const __m256i *u = t + 1;
    const __m256i d16 = _mm256_and_si256(t[0], _mm256_set1_epi32(0xffff)), m16 = _mm256_srli_epi32(t[0], 16);
    /* the 8 fp16 fields in row order (packus works per 128-bit lane: rows 0-3 low, 4-7 high), then converted */
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(d16, d16), 0x08)));
    *dmin = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(m16, m16), 0x08)));
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), hi2 = _mm256_set1_epi8(0x30);
    const __m256i sm[4] = {
        _mm256_and_si256(u[0], m6),
        _mm256_or_si256(_mm256_and_si256(u[2], m4), _mm256_and_si256(_mm256_srli_epi16(u[0], 2), hi2)),
        _mm256_and_si256(u[1], m6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(u[2], 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(u[1], 2), hi2))}; /* scales 0-3, 4-7, mins 0-3, 4-7 */
    const __m256i b0 = _mm256_set1_epi32(0xff), b2 = _mm256_set1_epi32(0xff0000);
    for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < 4; ++j) {
            const __m256i v = _mm256_and_si256(_mm256_srli_epi32(sm[h], 8 * j), b0);
            scl[4 * h + j] = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
        }
        const __m256i x = sm[2 + h];
        mn[2 * h] = _mm256_or_si256(_mm256_and_si256(x, b0), _mm256_and_si256(_mm256_slli_epi32(x, 8), b2));
        mn[2 * h + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 16), b0),
                                        _mm256_and_si256(_mm256_srli_epi32(x, 8), b2));
    }
}

static inline __attribute__((always_inline)) void super8(const int five, const uint8_t *p[RW], sb8 *sb) {
    kq_scales8(p, sb->scl, sb->mn, &sb->d, &sb->dmin);
    if (five) {
        transpose8x4(p, 16, sb->qh);
        transpose8x4(p, 32, sb->qh + 4);
    }
}


/* the super-block's quants . x rows [0, mr) of the chunk (row i's block at xq + i * QK: the block-major copy):
 * isum[i] lane r += row r's scaled sums over the 8 sub-blocks */
static inline __attribute__((always_inline)) void quants8(const int five, const uint8_t *p[RW], const sb8 *sb,
                                                          const int8_t *xq, int64_t mr, __m256i *isum) {
    const __m256i lo = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    for (int j = 0; j < 4; ++j) {
        __m256i t[8];
        transpose8x4(p, (five ? 48 : 16) + 32 * j, t);
        transpose8x4(p, (five ? 48 : 16) + 32 * j + 16, t + 4);
        for (int h = 0; h < 2; ++h) {
            __m256i v[8];
            for (int c = 0; c < 8; ++c) {
                v[c] = _mm256_and_si256(h ? _mm256_srli_epi16(t[c], 4) : t[c], lo);
                if (five)
                    v[c] = _mm256_or_si256(v[c], _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(sb->qh[c], 2 * j + h), one), 4));
            }
            const __m256i sc = sb->scl[2 * j + h];
            if (GGUF_VNNI && five) { /* vpdpbusd in 2 chains straight to int32 (1.1x a core), then the scale */
                const __m256i sc32 = _mm256_srai_epi32(sc, 16);
                for (int64_t i = 0; i < mr; ++i) {
                    const int8_t *x = xq + i * QK + 64 * j + 32 * h;
                    __m256i s = dot_u8s8(_mm256_setzero_si256(), v[0], bytes4_bcast(x));
                    __m256i e = dot_u8s8(_mm256_setzero_si256(), v[1], bytes4_bcast(x + 4));
                    for (int c = 2; c < 8; c += 2) {
                        s = dot_u8s8(s, v[c], bytes4_bcast(x + 4 * c));
                        e = dot_u8s8(e, v[c + 1], bytes4_bcast(x + 4 * c + 4));
                    }
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(_mm256_add_epi32(s, e), sc32));
                }
                continue;
            }
            for (int64_t i = 0; i < mr; ++i) {
                const int8_t *x = xq + i * QK + 64 * j + 32 * h;
                __m256i s = _mm256_maddubs_epi16(v[0], bytes4_bcast(x)), acc = isum[i];
                for (int c = 1; c < 8; ++c) {
                    if (five && c == 4) { /* 5-bit quants: 4 chunks fill int16 */
                        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, sc));
                        s = _mm256_maddubs_epi16(v[c], bytes4_bcast(x + 4 * c));
                    } else {
                        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v[c], bytes4_bcast(x + 4 * c)));
                    }
                }
                isum[i] = _mm256_add_epi32(acc, _mm256_madd_epi16(s, sc));
            }
        }
    }
}

/* Q6_K's 16 int8 scales of the 8 rows as int16 pairs, from one transpose (lane r: row r): scl[g] = (sc[g], sc[g]),
 * scp[q] = (sc[2q], sc[2q + 1]); was a scalar loop of 24 stores a row, a sixth of a 16-row call */
static inline __attribute__((always_inline)) void q6k_scales8(const uint8_t *p[RW], __m256i scl[16], __m256i scp[8]) {
    __m256i t[4];
    transpose8x4(p, 192, t); /* t[c] lane r: row r's scales 4c..4c+3 */
    for (int c = 0; c < 4; ++c) {
        const __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(t[c], 8), 8); /* int16 sc[4c], sc[4c + 2] */
        const __m256i hi = _mm256_srai_epi16(t[c], 8);                        /* int16 sc[4c + 1], sc[4c + 3] */
        const __m256i one[4] = {lo, hi, _mm256_srli_epi32(lo, 16), _mm256_srli_epi32(hi, 16)}; /* sc[4c + j] low */
        for (int j = 0; j < 4; ++j) {
            const __m256i v = _mm256_and_si256(one[j], _mm256_set1_epi32(0xffff));
            scl[4 * c + j] = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
        }
        scp[2 * c] = _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xAA);
        scp[2 * c + 1] = _mm256_blend_epi16(_mm256_srli_epi32(lo, 16), hi, 0xAA);
    }
}

/* Q6_K's super-block . x rows [0, mr) (row i's quants at xq + i * QK, its sums of 16 at bs + i * bstride): isum[i]
 * lane r += row r's exact sum, its -32 through x's sums of 16 (the row passes' integers) */
static inline __attribute__((always_inline)) void q6k8(const uint8_t *p[RW], const int8_t *xq,
                                                       const int16_t *bs, int64_t bstride, int64_t mr,
                                                       __m256i *isum) {
    __m256i scl[16], scp[8]; /* lane r: (sc[g], sc[g]), and (sc[2q], sc[2q + 1]) as int16 pairs */
    q6k_scales8(p, scl, scp);
    for (int64_t i = 0; i < mr; ++i) {
        __m256i o = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q)
            o = _mm256_add_epi32(o, _mm256_madd_epi16(scp[q],
                                                      bytes4_bcast(bs + i * bstride + 2 * q)));
        isum[i] = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(o, 5));
    }
    const __m256i nib = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
        __m256i ta[8], tc[8], tq[8];
        transpose8x4(p, 64 * h, ta);
        transpose8x4(p, 64 * h + 16, ta + 4);
        transpose8x4(p, 64 * h + 32, tc);
        transpose8x4(p, 64 * h + 48, tc + 4);
        transpose8x4(p, 128 + 32 * h, tq);
        transpose8x4(p, 128 + 32 * h + 16, tq + 4);
        for (int i4 = 0; i4 < 4; ++i4) {
            __m256i v[8];
            for (int c = 0; c < 8; ++c) {
                const __m256i l = i4 & 1 ? tc[c] : ta[c];
                const __m256i hi = i4 == 0 ? _mm256_slli_epi16(tq[c], 4) : i4 == 1 ? _mm256_slli_epi16(tq[c], 2)
                                 : i4 == 2 ? tq[c] : _mm256_srli_epi16(tq[c], 2);
                v[c] = _mm256_or_si256(_mm256_and_si256(i4 < 2 ? l : _mm256_srli_epi16(l, 4), nib),
                                       _mm256_and_si256(hi, two));
            }
            const int g = 8 * h + 2 * i4;
#if GGUF_VNNI /* the scales as int32 (the pair's high half, sign-extended) */
            const __m256i s0 = _mm256_srai_epi32(scl[g], 16), s1 = _mm256_srai_epi32(scl[g + 1], 16);
#else
            const __m256i s0 = scl[g], s1 = scl[g + 1];
#endif
            for (int64_t i = 0; i < mr; ++i) {
                const int8_t *x = xq + i * QK + 128 * h + 32 * i4;
                __m256i acc = isum[i];
#if GGUF_VNNI /* a sub-block's 4 vpdpbusd straight to int32, then its scale (1.1x a core) */
                for (int c = 0; c < 8; c += 4) {
                    __m256i s = dot_u8s8(_mm256_setzero_si256(), v[c], bytes4_bcast(x + 4 * c));
                    for (int e = 1; e < 4; ++e) s = dot_u8s8(s, v[c + e], bytes4_bcast(x + 4 * (c + e)));
                    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(s, c ? s1 : s0));
                }
#else
                for (int c = 0; c < 8; c += 2) { /* 6-bit quants: 2 chunks fill int16 */
                    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(v[c], bytes4_bcast(x + 4 * c)),
                                                       _mm256_maddubs_epi16(v[c + 1], bytes4_bcast(x + 4 * c + 4)));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, c < 4 ? s0 : s1));
                }
#endif
                isum[i] = acc;
            }
        }
    }
}

/* weight row groups [g0, g1) of RW rows (a short last one repeats its first row: lanes unused) against m rows, their
 * quants in gguf_xq.h's block-major copy (super-block b of row i at xqb + (b m + i) QK: a chunk's rows of a block one
 * run of bytes, not k apart in one or two L1 sets; 1.1-1.2x at 16 rows), their numbers (xd, bs, b32) by row */
static inline __attribute__((always_inline)) void groups8(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                          const int8_t *xqb, const float *xd, const int16_t *bs,
                                                          const int16_t *b32, int64_t m, float *y, int64_t g0,
                                                          int64_t g1) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[t], rb = nb * bb;
    int64_t chunk = X_CHUNK_BYTES / (k + nb * 20);
    chunk = chunk > XC ? XC : chunk < 1 ? 1 : chunk;
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t mr = m - c0 < chunk ? m - c0 : chunk;
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t r0 = g * RW;
            const int nr = n_out - r0 < RW ? (int)(n_out - r0) : RW;
            __m256 acc[XC], acc_m[XC];
            __m256i isum[XC];
            for (int64_t i = 0; i < mr; ++i) acc[i] = acc_m[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *p[RW];
                for (int r = 0; r < RW; ++r) {
                    p[r] = w + (r0 + (r < nr ? r : 0)) * rb + b * bb;
                    for (int64_t o = 0; o < bb; o += 64) __builtin_prefetch(p[r] + 2 * bb + o, 0, 0);
                }
                for (int64_t i = 0; i < mr; ++i) isum[i] = _mm256_setzero_si256();
                if (t == 2) {
                    q6k8(p, xqb + (b * m + c0) * QK, bs + (c0 * nb + b) * 16, nb * 16, mr, isum);
                    uint64_t hh[2] = {0, 0};
                    for (int r = 0; r < RW; ++r) {
                        uint16_t u;
                        memcpy(&u, p[r] + 208, 2);
                        hh[r / 4] |= (uint64_t)u << (16 * (r % 4));
                    }
                    const __m256 d = _mm256_cvtph_ps(_mm_set_epi64x((long long)hh[1], (long long)hh[0]));
                    for (int64_t i = 0; i < mr; ++i)
                        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[(c0 + i) * nb + b])),
                                                 _mm256_cvtepi32_ps(isum[i]), acc[i]);
                    continue;
                }
                sb8 sb;
                super8(t, p, &sb);
                quants8(t, p, &sb, xqb + (b * m + c0) * QK, mr, isum);
                for (int64_t i = 0; i < mr; ++i) {
                    const int64_t at = (c0 + i) * nb + b;
                    __m256i ms = _mm256_setzero_si256();
                    for (int q = 0; q < 4; ++q) ms = _mm256_add_epi32(ms, _mm256_madd_epi16(sb.mn[q], bytes4_bcast(b32 + 8 * at + 2 * q)));
                    const __m256 dx = _mm256_set1_ps(xd[at]);
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(sb.d, dx), _mm256_cvtepi32_ps(isum[i]), acc[i]);
                    acc_m[i] = _mm256_fmadd_ps(_mm256_mul_ps(sb.dmin, dx), _mm256_cvtepi32_ps(ms), acc_m[i]);
                }
            }
            for (int64_t i = 0; i < mr; ++i) {
                float o[RW];
                _mm256_storeu_ps(o, _mm256_sub_ps(acc[i], acc_m[i]));
                memcpy(y + (c0 + i) * n_out + r0, o, sizeof(float) * (size_t)nr);
            }
        }
    }
}

typedef void (*groups_fn)(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,
                          const int16_t *bs, const int16_t *b32, int64_t m, float *y, int64_t g0, int64_t g1);
#define GROUPS_OF(T, name)                                                                                         \
    static void name(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,              \
                     const int16_t *bs, const int16_t *b32, int64_t m, float *y, int64_t g0, int64_t g1) {       \
        groups8(T, w, n_out, k, xq, xd, bs, b32, m, y, g0, g1);                                                    \
    }
GROUPS_OF(0, groups_q4k)
GROUPS_OF(1, groups_q5k)
GROUPS_OF(2, groups_q6k)
#undef GROUPS_OF

/* y = x . W^T for m >= FEW_ROWS rows of x: Q8_K rows, with each super-block's 8 sums of 32 (pairs of its sums of
 * 16, as the row passes add them) */
static void many_kq(const int t, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    const int64_t nb = k / QK, groups = (n_out + RW - 1) / RW;
    const gguf_xq *team = gguf_xq_find(x, m, k, GGUF_XQ_Q8K); /* x quantized by the team (gguf_linear.c) */
    int8_t *xq = team != NULL ? team->qb : malloc((size_t)(m * k)); /* block-major */
    int8_t *row = team != NULL ? NULL : malloc((size_t)k);
    float *xd = team != NULL ? team->d : malloc(sizeof(float) * (size_t)(m * nb));
    int16_t *bs = team != NULL ? team->bs : malloc(sizeof(int16_t) * (size_t)(m * k / 16));
    int16_t *b32 = team != NULL ? team->b32 : malloc(sizeof(int16_t) * (size_t)(m * k / 32));
    if (xq != NULL && xd != NULL && bs != NULL && b32 != NULL && (team != NULL || row != NULL)) {
        for (int64_t i = 0; team == NULL && i < m; ++i) {
            gguf_q8k_quantize_row(x + i * k, k, row, xd + i * nb, bs + i * k / 16);
            gguf_xq_blocks(row, nb, QK, m, i, xq);
        }
        if (team == NULL) gguf_q8k_sums32(bs, m * k / 32, b32);
        const groups_fn run = t == 2 ? groups_q6k : t == 1 ? groups_q5k : groups_q4k;
        if (omp_get_level() > 0 || groups == 1) {
            run(w, n_out, k, xq, xd, bs, b32, m, y, 0, groups);
        } else {
#pragma omp parallel
            {
                int64_t g0, g1;
                team_share(groups, &g0, &g1);
                run(w, n_out, k, xq, xd, bs, b32, m, y, g0, g1);
            }
        }
    }
    if (team == NULL) {
        free(xq);
        free(xd);
        free(bs);
        free(b32);
    }
    free(row);
}
#endif

static void matmul_kq(const int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m,
                      float *y) {
    if (k % QK != 0 || m <= 0) return; /* the Python wrapper refuses a bad k first */
#if defined(__AVX2__) && defined(__F16C__)
    if (m >= FEW_ROWS) {
        many_kq(type == GGUF_KQ_Q6_K ? 2 : type == GGUF_KQ_Q5_K, w, n_out, k, x, m, y);
        return;
    }
#endif
    gguf_kquant_q8_matmul(type, w, n_out, k, x, m, y);
}

void gguf_matmul_q4_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_kq(GGUF_KQ_Q4_K, w, n_out, k, x, m, y);
}
void gguf_matmul_q5_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_kq(GGUF_KQ_Q5_K, w, n_out, k, x, m, y);
}
void gguf_matmul_q6_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_kq(GGUF_KQ_Q6_K, w, n_out, k, x, m, y);
}
