/*
 * TEST STAND-IN -- NOT NVIDIA CODE.
 *
 * uvm_workload: a known managed-memory workload for the stand-in's UVM tools model
 * (nvfuse), plus a planned fragmentation of GPU 0's heap. It opens the device files,
 * issues UVM_INITIALIZE and UVM_REGISTER_GPU, maps three managed ranges on nvidia-uvm
 * the way fault_workload does (offset == address) and runs "GPU kernels", CPU touches
 * and migrations through the stand-in-only command UVM_STANDIN_TEST (README: it is not
 * part of the real protocol). --print-expected prints what the stand-in must report.
 *
 *   uvm_workload DEVDIR [--wait] [--hold] [--print-expected] [--gpu G] [--pages P]
 *                [--cpu-pages H] [--batch B] [--dup D] [--prefetch R] [--evict-pages E]
 *                [--capacity C] [--pingpong T] [--frag-blocks N] [--frag-mib S] [--budget BYTES]
 *
 * --gpu G: register GPU G (not 0) and run everything on it, so that a tracker's processor
 * index (G+1 in V1 tables, 8*G+1 in V2) differs from the GPU number; the RM device and the
 * fragmented heap are GPU G's. --hold: after the fragmentation is checked, print
 * "FRAGMENTED" and wait for one stdin line before freeing it (a sampler can see it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvstandin.h"

#define RANGE_A 0x300000000000ull
#define RANGE_E 0x300040000000ull
#define RANGE_T 0x300080000000ull
#define H_DEVICE 0x5d000001u
#define H_SUBDEVICE 0x5d000002u
#define H_FRAG 0x5d010000u

static struct {
    uint64_t P, H, B, D, R, E, C, T, N, S, budget, G;
} a = {2048, 512, 64, 8, 16, 1024, 256, 64, 8, 2, 16ull << 30, 0};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("uvm_workload: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static uint64_t cdiv(uint64_t x, uint64_t y) { return (x + y - 1) / y; }

struct expect {
    uint64_t cpu_faults, gpu_faults, gpu_fault_dups, batches;
    uint64_t coh_htd_n, coh_htd_b, coh_dth_n, coh_dth_b, pre_n, pre_b, user_n, user_b, evict_n, evict_b;
    uint64_t thrash, map_remote;
    uint64_t frag_free, frag_largest, frag_largest_base;
};

/* The stand-in's model rules (README "managed-memory model"), in closed form for this workload. */
static void expected(struct expect *x)
{
    uint64_t pg = STANDIN_PAGE, R = a.R > 1 ? a.R : 1;
    memset(x, 0, sizeof *x);
    uint64_t dups_P = a.D ? a.P / a.D : 0, dups_E = a.D ? a.E / a.D : 0, dups_T = a.D ? a.T / a.D : 0;
    x->cpu_faults = a.H + 3 * a.T;
    x->gpu_faults = a.P + a.E + 2 * a.T;
    x->gpu_fault_dups = dups_P + dups_E + 2 * dups_T;
    x->batches = cdiv(a.P, a.B) + cdiv(a.E, a.B) + 2 * cdiv(a.T, a.B);
    x->coh_htd_n = a.H / R + 2 * a.T;
    x->coh_htd_b = x->coh_htd_n * pg;
    x->pre_n = R > 1 ? a.H / R : 0;
    x->pre_b = x->pre_n * (R - 1) * pg;
    x->user_n = cdiv(a.P * pg, 2ull << 20);
    x->user_b = a.P * pg;
    x->evict_n = a.C && a.E > a.C ? a.E - a.C : 0;
    x->evict_b = x->evict_n * pg;
    x->coh_dth_n = a.T;
    x->coh_dth_b = a.T * pg;
    x->thrash = a.T;
    x->map_remote = a.T;
    uint64_t S = a.S << 20, tail = a.budget - a.N * S;
    x->frag_free = (a.N / 2) * S + tail;
    x->frag_largest = tail > S ? tail : S;
    x->frag_largest_base = tail > S ? a.N * S : 0;
}

