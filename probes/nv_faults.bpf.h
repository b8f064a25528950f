/* CPU page faults on managed memory: exceptions:page_fault_user.
 *
 * Managed ranges are mmaps of a tracked nvidia-uvm fd whose offset equals the
 * returned address (how libcuda maps managed memory). Each process's ranges
 * are kept as one `managed_blocks` entry per 2 MiB block holding a bit per
 * 4 KiB page, so the filter is two hash lookups and a bit test: a fault of
 * any other process costs one array load (`known_tgids`), and faults outside
 * the ranges never reach the ring buffer.
 *
 * nv_lifecycle.bpf.h keeps the ranges current: added at sys_exit_mmap,
 * cleared by munmap (whole or partial) and by MAP_FIXED mmaps over them,
 * retired at exec and exit by deleting the process's `managed_procs` entry
 * (its generation): stale blocks can no longer match and user space deletes
 * them (loader.Probes.forget_managed). One mmap adds or clears at most
 * GT_MANAGED_MAX_BLOCKS interior blocks (16 GiB); blocks beyond that, and
 * inserts into a full map, are counted in fault_stats[GT_FS_BLOCKS_OVERFLOW].
 * Faults are staged per CPU and flushed by the recorder's GT_FLUSH_CMD ioctl.
 */
#include "common.bpf.h"
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

/* exceptions:page_fault_user (x86-64: address, ip, error_code); attached in
 * syscall_hooks.bpf.h. */
static __always_inline int fault_user(u64 addr, u64 ip, u64 error_code)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, zero = 0;
    if (!maybe_known(tgid))
        return 0;
    struct managed_proc *mp = managed_procs.lookup(&tgid);
    if (!mp)
        return 0;
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
    e->ip = ip;
    e->pid = tgid, e->tid = (u32)id;
    e->error_code = (u32)error_code;
    e->_pad0 = 0;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    st->count = n + 1;
    if (n + 1 >= GT_FAULT_STAGE)
        fault_submit(st);
    return 0;
}
