/* The allocation storm of ../alloc_storm/storm.c, its allocations made inside
 * the stand-in caching allocator built without frame pointers
 * (tests/standin_cuda/caching_alloc.c: cache_storm -> storm_one ->
 * cuMemAlloc_v2), so the API probe unwinds two frames by their tables on
 * each. Usage and output: as storm.c (N [--wait]). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../alloc_storm/api_program.h"

#define BATCH 1000

int cache_storm(CUdeviceptr *p, long k);

int main(int argc, char **argv)
{
    static CUdeviceptr p[BATCH];
    long n = argc > 1 ? atol(argv[1]) : 200000;
    double alloc_cpu = 0, free_cpu = 0;
    if (api_start(argc > 2 && strcmp(argv[2], "--wait") == 0))
        return 1;
    double w0 = clock_ns(CLOCK_MONOTONIC);
    for (long done = 0; done < n; done += BATCH) {
        long k = n - done < BATCH ? n - done : BATCH;
        double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (cache_storm(p, k))
            return 1;
        double c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < k; i++)
            if (cuMemFree_v2(p[i]))
                return 1;
        alloc_cpu += c1 - c0;
        free_cpu += clock_ns(CLOCK_THREAD_CPUTIME_ID) - c1;
    }
    double wall = clock_ns(CLOCK_MONOTONIC) - w0;
    printf("calls %ld ns %.0f ns_per_call %.1f alloc_cpu_ns %.1f free_cpu_ns %.1f\n", 2 * n,
           wall, wall / (2.0 * n), alloc_cpu / n, free_cpu / n);
    return 0;
}
