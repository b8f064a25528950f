/* Event structs shared by the BPF programs and gputrace/record/decode.py.
 *
 * Every field is naturally aligned and every hole is an explicit _pad field,
 * so the layout is the same for clang -target bpf and for host gcc;
 * tests/unit/record/test_event_structs.py compiles this header with gcc and checks each
 * offsetof/sizeof against the numpy dtypes. Units are in the field names.
 */
#ifndef GPUTRACE_EVENTS_H
#define GPUTRACE_EVENTS_H

#ifdef GT_USERSPACE /* host compilers (the struct test); bcc has the kernel types */
#include <stdint.h>
typedef uint8_t u8;
typedef int16_t s16;
typedef uint16_t u16;
typedef int32_t s32;
typedef uint32_t u32;
typedef int64_t s64;
typedef uint64_t u64;
#endif

/* Device kinds: the codes of gputrace.schema.DEVICE_KINDS. */
#define GT_DEV_CTL 1
#define GT_DEV_GPU 2
#define GT_DEV_UVM 3
#define GT_DEV_UVM_TOOLS 4

/* ioctl_event.valid: which nullable fields hold a value. */
#define GT_V_STATUS (1u << 0)
#define GT_V_H_CLIENT (1u << 1)
#define GT_V_H_PARENT (1u << 2)
#define GT_V_H_OBJECT (1u << 3)
#define GT_V_H_CLASS (1u << 4)
#define GT_V_SIZE (1u << 5)
#define GT_V_VA_BASE (1u << 6)
#define GT_V_VA_LENGTH (1u << 7)
#define GT_V_OFFSET (1u << 8)
#define GT_V_ALIGNMENT (1u << 9)
#define GT_V_FLAGS (1u << 10)
#define GT_V_ATTR (1u << 11)
#define GT_V_ATTR2 (1u << 12)
#define GT_V_CTRL_CMD (1u << 13)
#define GT_V_REF_FD (1u << 14)
#define GT_V_UUID (1u << 15)

/* One decoded ioctl on a tracked NVIDIA fd (168 bytes). */
struct ioctl_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC at syscall entry */
    u64 latency_ns;     /* entry to exit */
    s64 ret;            /* syscall return value */
    u64 size_bytes;
    u64 va_base;
    u64 va_length;
    u64 offset;
    u64 alignment;
    u32 pid;            /* tgid */
    u32 tid;
    s32 fd;
    u32 cmd;            /* raw request number */
    u32 nr;             /* RM escape (XFER unwrapped) or UVM command */
    u32 status;         /* NV_STATUS / rmStatus */
    u32 h_client;
    u32 h_parent;
    u32 h_object;
    u32 h_class;
    u32 flags;
    u32 attr;
    u32 attr2;
    u32 ctrl_cmd;
    s32 ref_fd;
    u32 valid;          /* GT_V_* bits */
    u8 uuid[16];
    char comm[16];
    u8 device;          /* GT_DEV_* */
    u8 _pad0;
    s16 gpu_index;      /* N of nvidiaN, -1 otherwise */
    u32 _pad1;
};

/* Per-CPU staging: many ioctl events per ring-buffer record. */
#ifndef GT_STAGE_EVENTS
#define GT_STAGE_EVENTS 64
#endif
struct ioctl_batch {
    u32 count;
    u32 _pad0;
    struct ioctl_event ev[GT_STAGE_EVENTS];
};

#define GT_MAP_MMAP 1
#define GT_MAP_MUNMAP 2

/* mmap/munmap of an NVIDIA device file (88 bytes). */
struct mapping_event {
    u64 ts_ns;
    u64 latency_ns;
    u64 addr;           /* mmap: returned address (0 on error); munmap: argument */
    u64 length;
    u64 offset;
    s64 ret;
    u32 pid;
    u32 tid;
    u32 prot;
    u32 flags;
    s32 fd;             /* -1 for munmap */
    u8 op;              /* GT_MAP_* */
    u8 device;
    s16 gpu_index;
    char comm[16];
};

#define GT_PROC_FORK 1
#define GT_PROC_EXEC 2
#define GT_PROC_EXIT 3
#define GT_PROC_SEEN 4  /* first NVIDIA device open by a process (host mode) */
#define GT_PROC_UVM_INIT 5 /* UVM_INITIALIZE returned NV_OK; exit_code holds the uvm fd:
                            * the recorder attaches its UVM tools tracker on it */

