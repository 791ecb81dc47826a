/* GGUF K-quant linears run from the blocks as GGUF stores them: y[m, n_out] = x[m, k] . W^T, row r of W being
 * k / 256 consecutive super-blocks of Q4_K (144 bytes), Q5_K (176) or Q6_K (210). Activations stay fp32; each
 * super-block is dequantized in registers to exactly the fp32 values gguf.quants.dequantize gives (the same
 * products and differences; see scale_min), so a result differs from "dequantize, then
 * fp32 matmul" only in the order of the fp32 sums.
 *
 * Few rows (m <= ROWS_FUSED: a decode step, bandwidth-bound): every thread streams its own contiguous share of
 * W's rows once, each 8-weight chunk decoded and multiplied into every activation row's accumulators at once
 * (a lone row keeps 4 accumulator chains, so the FMA latency is hidden).
 * More rows: a thread decodes 16 rows of W at a time into the k-major panel gemm.c's register tile reads
 * (gemm_kquant_panel.c) and runs that 6 x 16 tile over every activation row, so the decode costs once per 16 x m
 * outputs and the products run at the fp32 GEMM's speed.
 * Threads come from the OpenMP runtime the process already has (PyTorch's libgomp), split as team_share does. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "gemm.h"
#include "gemm_kquant.h"
#include "gemm_kquant_panel.h"
#include "gemm_tile.h"
#include "kernels.h"
#include "team_sync.h"
#include "kquant_block.h"
#include "vec_math.h"

#define QK 256
#define ROWS_FUSED 4
#define NR F32_TILE_NR
#define MR F32_TILE_MR

enum { Q4K = GGUF_KQ_Q4_K, Q5K = GGUF_KQ_Q5_K, Q6K = GGUF_KQ_Q6_K };
static const int64_t BLOCK_BYTES[3] = {144, 176, 210};

#ifndef __AVX2__
/* A super-block's per-sub-block factors: w = dsc[s] * q - dm[s] (Q4_K, Q5_K: 8 sub-blocks of 32, 6-bit scale
 * and min packed in 12 bytes as llama.cpp's get_scale_min_k4); Q6_K: w = dsc[s] * (q - 32), 16 sub-blocks of 16
 * with int8 scales. Each product rounded to fp32 once, as gguf's dequantize_blocks does. */
static void kq_factors(int type, const uint8_t *b, float *dsc, float *dm) {
    if (type == Q6K) {
        const float d = f16_to_f32(b + 208);
        for (int s = 0; s < 16; ++s) dsc[s] = d * (float)(int8_t)b[192 + s];
        return;
    }
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    const uint8_t *sc = b + 4;
    for (int s = 0; s < 8; ++s) {
        uint8_t ls, lm;
        if (s < 4) {
            ls = sc[s] & 63;
            lm = sc[s + 4] & 63;
        } else {
            ls = (uint8_t)((sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4));
            lm = (uint8_t)((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4));
        }
        dsc[s] = d * (float)ls;
        dm[s] = dmin * (float)lm;
    }
}

/* Quant value of element e (0..255) of a super-block, before the factors (Q6_K: already minus 32). */
static inline int kq_quant(int type, const uint8_t *b, int e) {
    if (type == Q6K) {
        const int h = e >> 7, i = (e >> 5) & 3, l = e & 31;
        const int lo = (b[64 * h + 32 * (i & 1) + l] >> (4 * (i >> 1))) & 0xF;
        const int hi = (b[128 + 32 * h + l] >> (2 * i)) & 3;
        return (lo | hi << 4) - 32;
    }
    const int s = e >> 5, l = e & 31;
    const uint8_t *qs = b + (type == Q4K ? 16 : 48);
    const int lo = (qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 0xF;
    return type == Q4K ? lo : lo | ((b[16 + l] >> s) & 1) << 4;
}

/* One super-block into out[256] fp32, element by element (the same values as the vector paths). */
static void kq_decode_scalar(int type, const uint8_t *b, float *out) {
    float dsc[16], dm[8];
    kq_factors(type, b, dsc, dm);
    for (int e = 0; e < QK; ++e) {
        const int q = kq_quant(type, b, e);
        out[e] = type == Q6K ? dsc[e >> 4] * (float)q : dsc[e >> 5] * (float)q - dm[e >> 5];
    }
}
#endif

#ifdef __AVX2__
#include <immintrin.h>

/* kq_factors with vectors: the 12 packed bytes unpacked 4 at a time as llama.cpp's AVX2 code does (kmask1-3). */
static inline void kq_factors_avx(int type, const uint8_t *b, float *dsc, float *dm) {
    if (type == Q6K) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(b + 208));
        const __m256i s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 192)));
        const __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 200)));
        _mm256_storeu_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s0)));
        _mm256_storeu_ps(dsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1)));
        return;
    }
    uint8_t sm[16];
    kq_scales_mins(b, sm);
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm));
    const __m256i mn = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b)), _mm256_cvtepi32_ps(sc)));
    _mm256_storeu_ps(dm, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(b + 2)), _mm256_cvtepi32_ps(mn)));
}

