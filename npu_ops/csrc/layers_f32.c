/* Every decoder layer of a Llama-family model for one step's rows in one call, fp32 on the CPU: RMSNorm,
 * the packed qkv projection, rotary on q and k with k and v written to the paged cache, paged attention,
 * o_proj with the residual added in its epilogue, RMSNorm, gate/up with silu(gate) * up in its epilogue, and
 * down_proj with the residual. A thin model (SmolLM2-135M: 30 layers of hidden 576) spent about a third of a
 * one-sequence decode step between the kernels (Python dispatch, tensor allocation, ctypes calls, a thread
 * team forked and joined per op); here one OpenMP team lives for the whole step and the ops meet at its
 * barriers. Each op is the same compiled code as its single-op kernel (its file's team half), so the result is
 * bit-identical to the op-by-op path. A projection may hold int8 weights (W8A16: gemm_int8.c, W8A8:
 * gemm_w8a8.c, activations quantized in the call) or GGUF blocks as the file stores them (gguf_linear.c: a
 * segment table, each segment run by its block type's kernel), the residual added in its epilogue as the op-by-op
 * path adds it. One row (a one-stream decode step) is normed and quantized by every thread into its own copy, so
 * the team meets at a barrier only where a projection needs another thread's output. An int8 KV cache
 * (npu_ops/quant_kv.py's rows) takes each step's K/V rows quantized here and is read in place (attention_int8.c,
 * attention_lone_i8.c). The caller keeps LoRA, tensor parallelism and other devices on the op-by-op path.
 *
 * layers[l]: pointers of layer l (each projection's packed weight as its kernel packs it, its bias or NULL,
 * its per-column scale for int8 kinds, its kind; its K and V caches and whether they hold int8 rows); x [T, hidden]
 * is updated in place; cos, sin [T, D]; slots [T] int64; block tables, rows and positions as attention.c
 * takes them; work: llama_layers_f32_work(...) floats. Returns 0 or attention.c's error codes. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <omp.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attention_i8.h"
#include "attention_int8.h"
#include "attention_lone_i8.h"
#include "elementwise.h"
#include "gemm.h"
#include "gemm_int8.h"
#include "gemm_tile.h"
#include "gemm_w8a8.h"
#include "gemm_w8a8_row.h"
#include "gguf_linear.h"
#include "kernels.h"
#include "layers_f32.h"
#include "team_sync.h"

enum { LIN_F32 = 0, LIN_W8A16 = 1, LIN_W8A8 = 2, LIN_GGUF = 3 }; /* LIN_GGUF: w is a gguf_seg table (gguf_linear.h) */

typedef struct {
    const void *w;
    const float *bias, *scale;
    int64_t kind;
} lin_desc;

typedef struct layer_f32 {
    const float *in_norm, *post_norm;
    lin_desc qkv, o, gu, down;
    void *k_cache, *v_cache; /* fp32 rows, or int8 rows with their scale (attention_i8.h) where kv_i8 */
    int64_t kv_i8;
} layer_f32;

typedef struct {
    float *xs;         /* W8A8 row scales [T] */
    int8_t *xq, *zero; /* quantized rows [T, kmax padded]; a zero W8A8 panel */
    uint8_t *gguf;     /* a GGUF projection's team work (gguf_linear.h: x quantized once, the tiles' panels) */
} int8_scratch;

typedef struct {
    int64_t T, hidden, H, KVH, D, inter, BS, MB;
    float eps, scale;
    int gguf_step; /* GGUF_STEP_*: a decode step or a prefill piece (which GGUF segments take int8 activations) */
} dims_f32;

static int64_t kmax_padded(int64_t hidden, int64_t QD, int64_t inter) {
    const int64_t k = hidden > QD ? hidden : QD;
    return ((k > inter ? k : inter) + 3) / 4 * 4;
}

/* Floats a row leaves between h and gate/up: a GGUF gate/up's team scratch (gguf_linear.h) is the region from qkv
 * to gate/up (qkv, q, attention and h are dead while it runs), at least 2 x inter a row; qkv's is the region from q
 * on (to gate/up's end), at least QKV a row. Typical shapes need none. */
static int64_t gu_pad(int64_t QKV, int64_t QD, int64_t inter) {
    const int64_t gu_short = 2 * inter - (QKV + 2 * QD + inter), qkv_short = QKV - (2 * QD + 3 * inter);
    const int64_t pad = gu_short > qkv_short ? gu_short : qkv_short;
    return pad > 0 ? pad : 0;
}

