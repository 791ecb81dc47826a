/* What every paged-attention path shares: the plan of a step's rows (tiles and query-head split), the fp32 score
 * rows and block prefetch (attention.c's batch rows and attention_lone.c's lone row: one compiled copy, so both
 * round alike), and a lone row's V units (attention_lone.c over fp32 rows, attention_lone_i8.c over int8 ones). */
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"
#include "team_sync.h"
#include "vec_math.h"

#define TILE_ROWS 8

/* Checks the rows and cuts them into tiles: up to TILE_ROWS consecutive rows of one sequence at consecutive
 * positions (a prefill); a decode row is a tile of its own. Returns 0, or the kernel's error code. */
int attn_plan_f32(attn_plan *pl, const int32_t *row_seq, const int32_t *row_pos, int64_t T, int64_t S, int64_t H,
                  int64_t KVH, int64_t D, int64_t BS, int64_t MB, int nthreads) {
    pl->tiles = NULL;
    if (KVH <= 0 || H % KVH != 0 || nthreads < 1) return 1;
    int64_t max_len = 1;
    for (int64_t t = 0; t < T; ++t) {
        if (row_seq[t] < 0 || row_seq[t] >= S || row_pos[t] < 0 || row_pos[t] >= MB * BS) return 2;
        if (row_pos[t] + 1 > max_len) max_len = row_pos[t] + 1;
    }
    int64_t *tiles = malloc(sizeof(int64_t) * (size_t)(T + 1)), ntiles = 0, max_rows = 1;
    if (tiles == NULL) return 3;
    for (int64_t t = 0; t < T; ++t)
        if (t == 0 || row_seq[t] != row_seq[t - 1] || row_pos[t] != row_pos[t - 1] + 1 ||
            t - tiles[ntiles - 1] >= TILE_ROWS)
            tiles[ntiles++] = t;
        else if (t - tiles[ntiles - 1] + 1 > max_rows)
            max_rows = t - tiles[ntiles - 1] + 1;
    tiles[ntiles] = T;
    /* Query heads per task: all of them when there are plenty of tiles to share out, else one KV head's group
     * or, with few tiles (a lone decode row: 9 heads over 3 KV heads), one query head, so that every thread
     * has an even share; a KV block re-read by a group's tasks comes from the cache. */
    const int64_t G = H / KVH, split = ntiles >= 4 * (int64_t)nthreads ? 1 : ntiles * KVH >= 4 * nthreads ? KVH : H,
                  per = H / split;
    *pl = (attn_plan){tiles, ntiles, split, per, G, max_rows * per * max_len, max_rows * per * D, NULL};
    if (T == 1 && nthreads > 1) { /* a lone row: the team shares it (attend_lone_row) */
        pl->shared = malloc(sizeof(float) * (size_t)(H * max_len));
        if (pl->shared == NULL) {
            free(tiles);
            return 3;
        }
    }
    return 0;
}

void attn_plan_free(attn_plan *pl) {
    free(pl->tiles);
    free(pl->shared);
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* Blocks sit at random places in the pool, beyond the reach of the hardware prefetcher: ask for
 * the next one while this one is being read. */
void attn_prefetch_block(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 1);
}

#ifdef __AVX2__
/* The eight lane sums of a[0..7] as one vector (lane i: a[i]'s sum): three rounds of pairwise adds instead of
 * eight horizontal sums. */
static inline __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

/* s[j] = q . k_j * scale for the n rows k_j = k + j * stride. With AVX2 eight rows go at once: eight
 * independent multiply-add chains hide each other's latency, and their sums come out as one vector. */
void attn_score_rows(const float *restrict q, const float *restrict k, int64_t stride, int64_t n, int64_t D,
                       float scale, float *restrict s) {
    int64_t j = 0;
#ifdef __AVX2__
    if (D % 8 == 0)
        for (; j + 8 <= n; j += 8) {
            __m256 a[8];
            for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(q + d);
                for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (j + r) * stride + d), a[r]);
            }
            _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(a), _mm256_set1_ps(scale)));
        }
    if (D % 8 == 0)
        for (; j + 4 <= n; j += 4) {
            const float *k0 = k + j * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
            }
            s[j] = hsum256(a0) * scale;
            s[j + 1] = hsum256(a1) * scale;
            s[j + 2] = hsum256(a2) * scale;
            s[j + 3] = hsum256(a3) * scale;
        }
#endif
    for (; j < n; ++j) s[j] = dot(q, k + j * stride, D) * scale;
}

void lone_v_units(const lone_v_pass *passes, int npasses, const float *scores, int64_t L, const void *v_cache,
                  const int32_t *bt, int64_t KVH, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride,
                  float *out) {
    int64_t u0, u1;
    team_share(KVH * D / 8, &u0, &u1);
    for (int64_t u = u0; u < u1;) {
        const int64_t g = u * 8 / D, left = (g + 1) * D / 8 - u, rest = u1 - u, run = left < rest ? left : rest;
        int k = npasses - 1;
        while (passes[k] == NULL || (1 << k) > run) --k;
        passes[k](scores, L, v_cache, bt, g, D, BS, tok_stride, blk_stride, u * 8 - g * D, out);
        u += 1 << k;
    }
}