static void print_expected(void)
{
    struct expect x;
    expected(&x);
    uint64_t replays = x.batches;
    printf("{\n  \"params\": {\"pages\": %lu, \"cpu_pages\": %lu, \"batch\": %lu, \"dup_every\": %lu, "
           "\"prefetch\": %lu, \"evict_pages\": %lu, \"capacity\": %lu, \"pingpong\": %lu, "
           "\"frag_blocks\": %lu, \"frag_mib\": %lu, \"budget\": %lu, \"gpu\": %lu},\n",
           a.P, a.H, a.B, a.D, a.R, a.E, a.C, a.T, a.N, a.S, a.budget, a.G);
    printf("  \"by_type\": {\"cpu_fault\": %lu, \"migration\": %lu, \"gpu_fault\": %lu, "
           "\"gpu_fault_replay\": %lu, \"thrashing_detected\": %lu, \"throttling_start\": %lu, "
           "\"throttling_end\": %lu, \"map_remote\": %lu},\n",
           x.cpu_faults, x.coh_htd_n + x.coh_dth_n + x.pre_n + x.user_n + x.evict_n,
           x.gpu_faults + x.gpu_fault_dups, replays, x.thrash, x.thrash, x.thrash, x.map_remote);
    printf("  \"cpu_faults\": {\"write\": %lu},\n", x.cpu_faults);
    printf("  \"gpu_faults\": {\"unique\": %lu, \"duplicates\": %lu, \"batches\": %lu},\n", x.gpu_faults,
           x.gpu_fault_dups, x.batches);
    uint64_t g = a.G;
    printf("  \"migrations\": {\n"
           "    \"coherence cpu->gpu%lu\": {\"count\": %lu, \"bytes\": %lu},\n"
           "    \"coherence gpu%lu->cpu\": {\"count\": %lu, \"bytes\": %lu},\n"
           "    \"prefetch cpu->gpu%lu\": {\"count\": %lu, \"bytes\": %lu},\n"
           "    \"user gpu%lu->cpu\": {\"count\": %lu, \"bytes\": %lu},\n"
           "    \"eviction gpu%lu->cpu\": {\"count\": %lu, \"bytes\": %lu}},\n",
           g, x.coh_htd_n, x.coh_htd_b, g, x.coh_dth_n, x.coh_dth_b, g, x.pre_n, x.pre_b, g, x.user_n,
           x.user_b, g, x.evict_n, x.evict_b);
    printf("  \"evictions\": %lu, \"thrashing\": %lu, \"throttling\": %lu, \"map_remote\": %lu,\n",
           x.evict_n, x.thrash, x.thrash, x.map_remote);
    printf("  \"counters\": {\"bytes_htd\": %lu, \"bytes_dth\": %lu, \"cpu_faults\": %lu, \"gpu_faults\": %lu},\n",
           x.coh_htd_b + x.pre_b, x.coh_dth_b + x.user_b + x.evict_b, x.cpu_faults, x.gpu_faults);
    printf("  \"fragmentation\": {\"heap_size_kib\": %lu, \"heap_free_kib\": %lu, "
           "\"largest_free_kib\": %lu, \"largest_free_base_kib\": %lu}\n}\n",
           a.budget >> 10, x.frag_free >> 10, x.frag_largest >> 10, x.frag_largest_base >> 10);
}

static int ctl, gpu0, uvm;
static NvHandle client;

static void rm_ioctl(int fd, unsigned long cmd, void *p, NvU32 *status, const char *what)
{
    if (ioctl(fd, cmd, p))
        die("%s: %s", what, strerror(errno));
    if (status && *status)
        die("%s: status 0x%x", what, *status);
}

static void rm_alloc(NvHandle parent, NvHandle h, NvU32 cls, void *params)
{
    NVOS64_PARAMETERS p = {.hRoot = client, .hObjectParent = parent, .hObjectNew = h, .hClass = cls,
                           .pAllocParms = (uint64_t)(uintptr_t)params};
    rm_ioctl(ctl, NV_IOCTL_RM_ALLOC_NVOS64, &p, &p.status, "RM_ALLOC");
}

static void rm_free(NvHandle h)
{
    NVOS00_PARAMETERS p = {.hRoot = client, .hObjectParent = client, .hObjectOld = h};
    rm_ioctl(ctl, NV_IOCTL_RM_FREE, &p, &p.status, "RM_FREE");
}

static void rm_control(NvHandle obj, NvU32 cmd, void *params, NvU32 size)
{
    NVOS54_PARAMETERS p = {.hClient = client, .hObject = obj, .cmd = cmd,
                           .params = (uint64_t)(uintptr_t)params, .paramsSize = size};
    rm_ioctl(ctl, NV_IOCTL_RM_CONTROL, &p, &p.status, "RM_CONTROL");
}

static void uvm_call(unsigned cmd, void *p, NV_STATUS *st, const char *what)
{
    if (ioctl(uvm, cmd, p))
        die("%s: %s", what, strerror(errno));
    if (*st)
        die("%s: rmStatus 0x%x", what, *st);
}

