/* The fused decoder layers (layers_f32.c) export only their entry points, llama_layers_f32 and
 * llama_layers_f32_work (kernels.h), which the fused decode step (decode_f32.c) calls; the layer table, layer_f32, is
 * defined there and filled field for field by mindie_service/models/fused_layers.py. */
#ifndef MINDIE_LAYERS_F32_H
#define MINDIE_LAYERS_F32_H
#endif
