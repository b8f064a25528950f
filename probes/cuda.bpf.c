/* gputrace API layer: uprobes/uretprobes on libcuda memory calls.
 *
 * Its own bcc program (gputrace/record/api/libcuda.py): uprobes are attached per
 * library path at run time, so this object lives beside the syscall one and
 * follows targets itself (fork/exit). Settings come from the `cuda_config`
 * map; nothing user-supplied is pasted here. Function ids and argument shapes
 * are listed once in gputrace/record/hooks.py (CUDA_FUNCS) and mirrored by the
 * GT_API3 lines below (tests/unit/record/test_event_structs.py checks they agree).
 */
#include <uapi/linux/ptrace.h>
#include "gputrace_events.h"

#include "cuda_common.bpf.h"

/* Argument shapes (x86-64 / arm64 calling convention through PT_REGS_PARMn). */
#define S_OUT_SIZE 1        /* (T **out, size)                    */
#define S_OUT_SIZE_FLAGS 2  /* (T **out, size, flags)             */
#define S_PITCH 3           /* (out, size_t *pitch, width, height, elem) */
#define S_FREE 4            /* (ptr)                              */
#define S_CREATE 5          /* (handle *out, size, prop, flags)   */
#define S_RELEASE 6         /* (handle)                           */
#define S_MAP 7             /* (ptr, size, offset, handle, flags) */
#define S_PTR_SIZE 8        /* (ptr, size)                        */
#define S_RESERVE 9         /* (out, size, alignment, addr, flags) */
#define S_ASYNC 10          /* (out, size, stream)                */
#define S_POOL_ASYNC 11     /* (out, size, pool, stream)          */
#define S_FREE_ASYNC 12     /* (ptr, stream)                      */

/* The calling thread's Python frames, when it runs CPython */
#include "cuda_python.bpf.h"

/* ------------------------------------------------------------ calls */
static __always_inline int api_enter(struct pt_regs *ctx, u16 func, u8 shape)
{
    u32 gen = cuda_generation();
    void *task = (void *)bpf_get_current_task_btf();
    struct cuda_pending *p = cuda_pending.task_storage_get(task, 0, 0);
    if (!p || !(p->known & KNOWN_WANTED) || p->gen != gen) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        struct cuda_config *cfg = cuda_cfg();
        if (!cfg || !cuda_wanted(tgid, cfg))
            return 0;
        p = cuda_pending.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
        if (!p)
            return 0;
        p->known = KNOWN_WANTED;
        p->gen = gen;
    }
    u64 a1 = PT_REGS_PARM1(ctx), a2 = PT_REGS_PARM2(ctx), a3 = PT_REGS_PARM3(ctx);
    u64 a4 = PT_REGS_PARM4(ctx), a5 = PT_REGS_PARM5(ctx);
    p->func = func;
    p->shape = shape;
    p->out = p->pitch_out = p->height = 0;
    p->size = p->ptr = p->handle = p->flags = p->stream = 0;
    p->valid = 0;
    if (shape == S_OUT_SIZE || shape == S_OUT_SIZE_FLAGS || shape == S_CREATE ||
        shape == S_RESERVE || shape == S_ASYNC || shape == S_POOL_ASYNC) {
        p->out = a1;
        p->size = a2;
        p->valid = GT_CV_SIZE;
    }
    if (shape == S_OUT_SIZE_FLAGS)
        p->flags = a3, p->valid |= GT_CV_FLAGS;
    else if (shape == S_CREATE)
        p->flags = a4, p->valid |= GT_CV_FLAGS;
    else if (shape == S_RESERVE)
        p->flags = a5, p->valid |= GT_CV_FLAGS;
    else if (shape == S_ASYNC)
        p->stream = a3, p->valid |= GT_CV_STREAM;
    else if (shape == S_POOL_ASYNC)
        p->handle = a3, p->stream = a4, p->valid |= GT_CV_HANDLE | GT_CV_STREAM;
    else if (shape == S_PITCH)
        p->out = a1, p->pitch_out = a2, p->height = a4;
    else if (shape == S_FREE)
        p->ptr = a1, p->valid = GT_CV_PTR;
    else if (shape == S_RELEASE)
        p->handle = a1, p->valid = GT_CV_HANDLE;
    else if (shape == S_MAP)
        p->ptr = a1, p->size = a2, p->handle = a4, p->flags = a5,
        p->valid = GT_CV_PTR | GT_CV_SIZE | GT_CV_HANDLE | GT_CV_FLAGS;
    else if (shape == S_PTR_SIZE)
        p->ptr = a1, p->size = a2, p->valid = GT_CV_PTR | GT_CV_SIZE;
    else if (shape == S_FREE_ASYNC)
        p->ptr = a1, p->stream = a2, p->valid = GT_CV_PTR | GT_CV_STREAM;
    if (shape != S_FREE && shape != S_RELEASE && shape != S_MAP && shape != S_PTR_SIZE &&
        shape != S_FREE_ASYNC) {  /* the calls that take a stack at return */
        u64 id = bpf_get_current_pid_tgid();
        cuda_py_enter(task, id >> 32, (u32)id);
    }
    p->active = 1;
    p->ts_ns = bpf_ktime_get_ns();
    return 0;
}

