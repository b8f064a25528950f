/*
 * TEST STAND-IN -- NOT NVIDIA CODE, NOT A DRIVER.
 *
 * nvfuse: a FUSE filesystem that plays the NVIDIA driver's device files
 * (nvidiactl, nvidia0..N-1, nvidia-uvm, nvidia-uvm-tools) for gputrace's tests on
 * machines without a GPU. It answers the RM escapes with the driver-580 parameter
 * layouts (nvstandin.h) and keeps real RM-like state: clients, their object trees,
 * handles, per-GPU memory use against a budget, RM mappings and UVM ranges.
 *
 *   nvfuse MOUNTPOINT [--budget BYTES] [--gpus N] [-f] [--verbose]
 *
 * What FUSE allows and what it does not (see README.md):
 *  - The files are regular files, not character devices.
 *  - The kernel copies ioctl data only for "restricted" commands whose word encodes
 *    direction and size. RM commands are _IOWR('F', nr, struct), so their params
 *    arrive here. UVM commands are plain integers: no data arrives, only the pointer.
 *  - Data behind pointers (pAllocParms, control params, UVM params) is read and
 *    written through /proc/<pid>/mem of the calling thread, which is why the server
 *    must run as root (or as the caller's user with ptrace rights).
 *  - mmap never reaches the server: page faults become FUSE reads (zeros) and
 *    dirty pages become FUSE writes (discarded), so mapped memory works but the
 *    stand-in cannot refuse or observe an mmap.
 */
#define FUSE_USE_VERSION 35
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "nvstandin.h"

#define MAX_GPUS 64
#define DEFAULT_BUDGET (16ull << 30)
/*
 * Large enough that any user virtual address is a valid file offset: UVM managed
 * memory is mmap'ed with offset == address, and a fault past EOF would be SIGBUS.
 */
#define DEV_FILE_SIZE (1ull << 47)
#define ATTR_TIMEOUT 86400.0

enum kind { K_ROOT, K_CTL, K_UVM, K_UVM_TOOLS, K_STATE, K_GPU };
#define INO_ROOT 1
#define INO_CTL 2
#define INO_UVM 3
#define INO_UVM_TOOLS 4
#define INO_STATE 5
#define INO_GPU0 16

enum uvm_fd_state { UVM_FD_UNINIT, UVM_FD_VA_SPACE, UVM_FD_MM };
enum mem_kind { MEM_NONE, MEM_VID, MEM_SYS, MEM_VIRT };
static const char *const MEM_KIND_NAME[] = {"none", "vid", "sys", "virt"};

/* One open file description (shared by dup'ed fds, alive while mmaps hold it). */
struct ofile {
    uint64_t id;
    enum kind kind;
    int gpu;
    pid_t opener;
    enum uvm_fd_state uvm_state;
    struct urange *ranges;
    struct tracker *trk; /* nvidia-uvm-tools: its tracker, once initialised */
    struct vspace *vs;   /* nvidia-uvm after UVM_INITIALIZE: the managed-memory model */
    char *text; /* .state snapshot taken at open */
    size_t textlen;
    struct ofile *prev, *next;
};

/* Physical or virtual memory behind one or more handles (RM_DUP_OBJECT shares it). */
struct backing {
    uint64_t size;
    uint64_t offset; /* vidmem: where the heap placed it */
    int gpu;
    enum mem_kind kind;
    int refs;
    pid_t owner;   /* tgid of the client that allocated it: GET_PID_INFO's process */
    unsigned mark; /* GET_PID_INFO pass that counted it (a duped handle counts once) */
};

struct obj {
    NvHandle client, handle;
    NvU32 hclass;
    int gpu; /* -1 above the device level */
    struct obj *parent, *children, *prev_sib, *next_sib;
    struct obj *hnext;
    struct backing *mem;
    /* clients only */
    struct ofile *owner;
    pid_t pid;
    pid_t tgid; /* the process, as GET_PIDS names it */
    NvHandle next_auto;
    struct obj *cprev, *cnext;
};

struct rmmap {
    NvHandle client, hmem;
    uint64_t token;
    struct rmmap *next;
};

enum urange_type { UR_EXTERNAL, UR_SEMAPHORE };
struct urange {
    uint64_t base, length;
    enum urange_type type;
    struct urange *next;
};

/* A free extent of a GPU heap (first-fit, coalesced on free). */
struct extent {
    uint64_t off, len;
    struct extent *next;
};

#define HBUCKETS 4096
static struct {
    uint64_t budget;
    int ngpus;
    int verbose;
    uint64_t used[MAX_GPUS], peak[MAX_GPUS];
    struct extent *heap_free[MAX_GPUS]; /* free extents of each GPU's heap, by offset */
    unsigned failed[MAX_GPUS];
    uint64_t sys_bytes, virt_bytes, sys_next, virt_next;
    unsigned nclients, nobjects, nfiles, nmaps, nranges;
    NvHandle next_client;
    uint64_t next_token, next_file_id;
    struct obj *htab[HBUCKETS];
    struct obj *clients;
    struct rmmap *maps;
    struct ofile *files;
    time_t start;
    pid_t foreign_pid;     /* --foreign-pid: a process of another PID namespace that */
    uint64_t foreign_vid;  /* holds this much vidmem on GPU 0 (GET_PIDS lists it) */
} g;

