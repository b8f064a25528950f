/*
 * TEST STAND-IN -- NOT NVIDIA CODE.
 *
 * workload: a known sequence of NVIDIA driver ioctls, issued the way libcuda issues
 * them (facts section 10), against the device files in DEVDIR (normally an nvfuse
 * mount). gputrace's tests trace it and compare with `--print-expected`.
 *
 *   workload DEVDIR [--wait] [--repeat N] [--no-exit-free]
 *   workload --print-expected [--repeat N] [--no-exit-free]
 *
 * stdout carries only "READY <pid>" (with --wait) and a final "DONE". The workload
 * counts every ioctl it issues and checks every status; it exits 1 on any
 * unexpected result and 3 if its own counts differ from what --print-expected says,
 * so a passing run is proof that expected.json describes what was issued.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvstandin.h"

enum wl_cmd {
    C_RM_ALLOC,
    C_RM_FREE,
    C_RM_CONTROL,
    C_RM_MAP_MEMORY,
    C_RM_UNMAP_MEMORY,
    C_RM_ALLOC_MEMORY,
    C_RM_DUP_OBJECT,
    C_UVM_INITIALIZE,
    C_UVM_MM_INITIALIZE,
    C_UVM_REGISTER_GPU,
    C_UVM_REGISTER_GPU_VASPACE,
    C_UVM_CREATE_EXTERNAL_RANGE,
    C_UVM_MAP_EXTERNAL_ALLOCATION,
    C_UVM_FREE,
    C_UVM_MIGRATE,
    C_UVM_ALLOC_SEMAPHORE_POOL,
    C_UVM_SET_PREFERRED_LOCATION,
    C_UVM_SET_ACCESSED_BY,
    C_UVM_PAGEABLE_MEM_ACCESS,
    NCMD
};
static const char *const CMD_NAME[NCMD] = {
    "RM_ALLOC", "RM_FREE", "RM_CONTROL", "RM_MAP_MEMORY", "RM_UNMAP_MEMORY",
    "RM_ALLOC_MEMORY", "RM_DUP_OBJECT", "UVM_INITIALIZE", "UVM_MM_INITIALIZE",
    "UVM_REGISTER_GPU", "UVM_REGISTER_GPU_VASPACE", "UVM_CREATE_EXTERNAL_RANGE",
    "UVM_MAP_EXTERNAL_ALLOCATION", "UVM_FREE", "UVM_MIGRATE", "UVM_ALLOC_SEMAPHORE_POOL",
    "UVM_SET_PREFERRED_LOCATION", "UVM_SET_ACCESSED_BY", "UVM_PAGEABLE_MEM_ACCESS",
};
/* The command word each name is issued with (RM_ALLOC has two: NVOS21 and NVOS64). */
static const unsigned long CMD_WORD[NCMD] = {
    NV_IOCTL_RM_ALLOC_NVOS64, NV_IOCTL_RM_FREE, NV_IOCTL_RM_CONTROL, NV_IOCTL_RM_MAP_MEMORY,
    NV_IOCTL_RM_UNMAP_MEMORY, NV_IOCTL_RM_ALLOC_MEMORY, NV_IOCTL_RM_DUP_OBJECT, UVM_INITIALIZE,
    UVM_MM_INITIALIZE, UVM_REGISTER_GPU, UVM_REGISTER_GPU_VASPACE, UVM_CREATE_EXTERNAL_RANGE,
    UVM_MAP_EXTERNAL_ALLOCATION, UVM_FREE, UVM_MIGRATE, UVM_ALLOC_SEMAPHORE_POOL,
    UVM_SET_PREFERRED_LOCATION, UVM_SET_ACCESSED_BY, UVM_PAGEABLE_MEM_ACCESS,
};

enum wl_dev { D_CTL, D_GPU, D_UVM, NDEV };
static const char *const DEV_NAME[NDEV] = {"ctl", "gpu", "uvm"};

typedef unsigned counts_t[NDEV][NCMD];
static counts_t issued;

