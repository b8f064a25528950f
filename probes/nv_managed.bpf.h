/* Managed ranges of traced processes, for the CPU page-fault filter of
 * nv_faults.bpf.h: page bitmaps per 2 MiB block for ranges of up to
 * GT_SMALL_BLOCKS blocks, whole [start, end) slots for longer ones; added,
 * cleared and retired from the mmap/munmap/exec/exit probes of
 * nv_lifecycle.bpf.h.
 */
#include "common.bpf.h"

static __always_inline void fault_stat(u32 slot, u64 n)
{
    u64 *s = fault_stats.lookup(&slot);
    if (s) *s += n;
}

/* Bits of pages first..last (0..511, inclusive) that fall in word w. */
static __always_inline u64 page_mask(u32 w, u32 first, u32 last)
{
    u32 lo = w * 64, hi = lo + 63;
    if (last < lo || first > hi)
        return 0;
    u32 a = first > lo ? first - lo : 0;
    u32 b = last < hi ? last - lo : 63;
    u64 m = b >= 63 ? ~0ULL : ((1ULL << ((b + 1) & 63)) - 1);
    return m & ~((1ULL << (a & 63)) - 1);
}

/* Set or clear the pages of [start, end) that lie in block k->block. */
static __always_inline void block_edit(struct managed_proc *mp, struct mblock_key *k, u64 start,
                                       u64 end, int set)
{
    u64 bs = k->block << 21, be = bs + (1ULL << 21);
    u64 s = start > bs ? start : bs, e = end < be ? end : be;
    if (s >= e)
        return;
    u32 first = (s - bs) >> 12, last = ((e - 1) - bs) >> 12;
    struct mblock *b = managed_blocks.lookup(k);
    if (!b) {
        if (!set)
            return;
        struct mblock nb = {};
#pragma unroll
        for (u32 w = 0; w < 8; w++)
            nb.bits[w] = page_mask(w, first, last);
        if (managed_blocks.update(k, &nb) != 0)
            fault_stat(GT_FS_BLOCKS_OVERFLOW, 1);
        else
            __sync_fetch_and_add(&mp->nblocks, 1);
        return;
    }
    u64 any = 0;
#pragma unroll
    for (u32 w = 0; w < 8; w++) {
        u64 m = page_mask(w, first, last);
        u64 v = set ? (b->bits[w] | m) : (b->bits[w] & ~m);
        b->bits[w] = v;
        any |= v;
    }
    if (!any && managed_blocks.delete(k) == 0)
        __sync_fetch_and_add(&mp->nblocks, -1);
}

/* Remove [s, e) from the big ranges: drop, trim, or split one in two. */
static __always_inline void big_clear(struct managed_proc *mp, u64 s, u64 e)
{
    u64 split_lo = 0, split_hi = 0;
#pragma unroll
    for (u32 i = 0; i < GT_BIG_RANGES; i++) {
        u64 lo = mp->big_start[i], hi = mp->big_end[i];
        if (hi == 0 || e <= lo || s >= hi)
            continue;
        if (s <= lo && e >= hi) {
            mp->big_end[i] = 0;
        } else if (s <= lo) {
            mp->big_start[i] = e;
        } else {
            mp->big_end[i] = s;
            if (e < hi)
                split_lo = e, split_hi = hi;
        }
    }
    if (split_hi == 0)
        return;
    /* Read the slots again: without this clang carries a flag per slot over from the
     * loop above, and the verifier walks every combination of them (~2^16 paths). */
    __asm__ __volatile__("" ::: "memory");
#pragma unroll
    for (u32 i = 0; i < GT_BIG_RANGES; i++) {
        if (mp->big_end[i] == 0) {
            mp->big_start[i] = split_lo;
            mp->big_end[i] = split_hi;
            return;
        }
    }
    fault_stat(GT_FS_RANGES_OVERFLOW, 1);
}

static __always_inline void big_add(struct managed_proc *mp, u64 s, u64 e)
{
#pragma unroll
    for (u32 i = 0; i < GT_BIG_RANGES; i++) {
        if (mp->big_end[i] == 0) {
            mp->big_start[i] = s;
            mp->big_end[i] = e;
            return;
        }
    }
    fault_stat(GT_FS_RANGES_OVERFLOW, 1);
}

/* Add (set) or remove the pages of [start, start+len) of a process. Ranges of
 * more than GT_SMALL_BLOCKS blocks are added as big ranges; a removal edits
 * both kinds, blocks for at most GT_SMALL_BLOCKS interior blocks. */