/* Process lifecycle of targets and of processes seen on NVIDIA devices (48 bytes). */
struct proc_event {
    u64 ts_ns;
    u32 kind;           /* GT_PROC_* */
    u32 pid;            /* the process (child for fork) */
    u32 ppid;           /* parent (fork), 0 otherwise */
    s32 exit_code;      /* wait(2) status for exit, -1 when unknown; the fd for UVM_INIT */
    u32 tid;
    u32 _pad0;
    char comm[16];
};

/* A "no memory" failure (NV_ERR_NO_MEMORY from RM_ALLOC, RM_VID_HEAP_CONTROL or a UVM
 * command), sent at once with a wakeup to the recorder's incident thread so its RM
 * sampler asks the GPU while the failure is fresh; the ioctl row follows as usual
 * (24 bytes). */
#define GT_NV_ERR_NO_MEMORY 0x51u
struct oom_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC when the call returned: the row's ts_ns + latency_ns */
    u32 pid;            /* tgid */
    u32 status;         /* NV_STATUS */
    u32 nr;             /* RM escape or UVM command */
    u8 device;          /* GT_DEV_* */
    u8 _pad0;
    s16 gpu_index;      /* N of nvidiaN, -1 otherwise */
};

/* Value of the `proc_starts` map (key: the new task's id; probes/nv_lifecycle.bpf.h):
 * how a process that started during the recording began. Written at every fork
 * and exec of the host and emitted nowhere: the recorder looks a process up when
 * it first matters (gputrace/record/session.py), so an unrelated fork costs one
 * map update. */
struct proc_start {
    u64 fork_ns;        /* CLOCK_MONOTONIC of its fork; 0 when the fork was not seen */
    u64 fork_boot_ns;   /* CLOCK_BOOTTIME of the fork: /proc/PID/stat's start time
                         * must match it for /proc to describe this process */
    u64 exec_ns;        /* CLOCK_MONOTONIC of its last exec; 0 when none was seen */
    u64 cgroup_id;      /* cgroup v2 id at that exec (the cgroup directory's inode) */
    u32 ppid;           /* tgid of the process that forked it */
    u32 _pad0;
};

/* Drop counters: index of each ring buffer in the per-CPU `drops` array
 * (gputrace/record/loader.py BUFFERS lists the names in this order). */
#define GT_BUF_IOCTL 0
#define GT_BUF_MAPPING 1
#define GT_BUF_PROC 2
#define GT_BUF_FAULT 3   /* CPU page faults */
#define GT_BUF_FD 4      /* open/close/dup of NVIDIA fds (files table) */
#define GT_NBUF 5

/* Settings written by the loader into the `config` array (validated first). */
#define GT_PREFIX_MAX 256
struct gt_config {
    u32 self_tgid;      /* the recorder: its flush trigger is honoured */
    u32 filter;         /* 0 = whole host, 1 = only tgids in `targets` */
    u32 prefix_len;     /* length of prefix, including the trailing '/' */
    u32 comm_cache;     /* 1 = threads keep their name (gt_task_rename attached) */
    char prefix[GT_PREFIX_MAX];  /* device dir, absolute, ending in '/' */
};

/* UVM parameter layout for one command (offsets in bytes, GT_NOFF = absent). */
#define GT_NOFF 0xffff
struct uvm_layout {
    u16 status;
    u16 base;
    u16 length;
    u16 offset;
    u16 uuid;
    u16 ref_fd;
    u16 h_client;
    u16 h_object;
    u16 flags;
    u8 flags_size;      /* 1, 4 or 8 */
    u8 known;           /* 1 when the command is decoded */
    u16 span_lo;        /* [span_lo, span_lo + span_len): the bytes one user read takes, */
    u16 span_len;       /* the fields inside it come from that copy (0: each read alone) */
};
/* The most bytes of a UVM command's parameters one read takes (driver.SPAN_MAX):
 * every user read costs ~80-180 ns whatever its size, a field a read. */
#define GT_UVM_SPAN 128
#define GT_UVM_SLOTS 128
#define GT_UVM_SLOT_INITIALIZE 126
#define GT_UVM_SLOT_DEINITIALIZE 127