static const NvProcessorUuid GPU0 = {WL_GPU0_UUID};
#define RM_FREES_PER_SECTION 2 /* the os descriptor and the duplicate, beyond the table */

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("workload: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void xioctl(int fd, enum wl_dev dev, enum wl_cmd c, unsigned long req, void *arg)
{
    issued[dev][c]++;
    if (ioctl(fd, req, arg) != 0)
        die("%s on %s: ioctl failed: %s", CMD_NAME[c], DEV_NAME[dev], strerror(errno));
}

static void want(const char *what, uint64_t got, uint64_t expect)
{
    if (got != expect)
        die("%s: got 0x%" PRIx64 ", expected 0x%" PRIx64, what, got, expect);
}

static NvHandle mem_handle(unsigned rep, unsigned idx)
{
    return WL_H_MEM_BASE + rep * WL_H_MEM_STRIDE + idx;
}

static unsigned table_count(enum wl_fate fate)
{
    unsigned n = 0;
    for (size_t i = 0; i < WL_NALLOCS; i++)
        n += WL_ALLOCS[i].fate == fate;
    return n;
}

/* ------------------------------------------------------------------ */
/* What the run below issues, derived from the tables in nvstandin.h   */
/* ------------------------------------------------------------------ */

static void expected_counts(counts_t out, unsigned repeat, int exit_free)
{
    memset(out, 0, sizeof(counts_t));
    /* client (NVOS21), device, subdevice, VA space, then the table per section */
    out[D_CTL][C_RM_ALLOC] = 4 + repeat * (unsigned)WL_NALLOCS;
    out[D_CTL][C_RM_FREE] = repeat * (table_count(WL_FREED) + RM_FREES_PER_SECTION) + (exit_free ? 1 : 0);
    out[D_CTL][C_RM_CONTROL] = 3; /* two at set-up, one through the dup'ed fd */
    out[D_CTL][C_RM_MAP_MEMORY] = repeat;
    out[D_CTL][C_RM_UNMAP_MEMORY] = repeat;
    out[D_CTL][C_RM_DUP_OBJECT] = repeat;
    out[D_GPU][C_RM_ALLOC_MEMORY] = repeat;
    out[D_UVM][C_UVM_INITIALIZE] = 1;
    out[D_UVM][C_UVM_MM_INITIALIZE] = 1;
    out[D_UVM][C_UVM_REGISTER_GPU] = 1;
    out[D_UVM][C_UVM_REGISTER_GPU_VASPACE] = 1;
    out[D_UVM][C_UVM_PAGEABLE_MEM_ACCESS] = 1;
    out[D_UVM][C_UVM_ALLOC_SEMAPHORE_POOL] = 1;
    out[D_UVM][C_UVM_CREATE_EXTERNAL_RANGE] = repeat;
    out[D_UVM][C_UVM_MAP_EXTERNAL_ALLOCATION] = repeat;
    out[D_UVM][C_UVM_FREE] = repeat;
    out[D_UVM][C_UVM_SET_PREFERRED_LOCATION] = 1;
    out[D_UVM][C_UVM_SET_ACCESSED_BY] = 1;
    out[D_UVM][C_UVM_MIGRATE] = 1;
}

static void print_counts_obj(const char *indent, unsigned const row[NCMD])
{
    int first = 1;
    printf("{");
    for (int c = 0; c < NCMD; c++) {
        if (!row[c])
            continue;
        printf("%s\n%s  \"%s\": %u", first ? "" : ",", indent, CMD_NAME[c], row[c]);
        first = 0;
    }
    printf("\n%s}", indent);
}

static void print_alloc(unsigned rep, unsigned idx, const char *ioctl_name, const char *dev,
                        uint32_t hclass, uint64_t size, uint32_t status, const char *fate,
                        const char *role, int last)
{
    printf("    {\"repeat\": %u, \"index\": %u, \"handle\": %u, \"ioctl\": \"%s\", \"device\": \"%s\", "
           "\"class\": %u, \"size\": %" PRIu64 ", \"status\": %u, \"fate\": \"%s\", \"role\": \"%s\"}%s\n",
           rep, idx, mem_handle(rep, idx), ioctl_name, dev, hclass, size, status, fate, role,
           last ? "" : ",");
}

static void print_expected(unsigned repeat, int exit_free)
{
    counts_t e;
    expected_counts(e, repeat, exit_free);
    unsigned total[NCMD] = {0};
    for (int d = 0; d < NDEV; d++)
        for (int c = 0; c < NCMD; c++)
            total[c] += e[d][c];

    uint64_t kept_bytes[3] = {0}; /* vid, sys, virtual */
    unsigned kept_count[3] = {0};
    uint64_t peak = 0, live = 0;
    for (size_t i = 0; i < WL_NALLOCS; i++) {
        const wl_alloc *a = &WL_ALLOCS[i];
        int k = a->hclass == NV01_MEMORY_LOCAL_USER ? 0 : a->hclass == NV01_MEMORY_SYSTEM ? 1 : 2;
        if (a->fate == WL_KEPT) {
            kept_bytes[k] += a->size;
            kept_count[k]++;
        }
        if (k == 0 && a->fate != WL_FAILS)
            live += a->size;
    }
    /* vidmem in use at the deliberate failure of the last section */
    peak = (repeat - 1) * kept_bytes[0] + live;

    printf("{\n");
    printf("  \"_comment\": \"TEST STAND-IN. Generated by `tests/standin/build/workload "
           "--print-expected`; what tests/standin/workload.c issues against tests/standin/nvfuse. "
           "Sizes in bytes, handles and classes as integers.\",\n");
    printf("  \"driver_layouts\": \"580\",\n");
    printf("  \"repeat\": %u,\n  \"exit_free\": %s,\n", repeat, exit_free ? "true" : "false");
    /* Every section's over-budget request must fail, the first one included. */
    printf("  \"budget_bytes\": {\"min\": %" PRIu64 ", \"max_exclusive\": %" PRIu64 "},\n", peak,
           live + WL_ALLOCS[WL_NALLOCS - 1].size);
    printf("  \"ioctls\": ");
    print_counts_obj("  ", total);
    printf(",\n  \"ioctls_total\": ");
    unsigned sum = 0;
    for (int c = 0; c < NCMD; c++)
        sum += total[c];
    printf("%u,\n  \"ioctls_by_device\": {", sum);
    for (int d = 0; d < NDEV; d++) {
        printf("%s\n    \"%s\": ", d ? "," : "", DEV_NAME[d]);
        print_counts_obj("    ", e[d]);
    }
    printf("\n  },\n");
    printf("  \"ioctls_before_ready\": {\"ctl\": {\"RM_ALLOC\": 1}},\n");
    printf("  \"ioctls_via_dup_fd\": {\"ctl\": {\"RM_CONTROL\": 1}},\n");
    printf("  \"rm_alloc_structs\": {\"NVOS21\": 1, \"NVOS64\": %u},\n", total[C_RM_ALLOC] - 1);
    printf("  \"cmd_words\": {");
    for (int c = 0; c < NCMD; c++)
        printf("%s\n    \"%s\": %lu", c ? "," : "", CMD_NAME[c], CMD_WORD[c]);
    printf(",\n    \"RM_ALLOC_NVOS21\": %lu\n  },\n", (unsigned long)NV_IOCTL_RM_ALLOC_NVOS21);
    printf("  \"handles\": {\"client\": null, \"client_note\": \"hObjectNew 0 in, the driver's "
           "handle out\", \"device\": %u, \"subdevice\": %u, \"vaspace\": %u, \"memory_base\": %u, "
           "\"memory_stride_per_repeat\": %u},\n",
           WL_H_DEVICE, WL_H_SUBDEVICE, WL_H_VASPACE, WL_H_MEM_BASE, WL_H_MEM_STRIDE);
    printf("  \"classes\": {\"client\": %u, \"device\": %u, \"subdevice\": %u, \"vaspace\": %u},\n",
           NV01_ROOT_CLIENT, NV01_DEVICE_0, NV20_SUBDEVICE_0, FERMI_VASPACE_A);
    printf("  \"memory_allocations\": [\n");
    for (unsigned r = 0; r < repeat; r++) {
        for (unsigned i = 0; i < WL_NALLOCS; i++) {
            const wl_alloc *a = &WL_ALLOCS[i];
            print_alloc(r, i, "RM_ALLOC", "ctl", a->hclass, a->size,
                        a->fate == WL_FAILS ? NV_ERR_NO_MEMORY : NV_OK,
                        a->fate == WL_FREED ? "freed" : a->fate == WL_KEPT ? "kept" : "failed",
                        a->role, 0);
        }
        print_alloc(r, WL_IDX_OSDESC, "RM_ALLOC_MEMORY", "gpu", NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
                    WL_OSDESC_SIZE, NV_OK, "freed", "OS descriptor of a user buffer", 0);
        print_alloc(r, WL_IDX_DUP, "RM_DUP_OBJECT", "ctl", WL_ALLOCS[WL_IDX_DUP_SRC].hclass,
                    WL_ALLOCS[WL_IDX_DUP_SRC].size, NV_OK, "freed",
                    "duplicate of index 1: shares its memory, freeing it frees no bytes",
                    r + 1 == repeat);
    }
    printf("  ],\n");
    printf("  \"failing_allocations\": %u,\n  \"failing_status\": %u,\n",
           repeat * table_count(WL_FAILS), NV_ERR_NO_MEMORY);
    printf("  \"unfreed_memory_objects\": {\n");
    printf("    \"note\": \"never RM_FREE'd by handle; gone with the client (exit free) or at "
           "nvidiactl close\",\n");
    printf("    \"count\": %u,\n    \"bytes\": %" PRIu64 ",\n",
           repeat * (kept_count[0] + kept_count[1] + kept_count[2]),
           repeat * (kept_bytes[0] + kept_bytes[1] + kept_bytes[2]));
    printf("    \"by_class\": {\"%u\": {\"count\": %u, \"bytes\": %" PRIu64 "}, "
           "\"%u\": {\"count\": %u, \"bytes\": %" PRIu64 "}, "
           "\"%u\": {\"count\": %u, \"bytes\": %" PRIu64 "}},\n",
           NV01_MEMORY_LOCAL_USER, repeat * kept_count[0], repeat * kept_bytes[0],
           NV01_MEMORY_SYSTEM, repeat * kept_count[1], repeat * kept_bytes[1],
           NV50_MEMORY_VIRTUAL, repeat * kept_count[2], repeat * kept_bytes[2]);
    printf("    \"handles\": [");
    int first = 1;
    for (unsigned r = 0; r < repeat; r++)
        for (unsigned i = 0; i < WL_NALLOCS; i++)
            if (WL_ALLOCS[i].fate == WL_KEPT) {
                printf("%s%u", first ? "" : ", ", mem_handle(r, i));
                first = 0;
            }
    printf("]\n  },\n");
    printf("  \"managed_mmap\": {\"device\": \"uvm\", \"address\": %llu, \"length\": %llu, "
           "\"offset\": %llu, \"prot\": \"PROT_READ|PROT_WRITE\", \"flags\": \"MAP_SHARED|MAP_FIXED\"},\n",
           WL_MANAGED_ADDR, WL_MANAGED_LEN, WL_MANAGED_ADDR);
    printf("  \"gpu_mmaps\": {\"device\": \"gpu\", \"count\": %u, \"length\": %" PRIu64 ", "
           "\"offset\": \"pLinearAddress returned by RM_MAP_MEMORY\"},\n",
           repeat, WL_ALLOCS[WL_IDX_RM_MAP].size);
    printf("  \"semaphore_pool\": {\"base\": %llu, \"length\": %llu, \"uvm_freed\": false},\n",
           WL_SEMA_BASE, WL_SEMA_LEN);
    printf("  \"uvm_external_ranges\": [");
    for (unsigned r = 0; r < repeat; r++)
        printf("%s\n    {\"base\": %llu, \"length\": %" PRIu64 ", \"hMemory\": %u, \"uvm_freed\": true}",
               r ? "," : "", WL_EXT_BASE + r * WL_EXT_STRIDE, WL_ALLOCS[WL_IDX_UVM_EXT].size,
               mem_handle(r, WL_IDX_UVM_EXT));
    printf("\n  ],\n");
    printf("  \"rm_controls\": [{\"cmd\": %u, \"object\": %u}, {\"cmd\": %u, \"object\": %u}, "
           "{\"cmd\": %u, \"object\": %u, \"via_dup_fd\": true}],\n",
           NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES, WL_H_DEVICE, NV2080_CTRL_CMD_FB_GET_INFO_V2,
           WL_H_SUBDEVICE, NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES, WL_H_DEVICE);
    printf("  \"uvm_mm_initialize_status\": %u,\n", NV_WARN_NOTHING_TO_DO);
    printf("  \"opens\": {\"ctl\": 1, \"gpu\": 1, \"uvm\": 2}, \"dups_of_ctl\": 1\n");
    printf("}\n");
}

/* ------------------------------------------------------------------ */
/* The run                                                              */
/* ------------------------------------------------------------------ */

struct wl {
    int ctl, gpu, uvm;
    NvHandle client;
};

static int open_dev(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        die("open %s: %s", path, strerror(errno));
    return fd;
}

static NV_STATUS rm_alloc64(struct wl *w, NvHandle parent, NvHandle h, NvU32 hclass, void *params)
{
    NVOS64_PARAMETERS p = {
        .hRoot = w->client, .hObjectParent = parent, .hObjectNew = h, .hClass = hclass,
        .pAllocParms = (uintptr_t)params, .paramsSize = 0, /* as libcuda: the class decides */
    };
    xioctl(w->ctl, D_CTL, C_RM_ALLOC, NV_IOCTL_RM_ALLOC_NVOS64, &p);
    if (p.status == NV_OK)
        want("RM_ALLOC hObjectNew", p.hObjectNew, h);
    return p.status;
}

static void rm_free(struct wl *w, NvHandle parent, NvHandle h)
{
    NVOS00_PARAMETERS p = {.hRoot = w->client, .hObjectParent = parent, .hObjectOld = h};
    xioctl(w->ctl, D_CTL, C_RM_FREE, NV_IOCTL_RM_FREE, &p);
    want("RM_FREE status", p.status, NV_OK);
}

static void rm_control(struct wl *w, int fd, NvHandle obj, NvU32 cmd, void *params, NvU32 size)
{
    NVOS54_PARAMETERS p = {
        .hClient = w->client, .hObject = obj, .cmd = cmd, .params = (uintptr_t)params,
        .paramsSize = size,
    };
    xioctl(fd, D_CTL, C_RM_CONTROL, NV_IOCTL_RM_CONTROL, &p);
    want("RM_CONTROL status", p.status, NV_OK);
}

static void get_num_subdevices(struct wl *w, int fd)
{
    NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS p = {0};
    rm_control(w, fd, WL_H_DEVICE, NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES, &p, sizeof p);
    want("numSubDevices", p.numSubDevices, 1);
}

static void uvm_call(int fd, enum wl_cmd c, unsigned long cmd, void *params, NV_STATUS *rmStatus,
                     NV_STATUS expect)
{
    *rmStatus = 0xdeadbeef; /* proves the driver wrote it */
    xioctl(fd, D_UVM, c, cmd, params);
    char what[64];
    snprintf(what, sizeof what, "%s rmStatus", CMD_NAME[c]);
    want(what, *rmStatus, expect);
}

static void alloc_section(struct wl *w, unsigned r)
{
    static NV_MEMORY_ALLOCATION_PARAMS ap[WL_NALLOCS];
    for (unsigned i = 0; i < WL_NALLOCS; i++) {
        const wl_alloc *a = &WL_ALLOCS[i];
        memset(&ap[i], 0, sizeof ap[i]);
        ap[i].owner = w->client;
        ap[i].flags = a->flags;
        ap[i].attr = a->attr;
        ap[i].attr2 = a->attr2;
        ap[i].size = a->size;
        ap[i].hVASpace = a->hclass == NV50_MEMORY_VIRTUAL ? WL_H_VASPACE : 0;
        NV_STATUS st = rm_alloc64(w, WL_H_DEVICE, mem_handle(r, i), a->hclass, &ap[i]);
        want("RM_ALLOC memory status", st, a->fate == WL_FAILS ? NV_ERR_NO_MEMORY : NV_OK);
        if (st == NV_OK) {
            want("NV_MEMORY_ALLOCATION_PARAMS.size", ap[i].size, a->size);
            want("NV_MEMORY_ALLOCATION_PARAMS.limit", ap[i].limit, a->size - 1);
        }
    }

    /* CPU mapping of the sysmem object: RM_MAP_MEMORY names nvidia0, then mmap it. */
    nv_ioctl_nvos33_parameters_with_fd mp = {
        .params = {.hClient = w->client, .hDevice = WL_H_DEVICE,
                   .hMemory = mem_handle(r, WL_IDX_RM_MAP), .offset = 0,
                   .length = WL_ALLOCS[WL_IDX_RM_MAP].size},
        .fd = w->gpu,
    };
    xioctl(w->ctl, D_CTL, C_RM_MAP_MEMORY, NV_IOCTL_RM_MAP_MEMORY, &mp);
    want("RM_MAP_MEMORY status", mp.params.status, NV_OK);
    size_t maplen = (size_t)WL_ALLOCS[WL_IDX_RM_MAP].size;
    volatile unsigned char *cpu = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, w->gpu,
                                       (off_t)mp.params.pLinearAddress);
    if (cpu == MAP_FAILED)
        die("mmap nvidia0 at 0x%" PRIx64 ": %s", (uint64_t)mp.params.pLinearAddress, strerror(errno));
    cpu[0] = 0x5a;
    want("sysmem mapping readback", cpu[0], 0x5a);
    if (munmap((void *)cpu, maplen))
        die("munmap nvidia0: %s", strerror(errno));
    NVOS34_PARAMETERS up = {.hClient = w->client, .hDevice = WL_H_DEVICE,
                            .hMemory = mem_handle(r, WL_IDX_RM_MAP),
                            .pLinearAddress = mp.params.pLinearAddress};
    xioctl(w->ctl, D_CTL, C_RM_UNMAP_MEMORY, NV_IOCTL_RM_UNMAP_MEMORY, &up);
    want("RM_UNMAP_MEMORY status", up.status, NV_OK);

    /* An OS descriptor of a user buffer, on /dev/nvidia0 as the driver insists. */
    static unsigned char osbuf[WL_OSDESC_SIZE] __attribute__((aligned(4096)));
    nv_ioctl_nvos02_parameters_with_fd op = {
        .params = {.hRoot = w->client, .hObjectParent = WL_H_DEVICE,
                   .hObjectNew = mem_handle(r, WL_IDX_OSDESC),
                   .hClass = NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, .pMemory = (uintptr_t)osbuf,
                   .limit = WL_OSDESC_SIZE - 1},
        .fd = -1,
    };
    xioctl(w->gpu, D_GPU, C_RM_ALLOC_MEMORY, NV_IOCTL_RM_ALLOC_MEMORY, &op);
    want("RM_ALLOC_MEMORY status", op.params.status, NV_OK);
    want("RM_ALLOC_MEMORY hObjectNew", op.params.hObjectNew, mem_handle(r, WL_IDX_OSDESC));

    /* A second handle on the leaked 64 MiB object, freed again: no bytes move. */
    NVOS55_PARAMETERS dp = {.hClient = w->client, .hParent = WL_H_DEVICE,
                            .hObject = mem_handle(r, WL_IDX_DUP), .hClientSrc = w->client,
                            .hObjectSrc = mem_handle(r, WL_IDX_DUP_SRC)};
    xioctl(w->ctl, D_CTL, C_RM_DUP_OBJECT, NV_IOCTL_RM_DUP_OBJECT, &dp);
    want("RM_DUP_OBJECT status", dp.status, NV_OK);
    want("RM_DUP_OBJECT hObject", dp.hObject, mem_handle(r, WL_IDX_DUP));
    rm_free(w, WL_H_DEVICE, mem_handle(r, WL_IDX_DUP));

    /* cuMemAlloc's UVM half and cuMemFree (facts section 10). */
    static UVM_CREATE_EXTERNAL_RANGE_PARAMS cr;
    static UVM_MAP_EXTERNAL_ALLOCATION_PARAMS me;
    static UVM_FREE_PARAMS fr;
    uint64_t base = WL_EXT_BASE + r * WL_EXT_STRIDE, len = WL_ALLOCS[WL_IDX_UVM_EXT].size;
    memset(&cr, 0, sizeof cr);
    cr.base = base;
    cr.length = len;
    uvm_call(w->uvm, C_UVM_CREATE_EXTERNAL_RANGE, UVM_CREATE_EXTERNAL_RANGE, &cr, &cr.rmStatus, NV_OK);
    memset(&me, 0, sizeof me);
    me.base = base;
    me.length = len;
    me.perGpuAttributes[0].gpuUuid = GPU0;
    me.gpuAttributesCount = 1;
    me.rmCtrlFd = w->ctl;
    me.hClient = w->client;
    me.hMemory = mem_handle(r, WL_IDX_UVM_EXT);
    uvm_call(w->uvm, C_UVM_MAP_EXTERNAL_ALLOCATION, UVM_MAP_EXTERNAL_ALLOCATION, &me, &me.rmStatus,
             NV_OK);
    memset(&fr, 0, sizeof fr);
    fr.base = base;
    fr.length = len;
    uvm_call(w->uvm, C_UVM_FREE, UVM_FREE, &fr, &fr.rmStatus, NV_OK);

    for (unsigned i = 0; i < WL_NALLOCS; i++)
        if (WL_ALLOCS[i].fate == WL_FREED)
            rm_free(w, WL_H_DEVICE, mem_handle(r, i));
    rm_free(w, WL_H_DEVICE, mem_handle(r, WL_IDX_OSDESC));
}

