/* A barrier for the fused decoder's team (layers_f32.c) that costs a cache line's trip between cores. libgomp's
 * `omp barrier` ends with a futex wake, a system call even when no thread sleeps: about 0.5 us on this VM, and a
 * one-stream decode step of a thin model meets the team's barrier 8 times a layer (SmolLM2-135M: 240 a step, 3% of
 * it). Here each thread publishes its arrival count in a cache line of its own and spins on the others' (then
 * pauses, then yields: a thread descheduled on a loaded machine is waited for without burning its core).
 *
 * A team opts in: team_sync_new before the parallel region, team_sync_join / team_sync_leave by every thread at its
 * start and end. team_barrier() is then this barrier and elsewhere (a standalone kernel's team, or no team) an
 * `omp barrier`, so shared code calls team_barrier() wherever it needs the team's barrier. */
#ifndef MINDIE_TEAM_SYNC_H
#define MINDIE_TEAM_SYNC_H

#include <stdint.h>

typedef struct team_sync team_sync;

/* a barrier for n threads, or NULL without memory */
team_sync *team_sync_new(int n);
void team_sync_free(team_sync *s);
/* the calling thread (omp_get_thread_num() of a team of s's size) takes part in s until team_sync_leave */
void team_sync_join(team_sync *s);
void team_sync_leave(void);
/* every thread of the team waits for the others; writes before it are seen by every thread after it */
void team_barrier(void);
/* this thread's share [lo, hi) of n items when a team splits them by hand (balanced to one item); team_share_of:
 * thread t's, as team_share gives it to t (a thief's view of another thread's share: team_work_steal) */
void team_share(int64_t n, int64_t *lo, int64_t *hi);
void team_share_of(int64_t n, int t, int64_t *lo, int64_t *hi);
/* Work shared with stealing, for a phase whose shares the memory system serves unevenly (two threads streaming
 * weights: one often gets 10-30% less bandwidth, and the other waited for it at the barrier). Every thread of the
 * team opens its share of n units in the phase (at most one such share between two barriers: the phase ends on the
 * team's barrier), takes its units from the front in claims of `want`, and when it has none left takes single units
 * from the back of the others' shares. Outside a team (or with n >= 2^18) a thread takes its own units only.
 * team_work_front returns the first unit of a claim and *got its length (0: none left); team_work_steal returns 1
 * with a unit of thread *who's share, 0 when no thread has one left. */
void team_work_open(int64_t n);
int64_t team_work_front(int64_t want, int64_t *got);
int team_work_steal(int *who, int64_t *unit);
#endif
