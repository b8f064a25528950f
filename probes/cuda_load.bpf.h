/* gputrace API layer, part of cuda.bpf.c (inlined by gputrace/record/api/libcuda.py):
 * libcuda loads seen at openat (the recorder attaches uprobes to that file),
 * and targets followed across fork/exit.
 */
/* ------------------------------------------------------------ library loads */
#ifndef GT_CUDA_EXTERN /* else the syscall layer's tp_btf dispatcher sees them (syscalls.bpf.c) */
TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
    u32 zero = 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct cuda_config *cfg = cuda_cfg();
    struct cuda_path *pb = cuda_path_scratch.lookup(&zero);
    if (!cfg || !pb || !cuda_wanted(id >> 32, cfg))
        return 0;
    long n = bpf_probe_read_user_str(pb->s, GT_PATH_MAX, args->filename);
    if (!cuda_lib_path(pb->s, n))
        return 0;
    struct cuda_open o = {.hit = 1};
    cuda_opens.update(&tid, &o);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct cuda_open *o = cuda_opens.lookup(&tid);
    if (!o)
        return 0;
    cuda_opens.delete(&tid);
    struct cuda_config *cfg = cuda_cfg();
    if (!cfg || args->ret < 0)
        return 0;
    cuda_pause_for(id >> 32, GT_PAUSE_LOAD, (s32)args->ret, cfg);
    return 0;
}
#endif

/* ------------------------------------------------------------ targets */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 child = args->child_pid;
    struct cuda_config *cfg = cuda_cfg();
    if (cfg && cfg->filter && cuda_targets.lookup(&tgid)) {
        u8 one = 1;
        cuda_targets.update(&child, &one);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    /* sched_process_fork also fires for a target's new threads, whose tids then
     * sit in cuda_targets: drop each at its thread's exit, else a later process
     * that reuses the number would be traced */
    if (tgid != tid) {
        cuda_targets.delete(&tid);
        return 0;
    }
    int gone = cuda_targets.delete(&tgid) == 0;
    gone |= cuda_seen.delete(&tgid) == 0;
    if (gone) { /* threads' remembered facts (cuda.bpf.c) may name this tgid */
        u32 zero = 0;
        u32 *g = cuda_gen.lookup(&zero);
        if (g)
            __sync_fetch_and_add(g, 1);
    }
    return 0;
}

/* ------------------------------------------------------------ thread names */
/* tp_btf/task_rename (struct task_struct *task, const char *comm): keeps the
 * name a thread's API calls copy (comm_cache.bpf.h). bpf_load.keep_names
 * loads it; cuda_config.comm_cache says it runs. */
int cuda_task_rename(u64 *ctx)
{
    struct cuda_pending *p = cuda_pending.task_storage_get((void *)ctx[0], 0, 0);
    if (p)
        gt_comm_renamed(&p->comm, (const char *)ctx[1]);
    return 0;
}
