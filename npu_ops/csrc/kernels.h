/* Every entry point Python calls through ctypes, declared once: npu_ops/cpu_kernels.py, quant_cpu.py and
 * quant_kv.py give each the argument and result types written here (tests/unit/test_csrc_kernels_h.py holds them to
 * it), and each defining file includes this header, so the compiler holds the definitions to it too. Pointers
 * cross from Python as plain integers (Tensor.data_ptr()); int results are 0 or an error code. */
#ifndef MINDIE_KERNELS_H
#define MINDIE_KERNELS_H
#include <stdint.h>

/* fused elementwise ops (elementwise.c; cpu_kernels.rms_norm, silu_mul, rotary) */
void rms_norm_f32(const float *restrict x, const float *restrict w, float *restrict out, int64_t rows,
                  int64_t dim, float eps, int nthreads);
void silu_mul_f32(const float *restrict gu, float *restrict out, int64_t rows, int64_t inter, int nthreads);
void rotary_f32(const float *restrict x, int64_t stride, const float *restrict cos_, const float *restrict sin_,
                float *restrict out, int64_t rows, int64_t heads, int64_t d, int nthreads);

/* paged attention rows over fp32 or int8 pages (attention.c; cpu_kernels.paged_attention_rows,
 * quant_kv.paged_attention_rows): 1 bad heads or threads, 2 a row outside its table, 3 no memory */
int paged_attention_rows_f32(const float *q, const float *k_cache, const float *v_cache,
                             const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                             int64_t T, int64_t S, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                             float scale, int nthreads);
int paged_attention_rows_i8(const float *q, const int8_t *k_cache, const int8_t *v_cache,
                            const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                            int64_t T, int64_t S, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                            float scale, int nthreads);

/* the packed fp32 linear (gemm.c; cpu_kernels.pack_weight, linear) */
int64_t packed_weight_numel(int64_t N, int64_t K);
void pack_weight_f32(const float *w, int64_t N, int64_t K, float *wp);
void linear_f32(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                int nthreads);

/* the int8 linears (quant_cpu): W8A16 (gemm_int8.c), W8A8 (gemm_w8a8.c), the W8I16 head (gemm_w8i16.c) and the
 * rows W8A8 quantizes (quantize_rows.c); their int results: 3 without scratch */
int64_t packed_w8a16_numel(int64_t N, int64_t K);
void pack_w8a16(const int8_t *w, int64_t N, int64_t K, int8_t *wp);
void linear_w8a16_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                      const float *bias, float *y, int nthreads);
int64_t packed_w8a8_numel(int64_t N, int64_t K);
void pack_w8a8(const int8_t *w, int64_t N, int64_t K, int8_t *wp);
/* the packed W8A8 panels' width (16: the VNNI core, 8: AVX2's); a [gate | up] projection whose `inter` it divides
 * takes the fused layers' gate_up_silu_w8a8_team */
int w8a8_panel_width(void);
int linear_w8a8_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                    const float *bias, float *y, int nthreads);
int linear_w8a8_i8(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                   int64_t N, const float *bias, float *y, int nthreads);
int gemm_i8_i32(const int8_t *xq, int64_t M, int64_t K, const int8_t *wp, int64_t N, int32_t *acc);
void quantize_rows_i8(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, int nthreads);
int64_t packed_w8i16_numel(int64_t N, int64_t K);
void pack_w8i16(const int8_t *w, int64_t N, int64_t K, int8_t *wp);
int linear_w8i16_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                     const float *bias, float *y, int nthreads);

/* GGUF K-quant linears over the blocks as the file stores them (gemm_kquant.c; quant_gguf_kquant.matmul):
 * y[m, n_out] = x[m, k] . W^T, row r of W = k / 256 consecutive super-blocks, k % 256 == 0, all contiguous */
