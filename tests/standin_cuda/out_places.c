/*
 * TEST STAND-IN workload: allocations whose out pointers lie in different
 * places, because the API layer reads an out pointer from the copy of the
 * caller's frame its stack walk already made when it lies there, and from user
 * memory otherwise (probes/cuda.bpf.c, cuda_chunk_word). Each line printed is
 * "OUT <place> <function> ptr=0x<value> size=<bytes>" with the value the call
 * returned, which the recording must hold exactly:
 *
 *   frame      a local of the calling function
 *   heap       malloc'd
 *   global     a static variable
 *   far        a local of a caller 4 KiB of locals up the stack (beyond the first read)
 *   unaligned  a local at an address that is not 8-byte aligned (memcpy'd out)
 *   pitch      cuMemAllocPitch_v2: the pointer in the frame, the pitch on the heap
 *   handle     cuMemCreate: the handle on the heap
 *
 * Usage: out_places   (exit 0 when every call succeeded)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_standin.h"

#define NOINLINE __attribute__((noinline, noclone))

static CUdeviceptr g_global;

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "out_places: %s returned %d\n", what, (int)r);
        exit(1);
    }
}

static void report(const char *place, const char *fn, unsigned long long v, unsigned long long size)
{
    printf("OUT %s %s ptr=0x%llx size=%llu\n", place, fn, v, size);
}

NOINLINE static void in_frame(void)
{
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 1 << 12), "frame");
    report("frame", "cuMemAlloc_v2", p, 1 << 12);
}

NOINLINE static void on_heap(void)
{
    CUdeviceptr *p = malloc(sizeof(*p));
    check(cuMemAlloc_v2(p, 2 << 12), "heap");
    report("heap", "cuMemAlloc_v2", *p, 2 << 12);
    free(p);
}

NOINLINE static void in_global(void)
{
    check(cuMemAlloc_v2(&g_global, 3 << 12), "global");
    report("global", "cuMemAlloc_v2", g_global, 3 << 12);
}

NOINLINE static void far_call(CUdeviceptr *p)
{
    check(cuMemAlloc_v2(p, 4 << 12), "far");
}

NOINLINE static void far_up(void)
{
    volatile char pad[4096];
    CUdeviceptr p = 0;
    pad[0] = 1;
    far_call(&p);
    report("far", "cuMemAlloc_v2", p, 4 << 12);
    pad[4095] = pad[0];
}

NOINLINE static void unaligned(void)
{
    unsigned char buf[24] __attribute__((aligned(8)));
    CUdeviceptr v;
    check(cuMemAlloc_v2((CUdeviceptr *)(buf + 3), 5 << 12), "unaligned");
    memcpy(&v, buf + 3, sizeof(v));
    report("unaligned", "cuMemAlloc_v2", v, 5 << 12);
}

NOINLINE static void pitched(void)
{
    CUdeviceptr p = 0;
    size_t *pitch = malloc(sizeof(*pitch));
    check(cuMemAllocPitch_v2(&p, pitch, 1000, 7, 4), "pitch");
    report("pitch", "cuMemAllocPitch_v2", p, (unsigned long long)*pitch * 7);
    free(pitch);
}

NOINLINE static void created(void)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle *h = malloc(sizeof(*h));
    check(cuMemCreate(h, 2 << 20, &prop, 0), "handle");
    report("handle", "cuMemCreate", *h, 2 << 20);
    free(h);
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 1;
    in_frame();
    on_heap();
    in_global();
    far_up();
    unaligned();
    pitched();
    created();
    printf("DONE\n");
    return 0;
}
