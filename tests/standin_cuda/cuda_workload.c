/*
 * TEST STAND-IN -- a known CUDA driver-API workload for gputrace's API-layer tests.
 * It does no GPU work; it only calls the allocation API of the stand-in libcuda
 * (libcuda_standin.c) from distinct, non-inlined functions with known sizes:
 *
 *   balanced_alloc_free  10 cuMemAlloc_v2 of varied sizes, one cuMemAllocPitch_v2,
 *                        one cuMemAllocHost_v2, one cuMemHostAlloc, one cuMemAllocManaged,
 *                        and a free for every one of them
 *   leak_buffers         23 cuMemAlloc_v2 of 1 MiB, never freed
 *   vmm_alloc            cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
 *                        cuMemUnmap, cuMemRelease, cuMemAddressFree
 *   async_alloc          cuMemAllocAsync(+_ptsz), cuMemAllocFromPoolAsync(+_ptsz),
 *                        cuMemFreeAsync(+_ptsz)
 *   failing_alloc        one cuMemAlloc_v2 of 1 TiB: CUDA_ERROR_OUT_OF_MEMORY
 *
 * Usage: cuda_workload [--wait] [--hold] [--dlopen] [--ctx-destroy] [--quiet] | --print-expected
 *   --wait            print "READY <pid>", then wait for a line on stdin before any CUDA call
 *   --dlopen          load libcuda.so.1 with dlopen() after the READY line and call through
 *                     dlsym'd pointers. The linked binary re-execs (same pid) its twin
 *                     cuda_workload_dlopen, which has no DT_NEEDED on libcuda at all.
 *   --hold            after "DONE", wait for another line (or EOF) on stdin before exiting,
 *                     so the leaked memory can be inspected while the process lives
 *   --ctx-destroy     call cuCtxDestroy_v2 at the end (frees what the context still owns)
 *   --quiet           no per-call lines
 *   --print-expected  print the expected calls as JSON (tests/standin_cuda/expected.json)
 * Per call it prints "CALL <function> <symbol> size=<n> result=<r> ptr=0x<p>", then "DONE".
 * Exit status 0 when every call returned what it should.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_standin.h"

#define NOINLINE __attribute__((noinline, noclone))
#define MIB (1ull << 20)

/* ---- the sizes, used by the calls and by --print-expected ---- */
static const unsigned long long BALANCED_SIZES[10] = {
    4096, 100000, 1 * MIB, 3 * MIB, 512, 65536, 777777, 2 * MIB, 10 * MIB, 12345};
#define PITCH_WIDTH 1000ull
#define PITCH_HEIGHT 100ull
#define PITCH_ELEM 4u
#define PITCH_EXPECTED 1024ull /* width rounded up to 512 bytes */
#define HOST_SIZE (256 * 1024ull)
#define HOSTALLOC_SIZE (1 * MIB)
#define HOSTALLOC_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)
#define MANAGED_SIZE (8 * MIB)
#define LEAK_COUNT 23
#define LEAK_SIZE (1 * MIB)
#define VMM_RESERVE (8 * MIB)
#define VMM_SIZE (4 * MIB)
static const unsigned long long ASYNC_SIZES[4] = {256 * 1024, 512 * 1024, 1 * MIB, 3 * MIB};
#define FAIL_SIZE (1ull << 40)

/* ---- how the calls are made: directly, or through dlsym'd pointers ---- */
#define CU_SYMBOLS(X)                                                                       \
    X(cuInit) X(cuDeviceGet) X(cuCtxCreate_v2) X(cuCtxDestroy_v2) X(cuMemAlloc_v2)         \
    X(cuMemAllocPitch_v2) X(cuMemFree_v2) X(cuMemAllocManaged) X(cuMemAllocHost_v2)        \
    X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemGetAllocationGranularity)                     \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap)   \
    X(cuMemUnmap) X(cuMemSetAccess) X(cuStreamCreate) X(cuStreamDestroy_v2)                 \
    X(cuStreamSynchronize) X(cuDeviceGetDefaultMemPool) X(cuMemAllocAsync)                  \
    X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz)      \
    X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)

