/* Paged attention for the CPU, fp32, one query row at a time: row t of sequence row_seq[t] at
 * position row_pos[t] attends causally to positions 0..row_pos[t] of that sequence, read in place
 * from the cache through its block table (no gather, no padding). Decode rows (one per sequence)
 * and prefill rows (every new prompt token, with or without a cached prefix) are the same thing;
 * a step's K/V are written to the cache before attention runs.
 *
 * Layouts (all contiguous): q, out [T, H, D]; k_cache, v_cache [num_blocks, BS, KVH, D];
 * block_tables [S, MB] int32; row_seq, row_pos [T] int32. The H query heads are KVH groups of
 * G = H / KVH heads sharing one KV head (GQA). A task is a tile of consecutive rows of one
 * sequence (a decode row alone) and a run of its query heads: with many tiles each task walks whole
 * blocks front to back (contiguous reads) once for all its rows; with few, the heads are split
 * across tasks (by KV head, or down to one query head each) so that every thread has an even share.
 * Threads come from the OpenMP runtime the process already has loaded (PyTorch's libgomp). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attention_int8.h"
#include "attention_lone.h"
#include "attention_rows.h"
#include "kernels.h"
#include "vec_math.h"

/* acc[0:D] += sum_j p[j] * v_j for the n rows v_j = v + j * stride. With AVX2 and D a multiple of
 * 64, the accumulator stays in eight registers across the rows instead of going through memory. */
static void accumulate_rows(const float *restrict p, const float *restrict v, int64_t stride, int64_t n, int64_t D,
                            float *restrict acc) {
#ifdef __AVX2__
    if (D % 64 == 0) {
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            __m256 a[8];
            for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(acc + d0 + 8 * i);
            for (int64_t j = 0; j < n; ++j) {
                const __m256 pv = _mm256_set1_ps(p[j]);
                const float *vr = v + j * stride + d0;
                for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 8 * i), a[i]);
            }
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
        }
        return;
    }
#endif
    for (int64_t j = 0; j < n; ++j) {
        const float pj = p[j], *vr = v + j * stride;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += pj * vr[d];
    }
}

/* Rows pos0 .. pos0 + nrows - 1 of one sequence (a tile; the last attends to pos0 + nrows keys),
 * query heads [h0, h1) (query head h reads KV head h / G). q, out: the tile's first row [H, D], rows H * D
 * apart. Each K/V block is read once per tile and used by all its rows while it sits in L1. scores:
 * [nrows * nh, L] and acc: [nrows * nh, D] with nh = h1 - h0, L = pos0 + nrows. */
static void attend(const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
                   const int32_t *restrict bt, int64_t pos0, int64_t nrows, float *restrict out, int64_t h0,
                   int64_t h1, int64_t H, int64_t G, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride,
                   float scale, float *restrict scores, float *restrict acc) {
    const int64_t nh = h1 - h0, L = pos0 + nrows;
    for (int64_t start = 0; start < L; start += BS) {
        const float *kb = k_cache + (int64_t)bt[start / BS] * blk_stride;
        if (start + BS < L) attn_prefetch_block(k_cache + (int64_t)bt[start / BS + 1] * blk_stride, blk_stride);
        for (int64_t i = 0; i < nrows; ++i) {
            const int64_t len = pos0 + i + 1 - start, n = len < BS ? len : BS; /* causal: keys <= pos0 + i */
            if (n <= 0) continue;
            for (int64_t h = h0; h < h1; ++h)
                attn_score_rows(q + i * H * D + h * D, kb + (h / G) * D, tok_stride, n, D, scale,
                           scores + (i * nh + h - h0) * L + start);
        }
    }
    for (int64_t i = 0; i < nrows; ++i)
        for (int64_t r = i * nh; r < (i + 1) * nh; ++r) softmax_inplace(scores + r * L, pos0 + i + 1);
    memset(acc, 0, sizeof(float) * (size_t)(nrows * nh * D));
    for (int64_t start = 0; start < L; start += BS) {
        const float *vb = v_cache + (int64_t)bt[start / BS] * blk_stride;
        if (start + BS < L) attn_prefetch_block(v_cache + (int64_t)bt[start / BS + 1] * blk_stride, blk_stride);
        for (int64_t i = 0; i < nrows; ++i) {
            const int64_t len = pos0 + i + 1 - start, n = len < BS ? len : BS;
            if (n <= 0) continue;
            for (int64_t h = h0; h < h1; ++h)
                accumulate_rows(scores + (i * nh + h - h0) * L + start, vb + (h / G) * D, tok_stride, n, D,
                                acc + (i * nh + h - h0) * D);
        }
    }
    for (int64_t i = 0; i < nrows; ++i)
        memcpy(out + i * H * D + h0 * D, acc + i * nh * D, sizeof(float) * (size_t)(nh * D));
}

