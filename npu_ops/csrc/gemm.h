/* What other files run of the fp32 GEMM (gemm.c): its register tile (gemm_int8.c runs it over widened W8A16
 * panels) and the team halves of the fused layers' fp32 projections (layers_f32.c). */
#ifndef MINDIE_GEMM_H
#define MINDIE_GEMM_H
#include <stdint.h>


/* c[mr, 16] = a[mr, K] (rows lda apart) . panel b[K, 16], mr <= F32_TILE_MR (gemm_tile.h); pf + k * pf_step is
 * prefetched at step k (pf_step 0: no useful prefetch) */
void f32_tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
              int64_t pf_step);
/* linear_f32's work by every thread of the calling team (add: y += the result); ends on the team's barrier */
void linear_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                     int add);
/* the packed [gate | up] projection (inter % F32_TILE_NR == 0) with silu(gate) * up in its epilogue into h, by
 * every thread of the team: the bits of linear_f32 then silu_mul_f32 */
void gate_up_silu_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t inter, const float *bias,
                           float *h);
#endif
