/* gputrace API layer, part of cuda.bpf.c (inlined by gputrace/record/api/libcuda.py):
 * the state the calls (cuda.bpf.c) and the library loads and fork/exit
 * following (cuda_load.bpf.h) share: ring buffer and stack sizes, the
 * per-thread pending call, the layer's maps, and (cuda_shared.bpf.h, which the
 * syscall layer's tp_btf dispatcher shares) the helpers that say whether a
 * process is traced and that pause it for the recorder.
 */
#ifndef GT_CUDA_RB_PAGES
#define GT_CUDA_RB_PAGES 1024
#endif
#ifndef GT_CUDA_STACKS
#define GT_CUDA_STACKS 16384
#endif
/* cuda_config, cuda_targets, cuda_paused and their helpers */
#include "cuda_shared.bpf.h"
#include "comm_cache.bpf.h"

struct cuda_pending {
    u64 ts_ns, out, pitch_out, height;
    u64 size, ptr, handle, flags, stream;
    u16 func;
    u8 shape, valid, active;
    u8 known;           /* KNOWN_*: what this thread's earlier calls found out */
    u8 _pad[2];
    u32 gen;            /* cuda_gen when `known` was set */
    u32 _pad1;
    struct gt_comm comm; /* the thread's name (comm_cache.bpf.h) */
};
/* A thread remembers that its process is traced and already seen, so its later
 * calls skip the cuda_targets and cuda_seen lookups. Both maps only lose a tgid
 * when its leader exits, which bumps cuda_gen: remembered facts of an older
 * generation are looked up again. */
#define KNOWN_WANTED 1
#define KNOWN_SEEN 2
struct cuda_open {
    u8 hit;
};
struct cuda_path {
    char s[GT_PATH_MAX];
};

BPF_RINGBUF_OUTPUT(cuda_events, GT_CUDA_RB_PAGES);
/* CUDA_ERROR_OUT_OF_MEMORY of a device allocation, sent at once with a wakeup to the
 * recorder's incident thread (struct oom_event: status = the CUresult, nr = the
 * function id, device 0, gpu_index -1). */
BPF_RINGBUF_OUTPUT(cuda_oom_events, 1);
#define GT_CUDA_ERROR_OUT_OF_MEMORY 2
BPF_PERCPU_ARRAY(cuda_drops, u64, 1);
/* The user stack of an allocation, at most GT_CUDA_STACK_DEPTH frames
 * (`record --stack-depth`, 1..127), walked by cuda_stack_id() in cuda.bpf.c.
 * Each distinct stack is stored once in `cuda_stacks`; its key is its id: a
 * 31-bit hash of its frames, or one of the GT_CUDA_STACK_PROBES - 1 keys after
 * it when another stack holds that one (frames are compared, never only the
 * hash). The walk is built in a per-thread buffer (a per-CPU one could be
 * shared by two threads: uprobe programs run preemptible). */
#ifndef GT_CUDA_STACK_DEPTH
#define GT_CUDA_STACK_DEPTH 127
#endif
/* How far above the user sp a frame record may lie: the default stack limit
 * (8 MiB); a frame pointer beyond it is not followed. */
#ifndef GT_CUDA_STACK_SPAN
#define GT_CUDA_STACK_SPAN (8ULL << 20)
#endif
#define GT_CUDA_STACK_PROBES 4
struct cuda_stack {
    u32 n;              /* frames in ip[] */
    u32 _pad;
    u64 ip[GT_CUDA_STACK_DEPTH];
};
/* The stack is read in chunks, never past the end of the page the chunk starts
 * in: one user read serves every frame record that lies in it. A walk's first
 * read copies at most GT_CUDA_STACK_FIRST words (a shallow stack's records lie
 * within it), the next ones up to GT_CUDA_STACK_CHUNK (a page: a deep stack of
 * big frames costs a read per page). */
#define GT_CUDA_STACK_CHUNK 512
#define GT_CUDA_STACK_FIRST 64  /* words of a walk's first read */
struct cuda_stack_walk {
    struct cuda_stack s;
    u64 base, end;      /* the user bytes chunk[] holds: [base, end) */
    u64 fp_ip[GT_CUDA_STACK_DEPTH]; /* the frame-pointer walk's frames, before they join s */
    u64 top_h;          /* the hash of the frames unwound by tables (cuda_unwind.bpf.h) */
    u32 top_n;          /* frames in s after them */
    u32 fp_m;           /* frames in fp_ip, after the frame-pointer walk */
    u64 fp, low;        /* the frame-pointer walk's next record and lowest address */
    u64 out_v, pitch_v; /* the out words the first chunk held, and which (have) */
    u32 have, _pad2;
    u64 chunk[GT_CUDA_STACK_CHUNK];
};
BPF_HASH(cuda_stacks, u32, struct cuda_stack, GT_CUDA_STACKS);
BPF_TASK_STORAGE(cuda_stack_scratch, struct cuda_stack_walk);
BPF_TASK_STORAGE(cuda_pending, struct cuda_pending);
BPF_HASH(cuda_seen, u32, u8, 65536);             /* tgids that made an API call */
BPF_HASH(cuda_opens, u32, struct cuda_open, 4096); /* tid -> openat of libcuda pending */
BPF_PERCPU_ARRAY(cuda_path_scratch, struct cuda_path, 1);
BPF_ARRAY(cuda_gen, u32, 1);

static __always_inline u32 cuda_generation(void)
{
    u32 zero = 0;
    u32 *g = cuda_gen.lookup(&zero);
    return g ? *g : 0;
}
