/* close and dup of tracked NVIDIA fds, and the `fd_events` ring buffer of the
 * files table (open rows are emitted by open_exit in syscalls.bpf.c).
 *
 * Rows are emitted only for tracked fds, so the target filter is implied.
 * close: the fd leaves `fds` at entry (Linux releases it whatever close
 * returns) and the row is emitted at exit with the return value. dup, dup2,
 * dup3, fcntl(F_DUPFD, F_DUPFD_CLOEXEC): a successful dup of a tracked fd
 * copies its entry and emits a dup row (fd = old, new_fd = result); dup2 and
 * dup3 onto a tracked newfd first emit a close row for it without a return
 * value (the close is implicit). Failed dups emit nothing.
 * Included by syscalls.bpf.c after its maps and emit_proc, before the opens.
 */
#ifndef GT_FD_RB_PAGES
#define GT_FD_RB_PAGES 64 /* 256 KiB: ~4000 rows between polls */
#endif

struct pending_close {
    u64 ts_ns;
    s32 fd;
    struct fdval v;
};
struct pending_dup {
    u64 ts_ns;
    s32 oldfd;
    s32 newfd;          /* dup2/dup3: the fd it closes if open; -1 for dup, fcntl */
};

BPF_RINGBUF_OUTPUT(fd_events, GT_FD_RB_PAGES);
BPF_HASH(pending_closes, u32, struct pending_close, 16384);
BPF_HASH(pending_dups, u32, struct pending_dup, 16384);

static __always_inline void emit_fd(u8 op, u64 ts, s32 fd, s32 new_fd, struct fdval *v,
                                    long ret, int has_ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct fd_event e = {};
    e.ts_ns = ts;
    e.ret = ret;
    e.pid = id >> 32;
    e.tid = (u32)id;
    e.fd = fd;
    e.new_fd = new_fd;
    e.op = op;
    e.device = v->kind;
    e.gpu_index = v->gpu;
    e.valid = has_ret ? GT_FV_RET : 0;
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    if (fd_events.ringbuf_output(&e, sizeof(e), BPF_RB_NO_WAKEUP) != 0)
        count_drop(GT_BUF_FD, 1);
}

/* ------------------------------------------------------------------ close */
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u64 k = fdkey(id >> 32, (s32)args->fd);
    struct fdval *v = fds.lookup(&k);
    if (!v)
        return 0;
    struct pending_close p = {};
    p.ts_ns = bpf_ktime_get_ns();
    p.fd = (s32)args->fd;
    p.v = *v;
    fds.delete(&k);
    pending_closes.update(&tid, &p);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_close)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct pending_close *pp = pending_closes.lookup(&tid);
    if (!pp)
        return 0;
    struct pending_close p = *pp;
    pending_closes.delete(&tid);
    emit_fd(GT_FD_CLOSE, p.ts_ns, p.fd, -1, &p.v, args->ret, 1);
    return 0;
}

/* -------------------------------------------------------------------- dup */
static __always_inline int dup_enter(s32 oldfd, s32 newfd)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct pending_dup p = {.ts_ns = bpf_ktime_get_ns(), .oldfd = oldfd, .newfd = newfd};
    pending_dups.update(&tid, &p);
    return 0;
}

static __always_inline int dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct pending_dup *pp = pending_dups.lookup(&tid);
    if (!pp)
        return 0;
    struct pending_dup p = *pp;
    pending_dups.delete(&tid);
    u64 ko = fdkey(tgid, p.oldfd), kn = fdkey(tgid, (s32)ret);
    if (ret < 0 || ko == kn)
        return 0;
    struct fdval *n = fds.lookup(&kn);
    if (n) {
        struct fdval c = *n;
        fds.delete(&kn);
        if (p.newfd == (s32)ret) /* dup2/dup3 closed a tracked newfd */
            emit_fd(GT_FD_CLOSE, p.ts_ns, (s32)ret, -1, &c, 0, 0);
    }
    struct fdval *v = fds.lookup(&ko);
    if (v) {
        struct fdval c = *v;
        fds.update(&kn, &c);
        emit_fd(GT_FD_DUP, p.ts_ns, p.oldfd, (s32)ret, &c, ret, 1);
    }
    return 0;
}

#ifdef GT_HAVE_SYS_ENTER_DUP
TRACEPOINT_PROBE(syscalls, sys_enter_dup) { return dup_enter(args->fildes, -1); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup) { return dup_exit(args->ret); }
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP2
TRACEPOINT_PROBE(syscalls, sys_enter_dup2) { return dup_enter(args->oldfd, args->newfd); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup2) { return dup_exit(args->ret); }
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP3
TRACEPOINT_PROBE(syscalls, sys_enter_dup3) { return dup_enter(args->oldfd, args->newfd); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup3) { return dup_exit(args->ret); }
#endif

#ifdef GT_HAVE_SYS_ENTER_FCNTL /* F_DUPFD (0), F_DUPFD_CLOEXEC (1030) */
TRACEPOINT_PROBE(syscalls, sys_enter_fcntl)
{
    return (args->cmd == 0 || args->cmd == 1030) ? dup_enter(args->fd, -1) : 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_fcntl) { return dup_exit(args->ret); }
#endif
