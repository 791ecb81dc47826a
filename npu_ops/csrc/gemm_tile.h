/* The fp32 register tile's shape (gemm.c's f32_tile, declared in gemm.h): gemm_int8.c's W8A16 panels take its
 * width, so that a widened panel runs the fp32 tile, and layers_f32.c fuses gate/up where `inter` is a multiple
 * of it. */
#ifndef MINDIE_GEMM_TILE_H
#define MINDIE_GEMM_TILE_H

#define F32_TILE_NR 16
#define F32_TILE_MR 6

#endif
