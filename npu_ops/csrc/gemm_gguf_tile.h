/* What gguf_linear.c runs of the tile path (gemm_gguf_tile.c): a prompt piece's projection over any GGUF block type
 * with a row dequantizer, dequantized tile by tile into fp32 and multiplied by an fp32 register tile. */
#ifndef MINDIE_GEMM_GGUF_TILE_H
#define MINDIE_GEMM_GGUF_TILE_H
#include <stdint.h>

/* y[m, n_out] = x[m, k] . W^T on the calling thread alone, W's rows row_bytes apart, each k / block_vals blocks that
 * row_fn (a type's gguf_dequant_<type>: a run of whole blocks -> their fp32 values) dequantizes. Every output is one
 * fp32 FMA chain over k ascending, whatever m, the tile or the thread. work: gguf_tile_work_floats(k) floats of the
 * caller's (the tile's panels), or NULL: malloc'd here (on a worker thread that block stays in its arena for good:
 * gguf_linear.c). interleave 4: W's rows are gguf_x4.h's groups (n_out a multiple of 4), un-interleaved for row_fn
 * a few blocks at a time. 0, or 3 without scratch. */
int gguf_tile_matmul(void (*row_fn)(const uint8_t *w, int64_t k, float *out), int64_t block_vals, int64_t interleave,
                     int64_t row_bytes, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m,
                     float *y, float *work);
int64_t gguf_tile_work_floats(int64_t k);
#endif