/* floats: x's norm, qkv, q, attention, h, the pad (gu_pad), gate/up, then the int8 scratch (int8_scratch) and the
 * GGUF team work (as long as the longest K needs: its layout grows with K) */
int64_t llama_layers_f32_work(int64_t T, int64_t hidden, int64_t H, int64_t KVH, int64_t D, int64_t inter) {
    const int64_t kp = kmax_padded(hidden, H * D, inter);
    const int64_t bytes = T * kp + w8a8_zero_bytes(kp) + gguf_team_work_room(T, kp);
    const int64_t QKV = (H + 2 * KVH) * D;
    return T * (hidden + QKV + 2 * H * D + inter + gu_pad(QKV, H * D, inter) + 2 * inter) + T + (bytes + 3) / 4;
}

/* A thread's attention scratch for the step (scores, then acc): from a mapping of its own where it is large (a long
 * prompt's scores: MBs), never from malloc: a worker's freed block stays resident in its glibc arena for good, and
 * the dynamic mmap threshold, raised by each large free, sends the next large one there too (issue 44: the RSS at
 * the end of a run). A small one (a decode step's) from malloc: the same few KB reused each step, no system call. */
#define MAP_AT_BYTES (64 * 1024)
typedef struct {
    float *p;
    size_t bytes;
} thread_scratch;