#ifdef WL_DLOPEN
#define DECL_PTR(f) static __typeof__(f) *p_##f;
CU_SYMBOLS(DECL_PTR)
#define CU(f) p_##f
static void *g_lib;
#else
#define CU(f) f
#endif

static int g_quiet;
static int g_failed;

static void report(const char *fn, const char *sym, unsigned long long size, CUresult r,
                   unsigned long long ptr, CUresult want)
{
    if (!g_quiet)
        printf("CALL %s %s size=%llu result=%d ptr=0x%llx\n", fn, sym, size, (int)r, ptr);
    if (r != want) {
        fprintf(stderr, "cuda_workload: %s: %s returned %d, expected %d\n", fn, sym, (int)r,
                (int)want);
        g_failed = 1;
    }
}
#define OK(fn, sym, size, r, ptr) report(fn, sym, size, r, ptr, CUDA_SUCCESS)

static CUdevice g_dev;

NOINLINE static void balanced_alloc_free(void)
{
    static const char *F = "balanced_alloc_free";
    CUdeviceptr d[10] = {0};
    for (int i = 0; i < 10; i++) {
        CUresult r = CU(cuMemAlloc_v2)(&d[i], BALANCED_SIZES[i]);
        OK(F, "cuMemAlloc_v2", BALANCED_SIZES[i], r, d[i]);
    }
    CUdeviceptr pitched = 0;
    size_t pitch = 0;
    CUresult r = CU(cuMemAllocPitch_v2)(&pitched, &pitch, PITCH_WIDTH, PITCH_HEIGHT, PITCH_ELEM);
    OK(F, "cuMemAllocPitch_v2", (unsigned long long)pitch * PITCH_HEIGHT, r, pitched);
    if (pitch != PITCH_EXPECTED) {
        fprintf(stderr, "cuda_workload: pitch %zu, expected %llu\n", pitch, PITCH_EXPECTED);
        g_failed = 1;
    }
    void *host = NULL, *host2 = NULL;
    r = CU(cuMemAllocHost_v2)(&host, HOST_SIZE);
    OK(F, "cuMemAllocHost_v2", HOST_SIZE, r, (unsigned long long)(uintptr_t)host);
    r = CU(cuMemHostAlloc)(&host2, HOSTALLOC_SIZE, HOSTALLOC_FLAGS);
    OK(F, "cuMemHostAlloc", HOSTALLOC_SIZE, r, (unsigned long long)(uintptr_t)host2);
    CUdeviceptr managed = 0;
    r = CU(cuMemAllocManaged)(&managed, MANAGED_SIZE, CU_MEM_ATTACH_GLOBAL);
    OK(F, "cuMemAllocManaged", MANAGED_SIZE, r, managed);

    for (int i = 0; i < 10; i++) {
        r = CU(cuMemFree_v2)(d[i]);
        OK(F, "cuMemFree_v2", 0, r, d[i]);
    }
    r = CU(cuMemFree_v2)(pitched);
    OK(F, "cuMemFree_v2", 0, r, pitched);
    r = CU(cuMemFreeHost)(host);
    OK(F, "cuMemFreeHost", 0, r, (unsigned long long)(uintptr_t)host);
    r = CU(cuMemFreeHost)(host2);
    OK(F, "cuMemFreeHost", 0, r, (unsigned long long)(uintptr_t)host2);
    r = CU(cuMemFree_v2)(managed);
    OK(F, "cuMemFree_v2", 0, r, managed);
}

NOINLINE static void leak_buffers(void)
{
    static const char *F = "leak_buffers";
    for (int i = 0; i < LEAK_COUNT; i++) {
        CUdeviceptr p = 0;
        CUresult r = CU(cuMemAlloc_v2)(&p, LEAK_SIZE);
        OK(F, "cuMemAlloc_v2", LEAK_SIZE, r, p);
        /* never freed */
    }
}

