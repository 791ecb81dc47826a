/* team_sync.h's barrier: arrival counts in cache lines of their own, release stores and acquire loads. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
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
    long spin_tight, spin_paused; /* the spin budget (relax): none where the team outnumbers the CPUs it may use */
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
 * pause between loads, then yields the core: some 50 us of spinning in all. A team larger than the CPUs it may run
 * on yields at once (a waiter would spin while the thread it waits for has no core). */
#define SPIN_TIGHT 4096
#define SPIN_PAUSED (SPIN_TIGHT + 2048)

/* the CPUs this process may run on, asked once (a fused decode step builds a team_sync: no system call a step) */
static int usable_cpus(void) {
    static atomic_int known; /* 0: not asked yet */
    int n = atomic_load_explicit(&known, memory_order_relaxed);
    if (n > 0) return n;
#ifdef CPU_COUNT
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
#endif
    if (n <= 0) n = omp_get_num_procs();
    atomic_store_explicit(&known, n, memory_order_relaxed);
    return n;
}

team_sync *team_sync_new(int n) {
    team_sync *s = malloc(sizeof *s);
    sync_slot *slots = n > 0 ? aligned_alloc(_Alignof(sync_slot), sizeof(sync_slot) * (size_t)n) : NULL;
    if (s == NULL || slots == NULL) {
        free(s);
        free(slots);
        return NULL;
    }
    for (int i = 0; i < n; ++i) atomic_init(&slots[i].arrived, 0);
    const int spin = n <= usable_cpus();
    *s = (team_sync){n, spin ? SPIN_TIGHT : 0, spin ? SPIN_PAUSED : 0, slots};
    return s;
}

void team_sync_free(team_sync *s) {
    if (s == NULL) return;
    free(s->slots);
    free(s);
}

void team_sync_join(team_sync *s) { self = (member){s, omp_get_thread_num(), 0}; }

void team_sync_leave(void) { self = (member){NULL, 0, 0}; }

static inline void relax(const team_sync *s, long spins) {
    if (spins < s->spin_tight) return;
#ifdef __x86_64__
    if (spins < s->spin_paused) {
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
        while (atomic_load_explicit(&m->s->slots[t].arrived, memory_order_acquire) < e) relax(m->s, spins++);
    }
}

/* The barrier's contract, checked (tests/unit/test_team_sync.py): a team of nthreads over `rounds` rounds, each
 * thread publishing a value a round with plain stores and reading every other thread's after the barrier. Returns
 * the reads that saw another round's value (0), or -1 without memory. */
int team_sync_check(int nthreads, int rounds) {
    team_sync *s = team_sync_new(nthreads);
    long *vals = calloc((size_t)nthreads * 16, sizeof(long)); /* a cache line a thread */
    if (s == NULL || vals == NULL) {
        team_sync_free(s);
        free(vals);
        return -1;
    }
    int wrong = 0, short_team = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : wrong)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        if (nt != nthreads) {
#pragma omp atomic write
            short_team = 1;
        } else {
            team_sync_join(s);
            for (long r = 1; r <= rounds; ++r) {
                vals[me * 16] = r * nt + me;
                team_barrier();
                for (int t = 0; t < nt; ++t) wrong += vals[t * 16] != r * nt + t;
                team_barrier(); /* nobody writes round r + 1 before everyone has read round r */
            }
            team_sync_leave();
        }
    }
    team_sync_free(s);
    free(vals);
    return short_team ? -1 : wrong;
}
