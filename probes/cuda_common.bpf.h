/* gputrace API layer, part of cuda.bpf.c (inlined by gputrace/record/cuda.py):
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

struct cuda_pending {
    u64 ts_ns, out, pitch_out, height;
    u64 size, ptr, handle, flags, stream;
    u16 func;
    u8 shape, valid, active;
    u8 known;           /* KNOWN_*: what this thread's earlier calls found out */
    u8 _pad[2];
    u32 gen;            /* cuda_gen when `known` was set */
    u32 _pad1;
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
BPF_PERCPU_ARRAY(cuda_drops, u64, 1);
/* The user stack of an allocation, at most GT_CUDA_STACK_DEPTH frames: the
 * value size is what bounds bpf_get_stackid's frame-pointer walk (each frame
 * costs a user read; `record --stack-depth` sets it, 1..127). */
#ifndef GT_CUDA_STACK_DEPTH
#define GT_CUDA_STACK_DEPTH 127
#endif
struct cuda_stack {
    u64 ip[GT_CUDA_STACK_DEPTH];
};
BPF_TABLE("stacktrace", int, struct cuda_stack, cuda_stacks, GT_CUDA_STACKS);
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
