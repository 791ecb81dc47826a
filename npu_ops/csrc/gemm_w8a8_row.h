/* W8A8 projections of one row (a one-stream decode step) by every thread of a team (gemm_w8a8_row.c): the
 * batched kernels' single row (gemm_w8a8.c) and the fused layers' gate/up with silu(gate) * up (layers_f32.c). */
#ifndef MINDIE_GEMM_W8A8_ROW_H
#define MINDIE_GEMM_W8A8_ROW_H
#include <stdint.h>

/* one row by every thread of a team (gemm_w8a8_row.c): this thread's share of y, no barrier */
void w8a8_row(const int8_t *xr, const float *xs, int64_t K, const int8_t *wp, const float *ws, int64_t N,
              const float *bias, float *y, const int8_t *zero, int add);
/* one row's silu(gate) * up into h from the packed W8A8 [gate | up] projection: every thread of the team, x quantized
 * into its own xq / xs; the bits of linear_w8a8_f32_team then silu_mul_row_f32. Ends on the team's barrier. */
void gate_up_silu_w8a8_team(const float *x, int64_t K, const int8_t *wp, const float *ws, int64_t inter,
                            const float *bias, float *h, int8_t *xq, float *xs);
#endif