/* ------------------------------------------------------------ stacks */
static __always_inline u64 cuda_mix(u64 h, u64 v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

static __always_inline int cuda_same_stack(const struct cuda_stack *a, const struct cuda_stack *b)
{
    u32 n = a->n;
    if (n != b->n || n > GT_CUDA_STACK_DEPTH)
        return 0;
    for (u32 i = 0; i < n; i++)
        if (a->ip[i] != b->ip[i])
            return 0;
    return 1;
}

#include "cuda_unwind.bpf.h"

/* The word at user address `addr` if the chunk holds it (called after the
 * walk's first read: the caller's own frame, where an allocation's out pointer
 * usually lies). */
static __always_inline int cuda_chunk_word(struct cuda_stack_walk *w, u64 addr, u64 *v)
{
    if ((addr & 7) || addr < w->base || addr + 8 > w->end)
        return 0;
    *v = w->chunk[((addr - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
    return 1;
}

/* The user stack at a uretprobe, by frame pointers, as the kernel's walker
 * (perf_callchain_user, what bpf_get_stackid runs) gives it on valid frames:
 * frame 0 is the user ip (the return address in the caller: the callee's
 * frame is gone), then the return address of each {saved rbp, return address}
 * record up the rbp chain. Unlike the kernel's walker it stops before reading
 * a frame pointer that cannot be one (not 8-byte aligned, below the user sp or
 * the record before it, more than GT_CUDA_STACK_SPAN above the sp): glibc's
 * __libc_start_call_main keeps no frame pointer, so every walk that reaches
 * main would otherwise end in a page fault at a garbage address (~750 ns).
 * The first read starts at the sp, not at the frame pointer: it also holds the
 * caller's locals, where the out pointer of an allocation usually points, so
 * `out` and `pitch_out` are read from it (cuda_chunk_word) rather than by more
 * user reads (each ~80 ns after the first on the VM measured, whatever its size).
 * In a process with unwind tables (cuda_unwind.bpf.h) the top frames whose
 * return addresses lie in libraries built without frame pointers are unwound
 * by their rows first; the frame-pointer walk goes on from the first other,
 * unless the tail-called walk of the whole stack (unwind_step) did it already.
 * Returns the stack's id (one per distinct stack, >= 0), or -errno; `*out_v`
 * and `*pitch_v` are set and `*have` has bit 0 / 1 set where the chunk held them. */
static __always_inline int cuda_stack_id(struct pt_regs *ctx, void *task, u64 call, u64 out,
                                         u64 pitch_out, u64 *out_v, u64 *pitch_v, int *have)
{
    struct cuda_stack_walk *w = cuda_stack_scratch.task_storage_get(
        task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!w)
        return -12;  /* ENOMEM */
    struct cuda_stack *s = &w->s;
    u64 sp = PT_REGS_SP(ctx), fp = PT_REGS_FP(ctx), low = sp;
    u64 top = sp + GT_CUDA_STACK_SPAN;
    /* base and end live in the map value, not in registers: the verifier then
     * sees one state whether or not an iteration read a chunk (else the
     * paths of a 127-frame walk multiply past its limit) */
    w->base = w->end = 0;
    /* so do the out words found in the first chunk, until the walks are done
     * (on the caller's stack each found or not would double the walk's states) */
    w->out_v = w->pitch_v = 0;
    w->have = 0;
    if (!(sp & 7)) {
        /* to the end of sp's page at most: no fault past what the walk needs */
        u64 len = 4096 - (sp & 4095);
        if (len > GT_CUDA_STACK_FIRST * 8)
            len = GT_CUDA_STACK_FIRST * 8;
        if (bpf_probe_read_user(w->chunk, len, (void *)sp) == 0) {
            w->base = sp;
            w->end = sp + len;
            w->have = cuda_chunk_word(w, out, &w->out_v) |
                      (cuda_chunk_word(w, pitch_out, &w->pitch_v) << 1);
        }
    }
    u64 ip = PT_REGS_IP(ctx);
    u64 h = cuda_mix(0, ip);
    u32 n = 1;
    s->ip[0] = ip;
    /* the top frames in libraries with unwind tables (built without frame
     * pointers: cuda_unwind.bpf.h), then frame pointers from the first other */
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct unwind_proc *unw = unwind_procs.lookup(&tgid);
    /* n and h wait in the map value across the frame-pointer walk: its states
     * are then the same whether or not tables were used (else it is verified
     * once for each) */
    *(volatile u32 *)&w->top_n = 1;
    *(volatile u64 *)&w->top_h = h;
    u32 dn;
    u64 dh;
    if (unwind_take(task, call, &dn, &dh)) {
        /* every frame, by tables and frame pointers, in s already */
        *(volatile u32 *)&w->top_n = dn;
        *(volatile u64 *)&w->top_h = dh;
        unw = 0, fp = 0;
    }
    if (unw) {
        struct unwind_regs r = {.ip = ip, .sp = sp, .fp = fp, .top = top, .h = h};
        *(volatile u32 *)&w->top_n = unwind_top_frames(w, unw, &r);
        *(volatile u64 *)&w->top_h = r.h;
        fp = r.fp, low = r.sp;
        if (r.stop)
            fp = 0;  /* a frame its table cannot unwind: no walk by %rbp from there */
    }
    /* the frame-pointer walk's frames go to fp_ip[1..m), then after the
     * tables' (at a constant index each: a walk that started at frame n
     * would be verified once per n) */
    u32 m = 1;
    /* fp and low too wait in the map value between frames: every path through
     * a frame then reaches the next with the same state, verified once (in
     * registers they differ by how they were derived: one walk per path) */
    *(volatile u64 *)&w->fp = fp;
    *(volatile u64 *)&w->low = low;
    for (u32 i = 1; i < GT_CUDA_STACK_DEPTH; i++) {
        fp = *(volatile u64 *)&w->fp;
        low = *(volatile u64 *)&w->low;
        if ((fp & 7) || fp < low || fp >= top)
            break;
        if (fp < w->base || fp + 16 > w->end) {
            /* to the end of fp's page (no fault past what the kernel's walker
             * reads), or the 16-byte record itself where it spans two pages */
            u64 len = 4096 - (fp & 4095);
            /* the first read of a walk is short (a shallow stack needs no more);
             * a walk that goes on reads to the page's end: deep stacks of big
             * frames (Python, libtorch) cost a read per page, not per 512 bytes */
            u64 cap = w->end ? GT_CUDA_STACK_CHUNK * 8 : GT_CUDA_STACK_FIRST * 8;
            if (len > cap)
                len = cap;
            if (len < 16)
                len = 16;
            if (bpf_probe_read_user(w->chunk, len, (void *)fp))
                break;
            w->base = fp, w->end = fp + len;
        }
        u64 off = (fp - w->base) >> 3;  /* < GT_CUDA_STACK_CHUNK - 1: fp + 16 <= end */
        u64 ret = w->chunk[(off + 1) & (GT_CUDA_STACK_CHUNK - 1)];
        w->fp_ip[i] = ret;
        m = i + 1;
        *(volatile u64 *)&w->low = fp + 16;  /* callers' records lie above this one */
        *(volatile u64 *)&w->fp = w->chunk[off & (GT_CUDA_STACK_CHUNK - 1)];
    }
    /* m too goes through the map value: as a constant on each of the walk's
     * exits, it would have the loop below verified once per exit */
    *(volatile u32 *)&w->fp_m = m;
    m = *(volatile u32 *)&w->fp_m;
    n = *(volatile u32 *)&w->top_n & 0xff;
    h = *(volatile u64 *)&w->top_h;
    for (u32 j = 1; j < GT_CUDA_STACK_DEPTH; j++) {
        /* masked: the verifier then bounds the index inside the map value
         * whichever register the compiler checks */
        u32 d = (n - 1 + j) & 0xff;
        if (j >= m || d >= GT_CUDA_STACK_DEPTH)
            break;
        u64 ret = w->fp_ip[j];
        s->ip[d] = ret;
        h = cuda_mix(h, ret);
    }
    n = n - 1 + m < GT_CUDA_STACK_DEPTH ? n - 1 + m : GT_CUDA_STACK_DEPTH;
    s->n = n;
    s->_pad = 0;
    h = cuda_mix(h, n);
    h ^= h >> 32;
    *have = *(volatile u32 *)&w->have;
    *out_v = *(volatile u64 *)&w->out_v;
    *pitch_v = *(volatile u64 *)&w->pitch_v;
    for (u32 k = 0; k < GT_CUDA_STACK_PROBES; k++) {
        u32 key = (u32)(h + k) & 0x7fffffff;
        struct cuda_stack *v = cuda_stacks.lookup(&key);
        if (!v) {
            int err = cuda_stacks.insert(&key, s);
            if (err == 0)
                return key;
            if (err != -17)  /* EEXIST: another thread stored this key meanwhile */
                return err;
            v = cuda_stacks.lookup(&key);
            if (!v)
                return -17;
        }
        if (cuda_same_stack(v, s))
            return key;
    }
    return -17;  /* EEXIST: every key tried holds another stack */
}

int uretprobe_cuda(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    void *task = (void *)bpf_get_current_task_btf();
    struct cuda_pending *p = cuda_pending.task_storage_get(task, 0, 0);
    if (!p || !p->active)
        return 0;
    if (p->out)
        unwind_start(ctx, task, p->ts_ns);  /* a tail call when tables walk the stack */
    p->active = 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = id >> 32;
    u32 py_fresh = 0;
    s32 py_id = -1;
    /* Out of device memory: heard at once. The device allocations' ids (cuMemAlloc,
     * Pitch, Managed, Async, FromPoolAsync; record/incidents.py says the same). */
    if ((s32)PT_REGS_RC(ctx) == GT_CUDA_ERROR_OUT_OF_MEMORY &&
        (p->func < 8 || (p->func >= 12 && p->func < 16) || (p->func >= 52 && p->func < 60))) {
        struct oom_event o = {.ts_ns = now, .pid = pid, .status = GT_CUDA_ERROR_OUT_OF_MEMORY,
                              .nr = p->func, .gpu_index = -1};
        cuda_oom_events.ringbuf_output(&o, sizeof(o), 0);
    }
    /* Built in place in the ring buffer: no copy from the stack. */
    struct cuda_event *e = cuda_events.ringbuf_reserve(sizeof(struct cuda_event));
    if (e) {
        /* Every field is stored below (comm by the helper, which pads it): no
         * memset of the whole record first (it cost ~25-100 ns a call). */
        e->_pad0 = 0;
        e->ts_ns = p->ts_ns;
        e->latency_ns = now - p->ts_ns;
        e->pid = pid;
        e->tid = (u32)id;
        e->result = (s32)PT_REGS_RC(ctx);
        e->func = p->func;
        e->size_bytes = p->size;
        e->ptr = p->ptr;
        e->handle = p->handle;
        e->flags = p->flags;
        e->stream = p->stream;
        e->valid = p->valid;
        e->stack_id = -1;
        e->py_stack_id = -1;
        if (p->out) {
            u64 v = 0, pitch = 0;
            int have = 0;
            /* Taken at return: the caller's frame is current again, so the
             * frame-pointer walk starts in the caller on every kernel. */
            e->stack_id = cuda_stack_id(ctx, task, p->ts_ns, p->out, p->pitch_out, &v, &pitch,
                                        &have);
            /* walked at entry, apart from the native walk, which may stop early */
            py_id = cuda_py_take(task, &py_fresh);
            e->py_stack_id = py_id;
            if (e->result == 0 &&
                ((have & 1) || bpf_probe_read_user(&v, sizeof(v), (void *)p->out) == 0)) {
                if (p->shape == S_CREATE)
                    e->handle = v, e->valid |= GT_CV_HANDLE;
                else
                    e->ptr = v, e->valid |= GT_CV_PTR;
            }
            if (p->shape == S_PITCH && e->result == 0 &&
                ((have & 2) || bpf_probe_read_user(&pitch, sizeof(pitch), (void *)p->pitch_out) == 0))
                e->size_bytes = pitch * p->height, e->valid |= GT_CV_SIZE;
        }
        if (!gt_comm_get(&p->comm, e->comm, now)) {
            bpf_get_current_comm(&e->comm, sizeof(e->comm));
            struct cuda_config *cfg = cuda_cfg();
            if (cfg && cfg->comm_cache)
                gt_comm_keep(&p->comm, e->comm, now);
        }
        cuda_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    } else {
        u32 zero = 0;
        u64 *d = cuda_drops.lookup(&zero);
        if (d)
            *d += 1;
    }
    /* First call of the process, or a Python stack never seen before: stop it on
     * its way back to the caller (the latency above excludes the stop) so its
     * maps and that stack's code objects are read while it is alive. */
    u32 gen = cuda_generation();
    u32 kinds = py_fresh ? GT_PAUSE_PY : 0;
    if (!(p->known & KNOWN_SEEN) || p->gen != gen) {
        if (!cuda_seen.lookup(&pid)) {
            u8 one = 1;
            cuda_seen.update(&pid, &one);
            kinds |= GT_PAUSE_FIRST;
        }
        if (p->gen == gen)
            p->known |= KNOWN_SEEN;
    }
    if (kinds)
        cuda_stop_for(pid, kinds, py_fresh ? py_id : -1);
    return 0;
}

#define GT_API(sym, id, shape) \
    int uprobe_##sym(struct pt_regs *ctx) { return api_enter(ctx, id, shape); }
#define GT_API3(sym, id, shape) \
    GT_API(sym, id, shape) GT_API(sym##_ptsz, id + 1, shape) GT_API(sym##_ptds, id + 2, shape)

GT_API3(cuMemAlloc_v2, 0, S_OUT_SIZE)
GT_API3(cuMemAllocPitch_v2, 4, S_PITCH)
GT_API3(cuMemFree_v2, 8, S_FREE)
GT_API3(cuMemAllocManaged, 12, S_OUT_SIZE_FLAGS)
GT_API3(cuMemAllocHost_v2, 16, S_OUT_SIZE)
GT_API3(cuMemHostAlloc, 20, S_OUT_SIZE_FLAGS)
GT_API3(cuMemFreeHost, 24, S_FREE)
GT_API3(cuMemCreate, 28, S_CREATE)
GT_API3(cuMemRelease, 32, S_RELEASE)
GT_API3(cuMemMap, 36, S_MAP)
GT_API3(cuMemUnmap, 40, S_PTR_SIZE)
GT_API3(cuMemAddressReserve, 44, S_RESERVE)
GT_API3(cuMemAddressFree, 48, S_PTR_SIZE)
GT_API3(cuMemAllocAsync, 52, S_ASYNC)
GT_API3(cuMemAllocFromPoolAsync, 56, S_POOL_ASYNC)
GT_API3(cuMemFreeAsync, 60, S_FREE_ASYNC)

#include "cuda_load.bpf.h"