static pid_t tgid_of(pid_t tid);
static void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vlog(const char *fmt, ...)
{
    if (!g.verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("nvfuse: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ------------------------------------------------------------------ */
/* The caller's memory                                                 */
/* ------------------------------------------------------------------ */

/*
 * FUSE gives the server the caller's pointer but never the memory behind it, so the
 * stand-in goes through /proc/<tid>/mem. The caller is blocked in its ioctl and holds
 * no mm lock, so this cannot deadlock for a single-threaded caller whose params are
 * ordinary memory (not pages of this filesystem).
 */
static int pmem_rw(pid_t pid, uint64_t addr, void *buf, size_t len, int write)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    int fd = open(path, (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        ssize_t n = write ? pwrite(fd, (const char *)buf + done, len - done, (off_t)(addr + done))
                          : pread(fd, (char *)buf + done, len - done, (off_t)(addr + done));
        if (n <= 0) {
            rc = n < 0 ? -errno : -EFAULT;
            break;
        }
        done += (size_t)n;
    }
    close(fd);
    return rc;
}

static int pmem_read(pid_t pid, uint64_t addr, void *buf, size_t len)
{
    return addr ? pmem_rw(pid, addr, buf, len, 0) : -EFAULT;
}

static int pmem_write(pid_t pid, uint64_t addr, const void *buf, size_t len)
{
    return addr ? pmem_rw(pid, addr, (void *)buf, len, 1) : -EFAULT;
}

/* ------------------------------------------------------------------ */
/* RM object store                                                      */
/* ------------------------------------------------------------------ */

static unsigned hslot(NvHandle client, NvHandle handle)
{
    return (client * 2654435761u ^ handle * 40503u) % HBUCKETS;
}

static struct obj *obj_find(NvHandle client, NvHandle handle)
{
    for (struct obj *o = g.htab[hslot(client, handle)]; o; o = o->hnext)
        if (o->client == client && o->handle == handle)
            return o;
    return NULL;
}

static struct obj *client_find(NvHandle h)
{
    struct obj *o = obj_find(h, h);
    return o && !o->parent ? o : NULL;
}

static struct obj *obj_new(NvHandle client, NvHandle handle, NvU32 hclass, struct obj *parent)
{
    struct obj *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->client = client;
    o->handle = handle;
    o->hclass = hclass;
    o->gpu = parent ? parent->gpu : -1;
    o->parent = parent;
    if (parent) {
        o->next_sib = parent->children;
        if (parent->children)
            parent->children->prev_sib = o;
        parent->children = o;
    }
    unsigned s = hslot(client, handle);
    o->hnext = g.htab[s];
    g.htab[s] = o;
    g.nobjects++;
    return o;
}

/* ------------------------------------------------------------------ */
/* GPU heap: first fit over [0, budget), coalescing on free              */
/* ------------------------------------------------------------------ */

static void heap_init(void)
{
    for (int i = 0; i < g.ngpus; i++) {
        struct extent *e = calloc(1, sizeof *e);
        if (!e)
            abort();
        e->len = g.budget;
        g.heap_free[i] = e;
    }
}

/* Lowest aligned offset where `size` fits, as RM's heap does for a plain allocation. */
static int heap_alloc(int gpu, uint64_t size, uint64_t align, uint64_t *off)
{
    for (struct extent **pp = &g.heap_free[gpu]; *pp; pp = &(*pp)->next) {
        struct extent *e = *pp;
        uint64_t start = (e->off + align - 1) & ~(align - 1);
        if (start < e->off || start - e->off > e->len || e->len - (start - e->off) < size)
            continue;
        uint64_t head = start - e->off, tail = e->len - head - size;
        if (head && tail) {
            struct extent *t = calloc(1, sizeof *t);
            if (!t)
                abort();
            t->off = start + size;
            t->len = tail;
            t->next = e->next;
            e->next = t;
            e->len = head;
        } else if (head) {
            e->len = head;
        } else if (tail) {
            e->off = start + size;
            e->len = tail;
        } else {
            *pp = e->next;
            free(e);
        }
        *off = start;
        return 0;
    }
    return -1;
}

static void heap_free(int gpu, uint64_t off, uint64_t len)
{
    struct extent **pp = &g.heap_free[gpu], *prev = NULL;
    while (*pp && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    struct extent *next = *pp;
    if (prev && prev->off + prev->len == off) {
        prev->len += len;
        if (next && prev->off + prev->len == next->off) {
            prev->len += next->len;
            prev->next = next->next;
            free(next);
        }
        return;
    }
    if (next && off + len == next->off) {
        next->off = off;
        next->len += len;
        return;
    }
    struct extent *e = calloc(1, sizeof *e);
    if (!e)
        abort();
    e->off = off;
    e->len = len;
    e->next = next;
    *pp = e;
}

/* Free bytes, the largest free extent and its base: what FB_GET_INFO_V2 reports. */
static void heap_stats(int gpu, uint64_t *freeb, uint64_t *largest, uint64_t *largest_base)
{
    *freeb = *largest = *largest_base = 0;
    for (struct extent *e = g.heap_free[gpu]; e; e = e->next) {
        *freeb += e->len;
        if (e->len > *largest) {
            *largest = e->len;
            *largest_base = e->off;
        }
    }
}

static void backing_release(struct backing *m)
{
    if (!m || --m->refs > 0)
        return;
    switch (m->kind) {
    case MEM_VID:
        g.used[m->gpu] -= m->size;
        heap_free(m->gpu, m->offset, m->size);
        break;
    case MEM_SYS:
        g.sys_bytes -= m->size;
        break;
    case MEM_VIRT:
        g.virt_bytes -= m->size;
        break;
    case MEM_NONE:
        break;
    }
    free(m);
}

static void maps_drop(NvHandle client, NvHandle hmem)
{
    for (struct rmmap **pp = &g.maps; *pp;) {
        struct rmmap *m = *pp;
        if (m->client == client && (hmem == 0 || m->hmem == hmem)) {
            *pp = m->next;
            free(m);
            g.nmaps--;
        } else {
            pp = &m->next;
        }
    }
}

/* RM frees the whole subtree: children go first, as the resource server does. */
static void obj_destroy(struct obj *o)
{
    while (o->children)
        obj_destroy(o->children);
    if (o->parent) {
        if (o->prev_sib)
            o->prev_sib->next_sib = o->next_sib;
        else
            o->parent->children = o->next_sib;
        if (o->next_sib)
            o->next_sib->prev_sib = o->prev_sib;
    } else {
        if (o->cprev)
            o->cprev->cnext = o->cnext;
        else
            g.clients = o->cnext;
        if (o->cnext)
            o->cnext->cprev = o->cprev;
        g.nclients--;
    }
    for (struct obj **pp = &g.htab[hslot(o->client, o->handle)]; *pp; pp = &(*pp)->hnext)
        if (*pp == o) {
            *pp = o->hnext;
            break;
        }
    if (o->mem)
        maps_drop(o->client, o->handle);
    backing_release(o->mem);
    g.nobjects--;
    free(o);
}

/* RM hands out client handles from RS_CLIENT_HANDLE_BASE and others from 0xcaf00000. */
static NvHandle client_gen_handle(void)
{
    while (obj_find(g.next_client, g.next_client))
        g.next_client++;
    return g.next_client++;
}

static NvHandle obj_gen_handle(struct obj *client)
{
    while (obj_find(client->client, client->next_auto))
        client->next_auto++;
    return client->next_auto++;
}

static int is_root_class(NvU32 c)
{
    return c == NV01_ROOT || c == NV01_ROOT_NON_PRIV || c == NV01_ROOT_CLIENT;
}

static uint64_t page_size_for(NvU32 attr, NvU32 attr2)
{
    switch (NVOS32_ATTR_PAGE_SIZE(attr)) {
    case 3:
        return NVOS32_ATTR2_PAGE_SIZE_HUGE(attr2) == 2 ? 512ull << 20 : 2ull << 20;
    case 2:
        return 64ull << 10;
    default:
        return 4ull << 10;
    }
}

/*
 * Charges a new piece of memory. Only vidmem counts against the per-GPU budget:
 * sysmem and VA reservations consume no GPU memory on the real driver either.
 * Returns the fake physical/virtual address RM would report as `offset`.
 */
static NV_STATUS mem_charge(enum mem_kind kind, int gpu, uint64_t size, uint64_t align,
                            struct backing **out, uint64_t *offset)
{
    uint64_t vid_off = 0;
    if (kind == MEM_VID && heap_alloc(gpu, size, align, &vid_off)) {
        g.failed[gpu]++;
        return NV_ERR_NO_MEMORY;
    }
    struct backing *m = calloc(1, sizeof *m);
    if (!m)
        abort();
    m->size = size;
    m->gpu = gpu;
    m->kind = kind;
    m->refs = 1;
    if (kind == MEM_VID) {
        *offset = m->offset = vid_off;
    } else {
        uint64_t *cursor = kind == MEM_SYS ? &g.sys_next : &g.virt_next;
        *offset = (*cursor + align - 1) & ~(align - 1);
        *cursor = *offset + size;
    }
    switch (kind) {
    case MEM_VID:
        g.used[gpu] += size;
        if (g.used[gpu] > g.peak[gpu])
            g.peak[gpu] = g.used[gpu];
        break;
    case MEM_SYS:
        g.sys_bytes += size;
        break;
    case MEM_VIRT:
        g.virt_bytes += size;
        break;
    case MEM_NONE:
        break;
    }
    *out = m;
    return NV_OK;
}

/* ------------------------------------------------------------------ */
/* RM escapes                                                           */
/* ------------------------------------------------------------------ */

struct call {
    fuse_req_t req;
    pid_t pid;
    struct ofile *of;
    const char *dev; /* for the log */
};

/* Classes whose pAllocParms is NV_MEMORY_ALLOCATION_PARAMS (facts section 2.4). */
static NV_STATUS alloc_memory_class(struct call *c, NvU32 hclass, uint64_t pAllocParms, int gpu,
                                    struct backing **mem, uint64_t *logsize)
{
    NV_MEMORY_ALLOCATION_PARAMS ap;
    if (gpu < 0)
        return NV_ERR_INVALID_OBJECT_PARENT;
    if (!pAllocParms)
        return NV_ERR_INVALID_ARGUMENT;
    if (pmem_read(c->pid, pAllocParms, &ap, sizeof ap))
        return NV_ERR_INVALID_ADDRESS;
    *logsize = ap.size;
    if (ap.size == 0)
        return NV_ERR_INVALID_ARGUMENT;
    enum mem_kind kind = hclass == NV01_MEMORY_SYSTEM ? MEM_SYS : MEM_VID;
    if (hclass == NV50_MEMORY_VIRTUAL || (ap.flags & NVOS32_ALLOC_FLAGS_VIRTUAL))
        kind = MEM_VIRT;
    uint64_t pg = page_size_for(ap.attr, ap.attr2);
    if (ap.size > UINT64_MAX - pg)
        return NV_ERR_INVALID_ARGUMENT;
    uint64_t size = (ap.size + pg - 1) & ~(pg - 1);
    uint64_t align = ap.alignment > pg ? ap.alignment : pg;
    if (align & (align - 1))
        return NV_ERR_INVALID_ARGUMENT;
    uint64_t offset;
    NV_STATUS st = mem_charge(kind, gpu, size, align, mem, &offset);
    if (st != NV_OK)
        return st;
    /* OUT fields, as vidmemConstruct/sysmemConstruct return them: actual size,
     * physical (or virtual) offset, and limit = size - 1. */
    struct {
        NvU64 size, alignment, offset, limit;
    } out = {size, ap.alignment, offset, size - 1};
    _Static_assert(offsetof(NV_MEMORY_ALLOCATION_PARAMS, limit) ==
                       offsetof(NV_MEMORY_ALLOCATION_PARAMS, size) + 24,
                   "size..limit contiguous");
    if (pmem_write(c->pid, pAllocParms + offsetof(NV_MEMORY_ALLOCATION_PARAMS, size), &out,
                   sizeof out)) {
        backing_release(*mem);
        *mem = NULL;
        return NV_ERR_INVALID_ADDRESS;
    }
    return NV_OK;
}

static NV_STATUS rm_alloc(struct call *c, NvHandle hRoot, NvHandle hParent, NvHandle *hNew,
                          NvU32 *hClass, uint64_t pAllocParms)
{
    uint64_t logsize = 0;
    NV_STATUS st = NV_OK;

    if (is_root_class(*hClass)) {
        NvHandle h = *hNew ? *hNew : client_gen_handle();
        if (obj_find(h, h))
            return NV_ERR_INSERT_DUPLICATE_NAME;
        struct obj *o = obj_new(h, h, NV01_ROOT_CLIENT, NULL);
        o->owner = c->of;
        o->pid = c->pid;
        o->tgid = tgid_of(c->pid);
        o->next_auto = 0xcaf00000u;
        o->cnext = g.clients;
        if (g.clients)
            g.clients->cprev = o;
        g.clients = o;
        g.nclients++;
        *hNew = h;
        /* RM rewrites every root class to NV01_ROOT_CLIENT in the caller's copy. */
        *hClass = NV01_ROOT_CLIENT;
        vlog("  new client 0x%08x", h);
        return NV_OK;
    }

    struct obj *client = client_find(hRoot);
    if (!client)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *parent = hParent == hRoot ? client : obj_find(hRoot, hParent);
    if (!parent)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    NvHandle h = *hNew ? *hNew : obj_gen_handle(client);
    if (obj_find(hRoot, h))
        return NV_ERR_INSERT_DUPLICATE_NAME;

    int gpu = parent->gpu;
    struct backing *mem = NULL;
    switch (*hClass) {
    case NV01_DEVICE_0: {
        NvU32 dev = 0;
        if (pAllocParms && pmem_read(c->pid, pAllocParms, &dev, sizeof dev))
            return NV_ERR_INVALID_ADDRESS;
        if (dev >= (NvU32)g.ngpus)
            return NV_ERR_INVALID_ARGUMENT;
        gpu = (int)dev;
        break;
    }
    case NV01_MEMORY_SYSTEM:
    case NV01_MEMORY_LOCAL_USER:
    case NV50_MEMORY_VIRTUAL:
        st = alloc_memory_class(c, *hClass, pAllocParms, gpu, &mem, &logsize);
        break;
    default:
        /* Other classes are accepted as plain tree nodes; their params are not read. */
        break;
    }
    vlog("  alloc class 0x%x client 0x%08x parent 0x%08x handle 0x%08x size %" PRIu64
         " -> 0x%x",
         *hClass, hRoot, hParent, h, logsize, st);
    if (st != NV_OK)
        return st;
    struct obj *o = obj_new(hRoot, h, *hClass, parent);
    o->gpu = gpu;
    o->mem = mem;
    if (mem)
        mem->owner = client->tgid;
    *hNew = h;
    return NV_OK;
}

static NV_STATUS rm_free(NvHandle hRoot, NvHandle hOld)
{
    struct obj *client = client_find(hRoot);
    if (!client)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *o = hOld == hRoot ? client : obj_find(hRoot, hOld);
    if (!o)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    obj_destroy(o);
    return NV_OK;
}

/* GPU i's UUID: the workload's WL_GPU0_UUID with i in the last byte. */
static void gpu_uuid(int gpu, NvU8 out[16])
{
    static const NvU8 base[16] = WL_GPU0_UUID;
    memcpy(out, base, 16);
    out[15] = (NvU8)gpu;
}

static void gpu_uuid_ascii(int gpu, char out[41])
{
    NvU8 u[16];
    gpu_uuid(gpu, u);
    snprintf(out, 41,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int gpu_by_id(NvU32 id)
{
    for (int i = 0; i < g.ngpus; i++)
        if (STANDIN_GPU_ID(i) == id)
            return i;
    return -1;
}

/* The UUID in binary (16 bytes) or ASCII form, as GET_UUID_FROM_GPU_ID and GET_GID_INFO give it. */
static NvU32 uuid_fill(int gpu, NvU32 flags, NvU8 *out)
{
    if ((flags & 3u) == NV_GID_FLAGS_FORMAT_BINARY) {
        gpu_uuid(gpu, out);
        return 16;
    }
    char a[41];
    gpu_uuid_ascii(gpu, a);
    memcpy(out, a, 41);
    return 40;
}

#define CTRL_IO(T)                                                              \
    T q;                                                                        \
    if (p->paramsSize != sizeof q)                                              \
        return NV_ERR_INVALID_ARGUMENT;                                         \
    if (pmem_read(c->pid, p->params, &q, sizeof q))                             \
        return NV_ERR_INVALID_ADDRESS
#define CTRL_OUT()                                                              \
    return pmem_write(c->pid, p->params, &q, sizeof q) ? NV_ERR_INVALID_ADDRESS : NV_OK

/* NV0000 controls on the client: the open sequence nvidia-smi uses, and UUIDs. */
static NV_STATUS rm_control_client(struct call *c, NVOS54_PARAMETERS *p)
{
    switch (p->cmd) {
    case NV0000_CTRL_CMD_GPU_GET_PROBED_IDS: {
        CTRL_IO(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS);
        for (unsigned i = 0; i < NV0000_CTRL_GPU_MAX_PROBED_GPUS; i++) {
            q.gpuIds[i] = i < (unsigned)g.ngpus ? STANDIN_GPU_ID(i) : NV0000_CTRL_GPU_INVALID_ID;
            q.excludedGpuIds[i] = NV0000_CTRL_GPU_INVALID_ID;
            q.gpuFlags[i] = 0;
        }
        CTRL_OUT();
    }
    case NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS: {
        CTRL_IO(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS); /* gpuIds[32] leads both structs */
        for (unsigned i = 0; i < NV0000_CTRL_GPU_MAX_PROBED_GPUS; i++)
            q.gpuIds[i] = i < (unsigned)g.ngpus ? STANDIN_GPU_ID(i) : NV0000_CTRL_GPU_INVALID_ID;
        CTRL_OUT();
    }
    case NV0000_CTRL_CMD_GPU_ATTACH_IDS: {
        CTRL_IO(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS);
        q.failedId = NV0000_CTRL_GPU_INVALID_ID;
        for (unsigned i = 0; i < NV0000_CTRL_GPU_MAX_PROBED_GPUS; i++) {
            if (q.gpuIds[i] == NV0000_CTRL_GPU_INVALID_ID || q.gpuIds[i] == 0xffffu)
                break;
            if (gpu_by_id(q.gpuIds[i]) < 0) {
                q.failedId = q.gpuIds[i];
                pmem_write(c->pid, p->params, &q, sizeof q);
                return NV_ERR_INVALID_ARGUMENT;
            }
        }
        CTRL_OUT();
    }
    case NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: {
        CTRL_IO(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS);
        int gpu = gpu_by_id(q.gpuId);
        if (gpu < 0)
            return NV_ERR_INVALID_ARGUMENT;
        q.deviceInstance = (NvU32)gpu;
        q.subDeviceInstance = 0;
        q.numaId = -1;
        CTRL_OUT();
    }
    case NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID: {
        CTRL_IO(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS);
        int gpu = gpu_by_id(q.gpuId);
        if (gpu < 0)
            return NV_ERR_OBJECT_NOT_FOUND;
        q.uuidStrLen = uuid_fill(gpu, q.flags, q.gpuUuid);
        CTRL_OUT();
    }
    default:
        return NV_OK;
    }
}

/* FB_GET_INFO_V2 from the heap model: exact free / largest-free values, in KiB. */
static NV_STATUS rm_fb_get_info(struct call *c, NVOS54_PARAMETERS *p, int gpu)
{
    CTRL_IO(NV2080_CTRL_FB_GET_INFO_V2_PARAMS);
    if (q.fbInfoListSize > NV2080_CTRL_FB_INFO_MAX_LIST_SIZE)
        return NV_ERR_INVALID_ARGUMENT;
    uint64_t freeb, largest, base;
    heap_stats(gpu, &freeb, &largest, &base);
    for (NvU32 i = 0; i < q.fbInfoListSize; i++) {
        uint64_t v;
        switch (q.fbInfoList[i].index) {
        case NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE:
        case NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE:
        case NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE:
        case NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE: v = g.budget; break;
        case NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE: v = freeb; break;
        case NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB: v = largest; break;
        case NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_BASE_KB: v = base; break;
        default:
            if (q.fbInfoList[i].index > NV2080_CTRL_FB_INFO_INDEX_MAX)
                return NV_ERR_INVALID_ARGUMENT;
            v = 0; /* FB_TAX, HEAP_BASE, HEAP_START, HEAP_OFFLINE and the rest */
            break;
        }
        q.fbInfoList[i].data = (NvU32)(v >> 10);
    }
    CTRL_OUT();
}

/* GET_PIDS: the processes holding a subdevice of this GPU (the class query for
 * NV20_SUBDEVICE_0, as nvidia-smi asks); other ids answer the same set, as every
 * stand-in client that allocates memory holds one. */
static NV_STATUS rm_get_pids(struct call *c, NVOS54_PARAMETERS *p, int gpu)
{
    CTRL_IO(NV2080_CTRL_GPU_GET_PIDS_PARAMS);
    if (q.idType != NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS)
        return NV_ERR_INVALID_ARGUMENT;
    q.pidTblCount = 0;
    for (struct obj *cl = g.clients; cl; cl = cl->cnext) {
        int holds = 0;
        for (unsigned s = 0; s < HBUCKETS && !holds; s++)
            for (struct obj *o = g.htab[s]; o && !holds; o = o->hnext)
                holds = o->client == cl->handle && o->hclass == NV20_SUBDEVICE_0 && o->gpu == gpu;
        int seen = 0;
        for (NvU32 i = 0; i < q.pidTblCount; i++)
            seen |= q.pidTbl[i] == (NvU32)cl->tgid;
        if (holds && !seen && q.pidTblCount < NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT)
            q.pidTbl[q.pidTblCount++] = (NvU32)cl->tgid;
    }
    /* the host pid of a container's process: no client of ours, the driver lists it */
    if (g.foreign_pid && gpu == 0 && q.pidTblCount < NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT)
        q.pidTbl[q.pidTblCount++] = (NvU32)g.foreign_pid;
    CTRL_OUT();
}

/* GET_PID_INFO, video memory usage: the vidmem on this GPU each process allocated
 * (memPrivate; a handle another process duped still counts for its owner, once). */
static NV_STATUS rm_get_pid_info(struct call *c, NVOS54_PARAMETERS *p, int gpu)
{
    static unsigned pass;
    CTRL_IO(NV2080_CTRL_GPU_GET_PID_INFO_PARAMS);
    if (q.pidInfoListCount > NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT)
        return NV_ERR_INVALID_ARGUMENT;
    for (NvU32 i = 0; i < q.pidInfoListCount; i++) {
        NV2080_CTRL_GPU_PID_INFO *e = &q.pidInfoList[i];
        memset(&e->data, 0, sizeof e->data);
        e->smcSubscription.computeInstanceId = e->smcSubscription.gpuInstanceId = 0xffffffffu;
        if (e->index != NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE) {
            e->result = NV_ERR_INVALID_ARGUMENT;
            continue;
        }
        e->result = NV_OK;
        pass++;
        if (g.foreign_pid && gpu == 0 && (pid_t)e->pid == g.foreign_pid)
            e->data.memPrivate += g.foreign_vid;
        for (unsigned s = 0; s < HBUCKETS; s++)
            for (struct obj *o = g.htab[s]; o; o = o->hnext) {
                struct backing *m = o->mem;
                if (m && m->kind == MEM_VID && m->gpu == gpu && m->owner == (pid_t)e->pid &&
                    m->mark != pass) {
                    m->mark = pass;
                    e->data.memPrivate += m->size;
                }
            }
    }
    CTRL_OUT();
}

static NV_STATUS rm_control(struct call *c, NVOS54_PARAMETERS *p)
{
    if (!client_find(p->hClient))
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *target = p->hObject == p->hClient ? NULL : obj_find(p->hClient, p->hObject);
    if (p->hObject != p->hClient && !target)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    if (!target)
        return rm_control_client(c, p);
    if (target->hclass == NV20_SUBDEVICE_0 && p->cmd == NV2080_CTRL_CMD_FB_GET_INFO_V2)
        return rm_fb_get_info(c, p, target->gpu);
    if (target->hclass == NV20_SUBDEVICE_0 && p->cmd == NV2080_CTRL_CMD_GPU_GET_PIDS)
        return rm_get_pids(c, p, target->gpu);
    if (target->hclass == NV20_SUBDEVICE_0 && p->cmd == NV2080_CTRL_CMD_GPU_GET_PID_INFO)
        return rm_get_pid_info(c, p, target->gpu);
    if (target->hclass == NV20_SUBDEVICE_0 && p->cmd == NV2080_CTRL_CMD_GPU_GET_GID_INFO) {
        CTRL_IO(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS);
        q.length = uuid_fill(target->gpu, q.flags, q.data);
        CTRL_OUT();
    }
    if (p->cmd == NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES &&
        p->paramsSize >= sizeof(NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS)) {
        NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS out = {1};
        if (pmem_write(c->pid, p->params, &out, sizeof out))
            return NV_ERR_INVALID_ADDRESS;
    }
    /* Any other command succeeds and leaves its params untouched. */
    return NV_OK;
}

/* The fd in RM_MAP_MEMORY must name one of the caller's /dev/nvidiaN files. */
static int fd_is_gpu_file(pid_t pid, int fd)
{
    char path[64], target[4096];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if (strncmp(base, "nvidia", 6) != 0 || !base[6])
        return 0;
    for (const char *s = base + 6; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static NV_STATUS rm_map_memory(struct call *c, nv_ioctl_nvos33_parameters_with_fd *w)
{
    NVOS33_PARAMETERS *p = &w->params;
    if (!client_find(p->hClient) || !obj_find(p->hClient, p->hDevice))
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *o = obj_find(p->hClient, p->hMemory);
    if (!o || !o->mem || o->mem->kind == MEM_VIRT)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    if (p->length == 0 || p->offset > o->mem->size || p->length > o->mem->size - p->offset)
        return NV_ERR_INVALID_LIMIT;
    if (!fd_is_gpu_file(c->pid, w->fd))
        return NV_ERR_INVALID_ARGUMENT;
    /*
     * The real pLinearAddress is a cookie for a later mmap of that /dev/nvidiaN fd.
     * Here it is a page-aligned file offset below DEV_FILE_SIZE, so the mmap works.
     */
    uint64_t token = 0x400000000000ull | ((g.next_token++ & 0xffffu) << 30);
    struct rmmap *m = calloc(1, sizeof *m);
    if (!m)
        abort();
    m->client = p->hClient;
    m->hmem = p->hMemory;
    m->token = token;
    m->next = g.maps;
    g.maps = m;
    g.nmaps++;
    p->pLinearAddress = token;
    return NV_OK;
}

static NV_STATUS rm_unmap_memory(NVOS34_PARAMETERS *p)
{
    if (!client_find(p->hClient) || !obj_find(p->hClient, p->hDevice) ||
        !obj_find(p->hClient, p->hMemory))
        return NV_ERR_INVALID_OBJECT_HANDLE;
    for (struct rmmap **pp = &g.maps; *pp; pp = &(*pp)->next) {
        struct rmmap *m = *pp;
        if (m->client == p->hClient && m->hmem == p->hMemory && m->token == p->pLinearAddress) {
            *pp = m->next;
            free(m);
            g.nmaps--;
            return NV_OK;
        }
    }
    return NV_ERR_INVALID_ARGUMENT;
}

static NV_STATUS rm_dup_object(NVOS55_PARAMETERS *p)
{
    struct obj *dst = client_find(p->hClient);
    struct obj *src = client_find(p->hClientSrc);
    if (!dst || !src)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *parent = p->hParent == p->hClient ? dst : obj_find(p->hClient, p->hParent);
    struct obj *so = obj_find(p->hClientSrc, p->hObjectSrc);
    if (!parent || !so || !so->parent)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    NvHandle h = p->hObject ? p->hObject : obj_gen_handle(dst);
    if (obj_find(p->hClient, h))
        return NV_ERR_INSERT_DUPLICATE_NAME;
    /* The duplicate shares the source's memory: freeing one handle frees no bytes. */
    struct obj *o = obj_new(p->hClient, h, so->hclass, parent);
    o->gpu = so->gpu;
    o->mem = so->mem;
    if (o->mem)
        o->mem->refs++;
    p->hObject = h;
    return NV_OK;
}

static NV_STATUS rm_alloc_memory(NVOS02_PARAMETERS *p)
{
    struct obj *client = client_find(p->hRoot);
    if (!client)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *parent = p->hObjectParent == p->hRoot ? client : obj_find(p->hRoot, p->hObjectParent);
    if (!parent)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    NvHandle h = p->hObjectNew ? p->hObjectNew : obj_gen_handle(client);
    if (obj_find(p->hRoot, h))
        return NV_ERR_INSERT_DUPLICATE_NAME;
    if (p->limit == UINT64_MAX)
        return NV_ERR_INVALID_LIMIT;
    /* OS descriptors (0x71) wrap the caller's pages at pMemory; no GPU memory is used. */
    struct backing *mem;
    uint64_t offset;
    mem_charge(MEM_SYS, parent->gpu < 0 ? 0 : parent->gpu, p->limit + 1, 1, &mem, &offset);
    struct obj *o = obj_new(p->hRoot, h, p->hClass, parent);
    o->mem = mem;
    p->hObjectNew = h;
    return NV_OK;
}

static NV_STATUS rm_vid_heap(NVOS32_PARAMETERS *p)
{
    struct obj *client = client_find(p->hRoot);
    if (!client)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    struct obj *parent = p->hObjectParent == p->hRoot ? client : obj_find(p->hRoot, p->hObjectParent);
    if (!parent)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    if (p->function == NVOS32_FUNCTION_FREE) {
        struct obj *o = obj_find(p->hRoot, p->data.Free.hMemory);
        if (!o)
            return NV_ERR_INVALID_OBJECT_HANDLE;
        obj_destroy(o);
        return NV_OK;
    }
    if (p->function != NVOS32_FUNCTION_ALLOC_SIZE)
        return NV_ERR_NOT_SUPPORTED;
    NVOS32_ALLOC_SIZE *a = &p->data.AllocSize;
    if (parent->gpu < 0)
        return NV_ERR_INVALID_OBJECT_PARENT;
    NvHandle h = a->hMemory ? a->hMemory : obj_gen_handle(client);
    if (obj_find(p->hRoot, h))
        return NV_ERR_INSERT_DUPLICATE_NAME;
    if (a->size == 0)
        return NV_ERR_INVALID_ARGUMENT;
    enum mem_kind kind = NVOS32_ATTR_LOCATION(a->attr) == NVOS32_ATTR_LOCATION_PCI_V ? MEM_SYS : MEM_VID;
    if (a->flags & NVOS32_ALLOC_FLAGS_VIRTUAL)
        kind = MEM_VIRT;
    uint64_t pg = page_size_for(a->attr, 0);
    if (a->size > UINT64_MAX - pg)
        return NV_ERR_INVALID_ARGUMENT;
    uint64_t size = (a->size + pg - 1) & ~(pg - 1);
    struct backing *mem;
    uint64_t offset;
    NV_STATUS st = mem_charge(kind, parent->gpu, size, pg, &mem, &offset);
    p->total = g.budget;
    p->free = g.budget - g.used[parent->gpu];
    if (st != NV_OK)
        return st;
    struct obj *o = obj_new(p->hRoot, h, kind == MEM_SYS ? NV01_MEMORY_SYSTEM : NV01_MEMORY_LOCAL_USER,
                            parent);
    o->mem = mem;
    mem->owner = client->tgid;
    a->hMemory = h;
    a->size = size;
    a->offset = offset;
    a->limit = size - 1;
    return NV_OK;
}

static const char *esc_name(unsigned nr)
{
    switch (nr) {
    case NV_ESC_RM_ALLOC_MEMORY: return "RM_ALLOC_MEMORY";
    case NV_ESC_RM_FREE: return "RM_FREE";
    case NV_ESC_RM_CONTROL: return "RM_CONTROL";
    case NV_ESC_RM_ALLOC: return "RM_ALLOC";
    case NV_ESC_RM_DUP_OBJECT: return "RM_DUP_OBJECT";
    case NV_ESC_RM_VID_HEAP_CONTROL: return "RM_VID_HEAP_CONTROL";
    case NV_ESC_RM_MAP_MEMORY: return "RM_MAP_MEMORY";
    case NV_ESC_RM_UNMAP_MEMORY: return "RM_UNMAP_MEMORY";
    case NV_ESC_REGISTER_FD: return "REGISTER_FD";
    case NV_ESC_WAIT_OPEN_COMPLETE: return "WAIT_OPEN_COMPLETE";
    case NV_ESC_CHECK_VERSION_STR: return "CHECK_VERSION_STR";
    case NV_ESC_IOCTL_XFER_CMD: return "XFER_CMD";
    default: return "?";
    }
}

/*
 * One escape on its kernel copy of the params. Returns 0 (the RM status is in the
 * params, as RmIoctl leaves it) or -EINVAL where nvidia.ko fails the syscall itself:
 * a wrong size, an unknown escape, or the wrong device node (NV_CTL_DEVICE_ONLY /
 * NV_ACTUAL_DEVICE_ONLY).
 */
static int rm_escape(struct call *c, unsigned nr, void *buf, size_t size)
{
    int ctl = c->of->kind == K_CTL;
    NV_STATUS st;
#define NEED(sz, on_ctl)                                  \
    do {                                                  \
        if (size != (sz) || ctl != (on_ctl))              \
            return -EINVAL;                               \
    } while (0)

    switch (nr) {
    case NV_ESC_RM_ALLOC: {
        if (size != sizeof(NVOS21_PARAMETERS) && size != sizeof(NVOS64_PARAMETERS))
            return -EINVAL;
        /* The first five fields sit at the same offsets in NVOS21 and NVOS64. */
        NVOS21_PARAMETERS *p = buf;
        if (!ctl && p->hClass != 0x79u)
            return -EINVAL;
        NvU32 *status = size == sizeof(NVOS21_PARAMETERS) ? &p->status
                                                          : &((NVOS64_PARAMETERS *)buf)->status;
        st = rm_alloc(c, p->hRoot, p->hObjectParent, &p->hObjectNew, &p->hClass, p->pAllocParms);
        *status = st;
        break;
    }
    case NV_ESC_RM_FREE: {
        NEED(sizeof(NVOS00_PARAMETERS), 1);
        NVOS00_PARAMETERS *p = buf;
        st = p->status = rm_free(p->hRoot, p->hObjectOld);
        vlog("  free client 0x%08x handle 0x%08x -> 0x%x", p->hRoot, p->hObjectOld, st);
        break;
    }
    case NV_ESC_RM_CONTROL: {
        NEED(sizeof(NVOS54_PARAMETERS), 1);
        NVOS54_PARAMETERS *p = buf;
        st = p->status = rm_control(c, p);
        vlog("  control client 0x%08x object 0x%08x cmd 0x%08x -> 0x%x", p->hClient, p->hObject,
             p->cmd, st);
        break;
    }
    case NV_ESC_RM_MAP_MEMORY: {
        NEED(sizeof(nv_ioctl_nvos33_parameters_with_fd), 1);
        nv_ioctl_nvos33_parameters_with_fd *w = buf;
        st = w->params.status = rm_map_memory(c, w);
        vlog("  map memory 0x%08x len %" PRIu64 " fd %d -> 0x%x addr 0x%" PRIx64, w->params.hMemory,
             (uint64_t)w->params.length, w->fd, st, (uint64_t)w->params.pLinearAddress);
        break;
    }
    case NV_ESC_RM_UNMAP_MEMORY: {
        NEED(sizeof(NVOS34_PARAMETERS), 1);
        NVOS34_PARAMETERS *p = buf;
        st = p->status = rm_unmap_memory(p);
        vlog("  unmap memory 0x%08x -> 0x%x", p->hMemory, st);
        break;
    }
    case NV_ESC_RM_DUP_OBJECT: {
        NEED(sizeof(NVOS55_PARAMETERS), 1);
        NVOS55_PARAMETERS *p = buf;
        st = p->status = rm_dup_object(p);
        vlog("  dup 0x%08x/0x%08x -> 0x%08x/0x%08x: 0x%x", p->hClientSrc, p->hObjectSrc,
             p->hClient, p->hObject, st);
        break;
    }
    case NV_ESC_RM_VID_HEAP_CONTROL: {
        NEED(sizeof(NVOS32_PARAMETERS), 1);
        NVOS32_PARAMETERS *p = buf;
        st = p->status = rm_vid_heap(p);
        vlog("  vid heap function %u -> 0x%x", p->function, st);
        break;
    }
    case NV_ESC_RM_ALLOC_MEMORY: {
        NEED(sizeof(nv_ioctl_nvos02_parameters_with_fd), 0);
        NVOS02_PARAMETERS *p = &((nv_ioctl_nvos02_parameters_with_fd *)buf)->params;
        st = p->status = rm_alloc_memory(p);
        vlog("  alloc memory class 0x%x handle 0x%08x size %" PRIu64 " -> 0x%x", p->hClass,
             p->hObjectNew, (uint64_t)p->limit + 1, st);
        break;
    }
    case NV_ESC_REGISTER_FD:
        if (ctl)
            return -EINVAL;
        break;
    case NV_ESC_WAIT_OPEN_COMPLETE: {
        NEED(sizeof(nv_ioctl_wait_open_complete_t), 0);
        nv_ioctl_wait_open_complete_t *p = buf;
        p->rc = 0;
        p->adapterStatus = NV_OK;
        break;
    }
    case NV_ESC_CHECK_VERSION_STR: {
        NEED(sizeof(nv_ioctl_rm_api_version_t), 1);
        nv_ioctl_rm_api_version_t *p = buf;
        /* QUERY ('2') asks for the version; STRICT (0) compares; RELAXED ('1') accepts. */
        if (p->cmd == '2') {
            memset(p->versionString, 0, sizeof p->versionString);
            strcpy(p->versionString, STANDIN_DRIVER_VERSION);
            p->reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;
        } else {
            p->reply = p->cmd == '1' || !strncmp(p->versionString, STANDIN_DRIVER_VERSION,
                                                 sizeof p->versionString)
                           ? NV_RM_API_VERSION_REPLY_RECOGNIZED
                           : 0;
            if (!p->reply) {
                memset(p->versionString, 0, sizeof p->versionString);
                strcpy(p->versionString, STANDIN_DRIVER_VERSION);
            }
        }
        break;
    }
    default:
        return -EINVAL;
    }
#undef NEED
    return 0;
}

static void rm_ioctl(struct call *c, unsigned int cmd, const void *in_buf, size_t in_bufsz,
                     size_t out_bufsz)
{
    static unsigned char buf[NV_ABSOLUTE_MAX_IOCTL_SIZE], inner[NV_ABSOLUTE_MAX_IOCTL_SIZE];
    unsigned nr = _IOC_NR(cmd);
    size_t size = _IOC_SIZE(cmd);

    vlog("pid %d %s %s cmd 0x%08x size %zu", (int)c->pid, c->dev, esc_name(nr), cmd, size);
    if (_IOC_DIR(cmd) != (_IOC_READ | _IOC_WRITE) || in_bufsz != size || out_bufsz != size ||
        size > sizeof buf) {
        fuse_reply_err(c->req, EINVAL);
        return;
    }
    memcpy(buf, in_buf, size);

    int rc;
    if (nr == NV_ESC_IOCTL_XFER_CMD) {
        /* The wrapped params are behind a pointer, out of FUSE's reach: use /proc. */
        nv_ioctl_xfer_t *x = (nv_ioctl_xfer_t *)buf;
        if (size != sizeof *x || x->size > sizeof inner) {
            rc = -EINVAL;
        } else if (pmem_read(c->pid, x->ptr, inner, x->size)) {
            rc = -EFAULT;
        } else {
            vlog("  xfer inner %s size %u", esc_name(x->cmd), x->size);
            rc = rm_escape(c, x->cmd, inner, x->size);
            if (rc == 0 && pmem_write(c->pid, x->ptr, inner, x->size))
                rc = -EFAULT;
        }
    } else {
        rc = rm_escape(c, nr, buf, size);
    }
    if (rc)
        fuse_reply_err(c->req, -rc);
    else
        fuse_reply_ioctl(c->req, 0, buf, size);
}

/* ------------------------------------------------------------------ */
/* UVM                                                                  */
/* ------------------------------------------------------------------ */

#define X(c, n, s, o, t) {(c), (n), (s), (o), (t)},
static const uvm_cmd_info UVM_CMDS[] = {UVM_CMD_TABLE(X)};
#undef X

static const uvm_cmd_info *uvm_cmd(unsigned cmd)
{
    for (size_t i = 0; i < sizeof UVM_CMDS / sizeof UVM_CMDS[0]; i++)
        if (UVM_CMDS[i].cmd == cmd)
            return &UVM_CMDS[i];
    return NULL;
}

static struct urange *urange_find(struct ofile *of, uint64_t base, uint64_t len, int exact)
{
    for (struct urange *r = of->ranges; r; r = r->next) {
        if (exact ? r->base == base
                  : base < r->base + r->length && r->base < base + len)
            return r;
    }
    return NULL;
}

static NV_STATUS uvm_add_range(struct call *c, uint64_t arg, enum urange_type type, int *rc)
{
    NvU64 bl[2];
    if (pmem_read(c->pid, arg, bl, sizeof bl)) {
        *rc = -EFAULT;
        return NV_OK;
    }
    if (bl[1] == 0 || (bl[0] | bl[1]) & 0xfff || bl[0] + bl[1] < bl[0])
        return NV_ERR_INVALID_ADDRESS;
    if (urange_find(c->of, bl[0], bl[1], 0))
        return NV_ERR_UVM_ADDRESS_IN_USE;
    struct urange *r = calloc(1, sizeof *r);
    if (!r)
        abort();
    r->base = bl[0];
    r->length = bl[1];
    r->type = type;
    r->next = c->of->ranges;
    c->of->ranges = r;
    g.nranges++;
    vlog("  uvm range 0x%" PRIx64 " +0x%" PRIx64, bl[0], bl[1]);
    return NV_OK;
}

static NV_STATUS uvm_map_external(struct call *c, uint64_t arg, int *rc)
{
    NvU64 blo[3];
    NvU32 hh[2];
    if (pmem_read(c->pid, arg, blo, sizeof blo) ||
        pmem_read(c->pid, arg + offsetof(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hClient), hh,
                  sizeof hh)) {
        *rc = -EFAULT;
        return NV_OK;
    }
    struct urange *r = urange_find(c->of, blo[0], blo[1], 0);
    if (!r || r->type != UR_EXTERNAL || blo[0] < r->base ||
        blo[0] + blo[1] > r->base + r->length)
        return NV_ERR_INVALID_ADDRESS;
    struct obj *o = client_find(hh[0]) ? obj_find(hh[0], hh[1]) : NULL;
    if (!o || !o->mem)
        return NV_ERR_INVALID_OBJECT_HANDLE;
    if (blo[2] > o->mem->size || blo[1] > o->mem->size - blo[2])
        return NV_ERR_INVALID_LIMIT;
    vlog("  uvm map external 0x%" PRIx64 " hMemory 0x%08x", blo[0], hh[1]);
    return NV_OK;
}

static NV_STATUS uvm_free(struct call *c, uint64_t arg, int *rc)
{
    NvU64 base;
    if (pmem_read(c->pid, arg, &base, sizeof base)) {
        *rc = -EFAULT;
        return NV_OK;
    }
    for (struct urange **pp = &c->of->ranges; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == base) {
            struct urange *r = *pp;
            *pp = r->next;
            free(r);
            g.nranges--;
            vlog("  uvm free 0x%" PRIx64, base);
            return NV_OK;
        }
    }
    return NV_ERR_INVALID_ADDRESS;
}

/* ------------------------------------------------------------------ */
/* UVM tools trackers and the managed-memory model                      */
/* ------------------------------------------------------------------ */

/*
 * A tracker lives on a nvidia-uvm-tools open file. Like the driver, it keeps a reference
 * on the target's uvm file (the driver's fget): the server holds a duplicate of the
 * caller's uvmFd (pidfd_getfd) until the tracker goes away. Which of our open files that
 * fd is, the server learns soundly by asking the file itself: a helper thread issues
 * UVM_STANDIN_IDENTIFY on the duplicate, which arrives here with that file's handle.
 * The tracker's INIT request is answered only then.
 */
struct tracker {
    uint64_t id;
    struct ofile *tools, *target;
    pid_t pid;   /* thread group whose memory holds queue and control */
    int srvfd;   /* the server's reference on the target uvm file */
    int is_queue, v2;
    unsigned entry_size;
    uint32_t count, threshold;
    uint64_t queue, control;
    uint64_t events, counter_mask;
    int all_processors;
    NvU8 processor[16];
    uint64_t written[UVM_EVENT_NUM_TYPES_ALL], dropped[UVM_EVENT_NUM_TYPES_ALL];
    NvU64 cdelta[UVM_TOTAL_COUNTERS];
    struct fuse_pollhandle *ph;
    struct tracker *next;
};

struct pending_init {
    uint64_t token;
    fuse_req_t req;
    struct ofile *tools;
    pid_t tid, pid;
    uint64_t arg;
    UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS p;
    int v2, srvfd;
    struct pending_init *next;
};

/* A managed range the workload registered; per 4 KiB page: residency, history, flags. */
#define RES_NONE 0
#define RES_CPU 1
#define RES_GPU(gpu) (2 + (gpu))
#define PF_THRASH 1u /* thrashing detected: pinned where it is */
#define PF_REMOTE 2u /* the other side maps it remotely */
struct mrange {
    uint64_t base;
    uint32_t npages;
    uint8_t *res, *nmig, *flags;
    uint32_t *gen;
    struct mrange *next;
};
struct fifo_ent {
    struct mrange *r;
    uint32_t page, gen;
};
struct ev {
    uint8_t type, access, cause, client, fault_type;
    int src, dst; /* processors: -1 = CPU, g >= 0 = GPU g */
    uint64_t addr, size, ts, ts2, gts, gts2;
    uint32_t batch, pid, tid;
};
/* One va space = one uvm open file after UVM_INITIALIZE. */
struct vspace {
    pid_t pid;
    uint64_t registered; /* GPUs registered with UVM_REGISTER_GPU */
    struct mrange *ranges;
    uint64_t cap[MAX_GPUS], resident[MAX_GPUS];
    uint32_t next_batch[MAX_GPUS];
    struct fifo_ent *fifo[MAX_GPUS];
    size_t fhead[MAX_GPUS], flen[MAX_GPUS], fcap[MAX_GPUS];
    struct ev *evs;
    size_t nev, evcap;
};

struct uvm_release_rec {
    uint64_t file;
    pid_t opener, va_pid;
    int64_t mono_ns;
    struct uvm_release_rec *next;
};

static struct {
    struct tracker *trackers;
    struct pending_init *pending;
    struct uvm_release_rec *releases;
    uint64_t next_tracker, next_token, next_seq;
    char uvm_path[4096]; /* realpath of MOUNT/nvidia-uvm, to recognise our files */
    FILE *log;           /* --event-log: JSON lines */
} u;

static int64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
/* CPU stamps are CLOCK_MONOTONIC_RAW, as the driver's (real-h200 README). */
static uint64_t now_raw(void) { return (uint64_t)clock_ns(CLOCK_MONOTONIC_RAW); }
/* GPU g's fake global timer: CLOCK_MONOTONIC_RAW + (g + 1) * 10^12 ns. */
static uint64_t gpu_timer(int gpu) { return now_raw() + (uint64_t)(gpu + 1) * 1000000000000ull; }

static pid_t tgid_of(pid_t tid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)tid);
    FILE *f = fopen(path, "re");
    pid_t tg = tid;
    if (!f)
        return tid;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Tgid:", 5)) {
            tg = (pid_t)atoi(line + 5);
            break;
        }
    fclose(f);
    return tg;
}

static int vm_rw(pid_t pid, uint64_t addr, void *buf, size_t len, int write)
{
    struct iovec l = {buf, len}, r = {(void *)(uintptr_t)addr, len};
    ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    return n == (ssize_t)len ? 0 : -1;
}

static void *closer_main(void *a)
{
    close((int)(intptr_t)a);
    return NULL;
}

/* close() of a file of this filesystem sends FLUSH to this single-threaded server:
 * never from the loop itself. */
static void close_async(int fd)
{
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, closer_main, (void *)(intptr_t)fd))
        abort();
    pthread_attr_destroy(&at);
}

struct ident_arg {
    int fd;
    uint64_t token;
};
static void *identify_main(void *a)
{
    struct ident_arg x = *(struct ident_arg *)a;
    free(a);
    ioctl(x.fd, UVM_STANDIN_IDENTIFY, (unsigned long)x.token);
    return NULL;
}

static void log_release(struct ofile *of)
{
    struct uvm_release_rec *r = calloc(1, sizeof *r);
    if (!r)
        abort();
    r->file = of->id;
    r->opener = of->opener;
    r->va_pid = of->vs ? of->vs->pid : 0;
    r->mono_ns = clock_ns(CLOCK_MONOTONIC);
    r->next = u.releases;
    u.releases = r;
    if (u.log) {
        fprintf(u.log, "{\"ev\":\"uvm_release\",\"file\":%" PRIu64 ",\"pid\":%d,\"mono_ns\":%" PRId64 "}\n",
                r->file, (int)r->va_pid, r->mono_ns);
        fflush(u.log);
    }
}

/* ---- encoding ---- */

static unsigned proc_index(int proc, int v2)
{
    return proc < 0 ? 0u : v2 ? UVM_V2_GPU_ID((unsigned)proc) : UVM_V1_GPU_ID((unsigned)proc);
}

static void ev_encode(const struct ev *e, int v2, uint8_t out[UVM_ENTRY_SIZE_V2])
{
    memset(out, 0, UVM_ENTRY_SIZE_V2);
    switch (e->type) {
    case UVM_EV_CPU_FAULT: {
        UvmEventCpuFaultInfo r = {.eventType = e->type, .accessType = e->access, .cpuId = 0,
                                  .address = e->addr, .timeStamp = e->ts, .pid = e->pid,
                                  .threadId = e->tid, .pc = 0};
        memcpy(out, &r, sizeof r);
        break;
    }
    case UVM_EV_MIGRATION:
        if (v2) {
            UvmEventMigrationInfo_V2 r = {.eventType = e->type, .migrationCause = e->cause,
                                          .srcIndex = (NvU16)proc_index(e->src, 1),
                                          .dstIndex = (NvU16)proc_index(e->dst, 1),
                                          .srcNid = e->src < 0 ? 0 : -1, .dstNid = e->dst < 0 ? 0 : -1,
                                          .address = e->addr, .migratedBytes = e->size,
                                          .beginTimeStamp = e->ts, .endTimeStamp = e->ts2,
                                          .beginTimeStampGpu = e->gts, .endTimeStampGpu = e->gts2};
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventMigrationInfo_V1 r = {.eventType = e->type, .migrationCause = e->cause,
                                          .srcIndex = (NvU8)proc_index(e->src, 0),
                                          .dstIndex = (NvU8)proc_index(e->dst, 0),
                                          .address = e->addr, .migratedBytes = e->size,
                                          .beginTimeStamp = e->ts, .endTimeStamp = e->ts2,
                                          .beginTimeStampGpu = e->gts, .endTimeStampGpu = e->gts2};
            memcpy(out, &r, sizeof r);
        }
        break;
    case UVM_EV_GPU_FAULT:
        if (v2) {
            UvmEventGpuFaultInfo_V2 r = {.eventType = e->type, .faultType = e->fault_type,
                                         .gpuIndex = (NvU16)proc_index(e->src, 1), .address = e->addr,
                                         .timeStamp = e->ts, .timeStampGpu = e->gts,
                                         .batchId = e->batch, .clientType = e->client,
                                         .accessType = e->access};
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventGpuFaultInfo_V1 r = {.eventType = e->type, .faultType = e->fault_type,
                                         .accessType = e->access,
                                         .gpuIndex = (NvU8)proc_index(e->src, 0), .address = e->addr,
                                         .timeStamp = e->ts, .timeStampGpu = e->gts,
                                         .batchId = e->batch, .clientType = e->client};
            memcpy(out, &r, sizeof r);
        }
        break;
    case UVM_EV_GPU_FAULT_REPLAY:
        if (v2) {
            UvmEventGpuFaultReplayInfo_V2 r = {.eventType = e->type, .clientType = e->client,
                                               .gpuIndex = (NvU16)proc_index(e->src, 1),
                                               .batchId = e->batch, .timeStamp = e->ts,
                                               .timeStampGpu = e->gts};
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventGpuFaultReplayInfo_V1 r = {.eventType = e->type, .clientType = e->client,
                                               .gpuIndex = (NvU8)proc_index(e->src, 0),
                                               .batchId = e->batch, .timeStamp = e->ts,
                                               .timeStampGpu = e->gts};
            memcpy(out, &r, sizeof r);
        }
        break;
    case UVM_EV_THRASHING_DETECTED: {
        /* processors: the CPU (src -1) and the GPU (dst) the page moved between */
        unsigned a = proc_index(e->src, v2), b = proc_index(e->dst, v2);
        if (v2) {
            UvmEventThrashingDetectedInfo_V2 r = {.eventType = e->type, .address = e->addr,
                                                  .size = e->size, .timeStamp = e->ts};
            r.processors[a / 64] |= 1ull << (a % 64);
            r.processors[b / 64] |= 1ull << (b % 64);
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventThrashingDetectedInfo_V1 r = {.eventType = e->type, .address = e->addr,
                                                  .size = e->size, .timeStamp = e->ts};
            r.processors = (1ull << a) | (1ull << b);
            memcpy(out, &r, sizeof r);
        }
        break;
    }
    case UVM_EV_THROTTLING_START:
    case UVM_EV_THROTTLING_END:
        if (v2) {
            UvmEventThrottlingInfo_V2 r = {.eventType = e->type,
                                           .processorIndex = (NvU16)proc_index(e->src, 1),
                                           .address = e->addr, .timeStamp = e->ts};
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventThrottlingInfo_V1 r = {.eventType = e->type,
                                           .processorIndex = (NvU8)proc_index(e->src, 0),
                                           .address = e->addr, .timeStamp = e->ts};
            memcpy(out, &r, sizeof r);
        }
        break;
    case UVM_EV_MAP_REMOTE:
        if (v2) {
            UvmEventMapRemoteInfo_V2 r = {.eventType = e->type, .mapRemoteCause = e->cause,
                                          .srcIndex = (NvU16)proc_index(e->src, 1),
                                          .dstIndex = (NvU16)proc_index(e->dst, 1),
                                          .address = e->addr, .size = e->size, .timeStamp = e->ts,
                                          .timeStampGpu = e->gts};
            memcpy(out, &r, sizeof r);
        } else {
            UvmEventMapRemoteInfo_V1 r = {.eventType = e->type, .mapRemoteCause = e->cause,
                                          .srcIndex = (NvU8)proc_index(e->src, 0),
                                          .dstIndex = (NvU8)proc_index(e->dst, 0),
                                          .address = e->addr, .size = e->size, .timeStamp = e->ts,
                                          .timeStampGpu = e->gts};
            memcpy(out, &r, sizeof r);
        }
        break;
    default:
        out[0] = e->type;
        break;
    }
}

/* ---- delivery into trackers' memory ---- */

#define OUT_NOT_ENABLED (-2)
#define OUT_DROPPED (-1)
#define CHUNK 256

/*
 * The driver's enqueue_event, for a run of events: read get_behind (the consumer's index),
 * copy each record to put_behind unless only one free slot is left (then dropped[type]++),
 * then publish put_ahead = put_behind. get_behind is re-read every CHUNK events.
 */
static void tracker_deliver(struct tracker *t, const struct ev *evs, size_t n, int64_t *outc)
{
    static uint8_t buf[CHUNK * UVM_ENTRY_SIZE_V2];
    UvmToolsEventControlData ctl;
    uint32_t mask = t->count - 1;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        if (vm_rw(t->pid, t->control, &ctl, sizeof ctl, 0)) {
            for (size_t i = 0; i < m; i++)
                outc[i0 + i] = OUT_DROPPED;
            continue;
        }
        uint32_t gb = ctl.get_behind & mask, put = ctl.put_behind & mask, start = put;
        int dropped_any = 0;
        size_t nw = 0;
        for (size_t i = 0; i < m; i++) {
            const struct ev *e = &evs[i0 + i];
            if (!(t->events & (1ull << e->type))) {
                outc[i0 + i] = OUT_NOT_ENABLED;
                continue;
            }
            if (((t->count + gb - put) & mask) == 1) {
                ctl.dropped[e->type]++;
                t->dropped[e->type]++;
                dropped_any = 1;
                outc[i0 + i] = OUT_DROPPED;
                continue;
            }
            uint8_t rec[UVM_ENTRY_SIZE_V2];
            ev_encode(e, t->v2, rec);
            memcpy(buf + nw * t->entry_size, rec, t->entry_size);
            outc[i0 + i] = put;
            t->written[e->type]++;
            put = (put + 1) & mask;
            nw++;
        }
        if (nw) {
            /* the records may wrap around the end of the queue */
            size_t first = nw < t->count - start ? nw : t->count - start;
            vm_rw(t->pid, t->queue + (uint64_t)start * t->entry_size, buf, first * t->entry_size, 1);
            if (nw > first)
                vm_rw(t->pid, t->queue, buf + first * t->entry_size, (nw - first) * t->entry_size, 1);
            NvU32 pp[2] = {put, put};
            vm_rw(t->pid, t->control + offsetof(UvmToolsEventControlData, put_ahead), pp, sizeof pp, 1);
        }
        if (dropped_any)
            vm_rw(t->pid, t->control + offsetof(UvmToolsEventControlData, dropped), ctl.dropped,
                  sizeof ctl.dropped, 1);
        if (t->ph && ((t->count + put - (ctl.get_ahead & mask)) & mask) >= t->threshold) {
            fuse_lowlevel_notify_poll(t->ph);
            fuse_pollhandle_destroy(t->ph);
            t->ph = NULL;
        }
    }
}

static int counter_matches(struct tracker *t, unsigned counter, int proc)
{
    if (t->all_processors)
        return counter != UVM_COUNTER_CPU_FAULTS || proc < 0;
    NvU8 want[16];
    static const NvU8 cpu[16] = NV_PROCESSOR_UUID_CPU_DEFAULT_BYTES;
    if (proc < 0)
        memcpy(want, cpu, 16);
    else
        gpu_uuid(proc, want);
    return !memcmp(want, t->processor, 16);
}

static void count_event(struct tracker *t, const struct ev *e)
{
#define INC(cn, amount, proc)                                                         \
    do {                                                                              \
        if ((t->counter_mask & (1ull << (cn))) && counter_matches(t, (cn), (proc)))   \
            t->cdelta[(cn)] += (amount);                                              \
    } while (0)
    if (e->type == UVM_EV_MIGRATION) {
        if (e->src < 0 && e->dst >= 0)
            INC(UVM_COUNTER_BYTES_HTD, e->size, e->dst);
        if (e->src >= 0 && e->dst < 0)
            INC(UVM_COUNTER_BYTES_DTH, e->size, e->src);
    } else if (e->type == UVM_EV_CPU_FAULT) {
        INC(UVM_COUNTER_CPU_FAULTS, 1, -1);
    } else if (e->type == UVM_EV_GPU_FAULT && e->cause == 0) { /* cause 1 marks a duplicate */
        INC(UVM_COUNTER_GPU_FAULTS, 1, e->src);
    }
#undef INC
}

static const char *const EV_NAME[] = {
    [UVM_EV_CPU_FAULT] = "cpu_fault", [UVM_EV_MIGRATION] = "migration",
    [UVM_EV_GPU_FAULT] = "gpu_fault", [UVM_EV_GPU_FAULT_REPLAY] = "gpu_fault_replay",
    [UVM_EV_THRASHING_DETECTED] = "thrashing_detected",
    [UVM_EV_THROTTLING_START] = "throttling_start", [UVM_EV_THROTTLING_END] = "throttling_end",
    [UVM_EV_MAP_REMOTE] = "map_remote"};

static void hex(FILE *f, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", b[i]);
}

static void proc_name(char *out, int proc)
{
    if (proc < 0)
        strcpy(out, "cpu");
    else
        sprintf(out, "gpu%d", proc);
}

/* Delivers the events the current operation produced to every tracker of this va space
 * and writes them, with where each landed, to the event log. */
static void vs_flush(struct ofile *of)
{
    struct vspace *vs = of->vs;
    size_t n = vs->nev;
    if (!n)
        return;
    size_t nt = 0;
    for (struct tracker *t = u.trackers; t; t = t->next)
        if (t->target == of)
            nt++;
    int64_t *outc = calloc(nt * n + 1, sizeof *outc);
    uint64_t *tids = calloc(nt + 1, sizeof *tids);
    if (!outc || !tids)
        abort();
    size_t k = 0;
    for (struct tracker *t = u.trackers; t; t = t->next) {
        if (t->target != of)
            continue;
        tids[k] = t->id;
        if (t->is_queue) {
            tracker_deliver(t, vs->evs, n, outc + k * n);
        } else {
            for (size_t i = 0; i < n; i++) {
                outc[k * n + i] = OUT_NOT_ENABLED;
                count_event(t, &vs->evs[i]);
            }
            NvU64 cur[UVM_TOTAL_COUNTERS];
            if (!vm_rw(t->pid, t->control, cur, sizeof cur, 0)) {
                for (unsigned c = 0; c < UVM_TOTAL_COUNTERS; c++)
                    cur[c] += t->cdelta[c];
                vm_rw(t->pid, t->control, cur, sizeof cur, 1);
            }
            memset(t->cdelta, 0, sizeof t->cdelta);
        }
        k++;
    }
    if (u.log) {
        for (size_t i = 0; i < n; i++) {
            const struct ev *e = &vs->evs[i];
            uint8_t r1[UVM_ENTRY_SIZE_V2], r2[UVM_ENTRY_SIZE_V2];
            char s[16], d[16];
            ev_encode(e, 0, r1);
            ev_encode(e, 1, r2);
            proc_name(s, e->src);
            proc_name(d, e->dst);
            fprintf(u.log,
                    "{\"ev\":\"event\",\"seq\":%" PRIu64 ",\"file\":%" PRIu64 ",\"pid\":%d,"
                    "\"type\":%u,\"name\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"addr\":%" PRIu64
                    ",\"size\":%" PRIu64 ",\"cause\":%u,\"access\":%u,\"batch\":%u,\"dup\":%s,"
                    "\"v1\":\"",
                    u.next_seq++, of->id, (int)vs->pid, e->type, EV_NAME[e->type], s,
                    e->type == UVM_EV_MIGRATION || e->type == UVM_EV_MAP_REMOTE ? d : "", e->addr,
                    e->size, e->type == UVM_EV_GPU_FAULT ? 0u : e->cause, e->access, e->batch,
                    e->type == UVM_EV_GPU_FAULT && e->cause ? "true" : "false");
            hex(u.log, r1, UVM_ENTRY_SIZE_V1);
            fputs("\",\"v2\":\"", u.log);
            hex(u.log, r2, UVM_ENTRY_SIZE_V2);
            fputs("\",\"delivered\":{", u.log);
            int first = 1;
            for (size_t j = 0; j < nt; j++)
                if (outc[j * n + i] >= 0) {
                    fprintf(u.log, "%s\"%" PRIu64 "\":%" PRId64, first ? "" : ",", tids[j], outc[j * n + i]);
                    first = 0;
                }
            fputs("},\"dropped\":[", u.log);
            first = 1;
            for (size_t j = 0; j < nt; j++)
                if (outc[j * n + i] == OUT_DROPPED) {
                    fprintf(u.log, "%s%" PRIu64, first ? "" : ",", tids[j]);
                    first = 0;
                }
            fputs("]}\n", u.log);
        }
        fflush(u.log);
    }
    free(outc);
    free(tids);
    vs->nev = 0;
}

static struct ev *ev_new(struct vspace *vs, uint8_t type)
{
    if (vs->nev == vs->evcap) {
        vs->evcap = vs->evcap ? 2 * vs->evcap : 1024;
        vs->evs = realloc(vs->evs, vs->evcap * sizeof *vs->evs);
        if (!vs->evs)
            abort();
    }
    struct ev *e = &vs->evs[vs->nev++];
    memset(e, 0, sizeof *e);
    e->type = type;
    e->src = e->dst = -1;
    e->ts = now_raw();
    return e;
}

/* ---- the managed-memory model ---- */

static void vs_free(struct vspace *vs)
{
    if (!vs)
        return;
    while (vs->ranges) {
        struct mrange *r = vs->ranges;
        vs->ranges = r->next;
        free(r->res);
        free(r->nmig);
        free(r->flags);
        free(r->gen);
        free(r);
    }
    for (int i = 0; i < MAX_GPUS; i++)
        free(vs->fifo[i]);
    free(vs->evs);
    free(vs);
}

static struct mrange *mrange_at(struct vspace *vs, uint64_t addr)
{
    for (struct mrange *r = vs->ranges; r; r = r->next)
        if (addr >= r->base && addr - r->base < (uint64_t)r->npages * STANDIN_PAGE)
            return r;
    return NULL;
}

static void fifo_push(struct vspace *vs, int gpu, struct mrange *r, uint32_t page)
{
    if (vs->fhead[gpu] + vs->flen[gpu] == vs->fcap[gpu]) {
        if (vs->fhead[gpu]) {
            memmove(vs->fifo[gpu], vs->fifo[gpu] + vs->fhead[gpu], vs->flen[gpu] * sizeof(struct fifo_ent));
            vs->fhead[gpu] = 0;
        } else {
            vs->fcap[gpu] = vs->fcap[gpu] ? 2 * vs->fcap[gpu] : 1024;
            vs->fifo[gpu] = realloc(vs->fifo[gpu], vs->fcap[gpu] * sizeof(struct fifo_ent));
            if (!vs->fifo[gpu])
                abort();
        }
    }
    vs->fifo[gpu][vs->fhead[gpu] + vs->flen[gpu]++] = (struct fifo_ent){r, page, r->gen[page]};
}

static void emit_migration(struct vspace *vs, int src, int dst, uint8_t cause, uint64_t addr, uint64_t bytes)
{
    struct ev *e = ev_new(vs, UVM_EV_MIGRATION);
    int gpu = dst >= 0 ? dst : src;
    e->src = src;
    e->dst = dst;
    e->cause = cause;
    e->addr = addr;
    e->size = bytes;
    e->gts = gpu_timer(gpu);
    e->ts2 = now_raw();
    e->gts2 = gpu_timer(gpu);
}

/* Makes room for one page on the GPU: the oldest page placed there goes to the CPU. */
static void ensure_capacity(struct vspace *vs, int gpu)
{
    while (vs->cap[gpu] && vs->resident[gpu] >= vs->cap[gpu] && vs->flen[gpu]) {
        struct fifo_ent fe = vs->fifo[gpu][vs->fhead[gpu]++];
        vs->flen[gpu]--;
        if (fe.r->res[fe.page] != RES_GPU(gpu) || fe.r->gen[fe.page] != fe.gen)
            continue; /* left the GPU some other way since */
        emit_migration(vs, gpu, -1, UVM_CAUSE_EVICTION, fe.r->base + (uint64_t)fe.page * STANDIN_PAGE,
                       STANDIN_PAGE);
        fe.r->res[fe.page] = RES_CPU;
        vs->resident[gpu]--;
    }
}

static void place_on_gpu(struct vspace *vs, int gpu, struct mrange *r, uint32_t p)
{
    r->res[p] = (uint8_t)RES_GPU(gpu);
    r->gen[p]++;
    vs->resident[gpu]++;
    fifo_push(vs, gpu, r, p);
}

/* A fault-driven migration of page p (counts towards thrashing; STANDIN_THRASH_THRESHOLD). */
static void fault_migrate(struct vspace *vs, struct mrange *r, uint32_t p, int from, int to)
{
    uint64_t addr = r->base + (uint64_t)p * STANDIN_PAGE;
    emit_migration(vs, from, to, UVM_CAUSE_COHERENCE, addr, STANDIN_PAGE);
    if (from >= 0)
        vs->resident[from]--;
    if (to >= 0)
        place_on_gpu(vs, to, r, p);
    else
        r->res[p] = RES_CPU;
    if (r->nmig[p] < 255)
        r->nmig[p]++;
    if (r->nmig[p] == STANDIN_THRASH_THRESHOLD && !(r->flags[p] & PF_THRASH)) {
        /* Detected on the migration that reaches the threshold: the accessor is throttled
         * once and the page stays where it now is; the other side maps it remotely. */
        int gpu = to >= 0 ? to : from;
        struct ev *e = ev_new(vs, UVM_EV_THRASHING_DETECTED);
        e->src = -1;
        e->dst = gpu;
        e->addr = addr;
        e->size = STANDIN_PAGE;
        e = ev_new(vs, UVM_EV_THROTTLING_START);
        e->src = to;
        e->addr = addr;
        e = ev_new(vs, UVM_EV_THROTTLING_END);
        e->src = to;
        e->addr = addr;
        r->flags[p] |= PF_THRASH;
    }
}

static void map_remote(struct vspace *vs, struct mrange *r, uint32_t p, int mapper, int resident)
{
    struct ev *e = ev_new(vs, UVM_EV_MAP_REMOTE);
    e->src = mapper;
    e->dst = resident;
    e->cause = UVM_MAP_REMOTE_CAUSE_THRASHING;
    e->addr = r->base + (uint64_t)p * STANDIN_PAGE;
    e->size = STANDIN_PAGE;
    e->gts = gpu_timer(mapper >= 0 ? mapper : resident);
    r->flags[p] |= PF_REMOTE;
}

static int res_proc(uint8_t res) { return res >= 2 ? res - 2 : -1; }

static NV_STATUS op_range_check(struct vspace *vs, const UVM_STANDIN_TEST_PARAMS *q, struct mrange **out)
{
    if (!q->length || (q->base | q->length) & (STANDIN_PAGE - 1))
        return NV_ERR_INVALID_ADDRESS;
    struct mrange *r = mrange_at(vs, q->base);
    if (!r || q->length > (uint64_t)r->npages * STANDIN_PAGE - (q->base - r->base))
        return NV_ERR_INVALID_ADDRESS;
    *out = r;
    return NV_OK;
}

static NV_STATUS op_cpu_touch(struct call *c, struct vspace *vs, const UVM_STANDIN_TEST_PARAMS *q)
{
    struct mrange *r;
    NV_STATUS st = op_range_check(vs, q, &r);
    if (st)
        return st;
    uint32_t p0 = (uint32_t)((q->base - r->base) / STANDIN_PAGE), n = (uint32_t)(q->length / STANDIN_PAGE);
    for (uint32_t p = p0; p < p0 + n; p++) {
        if (r->res[p] == RES_CPU || (r->flags[p] & PF_REMOTE))
            continue;
        struct ev *e = ev_new(vs, UVM_EV_CPU_FAULT);
        e->access = (uint8_t)q->access;
        e->addr = r->base + (uint64_t)p * STANDIN_PAGE;
        e->pid = (uint32_t)vs->pid;
        e->tid = (uint32_t)c->pid;
        int from = res_proc(r->res[p]);
        if (r->res[p] == RES_NONE)
            r->res[p] = RES_CPU;
        else if (r->flags[p] & PF_THRASH)
            map_remote(vs, r, p, -1, from);
        else
            fault_migrate(vs, r, p, from, -1);
    }
    return NV_OK;
}

static NV_STATUS op_gpu_kernel(struct ofile *of, const UVM_STANDIN_TEST_PARAMS *q)
{
    struct vspace *vs = of->vs;
    struct mrange *r;
    NV_STATUS st = op_range_check(vs, q, &r);
    if (st)
        return st;
    int gpu = (int)q->gpu;
    if (q->gpu >= (NvU32)g.ngpus || !(vs->registered & (1ull << gpu)))
        return NV_ERR_INVALID_DEVICE;
    if (!q->batch || (q->prefetch & (q->prefetch - 1)))
        return NV_ERR_INVALID_ARGUMENT;
    uint32_t p0 = (uint32_t)((q->base - r->base) / STANDIN_PAGE), n = (uint32_t)(q->length / STANDIN_PAGE);
    uint32_t *batch = malloc(q->batch * sizeof *batch);
    if (!batch)
        abort();
    uint64_t k = 0; /* unique faults so far in this kernel */
    uint32_t p = p0;
    while (p < p0 + n) {
        /* collect one batch of faulting pages, in address order */
        uint32_t nb = 0;
        for (; p < p0 + n && nb < q->batch; p++)
            if (r->res[p] != RES_GPU(gpu) && !(r->flags[p] & PF_REMOTE))
                batch[nb++] = p;
        if (!nb)
            break;
        uint32_t id = vs->next_batch[gpu]++;
        for (uint32_t i = 0; i < nb; i++, k++) {
            for (int dup = 0; dup < 2; dup++) {
                if (dup && !(q->dup_every && k % q->dup_every == q->dup_every - 1))
                    break;
                struct ev *e = ev_new(vs, UVM_EV_GPU_FAULT);
                e->src = gpu;
                e->fault_type = r->res[batch[i]] == RES_NONE ? UVM_FAULT_INVALID_PDE : UVM_FAULT_INVALID_PTE;
                e->access = (uint8_t)q->access;
                e->client = UVM_CLIENT_TYPE_GPC;
                e->addr = r->base + (uint64_t)batch[i] * STANDIN_PAGE;
                e->batch = id;
                e->gts = gpu_timer(gpu);
                e->cause = (uint8_t)dup; /* internal: marks the duplicate for the counters */
            }
        }
        /* service the batch */
        for (uint32_t i = 0; i < nb; i++) {
            uint32_t pg = batch[i];
            if (r->res[pg] == RES_GPU(gpu))
                continue; /* prefetched by an earlier fault of this batch */
            int from = res_proc(r->res[pg]);
            if (r->flags[pg] & PF_THRASH && r->res[pg] != RES_NONE) {
                map_remote(vs, r, pg, gpu, from);
                continue;
            }
            ensure_capacity(vs, gpu);
            if (r->res[pg] == RES_NONE)
                place_on_gpu(vs, gpu, r, pg);
            else
                fault_migrate(vs, r, pg, from, gpu);
            if (q->prefetch > 1) {
                uint32_t rs = pg - (pg - 0) % q->prefetch, cnt = 0, lo = 0;
                for (uint32_t x = rs; x < rs + q->prefetch && x < r->npages; x++)
                    if (x != pg && r->res[x] == RES_CPU && !(r->flags[x] & PF_THRASH))
                        cnt++;
                if (cnt && (!vs->cap[gpu] || vs->resident[gpu] + cnt <= vs->cap[gpu])) {
                    int first = 1;
                    for (uint32_t x = rs; x < rs + q->prefetch && x < r->npages; x++)
                        if (x != pg && r->res[x] == RES_CPU && !(r->flags[x] & PF_THRASH)) {
                            if (first)
                                lo = x;
                            first = 0;
                            place_on_gpu(vs, gpu, r, x);
                        }
                    emit_migration(vs, -1, gpu, UVM_CAUSE_PREFETCH, r->base + (uint64_t)lo * STANDIN_PAGE,
                                   (uint64_t)cnt * STANDIN_PAGE);
                }
            }
        }
        struct ev *e = ev_new(vs, UVM_EV_GPU_FAULT_REPLAY);
        e->src = gpu;
        e->client = UVM_CLIENT_TYPE_GPC;
        e->batch = id;
        e->gts = gpu_timer(gpu);
        vs_flush(of); /* per batch, so a concurrent consumer sees the stream grow */
    }
    free(batch);
    return NV_OK;
}

static NV_STATUS op_migrate(struct vspace *vs, const UVM_STANDIN_TEST_PARAMS *q)
{
    struct mrange *r;
    NV_STATUS st = op_range_check(vs, q, &r);
    if (st)
        return st;
    int dest = (int)q->dest - 1; /* -1 = CPU */
    if (q->dest > (NvU32)g.ngpus || (dest >= 0 && !(vs->registered & (1ull << dest))))
        return NV_ERR_INVALID_DEVICE;
    uint32_t p0 = (uint32_t)((q->base - r->base) / STANDIN_PAGE), n = (uint32_t)(q->length / STANDIN_PAGE);
    uint8_t want = dest < 0 ? RES_CPU : (uint8_t)RES_GPU(dest);
    /* one event per run of pages with the same source inside one 2 MiB block */
    uint32_t p = p0;
    while (p < p0 + n) {
        if (r->res[p] == want || r->res[p] == RES_NONE) {
            if (r->res[p] == RES_NONE) {
                if (dest >= 0) {
                    ensure_capacity(vs, dest);
                    place_on_gpu(vs, dest, r, p);
                } else {
                    r->res[p] = RES_CPU;
                }
            }
            p++;
            continue;
        }
        uint8_t from = r->res[p];
        uint64_t addr = r->base + (uint64_t)p * STANDIN_PAGE;
        uint32_t cnt = 0;
        do {
            if (dest >= 0)
                ensure_capacity(vs, dest);
            if (res_proc(from) >= 0)
                vs->resident[res_proc(from)]--;
            if (dest >= 0)
                place_on_gpu(vs, dest, r, p);
            else
                r->res[p] = RES_CPU;
            cnt++;
            p++;
        } while (p < p0 + n && r->res[p] == from &&
                 ((r->base + (uint64_t)p * STANDIN_PAGE) & ((2ull << 20) - 1)) != 0);
        emit_migration(vs, res_proc(from), dest, UVM_CAUSE_USER, addr, (uint64_t)cnt * STANDIN_PAGE);
    }
    return NV_OK;
}

static NV_STATUS op_register_range(struct vspace *vs, const UVM_STANDIN_TEST_PARAMS *q)
{
    if (!q->length || (q->base | q->length) & (STANDIN_PAGE - 1) || q->length / STANDIN_PAGE > UINT32_MAX)
        return NV_ERR_INVALID_ADDRESS;
    for (struct mrange *x = vs->ranges; x; x = x->next)
        if (q->base < x->base + (uint64_t)x->npages * STANDIN_PAGE && x->base < q->base + q->length)
            return NV_ERR_UVM_ADDRESS_IN_USE;
    struct mrange *r = calloc(1, sizeof *r);
    if (!r)
        abort();
    r->base = q->base;
    r->npages = (uint32_t)(q->length / STANDIN_PAGE);
    r->res = calloc(r->npages, 1);
    r->nmig = calloc(r->npages, 1);
    r->flags = calloc(r->npages, 1);
    r->gen = calloc(r->npages, sizeof *r->gen);
    if (!r->res || !r->nmig || !r->flags || !r->gen)
        abort();
    r->next = vs->ranges;
    vs->ranges = r;
    return NV_OK;
}

/* UVM_STANDIN_TEST: not part of the real protocol (README). */
static void standin_test(struct call *c, uint64_t arg)
{
    UVM_STANDIN_TEST_PARAMS q;
    if (pmem_read(c->pid, arg, &q, sizeof q)) {
        fuse_reply_err(c->req, EFAULT);
        return;
    }
    NV_STATUS st;
    struct vspace *vs = c->of->vs;
    if (c->of->uvm_state != UVM_FD_VA_SPACE || !vs) {
        st = NV_ERR_ILLEGAL_ACTION;
    } else {
        switch (q.op) {
        case STANDIN_OP_REGISTER_RANGE: st = op_register_range(vs, &q); break;
        case STANDIN_OP_CPU_TOUCH: st = op_cpu_touch(c, vs, &q); break;
        case STANDIN_OP_GPU_KERNEL: st = op_gpu_kernel(c->of, &q); break;
        case STANDIN_OP_MIGRATE: st = op_migrate(vs, &q); break;
        case STANDIN_OP_SET_CAPACITY:
            if (q.gpu >= (NvU32)g.ngpus) {
                st = NV_ERR_INVALID_DEVICE;
            } else {
                vs->cap[q.gpu] = q.length / STANDIN_PAGE;
                st = NV_OK;
            }
            break;
        default: st = NV_ERR_INVALID_ARGUMENT; break;
        }
        vs_flush(c->of);
    }
    vlog("  standin test op %u -> 0x%x", q.op, st);
    if (pmem_write(c->pid, arg + offsetof(UVM_STANDIN_TEST_PARAMS, rmStatus), &st, sizeof st))
        fuse_reply_err(c->req, EFAULT);
    else
        fuse_reply_ioctl(c->req, 0, NULL, 0);
}

/* ---- the tools ioctls ---- */

static void reply_status(struct call *c, uint64_t arg, uint32_t off, NV_STATUS st)
{
    vlog("  -> rmStatus 0x%x", st);
    if (pmem_write(c->pid, arg + off, &st, sizeof st))
        fuse_reply_err(c->req, EFAULT);
    else
        fuse_reply_ioctl(c->req, 0, NULL, 0);
}

static void tools_init(struct call *c, uint64_t arg, int v2)
{
    UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS p;
    const uint32_t soff = offsetof(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, rmStatus);
    if (pmem_read(c->pid, arg, &p, sizeof p)) {
        fuse_reply_err(c->req, EFAULT);
        return;
    }
    pid_t tg = tgid_of(c->pid);
    unsigned esz = v2 ? UVM_ENTRY_SIZE_V2 : UVM_ENTRY_SIZE_V1;
    uint8_t probe[sizeof(UvmToolsEventControlData)];
    if (c->of->trk)
        return reply_status(c, arg, soff, NV_ERR_INVALID_ARGUMENT);
    if (p.queueBufferSize &&
        (p.queueBufferSize > UINT32_MAX || p.queueBufferSize < 2 || (p.queueBufferSize & (p.queueBufferSize - 1))))
        return reply_status(c, arg, soff, NV_ERR_INVALID_ARGUMENT);
    /* the driver pins both buffers here: they must be the caller's writable memory */
    size_t csz = p.queueBufferSize ? sizeof(UvmToolsEventControlData) : UVM_TOTAL_COUNTERS * sizeof(NvU64);
    if (vm_rw(tg, p.controlBuffer, probe, csz, 0) || vm_rw(tg, p.controlBuffer, probe, csz, 1) ||
        (p.queueBufferSize &&
         (vm_rw(tg, p.queueBuffer, probe, 1, 0) ||
          vm_rw(tg, p.queueBuffer + p.queueBufferSize * esz - 1, probe, 1, 0))))
        return reply_status(c, arg, soff, NV_ERR_INVALID_ADDRESS);
    /* The driver only fget()s uvmFd, which never runs the file's FLUSH: this server
     * must take a reference to learn which file it is, and closing a foreign file
     * would run its FLUSH (a hostile FUSE file never answers one). Names first. */
    char plink[64], ptarget[4096];
    snprintf(plink, sizeof plink, "/proc/%d/fd/%d", (int)tg, (int)p.uvmFd);
    ssize_t pn = readlink(plink, ptarget, sizeof ptarget - 1);
    if (pn <= 0 || (ptarget[pn] = 0, strcmp(ptarget, u.uvm_path)))
        return reply_status(c, arg, soff, NV_ERR_INSUFFICIENT_PERMISSIONS);
    int pfd = (int)syscall(SYS_pidfd_open, tg, 0);
    int sfd = pfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pfd, (int)p.uvmFd, 0);
    if (pfd >= 0)
        close(pfd);
    if (sfd < 0)
        return reply_status(c, arg, soff, NV_ERR_INSUFFICIENT_PERMISSIONS);
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", sfd);
    ssize_t ln = readlink(link, target, sizeof target - 1);
    if (ln <= 0 || (target[ln] = 0, strcmp(target, u.uvm_path))) {
        close(sfd); /* not a file of this filesystem: closing it cannot call us */
        return reply_status(c, arg, soff, NV_ERR_INSUFFICIENT_PERMISSIONS);
    }
    struct pending_init *pi = calloc(1, sizeof *pi);
    struct ident_arg *ia = calloc(1, sizeof *ia);
    if (!pi || !ia)
        abort();
    pi->token = ++u.next_token;
    pi->req = c->req;
    pi->tools = c->of;
    pi->tid = c->pid;
    pi->pid = tg;
    pi->arg = arg;
    pi->p = p;
    pi->v2 = v2;
    pi->srvfd = sfd;
    pi->next = u.pending;
    u.pending = pi;
    ia->fd = sfd;
    ia->token = pi->token;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, identify_main, ia))
        abort();
    pthread_attr_destroy(&at);
    /* answered in standin_identify() */
}