/* Independent accumulator chains a row keeps, so the FMAs' latency is hidden: R rows x CHAINS(R) <= 4. */
#define CHAINS(R) ((R) == 1 ? 4 : (R) == 2 ? 2 : 1)

/* Hand the ci-th decoded 8-weight chunk w (elements off..off+7 of the super-block) on: R == 0 stores it to out,
 * else it is multiplied into R activation rows' accumulators (x: this super-block's first column, rows ldx
 * apart; acc[r * CHAINS(R) + chain]). */
static inline __attribute__((always_inline)) void emit(const int R, const int ci, __m256 w, int off, float *out,
                                                       const float *x, int64_t ldx, __m256 *acc) {
    if (R == 0) {
        _mm256_storeu_ps(out + off, w);
        return;
    }
    const int c = ci % CHAINS(R);
    for (int r = 0; r < R; ++r)
        acc[r * CHAINS(R) + c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * ldx + off), acc[r * CHAINS(R) + c]);
}

static inline __m256i load8_u8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* fl(dsc * q - dm), which is gguf's fl(fl(dsc * q) - dm): dsc * q is exact in fp32 (an 11-bit fp16 d times a
 * 6-bit scale times a 5-bit quant), so one FMA rounds as gguf's product and difference do. */
static inline __m256 scale_min(__m256i q, __m256 dsc, __m256 dm) {
    return _mm256_fmsub_ps(dsc, _mm256_cvtepi32_ps(q), dm);
}

/* Q4_K / Q5_K: sub-blocks 2j and 2j+1 share the bytes qs[32j ..], low then high nibble; Q5_K's fifth bit of
 * element l of sub-block s is bit s of qh[l]. */
static inline __attribute__((always_inline)) void q45k_block(const int R, const int five, const uint8_t *b,
                                                             float *out, const float *x, int64_t ldx, __m256 *acc) {
    float dsc[16], dm[8];
    kq_factors_avx(five ? Q5K : Q4K, b, dsc, dm);
    const uint8_t *qs = b + (five ? 48 : 16), *qh = b + 16;
    const __m256i nib = _mm256_set1_epi32(0xF), bit = _mm256_set1_epi32(0x10);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const __m256 d_lo = _mm256_set1_ps(dsc[2 * j]), d_hi = _mm256_set1_ps(dsc[2 * j + 1]);
        const __m256 m_lo = _mm256_set1_ps(dm[2 * j]), m_hi = _mm256_set1_ps(dm[2 * j + 1]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m256i v = load8_u8(qs + 32 * j + 8 * t);
            __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_srli_epi32(v, 4);
            if (five) {
                const __m256i h = _mm256_slli_epi32(load8_u8(qh + 8 * t), 4);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srli_epi32(h, 2 * j), bit));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(h, 2 * j + 1), bit));
            }
            emit(R, 2 * t, scale_min(lo, d_lo, m_lo), 64 * j + 8 * t, out, x, ldx, acc);
            emit(R, 2 * t + 1, scale_min(hi, d_hi, m_hi), 64 * j + 32 + 8 * t, out, x, ldx, acc);
        }
    }
}

