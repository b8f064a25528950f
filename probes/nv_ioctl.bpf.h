/* ioctls on tracked NVIDIA fds: RM escapes (nvidiactl, nvidiaN) and UVM
 * commands (nvidia-uvm, nvidia-uvm-tools), decoded at syscall exit from the
 * saved argument pointer, staged per CPU and submitted many per record.
 * Layouts: docs/driver-facts.md §1.3-1.4 (UVM, via `uvm_layouts`) and
 * §2.2-2.4 (RM, sizes taken from the request number). */
#include "common.bpf.h"
#include "nv_abi.h"

#define W32(o) (w[(o) / 4])
#define W64(o) ((u64)w[(o) / 4] | ((u64)w[(o) / 4 + 1] << 32))
#define SET(field, bit, val) do { e->field = (val); e->valid |= (bit); } while (0)
#define RD(n) (size >= (n) && bpf_probe_read_user(w, (n), (void *)p) == 0)

static __always_inline void stage_submit(struct ioctl_batch *st)
{
    u32 n = st->count;
    if (n == 0)
        return;
    if (n > GT_STAGE_EVENTS)
        n = GT_STAGE_EVENTS;
    u64 size = 8 + (u64)n * sizeof(struct ioctl_event);
    if (ioctl_events.ringbuf_output(st, size, BPF_RB_NO_WAKEUP) != 0)
        count_drop(GT_BUF_IOCTL, n);
    st->count = 0;
}

#include "nv_rm.bpf.h"

/* Field `off` (`n` bytes: 1, 4, 8 or 16) of a UVM command's parameters at `b`:
 * from the span `w` holds (read in one go from b + lo, `len` bytes) when it lies
 * inside, else read alone. 0 on success, as bpf_probe_read_user. */
static __always_inline int uvm_get(void *dst, u32 n, u8 *b, u32 off, struct uvm_span *w,
                                   u32 lo, u32 len)
{
    if (w && off >= lo && off + n <= lo + len) {
        u8 *s = &w->b[(off - lo) & (GT_UVM_SPAN - 1)];
        if (n == 1)
            *(u8 *)dst = *s;
        else if (n == 4)
            *(u32 *)dst = *(u32 *)s;
        else if (n == 8)
            *(u64 *)dst = *(u64 *)s;
        else
            ((u64 *)dst)[0] = ((u64 *)s)[0], ((u64 *)dst)[1] = ((u64 *)s)[1];
        return 0;
    }
    return bpf_probe_read_user(dst, n, b + off);
}

/* UVM commands carry no size: offsets come from `uvm_layouts` (record/driver_version.py), with
 * the span of them one read takes (driver_version.UvmLayout.span). */
static __always_inline void uvm_decode(struct ioctl_event *e, u32 cmd, u64 p)
{
    u32 slot = cmd;
    if (cmd == GT_UVM_INITIALIZE)
        slot = GT_UVM_SLOT_INITIALIZE;
    else if (cmd == GT_UVM_DEINITIALIZE)
        slot = GT_UVM_SLOT_DEINITIALIZE;
    else if (cmd >= GT_UVM_SLOT_INITIALIZE)
        return;
    struct uvm_layout *l = uvm_layouts.lookup(&slot);
    if (!l || !l->known)
        return;
    u64 v = 0;
    u8 *b = (u8 *)p;
    u32 lo = l->span_lo, len = l->span_len, zero = 0;
    struct uvm_span *w = 0;
    if (len && len <= GT_UVM_SPAN) {
        w = uvm_span_scratch.lookup(&zero);
        /* len again, in a form whose bounds the verifier sees at the call */
        if (w && bpf_probe_read_user(w->b, ((len - 1) & (GT_UVM_SPAN - 1)) + 1, b + lo))
            w = 0;  /* some byte of the span is unreadable: each field alone */
    }
    if (l->status != GT_NOFF && !uvm_get(&v, 4, b, l->status, w, lo, len))
        SET(status, GT_V_STATUS, (u32)v);
    if (l->base != GT_NOFF && !uvm_get(&v, 8, b, l->base, w, lo, len))
        SET(va_base, GT_V_VA_BASE, v);
    if (l->length != GT_NOFF && !uvm_get(&v, 8, b, l->length, w, lo, len))
        SET(va_length, GT_V_VA_LENGTH, v);
    if (l->offset != GT_NOFF && !uvm_get(&v, 8, b, l->offset, w, lo, len))
        SET(offset, GT_V_OFFSET, v);
    v = 0;
    if (l->ref_fd != GT_NOFF && !uvm_get(&v, 4, b, l->ref_fd, w, lo, len))
        SET(ref_fd, GT_V_REF_FD, (s32)v);
    if (l->h_client != GT_NOFF && !uvm_get(&v, 4, b, l->h_client, w, lo, len))
        SET(h_client, GT_V_H_CLIENT, (u32)v);
    if (l->h_object != GT_NOFF && !uvm_get(&v, 4, b, l->h_object, w, lo, len))
        SET(h_object, GT_V_H_OBJECT, (u32)v);
    v = 0;
    if (l->flags != GT_NOFF) {
        int r = l->flags_size == 1   ? uvm_get(&v, 1, b, l->flags, w, lo, len)
                : l->flags_size == 8 ? uvm_get(&v, 8, b, l->flags, w, lo, len)
                                     : uvm_get(&v, 4, b, l->flags, w, lo, len);
        if (!r)
            SET(flags, GT_V_FLAGS, (u32)v);
    }
    if (l->uuid != GT_NOFF && !uvm_get(e->uuid, 16, b, l->uuid, w, lo, len))
        e->valid |= GT_V_UUID;
}

