/* team_sync.h's barrier: arrival counts in cache lines of their own, release stores and acquire loads. */
#include "team_sync.h"

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif

typedef struct {
    _Alignas(64) atomic_long arrived; /* barriers this thread has reached */
} sync_slot;

struct team_sync {
    int n;
    sync_slot *slots;
};

/* the thread's membership: its team, its slot and the barriers it has reached */
typedef struct {
    team_sync *s;
    int me;
    long count;
} member;

static _Thread_local member self;

/* Spins in a tight load loop first (a team's phases end within a few microseconds of each other), then with a
 * pause between loads, then yielding the core: about a millisecond of spinning in all. */
#define SPIN_TIGHT 4096
#define SPIN_PAUSED (SPIN_TIGHT + 16384)

team_sync *team_sync_new(int n) {
    team_sync *s = malloc(sizeof *s);
    sync_slot *slots = n > 0 ? aligned_alloc(_Alignof(sync_slot), sizeof(sync_slot) * (size_t)n) : NULL;
    if (s == NULL || slots == NULL) {
        free(s);
        free(slots);
        return NULL;
    }
    for (int i = 0; i < n; ++i) atomic_init(&slots[i].arrived, 0);
    *s = (team_sync){n, slots};
    return s;
}

void team_sync_free(team_sync *s) {
    if (s == NULL) return;
    free(s->slots);
    free(s);
}

void team_sync_join(team_sync *s) { self = (member){s, omp_get_thread_num(), 0}; }

void team_sync_leave(void) { self = (member){NULL, 0, 0}; }

static inline void relax(long spins) {
    if (spins < SPIN_TIGHT) return;
#ifdef __x86_64__
    if (spins < SPIN_PAUSED) {
        _mm_pause();
        return;
    }
#endif
    sched_yield();
}

void team_barrier(void) {
    member *m = &self;
    if (m->s == NULL) {
#pragma omp barrier
        return;
    }
    const long e = ++m->count;
    atomic_store_explicit(&m->s->slots[m->me].arrived, e, memory_order_release);
    for (int t = 0; t < m->s->n; ++t) {
        long spins = 0;
        while (atomic_load_explicit(&m->s->slots[t].arrived, memory_order_acquire) < e) relax(spins++);
    }
}
