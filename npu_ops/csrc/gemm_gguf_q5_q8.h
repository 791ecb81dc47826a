/* GGUF's Q5_0 and Q5_1 blocks against int8 activations (gemm_gguf_q5_q8.c): its entry points are in kernels.h; the
 * fused paths reach them through function pointers (a segment's fn_q8, gguf_linear.c), so it exports nothing else. */
#ifndef MINDIE_GEMM_GGUF_Q5_Q8_H
#define MINDIE_GEMM_GGUF_Q5_Q8_H
#endif
