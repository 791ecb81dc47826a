/* GGUF's 4-bit simple blocks (Q4_0, Q4_1 and our Q4_1F) repacked once at load with 4 weight rows interleaved
 * (npu_ops/quant_gguf_x4.py: the types Q4_0x4, Q4_1x4, Q4_1Fx4): the same bytes, rows 4g .. 4g + 3 a group in the
 * place the 4 rows held, each block step of the group the 4 rows' scale fields side by side (sb = block bytes - 16
 * each: d, or d and min, in GGUF's own encoding), then their 16 bytes of nibbles each (4 x sb + 64 bytes).
 *
 * Why: a lone row of x is bound by the instructions that unpack the blocks (gemm_gguf_q8.c's 4-row pass read Q4_0
 * at ~20 GB/s a core in cache, where Q6_K's 256-value blocks reach ~22 and memory gives two cores ~58): gathering
 * the 4 rows' fp16 scales took 4 loads, 3 shifts, 3 ors and a move a block step, one load here; the 4 rows' quants
 * are one line (tools/ab_ceiling.c: 25 GB/s a core in cache, 1.17x streamed at two cores). The int8 kernels read the
 * layout directly (gemm_gguf_q8.c's passes, gemm_gguf_q4_q8.c's lanes: the same operations on each value as the
 * type's own, so the same bits); the fp32 ones un-interleave a group at a time and run the type's own kernel on it
 * (gguf_x4.c; the tiles: gemm_gguf_tile.c), also the same bits. A weight used as embeddings is never repacked. */
#ifndef MINDIE_GGUF_X4_H
#define MINDIE_GGUF_X4_H
#include <stdint.h>
#include <string.h>

#define GGUF_X4_ROWS 4
#define GGUF_X4_MAX_BLOCK 24 /* the largest block of an interleaved type (Q4_1F's) */

/* in a group's block step at `step` (blocks of bb bytes): row r's scale fields, and its 16 bytes of nibbles */
static inline const uint8_t *gguf_x4_scales_at(const uint8_t *step, int64_t bb, int r) { return step + (bb - 16) * r; }
static inline const uint8_t *gguf_x4_quants_at(const uint8_t *step, int64_t bb, int r) {
    return step + GGUF_X4_ROWS * (bb - 16) + 16 * r;
}

/* blocks [b0, b0 + nblk) of the 4 rows of the group at g (blocks of bb bytes: 18, 20 or 24) as GGUF stores them:
 * row r's at out + r * out_rb */
static inline void gguf_x4_rows(const uint8_t *g, int64_t bb, int64_t b0, int64_t nblk, uint8_t *out,
                                int64_t out_rb) {
    const int64_t sb = bb - 16;
    for (int64_t b = 0; b < nblk; ++b) {
        const uint8_t *step = g + (b0 + b) * GGUF_X4_ROWS * bb;
        for (int r = 0; r < GGUF_X4_ROWS; ++r) {
            uint8_t *dst = out + r * out_rb + b * bb;
            const uint8_t *sc = gguf_x4_scales_at(step, bb, r);
            switch (sb) { /* constant sizes, so the copies inline (a call each cost the prefill tiles 2-4%) */
            case 2: memcpy(dst, sc, 2); break;
            case 4: memcpy(dst, sc, 4); break;
            default: memcpy(dst, sc, 8); break;
            }
            memcpy(dst + sb, gguf_x4_quants_at(step, bb, r), 16);
        }
    }
}
#endif