static void managed_section(struct wl *w)
{
    void *p = mmap((void *)WL_MANAGED_ADDR, WL_MANAGED_LEN, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, w->uvm, (off_t)WL_MANAGED_ADDR);
    if (p == MAP_FAILED)
        die("managed mmap: %s", strerror(errno));
    want("managed mmap address", (uintptr_t)p, WL_MANAGED_ADDR);

    UVM_SET_PREFERRED_LOCATION_PARAMS pl = {.requestedBase = WL_MANAGED_ADDR,
                                            .length = WL_MANAGED_LEN, .preferredLocation = GPU0,
                                            .preferredCpuNumaNode = -1};
    uvm_call(w->uvm, C_UVM_SET_PREFERRED_LOCATION, UVM_SET_PREFERRED_LOCATION, &pl, &pl.rmStatus,
             NV_OK);
    UVM_SET_ACCESSED_BY_PARAMS ab = {.requestedBase = WL_MANAGED_ADDR, .length = WL_MANAGED_LEN,
                                     .accessedByUuid = GPU0};
    uvm_call(w->uvm, C_UVM_SET_ACCESSED_BY, UVM_SET_ACCESSED_BY, &ab, &ab.rmStatus, NV_OK);

    /* CPU faults on the managed range: one write per 2 MiB VA block. */
    volatile unsigned char *m = p;
    for (uint64_t off = 0; off < WL_MANAGED_LEN; off += 2 * WL_MIB)
        m[off] = 0xa5;
    for (uint64_t off = 0; off < WL_MANAGED_LEN; off += 2 * WL_MIB)
        want("managed readback", m[off], 0xa5);

    UVM_MIGRATE_PARAMS mg = {.base = WL_MANAGED_ADDR, .length = WL_MANAGED_LEN,
                             .destinationUuid = GPU0, .cpuNumaNode = -1};
    uvm_call(w->uvm, C_UVM_MIGRATE, UVM_MIGRATE, &mg, &mg.rmStatus, NV_OK);
    if (munmap(p, WL_MANAGED_LEN))
        die("managed munmap: %s", strerror(errno));
}