/* Q6_K: half h holds ql[64h ..] (low nibbles: quarters 0, 1; high: 2, 3) and qh[32h ..] (2 bits a quarter). */
static inline __attribute__((always_inline)) void q6k_block(const int R, const uint8_t *b, float *out,
                                                            const float *x, int64_t ldx, __m256 *acc) {
    float dsc[16], dm[8];
    kq_factors_avx(Q6K, b, dsc, dm);
    const __m256i nib = _mm256_set1_epi32(0xF), two = _mm256_set1_epi32(0x30), off = _mm256_set1_epi32(32);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m256i a = load8_u8(b + 64 * h + 8 * t), c = load8_u8(b + 64 * h + 32 + 8 * t);
            const __m256i q = load8_u8(b + 128 + 32 * h + 8 * t);
            const __m256i lows[4] = {_mm256_and_si256(a, nib), _mm256_and_si256(c, nib), _mm256_srli_epi32(a, 4),
                                     _mm256_srli_epi32(c, 4)};
            const __m256i highs[4] = {_mm256_slli_epi32(q, 4), _mm256_slli_epi32(q, 2), q, _mm256_srli_epi32(q, 2)};
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const __m256i v = _mm256_sub_epi32(_mm256_or_si256(lows[i], _mm256_and_si256(highs[i], two)), off);
                const __m256 w = _mm256_mul_ps(_mm256_set1_ps(dsc[8 * h + 2 * i + (t >> 1)]), _mm256_cvtepi32_ps(v));
                emit(R, i, w, 128 * h + 32 * i + 8 * t, out, x, ldx, acc);
            }
        }
}

/* Q6_K into R >= 1 rows' FMAs in fewer instructions than q6k_block (the head's GEMV was compute-bound): a quarter's
 * quants put together byte-wise in one register, a sub-block's bytes copied to both halves and spread by pshufb into
 * byte 2 of 8 lanes; or-ed with 0x3F800000 a lane is 1 + q / 128, and fmsub(128 dsc, 1 + q / 128, 160 dsc) is
 * gguf's exact fl(fl(d * sc) * (q - 32)) (every term exact: dsc has <= 18 significant bits, the weight <= 23; a
 * non-finite d, which no quantizer writes, gives NaN). a, c: q6k_scales' 128 dsc and 160 dsc of the super-block. */
static inline void q6k_scales(const uint8_t *b, float *a, float *c) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(b + 208));
    for (int v = 0; v < 2; ++v) {
        const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                              _mm_loadl_epi64((const __m128i *)(b + 192 + 8 * v)))));
        _mm256_storeu_ps(a + 8 * v, _mm256_mul_ps(s, _mm256_set1_ps(128.0f)));
        _mm256_storeu_ps(c + 8 * v, _mm256_mul_ps(s, _mm256_set1_ps(160.0f)));
    }
}

static inline __attribute__((always_inline)) void q6k_rows_block(const int R, const uint8_t *b, const float *a,
                                                                 const float *c, const float *x, int64_t ldx,
                                                                 __m256 *acc) {
    const __m256i nib = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30), one = _mm256_set1_epi32(0x3F800000);
#define SPREAD(j) /* lane p: byte j + p of the sub-block's 16, from the half copy p / 4 */                           \
    _mm256_setr_epi8(-1, -1, j, -1, -1, -1, j + 1, -1, -1, -1, j + 2, -1, -1, -1, j + 3, -1, -1, -1, j + 4, -1,   \
                     -1, -1, j + 5, -1, -1, -1, j + 6, -1, -1, -1, j + 7, -1)
    const __m256i spread[2] = {SPREAD(0), SPREAD(8)};
#undef SPREAD
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(a0, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 4), two)),
            _mm256_or_si256(_mm256_and_si256(a1, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 2), two)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), nib), _mm256_and_si256(qh, two)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), nib),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), two))};
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
#pragma GCC unroll 2
            for (int half = 0; half < 2; ++half) {
                const int s = 8 * h + 2 * i + half, e0 = 128 * h + 32 * i + 16 * half;
                const __m256i sb = half ? _mm256_permute2x128_si256(q[i], q[i], 0x11)
                                        : _mm256_permute2x128_si256(q[i], q[i], 0x00);
                const __m256 as = _mm256_broadcast_ss(a + s), cs = _mm256_broadcast_ss(c + s);
#pragma GCC unroll 2
                for (int j = 0; j < 2; ++j) {
                    const __m256 f = _mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(sb, spread[j]), one));
                    emit(R, 2 * half + j, _mm256_fmsub_ps(as, f, cs), e0 + 8 * j, NULL, x, ldx, acc);
                }
            }
    }
}

static inline __attribute__((always_inline)) void kq_block(const int type, const int R, const uint8_t *b, float *out,
                                                           const float *x, int64_t ldx, __m256 *acc) {
    if (type == Q6K)
        q6k_block(R, b, out, x, ldx, acc);
    else
        q45k_block(R, type == Q5K, b, out, x, ldx, acc);
}

/* W rows n0..n1 against R <= ROWS_FUSED activation rows: each super-block read once, decoded in registers, the
 * accumulators in registers for the whole row. */