NOINLINE static void vmm_alloc(void)
{
    static const char *F = "vmm_alloc";
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_dev;
    size_t gran = 0;
    CUresult r = CU(cuMemGetAllocationGranularity)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    OK(F, "cuMemGetAllocationGranularity", 0, r, gran);
    CUdeviceptr va = 0;
    r = CU(cuMemAddressReserve)(&va, VMM_RESERVE, 0, 0, 0);
    OK(F, "cuMemAddressReserve", VMM_RESERVE, r, va);
    CUmemGenericAllocationHandle h = 0;
    r = CU(cuMemCreate)(&h, VMM_SIZE, &prop, 0);
    OK(F, "cuMemCreate", VMM_SIZE, r, h);
    r = CU(cuMemMap)(va, VMM_SIZE, 0, h, 0);
    OK(F, "cuMemMap", VMM_SIZE, r, va);
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = CU(cuMemSetAccess)(va, VMM_SIZE, &acc, 1);
    OK(F, "cuMemSetAccess", VMM_SIZE, r, va);
    r = CU(cuMemUnmap)(va, VMM_SIZE);
    OK(F, "cuMemUnmap", VMM_SIZE, r, va);
    r = CU(cuMemRelease)(h);
    OK(F, "cuMemRelease", 0, r, h);
    r = CU(cuMemAddressFree)(va, VMM_RESERVE);
    OK(F, "cuMemAddressFree", VMM_RESERVE, r, va);
}

NOINLINE static void async_alloc(void)
{
    static const char *F = "async_alloc";
    CUstream s = NULL;
    CUresult r = CU(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING);
    OK(F, "cuStreamCreate", 0, r, (unsigned long long)(uintptr_t)s);
    CUmemoryPool pool = NULL;
    r = CU(cuDeviceGetDefaultMemPool)(&pool, g_dev);
    OK(F, "cuDeviceGetDefaultMemPool", 0, r, (unsigned long long)(uintptr_t)pool);
    CUdeviceptr a[4] = {0};
    r = CU(cuMemAllocAsync)(&a[0], ASYNC_SIZES[0], s);
    OK(F, "cuMemAllocAsync", ASYNC_SIZES[0], r, a[0]);
    r = CU(cuMemAllocAsync_ptsz)(&a[1], ASYNC_SIZES[1], s);
    OK(F, "cuMemAllocAsync_ptsz", ASYNC_SIZES[1], r, a[1]);
    r = CU(cuMemAllocFromPoolAsync)(&a[2], ASYNC_SIZES[2], pool, s);
    OK(F, "cuMemAllocFromPoolAsync", ASYNC_SIZES[2], r, a[2]);
    r = CU(cuMemAllocFromPoolAsync_ptsz)(&a[3], ASYNC_SIZES[3], pool, s);
    OK(F, "cuMemAllocFromPoolAsync_ptsz", ASYNC_SIZES[3], r, a[3]);
    r = CU(cuMemFreeAsync)(a[0], s);
    OK(F, "cuMemFreeAsync", 0, r, a[0]);
    r = CU(cuMemFreeAsync_ptsz)(a[1], s);
    OK(F, "cuMemFreeAsync_ptsz", 0, r, a[1]);
    r = CU(cuMemFreeAsync)(a[2], s);
    OK(F, "cuMemFreeAsync", 0, r, a[2]);
    r = CU(cuMemFreeAsync_ptsz)(a[3], s);
    OK(F, "cuMemFreeAsync_ptsz", 0, r, a[3]);
    r = CU(cuStreamSynchronize)(s);
    OK(F, "cuStreamSynchronize", 0, r, (unsigned long long)(uintptr_t)s);
    r = CU(cuStreamDestroy_v2)(s);
    OK(F, "cuStreamDestroy_v2", 0, r, (unsigned long long)(uintptr_t)s);
}

