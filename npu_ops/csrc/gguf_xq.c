/* The calling thread's view of its team's quantized x (gguf_xq.h): set by gguf_linear.c around a projection's
 * kernels, looked up by them. Thread-local: each thread of a team holds its own pointer to the same buffers. */
#include "gguf_xq.h"

#include <stddef.h>

static _Thread_local const gguf_xq *team_xq;

void gguf_xq_set(const gguf_xq *q) { team_xq = q; }

const gguf_xq *gguf_xq_find(const float *x, int64_t m, int64_t k, int format) {
    const gguf_xq *q = team_xq;
    return q != NULL && q->x == x && q->m == m && q->k == k && q->format == format ? q : NULL;
}
