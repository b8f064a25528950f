/*
 * TEST STAND-IN -- NOT NVIDIA CODE, NOT THE CUDA DRIVER, RUNS NO GPU WORK.
 *
 * libcuda_standin.c, built as libcuda.so.1: a stand-in for the CUDA driver library
 * that exports the memory-management part of the CUDA driver API with the real
 * signatures (see cuda_standin.h), so that gputrace's API-layer uprobes and user
 * stack walks can be tested without NVIDIA hardware.
 *
 * When GPUTRACE_STANDIN_DEVDIR names a folder holding `nvidiactl`, `nvidiaN` and
 * `nvidia-uvm` (the FUSE stand-in driver of tests/standin/), it talks to them the way
 * the real libcuda talks to the real driver (docs/driver-facts.md section 10):
 *   cuInit:        open nvidiactl, RM_ALLOC root client (NVOS21, class 0),
 *                  open nvidia-uvm, UVM_INITIALIZE
 *   cuCtxCreate:   open nvidiaN, RM_ALLOC device 0x80, subdevice 0x2080,
 *                  VA space 0x90F1 (NVOS64), UVM_REGISTER_GPU, UVM_REGISTER_GPU_VASPACE
 *   device memory: small requests are carved out of 2 MiB RM allocations (class 0x40),
 *                  big ones get their own RM allocation rounded up to 2 MiB; each new
 *                  RM block gets UVM_CREATE_EXTERNAL_RANGE + UVM_MAP_EXTERNAL_ALLOCATION
 *                  at its device VA, and a block that becomes empty gets UVM_FREE + RM_FREE
 *   managed:       mmap(addr, len, RW, MAP_SHARED|MAP_FIXED, uvm_fd, offset = addr)
 *   pinned host:   anonymous mmap + RM_ALLOC_MEMORY class 0x71 on nvidiaN; RM_FREE + munmap
 *   VMM:           cuMemCreate = RM_ALLOC 0x40; cuMemMap = CREATE_EXTERNAL_RANGE +
 *                  MAP_EXTERNAL_ALLOCATION; cuMemUnmap = UVM_FREE; cuMemRelease = RM_FREE
 * Without GPUTRACE_STANDIN_DEVDIR it issues no driver traffic and only keeps the books.
 * Device pointers come from a PROT_NONE reservation in the process, as CUDA's do.
 *
 * GPUTRACE_STANDIN_CUDA_MAX: largest single allocation in bytes (K/M/G/T suffix allowed,
 *   default 1 GiB); bigger requests fail with CUDA_ERROR_OUT_OF_MEMORY before any ioctl.
 * GPUTRACE_STANDIN_CUDA_LOG=1: one line per driver operation on stderr
 *   ("standin-cuda: drv OP key=value ..."), also in bookkeeping mode (with dry=1).
 *
 * Build: -O1 -g -fno-omit-frame-pointer; every exported function is its own
 * non-inlined, non-cloned body so uprobes and frame-pointer stack walks work.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../standin/nvstandin.h"
#include "cuda_standin.h"

#define CUAPI __attribute__((noinline, noclone, used, visibility("default")))

/* UVM unregister structs: not in nvstandin.h; layouts from facts section 1.3. */
typedef struct {
    NvProcessorUuid gpu_uuid;
    NV_STATUS rmStatus;
} SC_UVM_UNREGISTER_GPU_PARAMS;
NVSA_SIZE(SC_UVM_UNREGISTER_GPU_PARAMS, 20);
NVSA_OFF(SC_UVM_UNREGISTER_GPU_PARAMS, rmStatus, 16);
typedef SC_UVM_UNREGISTER_GPU_PARAMS SC_UVM_UNREGISTER_GPU_VASPACE_PARAMS;
#define SC_UVM_UNREGISTER_GPU_VASPACE 26u
#define SC_UVM_UNREGISTER_GPU 38u

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define BLOCK (2 * MIB)           /* RM allocation and VA granularity */
#define SMALL_MAX (1 * MIB)       /* requests up to this size share 2 MiB blocks */
#define SUB_ALIGN 512ull          /* alignment of carved-out pointers */
#define ARENA_SIZE (256 * GIB)    /* device VA reservation */
#define ARENA_SLOTS (ARENA_SIZE / BLOCK)
#define MAX_GPUS 32
#define STATUS_IOCTL_FAILED 0xFFFFFFFFu /* the ioctl itself returned -1 */

/* Handles this library picks (the root client handle is picked by RM). */
#define H_DEVICE 0xcaf00001u
#define H_SUBDEVICE 0xcaf00002u
#define H_VASPACE 0xcaf00003u
#define H_MEM_FIRST 0xcaf10000u

