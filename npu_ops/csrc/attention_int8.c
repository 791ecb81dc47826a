/* Paged attention for the CPU over an int8 KV cache (npu_ops/quant_kv.py): the same row contract, plan (tiles
 * and head split: attention_rows.c) and standalone driver (attention.c) as fp32 pages (a lone row:
 * attention_lone_i8.c), but every cache row (one token, one KV head) is D int8 values followed by their fp32
 * scale, read in place: scores are scale_k * (q . k_int8) and the output sums p * scale_v * v_int8, widening
 * eight int8 lanes at a time. A quarter of the bytes of an fp32 cache pass through memory. q and out stay fp32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_i8.h"
#include "attention_int8.h"
#include "attention_lone_i8.h"
#include "attention_rows.h"
#include "vec_math.h"

/* s[j] = q . k_j * scale_j * scale for the n rows k_j = k + j * stride (bytes) */
void attn_score_rows_i8(const float *restrict q, const int8_t *restrict k, int64_t stride, int64_t n, int64_t D,
                          float scale, float *restrict s) {
    int64_t j0 = 0;
#ifdef __AVX2__
    if (D % 8 == 0) /* four rows at once: four independent multiply-add chains */
        for (; j0 + 4 <= n; j0 += 4) {
            const int8_t *k0 = k + j0 * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, load8_i8(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, load8_i8(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qv, load8_i8(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qv, load8_i8(k3 + d), a3);
            }
            s[j0] = hsum256(a0) * row_scale(k0, D) * scale;
            s[j0 + 1] = hsum256(a1) * row_scale(k1, D) * scale;
            s[j0 + 2] = hsum256(a2) * row_scale(k2, D) * scale;
            s[j0 + 3] = hsum256(a3) * row_scale(k3, D) * scale;
        }
#endif
    for (int64_t j = j0; j < n; ++j) {
        const int8_t *kr = k + j * stride;
        float dot = 0.f;
        int64_t d = 0;
#ifdef __AVX2__
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (; d + 16 <= D; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8_i8(kr + d), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8_i8(kr + d + 8), a1);
        }
        dot = hsum256(_mm256_add_ps(a0, a1));
#endif
        for (; d < D; ++d) dot += q[d] * (float)kr[d];
        s[j] = dot * row_scale(kr, D) * scale;
    }
}

/* acc[0:D] += sum_j p[j] * scale_j * v_j: per element, w_j = p[j] * scale_j then one fused multiply-add per row
 * in row order (attention_lone_i8.c's V passes give each element the same) */
static void accumulate_rows_i8(const float *restrict p, const int8_t *restrict v, int64_t stride, int64_t n,
                               int64_t D, float *restrict acc) {
#ifdef __AVX2__
    if (D % 64 == 0) { /* the accumulator stays in eight registers across the rows */
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            __m256 a[8];
            for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(acc + d0 + 8 * i);
            for (int64_t j = 0; j < n; ++j) {
                const int8_t *vr = v + j * stride;
                const __m256 wv = _mm256_set1_ps(p[j] * row_scale(vr, D));
                for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(wv, load8_i8(vr + d0 + 8 * i), a[i]);
            }
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
        }
        return;
    }
#endif
    for (int64_t j = 0; j < n; ++j) {
        const int8_t *vr = v + j * stride;
        const float w = p[j] * row_scale(vr, D);
        int64_t d = 0;
#ifdef __AVX2__
        const __m256 wv = _mm256_set1_ps(w);
        for (; d + 8 <= D; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(wv, load8_i8(vr + d), _mm256_loadu_ps(acc + d)));
#endif
        for (; d < D; ++d) acc[d] += w * (float)vr[d];
    }
}

/* query heads [h0, h1) of nrows consecutive rows of one sequence from position pos0 (attention.c's attend over
 * int8 rows: each row's scores, softmax and sums take the same operations whatever the task split) */