/* The recorder's own ioctl(-1, GT_FLUSH_CMD) makes the probe submit the
 * current CPU's partially filled staging batch. */
#define GT_FLUSH_CMD 0x47545246u

/* ---------------------------------------------------------------------------
 * Open, close and dup of NVIDIA device fds: probes/syscalls.bpf.c (opens) and
 * probes/nv_fds.bpf.h (close, dup*), decoded by decode.files_batch.
 */
#define GT_FD_OPEN 1
#define GT_FD_CLOSE 2
#define GT_FD_DUP 3
#define GT_FD_SEEN 4    /* already open at start: written by the recorder, never by BPF */

/* fd_event.valid */
#define GT_FV_RET (1u << 0)  /* ret holds the syscall's return value */

/* One open/close/dup of a tracked NVIDIA fd (56 bytes). */
struct fd_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC at syscall entry */
    s64 ret;            /* syscall return value (when GT_FV_RET) */
    u32 pid;            /* tgid */
    u32 tid;
    s32 fd;             /* opened, duplicated from, or closed */
    s32 new_fd;         /* GT_FD_DUP: the new fd; -1 otherwise */
    u8 op;              /* GT_FD_* */
    u8 device;          /* GT_DEV_* */
    s16 gpu_index;      /* N of nvidiaN, -1 otherwise */
    u8 valid;           /* GT_FV_* bits */
    u8 _pad0;
    u16 _pad1;
    char comm[16];
};

/* ---------------------------------------------------------------------------
 * API layer: uprobes on libcuda, probes/cuda.bpf.c, its own BPF
 * object; decoded by gputrace/record/api/libcuda.py (numpy mirrors in decode.py).
 */

/* cuda_event.valid: which argument fields hold a value. */
#define GT_CV_SIZE (1u << 0)
#define GT_CV_PTR (1u << 1)
#define GT_CV_HANDLE (1u << 2)
#define GT_CV_FLAGS (1u << 3)
#define GT_CV_STREAM (1u << 4)

/* One CUDA driver API memory call, emitted at return (96 bytes). */
struct cuda_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC at entry */
    u64 latency_ns;     /* entry to return */
    u64 size_bytes;
    u64 ptr;            /* device/host pointer returned (allocs) or passed */
    u64 handle;         /* CUmemGenericAllocationHandle or CUmemoryPool */
    u64 flags;
    u64 stream;
    u32 pid;            /* tgid */
    u32 tid;
    s32 result;         /* CUresult */
    s32 stack_id;       /* user stack in cuda_stacks; < 0: none (-errno) */
    u16 func;           /* id in gputrace.record.hooks.CUDA_FUNCS */
    u8 valid;           /* GT_CV_* bits */
    u8 _pad0;
    s32 py_stack_id;    /* Python stack in cuda_py_stacks; < 0: none (-errno, -1: not Python) */
    char comm[16];
};

/* Why the probe stopped a traced process (SIGSTOP) until the recorder acts. */
#define GT_PAUSE_LOAD 1   /* opened a libcuda.so* file: attach uprobes to it */
#define GT_PAUSE_FIRST 2  /* its first API call: read its maps for stacks */
#define GT_PAUSE_PY 4     /* a Python stack not seen before: its code objects are read
                           * while the process is stopped, before it can exit */

/* Value of the `cuda_paused` map (key: tgid). */
struct cuda_pause {
    u64 ts_ns;
    u32 kinds;          /* GT_PAUSE_* bits */
    s32 fd;             /* fd of the libcuda file (GT_PAUSE_LOAD), else -1 */
    u32 stopped;        /* 1 when SIGSTOP was sent (the recorder sends SIGCONT) */
    u32 _pad0;
    u64 stop_boot_ns;   /* CLOCK_BOOTTIME of the stop: a pid whose process started
                         * later was reused, and is never sent SIGCONT */
};

/* A CPython process whose Python frames the API probe walks (the `cuda_py_procs`
 * map, key: tgid), filled by gputrace/record/python_stacks from the interpreter's
 * symbols and its version's layout. Offsets are in bytes; 0xffff: no such field. */
