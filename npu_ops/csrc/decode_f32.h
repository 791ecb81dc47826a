/* The fused decode step (decode_f32.c) exports only its entry points (kernels.h); its argument block,
 * decode_f32_args, is defined there and filled field for field by mindie_service/models/fused_decode.py. */
#ifndef MINDIE_DECODE_F32_H
#define MINDIE_DECODE_F32_H
#endif
