/* A decode step (one row per sequence, every row sampled) of a Llama-family model in one call on the CPU: the
 * embedding rows, the rotary rows of each position, every decoder layer (llama_layers_f32), the final RMSNorm and
 * the LM head into the logits. What it saves is Python: the op-by-op step runs about twenty small PyTorch ops
 * around the layers (metadata tensors, embedding, index, norm, head), each several times slower than usual right
 * after the layers have streamed every weight through the caches (SmolLM2-135M: about 0.5 ms of a 5.5 ms step).
 * A GGUF embedding (models/gguf_packed.py) dequantizes only the rows the step reads, with its type's row kernel; a
 * GGUF head (a tied one reads the embedding's bytes) runs gguf_linear_f32. Each piece is the code the op-by-op path
 * runs (the same row functions and team halves), so the logits are bit-identical to that path's. The caller (mindie_service/models/fused_decode.py) fills decode_f32_args. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_f32.h"
#include "elementwise.h"
#include "gguf_linear.h"
#include "kernels.h"

/* HEAD_GGUF: head_w is a gguf_seg table (gguf_linear.h); EMBED_GGUF: embed is one, its row_fn dequantizes a row */
enum { HEAD_F32 = 0, HEAD_W8I16 = 3, HEAD_GGUF = 4 };
enum { EMBED_F32 = 0, EMBED_GGUF = 1 };

typedef struct decode_f32_args {
    /* the model */
    const struct layer_f32 *layers;
    int64_t L, hidden, H, KVH, D, inter, vocab, BS, rope_len;
    float eps, scale;
    const void *embed;                           /* [vocab, hidden] fp32, or a gguf_seg table (embed_kind) */
    const float *rope_cos, *rope_sin, *final_norm; /* [rope_len, D] x 2, [hidden] */
    const void *head_w;                           /* packed as the head's own kernel packs it */
    const float *head_bias, *head_scale;
    int64_t head_kind, embed_kind;
    /* the step: T rows, row t of sequence t (its block table row t, MB wide) */
    int64_t T, MB, nthreads;
    const int64_t *ids, *slots;
    const int32_t *positions, *block_tables, *row_seq;
    float *logits; /* [T, vocab] */
    float *work;   /* decode_f32_work(...) floats */
} decode_f32_args;

/* floats: x, cos, sin and xn rows, then the layers' work, which a GGUF head's team scratch (T x vocab) and work
 * (gguf_linear.h: x quantized once, 64-byte aligned) reuse once the layers are done (longer where they need it) */
static int64_t head_floats(int64_t T, int64_t hidden, int64_t vocab) {
    return T * vocab + (gguf_team_work_room(T, hidden) + 3) / 4;
}

int64_t decode_f32_work(int64_t T, int64_t hidden, int64_t H, int64_t KVH, int64_t D, int64_t inter, int64_t vocab) {
    const int64_t layers = llama_layers_f32_work(T, hidden, H, KVH, D, inter), head = head_floats(T, hidden, vocab);
    return T * (2 * hidden + 2 * D) + (layers > head ? layers : head);
}

/* Returns 0, 3 without scratch for the head, 4 for a token id or position outside its table, 5 for an unknown
 * head kind, or llama_layers_f32's codes. The head is the op-by-op path's own kernel call (linear_f32 or
 * linear_w8i16_f32). */