static void standin_identify(struct call *c, uint64_t token)
{
    if (tgid_of(c->pid) != getpid()) {
        fuse_reply_err(c->req, EINVAL);
        return;
    }
    struct pending_init *pi = NULL;
    for (struct pending_init **pp = &u.pending; *pp; pp = &(*pp)->next)
        if ((*pp)->token == token) {
            pi = *pp;
            *pp = pi->next;
            break;
        }
    fuse_reply_ioctl(c->req, 0, NULL, 0);
    if (!pi)
        return;
    struct ofile *target = c->of;
    NV_STATUS st = NV_OK;
    if (target->kind != K_UVM || target->uvm_state != UVM_FD_VA_SPACE || !target->vs) {
        st = NV_ERR_ILLEGAL_ACTION;
        close_async(pi->srvfd);
    } else {
        struct tracker *t = calloc(1, sizeof *t);
        if (!t)
            abort();
        t->id = ++u.next_tracker;
        t->tools = pi->tools;
        t->target = target;
        t->pid = pi->pid;
        t->srvfd = pi->srvfd;
        t->is_queue = pi->p.queueBufferSize != 0;
        t->v2 = pi->v2;
        t->entry_size = pi->v2 ? UVM_ENTRY_SIZE_V2 : UVM_ENTRY_SIZE_V1;
        t->count = (uint32_t)pi->p.queueBufferSize;
        t->threshold = t->count / 2;
        t->queue = pi->p.queueBuffer;
        t->control = pi->p.controlBuffer;
        t->all_processors = pi->p.allProcessors != 0;
        memcpy(t->processor, pi->p.processor.uuid, 16);
        t->next = u.trackers;
        u.trackers = t;
        pi->tools->trk = t;
        if (u.log) {
            fprintf(u.log,
                    "{\"ev\":\"tracker\",\"id\":%" PRIu64 ",\"tools_file\":%" PRIu64 ",\"file\":%" PRIu64
                    ",\"pid\":%d,\"target_pid\":%d,\"version\":%d,\"entries\":%u,\"mono_ns\":%" PRId64 "}\n",
                    t->id, t->tools->id, target->id, (int)t->pid, (int)target->vs->pid, t->v2 ? 2 : 1,
                    t->count, clock_ns(CLOCK_MONOTONIC));
            fflush(u.log);
        }
        vlog("  tracker %" PRIu64 " on file %" PRIu64 " (pid %d)", t->id, target->id, (int)target->vs->pid);
    }
    struct call pc = {pi->req, pi->tid, pi->tools, "nvidia-uvm-tools"};
    reply_status(&pc, pi->arg, offsetof(UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS, rmStatus), st);
    free(pi);
}

