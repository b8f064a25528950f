/* TEST STAND-IN program for the whole-stack unwinder (frame pointers kept):
 *   main -> run_mid -> mid_outer (libmid_a, no frame pointers)
 *        -> mid_middle (libmid_b, frame pointers)
 *        -> cache_alloc -> grow_segment (libcaching_standin, none) -> cuMemAlloc_v2
 * Usage: mid_program [N]: N tensors of 3 MiB, each growing a 4 MiB segment
 * (the first allocation of the process among them), then every segment freed.
 * Prints "segments N". */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_standin.h"

CUdeviceptr mid_outer(size_t size, unsigned long tag);
int cache_release_all(void);

__attribute__((noinline)) static int run_mid(long n)
{
    for (long i = 0; i < n; i++)
        if (mid_outer(3u << 20, (unsigned long)i) == 0)
            return 1;
    __asm__ volatile("" ::: "memory");
    return 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 1;
    if (run_mid(n) || cache_release_all())
        return 1;
    printf("segments %ld\n", n);
    return 0;
}