int llama_decode_f32(const decode_f32_args *a) {
    const int64_t T = a->T, hd = a->hidden, D = a->D;
    if (T <= 0) return 0;
    if (a->head_kind != HEAD_F32 && a->head_kind != HEAD_W8I16 && a->head_kind != HEAD_GGUF) return 5;
    const gguf_seg *emb = a->embed_kind == EMBED_GGUF ? a->embed : NULL;
    float *x = a->work, *cosr = x + T * hd, *sinr = cosr + T * D, *xn = sinr + T * D, *lw = xn + T * hd;
    for (int64_t t = 0; t < T; ++t) {
        if (a->ids[t] < 0 || a->ids[t] >= a->vocab || a->positions[t] < 0 || a->positions[t] >= a->rope_len) return 4;
        if (emb != NULL)
            emb->row_fn(emb->w + a->ids[t] * emb->row_bytes, hd, x + t * hd);
        else
            memcpy(x + t * hd, (const float *)a->embed + a->ids[t] * hd, sizeof(float) * (size_t)hd);
        memcpy(cosr + t * D, a->rope_cos + a->positions[t] * D, sizeof(float) * (size_t)D);
        memcpy(sinr + t * D, a->rope_sin + a->positions[t] * D, sizeof(float) * (size_t)D);
    }
    const int rc = llama_layers_f32(a->layers, a->L, x, T, hd, a->H, a->KVH, D, a->inter, a->eps, cosr, sinr,
                                    a->slots, a->block_tables, T, a->MB, a->row_seq, a->positions, a->BS, a->scale,
                                    lw, (int)a->nthreads, GGUF_STEP_DECODE);
    if (rc != 0) return rc;
    for (int64_t t = 0; t < T; ++t) rms_norm_row_f32(x + t * hd, a->final_norm, xn + t * hd, hd, a->eps);
    if (a->head_kind == HEAD_W8I16)
        return linear_w8i16_f32(xn, T, hd, a->head_w, a->head_scale, a->vocab, a->head_bias, a->logits,
                                (int)a->nthreads);
    if (a->head_kind == HEAD_GGUF)
        return gguf_linear_run(a->head_w, gguf_seg_count(a->head_w), xn, T, hd, a->head_bias, lw,
                               gguf_team_work_at(lw + T * a->vocab), a->logits, a->vocab,
                               (int)a->nthreads, GGUF_STEP_DECODE); /* its scratch and work: the layers' work */
    linear_f32(xn, T, hd, a->head_w, a->vocab, a->head_bias, a->logits, (int)a->nthreads);
    return 0;
}

/* ``steps`` greedy decode steps (mindie_service/engine/sched/bursts.py): step s writes each row's K/V at slot
 * slots[s * T + t] and position positions[t] + s, its input the first maximum of step s - 1's logits (the
 * sampler's greedy_rows_f32, so the tokens are a single step's). out_ids, out_lp [steps, T]: each step's tokens
 * and their log-probabilities. *done: the steps whose tokens are there; fewer than ``steps`` where a step's
 * logits were not all finite (they stay in a->logits for the caller). Returns llama_decode_f32's codes, or 3
 * without scratch; a's step fields are as given when it returns. */
int llama_decode_steps_f32(decode_f32_args *a, int64_t steps, const int64_t *slots, int64_t *out_ids, float *out_lp,
                           int64_t *done) {
    const int64_t T = a->T;
    const int64_t *ids0 = a->ids, *slots0 = a->slots;
    const int32_t *pos0 = a->positions;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    int rc = ids == NULL || pos == NULL ? 3 : 0;
    *done = 0;
    if (rc == 0) {
        memcpy(ids, ids0, sizeof(int64_t) * (size_t)T);
        memcpy(pos, pos0, sizeof(int32_t) * (size_t)T);
        a->ids = ids;
        a->positions = pos;
    }
    for (int64_t s = 0; rc == 0 && s < steps; ++s) {
        a->slots = slots + s * T;
        rc = llama_decode_f32(a);
        if (rc != 0 || greedy_rows_f32(a->logits, T, a->vocab, out_ids + s * T, out_lp + s * T, (int)a->nthreads))
            break;
        *done = s + 1;
        for (int64_t t = 0; t < T; ++t) {
            ids[t] = out_ids[s * T + t];
            ++pos[t];
        }
    }
    a->ids = ids0;
    a->positions = pos0;
    a->slots = slots0;
    free(ids);
    free(pos);
    return rc;
}
