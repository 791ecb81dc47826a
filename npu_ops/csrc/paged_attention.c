/* Paged decode attention for the CPU, fp32: one query token per sequence attends over the K/V
 * rows that its block table points at, read in place from the cache (no gather, no padding).
 *
 * Layouts (all contiguous): q, out [B, H, D]; k_cache, v_cache [num_blocks, BS, KVH, D];
 * block_tables [B, MB] int32; ctx_lens [B] int32. The H query heads are KVH groups of G = H / KVH
 * heads sharing one KV head (GQA). A task is one sequence and a run of its KV heads: with many
 * sequences each task walks whole blocks front to back (contiguous reads); with few, the KV heads
 * are split across tasks so that every thread has work.
 * Threads come from the OpenMP runtime the process already has loaded (PyTorch's libgomp). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

static void attend(const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
                   const int32_t *restrict bt, int64_t L, float *restrict out, int64_t h0, int64_t h1,
                   int64_t G, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride, float scale,
                   float *restrict scores, float *restrict acc) {
    /* q, out: this sequence's [H, D]; heads [h0, h1) of the KV heads; scores [(h1-h0)*G, L] */
    const int64_t nh = (h1 - h0) * G;
    for (int64_t start = 0; start < L; start += BS) {
        const float *kb = k_cache + (int64_t)bt[start / BS] * blk_stride;
        const int64_t n = L - start < BS ? L - start : BS;
        for (int64_t j = 0; j < n; ++j)
            for (int64_t kh = h0; kh < h1; ++kh) {
                const float *k = kb + j * tok_stride + kh * D;
                for (int64_t g = 0; g < G; ++g) {
                    const int64_t r = (kh - h0) * G + g;
                    scores[r * L + start + j] = dot(q + (kh * G + g) * D, k, D) * scale;
                }
            }
    }
    for (int64_t r = 0; r < nh; ++r) {
        float *s = scores + r * L, m = s[0], sum = 0.f;
        for (int64_t t = 1; t < L; ++t) m = s[t] > m ? s[t] : m;
        for (int64_t t = 0; t < L; ++t) {
            s[t] = expf(s[t] - m);
            sum += s[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < L; ++t) s[t] *= inv;
    }
    memset(acc, 0, sizeof(float) * (size_t)(nh * D));
    for (int64_t start = 0; start < L; start += BS) {
        const float *vb = v_cache + (int64_t)bt[start / BS] * blk_stride;
        const int64_t n = L - start < BS ? L - start : BS;
        for (int64_t j = 0; j < n; ++j)
            for (int64_t kh = h0; kh < h1; ++kh) {
                const float *v = vb + j * tok_stride + kh * D;
                for (int64_t g = 0; g < G; ++g) {
                    const int64_t r = (kh - h0) * G + g;
                    const float p = scores[r * L + start + j];
                    float *a = acc + r * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
                }
            }
    }
    memcpy(out + h0 * G * D, acc, sizeof(float) * (size_t)(nh * D));
}

int paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, const int32_t *ctx_lens, float *out,
                               int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                               float scale, int nthreads) {
    if (B <= 0) return 0;
    if (KVH <= 0 || H % KVH != 0 || nthreads < 1) return 1;
    const int64_t G = H / KVH, tok_stride = KVH * D, blk_stride = BS * KVH * D;
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; ++b) {
        if (ctx_lens[b] <= 0 || ctx_lens[b] > MB * BS) return 2;
        if (ctx_lens[b] > max_len) max_len = ctx_lens[b];
    }
    /* KV heads per task: all of them when there are plenty of sequences to share out */
    const int64_t split = B >= 4 * (int64_t)nthreads ? 1 : KVH, per = KVH / split;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(per * G * max_len));
        float *acc = malloc(sizeof(float) * (size_t)(per * G * D));
        if (scores == NULL || acc == NULL) {
#pragma omp atomic write
            failed = 3;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * split; ++task) {
            if (scores == NULL || acc == NULL) continue;
            const int64_t b = task / split, h0 = (task % split) * per;
            attend(q + b * H * D, k_cache, v_cache, block_tables + b * MB, ctx_lens[b], out + b * H * D, h0,
                   h0 + per, G, D, BS, tok_stride, blk_stride, scale, scores, acc);
        }
        free(scores);
        free(acc);
    }
    return failed;
}
