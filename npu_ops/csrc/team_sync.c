/* team_sync.h's barrier (arrival counts in cache lines of their own, release stores and acquire loads), the
 * team's split of n items (team_share: every kernel's, and the work stealing's shares) and the stealing. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "team_sync.h"

#include "kernels.h"

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif

typedef struct {
    _Alignas(64) atomic_long arrived; /* barriers this thread has reached */
    /* its share of the phase's shared work (team_work_open): the phase (the barriers before it + 1) << 40 | the
     * units taken from the back << 20 | those taken from the front; one atomic word, so that every claim sees the
     * other end's claims. A line of its own: the owner claims here every round, the others only at the end. */
    _Alignas(64) _Atomic uint64_t work;
    int64_t work_n; /* its units (written before `work` is released) */
} sync_slot;

struct team_sync {
    int n;
    long spin_tight, spin_paused; /* the spin budget (relax): none where the team outnumbers the CPUs it may use */
    sync_slot *slots;
};

/* the thread's membership: its team, its slot and the barriers it has reached; its share of the phase's work
 * where it claims alone (no team, or a share too large for the word's fields) */
typedef struct {
    team_sync *s;
    int me;
    long count;
    int64_t front, n;
    int alone;
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
    for (int i = 0; i < n; ++i) {
        atomic_init(&slots[i].arrived, 0);
        atomic_init(&slots[i].work, 0); /* phase 0: no phase's */
        slots[i].work_n = 0;
    }
    const int spin = n <= usable_cpus();
    *s = (team_sync){n, spin ? SPIN_TIGHT : 0, spin ? SPIN_PAUSED : 0, slots};
    return s;
}

void team_sync_free(team_sync *s) {
    if (s == NULL) return;
    free(s->slots);
    free(s);
}

void team_sync_join(team_sync *s) { self = (member){s, omp_get_thread_num(), 0, 0, 0, 0}; }

void team_sync_leave(void) { self = (member){NULL, 0, 0, 0, 0, 0}; }

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

/* This thread's share [lo, hi) of n items when a team splits them by hand (balanced to one item). */
void team_share_of(int64_t n, int t, int64_t *lo, int64_t *hi) {
    const int64_t nt = omp_get_num_threads();
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

void team_share(int64_t n, int64_t *lo, int64_t *hi) { team_share_of(n, omp_get_thread_num(), lo, hi); }

#define WORK_BITS 20
#define WORK_MASK ((UINT64_C(1) << WORK_BITS) - 1)
#define WORK_MAX (INT64_C(1) << (WORK_BITS - 2)) /* room for the claims that overshoot the end */

/* tests (team_work_slow): a thread that sleeps before each claim from its own front but the first, so that the others
 * steal the rest */
static atomic_int slow_thread = -1, slow_us;
static atomic_long stolen_units; /* units taken from another thread's share, all teams */

void team_work_slow(int thread, int us) {
    atomic_store(&slow_us, us);
    atomic_store(&slow_thread, thread);
}

long team_work_stolen(void) { return atomic_load_explicit(&stolen_units, memory_order_relaxed); }

static void slow_claim(const member *m) {
    if (m->me != atomic_load_explicit(&slow_thread, memory_order_relaxed)) return;
    const struct timespec pause = {0, 1000L * atomic_load_explicit(&slow_us, memory_order_relaxed)};
    nanosleep(&pause, NULL);
}

static inline uint64_t work_phase(const member *m) { return (uint64_t)(m->count + 1) << (2 * WORK_BITS); }

void team_work_open(int64_t n) {
    member *m = &self;
    m->front = 0;
    m->n = n;
    m->alone = m->s == NULL || n >= WORK_MAX;
    if (m->s == NULL) return;
    sync_slot *sl = &m->s->slots[m->me];
    sl->work_n = m->alone ? 0 : n; /* a share too large to publish is not stolen from */
    atomic_store_explicit(&sl->work, work_phase(m), memory_order_release);
}

int64_t team_work_front(int64_t want, int64_t *got) {
    member *m = &self;
    int64_t f, left;
    if (m->alone) {
        f = m->front;
        left = m->n - f;
    } else {
        if (m->front > 0) slow_claim(m); /* its first claim at once: a share split between owner and thieves */
        /* relaxed: the claims only split the indices; what the units write is published by the phase's barrier */
        const uint64_t v = atomic_fetch_add_explicit(&m->s->slots[m->me].work, (uint64_t)want, memory_order_relaxed);
        f = (int64_t)(v & WORK_MASK);
        left = m->n - f - (int64_t)((v >> WORK_BITS) & WORK_MASK);
    }
    *got = left <= 0 ? 0 : left < want ? left : want;
    m->front = f + *got;
    return f;
}

int team_work_steal(int *who, int64_t *unit) {
    member *m = &self;
    if (m->s == NULL) return 0;
    const uint64_t phase = work_phase(m);
    for (int k = 1; k < m->s->n; ++k) {
        const int t = (m->me + k) % m->s->n;
        sync_slot *sl = &m->s->slots[t];
        uint64_t v;
        long spins = 0; /* a thread that has not opened this phase's share yet will before the barrier */
        while (((v = atomic_load_explicit(&sl->work, memory_order_acquire)) & ~(WORK_MASK | WORK_MASK << WORK_BITS)) !=
               phase)
            relax(m->s, spins++);
        const int64_t n = sl->work_n;
        if ((int64_t)(v & WORK_MASK) + (int64_t)((v >> WORK_BITS) & WORK_MASK) >= n) continue; /* none left */
        v = atomic_fetch_add_explicit(&sl->work, UINT64_C(1) << WORK_BITS, memory_order_relaxed);
        const int64_t back = n - 1 - (int64_t)((v >> WORK_BITS) & WORK_MASK);
        if (back >= (int64_t)(v & WORK_MASK)) {
            atomic_fetch_add_explicit(&stolen_units, 1, memory_order_relaxed);
            *who = t;
            *unit = back;
            return 1;
        }
    }
    return 0;
}

/* body(me, nt, ctx) by every thread of a team of nthreads, each joined to s: 0, or -1 where the team was smaller */
static int with_team(int nthreads, team_sync *s, void (*body)(int, int, void *), void *ctx) {
    int short_team = 0;
#pragma omp parallel num_threads(nthreads)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        if (nt != nthreads) {
#pragma omp atomic write
            short_team = 1;
        } else {
            team_sync_join(s);
            body(me, nt, ctx);
            team_sync_leave();
        }
    }
    return -short_team;
}