static void tracker_destroy(struct tracker *t)
{
    for (struct tracker **pp = &u.trackers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    if (t->ph)
        fuse_pollhandle_destroy(t->ph);
    if (u.log) {
        fprintf(u.log, "{\"ev\":\"tracker_closed\",\"id\":%" PRIu64 ",\"mono_ns\":%" PRId64 "}\n", t->id,
                clock_ns(CLOCK_MONOTONIC));
        fflush(u.log);
    }
    close_async(t->srvfd); /* drops the tracker's reference on the target's uvm file */
    free(t);
}

/* ioctls 57-61 on a tools fd. Returns the status (the tracker must exist). */
static NV_STATUS tools_cmd(struct call *c, unsigned cmd, uint64_t arg, int *rc)
{
    struct tracker *t = c->of->trk;
    if (cmd == UVM_TOOLS_SET_NOTIFICATION_THRESHOLD) {
        UVM_TOOLS_SET_NOTIFICATION_THRESHOLD_PARAMS q;
        if (pmem_read(c->pid, arg, &q, sizeof q)) {
            *rc = -EFAULT;
            return NV_OK;
        }
        if (!t || !t->is_queue)
            return NV_ERR_INVALID_ARGUMENT;
        t->threshold = q.notificationThreshold;
        return NV_OK;
    }
    UVM_TOOLS_FLAGS_PARAMS q;
    if (pmem_read(c->pid, arg, &q, sizeof q)) {
        *rc = -EFAULT;
        return NV_OK;
    }
    int events = cmd == UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS || cmd == UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS;
    int enable = cmd == UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS || cmd == UVM_TOOLS_ENABLE_COUNTERS;
    if (!t || t->is_queue != events)
        return NV_ERR_INVALID_ARGUMENT;
    uint64_t *m = events ? &t->events : &t->counter_mask;
    if (!events && (q.flags >> UVM_TOTAL_COUNTERS))
        return NV_ERR_INVALID_ARGUMENT;
    *m = enable ? *m | q.flags : *m & ~q.flags;
    return NV_OK;
}

static NV_STATUS uuid_table(struct call *c, uint64_t arg, int v2, int *rc)
{
    UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_PARAMS q;
    if (pmem_read(c->pid, arg, &q, sizeof q)) {
        *rc = -EFAULT;
        return NV_OK;
    }
    unsigned nproc = v2 ? UVM_MAX_PROCESSORS_V2 : UVM_MAX_PROCESSORS_V1;
    NvProcessorUuid *tab = calloc(nproc, sizeof *tab);
    static const NvU8 cpu[16] = NV_PROCESSOR_UUID_CPU_DEFAULT_BYTES;
    if (!tab)
        abort();
    memcpy(tab[0].uuid, cpu, 16);
    /* only the GPUs registered in this va space, as for_each_va_space_gpu */
    for (int i = 0; i < g.ngpus; i++)
        if (c->of->vs && (c->of->vs->registered & (1ull << i)))
            gpu_uuid(i, tab[v2 ? UVM_V2_GPU_ID((unsigned)i) : UVM_V1_GPU_ID((unsigned)i)].uuid);
    int bad = pmem_write(c->pid, q.tablePtr, tab, nproc * sizeof *tab);
    free(tab);
    return bad ? NV_ERR_INVALID_ADDRESS : NV_OK;
}

/* UVM_REGISTER_GPU: remember which of our GPUs the va space has (for the UUID table). */
static void note_register_gpu(struct call *c, uint64_t arg)
{
    NvU8 want[16], have[16];
    if (!c->of->vs || pmem_read(c->pid, arg, want, 16))
        return;
    for (int i = 0; i < g.ngpus; i++) {
        gpu_uuid(i, have);
        if (!memcmp(want, have, 16))
            c->of->vs->registered |= 1ull << i;
    }
}

static void op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct fuse_pollhandle *ph)
{
    (void)ino;
    struct ofile *of = (struct ofile *)(uintptr_t)fi->fh;
    struct tracker *t = of->kind == K_UVM_TOOLS ? of->trk : NULL;
    unsigned rev = 0;
    if (t && t->is_queue) {
        UvmToolsEventControlData ctl;
        uint32_t mask = t->count - 1;
        if (!vm_rw(t->pid, t->control, &ctl, 16, 0) &&
            ((t->count + ctl.put_behind - ctl.get_ahead) & mask) >= t->threshold)
            rev = POLLIN | POLLRDNORM;
    }
    if (ph) {
        if (t && !rev) {
            if (t->ph)
                fuse_pollhandle_destroy(t->ph);
            t->ph = ph;
        } else {
            fuse_pollhandle_destroy(ph);
        }
    }
    fuse_reply_poll(req, rev);
}