static const NvU8 GPU_UUID_TEMPLATE[16] = WL_GPU0_UUID;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static int g_log;
static int g_dry = 1;
static char g_devdir[4096];
static unsigned long long g_cap = 1 * GIB;
static int g_ctl_fd = -1, g_uvm_fd = -1, g_dev_fd = -1;
static NvHandle g_client;
static NvHandle g_next_handle = H_MEM_FIRST;
static int g_ngpus = 1;

struct ctx {
    int dev;
    int live;
    NvProcessorUuid uuid;
};
static struct ctx g_ctx;

struct pool {
    int dev;
    int id;
};
static struct pool g_pools[MAX_GPUS];

struct stream {
    unsigned int flags;
    struct stream *next;
};
static struct stream *g_streams;

/* ------------------------------------------------------------------ logging */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    if (!g_log)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 16, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 16)
        n = (int)(sizeof buf - 16);
    n += snprintf(buf + n, 16, "%s\n", g_dry ? " dry=1" : "");
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

/* ------------------------------------------------------------- driver calls */

static NV_STATUS rm_alloc(int nvos21, NvHandle parent, NvHandle *handle, NvU32 hclass, void *params,
                          unsigned long long size_for_log)
{
    NV_STATUS st = NV_OK;
    if (!g_dry) {
        int r;
        if (nvos21) {
            NVOS21_PARAMETERS p = {.hRoot = g_client, .hObjectParent = parent,
                                   .hObjectNew = *handle, .hClass = hclass,
                                   .pAllocParms = (NvU64)(uintptr_t)params, .paramsSize = 0};
            r = ioctl(g_ctl_fd, NV_IOCTL_RM_ALLOC_NVOS21, &p);
            st = r < 0 ? STATUS_IOCTL_FAILED : p.status;
            if (r == 0 && st == NV_OK)
                *handle = p.hObjectNew;
        } else {
            NVOS64_PARAMETERS p = {.hRoot = g_client, .hObjectParent = parent,
                                   .hObjectNew = *handle, .hClass = hclass,
                                   .pAllocParms = (NvU64)(uintptr_t)params, .paramsSize = 0};
            r = ioctl(g_ctl_fd, NV_IOCTL_RM_ALLOC_NVOS64, &p);
            st = r < 0 ? STATUS_IOCTL_FAILED : p.status;
            if (r == 0 && st == NV_OK)
                *handle = p.hObjectNew;
        }
    } else if (*handle == 0) {
        *handle = 0xc1d00000u; /* bookkeeping mode: a made-up client handle */
    }
    logf_("standin-cuda: drv RM_ALLOC class=0x%x parent=0x%x handle=0x%x size=%llu status=0x%x",
          hclass, parent, *handle, size_for_log, st);
    return st;
}

static NV_STATUS rm_free(NvHandle parent, NvHandle handle)
{
    NV_STATUS st = NV_OK;
    if (!g_dry) {
        NVOS00_PARAMETERS p = {.hRoot = g_client, .hObjectParent = parent, .hObjectOld = handle};
        int r = ioctl(g_ctl_fd, NV_IOCTL_RM_FREE, &p);
        st = r < 0 ? STATUS_IOCTL_FAILED : p.status;
    }
    logf_("standin-cuda: drv RM_FREE parent=0x%x handle=0x%x status=0x%x", parent, handle, st);
    return st;
}

static NV_STATUS uvm_call(unsigned long cmd, const char *name, void *params, NV_STATUS *status,
                          unsigned long long base, unsigned long long length)
{
    NV_STATUS st = NV_OK;
    if (!g_dry) {
        int r = ioctl(g_uvm_fd, cmd, params);
        st = r < 0 ? STATUS_IOCTL_FAILED : *status;
    }
    logf_("standin-cuda: drv %s base=0x%llx length=%llu status=0x%x", name, base, length, st);
    return st;
}

static NvHandle new_handle(void)
{
    return g_next_handle++;
}

/* RM vidmem object (class 0x40), the unit of physical device memory. */
static NV_STATUS rm_vidmem_alloc(unsigned long long size, NvHandle *h)
{
    NV_MEMORY_ALLOCATION_PARAMS mp;
    memset(&mp, 0, sizeof mp);
    mp.owner = 0x43554441u; /* "CUDA" */
    mp.type = 0;            /* NVOS32_TYPE_IMAGE */
    mp.attr = NVOS32_ATTR_PAGE_SIZE_HUGE;
    mp.attr2 = NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB;
    mp.size = size;
    mp.alignment = BLOCK;
    *h = new_handle();
    return rm_alloc(0, H_DEVICE, h, NV01_MEMORY_LOCAL_USER, &mp, size);
}

