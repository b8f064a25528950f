/* What the API layer's program (cuda.bpf.c) shares with the syscall layer's
 * tp_btf dispatcher: the maps that say which processes the API layer traces
 * and which it has paused, the helpers that read them, and the libcuda path
 * test of library loads.
 *
 * With tp_btf the syscall layer sees every openat in its sys_enter/sys_exit
 * programs, so it also notices libcuda loads (syscalls.bpf.c): no syscalls:*
 * tracepoint stays attached, which would make every syscall of the host take
 * the kernel's per-syscall perf path. Its program, loaded first, then makes
 * these maps (GT_CUDA_SHARE: bcc shares them by name within the recorder
 * process) and the API program uses them (GT_CUDA_EXTERN). Alone, or beside
 * the syscalls:* tracepoints, the API program has its own maps and its own
 * openat tracepoints (cuda_load.bpf.h). gputrace/record/api/libcuda.py chooses.
 */
#ifndef GT_CUDA_SHARED_BPF_H
#define GT_CUDA_SHARED_BPF_H
#define GT_PATH_MAX 256
#define GT_SIGSTOP 19

/* One list of the shared maps; how each is declared depends on the program. */
#if defined(GT_CUDA_EXTERN)
#define GT_CUDA_TABLE(kind, k, v, name, n) BPF_TABLE("extern", k, v, name, n)
#elif defined(GT_CUDA_SHARE)
#define GT_CUDA_TABLE(kind, k, v, name, n) BPF_TABLE_SHARED(kind, k, v, name, n)
#else
#define GT_CUDA_TABLE(kind, k, v, name, n) BPF_TABLE(kind, k, v, name, n)
#endif
GT_CUDA_TABLE("array", int, struct cuda_config, cuda_config, 1);
GT_CUDA_TABLE("hash", u32, u8, cuda_targets, 65536);          /* traced tgids (filter mode) */
GT_CUDA_TABLE("hash", u32, struct cuda_pause, cuda_paused, 4096);

static __always_inline struct cuda_config *cuda_cfg(void)
{
    u32 zero = 0;
    return cuda_config.lookup(&zero);
}

static __always_inline int cuda_wanted(u32 tgid, struct cuda_config *cfg)
{
    /* self_tgid 0: the recorder has not configured the layer yet, and the zeroed
     * config would say "whole host": a process of the host that loads libcuda while
     * a `-p` recorder still compiles its other layers must not become a target */
    if (!cfg->self_tgid || tgid == cfg->self_tgid)
        return 0;
    if (!cfg->filter)
        return 1;
    if (cuda_targets.lookup(&tgid))
        return 1;
    return 0;
}

/* Record why `tgid` needs the recorder; stop it when pausing is on. */
static __always_inline void cuda_pause_for(u32 tgid, u32 kind, s32 fd, struct cuda_config *cfg)
{
    struct cuda_pause p = {};
    struct cuda_pause *old = cuda_paused.lookup(&tgid);
    if (old)
        p = *old;
    else
        p.fd = -1;
    p.ts_ns = bpf_ktime_get_ns();
    p.kinds |= kind;
    if (kind == GT_PAUSE_LOAD)
        p.fd = fd;
    if (cfg->pause && !p.stopped) {
        p.stopped = 1;
        p.stop_boot_ns = bpf_ktime_get_boot_ns();
        bpf_send_signal(GT_SIGSTOP);
    }
    cuda_paused.update(&tgid, &p);
}

/* Is the path in `s` (`n` bytes read with its NUL, as bpf_probe_read_user_str
 * returns) a libcuda file: "/libcuda.so" within its last 32 bytes? Unrolled:
 * no data-dependent loop for the verifier to explore. */
static __always_inline int cuda_lib_path(const char *s, long n)
{
    if (n < 12)
        return 0;
    u32 len = (u32)n - 1;
    u32 start = len > 32 ? len - 32 : 0;
    const char want[] = "/libcuda.so";
    int found = 0;
#pragma unroll
    for (u32 k = 0; k < 22; k++) {
        int ok = start + k + 11 <= len;
#pragma unroll
        for (u32 j = 0; j < 11; j++)
            ok = ok && s[(start + k + j) & (GT_PATH_MAX - 1)] == want[j];
        found |= ok;
    }
    return found;
}
#endif /* GT_CUDA_SHARED_BPF_H */