struct py_proc {
    u64 interp_head;    /* address of _PyRuntime.interpreters.head */
    u64 page_mask;      /* ~4095: frames lie in a data stack (3.11+), a page is read at
                         * once; ~0: each frame is read alone (3.10's heap frames) */
    u16 interp_next;    /* PyInterpreterState.next */
    u16 interp_threads; /* PyInterpreterState.threads.head (3.10: tstate_head) */
    u16 ts_next;        /* PyThreadState.next */
    u16 ts_tid;         /* PyThreadState.native_thread_id (3.10: thread_id, a pthread_t) */
    u16 ts_frame;       /* PyThreadState.cframe (3.11, 3.12), current_frame (3.13+), frame (3.10) */
    u16 ts_size;        /* bytes of PyThreadState read: past every field above */
    u16 cframe_frame;   /* _PyCFrame.current_frame; 0xffff: ts_frame is the frame */
    u16 pthread_tid;    /* 0: ts_tid is the kernel tid; else where glibc's struct pthread keeps it */
    u16 fr_code;        /* frame's code object (f_code, f_executable) */
    u16 fr_prev;        /* the caller's frame (previous, f_back) */
    u16 fr_instr;       /* last instruction (prev_instr, instr_ptr, f_lasti) */
    u16 fr_entry;       /* 3.11 is_entry (else any byte: entry_mask is 0) */
    u16 fr_owner;       /* owner (else any byte: shim_owner matches no byte) */
    u16 fr_size;        /* bytes of a frame read: past every field above */
    /* How a frame says it is the first of its _PyEval_EvalFrameDefault call, as
     * numbers rather than a kind (no branch in the walk for the verifier to follow):
     * entry = entry_all | (byte at fr_entry & entry_mask) != 0 (3.10: every frame,
     * entry_all 1; 3.11: is_entry, entry_mask 0xff); 3.12+: the frame below it is
     * owned by the C stack (byte at fr_owner == shim_owner, 3; 0x100 otherwise). */
    u16 shim_owner;
    u8 entry_all;
    u8 entry_mask;
};

/* Settings of the API program (the `cuda_config` array). */
struct cuda_config {
    u32 self_tgid;
    u32 filter;         /* 0 = whole host, 1 = only tgids in `cuda_targets` */
    u32 pause;          /* 1 = stop processes at libcuda load and first call */
    u32 comm_cache;     /* 1 = threads keep their name (cuda_task_rename attached) */
};

/* ---------------------------------------------------------------------------
 * CPU page faults on managed memory: exceptions:page_fault_user,
 * probes/nv_faults.bpf.h, decoded by gputrace/record/cpu_faults/managed_ranges.py.
 */

/* One user page fault inside a managed range (56 bytes). */
struct fault_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC when the fault was taken */
    u64 address;        /* faulting virtual address (exact byte) */
    u64 ip;             /* user instruction pointer */
    u32 pid;            /* tgid */
    u32 tid;
    u32 error_code;     /* x86 page-fault error code: bit 0 present, bit 1 write */
    u32 _pad0;
    char comm[16];
};

/* Per-CPU staging: many faults per ring-buffer record. */
#ifndef GT_FAULT_STAGE
#define GT_FAULT_STAGE 64
#endif
struct fault_batch {
    u32 count;
    u32 _pad0;
    struct fault_event ev[GT_FAULT_STAGE];
};

/* Managed ranges, one entry per (process, 2 MiB block): a bit per 4 KiB page. */
struct mblock_key {
    u32 tgid;
    u32 gen;            /* the process's generation (managed_procs): exec/exit retire it */
    u64 block;          /* address >> 21 */
};
struct mblock {
    u64 bits[8];        /* bit p: page p of the block is in a managed range */
};
/* Ranges longer than GT_SMALL_BLOCKS blocks are kept whole, per process. */
#ifndef GT_BIG_RANGES
#define GT_BIG_RANGES 16
#endif
struct managed_proc {
    u32 gen;
    u32 nblocks;        /* managed_blocks entries (approximate; 0 = none) */
    u64 big_start[GT_BIG_RANGES]; /* [start, end); end 0 = free slot */
    u64 big_end[GT_BIG_RANGES];
};
/* fault_stats slots */
#define GT_FS_BLOCKS_OVERFLOW 0 /* 2 MiB blocks not tracked or not cleared (map full, cap) */
#define GT_FS_RANGES_OVERFLOW 1 /* big ranges or processes not tracked (slots or map full) */
#define GT_FS_N 2

#endif
