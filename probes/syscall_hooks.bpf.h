/* Where the probes attach: the one place that names kernel hook points.
 *
 * GT_TP_BTF (x86-64; set by gputrace/record/loader.py when the kernel takes
 * BTF-typed raw tracepoints): one program on raw_syscalls sys_enter and one on
 * sys_exit dispatch on the syscall number, so a syscall of no interest costs
 * a compare, and page_fault_user is a tp_btf program too. The arguments are
 * read from the saved user registers (the x86-64 syscall ABI: di, si, dx, r10,
 * r8, r9; orig_ax holds the number at exit), whose order is that of ptrace's
 * user_regs_struct; the verifier checks each access against the kernel's BTF.
 * Calls from 32-bit code (cs != __USER_CS) have other numbers and are skipped,
 * as the syscalls:* tracepoints skip them.
 * Otherwise (the fallback): the per-syscall syscalls:* tracepoints, whose
 * arguments are the tracepoint's own fields.
 */
#include "common.bpf.h"
#ifdef GT_TP_BTF
#define GT_NR_CLOSE 3
#define GT_NR_MMAP 9
#define GT_NR_MUNMAP 11
#define GT_NR_IOCTL 16
#define GT_NR_OPEN 2
#define GT_NR_DUP 32
#define GT_NR_DUP2 33
#define GT_NR_FCNTL 72
#define GT_NR_EXIT_GROUP 231
#define GT_NR_OPENAT 257
#define GT_NR_DUP3 292
#define GT_NR_OPENAT2 437
#define GT_USER_CS 0x33

/* The exits that edit managed ranges run as tail calls: one program holding
 * them all is past what the verifier walks. Slots: loader.TP_BTF_TAILS. The
 * ioctl exit, the hot one, is inline (a tail call is an indirect jump: a
 * retpoline on the machines measured). gt_sys_exit filtered (maybe_known). */
#define GT_TAIL_MMAP 0
#define GT_TAIL_MUNMAP 1
BPF_PROG_ARRAY(exit_tails, 2);

int gt_exit_mmap(u64 *ctx) { return mmap_exit((long)ctx[1], bpf_get_current_pid_tgid()); }
int gt_exit_munmap(u64 *ctx) { return munmap_exit((long)ctx[1], bpf_get_current_pid_tgid()); }

/* tp_btf/sys_enter (struct pt_regs *regs, long id): loader.Probes attaches it. */
int gt_sys_enter(u64 *ctx)
{
    long nr = (long)ctx[1];
    struct pt_regs *r = (struct pt_regs *)ctx[0];
    switch (nr) {
    case GT_NR_IOCTL:
    case GT_NR_MMAP:
    case GT_NR_MUNMAP:
    case GT_NR_CLOSE:
    case GT_NR_OPENAT:
    case GT_NR_OPEN:
    case GT_NR_OPENAT2:
    case GT_NR_DUP:
    case GT_NR_DUP2:
    case GT_NR_DUP3:
    case GT_NR_FCNTL:
    case GT_NR_EXIT_GROUP:
        break;
    default:
        return 0;
    }
    if (r->cs != GT_USER_CS)
        return 0;
    if (nr == GT_NR_IOCTL)
        return ioctl_enter((s32)r->di, (u32)r->si, r->dx);
    if (nr == GT_NR_MMAP)
        return mmap_enter(r->di, r->si, r->dx, r->r10, (s32)r->r8, r->r9);
    if (nr == GT_NR_MUNMAP)
        return munmap_enter(r->di, r->si);
    if (nr == GT_NR_CLOSE)
        return close_enter((s32)r->di);
    if (nr == GT_NR_OPENAT)
        return open_enter((const char *)r->si, 1);
#ifdef GT_HAVE_SYS_ENTER_OPEN
    if (nr == GT_NR_OPEN)
        return open_enter((const char *)r->di, 0);
#endif
#ifdef GT_HAVE_SYS_ENTER_OPENAT2
    if (nr == GT_NR_OPENAT2)
        return open_enter((const char *)r->si, 0);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP
    if (nr == GT_NR_DUP)
        return dup_enter((s32)r->di, -1);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP2
    if (nr == GT_NR_DUP2)
        return dup_enter((s32)r->di, (s32)r->si);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP3
    if (nr == GT_NR_DUP3)
        return dup_enter((s32)r->di, (s32)r->si);
#endif
#ifdef GT_HAVE_SYS_ENTER_FCNTL
    if (nr == GT_NR_FCNTL)
        return fcntl_enter((s32)r->di, (u32)r->si);
#endif
#ifdef GT_HAVE_SYS_ENTER_EXIT_GROUP
    if (nr == GT_NR_EXIT_GROUP)
        return exit_group_enter((long)r->di);
#endif
    return 0;
}

