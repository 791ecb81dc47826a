/* How far ahead a one-row GEMV's weight streams ask for their lines (gemm_w8a8_tile.h): the hardware
 * prefetchers alone kept a core at ~18 GB/s on the short panels of a thin model's int8 projections (576 k: 9 KiB a
 * panel), where a plain read reaches ~30; a line asked for 2 KiB ahead, into L2 (locality 1: not L1, which the
 * streams' current lines need), let SmolLM2's 30 layers of W8A8 projections run 1.2x faster at this VM's 60 GB/s and
 * 1.05-1.1x at 34 GB/s (tools/bench_row_gemv.c: 2 threads, the layers' shapes, a read of 256 MB between passes). 1 KiB
 * or 3 KiB ahead did as well, 4 KiB worse; into L1 (locality 3) was 2x slower; 2 or 6 streams a thread instead of 8,
 * slower. The int8 head's one long GEMV (gemm_w8i16.c) reads at ~90% of a plain read without it, and slower with it. */
#ifndef MINDIE_STREAM_AHEAD_H
#define MINDIE_STREAM_AHEAD_H

#define STREAM_AHEAD 2048

/* How far ahead the int8 kernels' lone-row passes (gemm_gguf_q8.c, gemm_gguf_q5_q8.c, kquant_q8_wide.h) ask for
 * the rows after their group: whole groups, at least GROUPS_AHEAD_BYTES. One group ahead (4.6 KiB on 1.7B's
 * 2048-wide rows of Q4_0) kept a Zen 4 VM's two cores at ~28 GB/s where they stream ~37 with 12 KiB or more
 * (tools/profile_decode.py: the 1.7B Q4_0 file's step 35.5 -> 28.6 ms); long rows (8192 wide: 18 KiB a group) had
 * it already. The K-quants' passes likewise, into L2 (1.7B Q4_K_M: 37-44 -> 35-35.5 ms). */
#ifndef GROUPS_AHEAD_BYTES
#define GROUPS_AHEAD_BYTES 12288
#endif
static inline long long groups_ahead(long long group_bytes) {
    return group_bytes * ((GROUPS_AHEAD_BYTES + group_bytes - 1) / group_bytes);
}

/* the line at p, into L2 */
static inline void stream_at(const void *p) { __builtin_prefetch(p, 0, 1); }
/* the line STREAM_AHEAD bytes past p */
static inline void stream_ahead(const void *p) { stream_at((const char *)p + STREAM_AHEAD); }
#endif
