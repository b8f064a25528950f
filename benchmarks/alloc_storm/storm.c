/* Allocation-call storm through the stand-in libcuda (bookkeeping only, no
 * device dir): N x (cuMemAlloc_v2 4 KiB + cuMemFree_v2). Prints
 * "calls <n> ns <total> ns_per_call <x>"; with --wait first prints
 * "READY <pid>" and waits for a line on stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cuda_standin.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    if (argc > 2 && strcmp(argv[2], "--wait") == 0) {
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
    if (cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p)) /* warm-up (first-call pause) */
        return 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p))
            return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %.0f ns_per_call %.1f\n", 2 * n, ns, ns / (2.0 * n));
    return 0;
}
