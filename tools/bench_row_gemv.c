#define _GNU_SOURCE
/* One-row W8A8 projections of SmolLM2-135M's 30 layers (qkv 960x576, o 576x576, gate/up 2x1536x576 with silu,
 * down 576x1536) by a team of 2 threads, as the fused decoder runs them, against a plain read of 256 MB before each
 * pass (which also evicts the weights): each projection's time a thread and the share of the read's bandwidth. This
 * VM's bandwidth moves between ~34 and ~63 GB/s within minutes: compare builds run one after the other.
 *
 *   gcc -O3 -march=native -fopenmp -std=gnu11 -Inpu_ops/csrc -o /tmp/bench_row_gemv tools/bench_row_gemv.c \
 *       $(find npu_ops/csrc -name '*.c') -lm && /tmp/bench_row_gemv
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#include <sys/mman.h>
#include "gemm_w8a8.h"
#include "gemm_w8a8_row.h"
#include "kernels.h"
#include "team_sync.h"
#define NL 30
static void *huge(size_t n) { void *p = aligned_alloc(1 << 21, (n + (1 << 21) - 1) >> 21 << 21); madvise(p, n, MADV_HUGEPAGE); memset(p, 0, n); return p; }
int main(int argc, char **argv) {
    const int64_t H = 576, QKV = 960, I = 1536;
    int64_t shp[4][2] = {{QKV, H}, {H, H}, {2 * I, H}, {H, I}};
    int8_t *w[NL][4]; float *ws[4];
    int8_t *raw = malloc(2 * I * I);
    for (int64_t i = 0; i < 2 * I * I; ++i) raw[i] = rand() % 255 - 127;
    for (int k = 0; k < 4; ++k) { ws[k] = malloc(4 * shp[k][0]); for (int i = 0; i < shp[k][0]; ++i) ws[k][i] = 1e-3f; }
    /* one allocation, the projections in the order a step reads them, 64-byte aligned: the engine's arena
     * (mindie_service/models/packed_arena.py); a 2 MiB-aligned allocation each read 30 o_proj-sized calls 1.2x slower
     * at ~60 GB/s here, which the engine never sees */
    size_t piece[4], total = 0;
    for (int k = 0; k < 4; ++k) total += piece[k] = (packed_w8a8_numel(shp[k][0], shp[k][1]) + 63) / 64 * 64;
    int8_t *arena = huge(total * NL);
    for (int l = 0; l < NL; ++l)
        for (int k = 0; k < 4; ++k) {
            w[l][k] = arena;
            arena += piece[k];
            pack_w8a8(raw, shp[k][0], shp[k][1], w[l][k]);
        }
    size_t fn = 256u << 20; char *buf = huge(fn); memset(buf, 1, fn);
    float *x = malloc(4 * H), *y = malloc(4 * 2 * I), *hh = malloc(4 * I), *xo = malloc(4 * H);
    for (int i = 0; i < H; ++i) x[i] = (rand() % 100) / 50.f - 1;
    double acc[4][2] = {{0}}, flush_bw = 0, tot = 0;
    int reps = 40;
    int8_t *zero = calloc(1 << 16, 1);
    for (int r = 0; r < reps; ++r) {
        double t = omp_get_wtime(); long s = 0;
#pragma omp parallel for reduction(+:s) num_threads(2)
        for (size_t i = 0; i < fn; i += 64) s += buf[i];
        flush_bw += fn / (omp_get_wtime() - t); if (s == 7) puts("");
        team_sync *ts = team_sync_new(2);
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(2)
        {
            team_sync_join(ts);
            int me = omp_get_thread_num();
            int8_t xq[2048]; float xs[2];
            for (int l = 0; l < NL; ++l) {
                for (int k = 0; k < 4; ++k) {
                    double a = omp_get_wtime();
                    if (k == 2) gate_up_silu_w8a8_team(x, H, w[l][k], ws[k], I, NULL, hh, xq, xs);
                    else linear_w8a8_f32_team(k == 3 ? hh : x, 1, shp[k][1], w[l][k], ws[k], shp[k][0], NULL, k == 0 ? y : xo, xq, xs, zero, k != 0);
                    double b = omp_get_wtime();
                    acc[k][me] += b - a;
                }
            }
            team_sync_leave();
        }
        tot += omp_get_wtime() - t0;
        team_sync_free(ts);
    }
    const char *nm[4] = {"qkv", "o", "gu", "down"};
    double bw = flush_bw / reps, allb = 0;
    for (int k = 0; k < 4; ++k) {
        double bytes = (double)shp[k][0] * shp[k][1] * NL, bnd = bytes / bw;
        allb += bytes;
        printf("%-5s t0 %.3f t1 %.3f ms (bound %.3f) -> %.0f%%\n", nm[k], acc[k][0] / reps * 1e3, acc[k][1] / reps * 1e3, bnd * 1e3, bnd / (acc[k][0] / reps) * 100);
    }
    printf("all layers %.3f ms, bound %.3f (flush %.1f GB/s): %.0f%%\n", tot / reps * 1e3, allb / bw * 1e3, bw / 1e9, allb / bw / (tot / reps) * 100);
}