static __always_inline int ioctl_enter(s32 fd, u32 cmd, u64 arg)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 zero = 0;
    if (cmd == GT_FLUSH_CMD) {
        struct gt_config *cfg = config.lookup(&zero);
        struct ioctl_batch *st = ioctl_staging.lookup(&zero);
        if (cfg && st && tgid == cfg->self_tgid)
            stage_submit(st);
        if (cfg && tgid == cfg->self_tgid)
            faults_flush(); /* nv_faults.bpf.h */
        return 0;
    }
    if (!maybe_known(tgid))
        return 0;
    u64 k = fdkey(tgid, fd);
    struct fdval *v = fds.lookup(&k);
    if (!v)
        return 0;
    struct pending_ioctl *p = pending_ioctls.task_storage_get(
        (void *)bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!p)
        return 0;
    p->ts_ns = bpf_ktime_get_ns();
    p->arg = arg;
    p->fd = fd;
    p->cmd = cmd;
    p->v = *v;
    p->active = 1;
    return 0;
}

static __always_inline int ioctl_exit(long ret, u64 id)
{
    u32 tid = (u32)id, zero = 0;
    struct pending_ioctl *pp = pending_ioctls.task_storage_get(
        (void *)bpf_get_current_task_btf(), 0, 0);
    if (!pp || !pp->active)
        return 0;
    struct pending_ioctl p = *pp;
    pp->active = 0;
    struct ioctl_batch *st = ioctl_staging.lookup(&zero);
    if (!st)
        return 0;
    u32 n = st->count;
    if (n >= GT_STAGE_EVENTS) {
        count_drop(GT_BUF_IOCTL, 1);
        return 0;
    }
    /* Not cleared: the decoder reads only the fields set here and those whose
     * `valid` bit a decoder set (it masks the rest to null), so a slot's
     * earlier contents never reach the trace. */
    struct ioctl_event *e = &st->ev[n];
    e->valid = 0;
    u64 now = bpf_ktime_get_ns();
    e->ts_ns = p.ts_ns;
    e->latency_ns = now - p.ts_ns;
    e->ret = ret;
    e->pid = id >> 32;
    e->tid = tid;
    e->fd = p.fd;
    e->cmd = p.cmd;
    e->nr = p.cmd;
    e->device = p.v.kind;
    e->gpu_index = p.v.gpu;
    if (!gt_comm_get(&pp->comm, e->comm, now)) {
        bpf_get_current_comm(&e->comm, sizeof(e->comm));
        struct gt_config *cfg = config.lookup(&zero);
        if (cfg && cfg->comm_cache)
            gt_comm_keep(&pp->comm, e->comm, now);
    }
    if (p.v.kind == GT_DEV_UVM || p.v.kind == GT_DEV_UVM_TOOLS)
        uvm_decode(e, p.cmd, p.arg);
    else
        rm_decode(e, p.cmd, p.arg);
    /* Unstaged, so the recorder attaches its tracker within one poll rather than
     * when this batch fills: the process's faults start soon after. */
    if (p.v.kind == GT_DEV_UVM && p.cmd == GT_UVM_INITIALIZE && ret == 0 &&
        (e->valid & GT_V_STATUS) && e->status == 0)
        emit_proc(GT_PROC_UVM_INIT, id >> 32, 0, p.fd);
    /* Out of memory: the one record sent with a wakeup (one compare per ioctl). */
    if (e->status == GT_NV_ERR_NO_MEMORY && (e->valid & GT_V_STATUS) &&
        (p.v.kind == GT_DEV_UVM || e->nr == GT_ESC_RM_ALLOC || e->nr == GT_ESC_RM_VID_HEAP_CONTROL)) {
        struct oom_event o = {.ts_ns = now, .pid = id >> 32, .status = e->status, .nr = e->nr,
                              .device = p.v.kind, .gpu_index = p.v.gpu};
        oom_events.ringbuf_output(&o, sizeof(o), 0);
    }
    st->count = n + 1;
    if (n + 1 >= GT_STAGE_EVENTS)
        stage_submit(st);
    return 0;
}
