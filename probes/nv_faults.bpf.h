/* CPU page faults on managed memory (issue 6): exceptions:page_fault_user.
 *
 * Managed ranges are mmaps of a tracked nvidia-uvm fd whose offset equals the
 * returned address (how libcuda maps managed memory). Each process's ranges
 * are kept as one `managed_blocks` entry per 2 MiB block holding a bit per
 * 4 KiB page, so the filter is two hash lookups and a bit test: a fault of
 * any other process costs one miss in `managed_procs`, and faults outside the
 * ranges never reach the ring buffer.
 *
 * nv_lifecycle.bpf.h keeps the ranges current: added at sys_exit_mmap,
 * cleared by munmap (whole or partial) and by MAP_FIXED mmaps over them,
 * retired at exec and exit by deleting the process's `managed_procs` entry
 * (its generation): stale blocks can no longer match and user space deletes
 * them (loader.Probes.forget_managed). One mmap adds or clears at most
 * GT_MANAGED_MAX_BLOCKS interior blocks (16 GiB); blocks beyond that, and
 * inserts into a full map, are counted in fault_stats[GT_FS_BLOCKS_OVERFLOW].
 * Faults are staged per CPU and flushed by the recorder's GT_FLUSH_CMD ioctl.
 * Included by syscalls.bpf.c after its maps, before nv_ioctl.bpf.h.
 */
#ifndef GT_SMALL_BLOCKS
#define GT_SMALL_BLOCKS 512 /* ranges up to 1 GiB: per block; longer ones: big ranges */
#endif
#ifndef GT_MANAGED_BLOCKS
#define GT_MANAGED_BLOCKS 131072 /* map capacity: 256 GiB of managed ranges */
#endif
#ifndef GT_FAULT_RB_PAGES
#define GT_FAULT_RB_PAGES 4096
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

#include "nv_managed.bpf.h"

static __always_inline void fault_submit(struct fault_batch *st)
{
    u32 n = st->count;
    if (n == 0)
        return;
    if (n > GT_FAULT_STAGE)
        n = GT_FAULT_STAGE;
    u64 size = 8 + (u64)n * sizeof(struct fault_event);
    if (fault_events.ringbuf_output(st, size, BPF_RB_NO_WAKEUP) != 0)
        count_drop(GT_BUF_FAULT, n);
    st->count = 0;
}

/* The recorder's flush ioctl (nv_ioctl.bpf.h): submit this CPU's partial batch. */
static __always_inline void faults_flush(void)
{
    u32 zero = 0;
    struct fault_batch *st = fault_staging.lookup(&zero);
    if (st)
        fault_submit(st);
}

#ifdef GT_HAVE_PAGE_FAULT_USER /* x86-64: address, ip, error_code */
TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, zero = 0;
    struct managed_proc *mp = managed_procs.lookup(&tgid);
    if (!mp)
        return 0;
    u64 addr = args->address;
    struct mblock_key k = {.tgid = tgid, .gen = mp->gen, .block = addr >> 21};
    struct mblock *b = managed_blocks.lookup(&k);
    u32 page = (addr >> 12) & 511;
    int hit = b && ((b->bits[(page >> 6) & 7] >> (page & 63)) & 1);
#pragma unroll
    for (u32 i = 0; i < GT_BIG_RANGES; i++)
        hit |= addr >= mp->big_start[i] && addr < mp->big_end[i];
    if (!hit)
        return 0;
    struct fault_batch *st = fault_staging.lookup(&zero);
    if (!st)
        return 0;
    u32 n = st->count;
    if (n >= GT_FAULT_STAGE) {
        count_drop(GT_BUF_FAULT, 1);
        return 0;
    }
    struct fault_event *e = &st->ev[n];
    e->ts_ns = bpf_ktime_get_ns();
    e->address = addr;
    e->ip = args->ip;
    e->pid = tgid, e->tid = (u32)id;
    e->error_code = (u32)args->error_code;
    e->_pad0 = 0;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    st->count = n + 1;
    if (n + 1 >= GT_FAULT_STAGE)
        fault_submit(st);
    return 0;
}
#endif
