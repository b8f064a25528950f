/* What every part of the syscall layer's BPF program shares: settings with
 * their defaults, the structs kept in maps, every map, the small helpers, and
 * declarations of the functions one part calls in another, so that the parts
 * (nv_*.bpf.h, syscall_hooks.bpf.h) include this and nothing else, in any
 * order. loader.probe_source inlines it once.
 *
 * Only tracepoint arguments (and, with tp_btf, the saved user registers) are
 * read: no kernel struct layouts. Settings come from the `config` and
 * `uvm_layouts` maps and from -D defines that gputrace/record/driver_version.py and
 * loader.cflags validate; nothing user-supplied is pasted here.
 */
#ifndef GT_COMMON_BPF_H
#define GT_COMMON_BPF_H
#include <uapi/linux/ptrace.h>
#include "gputrace_events.h"
#include "comm_cache.bpf.h"

#ifndef GT_FD_SCAN
#define GT_FD_SCAN 1024 /* fds copied on fork / dropped on exit, per process */
#endif
#ifndef GT_IOCTL_RB_PAGES
#define GT_IOCTL_RB_PAGES 16384 /* 64 MiB: ~0.4 s of events at 1 M/s (loader.IOCTL_RB_PAGES) */
#endif
#ifndef GT_TGID_WORDS
#define GT_TGID_WORDS 65536 /* tgids up to 4194304 (pid_max): 64 per entry */
#endif

struct fdval {
    u8 kind;
    u8 _pad0;
    s16 gpu;
    u32 _pad1;
};
struct pending_open {
    u64 ts_ns;
    struct fdval v;
    u8 libcuda;         /* a libcuda load for the API layer (GT_CUDA_SHARE), not a device */
    u8 _pad[7];
};
struct mkey {
    u32 tgid;
    u32 _pad0;
    u64 addr;
};
struct pending_mmap {
    u64 ts_ns, addr, length, offset;
    u32 prot, flags;
    s32 fd;
    struct fdval v;
};

BPF_RINGBUF_OUTPUT(ioctl_events, GT_IOCTL_RB_PAGES);
BPF_RINGBUF_OUTPUT(mapping_events, 256);
BPF_RINGBUF_OUTPUT(proc_events, 64);
BPF_RINGBUF_OUTPUT(oom_events, 1); /* read by its own thread, woken per record */
BPF_PERCPU_ARRAY(drops, u64, GT_NBUF);
BPF_ARRAY(config, struct gt_config, 1);
BPF_ARRAY(uvm_layouts, struct uvm_layout, GT_UVM_SLOTS);
struct uvm_span {
    u8 b[GT_UVM_SPAN + 16];  /* + the widest field (a UUID) past the last offset */
};
BPF_PERCPU_ARRAY(uvm_span_scratch, struct uvm_span, 1);
BPF_PERCPU_ARRAY(ioctl_staging, struct ioctl_batch, 1);
BPF_HASH(fds, u64, struct fdval, 65536);          /* tgid<<32 | fd */
BPF_HASH(targets, u32, u8, 65536);                /* traced tgids (filter mode) */
BPF_HASH(seen, u32, u8, 65536);                   /* tgids that opened a device */
/* The first filter of every syscall and fault probe: one byte per tgid, set for
 * every process that may hold a tracked fd or a managed range (a superset of
 * `seen`), so the work of every other process costs one array load. A tgid
 * beyond the array counts as known (the hash lookups then decide). */
struct tgid_bytes {
    u8 b[64];
};
BPF_ARRAY(known_tgids, struct tgid_bytes, GT_TGID_WORDS);
BPF_HASH(exit_codes, u32, s32, 16384);
BPF_HASH(pending_opens, u32, struct pending_open, 16384);
BPF_HASH(pending_mmaps, u32, struct pending_mmap, 16384);
BPF_HASH(maps, struct mkey, struct pending_mmap, 65536); /* live mmaps */
struct path_buf {
    char s[GT_PREFIX_MAX];
};
BPF_PERCPU_ARRAY(path_scratch, struct path_buf, 1);

static __always_inline void count_drop(u32 buf, u64 n)
{
    u64 *d = drops.lookup(&buf);
    if (d)
        *d += n;
}

static __always_inline u64 fdkey(u32 tgid, s32 fd) { return ((u64)tgid << 32) | (u32)fd; }

static __always_inline int maybe_known(u32 tgid)
{
    u32 i = tgid >> 6;
    struct tgid_bytes *w = known_tgids.lookup(&i);
    return !w || w->b[tgid & 63];
}

static __always_inline void mark_known(u32 tgid, u8 on)
{
    u32 i = tgid >> 6;
    struct tgid_bytes *w = known_tgids.lookup(&i);
    if (w)
        w->b[tgid & 63] = on;
}

/* Is this process one we trace (the whole host but the recorder itself: its RM
 * client and UVM tools trackers must never appear in the trace)? */
static __always_inline int wanted(u32 tgid, struct gt_config *cfg)
{
    if (tgid == cfg->self_tgid)
        return 0;
    if (!cfg->filter)
        return 1;
    if (targets.lookup(&tgid))
        return 1;
    return 0;
}

