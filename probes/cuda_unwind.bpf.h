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
 * cuda_stack_id() looks each return address up here; one in no such mapping
 * is walked by its frame pointer, as before.
 */
#ifndef GT_UNWIND_ROWS
#define GT_UNWIND_ROWS (1 << 18)  /* rows of all tables together: 2 MiB */
#endif
#define GT_UNWIND_MAPS 8          /* mappings with a table per process */
#define GT_UNWIND_SEARCH 16       /* binary-search steps: a table has at most 65536 rows */
#ifndef GT_UNWIND_FRAMES
#define GT_UNWIND_FRAMES 8        /* frames unwound by tables at the top of a stack */
#endif
#define GT_UNWIND_STOP 0
#define GT_UNWIND_CFA_RSP 1
#define GT_UNWIND_CFA_RBP 2

struct unwind_row {
    u32 pc;             /* link-time address where the row starts */
    u16 cfa;            /* CFA = the kind's register + cfa */
    u8 kind;            /* GT_UNWIND_* */
    u8 rbp;             /* %rbp saved at CFA - 8 * rbp; 0: unchanged */
};
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
BPF_ARRAY(unwind_rows, struct unwind_row, GT_UNWIND_ROWS);
BPF_HASH(unwind_procs, u32, struct unwind_proc, 4096);

#define unwind_opaque(x) asm volatile("" : "+r"(x))

/* The row that covers return address `ip` of a process with tables: 1 and
 * *row set; 0 when ip lies in no mapping with a table (walk it by %rbp); -1
 * when it lies in one but no row covers it (the walk stops). The address
 * looked up is ip - 1, the call instruction: a call that ends a function
 * returns to the first byte of the next. */
static __always_inline int unwind_find(struct unwind_proc *u, u64 ip, struct unwind_row *row)
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
        u32 key = base + probe * inside;    /* row 0 of the table when outside */
        struct unwind_row *r = unwind_rows.lookup(&key);
        if (!r)
            return -1;
        u64 rpc = r->pc;
        unwind_opaque(rpc);
        u64 le = 1 - ((pc - rpc) >> 63);  /* r->pc <= pc */
        lo += (inside & le) << s;
    }
    u32 key = base + lo;
    struct unwind_row *r = unwind_rows.lookup(&key);
    if (!r || r->pc > pc)
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

struct unwind_regs {
    u64 ip, sp, fp;     /* the frame's return address, its CFA-to-be base and %rbp */
    u64 top;            /* no CFA at or above this (the stack span) */
    u64 h;              /* the stack's hash so far (cuda_mix) */
    u32 stop;           /* 1: a frame in a table that cannot be unwound */
};

/* Unwind frames by their tables while their return addresses lie in mappings
 * with one, at most GT_UNWIND_FRAMES; stores each caller's return address in
 * the walk's stack from ip[1]. Returns the frames in ip[] (1 + those found);
 * `r` is left at the first frame outside the tables (its %rbp, and its CFA
 * base as sp: where the frame-pointer walk goes on from) or `stop` is set. */
