/* The W8A16 linear by every thread of a team (gemm_int8.c), for the fused layers (layers_f32.c). */
#ifndef MINDIE_GEMM_INT8_H
#define MINDIE_GEMM_INT8_H
#include <stdint.h>


/* linear_w8a16_f32's body (add: y += the result); ends on the team's barrier */
void linear_w8a16_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                           const float *bias, float *y, int add);
#endif
