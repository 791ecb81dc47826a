/* The all-greedy sampler's rows (greedy_rows.c) export only their entry point, greedy_rows_f32 (kernels.h), which the
 * fused decode steps (decode_f32.c) call too. */
#ifndef MINDIE_GREEDY_ROWS_H
#define MINDIE_GREEDY_ROWS_H
#endif
