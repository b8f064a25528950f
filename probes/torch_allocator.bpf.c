/* gputrace torch_allocator layer: PyTorch's CUDA caching allocator, from outside.
 *
 * Compiled into the API layer's program (appended to cuda.bpf.c by
 * gputrace/record/torch_allocator/layer.py): its probes share the API layer's
 * targets, its Python walk (cuda_python.bpf.h) and its native walk (cuda_stack_id).
 * Attached by gputrace/record/torch_allocator/probes.py:
 *   - NativeCachingAllocator::malloc(this, void **devPtr, DeviceIndex device,
 *     size_t size, cudaStream_t stream): at its entry, and at each of its `ret`
 *     instructions (never a uretprobe: malloc throws c10::OutOfMemoryError, and a
 *     C++ exception cannot unwind through a uretprobe's trampoline);
 *   - NativeCachingAllocator::free(this, void *ptr) at its entry, or where a
 *     release inlined it, its callers (symbols.py);
 *   - DeviceCachingAllocator::insert_events(this, Block *) inside a free (deferred:
 *     another stream used the block) and ::free_block(this, Block *, context), the
 *     block back in the cache: paired by the Block's address (torch_deferred);
 *   - the cudaMallocAsync backend's mallocAsync(void **devPtr, DeviceIndex device,
 *     size_t size, cudaStream_t stream), as malloc (no `this`), and
 *     freeAsync(void *ptr);
 *   - libcuda's cuMemAlloc_v2 (entry and return) and cuMemFree_v2 (entry): the
 *     allocator's segments, kept only inside a malloc (allocs) or in a process
 *     that called malloc (frees; the recorder keeps those of its segments);
 *     cuMemMap (entry, return) and cuMemUnmap (entry): the pages of expandable
 *     segments, the same way; cuMemCreate and cuMemAllocAsync (return): an
 *     out-of-memory failure inside malloc; cuMemFreeAsync (entry): the async
 *     backend's tensor given back, at its free or later (deferred).
 * GT_TORCH_STACKS: 0 no stacks, 1 Python frames, 2 Python and native frames.
 */
#include "torch_events.h"

#ifndef GT_TORCH_STACKS
#define GT_TORCH_STACKS 1
#endif
#ifndef GT_TORCH_RB_PAGES
#define GT_TORCH_RB_PAGES 1024
#endif

struct torch_call {
    u64 ts_ns, out, size, stream;
    u64 seg_out, seg_size, seg_ts;
    u64 fail_ts;        /* when its last out-of-memory segment call returned */
    u64 map_ptr, map_size, map_ts;  /* the cuMemMap in flight inside malloc */
    s32 py_id;
    s16 device;
    u8 active;          /* inside malloc */
    u8 failed;          /* a segment call of this malloc failed out of memory */
    u8 backend;         /* 0 native, 1 cudaMallocAsync: the malloc in flight */
    u64 free_ptr;       /* the native free in flight (0: none): insert_events defers it */
};
struct torch_block_key {
    u32 pid;
    u32 _pad;
    u64 block;          /* a Block* whose free was deferred */
};
BPF_HASH(torch_deferred, struct torch_block_key, u64, 65536);  /* -> the tensor's pointer */
BPF_TASK_STORAGE(torch_calls, struct torch_call);
BPF_HASH(torch_pids, u32, u8, 65536);   /* processes that called malloc */
BPF_RINGBUF_OUTPUT(torch_events, GT_TORCH_RB_PAGES);
BPF_PERCPU_ARRAY(torch_drops, u64, 1);

static __always_inline void torch_emit(u8 kind, u64 ts, u64 lat, u64 ptr, u64 size, u64 stream,
                                       u64 request, s16 device, s32 stack, s32 py, s32 result)
{
    struct torch_event *e = torch_events.ringbuf_reserve(sizeof(struct torch_event));
    if (!e) {
        u32 zero = 0;
        u64 *d = torch_drops.lookup(&zero);
        if (d)
            *d += 1;
        return;
    }
    u64 id = bpf_get_current_pid_tgid();
    e->ts_ns = ts;
    e->latency_ns = lat;
    e->ptr = ptr;
    e->size_bytes = size;
    e->stream = stream;
    e->request_bytes = request;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->stack_id = stack;
    e->py_stack_id = py;
    e->result = result;
    e->device = device;
    e->kind = kind;
    e->_pad = 0;
    torch_events.ringbuf_submit(e, 0);
}

/* A malloc of this thread that never returned after an out-of-memory failure of
 * its segment call: it threw. Its oom entry, at the thread's next call. */
static __always_inline void torch_settle(struct torch_call *t)
{
    if (t->active && t->failed)
        torch_emit(GT_TORCH_OOM, t->fail_ts, 0, 0, t->size, t->stream, t->size, t->device, -1,
                   t->py_id, 0);
    t->active = 0;
    t->failed = 0;
}

