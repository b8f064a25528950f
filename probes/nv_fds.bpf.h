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
 */
#include "common.bpf.h"

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
static __always_inline int close_enter(s32 fd)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    if (!maybe_known(id >> 32))
        return 0;
    u64 k = fdkey(id >> 32, fd);
    struct fdval *v = fds.lookup(&k);
    if (!v)
        return 0;
    struct pending_close p = {};
    p.ts_ns = bpf_ktime_get_ns();
    p.fd = fd;
    p.v = *v;
    fds.delete(&k);
    pending_closes.update(&tid, &p);
    return 0;
}

static __always_inline int close_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    if (!maybe_known(id >> 32))
        return 0;
    struct pending_close *pp = pending_closes.lookup(&tid);
    if (!pp)
        return 0;
    struct pending_close p = *pp;
    pending_closes.delete(&tid);
    emit_fd(GT_FD_CLOSE, p.ts_ns, p.fd, -1, &p.v, ret, 1);
    return 0;
}

/* -------------------------------------------------------------------- dup */
static __always_inline int dup_enter(s32 oldfd, s32 newfd)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    if (!maybe_known(id >> 32))
        return 0;
    struct pending_dup p = {.ts_ns = bpf_ktime_get_ns(), .oldfd = oldfd, .newfd = newfd};
    pending_dups.update(&tid, &p);
    return 0;
}

static __always_inline int dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!maybe_known(tgid))
        return 0;
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

/* fcntl: only F_DUPFD (0) and F_DUPFD_CLOEXEC (1030) duplicate */
static __always_inline int fcntl_enter(s32 fd, u32 cmd)
{
    return (cmd == 0 || cmd == 1030) ? dup_enter(fd, -1) : 0;
}
