/* The team half of a GGUF block-quantized projection (gguf_linear.c), for the fused decoder (layers_f32.c,
 * decode_f32.c): gguf_seg is one segment of its output rows, filled by npu_ops/quant_gguf.py. */
#ifndef MINDIE_GGUF_LINEAR_H
#define MINDIE_GGUF_LINEAR_H
#include <stdint.h>

typedef void (*gguf_matmul_fn)(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
typedef void (*gguf_row_fn)(const uint8_t *w, int64_t k, float *out);

/* The kind of step a call belongs to (the runner's, npu_ops/gguf_modules.py's gguf_step): a prompt's prefill
 * piece, or a decode step (bursts and speculation's verify rows included) */
#define GGUF_STEP_PREFILL 0
#define GGUF_STEP_DECODE 1

/* rows of W [rows, K] in one GGUF block type: fn computes them, row_fn dequantizes one (an embedding row; may be
 * NULL), row_bytes apart from w; fn_q8 (may be NULL) computes them against int8 activations, taken by calls of the
 * step kinds whose bit (1 << GGUF_STEP_*) q8_steps sets (ModelConfig.ggufActivations); tile_block > 0 (the type's
 * values a block; needs row_fn): a prefill piece on fp32 activations runs gemm_gguf_tile.c's tiles instead of fn;
 * interleave: 4 where the rows are gguf_x4.h's groups (row_fn then dequantizes a row as GGUF stores it), else 0 or 1 */
typedef struct gguf_seg {
    gguf_matmul_fn fn;
    gguf_row_fn row_fn;
    const uint8_t *w;
    int64_t rows, row_bytes;
    gguf_matmul_fn fn_q8;
    int64_t q8_steps;
    int64_t tile_block;
    int64_t interleave;
} gguf_seg;

/* bytes of team work a projection of M rows of x [M, K] may use (gguf_linear_team's `work`): x quantized once, and
 * each of up to GGUF_TEAM_THREADS threads' tile panels (gemm_gguf_tile.c) */
#define GGUF_TEAM_THREADS 64
int64_t gguf_team_work_bytes(int64_t M, int64_t K);
/* the work's start in a buffer whose room begins at p (rounded up to 64 bytes), and the room that takes */
static inline void *gguf_team_work_at(void *p) { return (void *)(((uintptr_t)p + 63) / 64 * 64); }
static inline int64_t gguf_team_work_room(int64_t M, int64_t K) { return 64 + gguf_team_work_bytes(M, K); }

/* the segments of a table ended by one whose fn is NULL (as npu_ops/gguf_modules.py writes them) */
int64_t gguf_seg_count(const gguf_seg *segs);
/* y[M, N] = x[M, K] . W^T (+ bias) over the segments (their rows add up to N), by every thread of the calling team
 * (add: y += that), a call of step kind `step` (GGUF_STEP_*); scratch: M x N floats the team may overwrite (each
 * thread its rows' part), or NULL (each thread mallocs its own); work: gguf_team_work_bytes(M, K) bytes (64-byte
 * aligned) the team may overwrite, or NULL (each thread quantizes x itself and mallocs its tile panels); ends on the
 * team's barrier; 0, or 3 without scratch */
int gguf_linear_team(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                     float *scratch, void *work, float *y, int64_t N, int add, int step);
/* gguf_linear_f32 over the caller's scratch and work (as above), in a team of its own */
int gguf_linear_run(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                    float *scratch, void *work, float *y, int64_t N, int nthreads, int step);
#endif
