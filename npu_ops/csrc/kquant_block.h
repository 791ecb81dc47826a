/* A Q4_K / Q5_K super-block's 12 packed bytes of 6-bit factors (bytes 4..15, after the fp16 d and dmin), read
 * where they lie: gemm_kquant.c (fp32 activations), gemm_kquant_q8.c and gemm_kquant_q8_lanes.c (int8 ones). */
#ifndef MINDIE_KQUANT_BLOCK_H
#define MINDIE_KQUANT_BLOCK_H
#include <stdint.h>
#include <string.h>

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
#endif
