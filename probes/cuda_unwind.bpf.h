/* gputrace API layer, part of cuda.bpf.c: the native unwinder's tables.
 *
 * Libraries built without frame pointers (PyTorch's wheels, libcudart) leave
 * no %rbp chain to walk. For each such library mapped by a traced process the
 * recorder (gputrace/record/unwind/) compiles its .eh_frame into rows, sorted
 * by address, each saying how to find the caller of a frame stopped there:
 * CFA = rsp + cfa or rbp + cfa, the return address at CFA - 8, the caller's
 * %rbp saved at CFA - 8 * rbp (0: %rbp unchanged). A STOP row ends the walk
 * (rules the rows cannot say, gaps between functions): no frame is guessed.
 * A library's rows are stored once in `unwind_rows` whatever the processes
 * mapping it; `unwind_procs` lists, per process, the mappings with a table.
 * unwind_stack() looks each frame's return address up here, all the way up
 * the stack; one in no such mapping is walked by its frame pointer.
 */
#ifndef GT_UNWIND_ROWS
#define GT_UNWIND_ROWS (1 << 18)  /* rows of all tables together: 2 MiB */
#endif
#define GT_UNWIND_MAPS 8          /* mappings with a table per process */
#define GT_UNWIND_SEARCH 16       /* binary-search steps: a table has at most 65536 rows */
#ifndef GT_UNWIND_FRAMES
#define GT_UNWIND_FRAMES 40       /* frames walked by unwind_stack; frame pointers beyond */
#endif
#define GT_UNWIND_STOP 0
#define GT_UNWIND_CFA_RSP 1
#define GT_UNWIND_CFA_RBP 2

/* struct unwind_row: in cuda_common.bpf.h (the walk keeps one in its map value) */
struct unwind_map {
    u64 start, end;     /* the executable mapping [start, end) */
    u64 bias;           /* address - bias = link-time address */
    u32 row, rows;      /* its table: unwind_rows[row, row + rows) */
};
struct unwind_proc {
    u32 n;              /* entries of m[] in use */
    u32 _pad;
    u64 lo, hi;         /* the span of m[]: most addresses are rejected by it */
    struct unwind_map m[GT_UNWIND_MAPS];
};
/* All rows in ONE map value (an array map's value may be up to 4 MiB): the
 * walk looks it up once, and a search step indexes it without a lookup whose
 * NULL check the verifier would follow at every step of every frame. */
struct unwind_all_rows {
    struct unwind_row r[GT_UNWIND_ROWS];
};
BPF_ARRAY(unwind_rows, struct unwind_all_rows, 1);
BPF_HASH(unwind_procs, u32, struct unwind_proc, 4096);

#define unwind_opaque(x) asm volatile("" : "+r"(x))

/* The row that covers return address `ip` of a process with tables: 1 and
 * *row set; 0 when ip lies in no mapping with a table (walk it by %rbp); -1
 * when it lies in one but no row covers it (the walk stops). The address
 * looked up is ip - 1, the call instruction: a call that ends a function
 * returns to the first byte of the next. */
static __always_inline int unwind_find(struct unwind_proc *u, struct unwind_all_rows *all, u64 ip,
                                       struct unwind_row *row)
{
    if (ip < u->lo || ip >= u->hi)
        return 0;
    /* Written for the verifier: one path through, whatever the mapping and
     * the rows compared. A comparison is a branch in BPF, and the verifier
     * follows both sides with what each learnt (a frame's search would fork
     * its states thousands of times): the mapping's index is summed, each
     * search step adds its bit, from borrows of subtractions. */
    u64 found = 0;
    for (u32 k = 0; k < GT_UNWIND_MAPS; k++) {
        /* entries past u->n are zero: [0, 0) holds nothing */
        u64 off = ip - u->m[k].start, len = u->m[k].end - u->m[k].start;
        u64 in = ((~off & len) | (~(off ^ len) & (off - len))) >> 63;  /* off < len */
        found += in * (k + 1);
    }
    /* no branch on `found` itself (each value would be a path of its own):
     * the entry it names is checked instead (none found names the last) */
    unwind_opaque(found);
    struct unwind_map *m = &u->m[(found - 1) & (GT_UNWIND_MAPS - 1)];
    if (ip < m->start || ip >= m->end)
        return 0;
    u64 pc = ip - 1 - m->bias;
    u64 rows = m->rows, base = m->row;
    if (pc >> 32 || rows == 0 || rows > (1ULL << GT_UNWIND_SEARCH))
        return -1;
    /* opaque to the compiler, which would turn the borrows below back into
     * comparisons where it knows the values are small */
    unwind_opaque(pc);
    unwind_opaque(rows);
    /* the last row whose pc <= the address: lo grows by each power of two
     * that keeps it so, largest first */
    u64 lo = 0;
    for (int s = GT_UNWIND_SEARCH - 1; s >= 0; s--) {
        u64 probe = lo + (1ULL << s);
        u64 inside = (probe - rows) >> 63;  /* probe < rows (both < 2^32) */
        u64 key = base + probe * inside;    /* row 0 of the table when outside */
        u64 rpc = all->r[key & (GT_UNWIND_ROWS - 1)].pc;
        unwind_opaque(rpc);
        u64 le = 1 - ((pc - rpc) >> 63);  /* r->pc <= pc */
        lo += (inside & le) << s;
    }
    struct unwind_row *r = &all->r[(base + lo) & (GT_UNWIND_ROWS - 1)];
    if (r->pc > pc)
        return -1;
    *row = *r;
    return 1;
}

