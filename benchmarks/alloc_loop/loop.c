/* An allocation-heavy program modelled on the uncached PyTorch loop measured on
 * an H200 (../shared/real-h200/README.md: ~1.3 ms per iteration, each tensor a
 * real cudaMalloc/cudaFree): every iteration does PAIRS cuMemAlloc_v2 calls from
 * deep stacks (DEPTH frames below main, plus 0-3 more per call site, frame
 * pointers kept: the API probe walks them), a fixed amount of CPU work between
 * them (WORK units, the same in every mode), then their PAIRS cuMemFree_v2.
 * Stand-in libcuda, no device folder: the calls are bookkeeping only.
 *
 * Usage: alloc_loop ITERS WORK DEPTH PAIRS [--wait]. Prints
 * "iters <n> cpu_ns_per_iter <c> wall_ns_per_iter <w>": this thread's CPU time
 * (user + system, where the probes run) and wall time per iteration. With
 * --wait it first prints "READY <pid>" and waits for a line on stdin. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../alloc_storm/api_program.h"

#define MAX_PAIRS 256

static long iters, work, pairs;
static int depth;
static double cpu, wall;
static volatile uint64_t sink;

/* CPU work that no compiler removes: an xorshift chain, `units` steps. */
static void compute(long units)
{
    uint64_t x = sink | 1;
    for (long i = 0; i < units; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    sink = x;
}

static CUdeviceptr ptrs[MAX_PAIRS];

/* A call site `extra` frames deeper than the loop: distinct stacks, as an
 * allocator's callers differ by operator. */
__attribute__((noinline)) static int site(int extra, long k)
{
    volatile int keep = extra;
    if (extra > 0)
        return site(extra - 1, k) + (keep - extra);
    return cuMemAlloc_v2(&ptrs[k], (size_t)(1 + k % 16) << 20) != CUDA_SUCCESS;
}

static int loop(void)
{
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), w0 = clock_ns(CLOCK_MONOTONIC);
    for (long it = 0; it < iters; it++) {
        for (long k = 0; k < pairs; k++) {
            if (site((int)(k % 4), k))
                return 1;
            compute(work / pairs);
        }
        for (long k = 0; k < pairs; k++)
            if (cuMemFree_v2(ptrs[k]))
                return 1;
    }
    cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    wall = clock_ns(CLOCK_MONOTONIC) - w0;
    return 0;
}

/* DEPTH frames of this before the loop: a framework's deep stack. */
__attribute__((noinline)) static int descend(int d)
{
    volatile int keep = d;
    int r = d > 0 ? descend(d - 1) : loop();
    return r + (keep - d);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: alloc_loop ITERS WORK DEPTH PAIRS [--wait]\n");
        return 2;
    }
    iters = atol(argv[1]);
    work = atol(argv[2]);
    depth = atoi(argv[3]);
    pairs = atol(argv[4]);
    if (pairs < 1 || pairs > MAX_PAIRS || iters < 1 || work < 0 || depth < 0)
        return 2;
    if (api_start(argc > 5 && strcmp(argv[5], "--wait") == 0))
        return 1;
    if (descend(depth))
        return 1;
    printf("iters %ld cpu_ns_per_iter %.1f wall_ns_per_iter %.1f\n", iters, cpu / iters,
           wall / iters);
    return 0;
}
