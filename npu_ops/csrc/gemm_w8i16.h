/* The int8 LM head (gemm_w8i16.c) exports only its entry points (kernels.h): pack_w8i16, packed_w8i16_numel and
 * linear_w8i16_f32, which the fused decode step (decode_f32.c) calls too. */
#ifndef MINDIE_GEMM_W8I16_H
#define MINDIE_GEMM_W8I16_H
#endif