/* [from, to) of the user stack in the walk's chunk, read from `from` (to the
 * end of its page, or to `to` where that is further) when it is not there
 * yet. 0 when it cannot be read. */
static __always_inline int unwind_cover(struct cuda_stack_walk *w, u64 from, u64 to)
{
    if (from >= w->base && to <= w->end)
        return 1;
    u64 len = 4096 - (from & 4095);
    if (len > GT_CUDA_STACK_CHUNK * 8)
        len = GT_CUDA_STACK_CHUNK * 8;
    if (len < to - from)
        len = to - from;
    if (len > GT_CUDA_STACK_CHUNK * 8 || (from & 7))
        return 0;
    if (bpf_probe_read_user(w->chunk, len, (void *)from))
        return 0;
    w->base = from, w->end = from + len;
    return 1;
}

/* The whole user stack at a uretprobe, one frame at a time: the frame whose
 * return address lies in a mapping with a table is unwound by its row, any
 * other by its frame pointer, which is the row {CFA = rbp + 16, the return
 * address at CFA - 8, rbp saved at CFA - 16}: one step for both, so a library
 * without frame pointers anywhere in the stack (below Python's eval loop, in
 * the middle of libtorch) is crossed and the walk goes on by frame pointers
 * above it. Frame 0 is `ip` (the caller of the probed function), with the
 * caller's `sp` and `fp`. Stops before reading a frame that cannot be one: a
 * CFA not 8-byte aligned, a record below the frame before it or more than
 * GT_CUDA_STACK_SPAN above the sp (glibc's __libc_start_call_main keeps no
 * frame pointer: the walk that reaches main ends there), a frame in a table
 * with no usable row. At most GT_UNWIND_FRAMES frames (the caller walks on by
 * frame pointers from w->u_sp and w->u_fp past them). Stores the frames in
 * w->s.ip[] and their hash (cuda_mix) in w->top_h; returns how many.
 * Written for the verifier: it follows each of the GT_CUDA_STACK_DEPTH
 * iterations (a bounded loop is simulated, never summarized), so an
 * iteration is one path (the frame-pointer row is a row like the others, the
 * search branch-free: unwind_find) and the count and hash wait in the map
 * value, so that every exit reaches the code after the loop in one state. */
static __always_inline u32 unwind_stack(struct cuda_stack_walk *w, struct unwind_proc *u,
                                        struct unwind_all_rows *all, u64 ip, u64 sp, u64 fp)
{
    u64 top = sp + GT_CUDA_STACK_SPAN;
    u64 h = cuda_mix(0, ip);
    w->s.ip[0] = ip;
    w->top_n = 1;
    w->top_h = h;
    w->u_ip = ip, w->u_sp = sp, w->u_fp = fp;
    for (u32 i = 1; i < GT_UNWIND_FRAMES && i < GT_CUDA_STACK_DEPTH; i++) {
        /* the frame's registers, and below its row, are reloaded from the
         * map value: whichever way a step went, the next starts in one state */
        ip = *(volatile u64 *)&w->u_ip;
        /* no table for this frame: its frame pointer */
        struct unwind_row fp_row = {.kind = GT_UNWIND_CFA_RBP, .cfa = 16, .rbp = 2};
        w->u_row = fp_row;
        if (unwind_find(u, all, ip, &w->u_row) < 0)
            break;
        struct unwind_row row = *(volatile struct unwind_row *)&w->u_row;
        if (row.kind == GT_UNWIND_STOP)
            break;
        sp = *(volatile u64 *)&w->u_sp;
        fp = *(volatile u64 *)&w->u_fp;
        u64 cfa = (row.kind == GT_UNWIND_CFA_RSP ? sp : fp) + row.cfa;
        /* the return address and the saved %rbp lie below the CFA, in this
         * frame: [from, cfa) is read at once */
        u64 from = cfa - 8 * (row.rbp > 1 ? row.rbp : 1);
        if ((cfa & 7) || from < sp || from >= top || !unwind_cover(w, from, cfa))
            break;
        u64 ret = w->chunk[((cfa - 8 - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        if (row.rbp)
            w->u_fp = w->chunk[((cfa - 8 * row.rbp - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        w->u_sp = cfa;  /* the caller's sp, and above it the callers' frames */
        w->u_ip = ret;
        w->s.ip[i] = ret;
        w->top_h = cuda_mix(*(volatile u64 *)&w->top_h, ret);
        w->top_n = i + 1;
    }
    return *(volatile u32 *)&w->top_n;
}