/*
 * UVM command words carry no size, so the kernel passes no data and the syscall
 * returns 0 here as in the driver. The result goes where the driver puts it:
 * rmStatus inside the caller's struct, written through /proc/<pid>/mem.
 */
static void uvm_ioctl(struct call *c, unsigned int cmd, uint64_t arg)
{
    const uvm_cmd_info *info = uvm_cmd(cmd);
    int tools = c->of->kind == K_UVM_TOOLS;
    vlog("pid %d %s %s cmd 0x%x arg 0x%" PRIx64, (int)c->pid, c->dev, info ? info->name : "?",
         cmd, arg);
    if (cmd == UVM_STANDIN_IDENTIFY && !tools) {
        standin_identify(c, arg);
        return;
    }
    if (cmd == UVM_STANDIN_TEST && !tools) {
        standin_test(c, arg);
        return;
    }
    /* Unrouted numbers fall through to uvm_test_ioctl, which refuses them. */
    if (!info || info->tools_fd != tools) {
        fuse_reply_err(c->req, EINVAL);
        return;
    }
    if (info->status_off == UINT32_MAX) {
        fuse_reply_ioctl(c->req, 0, NULL, 0);
        return;
    }

    int rc = 0;
    NV_STATUS st = NV_OK;
    struct ofile *of = c->of;
    if (tools) {
        if (cmd == UVM_TOOLS_INIT_EVENT_TRACKER || cmd == UVM_TOOLS_INIT_EVENT_TRACKER_V2) {
            tools_init(c, arg, cmd == UVM_TOOLS_INIT_EVENT_TRACKER_V2);
            return;
        }
        st = tools_cmd(c, cmd, arg, &rc);
    } else if (cmd == UVM_INITIALIZE) {
        if (of->uvm_state == UVM_FD_MM) {
            st = NV_ERR_ILLEGAL_ACTION;
        } else if (of->uvm_state != UVM_FD_VA_SPACE) {
            of->uvm_state = UVM_FD_VA_SPACE;
            of->vs = calloc(1, sizeof *of->vs);
            if (!of->vs)
                abort();
            of->vs->pid = tgid_of(c->pid);
        }
    } else if (cmd == UVM_MM_INITIALIZE) {
        /* What real CUDA sees on its second uvm fd (facts section 10). */
        if (of->uvm_state == UVM_FD_UNINIT) {
            of->uvm_state = UVM_FD_MM;
            st = NV_WARN_NOTHING_TO_DO;
        } else {
            st = NV_ERR_ILLEGAL_ACTION;
        }
    } else if (of->uvm_state != UVM_FD_VA_SPACE) {
        st = NV_ERR_ILLEGAL_ACTION;
    } else {
        switch (cmd) {
        case UVM_CREATE_EXTERNAL_RANGE:
            st = uvm_add_range(c, arg, UR_EXTERNAL, &rc);
            break;
        case UVM_ALLOC_SEMAPHORE_POOL:
            st = uvm_add_range(c, arg, UR_SEMAPHORE, &rc);
            break;
        case UVM_MAP_EXTERNAL_ALLOCATION:
            st = uvm_map_external(c, arg, &rc);
            break;
        case UVM_FREE:
            st = uvm_free(c, arg, &rc);
            break;
        case UVM_REGISTER_GPU:
            note_register_gpu(c, arg);
            break;
        case UVM_TOOLS_GET_PROCESSOR_UUID_TABLE:
        case UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2:
            st = uuid_table(c, arg, cmd == UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2, &rc);
            break;
        default:
            break;
        }
    }
    if (rc == 0 && pmem_write(c->pid, arg + info->status_off, &st, sizeof st))
        rc = -EFAULT;
    vlog("  -> rmStatus 0x%x rc %d", st, rc);
    if (rc)
        fuse_reply_err(c->req, -rc);
    else
        fuse_reply_ioctl(c->req, 0, NULL, 0);
}

