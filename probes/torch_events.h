/* The torch_allocator layer's event (probes/torch_allocator.bpf.c), shared with
 * gputrace/record/torch_allocator/decode.py (TORCH_DTYPE; the struct test compiles
 * this header and compares). Naturally aligned, holes are explicit _pad fields.
 */
#ifndef GPUTRACE_TORCH_EVENTS_H
#define GPUTRACE_TORCH_EVENTS_H

#ifdef GT_USERSPACE /* host compilers (the struct test); bcc has the kernel types */
#include <stdint.h>
typedef uint8_t u8;
typedef int16_t s16;
typedef int32_t s32;
typedef uint32_t u32;
typedef uint64_t u64;
#endif

/* torch_event.kind */
#define GT_TORCH_ALLOC 0     /* malloc returned: ptr, requested size, device, stream */
#define GT_TORCH_FREE 1      /* free(ptr) entered */
#define GT_TORCH_SEG_ALLOC 2 /* cuMemAlloc_v2 inside malloc returned ptr (result 0) */
#define GT_TORCH_SEG_FREE 3  /* cuMemFree_v2(ptr) inside a malloc, free or emptyCache */
#define GT_TORCH_OOM 4       /* a malloc whose cuMemAlloc_v2 failed out of memory never
                              * returned (it threw): seen at the thread's next call */
#define GT_TORCH_SEG_FAIL 5  /* a segment call inside malloc (cuMemAlloc_v2, cuMemCreate,
                              * cuMemAllocAsync) failed out of memory: the malloc's
                              * facts, an oom unless that malloc still returns */
#define GT_TORCH_SEG_MAP 6   /* cuMemMap(ptr, size) inside malloc returned 0: a page of an
                              * expandable segment */
#define GT_TORCH_SEG_UNMAP 7 /* cuMemUnmap(ptr, size) in a process that called malloc */
#define GT_TORCH_RELEASE 8   /* a tensor given back after its free: the async backend's
                              * cuMemFreeAsync(ptr) in a process that called malloc, or
                              * free_block of a block whose free was deferred */
#define GT_TORCH_DEFER 9     /* insert_events inside the native free of ptr: given back
                              * once the other streams' events complete (release) */

struct torch_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC: the call's entry (the segment call's for segments;
                         * oom, seg_fail: when the failed segment call returned) */
    u64 latency_ns;     /* malloc: entry to return; else 0 */
    u64 ptr;            /* tensor (alloc, free, release) or segment (seg_*) address;
                         * 0 for oom */
    u64 size_bytes;     /* requested (alloc, oom), segment or page size (seg_alloc,
                         * seg_map, seg_unmap); 0 else */
    u64 stream;         /* cudaStream_t of the malloc (alloc, oom, seg_alloc) */
    u64 request_bytes;  /* the malloc's requested size (alloc, oom, seg_alloc); 0 else */
    u32 pid;
    u32 tid;
    s32 stack_id;       /* native stack (cuda_stacks), -1 when none */
    s32 py_stack_id;    /* Python stack (cuda_py_stacks), -1 when none */
    s32 result;         /* alloc, free: the backend (0 native, 1 cudaMallocAsync);
                         * seg_alloc, seg_fail: the CUresult; else 0 */
    s16 device;         /* CUDA device index of the malloc; -1 when not known */
    u8 kind;            /* GT_TORCH_* */
    u8 _pad;
};

#endif /* GPUTRACE_TORCH_EVENTS_H */
