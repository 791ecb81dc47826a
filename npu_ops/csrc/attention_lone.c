/* Attention for a lone row (a one-stream decode step) by the whole team (attention.c's attn_rows_f32_team calls
 * it for a plan with pl->shared). The row primitives are the batch rows' (attention_rows.c): each element takes
 * the operations a batch row's attention gives it, so a lone row has the bits it has in a batch. */
#include <stdint.h>
#include <string.h>

#include "attention_lone.h"
#include "attention_rows.h"
#include "team_sync.h"
#include "vec_math.h"

static inline void prefetch_span(const float *v, int64_t stride, int64_t n, int64_t c0, int64_t c1) {
    for (int64_t j = 0; j < n; ++j)
        for (int64_t c = c0; c < c1; c += 16) __builtin_prefetch(v + j * stride + c, 0, 1);
}

/* acc[c0:c1] += sum_j p[j] * v_j[c0:c1] (a span of one head's D columns): per element the same operations in the
 * same order as accumulate_rows over the whole head, so a split head adds up to the same bits. With AVX2 and D a
 * multiple of 64 (accumulate_rows' fused multiply-add path) c0 and c1 are multiples of 8. */
static void accumulate_span(const float *restrict p, const float *restrict v, int64_t stride, int64_t n, int64_t D,
                            int64_t c0, int64_t c1, float *restrict acc) {
#ifdef __AVX2__
    if (D % 64 == 0) {
        for (int64_t d0 = c0; d0 < c1; d0 += 64) {
            const int nv = (int)((c1 - d0 < 64 ? c1 - d0 : 64) / 8);
            __m256 a[8];
            for (int i = 0; i < nv; ++i) a[i] = _mm256_loadu_ps(acc + d0 + 8 * i);
            for (int64_t j = 0; j < n; ++j) {
                const __m256 pv = _mm256_set1_ps(p[j]);
                const float *vr = v + j * stride + d0;
                for (int i = 0; i < nv; ++i) a[i] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 8 * i), a[i]);
            }
            for (int i = 0; i < nv; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
        }
        return;
    }
#endif
    (void)D;
    for (int64_t j = 0; j < n; ++j) {
        const float pj = p[j], *vr = v + j * stride;
#pragma omp simd
        for (int64_t d = c0; d < c1; ++d) acc[d] += pj * vr[d];
    }
}

#ifdef __AVX2__
/* Blocks a V pass asks for ahead: a pass spends well under a memory latency on a block's few columns (A/B on one
 * stream: 1 block ahead 1.0, 3 blocks 1.017x, 6 blocks 1.014x). */
#define V_AHEAD 3

/* V vectors of VW floats (an AVX-512 build gains nothing from zmm here: Zen 4 runs them as two ymm halves) */
#define VW 8
typedef __m256 vvec;
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
#define V_FMA _mm256_fmadd_ps

/* out[h, c0 + VW i] for the G query heads h of KV head g and NC vectors of columns from c0: sum_j p_h[j] v_j, one
 * fused multiply-add per key in key order from zero, as accumulate_rows gives each element; a V vector is loaded
 * once for the G heads and the sums stay in registers over every key. */