/* Make [base, base+len) a UVM external range backed by RM object h. */
static NV_STATUS uvm_map_external(unsigned long long base, unsigned long long len, NvHandle h)
{
    UVM_CREATE_EXTERNAL_RANGE_PARAMS cp = {.base = base, .length = len};
    NV_STATUS st = uvm_call(UVM_CREATE_EXTERNAL_RANGE, "UVM_CREATE_EXTERNAL_RANGE", &cp,
                            &cp.rmStatus, base, len);
    if (st != NV_OK)
        return st;
    static UVM_MAP_EXTERNAL_ALLOCATION_PARAMS mp; /* 9 KiB: not on the stack; under g_lock */
    memset(&mp, 0, sizeof mp);
    mp.base = base;
    mp.length = len;
    mp.offset = 0;
    mp.perGpuAttributes[0].gpuUuid = g_ctx.uuid;
    mp.gpuAttributesCount = 1;
    mp.rmCtrlFd = g_ctl_fd;
    mp.hClient = g_client;
    mp.hMemory = h;
    st = uvm_call(UVM_MAP_EXTERNAL_ALLOCATION, "UVM_MAP_EXTERNAL_ALLOCATION", &mp, &mp.rmStatus,
                  base, len);
    if (st != NV_OK) {
        UVM_FREE_PARAMS fp = {.base = base, .length = len};
        uvm_call(UVM_FREE, "UVM_FREE", &fp, &fp.rmStatus, base, len);
    }
    return st;
}

static void uvm_free_range(unsigned long long base, unsigned long long len)
{
    UVM_FREE_PARAMS fp = {.base = base, .length = len};
    uvm_call(UVM_FREE, "UVM_FREE", &fp, &fp.rmStatus, base, len);
}

static CUresult status_to_cu(NV_STATUS st)
{
    if (st == NV_OK)
        return CUDA_SUCCESS;
    if (st == NV_ERR_NO_MEMORY)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (st == STATUS_IOCTL_FAILED)
        return CUDA_ERROR_OPERATING_SYSTEM;
    return CUDA_ERROR_UNKNOWN;
}

/* ------------------------------------------------------ device VA arena */

static uintptr_t g_arena;
static uint64_t g_slots[ARENA_SLOTS / 64]; /* bit set = 2 MiB slot in use */