static inline __attribute__((always_inline)) void rows_fused_r(const int type, const int R, const uint8_t *w,
                                                               int64_t n0, int64_t n1, int64_t n_out, int64_t k,
                                                               const float *x, float *y) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type];
    for (int64_t n = n0; n < n1; ++n) {
        __m256 acc[4];
        for (int c = 0; c < 4; ++c) acc[c] = _mm256_setzero_ps();
        const uint8_t *row = w + n * nb * bb;
        float sc[2][2][16]; /* Q6_K: the next super-block's factors made while this one's are used */
        if (type == Q6K) q6k_scales(row, sc[0][0], sc[0][1]);
        for (int64_t i = 0; i < nb; ++i) {
            /* every line of the super-block 8 on, not its first only (gemm_kquant_q8.c's rows_dot: SmolLM2-1.7B's
             * Q6_K head, 49152 x 2048, read faster from memory with all asked) */
            for (int64_t o = 0; o < bb; o += 64) __builtin_prefetch(row + (i + 8) * bb + o, 0, 0);
            if (type == Q6K && i + 1 < nb) q6k_scales(row + (i + 1) * bb, sc[(i + 1) & 1][0], sc[(i + 1) & 1][1]);
            if (type == Q6K) q6k_rows_block(R, row + i * bb, sc[i & 1][0], sc[i & 1][1], x + i * QK, k, acc);
            else kq_block(type, R, row + i * bb, NULL, x + i * QK, k, acc);
        }
        for (int r = 0; r < R; ++r) {
            __m256 s = acc[r * CHAINS(R)];
            for (int c = 1; c < CHAINS(R); ++c) s = _mm256_add_ps(s, acc[r * CHAINS(R) + c]);
            y[r * n_out + n] = hsum256(s);
        }
    }
}

typedef void (*fused_fn)(const uint8_t *w, int64_t n0, int64_t n1, int64_t n_out, int64_t k, const float *x,
                         float *y);
#define FUSED(T, R)                                                                                               \
    static void fused_##T##_##R(const uint8_t *w, int64_t n0, int64_t n1, int64_t n_out, int64_t k,                \
                                const float *x, float *y) {                                                       \
        rows_fused_r(T, R, w, n0, n1, n_out, k, x, y);                                                            \
    }
#define FUSED_ALL(T) FUSED(T, 1) FUSED(T, 2) FUSED(T, 3) FUSED(T, 4)
FUSED_ALL(Q4K)
FUSED_ALL(Q5K)
FUSED_ALL(Q6K)
static const fused_fn FUSED_FNS[3][ROWS_FUSED] = {{fused_Q4K_1, fused_Q4K_2, fused_Q4K_3, fused_Q4K_4},
                                                  {fused_Q5K_1, fused_Q5K_2, fused_Q5K_3, fused_Q5K_4},
                                                  {fused_Q6K_1, fused_Q6K_2, fused_Q6K_3, fused_Q6K_4}};

/* One super-block of `type` decoded into out[256]. */
static void decode_q4k(const uint8_t *b, float *out) { kq_block(Q4K, 0, b, out, NULL, 0, NULL); }
static void decode_q5k(const uint8_t *b, float *out) { kq_block(Q5K, 0, b, out, NULL, 0, NULL); }
static void decode_q6k(const uint8_t *b, float *out) { kq_block(Q6K, 0, b, out, NULL, 0, NULL); }
typedef void (*decode_fn)(const uint8_t *b, float *out);
static const decode_fn DECODE_FNS[3] = {decode_q4k, decode_q5k, decode_q6k};

#define DECODE(type, b, out) DECODE_FNS[type](b, out)
#else
#define DECODE(type, b, out) kq_decode_scalar(type, b, out)
#endif

/* One super-block of `type` into out[256]: the fp32 values gguf.quants.dequantize gives. */
void gguf_kquant_decode_block(int type, const uint8_t *block, float *out) { DECODE(type, block, out); }

#ifndef __AVX2__
/* Panel p of W (rows 16p .. 16p + 15, zeros past n_out) into the k-major layout f32_tile reads, panel[kk * 16 + j] =
 * W[16p + j, kk]: each row's super-block decoded, then transposed (with AVX2: gemm_kquant_panel.c, 8 rows in lanes). */
static void kquant_decode_panel(int type, const uint8_t *w, int64_t p, int64_t n_out, int64_t k, float *panel) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type];
    float tmp[NR * QK] = {0}; /* rows past n_out stay zeros */
    for (int64_t i = 0; i < nb; ++i) {
        for (int64_t j = 0; j < NR && p * NR + j < n_out; ++j)
            DECODE(type, w + ((p * NR + j) * nb + i) * bb, tmp + j * QK);
        f32_panel_from_rows(tmp, QK, QK, panel + i * QK * NR);
    }
}
#endif

