/* TEST STAND-IN program for the native unwinder: frame pointers kept here,
 * none in libcaching_standin.so. Each tensor's segment is allocated through
 *   main -> run -> alloc_tensor -> cache_alloc -> grow_segment -> cuMemAlloc_v2
 * (the last two frames in the library built without frame pointers).
 * Usage: caching_program [N] [--wait]: one warm-up cuMemAlloc_v2 from main
 * (the recorder reads the process's mappings at its first call), then N
 * tensors of 3 MiB (each grows a 4 MiB segment: N segment allocations), then
 * every segment freed. Prints "segments N". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_standin.h"

CUdeviceptr cache_alloc(size_t size, unsigned long tag);
int cache_release_all(void);

#define TENSOR (3u << 20)

__attribute__((noinline)) static CUdeviceptr alloc_tensor(unsigned long i)
{
    CUdeviceptr p = cache_alloc(TENSOR, i);
    __asm__ volatile("" ::: "memory"); /* not a tail call: alloc_tensor keeps its frame */
    return p;
}

__attribute__((noinline)) static int run(long n)
{
    for (long i = 0; i < n; i++)
        if (alloc_tensor((unsigned long)i) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3;
    if (argc > 2 && strcmp(argv[2], "--wait") == 0) {
        char line[16];
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr warm;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 1;
    if (cuMemAlloc_v2(&warm, 4096) || cuMemFree_v2(warm))
        return 1;
    if (run(n) || cache_release_all())
        return 1;
    printf("segments %ld\n", n);
    return 0;
}
