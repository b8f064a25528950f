/* mmap/munmap of NVIDIA fds and the process lifecycle (fork, exec, exit);
 * close and dup are in nv_fds.bpf.h.
 */
#include "common.bpf.h"

/* ------------------------------------------------------- mmap / munmap */
static __always_inline void emit_mapping(struct pending_mmap *p, u8 op, u64 addr, long ret,
                                         s32 fd)
{
    u64 id = bpf_get_current_pid_tgid();
    struct mapping_event e = {};
    e.ts_ns = p->ts_ns;
    e.latency_ns = bpf_ktime_get_ns() - p->ts_ns;
    e.addr = addr;
    e.length = p->length;
    e.offset = p->offset;
    e.ret = ret;
    e.pid = id >> 32;
    e.tid = (u32)id;
    e.prot = p->prot;
    e.flags = p->flags;
    e.fd = fd;
    e.op = op;
    e.device = p->v.kind;
    e.gpu_index = p->v.gpu;
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    if (mapping_events.ringbuf_output(&e, sizeof(e), BPF_RB_NO_WAKEUP) != 0)
        count_drop(GT_BUF_MAPPING, 1);
}

static __always_inline int mmap_enter(u64 addr, u64 len, u64 prot, u64 flags, s32 fd, u64 off)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    if (!maybe_known(id >> 32))
        return 0;
    managed_clear_enter(addr, len, flags); /* nv_faults.bpf.h */
    u64 k = fdkey(id >> 32, fd);
    struct fdval *v = fds.lookup(&k);
    if (!v)
        return 0;
    struct pending_mmap p = {};
    p.ts_ns = bpf_ktime_get_ns();
    p.addr = addr;
    p.length = len;
    p.offset = off;
    p.prot = prot;
    p.flags = flags;
    p.fd = fd;
    p.v = *v;
    pending_mmaps.update(&tid, &p);
    return 0;
}

static __always_inline int mmap_exit(long ret, u64 id)
{
    u32 tid = (u32)id;
    struct pending_mmap *pp = pending_mmaps.lookup(&tid);
    managed_mmap_exit(pp, ret); /* nv_faults.bpf.h: managed ranges */
    if (!pp)
        return 0;
    struct pending_mmap p = *pp;
    pending_mmaps.delete(&tid);
    int ok = !(ret < 0 && ret > -4096);
    emit_mapping(&p, GT_MAP_MMAP, ok ? (u64)ret : 0, ret, p.fd);
    if (ok) {
        struct mkey k = {.tgid = id >> 32, .addr = (u64)ret};
        p.addr = (u64)ret;
        maps.update(&k, &p);
    }
    return 0;
}

static __always_inline int munmap_enter(u64 addr, u64 len)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    if (!maybe_known(id >> 32))
        return 0;
    managed_clear_enter(addr, len, GT_MAP_FIXED); /* whole or partial */
    struct mkey k = {.tgid = id >> 32, .addr = addr};
    struct pending_mmap *m = maps.lookup(&k);
    if (!m || m->addr != addr)
        return 0;
    struct pending_mmap p = *m;
    p.ts_ns = bpf_ktime_get_ns();
    p.length = len;
    p.offset = 0;
    pending_mmaps.update(&tid, &p);
    return 0;
}

static __always_inline int munmap_exit(long ret, u64 id)
{
    u32 tid = (u32)id;
    managed_clear_exit(ret, 0);
    struct pending_mmap *pp = pending_mmaps.lookup(&tid);
    if (!pp)
        return 0;
    struct pending_mmap p = *pp;
    pending_mmaps.delete(&tid);
    emit_mapping(&p, GT_MAP_MUNMAP, p.addr, ret, -1);
    if (ret == 0) {
        struct mkey k = {.tgid = id >> 32, .addr = p.addr};
        maps.delete(&k);
    }
    return 0;
}