/* ------------------------------------------------------------------ */
/* Filesystem                                                           */
/* ------------------------------------------------------------------ */

static char zeros[1 << 20];

static int ino_kind(fuse_ino_t ino, int *gpu)
{
    *gpu = -1;
    switch (ino) {
    case INO_ROOT: return K_ROOT;
    case INO_CTL: return K_CTL;
    case INO_UVM: return K_UVM;
    case INO_UVM_TOOLS: return K_UVM_TOOLS;
    case INO_STATE: return K_STATE;
    default:
        if (ino >= INO_GPU0 && ino < INO_GPU0 + (fuse_ino_t)g.ngpus) {
            *gpu = (int)(ino - INO_GPU0);
            return K_GPU;
        }
        return -1;
    }
}

static void ino_name(fuse_ino_t ino, char *out, size_t n)
{
    int gpu;
    switch (ino_kind(ino, &gpu)) {
    case K_CTL: snprintf(out, n, "nvidiactl"); break;
    case K_UVM: snprintf(out, n, "nvidia-uvm"); break;
    case K_UVM_TOOLS: snprintf(out, n, "nvidia-uvm-tools"); break;
    case K_STATE: snprintf(out, n, ".state"); break;
    case K_GPU: snprintf(out, n, "nvidia%d", gpu); break;
    default: snprintf(out, n, "?"); break;
    }
}

