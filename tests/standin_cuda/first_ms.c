/* TEST STAND-IN program: allocates as soon as it runs (its first millisecond: no
 * set-up beyond the context), 64 cuMemAlloc_v2 of (i + 1) * 4 KiB from alloc_now()
 * under main, then frees them. Prints "ELAPSED_NS n", main's entry to the last
 * allocation. Linked by link_program (standin_cuda.py) for
 * tests/live/test_record_startup.py: start-up must lose none of these calls. */
#include <stdio.h>
#include <time.h>
#include "cuda_standin.h"

#define N 64

static CUdeviceptr ptrs[N];

__attribute__((noinline)) static int alloc_now(void)
{
    for (int i = 0; i < N; i++)
        if (cuMemAlloc_v2(&ptrs[i], (size_t)(i + 1) << 12))
            return 5;
    return 0;
}

int main(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 3;
    int rc = alloc_now();
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int i = 0; i < N; i++)
        cuMemFree_v2(ptrs[i]);
    printf("ELAPSED_NS %lld\n",
           (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    return rc;
}