static __always_inline struct torch_call *torch_call_of(void *task, int create)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct cuda_config *cfg = cuda_cfg();
    if (!cfg || !cuda_wanted(tgid, cfg))
        return 0;
    return torch_calls.task_storage_get(task, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* malloc(this, devPtr, device, size, stream): `args` 2; mallocAsync(devPtr, device,
 * size, stream): 1 */
static __always_inline int torch_malloc_begin(struct pt_regs *ctx, u8 backend)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_call_of(task, 1);
    if (!t)
        return 0;
    torch_settle(t);
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = id >> 32;
    u8 one = 1;
    if (!torch_pids.lookup(&pid))
        torch_pids.update(&pid, &one);
    if (backend) {
        t->out = PT_REGS_PARM1(ctx);
        t->device = (s8)PT_REGS_PARM2(ctx);
        t->size = PT_REGS_PARM3(ctx);
        t->stream = PT_REGS_PARM4(ctx);
    } else {
        t->out = PT_REGS_PARM2(ctx);
        t->device = (s8)PT_REGS_PARM3(ctx);
        t->size = PT_REGS_PARM4(ctx);
        t->stream = PT_REGS_PARM5(ctx);
    }
    t->backend = backend;
    t->free_ptr = 0;
    t->seg_out = 0;
    t->map_ptr = 0;
    t->py_id = -1;
#if GT_TORCH_STACKS >= 1
    /* walked and taken at once: the segment calls inside malloc walk again */
    cuda_py_enter(task, pid, (u32)id);
    u32 py_fresh = 0;
    t->py_id = cuda_py_take(task, &py_fresh);
    /* A stack never seen before stops the process as the API layer's calls do (one
     * path: cuda_stop_for), here at malloc's entry: a malloc that throws never
     * returns, and a program may exit or crash right after its last tensor. The
     * stop lands as this probe returns, before malloc runs; `latency_ns` then
     * holds it (no table keeps a tensor's latency). */
    if (py_fresh && t->py_id >= 0)
        cuda_stop_for(pid, GT_PAUSE_PY, t->py_id);
#endif
    t->active = 1;
    t->ts_ns = bpf_ktime_get_ns();
    return 0;
}

int torch_malloc_enter(struct pt_regs *ctx) { return torch_malloc_begin(ctx, 0); }
int torch_malloc_async_enter(struct pt_regs *ctx) { return torch_malloc_begin(ctx, 1); }

int torch_malloc_ret(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active)
        return 0;
    t->active = 0;
    t->failed = 0;
    u64 ptr = 0;
    if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)t->out))
        ptr = 0;
    s32 stack = -1;
#if GT_TORCH_STACKS >= 2
    /* At a `ret`, the stack walk starts as at a uretprobe: from the return address
     * (its caller's frame), with the stack pointer past it. */
    u64 v = 0, pv = 0, ra = 0;
    int have = 0;
    if (bpf_probe_read_user(&ra, sizeof(ra), (void *)PT_REGS_SP(ctx)) == 0) {
        struct pt_regs r = {};
        r.ip = ra;
        r.sp = PT_REGS_SP(ctx) + 8;
        r.bp = PT_REGS_FP(ctx);
        stack = cuda_stack_id(&r, task, t->ts_ns, 0, 0, &v, &pv, &have);
    }
#endif
    torch_emit(GT_TORCH_ALLOC, t->ts_ns, now - t->ts_ns, ptr, t->size, t->stream, t->size,
               t->device, stack, t->py_id, t->backend);
    return 0;
}

static __always_inline int torch_free(u64 ptr, s32 backend)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_call_of(task, 1);
    if (!t)
        return 0;
    torch_settle(t);
    t->free_ptr = backend ? 0 : ptr;
    torch_emit(GT_TORCH_FREE, bpf_ktime_get_ns(), 0, ptr, 0, 0, 0, -1, -1, -1, backend);
    return 0;
}

/* insert_events(this, block) inside the native free of t->free_ptr: deferred */
int torch_defer_enter(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->free_ptr)
        return 0;
    struct torch_block_key k = {.pid = bpf_get_current_pid_tgid() >> 32,
                                .block = PT_REGS_PARM2(ctx)};
    u64 ptr = t->free_ptr;
    t->free_ptr = 0;
    torch_deferred.update(&k, &ptr);
    torch_emit(GT_TORCH_DEFER, bpf_ktime_get_ns(), 0, ptr, 0, 0, 0, -1, -1, -1, 0);
    return 0;
}

