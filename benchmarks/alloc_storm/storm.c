/* Allocation-call storm through the stand-in libcuda (bookkeeping only, no
 * device dir): N x cuMemAlloc_v2 (4 KiB) and N x cuMemFree_v2, in batches of
 * 1000 allocations then their 1000 frees, called DEPTH frames below main
 * (frame pointers kept: the API probe walks them on every allocation).
 * Usage: alloc_storm N [--wait] [DEPTH[b][l]] (DEPTHb: frames of 256 bytes of
 * locals each, as a C++ or CPython frame: a walk then reads a page every ~15
 * frames, not every ~120; DEPTHl: each allocation's out pointer is a local of
 * the calling frame, as in cudaMalloc(&ptr, ...), not a static array). Prints
 * "calls <2n> ns <total> ns_per_call <x> alloc_cpu_ns <a> free_cpu_ns <f>":
 * wall ns per call over both, then this thread's CPU ns per allocation and per
 * free (user + system, where the probes run; time slices lost to other
 * processes on a shared machine are not counted). With --wait it first prints
 * "READY <pid>" and waits for a line on stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "api_program.h"

#define BATCH 1000

static long n;
static int local_out;
static double wall, alloc_cpu, free_cpu;

static int storm(void)
{
    static CUdeviceptr p[BATCH];
    double w0 = clock_ns(CLOCK_MONOTONIC);
    for (long done = 0; done < n; done += BATCH) {
        long k = n - done < BATCH ? n - done : BATCH;
        double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < k; i++) {
            /* one call site (tests/test_stack_walk_live.py finds its return address) */
            CUdeviceptr q, *out = local_out ? &q : &p[i];
            if (cuMemAlloc_v2(out, 4096))
                return 1;
            if (local_out)
                p[i] = q;
        }
        double c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < k; i++)
            if (cuMemFree_v2(p[i]))
                return 1;
        double c2 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        alloc_cpu += c1 - c0;
        free_cpu += c2 - c1;
    }
    wall = clock_ns(CLOCK_MONOTONIC) - w0;
    return 0;
}

/* DEPTH frames of this before the storm: a deep stack like a framework's. */
__attribute__((noinline)) static int descend(int depth)
{
    volatile int keep = depth;
    int r = depth > 0 ? descend(depth - 1) : storm();
    return r + (keep - depth);
}

/* The same with a big frame each (then descend(0): storm() keeps one call
 * site, inlined into descend, which tests/test_stack_walk_live.py expects). */
__attribute__((noinline)) static int descend_big(int depth)
{
    volatile char pad[256];
    pad[0] = (char)depth;
    int r = depth > 0 ? descend_big(depth - 1) : descend(0);
    return r + (pad[0] - (char)depth);
}

int main(int argc, char **argv)
{
    n = argc > 1 ? atol(argv[1]) : 200000;
    int depth = argc > 3 ? atoi(argv[3]) : 0;
    int big = argc > 3 && strchr(argv[3], 'b') != NULL;
    local_out = argc > 3 && strchr(argv[3], 'l') != NULL;
    if (api_start(argc > 2 && strcmp(argv[2], "--wait") == 0))
        return 1;
    if (big ? descend_big(depth) : descend(depth))
        return 1;
    printf("calls %ld ns %.0f ns_per_call %.1f alloc_cpu_ns %.1f free_cpu_ns %.1f\n", 2 * n,
           wall, wall / (2.0 * n), alloc_cpu / n, free_cpu / n);
    return 0;
}