/* ------------------------------------------------------ process lifecycle */
/* How each task of the host started (struct proc_start), kept for the recorder:
 * it reads a process's entry when the process first matters (device open, target
 * fork or exec), so nothing is emitted for the host's other forks. Entries of
 * threads and of processes that exit unseen are deleted at their exit; those of
 * seen processes stay for the recorder, which may read them after the exit. An
 * LRU map: when a busy host fills it, the least recently touched go (their
 * processes then get their facts from /proc only). */
BPF_TABLE("lru_hash", u32, struct proc_start, proc_starts, 65536);

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 zero = 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 child = args->child_pid;
    /* child_pid is a thread's id for pthread_create too: its entry goes at its exit */
    struct proc_start ps = {};
    ps.fork_ns = bpf_ktime_get_ns();
    ps.fork_boot_ns = bpf_ktime_get_boot_ns();
    ps.ppid = tgid;
    proc_starts.update(&child, &ps);
    struct gt_config *cfg = config.lookup(&zero);
    if (!cfg)
        return 0;
    if (cfg->filter && targets.lookup(&tgid)) {
        u8 one = 1;
        targets.update(&child, &one);
        emit_proc(GT_PROC_FORK, child, tgid, -1);
    } else if (!cfg->filter && seen.lookup(&tgid)) {
        emit_proc(GT_PROC_FORK, child, tgid, -1);
    }
    if (!seen.lookup(&tgid))
        return 0;
    /* The child inherits the parent's fds (threads share them: harmless). */
    u8 one = 1;
    mark_known(child, 1);
    seen.update(&child, &one);
    for (s32 fd = 0; fd < GT_FD_SCAN; fd++) {
        u64 kp = fdkey(tgid, fd);
        struct fdval *v = fds.lookup(&kp);
        if (v) {
            struct fdval c = *v;
            u64 kc = fdkey(child, fd);
            fds.update(&kc, &c);
        }
    }
    return 0;
}

#ifdef GT_HAVE_SCHED_PROCESS_EXEC
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 zero = 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct gt_config *cfg = config.lookup(&zero);
    u64 now = bpf_ktime_get_ns();
    struct proc_start *ps = proc_starts.lookup(&tgid);
    if (ps) {
        ps->exec_ns = now;
        ps->cgroup_id = bpf_get_current_cgroup_id();
    } else { /* forked before the probes were attached */
        struct proc_start n = {};
        n.exec_ns = now;
        n.cgroup_id = bpf_get_current_cgroup_id();
        proc_starts.update(&tgid, &n);
    }
    managed_forget(tgid); /* a new address space */
    if (cfg && relevant(tgid, cfg))
        emit_proc(GT_PROC_EXEC, tgid, 0, -1);
    return 0;
}
#endif

static __always_inline int exit_group_enter(long error_code)
{
    u32 zero = 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct gt_config *cfg = config.lookup(&zero);
    if (!cfg || !relevant(tgid, cfg))
        return 0;
    s32 code = (error_code & 0xff) << 8; /* as wait(2) reports it */
    exit_codes.update(&tgid, &code);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 zero = 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct gt_config *cfg = config.lookup(&zero);
    if (tid != tgid) { /* a thread: the leader's exit stands for the process */
        proc_starts.delete(&tid);
        return 0;
    }
    if (!cfg)
        return 0;
    managed_forget(tgid);
    mark_known(tgid, 0); /* its fds go below: a reused tgid starts unknown */
    int was_seen = 0;
    if (seen.lookup(&tgid))
        was_seen = 1;
    if (!relevant(tgid, cfg) && !was_seen) {
        proc_starts.delete(&tgid); /* never mattered: the recorder will not ask */
        return 0;
    }
    s32 code = -1;
    s32 *c = exit_codes.lookup(&tgid);
    if (c)
        code = *c;
    emit_proc(GT_PROC_EXIT, tgid, 0, code);
    exit_codes.delete(&tgid);
    targets.delete(&tgid);
    seen.delete(&tgid);
    if (!was_seen)
        return 0;
    for (s32 fd = 0; fd < GT_FD_SCAN; fd++) {
        u64 k = fdkey(tgid, fd);
        fds.delete(&k);
    }
    return 0;
}