/* W's panels p0..p1 against m activation rows: each panel decoded once, then gemm.c's register tiles over it. */
static void rows_panels(int type, const uint8_t *w, int64_t p0, int64_t p1, int64_t n_out, int64_t k,
                        const float *x, int64_t m, float *y, float *panel) {
    float c[MR * NR];
    const int64_t bytes = NR * (k / QK) * BLOCK_BYTES[type]; /* a panel's blocks, <= 16 k: 4 floats a k */
    for (int64_t p = p0; p < p1; ++p) {
        kquant_decode_panel(type, w, p, n_out, k, panel);
        const int64_t cols = n_out - p * NR < NR ? n_out - p * NR : NR;
        /* the first tile asks for the next panel's blocks (into L2), so that its decode does not wait on memory */
        const int ask = p + 1 < p1;
        for (int64_t r0 = 0; r0 < m; r0 += MR) {
            const int mr = m - r0 < MR ? (int)(m - r0) : MR, pf = ask && r0 == 0;
            f32_tile(mr, x + r0 * k, k, panel, k, c, pf ? (const float *)(w + (p + 1) * bytes) : panel, pf ? 4 : 0);
            for (int r = 0; r < mr; ++r)
                memcpy(y + (r0 + r) * n_out + p * NR, c + r * NR, (size_t)cols * sizeof(float));
        }
    }
}

/* The calling thread's share of gguf_matmul_<type>'s work: a contiguous share of W's rows within the calling team,
 * or all of them where it runs alone (inside another team: a kernel called from the fused decoder or
 * gguf_linear.c's team). 0, or 3 without its decode buffer. */
static int kquant_share(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y,
                        int alone) {
    int64_t n0 = 0, n1 = n_out;
#ifdef __AVX2__
    if (m <= ROWS_FUSED) {
        if (!alone) team_share(n_out, &n0, &n1);
        if (m > 0) FUSED_FNS[type][m - 1](w, n0, n1, n_out, k, x, y);
        return 0;
    }
#endif
    n1 = (n_out + NR - 1) / NR;
    if (!alone) team_share(n1, &n0, &n1);
    float *panel = malloc((size_t)k * NR * sizeof(float));
    if (panel == NULL) return 3;
    rows_panels(type, w, n0, n1, n_out, k, x, m, y, panel);
    free(panel);
    return 0;
}

/* gguf_matmul_<type>'s work by every thread of the calling team (serial outside a parallel region): each takes
 * a contiguous share of W's rows. Returns 0, or 3 where a thread could not get its decode buffer. Ends on the
 * team's barrier. */
int gguf_matmul_kquant_team(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m,
                            float *y) {
    const int rc = kquant_share(type, w, n_out, k, x, m, y, 0);
    team_barrier();
    return rc;
}

/* quant_gguf's kernel contract: a team of its own, or the calling thread alone inside any team (a team of 1
 * included), with no barrier of the caller's team taken */
static void matmul(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    if (k % QK != 0) return;  /* the Python wrapper refuses it first; never read past a row */
    if (omp_get_level() > 0) {
        kquant_share(type, w, n_out, k, x, m, y, 1);
        return;
    }
#pragma omp parallel
    gguf_matmul_kquant_team(type, w, n_out, k, x, m, y);
}

/* one row of k values (k / 256 super-blocks) dequantized: an embedding row in the fused decode step */
static void dequant_row(int type, const uint8_t *w, int64_t k, float *out) {
    for (int64_t b = 0; b < k / QK; ++b) gguf_kquant_decode_block(type, w + b * BLOCK_BYTES[type], out + b * QK);
}

void gguf_dequant_q4_k(const uint8_t *w, int64_t k, float *out) { dequant_row(Q4K, w, k, out); }
void gguf_dequant_q5_k(const uint8_t *w, int64_t k, float *out) { dequant_row(Q5K, w, k, out); }
void gguf_dequant_q6_k(const uint8_t *w, int64_t k, float *out) { dequant_row(Q6K, w, k, out); }

void gguf_matmul_q4_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(Q4K, w, n_out, k, x, m, y);
}
void gguf_matmul_q5_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(Q5K, w, n_out, k, x, m, y);
}
void gguf_matmul_q6_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(Q6K, w, n_out, k, x, m, y);
}