/* tp_btf/sys_exit (struct pt_regs *regs, long ret) */
int gt_sys_exit(u64 *ctx)
{
    struct pt_regs *r = (struct pt_regs *)ctx[0];
    long ret = (long)ctx[1];
    long nr = (long)r->orig_ax;
    switch (nr) {
    case GT_NR_IOCTL:
    case GT_NR_MMAP:
    case GT_NR_MUNMAP:
    case GT_NR_CLOSE:
    case GT_NR_OPENAT:
    case GT_NR_OPEN:
    case GT_NR_OPENAT2:
    case GT_NR_DUP:
    case GT_NR_DUP2:
    case GT_NR_DUP3:
    case GT_NR_FCNTL:
        break;
    default:
        return 0;
    }
    if (r->cs != GT_USER_CS)
        return 0;
    /* the first filter of these exits, here, so no other process pays a tail call */
    if (nr == GT_NR_IOCTL || nr == GT_NR_MMAP || nr == GT_NR_MUNMAP) {
        u64 id = bpf_get_current_pid_tgid();
        if (!maybe_known(id >> 32))
            return 0;
        if (nr == GT_NR_IOCTL)
            return ioctl_exit(ret, id);
    }
    if (nr == GT_NR_MMAP)
        exit_tails.call(ctx, GT_TAIL_MMAP);
    if (nr == GT_NR_MUNMAP)
        exit_tails.call(ctx, GT_TAIL_MUNMAP);
    if (nr == GT_NR_CLOSE)
        return close_exit(ret);
    if (nr == GT_NR_OPENAT)
        return open_exit(ret);
#ifdef GT_HAVE_SYS_ENTER_OPEN
    if (nr == GT_NR_OPEN)
        return open_exit(ret);
#endif
#ifdef GT_HAVE_SYS_ENTER_OPENAT2
    if (nr == GT_NR_OPENAT2)
        return open_exit(ret);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP
    if (nr == GT_NR_DUP)
        return dup_exit(ret);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP2
    if (nr == GT_NR_DUP2)
        return dup_exit(ret);
#endif
#ifdef GT_HAVE_SYS_ENTER_DUP3
    if (nr == GT_NR_DUP3)
        return dup_exit(ret);
#endif
#ifdef GT_HAVE_SYS_ENTER_FCNTL
    if (nr == GT_NR_FCNTL)
        return dup_exit(ret);
#endif
    return 0;
}

#ifdef GT_HAVE_PAGE_FAULT_USER
/* tp_btf/page_fault_user (unsigned long address, struct pt_regs *regs,
 * unsigned long error_code) */
int gt_page_fault_user(u64 *ctx)
{
    struct pt_regs *r = (struct pt_regs *)ctx[1];
    return fault_user(ctx[0], r->ip, ctx[2]);
}
#endif

#else /* the syscalls:* tracepoints */

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl) { return ioctl_enter((s32)args->fd, (u32)args->cmd, args->arg); }
/* the first filter of these exits (the tp_btf dispatcher has its own) */
static __always_inline u64 known_id(void)
{
    u64 id = bpf_get_current_pid_tgid();
    return maybe_known(id >> 32) ? id : 0; /* 0: the idle task, which makes no syscalls */
}
TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)
{
    u64 id = known_id();
    return id ? ioctl_exit(args->ret, id) : 0;
}
TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    return mmap_enter(args->addr, args->len, args->prot, args->flags, (s32)args->fd, args->off);
}
TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    u64 id = known_id();
    return id ? mmap_exit(args->ret, id) : 0;
}
TRACEPOINT_PROBE(syscalls, sys_enter_munmap) { return munmap_enter(args->addr, args->len); }
TRACEPOINT_PROBE(syscalls, sys_exit_munmap)
{
    u64 id = known_id();
    return id ? munmap_exit(args->ret, id) : 0;
}
TRACEPOINT_PROBE(syscalls, sys_enter_close) { return close_enter((s32)args->fd); }
TRACEPOINT_PROBE(syscalls, sys_exit_close) { return close_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_openat) { return open_enter(args->filename, 1); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat) { return open_exit(args->ret); }
#ifdef GT_HAVE_SYS_ENTER_OPEN
TRACEPOINT_PROBE(syscalls, sys_enter_open) { return open_enter(args->filename, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_open) { return open_exit(args->ret); }
#endif
#ifdef GT_HAVE_SYS_ENTER_OPENAT2
TRACEPOINT_PROBE(syscalls, sys_enter_openat2) { return open_enter(args->filename, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat2) { return open_exit(args->ret); }
#endif
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
#ifdef GT_HAVE_SYS_ENTER_FCNTL
TRACEPOINT_PROBE(syscalls, sys_enter_fcntl) { return fcntl_enter((s32)args->fd, (u32)args->cmd); }
TRACEPOINT_PROBE(syscalls, sys_exit_fcntl) { return dup_exit(args->ret); }
#endif
#ifdef GT_HAVE_SYS_ENTER_EXIT_GROUP
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group) { return exit_group_enter(args->error_code); }
#endif
#ifdef GT_HAVE_PAGE_FAULT_USER
TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    return fault_user(args->address, args->ip, args->error_code);
}
#endif

#endif /* GT_TP_BTF */

/* tp_btf/task_rename (struct task_struct *task, const char *comm), in both
 * modes: keeps the name a thread's traced ioctls copy (comm_cache.bpf.h).
 * bpf_load.keep_names loads it; config.comm_cache says it runs. */
int gt_task_rename(u64 *ctx)
{
    struct pending_ioctl *p = pending_ioctls.task_storage_get((void *)ctx[0], 0, 0);
    if (p)
        gt_comm_renamed(&p->comm, (const char *)ctx[1]);
    return 0;
}