static void attend_i8(const float *restrict q, const int8_t *restrict k_cache, const int8_t *restrict v_cache,
                      const int32_t *restrict bt, int64_t pos0, int64_t nrows, float *restrict out, int64_t h0,
                      int64_t h1, int64_t H, int64_t G, int64_t D, int64_t BS, int64_t tok_stride,
                      int64_t blk_stride, int64_t row, float scale, float *restrict scores, float *restrict acc) {
    const int64_t nh = h1 - h0, L = pos0 + nrows;
    const int grouped = groups_i8(G, D, h0, h1); /* a row widened once for a KV head's query heads */
    for (int64_t start = 0; start < L; start += BS) {
        const int8_t *kb = k_cache + (int64_t)bt[start / BS] * blk_stride;
        for (int64_t i = 0; i < nrows; ++i) {
            const int64_t len = pos0 + i + 1 - start, n = len < BS ? len : BS;
            if (n <= 0) continue;
            if (grouped)
                for (int64_t h = h0; h < h1; h += G)
                    attn_score_group_i8(G, q + i * H * D + h * D, kb + (h / G) * row, tok_stride, n, D, scale,
                                        scores + (i * nh + h - h0) * L + start, L);
            else
                for (int64_t h = h0; h < h1; ++h)
                    attn_score_rows_i8(q + i * H * D + h * D, kb + (h / G) * row, tok_stride, n, D, scale,
                                       scores + (i * nh + h - h0) * L + start);
        }
    }
    for (int64_t i = 0; i < nrows; ++i)
        for (int64_t r = i * nh; r < (i + 1) * nh; ++r) softmax_inplace(scores + r * L, pos0 + i + 1);
    memset(acc, 0, sizeof(float) * (size_t)(nrows * nh * D));
    for (int64_t start = 0; start < L; start += BS) {
        const int8_t *vb = v_cache + (int64_t)bt[start / BS] * blk_stride;
        for (int64_t i = 0; i < nrows; ++i) {
            const int64_t len = pos0 + i + 1 - start, n = len < BS ? len : BS;
            if (n <= 0) continue;
            if (grouped)
                for (int64_t h = h0; h < h1; h += G)
                    attn_acc_group_i8(G, scores + (i * nh + h - h0) * L + start, L, vb + (h / G) * row, tok_stride, n,
                                      D, acc + (i * nh + h - h0) * D);
            else
                for (int64_t h = h0; h < h1; ++h)
                    accumulate_rows_i8(scores + (i * nh + h - h0) * L + start, vb + (h / G) * row, tok_stride, n, D,
                                       acc + (i * nh + h - h0) * D);
        }
    }
    for (int64_t i = 0; i < nrows; ++i)
        memcpy(out + i * H * D + h0 * D, acc + i * nh * D, sizeof(float) * (size_t)(nh * D));
}

/* The rows of a plan (attention_rows.c's attn_plan_f32: its tiles and query-head split) over int8 pages, by the
 * calling team (orphaned: ends on the team's barrier); a lone row goes to attend_lone_row_i8. */
void attn_rows_i8_team(const attn_plan *pl, const float *q, const int8_t *k_cache, const int8_t *v_cache,
                       const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                       int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores,
                       float *acc) {
    const int64_t row = D + 4, tok_stride = KVH * row, blk_stride = BS * KVH * row;
    if (pl->shared != NULL && lone_i8_supported(H, KVH, D)) {
        attend_lone_row_i8(pl, q, k_cache, v_cache, block_tables + (int64_t)row_seq[0] * MB, row_pos[0], out, H,
                           KVH, D, BS, scale);
        return;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = pl->ntiles * pl->split - 1; task >= 0; --task) {
        const int64_t tile = task / pl->split, h0 = (task % pl->split) * pl->per, t = pl->tiles[tile];
        attend_i8(q + t * H * D, k_cache, v_cache, block_tables + (int64_t)row_seq[t] * MB, row_pos[t],
                  pl->tiles[tile + 1] - t, out + t * H * D, h0, h0 + pl->per, H, pl->G, D, BS, tok_stride,
                  blk_stride, row, scale, scores, acc);
    }
}

/* One cache row from D floats, as npu_ops/quant_kv.py's quantize writes it: symmetric, scale = amax / 127
 * (1 for a zero row), values round(x / scale) half to even, then the scale's 4 bytes. */
void kv_quantize_row_i8(const float *restrict x, int64_t D, int8_t *restrict out) {
    float amax = 0.f;
    for (int64_t d = 0; d < D; ++d) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
    const float s = amax > 0.f ? amax / 127.f : 1.f;
    for (int64_t d = 0; d < D; ++d) {
        const float r = nearbyintf(x[d] / s);
        out[d] = (int8_t)(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
    }
    memcpy(out + D, &s, sizeof s);
}
