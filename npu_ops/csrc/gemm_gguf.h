/* GGUF's Q4_0, Q4_1 and Q8_0 blocks as stored (gemm_gguf.c): its entry points are in kernels.h; the fused paths
 * reach them through function pointers (gguf_linear.c), so it exports nothing else. */
#ifndef MINDIE_GEMM_GGUF_H
#define MINDIE_GEMM_GGUF_H
#endif
