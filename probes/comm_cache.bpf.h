/* A thread's name (comm) kept in a layer's per-thread storage, so the hot
 * events (a traced ioctl's exit, an API call's return) copy 16 bytes instead
 * of calling bpf_get_current_comm (~90 ns a call on the 6.18 VM measured,
 * benchmarks/README.md "Overhead, sixth round").
 *
 * Exact as long as the name only changes through __set_task_comm (prctl
 * PR_SET_NAME, a write to /proc/<tid>/comm, exec): its task_rename tracepoint
 * runs a tp_btf program (gt_comm_renamed) that writes the new name into the
 * renamed thread's storage, before the kernel copies it into the task. The
 * cache is only filled where user space set `comm_cache` in the layer's config,
 * after that program attached; elsewhere every event reads the name as before.
 * One race is left: another thread renaming this one (through /proc) between
 * this thread's read of its old name and its storing it; a name is therefore
 * read again after GT_COMM_TTL_NS, which bounds such a stale name to 1 s.
 */
#ifndef GT_COMM_CACHE_BPF_H
#define GT_COMM_CACHE_BPF_H
#define GT_COMM_TTL_NS 1000000000ULL

struct gt_comm {
    u64 s[2];           /* the name as bpf_get_current_comm writes it (NUL-padded) */
    u64 ts_ns;          /* when it was read from the task; 0 = not held */
};

/* Copy the held name into `out` (16 bytes, 8-aligned); 0 if none is held or
 * it is older than the TTL (the caller reads it then, and may gt_comm_keep it). */
static __always_inline int gt_comm_get(struct gt_comm *c, char *out, u64 now)
{
    u64 ts = c->ts_ns;
    if (!ts || now - ts >= GT_COMM_TTL_NS)
        return 0;
    ((u64 *)out)[0] = c->s[0];
    ((u64 *)out)[1] = c->s[1];
    return 1;
}

static __always_inline void gt_comm_keep(struct gt_comm *c, const char *name, u64 now)
{
    c->s[0] = ((const u64 *)name)[0];
    c->s[1] = ((const u64 *)name)[1];
    c->ts_ns = now;
}

/* tp_btf/task_rename: `comm` is the new name, not yet in the task. A thread
 * that holds no name needs nothing: it reads the task's name when it next
 * needs one. Built on the stack first: a reader never sees a half-cleared name. */
static __always_inline void gt_comm_renamed(struct gt_comm *c, const char *comm)
{
    if (!c->ts_ns)
        return;
    u64 s[2] = {};
    bpf_probe_read_kernel_str(s, sizeof(s), comm);
    c->s[0] = s[0];
    c->s[1] = s[1];
}
#endif /* GT_COMM_CACHE_BPF_H */
