/* What every paged-attention path shares (attention_rows.c): the plan of a step's rows, the fp32 score rows and
 * block prefetch (attention.c's batch rows and attention_lone.c's lone row: one compiled copy, so both round
 * alike), and a lone row's V units over the team (attention_lone.c, attention_lone_i8.c). */
#ifndef MINDIE_ATTENTION_ROWS_H
#define MINDIE_ATTENTION_ROWS_H
#include <stdint.h>

typedef struct {
    int64_t *tiles; /* [ntiles + 1] first row of each tile, then T */
    int64_t ntiles, split, per, G;
    int64_t scores_len, acc_len; /* floats of per-thread scratch */
    float *shared;               /* a lone row's scores [H, L], shared by the team; NULL for other steps */
} attn_plan;

/* Checks the rows and cuts them into tiles (a lone row with nthreads > 1: pl->shared for the team's scores).
 * Returns 0, or the kernels' error codes: 1 bad heads or threads, 2 a row outside its table, 3 no memory. */
int attn_plan_f32(attn_plan *pl, const int32_t *row_seq, const int32_t *row_pos, int64_t T, int64_t S, int64_t H,
                  int64_t KVH, int64_t D, int64_t BS, int64_t MB, int nthreads);
void attn_plan_free(attn_plan *pl);

/* s[j] = q . k_j * scale for the n rows k_j = k + j * stride */
void attn_score_rows(const float *restrict q, const float *restrict k, int64_t stride, int64_t n, int64_t D,
                     float scale, float *restrict s);
/* the n floats from p on their way to the cache (a K/V block the hardware prefetcher cannot foresee) */
void attn_prefetch_block(const float *p, int64_t n);
/* One V pass of a lone row (attention_lone.c over fp32 rows, attention_lone_i8.c over int8 ones): out[h, c0 ..
 * c0 + 8 * 2^k) for the query heads h of KV head g, summed over every key; v_cache as the pass reads it. */
typedef void (*lone_v_pass)(const float *scores, int64_t L, const void *v_cache, const int32_t *bt, int64_t g,
                            int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride, int64_t c0, float *out);
/* the lone_v_pass prefix_G_NC: body(G_, NC_, ...) (an always-inline pass of G query heads and NC vectors) */
#define LONE_V_PASS(prefix, body, G_, NC_)                                                                           \
    static void prefix##_##G_##_##NC_(const float *scores, int64_t L, const void *v_cache, const int32_t *bt,       \
                                      int64_t g, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride,     \
                                      int64_t c0, float *out) {                                                      \
        body(G_, NC_, scores, L, v_cache, bt, g, D, BS, tok_stride, blk_stride, c0, out);                            \
    }
/* a lone row's weighted sum of V shared over the team by KV head and vector of 8 columns (every query head of the
 * group at once: a unit's work is the same for each, so the split is even); a thread's run of units in one KV head
 * goes in the widest passes that fit it. passes[k]: the pass of 2^k vectors (NULL: none), k < npasses. */
void lone_v_units(const lone_v_pass *passes, int npasses, const float *scores, int64_t L, const void *v_cache,
                  const int32_t *bt, int64_t KVH, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride,
                  float *out);
#endif