static thread_scratch scratch_new(int64_t floats) {
    thread_scratch t = {NULL, sizeof(float) * (size_t)floats};
    if (t.bytes < MAP_AT_BYTES) return (thread_scratch){malloc(t.bytes), 0};
    void *p = mmap(NULL, t.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    t.p = p == MAP_FAILED ? NULL : p;
    return t;
}

static void scratch_free(thread_scratch *t) {
    if (t->bytes == 0)
        free(t->p);
    else if (t->p != NULL)
        munmap(t->p, t->bytes);
}

/* A thread's own copies for a step of one row (a one-stream decode step): the normed row, its W8A8
 * quantization and the rotated q. Every thread computes them itself (the same code, so the same bits) instead of
 * one thread computing them while the others wait at a barrier: two barriers fewer a projection, one a layer. */
typedef struct {
    float *xn, *xs, *q;
    int8_t *xq;
} own_row;

static int own_row_alloc(own_row *o, int64_t T, int64_t hidden, int64_t kp, int64_t QD) {
    o->xn = o->xs = o->q = NULL;
    o->xq = NULL;
    if (T != 1) return 0;
    o->xn = malloc(sizeof(float) * (size_t)(hidden + 1 + QD));
    o->xq = malloc((size_t)kp);
    if (o->xn != NULL) o->xs = o->xn + hidden, o->q = o->xs + 1;
    return o->xn == NULL || o->xq == NULL;
}

/* y = x . W^T (+ bias), or y += that with add: one projection of any kind, by every thread of the team. A
 * single row's W8A8 quantization goes to the thread's own buffers (own != NULL). tmp: T x N floats of the work that
 * are dead during the call, a GGUF projection's team scratch (its threads' temporaries, never their own mallocs:
 * gguf_linear.c says why). */
static void lin(const dims_f32 *d, const lin_desc *ln, const float *x, int64_t K, int64_t N, float *y, int add,
                const int8_scratch *s, const own_row *own, float *tmp) {
    if (ln->kind == LIN_F32)
        linear_f32_team(x, d->T, K, ln->w, N, ln->bias, y, add);
    else if (ln->kind == LIN_W8A16)
        linear_w8a16_f32_team(x, d->T, K, ln->w, ln->scale, N, ln->bias, y, add);
    else if (ln->kind == LIN_GGUF)
        gguf_linear_team(ln->w, gguf_seg_count(ln->w), x, d->T, K, ln->bias, tmp, s->gguf, y, N, add, d->gguf_step);
    else
        linear_w8a8_f32_team(x, d->T, K, ln->w, ln->scale, N, ln->bias, y, d->T == 1 ? own->xq : s->xq,
                             d->T == 1 ? own->xs : s->xs, s->zero, add);
}

enum { ROW_K = 1, ROW_V = 2 }; /* the cache rows a rope_row call writes */

/* rotary on the q heads of row r into qr; with ROW_K in kv, on its k heads straight into the cache slot; with ROW_V,
 * v copied there. An int8 cache takes each K/V head's row quantized as npu_ops/quant_kv.py does (k rotated first, as
 * the op-by-op path). */
static void rope_row(const dims_f32 *d, const float *r, const float *c, const float *s, int64_t slot, float *qr,
                     const layer_f32 *ly, int kv) {
    const int64_t QD = d->H * d->D, KD = d->KVH * d->D, D = d->D, row = D + 4;
    for (int64_t h = 0; h < d->H; ++h) rotary_head_f32(r + h * D, c, s, qr + h * D, D / 2);
    if (ly->kv_i8) {
        int8_t *kd = (int8_t *)ly->k_cache + slot * d->KVH * row, *vd = (int8_t *)ly->v_cache + slot * d->KVH * row;
        float k[KV_I8_MAX_D];
        for (int64_t h = 0; h < d->KVH && (kv & ROW_K); ++h) {
            rotary_head_f32(r + QD + h * D, c, s, k, D / 2);
            kv_quantize_row_i8(k, D, kd + h * row);
        }
        for (int64_t h = 0; h < d->KVH && (kv & ROW_V); ++h) kv_quantize_row_i8(r + QD + KD + h * D, D, vd + h * row);
        return;
    }
    float *kd = (float *)ly->k_cache + slot * KD;
    for (int64_t h = 0; h < d->KVH && (kv & ROW_K); ++h) rotary_head_f32(r + QD + h * D, c, s, kd + h * D, D / 2);
    if (kv & ROW_V) memcpy((float *)ly->v_cache + slot * KD, r + QD + KD, sizeof(float) * (size_t)KD);
}

/* Rotary and the cache writes of every row, shared over the team (ends on its barrier); returns q. A lone row that
 * the team's lone attention takes (own != NULL) goes without the barrier: every thread rotates q into its own
 * copy, the last thread, the one that scores the last key block, writes the row's K, and the first its V (the V
 * sums read it only after the scores' barrier; the last thread, writing both, made the scores wait ~1 us a layer). */
static const float *rope_rows(const dims_f32 *d, const float *qkv, const float *cos_, const float *sin_,
                              const int64_t *slots, float *q, const layer_f32 *ly, const own_row *own) {
    const int64_t QD = d->H * d->D, QKV = QD + 2 * d->KVH * d->D;
    if (own != NULL) {
        const int me = omp_get_thread_num();
        rope_row(d, qkv, cos_, sin_, slots[0], own->q, ly,
                 (me == omp_get_num_threads() - 1 ? ROW_K : 0) | (me == 0 ? ROW_V : 0));
        return own->q;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d->T; ++t)
        rope_row(d, qkv + t * QKV, cos_ + t * d->D, sin_ + t * d->D, slots[t], q + t * QD, ly, ROW_K | ROW_V);
    return q;
}

/* The rows of x normed into out; one row by every thread into its own copy (no barrier): returns the rows. */
static const float *norm_rows(const dims_f32 *d, const float *x, const float *w, float *out, const own_row *own) {
    if (d->T == 1) {
        rms_norm_row_f32(x, w, own->xn, d->hidden, d->eps);
        return own->xn;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d->T; ++t) rms_norm_row_f32(x + t * d->hidden, w, out + t * d->hidden, d->hidden, d->eps);
    return out;
}

/* h = silu(gate) * up over gu's rows; one row split by columns over the team (chunks of whole 8-lane vectors,
 * so every element takes the path silu_mul_row_f32 gives it over the whole row). */
static void silu_rows(const dims_f32 *d, const float *gu, float *h) {
    const int64_t inter = d->inter;
    if (d->T == 1) {
        const int64_t chunk = 64;
        int64_t c0, c1;
        team_share((inter + chunk - 1) / chunk, &c0, &c1);
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t j0 = c * chunk, j1 = j0 + chunk < inter ? j0 + chunk : inter;
            silu_mul_row_f32(gu + j0, gu + inter + j0, h + j0, j1 - j0);
        }
        team_barrier();
        return;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d->T; ++t) silu_mul_row_f32(gu + t * 2 * inter, gu + t * 2 * inter + inter, h + t * inter, inter);
}

/* gate/up's team scratch: qkv's start (gu_pad's region); down's: xn (its T x hidden, dead once gate/up read it) */
static void mlp(const dims_f32 *d, const layer_f32 *ly, const float *xn, float *h, float *gu, float *x,
                const int8_scratch *s, const own_row *own, float *gu_tmp, float *down_tmp) {
    const int64_t inter = d->inter;
    if (ly->gu.kind == LIN_F32 && inter % F32_TILE_NR == 0) {
        gate_up_silu_f32_team(xn, d->T, d->hidden, ly->gu.w, inter, ly->gu.bias, h);
    } else if (ly->gu.kind == LIN_W8A8 && d->T == 1 && inter % w8a8_panel_width() == 0) {
        gate_up_silu_w8a8_team(xn, d->hidden, ly->gu.w, ly->gu.scale, inter, ly->gu.bias, h, own->xq, own->xs);
    } else {
        lin(d, &ly->gu, xn, d->hidden, 2 * inter, gu, 0, s, own, gu_tmp);
        silu_rows(d, gu, h);
    }
    lin(d, &ly->down, h, inter, d->hidden, x, 1, s, own, down_tmp);
}

