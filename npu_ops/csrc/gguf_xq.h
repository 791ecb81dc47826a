/* x quantized once for a GGUF projection's team (gguf_xq.c): the layouts, and the calling thread's current one,
 * which gguf_linear.c sets and the int8-activation kernels look up. A header of its own, free of the kernels'
 * headers, so the kernels that read it and gguf_linear.c that fills it with their row quantizers include no circle. */
#ifndef MINDIE_GGUF_XQ_H
#define MINDIE_GGUF_XQ_H
#include <stdint.h>

/* x's rows quantized once for a projection by the whole team (gguf_linear_team), in the layout its segments'
 * int8-activation kernels read, which find it with gguf_xq_find instead of quantizing x themselves:
 * GGUF_XQ_Q8: gemm_gguf_q8.c's rows (per 16: q[m k], d[8 m nb] lanes 0-3 d0, 4-7 d1, s[m nb] block sums, nb = k / 32)
 * and gemm_gguf_q4_q8.c's blocks (xb[4 m nb]: d0, d1, s, 0); GGUF_XQ_Q8K: llama.cpp's Q8_K (q[m k], d[m k / 256],
 * bs[m k / 16] sums of 16, b32[m k / 32] sums of 32). Each row's numbers are its own (the quantization is per row,
 * deterministic): the bits a kernel gets are those it would have made. */
#define GGUF_XQ_Q8 1
#define GGUF_XQ_Q8K 2
typedef struct gguf_xq {
    const float *x; /* the activations these are of, [m, k] */
    int64_t m, k;
    int format;
    int8_t *q;
    float *d, *s, *xb;
    int16_t *bs, *b32;
} gguf_xq;

/* the calling thread's team-quantized x when it is x [m, k] in `format`, else NULL (quantize it yourself) */
const gguf_xq *gguf_xq_find(const float *x, int64_t m, int64_t k, int format);
/* the calling thread's team-quantized x from now on (gguf_linear.c, around its segments' kernels), or NULL: none */
void gguf_xq_set(const gguf_xq *q);
#endif