NOINLINE static void failing_alloc(void)
{
    CUdeviceptr p = 0;
    CUresult r = CU(cuMemAlloc_v2)(&p, FAIL_SIZE);
    report("failing_alloc", "cuMemAlloc_v2", FAIL_SIZE, r, p, CUDA_ERROR_OUT_OF_MEMORY);
}

/* ------------------------------------------------------------ --print-expected */

static void print_expected(void)
{
    unsigned long long bal_bytes = 0;
    for (int i = 0; i < 10; i++)
        bal_bytes += BALANCED_SIZES[i];
    printf("{\n");
    printf("  \"schema\": 1,\n");
    printf("  \"note\": \"TEST STAND-IN: calls of tests/standin_cuda/cuda_workload (default flags)\",\n");
    printf("  \"functions_in_order\": [\"main\", \"balanced_alloc_free\", \"leak_buffers\", "
           "\"vmm_alloc\", \"async_alloc\", \"failing_alloc\"],\n");
    printf("  \"calls_by_function\": {\n");
    printf("    \"main\": {\"cuInit\": 1, \"cuDeviceGet\": 1, \"cuCtxCreate_v2\": 1},\n");
    printf("    \"balanced_alloc_free\": {\"cuMemAlloc_v2\": 10, \"cuMemAllocPitch_v2\": 1, "
           "\"cuMemAllocHost_v2\": 1, \"cuMemHostAlloc\": 1, \"cuMemAllocManaged\": 1, "
           "\"cuMemFree_v2\": 12, \"cuMemFreeHost\": 2},\n");
    printf("    \"leak_buffers\": {\"cuMemAlloc_v2\": %d},\n", LEAK_COUNT);
    printf("    \"vmm_alloc\": {\"cuMemGetAllocationGranularity\": 1, \"cuMemAddressReserve\": 1, "
           "\"cuMemCreate\": 1, \"cuMemMap\": 1, \"cuMemSetAccess\": 1, \"cuMemUnmap\": 1, "
           "\"cuMemRelease\": 1, \"cuMemAddressFree\": 1},\n");
    printf("    \"async_alloc\": {\"cuStreamCreate\": 1, \"cuDeviceGetDefaultMemPool\": 1, "
           "\"cuMemAllocAsync\": 1, \"cuMemAllocAsync_ptsz\": 1, \"cuMemAllocFromPoolAsync\": 1, "
           "\"cuMemAllocFromPoolAsync_ptsz\": 1, \"cuMemFreeAsync\": 2, "
           "\"cuMemFreeAsync_ptsz\": 2, \"cuStreamSynchronize\": 1, \"cuStreamDestroy_v2\": 1},\n");
    printf("    \"failing_alloc\": {\"cuMemAlloc_v2\": 1}\n");
    printf("  },\n");
    printf("  \"calls\": {\"cuInit\": 1, \"cuDeviceGet\": 1, \"cuCtxCreate_v2\": 1, "
           "\"cuMemAlloc_v2\": %d, \"cuMemAllocPitch_v2\": 1, \"cuMemAllocHost_v2\": 1, "
           "\"cuMemHostAlloc\": 1, \"cuMemAllocManaged\": 1, \"cuMemFree_v2\": 12, "
           "\"cuMemFreeHost\": 2, \"cuMemGetAllocationGranularity\": 1, "
           "\"cuMemAddressReserve\": 1, \"cuMemCreate\": 1, \"cuMemMap\": 1, "
           "\"cuMemSetAccess\": 1, \"cuMemUnmap\": 1, \"cuMemRelease\": 1, "
           "\"cuMemAddressFree\": 1, \"cuStreamCreate\": 1, \"cuDeviceGetDefaultMemPool\": 1, "
           "\"cuMemAllocAsync\": 1, \"cuMemAllocAsync_ptsz\": 1, \"cuMemAllocFromPoolAsync\": 1, "
           "\"cuMemAllocFromPoolAsync_ptsz\": 1, \"cuMemFreeAsync\": 2, "
           "\"cuMemFreeAsync_ptsz\": 2, \"cuStreamSynchronize\": 1, \"cuStreamDestroy_v2\": 1},\n",
           10 + LEAK_COUNT + 1);
    /* every allocating call in issue order, with how it is released */
    printf("  \"allocations\": [\n");
    for (int i = 0; i < 10; i++)
        printf("    {\"function\": \"balanced_alloc_free\", \"symbol\": \"cuMemAlloc_v2\", "
               "\"size\": %llu, \"result\": 0, \"freed_by\": \"cuMemFree_v2\"},\n",
               BALANCED_SIZES[i]);
    printf("    {\"function\": \"balanced_alloc_free\", \"symbol\": \"cuMemAllocPitch_v2\", "
           "\"width\": %llu, \"height\": %llu, \"element_size\": %u, \"pitch\": %llu, "
           "\"size\": %llu, \"result\": 0, \"freed_by\": \"cuMemFree_v2\"},\n",
           PITCH_WIDTH, PITCH_HEIGHT, PITCH_ELEM, PITCH_EXPECTED, PITCH_EXPECTED * PITCH_HEIGHT);
    printf("    {\"function\": \"balanced_alloc_free\", \"symbol\": \"cuMemAllocHost_v2\", "
           "\"size\": %llu, \"result\": 0, \"freed_by\": \"cuMemFreeHost\"},\n", HOST_SIZE);
    printf("    {\"function\": \"balanced_alloc_free\", \"symbol\": \"cuMemHostAlloc\", "
           "\"size\": %llu, \"flags\": %d, \"result\": 0, \"freed_by\": \"cuMemFreeHost\"},\n",
           HOSTALLOC_SIZE, HOSTALLOC_FLAGS);
    printf("    {\"function\": \"balanced_alloc_free\", \"symbol\": \"cuMemAllocManaged\", "
           "\"size\": %llu, \"flags\": %d, \"result\": 0, \"freed_by\": \"cuMemFree_v2\"},\n",
           MANAGED_SIZE, CU_MEM_ATTACH_GLOBAL);
    for (int i = 0; i < LEAK_COUNT; i++)
        printf("    {\"function\": \"leak_buffers\", \"symbol\": \"cuMemAlloc_v2\", "
               "\"size\": %llu, \"result\": 0, \"freed_by\": null},\n", LEAK_SIZE);
    printf("    {\"function\": \"vmm_alloc\", \"symbol\": \"cuMemAddressReserve\", "
           "\"size\": %llu, \"result\": 0, \"freed_by\": \"cuMemAddressFree\"},\n", VMM_RESERVE);
    printf("    {\"function\": \"vmm_alloc\", \"symbol\": \"cuMemCreate\", "
           "\"size\": %llu, \"result\": 0, \"freed_by\": \"cuMemRelease\", "
           "\"mapped_by\": \"cuMemMap\", \"unmapped_by\": \"cuMemUnmap\"},\n", VMM_SIZE);
    static const char *async_syms[4] = {"cuMemAllocAsync", "cuMemAllocAsync_ptsz",
                                        "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"};
    static const char *async_free[4] = {"cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemFreeAsync",
                                        "cuMemFreeAsync_ptsz"};
    for (int i = 0; i < 4; i++)
        printf("    {\"function\": \"async_alloc\", \"symbol\": \"%s\", \"size\": %llu, "
               "\"result\": 0, \"freed_by\": \"%s\"},\n", async_syms[i], ASYNC_SIZES[i],
               async_free[i]);
    printf("    {\"function\": \"failing_alloc\", \"symbol\": \"cuMemAlloc_v2\", \"size\": %llu, "
           "\"result\": 2, \"freed_by\": null}\n", FAIL_SIZE);
    printf("  ],\n");
    printf("  \"failed\": [{\"function\": \"failing_alloc\", \"symbol\": \"cuMemAlloc_v2\", "
           "\"size\": %llu, \"result\": 2, \"result_name\": \"CUDA_ERROR_OUT_OF_MEMORY\"}],\n",
           FAIL_SIZE);
    printf("  \"leaks\": {\"function\": \"leak_buffers\", \"symbol\": \"cuMemAlloc_v2\", "
           "\"count\": %d, \"size_each\": %llu, \"bytes\": %llu},\n",
           LEAK_COUNT, LEAK_SIZE, LEAK_COUNT * LEAK_SIZE);
    printf("  \"balanced_cuMemAlloc_v2_bytes\": %llu,\n", bal_bytes);
    /*
     * What the stand-in libcuda sends to the driver for this workload (default
     * GPUTRACE_STANDIN_CUDA_MAX, one GPU): it follows from its carving policy (requests
     * up to 1 MiB, rounded to 512 B, share 2 MiB RM blocks first-fit; bigger ones get
     * their own block rounded to 2 MiB; the async pool has its own blocks).
     */
    printf("  \"driver\": {\n");
    printf("    \"rm_alloc_by_class\": {\"0x0\": 1, \"0x80\": 1, \"0x2080\": 1, "
           "\"0x90f1\": 1, \"0x40\": 20},\n");
    printf("    \"rm_alloc_vidmem_sizes_by_function\": {\n");
    printf("      \"balanced_alloc_free\": [2097152, 4194304, 2097152, 10485760, 2097152],\n");
    printf("      \"leak_buffers\": [");
    for (int i = 0; i < 12; i++)
        printf("%s2097152", i ? ", " : "");
    printf("],\n");
    printf("      \"vmm_alloc\": [4194304],\n");
    printf("      \"async_alloc\": [2097152, 4194304],\n");
    printf("      \"failing_alloc\": []\n");
    printf("    },\n");
    printf("    \"rm_alloc_memory_os_descriptor\": {\"count\": 2, \"sizes\": [262144, 1048576]},\n");
    printf("    \"rm_free_vidmem\": 8,\n");
    printf("    \"rm_free_total\": 10,\n");
    printf("    \"uvm\": {\"UVM_INITIALIZE\": 1, \"UVM_REGISTER_GPU\": 1, "
           "\"UVM_REGISTER_GPU_VASPACE\": 1, \"UVM_CREATE_EXTERNAL_RANGE\": 20, "
           "\"UVM_MAP_EXTERNAL_ALLOCATION\": 20, \"UVM_FREE\": 8},\n");
    printf("    \"managed_mmaps\": [8388608],\n");
    printf("    \"managed_munmaps\": 1,\n");
    printf("    \"leaked_vidmem_objects\": 12,\n");
    printf("    \"leaked_vidmem_bytes\": 25165824,\n");
    printf("    \"peak_vidmem_bytes\": 31457280,\n");
    printf("    \"failing_alloc_note\": \"1 TiB is over the default 1 GiB per-call cap, so no "
           "ioctl is issued; with GPUTRACE_STANDIN_CUDA_MAX >= 1T the call issues one RM_ALLOC "
           "of class 0x40 that the FUSE driver fails with NV_ERR_NO_MEMORY (0x51)\"\n");
    printf("  },\n");
    printf("  \"optional\": {\"--ctx-destroy\": {\"calls_by_function\": {\"main\": "
           "{\"cuCtxDestroy_v2\": 1}}, \"driver\": {\"UVM_FREE\": 12, \"rm_free_vidmem\": 12, "
           "\"UVM_UNREGISTER_GPU_VASPACE\": 1, \"UVM_UNREGISTER_GPU\": 1, "
           "\"rm_free_context_objects\": 3}}}\n");
    printf("}\n");
}

