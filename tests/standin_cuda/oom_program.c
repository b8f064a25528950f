/* Asks the stand-in libcuda for 1 TiB: refused (over GPUTRACE_STANDIN_CUDA_MAX) with
 * CUDA_ERROR_OUT_OF_MEMORY, when it exits 0. Linked by link_program (standin_cuda.py)
 * for the flight recorder's live test and benchmarks/flight. */
#include <stdio.h>
#include "cuda_standin.h"
int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 3;
    CUresult r = cuMemAlloc_v2(&p, 1ull << 40);
    printf("OOM %d\n", (int)r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 4;
}