static int run(const char *dir, int wait_for_go, unsigned repeat, int exit_free)
{
    struct wl w;
    w.ctl = open_dev(dir, "nvidiactl");
    w.gpu = open_dev(dir, "nvidia0");
    w.uvm = open_dev(dir, "nvidia-uvm");

    /* libcuda's root client: NVOS21, class 0, handle chosen by the driver. */
    NVOS21_PARAMETERS cp = {0};
    xioctl(w.ctl, D_CTL, C_RM_ALLOC, NV_IOCTL_RM_ALLOC_NVOS21, &cp);
    want("client alloc status", cp.status, NV_OK);
    want("client class written back", cp.hClass, NV01_ROOT_CLIENT);
    if (!cp.hObjectNew)
        die("client alloc returned handle 0");
    w.client = cp.hObjectNew;

    if (wait_for_go) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            die("--wait: stdin closed before the go line");
    }

    NV0080_ALLOC_PARAMETERS dev = {.deviceId = 0};
    want("device alloc", rm_alloc64(&w, w.client, WL_H_DEVICE, NV01_DEVICE_0, &dev), NV_OK);
    NV2080_ALLOC_PARAMETERS sub = {.subDeviceId = 0};
    want("subdevice alloc", rm_alloc64(&w, WL_H_DEVICE, WL_H_SUBDEVICE, NV20_SUBDEVICE_0, &sub), NV_OK);
    NV_VASPACE_ALLOCATION_PARAMETERS vas = {0};
    want("vaspace alloc", rm_alloc64(&w, WL_H_DEVICE, WL_H_VASPACE, FERMI_VASPACE_A, &vas), NV_OK);

    get_num_subdevices(&w, w.ctl);
    static NV2080_CTRL_FB_GET_INFO_V2_PARAMS fb;
    rm_control(&w, w.ctl, WL_H_SUBDEVICE, NV2080_CTRL_CMD_FB_GET_INFO_V2, &fb, sizeof fb);

    /* UVM set-up as at context creation. */
    UVM_INITIALIZE_PARAMS ini = {.flags = 0};
    uvm_call(w.uvm, C_UVM_INITIALIZE, UVM_INITIALIZE, &ini, &ini.rmStatus, NV_OK);
    int uvm2 = open_dev(dir, "nvidia-uvm");
    UVM_MM_INITIALIZE_PARAMS mmi = {.uvmFd = w.uvm};
    uvm_call(uvm2, C_UVM_MM_INITIALIZE, UVM_MM_INITIALIZE, &mmi, &mmi.rmStatus,
             NV_WARN_NOTHING_TO_DO);
    close(uvm2);
    UVM_REGISTER_GPU_PARAMS rg = {.gpu_uuid = GPU0, .rmCtrlFd = -1, .hClient = 0};
    uvm_call(w.uvm, C_UVM_REGISTER_GPU, UVM_REGISTER_GPU, &rg, &rg.rmStatus, NV_OK);
    UVM_REGISTER_GPU_VASPACE_PARAMS rv = {.gpuUuid = GPU0, .rmCtrlFd = w.ctl, .hClient = w.client,
                                          .hVaSpace = WL_H_VASPACE};
    uvm_call(w.uvm, C_UVM_REGISTER_GPU_VASPACE, UVM_REGISTER_GPU_VASPACE, &rv, &rv.rmStatus, NV_OK);
    UVM_PAGEABLE_MEM_ACCESS_PARAMS pma = {0};
    uvm_call(w.uvm, C_UVM_PAGEABLE_MEM_ACCESS, UVM_PAGEABLE_MEM_ACCESS, &pma, &pma.rmStatus, NV_OK);
    static UVM_ALLOC_SEMAPHORE_POOL_PARAMS sp;
    sp.base = WL_SEMA_BASE;
    sp.length = WL_SEMA_LEN;
    sp.perGpuAttributes[0].gpuUuid = GPU0;
    sp.gpuAttributesCount = 1;
    uvm_call(w.uvm, C_UVM_ALLOC_SEMAPHORE_POOL, UVM_ALLOC_SEMAPHORE_POOL, &sp, &sp.rmStatus, NV_OK);

    for (unsigned r = 0; r < repeat; r++)
        alloc_section(&w, r);

    managed_section(&w);

    /* A dup'ed nvidiactl fd is the same open file: the client is usable through it. */
    int ctl2 = dup(w.ctl);
    if (ctl2 < 0)
        die("dup: %s", strerror(errno));
    get_num_subdevices(&w, ctl2);
    close(ctl2);

    /* Freeing the client frees the leaked objects with it; without this, closing
     * nvidiactl does the same inside the driver with no RM_FREE to see. */
    if (exit_free)
        rm_free(&w, w.client, w.client);

    close(w.uvm);
    close(w.gpu);
    close(w.ctl);

    counts_t e;
    expected_counts(e, repeat, exit_free);
    int bad = 0;
    for (int d = 0; d < NDEV; d++)
        for (int c = 0; c < NCMD; c++)
            if (issued[d][c] != e[d][c]) {
                fprintf(stderr, "workload: self-check: %s on %s issued %u, expected %u\n",
                        CMD_NAME[c], DEV_NAME[d], issued[d][c], e[d][c]);
                bad = 1;
            }
    if (bad)
        return 3;
    printf("DONE\n");
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: workload DEVDIR [--wait] [--repeat N] [--no-exit-free]\n"
            "       workload --print-expected [--repeat N] [--no-exit-free]\n"
            "TEST STAND-IN workload for gputrace: known NVIDIA ioctls against DEVDIR.\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int wait_for_go = 0, exit_free = 1, print = 0;
    unsigned long repeat = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait")) {
            wait_for_go = 1;
        } else if (!strcmp(argv[i], "--no-exit-free")) {
            exit_free = 0;
        } else if (!strcmp(argv[i], "--print-expected")) {
            print = 1;
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            char *end;
            repeat = strtoul(argv[++i], &end, 10);
            /* handles must stay inside one 0x100-stride block per repetition */
            if (*end || repeat < 1 || repeat > 0xff00)
                usage();
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            usage();
        }
    }
    if (print) {
        print_expected((unsigned)repeat, exit_free);
        return 0;
    }
    if (!dir)
        usage();
    return run(dir, wait_for_go, (unsigned)repeat, exit_free);
}