static __always_inline int relevant(u32 tgid, struct gt_config *cfg)
{
    if (tgid == cfg->self_tgid)
        return 0;
    if (cfg->filter) {
        if (targets.lookup(&tgid))
            return 1;
        return 0;
    }
    if (seen.lookup(&tgid))
        return 1;
    return 0;
}

static __always_inline void emit_proc(u32 kind, u32 pid, u32 ppid, s32 code)
{
    struct proc_event e = {};
    e.ts_ns = bpf_ktime_get_ns();
    e.kind = kind;
    e.pid = pid;
    e.ppid = ppid;
    e.exit_code = code;
    e.tid = (u32)bpf_get_current_pid_tgid();
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    if (proc_events.ringbuf_output(&e, sizeof(e), BPF_RB_NO_WAKEUP) != 0)
        count_drop(GT_BUF_PROC, 1);
}

/* ---------------------------------------------- fds (nv_fds.bpf.h) */
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

/* ------------------------------------------- ioctls (nv_ioctl.bpf.h) */
struct pending_ioctl {
    u64 ts_ns;
    u64 arg;
    s32 fd;
    u32 cmd;
    struct fdval v;
    u8 active;          /* set at entry, cleared at exit */
    u8 _pad[7];
    struct gt_comm comm; /* the thread's name (comm_cache.bpf.h) */
};
/* Per thread, in the task itself: cheaper than a hash keyed by tid, and gone
 * with the thread (a hash entry of a thread killed inside its ioctl stays). */
BPF_TASK_STORAGE(pending_ioctls, struct pending_ioctl);

/* ----------------------- managed ranges and CPU faults (nv_faults.bpf.h) */
#ifndef GT_SMALL_BLOCKS
#define GT_SMALL_BLOCKS 512 /* ranges up to 1 GiB: per block; longer ones: big ranges */
#endif
#ifndef GT_MANAGED_BLOCKS
#define GT_MANAGED_BLOCKS 131072 /* map capacity: 256 GiB of managed ranges */
#endif
#ifndef GT_FAULT_RB_PAGES
#define GT_FAULT_RB_PAGES 8192 /* 32 MiB (loader.FAULT_RB_PAGES) */
#endif
#define GT_MAP_FIXED 0x10
#define GT_GEN_BPF_MASK 0x7fffffffu /* generations set by user space have bit 31 */

struct gt_span {
    u64 addr, len;
};

BPF_RINGBUF_OUTPUT(fault_events, GT_FAULT_RB_PAGES);
BPF_PERCPU_ARRAY(fault_staging, struct fault_batch, 1);
BPF_PERCPU_ARRAY(fault_stats, u64, GT_FS_N);
BPF_ARRAY(managed_gen, u32, 1);
BPF_PERCPU_ARRAY(proc_scratch, struct managed_proc, 1);
BPF_HASH(managed_procs, u32, struct managed_proc, 16384);
BPF_HASH(managed_blocks, struct mblock_key, struct mblock, GT_MANAGED_BLOCKS);
BPF_HASH(pending_clears, u32, struct gt_span, 16384);

/* ------------------------------------- defined in one part, used in others */
static __always_inline void emit_fd(u8 op, u64 ts, s32 fd, s32 new_fd, struct fdval *v,
                                    long ret, int has_ret);                 /* nv_fds */
static __always_inline void faults_flush(void);                             /* nv_faults */
static __always_inline void managed_clear_enter(u64 addr, u64 len, u64 flags); /* nv_managed */
static __always_inline void managed_clear_exit(long ret, int is_mmap);
static __always_inline void managed_mmap_exit(struct pending_mmap *pp, long ret);
static __always_inline void managed_forget(u32 tgid);
/* the probes' bodies, attached in syscall_hooks.bpf.h; the exits of ioctl, mmap and
 * munmap take the pid_tgid of a process that passed maybe_known there */
static __always_inline int open_enter(const char *filename, int at);       /* syscalls.bpf.c */
static __always_inline int open_exit(long ret);
static __always_inline int close_enter(s32 fd);                             /* nv_fds */
static __always_inline int close_exit(long ret);
static __always_inline int dup_enter(s32 oldfd, s32 newfd);
static __always_inline int dup_exit(long ret);
static __always_inline int fcntl_enter(s32 fd, u32 cmd);
static __always_inline int ioctl_enter(s32 fd, u32 cmd, u64 arg);           /* nv_ioctl */
static __always_inline int ioctl_exit(long ret, u64 id);
static __always_inline int fault_user(u64 addr, u64 ip, u64 error_code);   /* nv_faults */
static __always_inline int mmap_enter(u64 addr, u64 len, u64 prot, u64 flags, s32 fd,
                                      u64 off);                             /* nv_lifecycle */
static __always_inline int mmap_exit(long ret, u64 id);
static __always_inline int munmap_enter(u64 addr, u64 len);
static __always_inline int munmap_exit(long ret, u64 id);
static __always_inline int exit_group_enter(long error_code);

#endif /* GT_COMMON_BPF_H */
