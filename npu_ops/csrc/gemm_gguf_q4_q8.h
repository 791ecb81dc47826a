/* GGUF's Q4_0, Q4_1 and Q4_1F blocks against int8 activations, 8 weight rows a vector (gemm_gguf_q4_q8.c): its entry
 * points are in kernels.h; the fused paths reach them through function pointers (a segment's fn_q8, gguf_linear.c),
 * so it exports nothing else. */
#ifndef MINDIE_GEMM_GGUF_Q4_Q8_H
#define MINDIE_GEMM_GGUF_Q4_Q8_H
#endif
