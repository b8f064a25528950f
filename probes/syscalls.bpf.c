/* gputrace syscall layer: NVIDIA fd tracking, ioctl decoding, mmap/munmap,
 * managed-range CPU faults, process lifecycle. The main text bcc compiles:
 * shared settings, maps and helpers are in common.bpf.h; the opens here; close
 * and dup in nv_fds.bpf.h; ioctls and the RM/UVM decoders in nv_ioctl.bpf.h
 * (nv_rm.bpf.h); managed ranges and faults in nv_faults.bpf.h (nv_managed.bpf.h);
 * mmap and the process lifecycle in nv_lifecycle.bpf.h; where each probe
 * attaches (tp_btf or tracepoints) in syscall_hooks.bpf.h.
 */
#include "common.bpf.h"
#ifdef GT_CUDA_SHARE
#include "cuda_shared.bpf.h"
#endif

/* ------------------------------------------------------------ opens */
/* `at`: an openat, where the API layer looks for libcuda loads (GT_CUDA_SHARE:
 * the tp_btf dispatcher sees them in its place; cuda_shared.bpf.h). */
static __always_inline int open_enter(const char *filename, int at)
{
    u32 zero = 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct gt_config *cfg = config.lookup(&zero);
    struct path_buf *pb = path_scratch.lookup(&zero);
    if (!cfg || !pb)
        return 0;
    int dev = wanted(tgid, cfg);
    int lib = 0;
#ifdef GT_CUDA_SHARE
    struct cuda_config *cc = at ? cuda_cfg() : 0;
    /* self_tgid 0: no API layer has configured the maps */
    lib = cc && cc->self_tgid && cuda_wanted(tgid, cc);
#endif
    if (!dev && !lib)
        return 0;
    char *buf = pb->s;
    long n = bpf_probe_read_user_str(buf, GT_PREFIX_MAX, filename);
#ifdef GT_CUDA_SHARE
    if (lib && cuda_lib_path(buf, n)) {
        struct pending_open lp = {.libcuda = 1};
        pending_opens.update(&tid, &lp);
        return 0;
    }
#endif
    u32 plen = cfg->prefix_len;
    if (!dev || plen == 0 || plen > GT_PREFIX_MAX - 32)
        return 0;
    if (n <= (long)plen)
        return 0;
    u32 diff = 0; /* fixed trip count: the verifier sees every index */
    for (u32 i = 0; i < GT_PREFIX_MAX - 32; i++) {
        /* all ones while i < plen (both below 2^31), without a branch: a
         * conditional here is one more path per byte for the verifier */
        u32 in = (u32)((s32)(i - plen) >> 31);
        diff |= in & (u32)(buf[i] ^ cfg->prefix[i]);
    }
    if (diff)
        return 0;
    char s[20] = {};
    bpf_probe_read_user_str(s, sizeof(s), filename + plen);
    if (s[0] != 'n' || s[1] != 'v' || s[2] != 'i' || s[3] != 'd' || s[4] != 'i' || s[5] != 'a')
        return 0;
    struct pending_open p = {};
    p.ts_ns = bpf_ktime_get_ns();
    p.v.gpu = -1;
    if (s[6] == 'c' && s[7] == 't' && s[8] == 'l' && s[9] == 0) {
        p.v.kind = GT_DEV_CTL;
    } else if (s[6] == '-' && s[7] == 'u' && s[8] == 'v' && s[9] == 'm') {
        if (s[10] == 0)
            p.v.kind = GT_DEV_UVM;
        else if (s[10] == '-' && s[11] == 't' && s[12] == 'o' && s[13] == 'o' &&
                 s[14] == 'l' && s[15] == 's' && s[16] == 0)
            p.v.kind = GT_DEV_UVM_TOOLS;
        else
            return 0;
    } else {
        s16 g = 0;
        int digits = 0, end = 0;
#pragma unroll
        for (int i = 6; i < 10; i++) {
            char c = s[i];
            if (end)
                continue;
            if (c == 0)
                end = 1;
            else if (c >= '0' && c <= '9' && digits < 3)
                g = g * 10 + (c - '0'), digits++;
            else
                return 0;
        }
        if (!digits || (!end && s[10] != 0))
            return 0;
        p.v.kind = GT_DEV_GPU;
        p.v.gpu = g;
    }
    pending_opens.update(&tid, &p);
    return 0;
}

static __always_inline int open_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct pending_open *p = pending_opens.lookup(&tid);
    if (!p)
        return 0;
    struct pending_open po = *p;
    pending_opens.delete(&tid);
    if (ret < 0)
        return 0;
#ifdef GT_CUDA_SHARE
    if (po.libcuda) {
        struct cuda_config *cc = cuda_cfg();
        if (cc)
            cuda_pause_for(tgid, GT_PAUSE_LOAD, (s32)ret, cc);
        return 0;
    }
#endif
    u64 k = fdkey(tgid, (s32)ret);
    mark_known(tgid, 1); /* before the fd exists: the filter never hides it */
    fds.update(&k, &po.v);
    emit_fd(GT_FD_OPEN, po.ts_ns, (s32)ret, -1, &po.v, ret, 1);
    if (!seen.lookup(&tgid)) {
        u8 one = 1;
        seen.update(&tgid, &one);
        emit_proc(GT_PROC_SEEN, tgid, 0, -1);
    }
    return 0;
}

#include "nv_fds.bpf.h"
#include "nv_faults.bpf.h"
#include "nv_ioctl.bpf.h"
#include "nv_lifecycle.bpf.h"
#include "syscall_hooks.bpf.h"