static fuse_ino_t name_ino(const char *name)
{
    if (!strcmp(name, "nvidiactl"))
        return INO_CTL;
    if (!strcmp(name, "nvidia-uvm"))
        return INO_UVM;
    if (!strcmp(name, "nvidia-uvm-tools"))
        return INO_UVM_TOOLS;
    if (!strcmp(name, ".state"))
        return INO_STATE;
    if (!strncmp(name, "nvidia", 6) && name[6] >= '0' && name[6] <= '9') {
        char *end;
        long n = strtol(name + 6, &end, 10);
        if (!*end && n >= 0 && n < g.ngpus && (n == 0 || name[6] != '0'))
            return INO_GPU0 + (fuse_ino_t)n;
    }
    return 0;
}

static int fill_stat(fuse_ino_t ino, struct stat *st)
{
    int gpu;
    int k = ino_kind(ino, &gpu);
    if (k < 0)
        return -1;
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_atime = st->st_mtime = st->st_ctime = g.start;
    if (k == K_ROOT) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
    } else if (k == K_STATE) {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
    } else {
        st->st_mode = S_IFREG | 0666;
        st->st_nlink = 1;
        st->st_size = (off_t)DEV_FILE_SIZE;
    }
    return 0;
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    (void)userdata;
    /*
     * Our mtime never changes, but the kernel bumps its own copy on mmap writes;
     * with auto-invalidation a later getattr would drop the page cache and with it
     * the data a process just wrote to its mapped "GPU memory".
     */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    fuse_ino_t ino = parent == INO_ROOT ? name_ino(name) : 0;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    if (!ino || fill_stat(ino, &e.attr)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    e.ino = ino;
    e.attr_timeout = e.entry_timeout = ATTR_TIMEOUT;
    fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    if (fill_stat(ino, &st))
        fuse_reply_err(req, ENOENT);
    else
        fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

/* Device files cannot be resized; answer with the unchanged attributes (O_TRUNC etc.). */
static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    (void)attr;
    (void)to_set;
    op_getattr(req, ino, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    if (ino != INO_ROOT) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    fuse_ino_t inos[4 + MAX_GPUS + 2];
    size_t n = 0;
    inos[n++] = INO_ROOT;
    inos[n++] = INO_ROOT;
    inos[n++] = INO_CTL;
    for (int i = 0; i < g.ngpus; i++)
        inos[n++] = INO_GPU0 + (fuse_ino_t)i;
    inos[n++] = INO_UVM;
    inos[n++] = INO_UVM_TOOLS;
    inos[n++] = INO_STATE;
    char *buf = calloc(1, size);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0;
    for (size_t i = (size_t)off; i < n; i++) {
        char name[32];
        if (i == 0)
            strcpy(name, ".");
        else if (i == 1)
            strcpy(name, "..");
        else
            ino_name(inos[i], name, sizeof name);
        struct stat st;
        fill_stat(inos[i], &st);
        size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(i + 1));
        if (need > size - used)
            break;
        used += need;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static char *state_text(size_t *len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return NULL;
    fprintf(f, "# nvfuse TEST STAND-IN state\n");
    fprintf(f, "gpus %d\nbudget %" PRIu64 "\nclients %u\nobjects %u\nopen_files %u\n", g.ngpus,
            g.budget, g.nclients, g.nobjects, g.nfiles);
    fprintf(f, "rm_mappings %u\nuvm_ranges %u\nsysmem_bytes %" PRIu64 "\nvirtual_bytes %" PRIu64 "\n",
            g.nmaps, g.nranges, g.sys_bytes, g.virt_bytes);
    for (int i = 0; i < g.ngpus; i++) {
        uint64_t fr, lg, lb;
        char uuid[41];
        heap_stats(i, &fr, &lg, &lb);
        gpu_uuid_ascii(i, uuid);
        fprintf(f,
                "gpu%d used=%" PRIu64 " peak=%" PRIu64 " failed=%u heap_free=%" PRIu64
                " largest_free=%" PRIu64 " largest_free_base=%" PRIu64 " gpu_id=0x%x uuid=%s\n",
                i, g.used[i], g.peak[i], g.failed[i], fr, lg, lb, STANDIN_GPU_ID(i), uuid);
    }
    for (struct tracker *t = u.trackers; t; t = t->next) {
        uint64_t w = 0, d = 0;
        for (unsigned k = 0; k < UVM_EVENT_NUM_TYPES_ALL; k++) {
            w += t->written[k];
            d += t->dropped[k];
        }
        fprintf(f,
                "tracker id=%" PRIu64 " tools_file=%" PRIu64 " file=%" PRIu64 " pid=%d target_pid=%d"
                " version=%d entries=%u events=0x%" PRIx64 " counters=0x%" PRIx64 " written=%" PRIu64
                " dropped=%" PRIu64 "\n",
                t->id, t->tools->id, t->target->id, (int)t->pid, t->target->vs ? (int)t->target->vs->pid : 0,
                t->v2 ? 2 : 1, t->count, t->events, t->counter_mask, w, d);
    }
    for (struct uvm_release_rec *r = u.releases; r; r = r->next)
        fprintf(f, "uvm_release file=%" PRIu64 " pid=%d mono_ns=%" PRId64 "\n", r->file, (int)r->va_pid,
                r->mono_ns);
    for (struct obj *cl = g.clients; cl; cl = cl->cnext)
        fprintf(f, "client 0x%08x pid=%d file=%" PRIu64 "\n", cl->handle, (int)cl->pid,
                cl->owner ? cl->owner->id : 0);
    for (unsigned s = 0; s < HBUCKETS; s++)
        for (struct obj *o = g.htab[s]; o; o = o->hnext)
            if (o->parent)
                fprintf(f,
                        "object client=0x%08x handle=0x%08x class=0x%x parent=0x%08x gpu=%d "
                        "kind=%s size=%" PRIu64 "\n",
                        o->client, o->handle, o->hclass, o->parent->handle, o->gpu,
                        MEM_KIND_NAME[o->mem ? o->mem->kind : MEM_NONE],
                        o->mem ? o->mem->size : 0);
    for (struct ofile *of = g.files; of; of = of->next)
        for (struct urange *r = of->ranges; r; r = r->next)
            fprintf(f, "uvm_range file=%" PRIu64 " base=0x%" PRIx64 " length=0x%" PRIx64 " %s\n",
                    of->id, r->base, r->length, r->type == UR_EXTERNAL ? "external" : "semaphore");
    fclose(f);
    *len = n;
    return text;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int gpu;
    int k = ino_kind(ino, &gpu);
    if (k < 0 || k == K_ROOT) {
        fuse_reply_err(req, k < 0 ? ENOENT : EISDIR);
        return;
    }
    if (k == K_STATE && (fi->flags & O_ACCMODE) != O_RDONLY) {
        fuse_reply_err(req, EACCES);
        return;
    }
    struct ofile *of = calloc(1, sizeof *of);
    if (!of)
        abort();
    of->id = ++g.next_file_id;
    of->kind = (enum kind)k;
    of->gpu = gpu;
    of->opener = fuse_req_ctx(req)->pid;
    if (k == K_STATE) {
        of->text = state_text(&of->textlen);
        fi->direct_io = 1;
    } else {
        /* Shared page cache across opens, so one process's open cannot drop pages
         * another process has mapped. */
        fi->keep_cache = 1;
    }
    of->next = g.files;
    if (g.files)
        g.files->prev = of;
    g.files = of;
    g.nfiles++;
    fi->fh = (uint64_t)(uintptr_t)of;
    char name[32];
    ino_name(ino, name, sizeof name);
    vlog("pid %d open %s file %" PRIu64, (int)of->opener, name, of->id);
    fuse_reply_open(req, fi);
}

/*
 * Last close of an open file description. Like rm_cleanup_file_private ->
 * RmFreeUnusedClients, every client the nvidiactl file still owns is freed, with
 * its whole tree; a uvm file takes its ranges with it.
 */
static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    struct ofile *of = (struct ofile *)(uintptr_t)fi->fh;
    unsigned freed = 0;
    for (struct obj *cl = g.clients, *next; cl; cl = next) {
        next = cl->cnext;
        if (cl->owner == of) {
            obj_destroy(cl);
            freed++;
        }
    }
    if (of->trk)
        tracker_destroy(of->trk);
    if (of->kind == K_UVM)
        log_release(of);
    vs_free(of->vs);
    while (of->ranges) {
        struct urange *r = of->ranges;
        of->ranges = r->next;
        free(r);
        g.nranges--;
    }
    vlog("release file %" PRIu64 " (freed %u clients)", of->id, freed);
    if (of->prev)
        of->prev->next = of->next;
    else
        g.files = of->next;
    if (of->next)
        of->next->prev = of->prev;
    g.nfiles--;
    free(of->text);
    free(of);
    fuse_reply_err(req, 0);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino;
    struct ofile *of = (struct ofile *)(uintptr_t)fi->fh;
    vlog("read file %" PRIu64 " offset 0x%" PRIx64 " size %zu", of->id, (uint64_t)off, size);
    if (of->kind == K_STATE) {
        size_t o = (size_t)off < of->textlen ? (size_t)off : of->textlen;
        size_t n = of->textlen - o < size ? of->textlen - o : size;
        fuse_reply_buf(req, of->text + o, n);
        return;
    }
    /* Device memory reads as zeros; that is what makes page faults on mmaps work. */
    if ((uint64_t)off >= DEV_FILE_SIZE) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > sizeof zeros)
        size = sizeof zeros;
    if (size > DEV_FILE_SIZE - (uint64_t)off)
        size = (size_t)(DEV_FILE_SIZE - (uint64_t)off);
    fuse_reply_buf(req, zeros, size);
}

