/* GGUF's Q4_K, Q5_K and Q6_K against int8 activations, 8 weight rows a vector (gemm_kquant_q8_lanes.c): its entry points
 * are in kernels.h (the fused paths reach them through a segment's fn_q8), so it exports nothing else. */
#ifndef MINDIE_GEMM_KQUANT_Q8_LANES_H
#define MINDIE_GEMM_KQUANT_Q8_LANES_H
#endif
