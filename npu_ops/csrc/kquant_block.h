/* A Q4_K / Q5_K super-block's 12 packed bytes of 6-bit factors (bytes 4..15, after the fp16 d and dmin), read
 * where they lie: gemm_kquant.c and gemm_kquant_panel.c (fp32 activations), gemm_kquant_q8.c and
 * gemm_kquant_q8_lanes.c (int8 ones). The K-quant type numbers every one of them takes as `type`. */
#ifndef MINDIE_KQUANT_BLOCK_H
#define MINDIE_KQUANT_BLOCK_H
#include <stdint.h>
#include <string.h>

/* the GGML block types the K-quant kernels run, as their `type` argument takes them, and a block's bytes */
#define GGUF_KQ_Q4_K 0
#define GGUF_KQ_Q5_K 1
#define GGUF_KQ_Q6_K 2
#define KQ_BLOCK_BYTES(type) ((type) == GGUF_KQ_Q4_K ? 144 : (type) == GGUF_KQ_Q5_K ? 176 : 210)

/* The 8 sub-block scales then the 8 mins of the super-block at b, one byte each (llama.cpp's kmask unpacking,
 * 4 at a time). */
static inline void kq_scales_mins(const uint8_t *b, uint8_t sm[16]) {
    uint32_t u[3], v[4];
    memcpy(u, b + 4, 12);
    v[0] = u[0] & 0x3f3f3f3fu;
    v[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    v[2] = u[1] & 0x3f3f3f3fu;
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    memcpy(sm, v, 16);
}

#ifdef __AVX2__
#include <immintrin.h>
/* kq_scales_mins in a register (the 8 scales in bytes 0-7, the 8 mins in 8-15): no trip through memory, whose
 * 4-byte stores an 8-byte load cannot be forwarded from (a stall a super-block in a lone row's pass). */
static inline __m128i kq_scales_mins_v(const uint8_t *b) {
    const __m128i x = _mm_loadu_si128((const __m128i *)b); /* d dmin, u0, u1, u2 */
    const __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(3, 2, 3, 1)), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i hi = _mm_srli_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 2, 1, 1)), 6);
    return _mm_or_si128(_mm_and_si128(lo, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
                        _mm_slli_epi32(_mm_and_si128(hi, _mm_setr_epi32(0, 0x03030303, 0, 0x03030303)), 4));
}
#endif
#endif
