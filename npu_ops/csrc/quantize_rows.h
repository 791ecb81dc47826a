/* Per-row dynamic quantization of fp32 activations (quantize_rows.c): int8 for the W8A8 linears
 * (gemm_w8a8.c), int16 for the W8I16 LM head (gemm_w8i16.c). */
#ifndef MINDIE_QUANTIZE_ROWS_H
#define MINDIE_QUANTIZE_ROWS_H
#include <stdint.h>

#define I16_QMAX 16383 /* 14 bits: 1,024 products with int8 weights sum inside int32 (gemm_w8i16.c) */

void quantize_row_i8(const float *xr, int64_t K, int64_t KP, int8_t *qr, float *xs, int8_t flip);
void quantize_rows_offset(const float *x, int64_t M, int64_t K, int64_t KP, int8_t *xq, float *xs, int nthreads,
                          int offset);
void quantize_row_i16(const float *xr, int64_t K, int64_t KP, int16_t *qr, float *xs);
#endif
