/* The fp32 register tile of gemm.c, shared with gemm_int8.c's W8A16 path (which widens int8 panels to
 * fp32 and runs the same tile over them): c[mr, 16] = a[mr, K] (rows lda apart) . panel b[K, 16], mr <= 6;
 * pf + k * pf_step is prefetched at step k (pf_step 0: no useful prefetch). */
#ifndef MINDIE_GEMM_TILE_H
#define MINDIE_GEMM_TILE_H
#include <stdint.h>

#define F32_TILE_NR 16
#define F32_TILE_MR 6

void f32_tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
              int64_t pf_step);

#endif