static int arena_init(void)
{
    if (g_arena)
        return 0;
    size_t len = ARENA_SIZE + BLOCK;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    uintptr_t a = ((uintptr_t)p + BLOCK - 1) & ~(uintptr_t)(BLOCK - 1);
    if (a > (uintptr_t)p)
        munmap(p, a - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + len;
    if (end > a + ARENA_SIZE)
        munmap((void *)(a + ARENA_SIZE), end - (a + ARENA_SIZE));
    g_arena = a;
    return 0;
}

static int slot_used(size_t i)
{
    return (int)((g_slots[i / 64] >> (i % 64)) & 1u);
}

static void slots_set(size_t first, size_t n, int used)
{
    for (size_t i = first; i < first + n; i++) {
        if (used)
            g_slots[i / 64] |= 1ull << (i % 64);
        else
            g_slots[i / 64] &= ~(1ull << (i % 64));
    }
}

/* First fit of n slots aligned to align_slots; returns the VA or 0. */
static unsigned long long va_alloc(unsigned long long bytes, unsigned long long align)
{
    if (arena_init() != 0 || bytes == 0 || bytes > ARENA_SIZE)
        return 0;
    size_t n = (size_t)((bytes + BLOCK - 1) / BLOCK);
    size_t al = align > BLOCK ? (size_t)(align / BLOCK) : 1;
    for (size_t i = 0; i + n <= ARENA_SLOTS; i += al) {
        size_t j = 0;
        while (j < n && !slot_used(i + j))
            j++;
        if (j == n) {
            slots_set(i, n, 1);
            return (unsigned long long)(g_arena + i * BLOCK);
        }
        /* skip past the used slot, rounded up to the alignment */
        i = ((i + j + 1 + al - 1) / al) * al - al;
    }
    return 0;
}

static void va_free(unsigned long long va, unsigned long long bytes)
{
    size_t first = (size_t)((va - g_arena) / BLOCK);
    size_t n = (size_t)((bytes + BLOCK - 1) / BLOCK);
    slots_set(first, n, 0);
}

static int va_range_free(unsigned long long va, unsigned long long bytes)
{
    if (!g_arena || va < g_arena || va % BLOCK || va + bytes > g_arena + ARENA_SIZE)
        return 0;
    size_t first = (size_t)((va - g_arena) / BLOCK);
    size_t n = (size_t)((bytes + BLOCK - 1) / BLOCK);
    for (size_t i = first; i < first + n; i++)
        if (slot_used(i))
            return 0;
    return 1;
}

/* ------------------------------------------------------- allocation books */

enum kind { K_DEVICE, K_MANAGED, K_HOST };

struct block;
struct alloc {
    unsigned long long ptr;
    unsigned long long size;     /* bytes occupied (rounded) */
    unsigned long long req;      /* bytes requested */
    enum kind kind;
    struct block *blk;           /* K_DEVICE */
    NvHandle h;                  /* K_HOST: RM object */
    struct alloc *hnext;         /* hash chain */
    struct alloc *bnext;         /* block's list, sorted by ptr */
};

struct block {
    unsigned long long va, size;
    NvHandle h;
    int pool;                    /* 0 = cuMemAlloc heap, 1 = default mem pool (async) */
    int dedicated;
    struct alloc *allocs;
    struct block *next;
};
static struct block *g_blocks;

#define HBUCKETS 65536
static struct alloc *g_hash[HBUCKETS];

static size_t hslot(unsigned long long p)
{
    return (size_t)((p >> 9) ^ (p >> 25)) & (HBUCKETS - 1);
}

static void hash_put(struct alloc *a)
{
    size_t s = hslot(a->ptr);
    a->hnext = g_hash[s];
    g_hash[s] = a;
}

static struct alloc *hash_take(unsigned long long p, int remove)
{
    struct alloc **pp = &g_hash[hslot(p)];
    for (; *pp; pp = &(*pp)->hnext) {
        if ((*pp)->ptr == p) {
            struct alloc *a = *pp;
            if (remove)
                *pp = a->hnext;
            return a;
        }
    }
    return NULL;
}

static unsigned long long round_up(unsigned long long v, unsigned long long a)
{
    return (v + a - 1) / a * a;
}

/* Find room for sz bytes in b; return the offset or -1. Links a into the list. */
static long long block_fit(struct block *b, struct alloc *a, unsigned long long sz)
{
    unsigned long long off = 0;
    struct alloc **pp = &b->allocs;
    for (;;) {
        unsigned long long end = *pp ? (*pp)->ptr - b->va : b->size;
        if (end >= off && end - off >= sz) {
            a->bnext = *pp;
            *pp = a;
            return (long long)off;
        }
        if (!*pp)
            return -1;
        off = (*pp)->ptr - b->va + (*pp)->size;
        pp = &(*pp)->bnext;
    }
}

static void block_unlink(struct block *b, struct alloc *a)
{
    for (struct alloc **pp = &b->allocs; *pp; pp = &(*pp)->bnext)
        if (*pp == a) {
            *pp = a->bnext;
            return;
        }
}

static CUresult block_new(unsigned long long size, int pool, int dedicated, struct block **out)
{
    NvHandle h;
    NV_STATUS st = rm_vidmem_alloc(size, &h);
    if (st != NV_OK)
        return status_to_cu(st);
    unsigned long long va = va_alloc(size, BLOCK);
    if (!va) {
        rm_free(H_DEVICE, h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    st = uvm_map_external(va, size, h);
    if (st != NV_OK) {
        va_free(va, size);
        rm_free(H_DEVICE, h);
        return status_to_cu(st);
    }
    struct block *b = calloc(1, sizeof *b);
    if (!b) {
        uvm_free_range(va, size);
        va_free(va, size);
        rm_free(H_DEVICE, h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->va = va;
    b->size = size;
    b->h = h;
    b->pool = pool;
    b->dedicated = dedicated;
    b->next = g_blocks;
    g_blocks = b;
    *out = b;
    return CUDA_SUCCESS;
}

static void block_release(struct block *b)
{
    uvm_free_range(b->va, b->size);
    rm_free(H_DEVICE, b->h);
    va_free(b->va, b->size);
    for (struct block **pp = &g_blocks; *pp; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    free(b);
}

static CUresult check_ctx(void)
{
    if (!g_inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!g_ctx.live)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

static CUresult device_alloc(CUdeviceptr *dptr, unsigned long long req, int pool)
{
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        return r;
    if (!dptr || req == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (req > g_cap)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long sz = round_up(req, SUB_ALIGN);
    struct block *b = NULL;
    long long off = -1;
    if (sz <= SMALL_MAX) {
        /* oldest block first, so carving is deterministic */
        struct block *cand[4096];
        size_t nc = 0;
        for (struct block *x = g_blocks; x && nc < 4096; x = x->next)
            if (!x->dedicated && x->pool == pool)
                cand[nc++] = x;
        while (nc > 0 && off < 0) {
            b = cand[--nc];
            off = block_fit(b, a, sz);
        }
        if (off < 0) {
            r = block_new(BLOCK, pool, 0, &b);
            if (r != CUDA_SUCCESS) {
                free(a);
                return r;
            }
            off = block_fit(b, a, sz);
        }
    } else {
        sz = round_up(req, BLOCK);
        r = block_new(sz, pool, 1, &b);
        if (r != CUDA_SUCCESS) {
            free(a);
            return r;
        }
        off = block_fit(b, a, sz);
    }
    a->ptr = b->va + (unsigned long long)off;
    a->size = sz;
    a->req = req;
    a->kind = K_DEVICE;
    a->blk = b;
    hash_put(a);
    *dptr = a->ptr;
    return CUDA_SUCCESS;
}

static void managed_release(struct alloc *a);

static CUresult any_free(CUdeviceptr p, int allow_device, int allow_managed, int allow_host)
{
    if (!g_inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc *a = hash_take(p, 0);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    if ((a->kind == K_DEVICE && !allow_device) || (a->kind == K_MANAGED && !allow_managed) ||
        (a->kind == K_HOST && !allow_host))
        return CUDA_ERROR_INVALID_VALUE;
    hash_take(p, 1);
    if (a->kind == K_DEVICE) {
        struct block *b = a->blk;
        block_unlink(b, a);
        if (!b->allocs)
            block_release(b);
    } else if (a->kind == K_MANAGED) {
        managed_release(a);
    } else {
        if (a->h)
            rm_free(H_DEVICE, a->h);
        munmap((void *)(uintptr_t)a->ptr, a->size);
    }
    free(a);
    return CUDA_SUCCESS;
}

static void managed_release(struct alloc *a)
{
    void *addr = (void *)(uintptr_t)a->ptr;
    munmap(addr, a->size);
    logf_("standin-cuda: drv MUNMAP_UVM addr=0x%llx length=%llu", a->ptr, a->size);
    /* keep the VA reserved, as CUDA does, until the slot is handed out again */
    mmap(addr, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    va_free(a->ptr, round_up(a->size, BLOCK));
}

/* ------------------------------------------------------------- VMM books */

struct phys {
    NvHandle h;
    unsigned long long size;
    int maps;
    int released;
    struct phys *next;
};
static struct phys *g_phys;

struct reservation {
    unsigned long long va, size;
    struct reservation *next;
};
static struct reservation *g_resv;

struct mapping {
    unsigned long long va, size;
    struct phys *ph;
    struct mapping *next;
};
static struct mapping *g_maps;

static struct phys *phys_find(CUmemGenericAllocationHandle h)
{
    for (struct phys *p = g_phys; p; p = p->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)p == h)
            return p;
    return NULL;
}

static void phys_maybe_free(struct phys *ph)
{
    if (!ph->released || ph->maps > 0)
        return;
    rm_free(H_DEVICE, ph->h);
    for (struct phys **pp = &g_phys; *pp; pp = &(*pp)->next)
        if (*pp == ph) {
            *pp = ph->next;
            break;
        }
    free(ph);
}

/* --------------------------------------------------------------- set-up */

static unsigned long long parse_size(const char *s, unsigned long long dflt)
{
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case 't': case 'T': v <<= 40; break;
    default: break;
    }
    return v ? v : dflt;
}

static int open_dev(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_devdir, name);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    logf_("standin-cuda: drv OPEN path=%s fd=%d", path, fd);
    return fd;
}

static void close_fds(void)
{
    if (g_uvm_fd >= 0)
        close(g_uvm_fd);
    if (g_ctl_fd >= 0)
        close(g_ctl_fd);
    g_uvm_fd = g_ctl_fd = -1;
}

/* ================================================================ the API */

CUAPI CUresult cuInit(unsigned int Flags)
{
    CUresult r = CUDA_SUCCESS;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (g_inited)
        goto out;
    const char *lg = getenv("GPUTRACE_STANDIN_CUDA_LOG");
    g_log = lg && *lg && strcmp(lg, "0") != 0;
    g_cap = parse_size(getenv("GPUTRACE_STANDIN_CUDA_MAX"), 1 * GIB);
    const char *dd = getenv("GPUTRACE_STANDIN_DEVDIR");
    g_dry = !(dd && *dd);
    if (arena_init() != 0) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    if (!g_dry) {
        snprintf(g_devdir, sizeof g_devdir, "%s", dd);
        g_ngpus = 0;
        for (int i = 0; i < MAX_GPUS; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/nvidia%d", g_devdir, i);
            if (access(path, F_OK) != 0)
                break;
            g_ngpus++;
        }
        g_ctl_fd = open_dev("nvidiactl");
        if (g_ctl_fd < 0 || g_ngpus == 0) {
            close_fds();
            r = CUDA_ERROR_NO_DEVICE;
            goto out;
        }
    }
    g_client = 0;
    NV_STATUS st = rm_alloc(1, 0, &g_client, NV01_ROOT, NULL, 0);
    if (st != NV_OK) {
        close_fds();
        r = CUDA_ERROR_UNKNOWN;
        goto out;
    }
    if (!g_dry) {
        g_uvm_fd = open_dev("nvidia-uvm");
        if (g_uvm_fd < 0) {
            close_fds();
            r = CUDA_ERROR_NO_DEVICE;
            goto out;
        }
    }
    UVM_INITIALIZE_PARAMS ip = {.flags = 0};
    st = uvm_call(UVM_INITIALIZE, "UVM_INITIALIZE", &ip, &ip.rmStatus, 0, 0);
    if (st != NV_OK) {
        close_fds();
        r = CUDA_ERROR_UNKNOWN;
        goto out;
    }
    g_inited = 1;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/*
 * The small queries below take g_lock like the rest; that also keeps them non-leaf,
 * so they set up a frame at their first instruction like every other entry point.
 */
CUAPI CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *driverVersion = 12080;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_inited)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else
        *count = g_ngpus;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_inited)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (ordinal < 0 || ordinal >= g_ngpus)
        r = CUDA_ERROR_INVALID_DEVICE;
    else
        *device = ordinal;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        r = CUDA_ERROR_NOT_INITIALIZED;
        goto out;
    }
    if (dev < 0 || dev >= g_ngpus) {
        r = CUDA_ERROR_INVALID_DEVICE;
        goto out;
    }
    if (g_ctx.live) { /* one context at a time in this stand-in */
        r = CUDA_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (!g_dry) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%d", dev);
        g_dev_fd = open_dev(name);
        if (g_dev_fd < 0) {
            r = CUDA_ERROR_INVALID_DEVICE;
            goto out;
        }
    }
    NV0080_ALLOC_PARAMETERS dp;
    memset(&dp, 0, sizeof dp);
    dp.deviceId = (NvU32)dev;
    NV2080_ALLOC_PARAMETERS sp = {.subDeviceId = 0};
    NV_VASPACE_ALLOCATION_PARAMETERS vp;
    memset(&vp, 0, sizeof vp);
    NvHandle hd = H_DEVICE, hs = H_SUBDEVICE, hv = H_VASPACE;
    NV_STATUS st = rm_alloc(0, g_client, &hd, NV01_DEVICE_0, &dp, 0);
    if (st == NV_OK)
        st = rm_alloc(0, H_DEVICE, &hs, NV20_SUBDEVICE_0, &sp, 0);
    if (st == NV_OK)
        st = rm_alloc(0, H_DEVICE, &hv, FERMI_VASPACE_A, &vp, 0);
    memcpy(g_ctx.uuid.uuid, GPU_UUID_TEMPLATE, 16);
    g_ctx.uuid.uuid[15] = (NvU8)dev;
    if (st == NV_OK) {
        UVM_REGISTER_GPU_PARAMS rp;
        memset(&rp, 0, sizeof rp);
        rp.gpu_uuid = g_ctx.uuid;
        rp.rmCtrlFd = -1;
        rp.hClient = 0;
        st = uvm_call(UVM_REGISTER_GPU, "UVM_REGISTER_GPU", &rp, &rp.rmStatus, 0, 0);
    }
    if (st == NV_OK) {
        UVM_REGISTER_GPU_VASPACE_PARAMS vs;
        memset(&vs, 0, sizeof vs);
        vs.gpuUuid = g_ctx.uuid;
        vs.rmCtrlFd = g_ctl_fd;
        vs.hClient = g_client;
        vs.hVaSpace = H_VASPACE;
        st = uvm_call(UVM_REGISTER_GPU_VASPACE, "UVM_REGISTER_GPU_VASPACE", &vs, &vs.rmStatus,
                      0, 0);
    }
    if (st != NV_OK) {
        rm_free(g_client, H_DEVICE); /* frees the subtree */
        if (g_dev_fd >= 0)
            close(g_dev_fd);
        g_dev_fd = -1;
        r = status_to_cu(st);
        goto out;
    }
    g_ctx.dev = dev;
    g_ctx.live = 1;
    *pctx = (CUcontext)(void *)&g_ctx;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        r = CUDA_ERROR_NOT_INITIALIZED;
        goto out;
    }
    if (ctx != (CUcontext)(void *)&g_ctx || !g_ctx.live) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        goto out;
    }
    /* Everything the context still owns goes, as with the real driver. */
    for (size_t i = 0; i < HBUCKETS; i++) {
        while (g_hash[i]) {
            unsigned long long p = g_hash[i]->ptr;
            any_free(p, 1, 1, 1);
        }
    }
    while (g_maps) {
        struct mapping *m = g_maps;
        g_maps = m->next;
        uvm_free_range(m->va, m->size);
        m->ph->maps--;
        free(m);
    }
    while (g_phys) {
        g_phys->released = 1;
        phys_maybe_free(g_phys);
    }
    while (g_resv) {
        struct reservation *v = g_resv;
        g_resv = v->next;
        va_free(v->va, v->size);
        free(v);
    }
    SC_UVM_UNREGISTER_GPU_VASPACE_PARAMS uv = {.gpu_uuid = g_ctx.uuid};
    uvm_call(SC_UVM_UNREGISTER_GPU_VASPACE, "UVM_UNREGISTER_GPU_VASPACE", &uv, &uv.rmStatus, 0, 0);
    SC_UVM_UNREGISTER_GPU_PARAMS ug = {.gpu_uuid = g_ctx.uuid};
    uvm_call(SC_UVM_UNREGISTER_GPU, "UVM_UNREGISTER_GPU", &ug, &ug.rmStatus, 0, 0);
    rm_free(H_DEVICE, H_VASPACE);
    rm_free(H_DEVICE, H_SUBDEVICE);
    rm_free(g_client, H_DEVICE);
    if (g_dev_fd >= 0)
        close(g_dev_fd);
    g_dev_fd = -1;
    g_ctx.live = 0;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuCtxSynchronize(void)
{
    return check_ctx();
}

CUAPI CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    if (!phStream || (Flags & ~1u))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        return r;
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->flags = Flags;
    pthread_mutex_lock(&g_lock);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_lock);
    *phStream = (CUstream)(void *)s;
    return CUDA_SUCCESS;
}

/* NULL, CU_STREAM_LEGACY (0x1), CU_STREAM_PER_THREAD (0x2) or a created stream. */
static int stream_ok(CUstream h)
{
    if ((uintptr_t)h <= 2)
        return 1;
    for (struct stream *s = g_streams; s; s = s->next)
        if ((CUstream)(void *)s == h)
            return 1;
    return 0;
}

CUAPI CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    for (struct stream **pp = &g_streams; *pp; pp = &(*pp)->next)
        if ((CUstream)(void *)*pp == hStream) {
            struct stream *s = *pp;
            *pp = s->next;
            free(s);
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuStreamSynchronize(CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = stream_ok(hStream) ? check_ctx() : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = stream_ok(hStream) ? check_ctx() : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------- device memory */

CUAPI CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = device_alloc(dptr, bytesize, 0);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                  size_t Height, unsigned int ElementSizeBytes)
{
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (size_t)round_up(WidthInBytes, SUB_ALIGN);
    if (Height > ~0ull / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    CUresult r = device_alloc(dptr, (unsigned long long)pitch * Height, 0);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

CUAPI CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = any_free(dptr, 1, 1, 0);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        goto out;
    if (bytesize > g_cap) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    unsigned long long len = round_up(bytesize, 4096);
    unsigned long long va = va_alloc(len, BLOCK);
    if (!va) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    void *want = (void *)(uintptr_t)va, *got;
    if (g_dry)
        got = mmap(want, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                   0);
    else
        got = mmap(want, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, g_uvm_fd,
                   (off_t)va);
    logf_("standin-cuda: drv MMAP_UVM addr=0x%llx length=%llu ok=%d", va, len, got == want);
    if (got != want) {
        va_free(va, len);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) {
        munmap(want, len);
        mmap(want, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        va_free(va, len);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    a->ptr = va;
    a->size = len;
    a->req = bytesize;
    a->kind = K_MANAGED;
    hash_put(a);
    *dptr = va;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------ pinned host memory */

static CUresult host_alloc(void **pp, size_t bytesize, unsigned int flags)
{
    if (!pp || bytesize == 0 || (flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        return r;
    if (bytesize > g_cap)
        return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long len = round_up(bytesize, 4096);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    NvHandle h = new_handle();
    NV_STATUS st = NV_OK;
    if (!g_dry) {
        nv_ioctl_nvos02_parameters_with_fd w;
        memset(&w, 0, sizeof w);
        w.params.hRoot = g_client;
        w.params.hObjectParent = H_DEVICE;
        w.params.hObjectNew = h;
        w.params.hClass = NV01_MEMORY_SYSTEM_OS_DESCRIPTOR;
        w.params.flags = 0;
        w.params.pMemory = (NvU64)(uintptr_t)p;
        w.params.limit = len - 1;
        w.fd = g_ctl_fd;
        int rc = ioctl(g_dev_fd, NV_IOCTL_RM_ALLOC_MEMORY, &w);
        st = rc < 0 ? STATUS_IOCTL_FAILED : w.params.status;
    }
    logf_("standin-cuda: drv RM_ALLOC_MEMORY class=0x%x parent=0x%x handle=0x%x size=%llu "
          "status=0x%x",
          NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, H_DEVICE, h, len, st);
    if (st != NV_OK) {
        munmap(p, len);
        return status_to_cu(st);
    }
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) {
        rm_free(H_DEVICE, h);
        munmap(p, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ptr = (unsigned long long)(uintptr_t)p;
    a->size = len;
    a->req = bytesize;
    a->kind = K_HOST;
    a->h = h;
    hash_put(a);
    *pp = p;
    return CUDA_SUCCESS;
}

CUAPI CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = host_alloc(pp, bytesize, 0);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = host_alloc(pp, bytesize, Flags);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemFreeHost(void *p)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = any_free((CUdeviceptr)(uintptr_t)p, 0, 0, 1);
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------- virtual memory management */

CUAPI CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                             CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *granularity = BLOCK;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUAPI CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                   CUdeviceptr addr, unsigned long long flags)
{
    (void)flags;
    if (!ptr || size == 0 || size % BLOCK || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        goto out;
    unsigned long long va = 0;
    if (addr && (alignment == 0 || addr % alignment == 0) && va_range_free(addr, size)) {
        va = addr; /* the hint is honoured when that range is free */
        slots_set((size_t)((va - g_arena) / BLOCK), size / BLOCK, 1);
    } else {
        va = va_alloc(size, alignment);
    }
    struct reservation *v = va ? calloc(1, sizeof *v) : NULL;
    if (!v) {
        if (va)
            va_free(va, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    v->va = va;
    v->size = size;
    v->next = g_resv;
    g_resv = v;
    *ptr = va;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (struct reservation **pp = &g_resv; *pp; pp = &(*pp)->next)
        if ((*pp)->va == ptr && (*pp)->size == size) {
            struct reservation *v = *pp;
            *pp = v->next;
            va_free(v->va, v->size);
            free(v);
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || !prop || flags != 0 || size == 0 || size % BLOCK ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult r = check_ctx();
    if (r != CUDA_SUCCESS)
        goto out;
    if (prop->location.id != g_ctx.dev) {
        r = CUDA_ERROR_INVALID_DEVICE;
        goto out;
    }
    if (size > g_cap) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct phys *ph = calloc(1, sizeof *ph);
    if (!ph) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    NV_STATUS st = rm_vidmem_alloc(size, &ph->h);
    if (st != NV_OK) {
        free(ph);
        r = status_to_cu(st);
        goto out;
    }
    ph->size = size;
    ph->next = g_phys;
    g_phys = ph;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct phys *ph = phys_find(handle);
    if (!ph || ph->released) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    ph->released = 1;
    phys_maybe_free(ph); /* RM_FREE now, or at the last cuMemUnmap */
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                        CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (flags != 0 || offset != 0 || size == 0 || size % BLOCK || ptr % BLOCK)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct phys *ph = phys_find(handle);
    if (!ph || ph->released || size > ph->size)
        goto out;
    int inside = 0;
    for (struct reservation *v = g_resv; v; v = v->next)
        if (ptr >= v->va && ptr + size <= v->va + v->size)
            inside = 1;
    for (struct mapping *m = g_maps; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size)
            inside = 0;
    if (!inside)
        goto out;
    struct mapping *m = calloc(1, sizeof *m);
    if (!m) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    NV_STATUS st = uvm_map_external(ptr, size, ph->h);
    if (st != NV_OK) {
        free(m);
        r = status_to_cu(st);
        goto out;
    }
    m->va = ptr;
    m->size = size;
    m->ph = ph;
    m->next = g_maps;
    g_maps = m;
    ph->maps++;
    r = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (struct mapping **pp = &g_maps; *pp; pp = &(*pp)->next)
        if ((*pp)->va == ptr && (*pp)->size == size) {
            struct mapping *m = *pp;
            *pp = m->next;
            uvm_free_range(m->va, m->size);
            m->ph->maps--;
            phys_maybe_free(m->ph);
            free(m);
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                              size_t count)
{
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (struct mapping *m = g_maps; m; m = m->next)
        if (ptr >= m->va && ptr + size <= m->va + m->size)
            r = CUDA_SUCCESS;
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------ stream-ordered allocator */

CUAPI CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        r = CUDA_ERROR_NOT_INITIALIZED;
    } else if (dev < 0 || dev >= g_ngpus) {
        r = CUDA_ERROR_INVALID_DEVICE;
    } else {
        g_pools[dev].dev = dev;
        g_pools[dev].id = 1;
        *pool_out = (CUmemoryPool)(void *)&g_pools[dev];
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

static CUresult async_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, int use_pool,
                            CUstream s)
{
    if (use_pool && (!pool || (struct pool *)(void *)pool != &g_pools[g_ctx.dev] ||
                     g_pools[g_ctx.dev].id != 1))
        return CUDA_ERROR_INVALID_VALUE;
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    return device_alloc(dptr, bytesize, 1);
}

CUAPI CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = async_alloc(dptr, bytesize, NULL, 0, hStream);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = async_alloc(dptr, bytesize, NULL, 0, hStream);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                       CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = async_alloc(dptr, bytesize, pool, 1, hStream);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = async_alloc(dptr, bytesize, pool, 1, hStream);
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* The pool's release threshold is 0 here: freed blocks go back to RM at once. */
CUAPI CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = stream_ok(hStream) ? any_free(dptr, 1, 0, 0) : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUAPI CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    pthread_mutex_lock(&g_lock);
    CUresult r = stream_ok(hStream) ? any_free(dptr, 1, 0, 0) : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_lock);
    return r;
}