void gguf_matmul_q4_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q5_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q6_k(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
/* one row of k values dequantized (an embedding row; quant_gguf's row_kernel) */
void gguf_dequant_q4_k(const uint8_t *w, int64_t k, float *out);
void gguf_dequant_q5_k(const uint8_t *w, int64_t k, float *out);
void gguf_dequant_q6_k(const uint8_t *w, int64_t k, float *out);
/* the same against int8 activations, each row quantized per 256 columns as llama.cpp's Q8_K (gemm_kquant_q8.c;
 * quant_gguf_kquant.matmul_q8; batches of 4+ rows: gemm_kquant_q8_lanes.c) */
void gguf_matmul_q4_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q5_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q6_k_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
/* GGUF block-quantized linears (npu_ops/quant_gguf.py's type table names each type's kernels): y[m, n_out] =
 * x[m, k] . W^T with W as GGUF stores it (row r: k / block_size consecutive blocks), fp32 activations; and one row
 * dequantized (an embedding row). Q4_0, Q4_1, Q8_0: gemm_gguf.c */
void gguf_matmul_q4_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q8_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_dequant_q4_0(const uint8_t *w, int64_t k, float *out);
void gguf_dequant_q4_1(const uint8_t *w, int64_t k, float *out);
void gguf_dequant_q8_0(const uint8_t *w, int64_t k, float *out);
/* Q4_1 with fp32 d and min (24-byte blocks): W4A16 groups fp16 cannot hold (npu_ops/quant_w4a16.py) */
void gguf_matmul_q4_1f(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_dequant_q4_1f(const uint8_t *w, int64_t k, float *out);
/* the same four against int8 activations, each row quantized per 16 columns by llama.cpp's Q8_0 rule (fp32 scale)
 * with its blocks' sums (gemm_gguf_q8.c, the 4-bit types' batches gemm_gguf_q4_q8.c; quant_gguf's kernel_q8): for the bandwidth-bound few-row case */
void gguf_matmul_q4_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q8_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1f_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
int gguf_int8_vnni(void); /* 1: this build's GGUF int8 kernels sum on VNNI (dot_u8s8.h), 0: maddubs */
/* the 4-bit three with 4 rows interleaved (gguf_x4.h; n_out a multiple of 4), fp32 activations (gguf_x4.c) and
 * int8 (gemm_gguf_q4_q8.c): the bits of the type's own kernels on the rows as GGUF stores them */
void gguf_matmul_q4_0x4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1x4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1fx4(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_0x4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1x4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q4_1fx4_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
/* Q5_0 and Q5_1 (22- and 24-byte blocks of 32: fp16 d (and m), 32 fifth bits, nibbles), fp32 activations and one
 * row dequantized (gemm_gguf_q5.c), and against int8 activations as the four above (gemm_gguf_q5_q8.c) */
void gguf_matmul_q5_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q5_1(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_dequant_q5_0(const uint8_t *w, int64_t k, float *out);
void gguf_dequant_q5_1(const uint8_t *w, int64_t k, float *out);
void gguf_matmul_q5_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
void gguf_matmul_q5_1_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
/* a projection whose rows are segments of those types, over a team of its own (gguf_linear.c; gguf_cpu.linear), a
 * call of step kind `step` (gguf_linear.h's GGUF_STEP_*: which segments take their int8 kernels): 0, or 3 without
 * scratch */
struct gguf_seg;
int gguf_linear_f32(const struct gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K,
                    const float *bias, float *y, int64_t N, int nthreads, int step);
/* tests' hooks (gguf_linear.c, gemm_gguf_tile.c), counts over all calls: the rows of x a team quantized once for all
 * its threads, and the tile calls that malloc'd their own panels (a projection run without the caller's work) */
long gguf_xq_team_rows(void);
/* on 0: teams no longer quantize x once for their threads (each its own, as before): tools/bench_gguf_kernels.py's
 * A/B in one run */
void gguf_xq_share(int on);
long gguf_tile_own_panels(void);

/* the all-greedy sampler's rows (greedy_rows.c; cpu_kernels.greedy_rows): first maxima and their
 * log-probabilities; 1 if a logit is not finite */
int greedy_rows_f32(const float *restrict logits, int64_t rows, int64_t n, int64_t *restrict idx,
                    float *restrict lp, int nthreads);

/* every decoder layer of a step (layers_f32.c; mindie_service/models/fused_layers.py fills the layer table) */
struct layer_f32;
int64_t llama_layers_f32_work(int64_t T, int64_t hidden, int64_t H, int64_t KVH, int64_t D, int64_t inter);
int llama_layers_f32(const struct layer_f32 *layers, int64_t L, float *x, int64_t T, int64_t hidden, int64_t H,
                     int64_t KVH, int64_t D, int64_t inter, float eps, const float *cos_, const float *sin_,
                     const int64_t *slots, const int32_t *block_tables, int64_t S, int64_t MB, const int32_t *row_seq,
                     const int32_t *row_pos, int64_t BS, float scale, float *work, int nthreads, int gguf_step);

/* a decode step, or several greedy ones, in one call (decode_f32.c; mindie_service/models/fused_decode.py fills
 * the arguments) */
struct decode_f32_args;
int64_t decode_f32_work(int64_t T, int64_t hidden, int64_t H, int64_t KVH, int64_t D, int64_t inter,
                        int64_t vocab);
int llama_decode_f32(const struct decode_f32_args *a);
int llama_decode_steps_f32(struct decode_f32_args *a, int64_t steps, const int64_t *slots, int64_t *out_ids,
                           float *out_lp, int64_t *done);

/* the fused team's barrier and work sharing held to their contracts, and the tests' hooks (team_sync.c;
 * tests/unit/test_team_sync.py, test_fused_layers_int8.py) */
/* the reads that saw a stale value (0), or -1 where the team could not be had */
int team_sync_check(int nthreads, int rounds);
/* the units not taken exactly once a phase (0), or -1; *stolen: the units stolen */
int team_work_check(int nthreads, int64_t total, int64_t want, int delay_us, int64_t *stolen);
/* thread `thread` of every team sleeps `us` before each claim from its own front but the first (-1: none) */
void team_work_slow(int thread, int us);
/* the units stolen so far in this process */
long team_work_stolen(void);
#endif