static __always_inline void managed_edit(struct managed_proc *mp, u32 tgid, u64 start, u64 len,
                                         int set)
{
    u64 end = (start + len + 4095) & ~4095ULL;
    start &= ~4095ULL;
    if (len == 0 || end <= start)
        return;
    u64 fb = start >> 21, lb = (end - 1) >> 21;
    if (set && lb - fb + 1 > GT_SMALL_BLOCKS) {
        big_add(mp, start, end);
        return;
    }
    if (!set) {
        big_clear(mp, start, end);
        if (mp->nblocks == 0)
            return;
    }
    /* Interior blocks first, edges last: the verifier walks the loop once. */
    struct mblock_key k = {.tgid = tgid, .gen = mp->gen};
    struct mblock full;
    __builtin_memset(&full, 0xff, sizeof(full));
    u64 inner = lb > fb + 1 ? lb - fb - 1 : 0, done = 0, fails = 0;
    for (u32 i = 0; i < GT_SMALL_BLOCKS; i++) {
        if (i >= inner)
            break;
        k.block = fb + 1 + i;
        /* no branches on results here: they would multiply the verifier's paths */
        long r = set ? managed_blocks.update(&k, &full) : managed_blocks.delete(&k);
        fails += (u64)r >> 63; /* helpers return 0 or -errno */
        done++;
    }
    /* nblocks counts entries approximately: inserts that replaced one also count */
    __sync_fetch_and_add(&mp->nblocks, set ? done - fails : fails - done);
    fault_stat(GT_FS_BLOCKS_OVERFLOW, (set ? fails : 0) + inner - done);
    k.block = fb;
    block_edit(mp, &k, start, end, set);
    if (lb != fb) {
        k.block = lb;
        block_edit(mp, &k, start, end, set);
    }
}

/* A managed mmap (uvm fd, offset == address) succeeded. */
static __always_inline void managed_add(u64 addr, u64 len)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32, zero = 0;
    struct managed_proc *mp = managed_procs.lookup(&tgid);
    if (!mp) {
        u32 *g = managed_gen.lookup(&zero);
        struct managed_proc *n = proc_scratch.lookup(&zero);
        if (!g || !n)
            return;
        /* Not atomic on purpose: a generation only has to differ from the
         * previous one of the same tgid, and the counter only moves forward. */
        __builtin_memset(n, 0, sizeof(*n));
        n->gen = (*g + 1) & GT_GEN_BPF_MASK;
        *g = n->gen;
        if (managed_procs.update(&tgid, n) != 0) {
            fault_stat(GT_FS_RANGES_OVERFLOW, 1);
            return;
        }
        mp = managed_procs.lookup(&tgid);
        if (!mp)
            return;
    }
    managed_edit(mp, tgid, addr, len, 1);
}

/* sys_enter_munmap, and sys_enter_mmap with MAP_FIXED (it replaces what was
 * there): remember the span, cleared at exit if the call succeeds. */
static __always_inline void managed_clear_enter(u64 addr, u64 len, u64 flags)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!(flags & GT_MAP_FIXED) || !managed_procs.lookup(&tgid))
        return;
    struct gt_span s = {.addr = addr, .len = len};
    pending_clears.update(&tid, &s);
}

/* sys_exit_mmap / sys_exit_munmap: clear the span when the call succeeded. */
static __always_inline void managed_clear_exit(long ret, int is_mmap)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct gt_span *sp = pending_clears.lookup(&tid);
    if (!sp)
        return;
    struct gt_span s = *sp;
    pending_clears.delete(&tid);
    if (is_mmap ? (ret < 0 && ret > -4096) : ret != 0)
        return;
    if (is_mmap)
        s.addr = (u64)ret;
    struct managed_proc *mp = managed_procs.lookup(&tgid);
    if (mp)
        managed_edit(mp, tgid, s.addr, s.len, 0);
}

/* sys_exit_mmap: clear what a MAP_FIXED mmap replaced, then add a managed range. */
static __always_inline void managed_mmap_exit(struct pending_mmap *pp, long ret)
{
    managed_clear_exit(ret, 1);
    if (pp && !(ret < 0 && ret > -4096) && pp->v.kind == GT_DEV_UVM && pp->offset == (u64)ret)
        managed_add((u64)ret, pp->length);
}

/* exec and exit: the address space is gone. */
static __always_inline void managed_forget(u32 tgid) { managed_procs.delete(&tgid); }