/* The plan's tasks shared over the calling team (orphaned `omp for`, ends on the team's barrier); scores and
 * acc: this thread's scratch of pl->scores_len and pl->acc_len floats. */
void attn_rows_f32_team(const attn_plan *pl, const float *q, const float *k_cache, const float *v_cache,
                        const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores,
                        float *acc) {
    const int64_t tok_stride = KVH * D, blk_stride = BS * KVH * D, split = pl->split, per = pl->per;
    if (pl->shared != NULL) {
        attend_lone_row(pl, q, k_cache, v_cache, block_tables + (int64_t)row_seq[0] * MB, row_pos[0], out, H, D, BS,
                        tok_stride, blk_stride, scale);
        return;
    }
    /* tiles come in sequence order with growing positions: walking them backwards hands out the
     * longest first, which keeps the threads' shares even */
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = pl->ntiles * split - 1; task >= 0; --task) {
        const int64_t tile = task / split, h0 = (task % split) * per, t = pl->tiles[tile];
        attend(q + t * H * D, k_cache, v_cache, block_tables + (int64_t)row_seq[t] * MB, row_pos[t],
               pl->tiles[tile + 1] - t, out + t * H * D, h0, h0 + per, H, pl->G, D, BS, tok_stride, blk_stride,
               scale, scores, acc);
    }
}

void attn_rows_team(const attn_plan *pl, int kv_i8, const float *q, const void *k_cache, const void *v_cache,
                    const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out, int64_t H,
                    int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores, float *acc) {
    if (kv_i8)
        attn_rows_i8_team(pl, q, k_cache, v_cache, block_tables, row_seq, row_pos, out, H, KVH, D, BS, MB, scale,
                          scores, acc);
    else
        attn_rows_f32_team(pl, q, k_cache, v_cache, block_tables, row_seq, row_pos, out, H, KVH, D, BS, MB, scale,
                           scores, acc);
}

/* The standalone attention-rows kernels' body (fp32 pages, or int8 ones: attention_int8.c): the plan, one team
 * and its scratch, the rows by attn_rows_team. */
int attn_rows_standalone(const float *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
                         const int32_t *row_seq, const int32_t *row_pos, float *out, int64_t T, int64_t S, int64_t H,
                         int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, int nthreads, int kv_i8) {
    if (T <= 0) return 0;
    attn_plan pl;
    const int rc = attn_plan_f32(&pl, row_seq, row_pos, T, S, H, KVH, D, BS, MB, nthreads);
    if (rc != 0) return rc;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        /* scratch for the largest tile: a decode-only step needs one row's worth */
        float *scores = malloc(sizeof(float) * (size_t)pl.scores_len);
        float *acc = malloc(sizeof(float) * (size_t)pl.acc_len);
        int ok = scores != NULL && acc != NULL;
        if (!ok) {
#pragma omp atomic write
            failed = 3;
        }
#pragma omp barrier
        if (!failed)
            attn_rows_team(&pl, kv_i8, q, k_cache, v_cache, block_tables, row_seq, row_pos, out, H, KVH, D, BS, MB,
                           scale, scores, acc);
        free(scores);
        free(acc);
    }
    attn_plan_free(&pl);
    return failed;
}

int paged_attention_rows_f32(const float *q, const float *k_cache, const float *v_cache,
                             const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                             int64_t T, int64_t S, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                             float scale, int nthreads) {
    return attn_rows_standalone(q, k_cache, v_cache, block_tables, row_seq, row_pos, out, T, S, H, KVH, D, BS, MB,
                                scale, nthreads, 0);
}

/* int8 pages (attention_int8.c's rows): here beside the fp32 kernel, as both are attn_rows_standalone */
int paged_attention_rows_i8(const float *q, const int8_t *k_cache, const int8_t *v_cache,
                            const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                            int64_t T, int64_t S, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                            float scale, int nthreads) {
    return attn_rows_standalone(q, k_cache, v_cache, block_tables, row_seq, row_pos, out, T, S, H, KVH, D, BS, MB,
                                scale, nthreads, 1);
}