typedef struct {
    long *vals; /* a cache line a thread */
    long rounds;
    int wrong;
} barrier_check;

static void barrier_rounds(int me, int nt, void *ctx) {
    barrier_check *c = ctx;
    int wrong = 0;
    for (long r = 1; r <= c->rounds; ++r) {
        c->vals[me * 16] = r * nt + me;
        team_barrier();
        for (int t = 0; t < nt; ++t) wrong += c->vals[t * 16] != r * nt + t;
        team_barrier(); /* nobody writes round r + 1 before everyone has read round r */
    }
#pragma omp atomic
    c->wrong += wrong;
}

/* The barrier's contract, checked (tests/unit/test_team_sync.py): a team of nthreads over `rounds` rounds, each
 * thread publishing a value a round with plain stores and reading every other thread's after the barrier. Returns
 * the reads that saw another round's value (0), or -1 without memory or the team. */
int team_sync_check(int nthreads, int rounds) {
    team_sync *s = team_sync_new(nthreads);
    barrier_check c = {calloc((size_t)nthreads * 16, sizeof(long)), rounds, 0};
    const int rc = s == NULL || c.vals == NULL ? -1 : with_team(nthreads, s, barrier_rounds, &c);
    team_sync_free(s);
    free(c.vals);
    return rc != 0 ? rc : c.wrong;
}

enum { WORK_PHASES = 3 };

typedef struct {
    atomic_int *seen; /* a count a unit */
    int64_t total, want, stolen;
} work_check;

static void work_phases(int me, int nt, void *ctx) {
    work_check *c = ctx;
    (void)nt;
    int64_t lo, hi, stolen = 0;
    team_share_of(c->total, me, &lo, &hi);
    for (int phase = 0; phase < WORK_PHASES; ++phase) {
        team_work_open(hi - lo);
        int64_t got, u;
        while ((u = team_work_front(c->want, &got)), got > 0)
            for (int64_t k = 0; k < got; ++k) atomic_fetch_add(&c->seen[lo + u + k], 1);
        int who;
        int64_t unit;
        while (team_work_steal(&who, &unit)) {
            int64_t wlo, whi;
            team_share_of(c->total, who, &wlo, &whi);
            atomic_fetch_add(&c->seen[wlo + unit], 1);
            ++stolen;
        }
        team_barrier();
    }
#pragma omp atomic
    c->stolen += stolen;
}

/* team_work_*'s contract, checked: a team of nthreads shares `total` units (team_share's split) over three phases,
 * each thread claiming `want` at a time from the front of its share, thread 0 slowed by team_work_slow(0, delay_us)
 * so that the others steal from it. Returns the units not taken exactly once a phase (0), or -1 without memory or the
 * team; *stolen: the units taken from another thread's share. */
int team_work_check(int nthreads, int64_t total, int64_t want, int delay_us, int64_t *stolen) {
    team_sync *s = team_sync_new(nthreads);
    work_check c = {calloc((size_t)(total > 0 ? total : 1), sizeof(atomic_int)), total, want, 0};
    team_work_slow(0, delay_us);
    int rc = s == NULL || c.seen == NULL ? -1 : with_team(nthreads, s, work_phases, &c);
    team_work_slow(-1, 0);
    for (int64_t i = 0; rc == 0 && i < total; ++i) rc += atomic_load(&c.seen[i]) != WORK_PHASES;
    team_sync_free(s);
    free(c.seen);
    *stolen = c.stolen;
    return rc;
}