static void op(NvU32 o, uint64_t base, uint64_t pages, NvU32 batch, NvU32 dup, NvU32 prefetch, NvU32 dest)
{
    UVM_STANDIN_TEST_PARAMS q = {.op = o, .gpu = (NvU32)a.G, .base = base, .length = pages * STANDIN_PAGE,
                                 .access = UVM_ACCESS_WRITE, .batch = batch, .dup_every = dup,
                                 .prefetch = prefetch, .dest = dest};
    uvm_call(UVM_STANDIN_TEST, &q, &q.rmStatus, "UVM_STANDIN_TEST");
}

/* The CPU really writes the pages, then tells the stand-in (it cannot see CPU faults). */
static void cpu_write(uint64_t base, uint64_t pages)
{
    for (uint64_t i = 0; i < pages; i++)
        ((volatile char *)(uintptr_t)base)[i * STANDIN_PAGE] = (char)i;
    op(STANDIN_OP_CPU_TOUCH, base, pages, 0, 0, 0, 0);
}

static void fb_check(uint64_t want_free, uint64_t want_largest, uint64_t want_base)
{
    static NV2080_CTRL_FB_GET_INFO_V2_PARAMS fb;
    const NvU32 idx[] = {NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE,
                         NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB,
                         NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_BASE_KB};
    memset(&fb, 0, sizeof fb);
    fb.fbInfoListSize = 4;
    for (int i = 0; i < 4; i++)
        fb.fbInfoList[i].index = idx[i];
    rm_control(H_SUBDEVICE, NV2080_CTRL_CMD_FB_GET_INFO_V2, &fb, sizeof fb);
    uint64_t got[4] = {fb.fbInfoList[0].data, fb.fbInfoList[1].data, fb.fbInfoList[2].data,
                       fb.fbInfoList[3].data};
    uint64_t want[4] = {a.budget >> 10, want_free >> 10, want_largest >> 10, want_base >> 10};
    for (int i = 0; i < 4; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "uvm_workload: FB_GET_INFO_V2 index 0x%x: %lu KiB, expected %lu\n", idx[i],
                    got[i], want[i]);
            exit(3);
        }
}