static __always_inline u32 unwind_top_frames(struct cuda_stack_walk *w, struct unwind_proc *u,
                                             struct unwind_regs *r)
{
    u32 n = 1;
    for (u32 i = 1; i <= GT_UNWIND_FRAMES && i < GT_CUDA_STACK_DEPTH; i++) {
        struct unwind_row row = {};
        int t = unwind_find(u, r->ip, &row);
        if (t == 0)
            break;
        if (t < 0 || row.kind == GT_UNWIND_STOP) {
            r->stop = 1;
            break;
        }
        u64 cfa = (row.kind == GT_UNWIND_CFA_RSP ? r->sp : r->fp) + row.cfa;
        /* the return address and the saved %rbp lie below the CFA, in this
         * frame: [from, cfa) is read at once */
        u64 from = cfa - 8 * (row.rbp > 1 ? row.rbp : 1);
        if ((cfa & 7) || from < r->sp || cfa >= r->top || !unwind_cover(w, from, cfa)) {
            r->stop = 1;
            break;
        }
        u64 ret = w->chunk[((cfa - 8 - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        if (row.rbp)
            r->fp = w->chunk[((from - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        r->sp = cfa;
        r->ip = ret;
        w->s.ip[i] = ret;
        r->h = cuda_mix(r->h, ret);
        n = i + 1;
    }
    return n;
}

/* ------------------------------------------------ the whole stack by tables
 * PyTorch's libraries and libcudart sit below Python's frames and between
 * frame-pointer code, anywhere in a stack: each frame is unwound by its
 * table's row when its return address lies in a library with one, else by its
 * frame pointer, to the stack's depth limit. That is more frames than one
 * program may verify (each table frame is ~80k instructions to the verifier),
 * so the walk runs in a tail-called program, GT_UNWIND_STEP frames a call,
 * its state in `unwind_walks`; the last step tail-calls the uretprobe again,
 * which finds the walk done for its call and stores the stack as usual.
 * bpf_loop would do it in one program, but this bcc does not relocate the
 * callback's address. Tail calls: 1 to start, one per step, 1 back, at most
 * 2 + GT_CUDA_STACK_DEPTH / GT_UNWIND_STEP (the kernel allows 33). Without the
 * step program (not loaded) the top-frames walk above runs as before. */
#ifndef GT_UNWIND_STEP
#define GT_UNWIND_STEP 8          /* frames per tail-called step */
#endif
#define GT_UNWIND_TAIL_STEP 0
#define GT_UNWIND_TAIL_BACK 1     /* uretprobe_cuda */
#define GT_UNWIND_WALKING 1
#define GT_UNWIND_DONE 2

struct unwind_walk {
    u64 ip, sp, fp;     /* the frame to unwind next: its return address, CFA base, %rbp */
    u64 top;            /* no CFA or frame record at or above this */
    u64 h;              /* the stack's hash so far (cuda_mix) */
    u64 call;           /* the call walked: its entry time (cuda_pending.ts_ns) */
    u32 n;              /* frames in the walk's stack so far */
    u32 state;          /* 0, GT_UNWIND_WALKING or GT_UNWIND_DONE */
};
BPF_TASK_STORAGE(unwind_walks, struct unwind_walk);
BPF_PROG_ARRAY(unwind_tails, 2);

/* One frame: its caller's return address to the walk's stack, by the frame's
 * row where its table has one, else by its frame pointer. 1 when the walk ends
 * (no caller found, a STOP row, the depth limit), 0 to go on. */
static __always_inline int unwind_frame(struct cuda_stack_walk *w, struct unwind_proc *u,
                                        struct unwind_walk *d)
{
    u32 n = d->n;
    if (n >= GT_CUDA_STACK_DEPTH)
        return 1;
    u64 sp = d->sp, fp = d->fp, ret;
    struct unwind_row row = {};
    int t = unwind_find(u, d->ip, &row);
    if (t < 0 || (t > 0 && row.kind == GT_UNWIND_STOP))
        return 1;
    if (t > 0) {
        u64 cfa = (row.kind == GT_UNWIND_CFA_RSP ? sp : fp) + row.cfa;
        u64 from = cfa - 8 * (row.rbp > 1 ? row.rbp : 1);
        if ((cfa & 7) || from < sp || cfa >= d->top || !unwind_cover(w, from, cfa))
            return 1;
        ret = w->chunk[((cfa - 8 - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        if (row.rbp)
            fp = w->chunk[((from - w->base) >> 3) & (GT_CUDA_STACK_CHUNK - 1)];
        sp = cfa;
    } else {
        /* as cuda_stack_id's walk: a record above the last, below the span */
        if ((fp & 7) || fp < sp || fp >= d->top || !unwind_cover(w, fp, fp + 16))
            return 1;
        u64 off = (fp - w->base) >> 3;
        ret = w->chunk[(off + 1) & (GT_CUDA_STACK_CHUNK - 1)];
        sp = fp + 16;
        fp = w->chunk[off & (GT_CUDA_STACK_CHUNK - 1)];
    }
    /* masked: the verifier then bounds the index inside the map value (n is
     * below GT_CUDA_STACK_DEPTH <= 127 already) */
    w->s.ip[n & 0x7f] = ret;
    d->ip = ret, d->sp = sp, d->fp = fp;
    d->h = cuda_mix(d->h, ret);
    d->n = n + 1;
    return 0;
}

/* At the uretprobe of a call that takes a stack, in a process with tables:
 * start the walk and tail-call its first step (no return when it is there).
 * Returns at once when this call's walk is done. */
static __always_inline void unwind_start(struct pt_regs *ctx, void *task, u64 call)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!unwind_procs.lookup(&tgid))
        return;
    struct unwind_walk *d = unwind_walks.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    struct cuda_stack_walk *w = cuda_stack_scratch.task_storage_get(
        task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!d || !w || (d->state == GT_UNWIND_DONE && d->call == call))
        return;
    u64 sp = PT_REGS_SP(ctx), ip = PT_REGS_IP(ctx);
    d->ip = ip, d->sp = sp, d->fp = PT_REGS_FP(ctx);
    d->top = sp + GT_CUDA_STACK_SPAN;
    d->h = cuda_mix(0, ip);
    d->call = call;
    d->n = 1;
    d->state = GT_UNWIND_WALKING;
    w->s.ip[0] = ip;
    w->base = w->end = 0;
    unwind_tails.call(ctx, GT_UNWIND_TAIL_STEP);
    d->state = 0;  /* no step program: cuda_stack_id walks as before */
}

/* The walk's frames for `call` when its step program did them: 1, with the
 * stack in w->s, *n and *h set (and the walk marked taken). */
static __always_inline int unwind_take(void *task, u64 call, u32 *n, u64 *h)
{
    struct unwind_walk *d = unwind_walks.task_storage_get(task, 0, 0);
    if (!d || d->state != GT_UNWIND_DONE || d->call != call)
        return 0;
    d->state = 0;
    *n = d->n;
    *h = d->h;
    return 1;
}

/* GT_UNWIND_STEP frames of the walk, then the next step or, once it has
 * ended, uretprobe_cuda again. */
int unwind_step(struct pt_regs *ctx)
{
    void *task = (void *)bpf_get_current_task_btf();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct unwind_walk *d = unwind_walks.task_storage_get(task, 0, 0);
    struct cuda_stack_walk *w = cuda_stack_scratch.task_storage_get(task, 0, 0);
    struct unwind_proc *u = unwind_procs.lookup(&tgid);
    if (!d || !w || d->state != GT_UNWIND_WALKING)
        return 0;
    u32 next = GT_UNWIND_TAIL_BACK;
    if (u) {
        for (u32 k = 0; k < GT_UNWIND_STEP; k++) {
            if (unwind_frame(w, u, d)) {
                d->state = GT_UNWIND_DONE;
                break;
            }
        }
        if (d->state == GT_UNWIND_WALKING)
            next = GT_UNWIND_TAIL_STEP;
    }
    if (next == GT_UNWIND_TAIL_BACK)
        d->state = GT_UNWIND_DONE;
    unwind_tails.call(ctx, next);
    d->state = 0;
    return 0;
}
