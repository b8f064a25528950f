/* What the API-layer benchmark programs (storm.c, ../alloc_loop/loop.c) share:
 * their clock, and the start every run makes the same way: with `wait`, print
 * "READY <pid>" and wait for a line on stdin (the recorder attaches meanwhile);
 * then a context on the stand-in libcuda and one warm-up allocation, so the
 * probe's first-call pause falls outside the timed part. Returns 0, or 1 when a
 * step failed. Always inlined: the warm-up call's site stays in main, where
 * tests/test_stack_walk_live.py expects it. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "cuda_standin.h"

static double clock_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline __attribute__((always_inline)) int api_start(int wait)
{
    if (wait) {
        char line[16];
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 1;
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p);
}
