/* gemm_kquant_q8.c's lone-row passes (1-3 rows of x against NW weight rows a pass), for AVX2 + F16C builds. Each
 * sub-block's scale madd and its add are one dot_s16 (vpdpwssd on VNNI: 1.12-1.30x the AVX2 build, a Zen 4 core at
 * 1-3 rows; the int16 pair sums stay, as vpdpbusd + vpmulld would spend a multiply more). */
#ifndef MINDIE_KQUANT_Q8_WIDE_H
#define MINDIE_KQUANT_Q8_WIDE_H
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#include "dot_u8s8.h"
#include "gemm_kquant.h"
#include "kquant_block.h"
#include "stream_ahead.h"

/* The lone rows (1-3 rows of x: a decode step of one to three streams): NW weight rows a pass share each x load, and
 * their super-block sums are reduced together (one hadd tree for NW rows, not one each), the scales picked by one
 * shuffle each; each output's integer sums are exact and its fp32 operations are the row pass's, so its bits. */
#define NW 4
static inline __m128i fold256(__m256i v) {
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}
/* [sum of a's lanes, of b's, of c's, of d's] */
static inline __m128i hsum4(__m128i a, __m128i b, __m128i c, __m128i d) {
    return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}
/* a shuffle's mask: int16 lane i of each 128-bit half, in its every int16 lane */
#define PICK16(i) _mm256_set1_epi16((short)(0x0100 + 0x0202 * (i)))

/* NW Q4_K / Q5_K super-blocks (b, b + rb, ...) . mr quantized row blocks, as dot_q45k: acc[r] lanes 0-3 += (d_w
 * xd) S_w, lanes 4-7 += (dmin_w xd) M_w */
static inline __attribute__((always_inline)) void dot4_q45k(const int five, const int mr, const uint8_t *b,
                                                            int64_t rb, const int8_t *xq, int64_t k, const float *xd,
                                                            int64_t nb, const int16_t *bs, __m256 *acc) {
    const __m256i nib = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256i sc[NW], sumi[NW][2];
    __m128i mn[NW];
    uint32_t dd[NW];
    for (int w = 0; w < NW; ++w) {
        const __m128i sm = kq_scales_mins_v(b + w * rb);
        sc[w] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        mn[w] = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
        memcpy(&dd[w], b + w * rb, 4);
        for (int r = 0; r < mr; ++r) sumi[w][r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        __m256i xl[2], xh[2];
        for (int r = 0; r < mr; ++r) {
            xl[r] = _mm256_loadu_si256((const __m256i *)(xq + r * k + 64 * j));
            xh[r] = _mm256_loadu_si256((const __m256i *)(xq + r * k + 64 * j + 32));
        }
        for (int w = 0; w < NW; ++w) {
            const uint8_t *bw = b + w * rb;
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(bw + (five ? 48 : 16) + 32 * j));
            __m256i lo = _mm256_and_si256(q4, nib), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), nib);
            if (five) {
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(bw + 16));
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
            }
            const __m256i s_lo = _mm256_shuffle_epi8(sc[w], PICK16(2 * j));
            const __m256i s_hi = _mm256_shuffle_epi8(sc[w], PICK16(2 * j + 1));
            for (int r = 0; r < mr; ++r) {
                sumi[w][r] = dot_s16(sumi[w][r], s_lo, _mm256_maddubs_epi16(lo, xl[r]));
                sumi[w][r] = dot_s16(sumi[w][r], s_hi, _mm256_maddubs_epi16(hi, xh[r]));
            }
        }
    }
    /* [d_0..d_3, dmin_0..dmin_3] */
    const __m256 dm = _mm256_permutevar8x32_ps(
        _mm256_cvtph_ps(_mm_setr_epi32((int)dd[0], (int)dd[1], (int)dd[2], (int)dd[3])),
        _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    for (int r = 0; r < mr; ++r) {
        const int16_t *s = bs + r * nb * 16;
        const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)s),
                                             _mm_loadu_si128((const __m128i *)(s + 8)));
        const __m128i S = hsum4(fold256(sumi[0][r]), fold256(sumi[1][r]), fold256(sumi[2][r]), fold256(sumi[3][r]));
        const __m128i M = hsum4(_mm_madd_epi16(mn[0], pairs), _mm_madd_epi16(mn[1], pairs),
                                _mm_madd_epi16(mn[2], pairs), _mm_madd_epi16(mn[3], pairs));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dm, _mm256_set1_ps(xd[r * nb])),
                                 _mm256_cvtepi32_ps(_mm256_set_m128i(M, S)), acc[r]);
    }
}