static inline __attribute__((always_inline)) void v_group_pass(const int G, const int NC, const float *restrict scores,
                                                               int64_t L, const float *restrict v_cache,
                                                               const int32_t *restrict bt, int64_t g, int64_t D,
                                                               int64_t BS, int64_t tok_stride, int64_t blk_stride,
                                                               int64_t c0, float *restrict out) {
    vvec a[4][8];
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 8
        for (int i = 0; i < NC; ++i) a[h][i] = V_ZERO();
    const float *p = scores + g * G * L;
    const int64_t nblk = (L + BS - 1) / BS, c1 = c0 + VW * NC;
    for (int64_t b = 1; b < V_AHEAD && b < nblk; ++b)
        prefetch_span(v_cache + (int64_t)bt[b] * blk_stride + g * D, tok_stride, BS, c0, c1);
    for (int64_t b = 0; b < nblk; ++b) {
        const int64_t start = b * BS, n = L - start < BS ? L - start : BS;
        const float *vb = v_cache + (int64_t)bt[b] * blk_stride + g * D + c0;
        if (b + V_AHEAD < nblk) /* rows of these columns further on: blocks sit beyond the hardware prefetcher */
            prefetch_span(v_cache + (int64_t)bt[b + V_AHEAD] * blk_stride + g * D, tok_stride, BS, c0, c1);
        for (int64_t j = 0; j < n; ++j) {
            vvec v[8];
#pragma GCC unroll 8
            for (int i = 0; i < NC; ++i) v[i] = V_LOAD(vb + j * tok_stride + VW * i);
#pragma GCC unroll 4
            for (int h = 0; h < G; ++h) {
                const vvec pv = V_SET1(p[h * L + start + j]);
#pragma GCC unroll 8
                for (int i = 0; i < NC; ++i) a[h][i] = V_FMA(pv, v[i], a[h][i]);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 8
        for (int i = 0; i < NC; ++i) V_STORE(out + (g * G + h) * D + c0 + VW * i, a[h][i]);
}

#define V_GROUP_PASS(G_, NC_) LONE_V_PASS(v_pass, v_group_pass, G_, NC_)
#define V_GROUP_PASSES(G_) V_GROUP_PASS(G_, 1) V_GROUP_PASS(G_, 2) V_GROUP_PASS(G_, 4)
V_GROUP_PASSES(1)
V_GROUP_PASSES(2)
V_GROUP_PASSES(3)
V_GROUP_PASS(1, 8)
V_GROUP_PASS(4, 1)
V_GROUP_PASS(4, 2)
/* [G][log2 NC]: the widest pass has G * NC accumulators within the registers (at most 12 of the 16) */
static const lone_v_pass V_PASSES[5][4] = {{0},
                                           {v_pass_1_1, v_pass_1_2, v_pass_1_4, v_pass_1_8},
                                           {v_pass_2_1, v_pass_2_2, v_pass_2_4, NULL},
                                           {v_pass_3_1, v_pass_3_2, v_pass_3_4, NULL},
                                           {v_pass_4_1, v_pass_4_2, NULL, NULL}};
#endif

/* A lone row's weighted sum of V shared over the team by query head and column span (any group size and D). */
static void lone_v_sum_heads(const float *scores, int64_t L, const float *v_cache, const int32_t *bt, int64_t H,
                             int64_t G, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride, float *out) {
#ifdef __AVX2__
    const int64_t unit = D % 64 == 0 ? 8 : D; /* columns a thread takes at a time: accumulate_span's grain */
#else
    const int64_t unit = D;
#endif
    const int64_t nblk = (L + BS - 1) / BS;
    int64_t u0, u1;
    team_share(H * D / unit, &u0, &u1);
    for (int64_t u = u0; u < u1;) {
        const int64_t h = u * unit / D, c0 = u * unit - h * D, last = (h + 1) * D / unit < u1 ? (h + 1) * D / unit : u1,
                      c1 = last * unit - h * D;
        float *o = out + h * D;
        memset(o + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        for (int64_t b = 0; b < nblk; ++b) {
            const int64_t start = b * BS, n = L - start < BS ? L - start : BS;
            const float *vh = v_cache + (int64_t)bt[b] * blk_stride + (h / G) * D;
            if (b + 1 < nblk) /* the next block's rows of this span: blocks sit beyond the hardware prefetcher */
                prefetch_span(v_cache + (int64_t)bt[b + 1] * blk_stride + (h / G) * D, tok_stride, BS, c0, c1);
            accumulate_span(scores + h * L + start, vh, tok_stride, n, D, c0, c1, o);
        }
        u = last;
    }
}

/* A lone row (a one-stream decode step) by the whole team: split by query head it left a thread idle (9 heads
 * over 2 threads: 5 and 4) and read each K/V block once per query head. Here the threads share the key blocks
 * for the scores (every head at once: a block is read once), the heads for the softmax, and the output columns
 * for the weighted sum of V. Every score, softmax and output element takes the operations attend gives it, in
 * the same order, so the row's result has the bits it has inside a batch. scores: the plan's shared [H, L]. */
void attend_lone_row(const attn_plan *pl, const float *restrict q, const float *restrict k_cache,
                            const float *restrict v_cache, const int32_t *restrict bt, int64_t pos,
                            float *restrict out, int64_t H, int64_t D, int64_t BS, int64_t tok_stride,
                            int64_t blk_stride, float scale) {
    const int64_t L = pos + 1, nblk = (L + BS - 1) / BS, G = pl->G;
    float *scores = pl->shared;
    int64_t b0, b1;
    team_share(nblk, &b0, &b1);
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t start = b * BS, n = L - start < BS ? L - start : BS;
        const float *kb = k_cache + (int64_t)bt[b] * blk_stride;
        /* the next block's lines a share before each head's scores: one burst of a whole block's prefetches
         * overflows the core's queue of outstanding misses */
        const float *nb = b + 1 < b1 ? k_cache + (int64_t)bt[b + 1] * blk_stride : NULL;
        const int64_t per = (blk_stride + 16 * H - 1) / (16 * H) * 16;
        for (int64_t h = 0; h < H; ++h) {
            if (nb != NULL && h * per < blk_stride)
                attn_prefetch_block(nb + h * per, h * per + per <= blk_stride ? per : blk_stride - h * per);
            attn_score_rows(q + h * D, kb + (h / G) * D, tok_stride, n, D, scale, scores + h * L + start);
        }
    }
    team_barrier();
    int64_t h0, h1;
    team_share(H, &h0, &h1);
    for (int64_t h = h0; h < h1; ++h) softmax_inplace(scores + h * L, L);
    team_barrier();
#ifdef __AVX2__
    if (D % 64 == 0 && G <= 4)
        lone_v_units(V_PASSES[G], 4, scores, L, v_cache, bt, H / G, D, BS, tok_stride, blk_stride, out);
    else
#endif
        lone_v_sum_heads(scores, L, v_cache, bt, H, G, D, BS, tok_stride, blk_stride, out);
    team_barrier();
}

