/* GGUF's Q5_0 and Q5_1 blocks as stored, fp32 activations (gemm_gguf_q5.c): its entry points are in kernels.h; the
 * fused paths reach them through function pointers (gguf_linear.c), so it exports nothing else. */
#ifndef MINDIE_GEMM_GGUF_Q5_H
#define MINDIE_GEMM_GGUF_Q5_H
#endif
