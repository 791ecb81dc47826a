/* gemm_kquant_panel.c: a 16-row k-major panel of GGUF K-quant weights for gemm_kquant.c's many-row path (AVX2). */
#ifndef MINDIE_GEMM_KQUANT_PANEL_H
#define MINDIE_GEMM_KQUANT_PANEL_H
#include <stdint.h>

#ifdef __AVX2__
/* Panel p of W (rows 16p .. 16p + 15 of n_out, +0 past n_out; k / 256 super-blocks of GGUF_KQ_* `type` a row) into
 * panel[kk * 16 + j] = W[16p + j, kk], gguf.quants.dequantize's values. */
void kquant_decode_panel(int type, const uint8_t *w, int64_t p, int64_t n_out, int64_t k, float *panel);
#endif
#endif