/* NW Q6_K super-blocks . mr quantized row blocks, as dot_q6k: acc[r] lane w += (d_w xd) S_w */
static inline __attribute__((always_inline)) void dot4_q6k(const int mr, const uint8_t *b, int64_t rb,
                                                           const int8_t *xq, int64_t k, const float *xd, int64_t nb,
                                                           const int16_t *bs, __m128 *acc) {
    const __m256i nib = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(0x30);
    __m128i sc[NW];
    __m256i sumi[NW][2];
    uint16_t dh[NW];
    for (int w = 0; w < NW; ++w) {
        sc[w] = _mm_loadu_si128((const __m128i *)(b + w * rb + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc[w]);
        for (int r = 0; r < mr; ++r)
            sumi[w][r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(
                _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(bs + r * nb * 16))), 5));
        memcpy(&dh[w], b + w * rb + 208, 2);
    }
#pragma GCC unroll 8
    for (int g = 0; g < 16; g += 2) { /* 32 quants: sub-blocks g (low half) and g + 1 */
        const int h = g / 8, i = (g % 8) / 2;
        __m256i xv[2];
        for (int r = 0; r < mr; ++r) xv[r] = _mm256_loadu_si256((const __m256i *)(xq + r * k + 16 * g));
        const __m128i pick = _mm_setr_epi8(g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1,
                                           g + 1);
        for (int w = 0; w < NW; ++w) {
            const uint8_t *bw = b + w * rb;
            const __m256i src = _mm256_loadu_si256((const __m256i *)(bw + 64 * h + 32 * (i & 1)));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(bw + 128 + 32 * h));
            const __m256i low = _mm256_and_si256(i < 2 ? src : _mm256_srli_epi16(src, 4), nib);
            const __m256i high = i == 0 ? _mm256_slli_epi16(q, 4) : i == 1 ? _mm256_slli_epi16(q, 2)
                                 : i == 2 ? q : _mm256_srli_epi16(q, 2);
            const __m256i q6 = _mm256_or_si256(low, _mm256_and_si256(high, two));
            const __m256i scl = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc[w], pick));
            for (int r = 0; r < mr; ++r)
                sumi[w][r] = dot_s16(sumi[w][r], scl, _mm256_maddubs_epi16(q6, xv[r]));
        }
    }
    const __m128 d = _mm_cvtph_ps(_mm_setr_epi16((short)dh[0], (short)dh[1], (short)dh[2], (short)dh[3], 0, 0, 0, 0));
    for (int r = 0; r < mr; ++r) {
        const __m128i S = hsum4(fold256(sumi[0][r]), fold256(sumi[1][r]), fold256(sumi[2][r]), fold256(sumi[3][r]));
        acc[r] = _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(xd[r * nb])), _mm_cvtepi32_ps(S), acc[r]);
    }
}

/* NW W rows (row, row + rb, ...) . mr (1 or 2) quantized rows of x -> y[r * ldy + w] */
static inline __attribute__((always_inline)) void rows_wide(const int type, const int mr, const uint8_t *row,
                                                            int64_t rb, int64_t nb, int64_t bb, const int8_t *xq,
                                                            int64_t k, const float *xd, const int16_t *bs, float *y,
                                                            int64_t ldy) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m128 acc6[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    const int64_t ahead = groups_ahead(NW * rb);
    for (int64_t i = 0; i < nb; ++i) {
        /* a group's NW rows further on (ahead: stream_ahead.h's groups_ahead; contiguous) asked for into L2 as
         * one stream, a step's share of it a step (NW * bb bytes): asking each row's place 8 super-blocks on
         * (rows_dot's way, past a short row's end into the next group's row) made 4 streams 1-2 KiB apart, which
         * read Q6_K rows of k <= 4096 at 0.75-0.9x the 1-row pass from memory; this way 1.15-1.5x a core (Q4_K and
         * Q6_K, 1.7B's and 360M's shapes). The next group only, not into L2 (locality 0), ran the 1.7B Q4_K_M
         * file's step at 37-44 ms, 41 at 12 KiB on, 35-35.5 ms at 12 KiB on into L2 (tools/profile_decode.py) */
        for (int64_t o = 0; o < NW * bb; o += 64) stream_at(row + ahead + i * NW * bb + o);
        if (type == GGUF_KQ_Q6_K)
            dot4_q6k(mr, row + i * bb, rb, xq + i * 256, k, xd + i, nb, bs + i * 16, acc6);
        else
            dot4_q45k(type == GGUF_KQ_Q5_K, mr, row + i * bb, rb, xq + i * 256, k, xd + i, nb, bs + i * 16, acc);
    }
    for (int r = 0; r < mr; ++r) /* Q4_K / Q5_K: acc - acc_m; Q6_K: acc (the row pass's acc - 0, the same bits) */
        _mm_storeu_ps(y + r * ldy, type == GGUF_KQ_Q6_K ? acc6[r] : _mm_sub_ps(_mm256_castps256_ps128(acc[r]),
                                                                              _mm256_extractf128_ps(acc[r], 1)));
}

#endif