static void map_range(uint64_t base, uint64_t pages)
{
    void *p = mmap((void *)(uintptr_t)base, pages * STANDIN_PAGE, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, uvm, (off_t)base);
    if (p == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    op(STANDIN_OP_REGISTER_RANGE, base, pages, 0, 0, 0, 0);
}

static uint64_t num(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || *s == '-')
        die("bad number %s", s);
    return v;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int wait = 0, print = 0, hold = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        uint64_t *slot = !strcmp(o, "--pages") ? &a.P : !strcmp(o, "--cpu-pages") ? &a.H
                       : !strcmp(o, "--batch") ? &a.B : !strcmp(o, "--dup") ? &a.D
                       : !strcmp(o, "--prefetch") ? &a.R : !strcmp(o, "--evict-pages") ? &a.E
                       : !strcmp(o, "--capacity") ? &a.C : !strcmp(o, "--pingpong") ? &a.T
                       : !strcmp(o, "--frag-blocks") ? &a.N : !strcmp(o, "--frag-mib") ? &a.S
                       : !strcmp(o, "--budget") ? &a.budget : !strcmp(o, "--gpu") ? &a.G : NULL;
        if (slot && i + 1 < argc)
            *slot = num(argv[++i]);
        else if (!strcmp(o, "--wait"))
            wait = 1;
        else if (!strcmp(o, "--hold"))
            hold = 1;
        else if (!strcmp(o, "--print-expected"))
            print = 1;
        else if (o[0] != '-' && !dir)
            dir = o;
        else
            die("usage: uvm_workload DEVDIR [--wait] [--hold] [--print-expected] [--gpu G] [--pages P] [--cpu-pages H] "
                "[--batch B] [--dup D] [--prefetch R] [--evict-pages E] [--capacity C] [--pingpong T] "
                "[--frag-blocks N] [--frag-mib S] [--budget BYTES]");
    }
    uint64_t R = a.R > 1 ? a.R : 1;
    /* the closed forms above hold under these conditions (README) */
    if (!a.B || a.H > a.P || a.H % R || a.B % R || a.P > 0x40000 || a.E > 0x40000 || a.T > 0x40000 ||
        (a.R & (a.R - 1)) || a.N % 2 || a.N * (a.S << 20) > a.budget || !a.S || a.S % 2 || a.G > 255)
        die("parameters out of range (H <= P, R | H, R | B, R a power of two, N even, S even, N*S <= budget, "
            "G <= 255)");
    if (print) {
        print_expected();
        return 0;
    }
    if (!dir)
        die("DEVDIR missing");
    char path[4096];
    snprintf(path, sizeof path, "%s/nvidiactl", dir);
    if ((ctl = open(path, O_RDWR | O_CLOEXEC)) < 0)
        die("open %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/nvidia%lu", dir, a.G);
    if ((gpu0 = open(path, O_RDWR | O_CLOEXEC)) < 0)
        die("open %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/nvidia-uvm", dir);
    if ((uvm = open(path, O_RDWR | O_CLOEXEC)) < 0)
        die("open %s: %s", path, strerror(errno));

    NVOS21_PARAMETERS root = {0};
    rm_ioctl(ctl, NV_IOCTL_RM_ALLOC_NVOS21, &root, &root.status, "RM_ALLOC client");
    client = root.hObjectNew;
    static NV0080_ALLOC_PARAMETERS dev;
    dev.deviceId = (NvU32)a.G;
    static NV2080_ALLOC_PARAMETERS sub = {.subDeviceId = 0};
    rm_alloc(client, H_DEVICE, NV01_DEVICE_0, &dev);
    rm_alloc(H_DEVICE, H_SUBDEVICE, NV20_SUBDEVICE_0, &sub);

    UVM_INITIALIZE_PARAMS init = {0};
    uvm_call(UVM_INITIALIZE, &init, &init.rmStatus, "UVM_INITIALIZE");
    UVM_REGISTER_GPU_PARAMS reg = {.gpu_uuid = {WL_GPU0_UUID}, .rmCtrlFd = -1};
    reg.gpu_uuid.uuid[15] = (NvU8)a.G; /* GPU i's UUID ends in i (README) */
    uvm_call(UVM_REGISTER_GPU, &reg, &reg.rmStatus, "UVM_REGISTER_GPU");
    map_range(RANGE_A, a.P);
    map_range(RANGE_E, a.E);
    map_range(RANGE_T, a.T);

    if (wait) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            die("stdin closed before go");
    }

    /* 1-2: CPU writes H pages, then a kernel over P pages (batches, duplicates, prefetch) */
    cpu_write(RANGE_A, a.H);
    op(STANDIN_OP_GPU_KERNEL, RANGE_A, a.P, (NvU32)a.B, (NvU32)a.D, (NvU32)a.R, 0);
    /* 3: explicit migration back to the CPU (cause user) */
    op(STANDIN_OP_MIGRATE, RANGE_A, a.P, 0, 0, 0, 0);
    /* 4: oversubscription: the GPU holds C pages of this process, the kernel touches E */
    UVM_STANDIN_TEST_PARAMS cap = {.op = STANDIN_OP_SET_CAPACITY, .gpu = (NvU32)a.G, .length = a.C * STANDIN_PAGE};
    uvm_call(UVM_STANDIN_TEST, &cap, &cap.rmStatus, "SET_CAPACITY");
    op(STANDIN_OP_GPU_KERNEL, RANGE_E, a.E, (NvU32)a.B, (NvU32)a.D, 0, 0);
    cap.length = 0;
    uvm_call(UVM_STANDIN_TEST, &cap, &cap.rmStatus, "SET_CAPACITY");
    /* 5: ping-pong of T pages between the CPU and the GPU, three rounds */
    for (int round = 0; round < 3; round++) {
        cpu_write(RANGE_T, a.T);
        op(STANDIN_OP_GPU_KERNEL, RANGE_T, a.T, (NvU32)a.B, (NvU32)a.D, 0, 0);
    }

    /* 6: fragmentation of GPU 0's heap: N blocks of S MiB, every even-numbered one freed */
    struct expect x;
    expected(&x);
    static NV_MEMORY_ALLOCATION_PARAMS mp;
    for (uint64_t i = 0; i < a.N; i++) {
        memset(&mp, 0, sizeof mp);
        mp.size = a.S << 20;
        mp.attr = NVOS32_ATTR_PAGE_SIZE_HUGE;
        mp.attr2 = NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB;
        rm_alloc(H_DEVICE, H_FRAG + (NvU32)i, NV01_MEMORY_LOCAL_USER, &mp);
    }
    for (uint64_t i = 0; i < a.N; i += 2)
        rm_free(H_FRAG + (NvU32)i);
    fb_check(x.frag_free, x.frag_largest, x.frag_largest_base);
    if (hold) {
        printf("FRAGMENTED\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            die("stdin closed before the fragmentation was released");
    }
    for (uint64_t i = 1; i < a.N; i += 2)
        rm_free(H_FRAG + (NvU32)i);
    fb_check(a.budget, a.budget, 0);

    munmap((void *)(uintptr_t)RANGE_A, a.P * STANDIN_PAGE);
    munmap((void *)(uintptr_t)RANGE_E, a.E * STANDIN_PAGE);
    munmap((void *)(uintptr_t)RANGE_T, a.T * STANDIN_PAGE);
    printf("DONE\n");
    return 0;
}
