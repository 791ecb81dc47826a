/* How far ahead a one-row GEMV's weight streams ask for their lines (gemm_w8a8_tile.h, gemm_w8i16.c): the hardware
 * prefetchers alone kept a core at ~18 GB/s on the short panels of a thin model's int8 projections (576 k: 9 KiB a
 * panel), where a plain read reaches ~30; a line asked for 2 KiB ahead, into L2 (locality 1: not L1, which the
 * streams' current lines need), let SmolLM2's 30 layers of W8A8 projections run 1.2x faster at this VM's 60 GB/s and
 * 1.05-1.1x at 34 GB/s (2 threads, a C loop over the layers' shapes with a read of 256 MB between passes). */
#ifndef MINDIE_STREAM_AHEAD_H
#define MINDIE_STREAM_AHEAD_H

#define STREAM_AHEAD 2048

static inline void stream_ahead(const void *p) { __builtin_prefetch((const char *)p + STREAM_AHEAD, 0, 1); }
#endif
