/* What the kernel A/B harnesses (tools/ab_lanes.c, tools/ab_panel.c) share: the thread's CPU clock (a shared
 * machine's other work does not count), one timed call kept if it beats the best so far, and random GGUF blocks
 * whose fp16 scales are small and finite. */
#ifndef AB_COMMON_H
#define AB_COMMON_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*ab_fn)(const uint8_t *, int64_t, int64_t, const float *, int64_t, float *);

static double ab_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* f on (w, x) once; the lesser of its time and best */
static double ab_best(ab_fn f, const uint8_t *w, int64_t n, int64_t k, const float *x, int m, float *y,
                      double best) {
    const double t = ab_now();
    f(w, n, k, x, m, y);
    const double d = ab_now() - t;
    return d < best ? d : best;
}

/* n x nb random blocks of bb bytes; each block's fp16 d at byte d_at (and, two_scales, its dmin right after) set
 * to 0x1400 + (rand() & mask): no inf / NaN scales (a mask of 0x1ff sets the sign bit now and then) */
static uint8_t *ab_random_blocks(int64_t n, int64_t nb, int bb, int d_at, int two_scales, unsigned mask) {
    uint8_t *w = malloc((size_t)(n * nb * bb));
    for (int64_t i = 0; i < n * nb * bb; ++i) w[i] = (uint8_t)rand();
    for (int64_t i = 0; i < n * nb; ++i) {
        uint16_t h = (uint16_t)(0x1400 + ((unsigned)rand() & mask));
        memcpy(w + i * bb + d_at, &h, 2);
        if (two_scales) memcpy(w + i * bb + d_at + 2, &h, 2);
    }
    return w;
}
#endif