int llama_layers_f32(const layer_f32 *layers, int64_t L, float *x, int64_t T, int64_t hidden, int64_t H, int64_t KVH,
                     int64_t D, int64_t inter, float eps, const float *cos_, const float *sin_, const int64_t *slots,
                     const int32_t *block_tables, int64_t S, int64_t MB, const int32_t *row_seq,
                     const int32_t *row_pos, int64_t BS, float scale, float *work, int nthreads, int gguf_step) {
    if (T <= 0) return 0;
    if (D % 2) return 1;
    for (int64_t l = 0; l < L; ++l)
        if (layers[l].kv_i8 && D > KV_I8_MAX_D) return 1;
    attn_plan pl;
    const int rc = attn_plan_f32(&pl, row_seq, row_pos, T, S, H, KVH, D, BS, MB, nthreads);
    if (rc != 0) return rc;
    const dims_f32 d = {T, hidden, H, KVH, D, inter, BS, MB, eps, scale, gguf_step};
    const int64_t QD = H * D;
    const int64_t kp = kmax_padded(hidden, QD, inter);
    float *xn = work, *qkv = xn + T * hidden, *q = qkv + T * (QD + 2 * KVH * D), *att = q + T * QD,
          *h = att + T * QD, *gu = h + T * (inter + gu_pad(QD + 2 * KVH * D, QD, inter)), *xs = gu + T * 2 * inter;
    int8_t *xq = (int8_t *)(xs + T);
    const int8_scratch s8 = {xs, xq, xq + T * kp, gguf_team_work_at(xq + T * kp + w8a8_zero_bytes(kp))};
    memset(s8.zero, 0, (size_t)w8a8_zero_bytes(kp));
    int failed = 0;
    team_sync *sync = team_sync_new(nthreads); /* NULL: the team meets at `omp barrier`s instead */
#pragma omp parallel num_threads(nthreads)
    {
        team_sync_join(omp_get_num_threads() == nthreads ? sync : NULL);
        thread_scratch ts = scratch_new(pl.scores_len + pl.acc_len);
        float *scores = ts.p, *acc = ts.p == NULL ? NULL : ts.p + pl.scores_len;
        own_row own;
        if (scores == NULL || acc == NULL || own_row_alloc(&own, T, hidden, kp, QD)) {
#pragma omp atomic write
            failed = 3;
        }
        team_barrier();
        for (int64_t l = 0; l < L && !failed; ++l) {
            const layer_f32 *ly = layers + l;
            const float *xin = norm_rows(&d, x, ly->in_norm, xn, &own);
            /* the GGUF projections' team scratch (lin): qkv's from q on (q, attention, h, gate/up: T x (2 QD +
             * 3 inter) >= its T x (QD + 2 KD)), o's and down's in xn (T x hidden, their N), gate/up's from qkv on */
            lin(&d, &ly->qkv, xin, hidden, QD + 2 * KVH * D, qkv, 0, &s8, &own, q);
            /* a lone row whose attention the whole team shares (attention.c, attention_int8.c) */
            const int lone = pl.shared != NULL && (!ly->kv_i8 || lone_i8_supported(H, KVH, D));
            const float *qr = rope_rows(&d, qkv, cos_, sin_, slots, q, ly, lone ? &own : NULL);
            attn_rows_team(&pl, (int)ly->kv_i8, qr, ly->k_cache, ly->v_cache, block_tables, row_seq, row_pos, att, H,
                           KVH, D, BS, MB, scale, scores, acc);
            lin(&d, &ly->o, att, QD, hidden, x, 1, &s8, &own, xn);
            mlp(&d, ly, norm_rows(&d, x, ly->post_norm, xn, &own), h, gu, x, &s8, &own, qkv, xn);
        }
        scratch_free(&ts);
        free(own.xn);
        free(own.xq);
        team_sync_leave();
    }
    team_sync_free(sync);
    attn_plan_free(&pl);
    return failed;
}