/* ---------------------------------------------------------------------- main */

#ifdef WL_DLOPEN
static int load_library(void)
{
    const char *path = getenv("GPUTRACE_STANDIN_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1"; /* found through this binary's RUNPATH ($ORIGIN) */
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "cuda_workload: dlopen %s: %s\n", path, dlerror());
        return -1;
    }
#define LOAD_PTR(f)                                                                 \
    p_##f = (__typeof__(f) *)dlsym(g_lib, #f);                                      \
    if (!p_##f) {                                                                   \
        fprintf(stderr, "cuda_workload: dlsym %s: %s\n", #f, dlerror());            \
        return -1;                                                                  \
    }
    CU_SYMBOLS(LOAD_PTR)
    char where[PATH_MAX] = "?";
    Dl_info info;
    if (dladdr((void *)p_cuInit, &info) && info.dli_fname)
        snprintf(where, sizeof where, "%s", info.dli_fname);
    printf("LOADED %s\n", where);
    fflush(stdout);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    int wait = 0, hold = 0, use_dlopen = 0, destroy = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--print-expected")) {
            print_expected();
            return 0;
        } else if (!strcmp(argv[i], "--wait")) {
            wait = 1;
        } else if (!strcmp(argv[i], "--hold")) {
            hold = 1;
        } else if (!strcmp(argv[i], "--dlopen")) {
            use_dlopen = 1;
        } else if (!strcmp(argv[i], "--ctx-destroy")) {
            destroy = 1;
        } else if (!strcmp(argv[i], "--quiet")) {
            g_quiet = 1;
        } else {
            fprintf(stderr, "usage: %s [--wait] [--hold] [--dlopen] [--ctx-destroy] [--quiet] | "
                            "--print-expected\n", argv[0]);
            return 2;
        }
    }