/* free_block(this, block, context): a deferred block back in the cache */
int torch_free_block_enter(struct pt_regs *ctx)
{
    struct torch_block_key k = {.pid = bpf_get_current_pid_tgid() >> 32,
                                .block = PT_REGS_PARM2(ctx)};
    u64 *ptr = torch_deferred.lookup(&k);
    if (!ptr)
        return 0;  /* an immediate free: its free event said it all */
    u64 p = *ptr;
    torch_deferred.delete(&k);
    torch_emit(GT_TORCH_RELEASE, bpf_ktime_get_ns(), 0, p, 0, 0, 0, -1, -1, -1, 0);
    return 0;
}

/* free(this, ptr), raw_delete(this, ptr); local_raw_delete(ptr); freeAsync(ptr) */
int torch_free_enter(struct pt_regs *ctx) { return torch_free(PT_REGS_PARM2(ctx), 0); }
int torch_free_arg1_enter(struct pt_regs *ctx) { return torch_free(PT_REGS_PARM1(ctx), 0); }
int torch_free_async_enter(struct pt_regs *ctx) { return torch_free(PT_REGS_PARM1(ctx), 1); }

/* A segment call of a malloc failed out of memory: its oom entry, unless the
 * malloc still returns (its retry after freeing the cache worked). */
static __always_inline void torch_seg_failed(struct torch_call *t, s32 rc)
{
    /* the oom entry is stamped after the failure it follows, as PyTorch's is */
    t->failed = 1;
    t->fail_ts = bpf_ktime_get_ns();
    torch_emit(GT_TORCH_SEG_FAIL, t->fail_ts, 0, 0, t->size, t->stream, t->size, t->device, -1,
               t->py_id, rc);
}

/* cuMemCreate (an expandable segment's page), cuMemAllocAsync (the async backend's
 * tensor): only their out-of-memory failures inside a malloc */
int torch_seg_try_ret(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    if (rc == GT_CUDA_ERROR_OUT_OF_MEMORY)
        torch_seg_failed(t, rc);
    return 0;
}

int torch_seg_alloc_enter(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active)
        return 0;
    t->seg_out = PT_REGS_PARM1(ctx);
    t->seg_size = PT_REGS_PARM2(ctx);
    t->seg_ts = bpf_ktime_get_ns();
    return 0;
}

int torch_seg_alloc_ret(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active || !t->seg_out)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    u64 ptr = 0;
    if (rc == GT_CUDA_ERROR_OUT_OF_MEMORY)
        torch_seg_failed(t, rc);
    if (rc == 0 && bpf_probe_read_user(&ptr, sizeof(ptr), (void *)t->seg_out) == 0)
        torch_emit(GT_TORCH_SEG_ALLOC, t->seg_ts, 0, ptr, t->seg_size, t->stream, t->size,
                   t->device, -1, -1, rc);
    t->seg_out = 0;
    return 0;
}

int torch_seg_free_enter(struct pt_regs *ctx)
{
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!torch_pids.lookup(&pid))
        return 0;
    torch_emit(GT_TORCH_SEG_FREE, bpf_ktime_get_ns(), 0, PT_REGS_PARM1(ctx), 0, 0, 0, -1, -1, -1,
               0);
    return 0;
}

/* cuMemMap(ptr, size, offset, handle, flags) inside malloc: a page of an expandable
 * segment (ExpandableSegment::map, one call per page) */
int torch_seg_map_enter(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active)
        return 0;
    t->map_ptr = PT_REGS_PARM1(ctx);
    t->map_size = PT_REGS_PARM2(ctx);
    t->map_ts = bpf_ktime_get_ns();
    return 0;
}

int torch_seg_map_ret(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    struct torch_call *t = torch_calls.task_storage_get(task, 0, 0);
    if (!t || !t->active || !t->map_ptr)
        return 0;
    if ((s32)PT_REGS_RC(ctx) == 0)
        torch_emit(GT_TORCH_SEG_MAP, t->map_ts, 0, t->map_ptr, t->map_size, t->stream, t->size,
                   t->device, -1, -1, 0);
    t->map_ptr = 0;
    return 0;
}

/* cuMemUnmap(ptr, size): a page given back (emptyCache, or a malloc's retry) */
int torch_seg_unmap_enter(struct pt_regs *ctx)
{
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!torch_pids.lookup(&pid))
        return 0;
    torch_emit(GT_TORCH_SEG_UNMAP, bpf_ktime_get_ns(), 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
               0, 0, -1, -1, -1, 0);
    return 0;
}

/* cuMemFreeAsync(ptr, stream): the async backend's tensor given back */
int torch_release_enter(struct pt_regs *ctx)
{
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!torch_pids.lookup(&pid))
        return 0;
    torch_emit(GT_TORCH_RELEASE, bpf_ktime_get_ns(), 0, PT_REGS_PARM1(ctx), 0, 0, 0, -1, -1, -1,
               0);
    return 0;
}
