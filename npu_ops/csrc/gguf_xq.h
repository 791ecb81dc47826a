/* x quantized once for a GGUF projection's team (gguf_xq.c): the layouts, and the calling thread's current one,
 * which gguf_linear.c sets and the int8-activation kernels look up. A header of its own, free of the kernels'
 * headers, so the kernels that read it and gguf_linear.c that fills it with their row quantizers include no circle. */
#ifndef MINDIE_GGUF_XQ_H
#define MINDIE_GGUF_XQ_H
#include <stdint.h>
#include <string.h>

/* x's rows quantized once for a projection by the whole team (gguf_linear_team), in the layout its segments'
 * int8-activation kernels read, which find it with gguf_xq_find instead of quantizing x themselves:
 * GGUF_XQ_Q8: gemm_gguf_q8.c's rows (per 16: q[m k], d[8 m nb] lanes 0-3 d0, 4-7 d1, s[m nb] block sums, nb = k / 32)
 * and gemm_gguf_q4_q8.c's block-major copy (qb[nb m 32]: block b of every row, then b + 1; xb[4 nb m]: d0, d1, s, 0
 * in the same order); GGUF_XQ_Q8K: llama.cpp's Q8_K (q[m k], d[m k / 256], bs[m k / 16] sums of 16, b32[m k / 32]
 * sums of 32) and gemm_kquant_q8_lanes.c's block-major copy of q (qb[nb m 256]). Each row's numbers are its own (the quantization is per row,
 * deterministic): the bits a kernel gets are those it would have made. */
#define GGUF_XQ_Q8 1
#define GGUF_XQ_Q8K 2
typedef struct gguf_xq {
    const float *x; /* the activations these are of, [m, k] */
    int64_t m, k;
    int format;
    int8_t *q, *qb;
    float *d, *s, *xb;
    int16_t *bs, *b32;
} gguf_xq;

/* row i of m quantized rows (nb blocks of blk bytes at row) into the block-major copy qb: block b at qb + (b m + i) blk.
 * The 8-row lanes kernels read a chunk's rows of a block as one run of bytes: rows k bytes apart (k = 2048 or 8192)
 * fall in one or two L1 sets, which cost their 16-row calls 1.1-1.2x */
static inline void gguf_xq_blocks(const int8_t *row, int64_t nb, int64_t blk, int64_t m, int64_t i, int8_t *qb) {
    for (int64_t b = 0; b < nb; ++b) memcpy(qb + (b * m + i) * blk, row + b * blk, (size_t)blk);
}

/* the calling thread's team-quantized x when it is x [m, k] in `format`, else NULL (quantize it yourself) */
const gguf_xq *gguf_xq_find(const float *x, int64_t m, int64_t k, int format);
/* the calling thread's team-quantized x from now on (gguf_linear.c, around its segments' kernels), or NULL: none */
void gguf_xq_set(const gguf_xq *q);
#endif