#ifndef WL_DLOPEN
    if (use_dlopen) {
        /* Same pid, fresh image without libcuda: the twin built with -DWL_DLOPEN. */
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 32);
        if (n <= 0) {
            perror("cuda_workload: /proc/self/exe");
            return 1;
        }
        self[n] = 0;
        char *slash = strrchr(self, '/');
        snprintf(slash + 1, sizeof self - (size_t)(slash + 1 - self), "cuda_workload_dlopen");
        execv(self, argv);
        perror("cuda_workload: exec cuda_workload_dlopen");
        return 1;
    }
#else
    use_dlopen = 1;
#endif
    if (wait) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        char line[256];
        if (!fgets(line, sizeof line, stdin)) {
            fprintf(stderr, "cuda_workload: stdin closed before the go line\n");
            return 1;
        }
    }
#ifdef WL_DLOPEN
    if (load_library() != 0)
        return 1;
#endif
    (void)use_dlopen;
    CUresult r = CU(cuInit)(0);
    OK("main", "cuInit", 0, r, 0);
    r = CU(cuDeviceGet)(&g_dev, 0);
    OK("main", "cuDeviceGet", 0, r, (unsigned long long)g_dev);
    CUcontext ctx = NULL;
    r = CU(cuCtxCreate_v2)(&ctx, 0, g_dev);
    OK("main", "cuCtxCreate_v2", 0, r, (unsigned long long)(uintptr_t)ctx);
    if (g_failed) {
        fprintf(stderr, "cuda_workload: no context, stopping\n");
        return 1;
    }
    balanced_alloc_free();
    leak_buffers();
    vmm_alloc();
    async_alloc();
    failing_alloc();
    if (destroy) {
        r = CU(cuCtxDestroy_v2)(ctx);
        OK("main", "cuCtxDestroy_v2", 0, r, (unsigned long long)(uintptr_t)ctx);
    }
    printf("DONE\n");
    fflush(stdout);
    if (hold) {
        char line[256];
        if (!fgets(line, sizeof line, stdin))
            line[0] = 0; /* EOF releases too */
    }
    return g_failed ? 1 : 0;
}
