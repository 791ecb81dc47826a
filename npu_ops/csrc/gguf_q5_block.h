/* GGUF's Q5_0 and Q5_1 blocks, read where they lie (gemm_gguf_q5.c: fp32 activations; gemm_gguf_q5_q8.c: int8 ones).
 * Q5_0: 22 bytes, fp16 d, qh (4 bytes, little-endian), qs (16 bytes); w = d * (q - 16). Q5_1: 24 bytes, fp16 d,
 * fp16 m, qh, qs; w = d * q + m. Value j of a block is q = nibble | (bit j of qh) << 4, its nibble byte j's low one
 * for j < 16 and byte j - 16's high one after (ggml's order, as gemm_gguf.c's 4-bit types). d * q is exact in fp32
 * (11 + 5 bits), so the dequantized value rounds once, as gguf.quants.dequantize's does. */
#ifndef MINDIE_GGUF_Q5_BLOCK_H
#define MINDIE_GGUF_Q5_BLOCK_H
#include <stdint.h>
#include <string.h>
#include "vec_math.h"
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define Q5_QK 32 /* values a block */
#define T_Q5_0 0
#define T_Q5_1 1
#define Q5_BYTES(t) ((t) == T_Q5_1 ? 24 : 22)
#define Q5_QH_AT(t) ((t) == T_Q5_1 ? 4 : 2) /* the quants' high bits; their nibbles 4 bytes on */

/* the block's min (Q5_1) */
static inline float q5_min(int t, const uint8_t *b) { return t == T_Q5_1 ? f16_to_f32(b + 2) : 0.0f; }

/* the block's 32 quants (0-31), k ascending */
static inline void q5_quants_scalar(int t, const uint8_t *b, uint8_t q[Q5_QK]) {
    uint32_t qh;
    memcpy(&qh, b + Q5_QH_AT(t), 4);
    const uint8_t *qs = b + Q5_QH_AT(t) + 4;
    for (int j = 0; j < Q5_QK / 2; ++j) {
        q[j] = (uint8_t)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
        q[j + Q5_QK / 2] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

#ifdef __AVX2__
/* the same 32 quants as bytes of a vector (byte j: value j): the 16 nibble bytes in both lanes by the load itself (no
 * insert), the high lane's shifted by a variable shift; qh's bit j spread to byte j (each byte takes qh's byte j / 8,
 * broadcast by the load, every bit but j % 8 forced on: all on means the bit was set) */
static inline __attribute__((always_inline)) __m256i q5_quants(int t, const uint8_t *b) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + Q5_QH_AT(t) + 4)));
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
    uint32_t qh;
    memcpy(&qh, b + Q5_QH_AT(t), 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi64x(-1));
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}
#endif
#endif