/* Writeback of dirty mmap'ed pages lands here; the data is not kept (README). */
static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    (void)ino;
    (void)buf;
    vlog("write file %" PRIu64 " offset 0x%" PRIx64 " size %zu (discarded)",
         ((struct ofile *)(uintptr_t)fi->fh)->id, (uint64_t)off, size);
    fuse_reply_write(req, size);
}

static void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
                     struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                     size_t in_bufsz, size_t out_bufsz)
{
    struct ofile *of = (struct ofile *)(uintptr_t)fi->fh;
    char name[32];
    ino_name(ino, name, sizeof name);
    struct call c = {req, fuse_req_ctx(req)->pid, of, name};
    if (flags & FUSE_IOCTL_COMPAT) {
        fuse_reply_err(req, ENOSYS);
        return;
    }
    switch (of->kind) {
    case K_CTL:
    case K_GPU:
        rm_ioctl(&c, cmd, in_buf, in_bufsz, out_bufsz);
        break;
    case K_UVM:
    case K_UVM_TOOLS:
        uvm_ioctl(&c, cmd, (uint64_t)(uintptr_t)arg);
        break;
    default:
        fuse_reply_err(req, ENOTTY);
        break;
    }
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readdir = op_readdir,
    .open = op_open,
    .release = op_release,
    .read = op_read,
    .write = op_write,
    .ioctl = op_ioctl,
    .poll = op_poll,
};

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *s == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
    }
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s MOUNTPOINT [--budget BYTES] [--gpus N] [--event-log FILE] "
            "[--foreign-pid PID:BYTES] [-f] [--verbose]\n"
            "TEST STAND-IN for the NVIDIA driver's device files (gputrace tests).\n"
            "  --budget BYTES  vidmem per GPU (suffix K/M/G/T allowed; default 16G)\n"
            "  --gpus N        number of nvidiaN files (1..%d, default 1)\n"
            "  -f              stay in the foreground\n"
            "  --event-log FILE  JSON lines: every UVM tools event the model produced, where\n"
            "                  each landed, trackers, releases of uvm files (README)\n"
            "  --verbose       log every request to stderr\n",
            argv0, MAX_GPUS);
}

int main(int argc, char **argv)
{
    const char *mountpoint = NULL;
    int foreground = 0;
    g.budget = DEFAULT_BUDGET;
    g.ngpus = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--budget") && i + 1 < argc) {
            if (parse_bytes(argv[++i], &g.budget)) {
                fprintf(stderr, "nvfuse: bad --budget %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--gpus") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > MAX_GPUS) {
                fprintf(stderr, "nvfuse: bad --gpus %s\n", argv[i]);
                return 2;
            }
            g.ngpus = (int)n;
        } else if (!strcmp(a, "-f")) {
            foreground = 1;
        } else if (!strcmp(a, "--event-log") && i + 1 < argc) {
            u.log = fopen(argv[++i], "we");
            if (!u.log) {
                fprintf(stderr, "nvfuse: cannot open --event-log %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--foreign-pid") && i + 1 < argc) {
            /* PID:BYTES, e.g. 4194000:64M */
            char *colon = strchr(argv[++i], ':');
            long pid = colon ? strtol(argv[i], NULL, 10) : 0;
            if (!colon || pid <= 0 || parse_bytes(colon + 1, &g.foreign_vid)) {
                fprintf(stderr, "nvfuse: bad --foreign-pid %s\n", argv[i]);
                return 2;
            }
            g.foreign_pid = (pid_t)pid;
        } else if (!strcmp(a, "--verbose")) {
            g.verbose = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(argv[0]);
            return 0;
        } else if (a[0] != '-' && !mountpoint) {
            mountpoint = a;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    if (!mountpoint) {
        usage(argv[0]);
        return 2;
    }
    char real[PATH_MAX];
    if (!realpath(mountpoint, real) || strlen(real) + 12 > sizeof u.uvm_path) {
        fprintf(stderr, "nvfuse: bad mountpoint %s\n", mountpoint);
        return 2;
    }
    snprintf(u.uvm_path, sizeof u.uvm_path, "%s/nvidia-uvm", real);
    g.start = time(NULL);
    g.next_client = 0xc1d00001u;
    g.sys_next = 1ull << 40;
    g.virt_next = 1ull << 44;
    heap_init();

    /* allow_other: a traced workload may run as another user than the server. */
    char opts[128];
    snprintf(opts, sizeof opts, "fsname=nvfuse,subtype=nvfuse-standin%s",
             geteuid() == 0 ? ",allow_other" : "");
    char *fargv[] = {argv[0], "-o", opts, NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se) {
        fuse_opt_free_args(&args);
        return 1;
    }
    int rc = 1;
    if (fuse_set_signal_handlers(se) == 0) {
        if (fuse_session_mount(se, mountpoint) == 0) {
            if (fuse_daemonize(foreground) == 0)
                /* Single-threaded on purpose: requests are handled in arrival order and
                 * the state needs no locks. */
                rc = fuse_session_loop(se) ? 1 : 0;
            fuse_session_unmount(se);
        }
        fuse_remove_signal_handlers(se);
    }
    fuse_session_destroy(se);
    fuse_opt_free_args(&args);
    return rc;
}
