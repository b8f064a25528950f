/* gputrace API layer, part of cuda.bpf.c: the Python stack of the thread that
 * made an allocation, read at the uretprobe from user memory only (the hosts
 * served refuse bpf_probe_read_kernel).
 *
 * The recorder fills `cuda_py_procs` (struct py_proc in gputrace_events.h) for
 * every traced process that runs CPython: where _PyRuntime's interpreter list
 * is and the offsets of its minor version (gputrace/record/python_stacks). The
 * walk finds the calling thread's PyThreadState by its kernel tid on the
 * interpreters' thread lists (remembered per thread, checked again at every
 * call: a thread state may be freed and its memory reused), then follows the
 * frames from the innermost one, keeping (code object, last instruction) per
 * frame. Code objects are named in user space (the recorder's drain); a stack
 * stored for the first time stops the process (cuda_stop_for: at the call's
 * return, at the torch_allocator layer's malloc entry; in filter mode,
 * GT_PAUSE_PY) until the recorder has read the code objects it names: a
 * program that exits, crashes or is killed right after its last allocation
 * still has its frames named.
 *
 * Bit 0 of a kept code address (code objects are aligned) says the frame is the
 * outermost one of its _PyEval_EvalFrameDefault call: user space merges each
 * run of frames with one native eval-loop frame.
 */
#ifndef GT_PY_DEPTH
#define GT_PY_DEPTH 64      /* Python frames kept per stack (a power of two) */
#endif
#ifndef GT_PY_STACKS
#define GT_PY_STACKS 8192
#endif
#define GT_PY_INTERPS 4     /* interpreters looked at */
#define GT_PY_THREADS 32    /* thread states looked at per interpreter */
#define GT_PY_BLOCK 512     /* the most bytes of a thread state or frame read */
/* 3.11+ frames lie one after the other in the thread's data stack, callers below:
 * one read from the start of a frame's page to its end serves every frame of that
 * page (a deep stack costs a read per page, not per frame). The first read too
 * takes the whole page below the innermost frame: each read costs about as much
 * as copying a few KiB (benchmarks/README.md, "Python frames"), so a shorter
 * first read that a second one must follow costs more. */
#define GT_PY_PAGE 4096
#define GT_PY_WINDOW 8192   /* the window's buffer: a page and a frame, rounded up */
#define GT_PY_NONE 0xffff
#define GT_PY_CSTACK 3      /* FRAME_OWNED_BY_CSTACK (3.12+) */

/* A load the compiler may not replace by the value it last stored: the walk's
 * state stays in the map value, where the verifier keeps no bounds of it, so the
 * paths through one turn of the loop meet again at the next (else they multiply). */
#define PY_LOAD(x) (*(volatile typeof(x) *)&(x))

struct py_stack {
    u32 n;              /* frames in code[] and instr[] */
    u32 _pad;
    u64 code[GT_PY_DEPTH];   /* PyCodeObject address | 1 when it began an eval-loop call */
    u64 instr[GT_PY_DEPTH];  /* last instruction: address (3.11+) or f_lasti (3.10) */
};
struct py_walk {
    struct py_stack s;
    u64 tstate;         /* this thread's PyThreadState when last found */
    u64 interp_head;    /* ... in the process whose _PyRuntime lay there */
    /* the walk's frame count and hash live here, not in registers: the verifier
     * then sees one state per turn, whatever the frames before were */
    u64 h;
    u32 n;
    u32 _pad;
    u64 wbase, wend;    /* the user bytes win[] holds: [wbase, wend) */
    u64 frame;          /* the next frame to read */
    s32 pending;        /* the stack id the call's entry found, for its return */
    u32 fresh;          /* 1: that stack was stored by this call (never seen before) */
    u8 buf[GT_PY_BLOCK];
    u8 win[GT_PY_WINDOW];
};
BPF_HASH(cuda_py_procs, u32, struct py_proc, 4096);
/* (pid << 32 | Python stack id) of each process stopped for a new Python stack,
 * with a wakeup: a thread of the recorder of its own (record/api/py_pauses.py)
 * reads that stack's code objects and continues the process at once, not at the
 * next drain */
BPF_RINGBUF_OUTPUT(cuda_py_wake, 1);
BPF_HASH(cuda_py_stacks, u32, struct py_stack, GT_PY_STACKS);
BPF_TASK_STORAGE(cuda_py_scratch, struct py_walk);

static __always_inline u64 py_mix(u64 h, u64 v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

static __always_inline u64 py_word(struct py_walk *w, u32 off)
{
    return *(u64 *)(w->buf + (off & (GT_PY_BLOCK - 8)));
}

/* Read `size` bytes (at most GT_PY_BLOCK) of the object at `addr` into w->buf. */
static __always_inline int py_read(struct py_walk *w, u32 size, u64 addr)
{
    if (size > GT_PY_BLOCK)
        size = GT_PY_BLOCK;
    return bpf_probe_read_user(w->buf, size, (void *)addr);
}

/* Is the thread state in w->buf the thread `tid`'s? */
static __always_inline int py_is_thread(struct py_proc *p, struct py_walk *w, u32 tid)
{
    u64 v = py_word(w, p->ts_tid);
    if (!p->pthread_tid)
        return v == tid;
    /* 3.10 keeps only pthread_self(): glibc's struct pthread holds the tid */
    u32 t = 0;
    if (!v || bpf_probe_read_user(&t, sizeof(t), (void *)(v + p->pthread_tid)))
        return 0;
    return t == tid;
}

/* The thread's PyThreadState, read into w->buf; 0 when it has none. */
static __always_inline u64 py_thread_state(struct py_proc *p, struct py_walk *w, u32 tid)
{
    if (w->tstate && w->interp_head == p->interp_head &&
        py_read(w, p->ts_size, w->tstate) == 0 && py_is_thread(p, w, tid))
        return w->tstate;
    w->tstate = 0;
    u64 interp = 0;
    if (bpf_probe_read_user(&interp, sizeof(interp), (void *)p->interp_head))
        return 0;
    for (u32 i = 0; i < GT_PY_INTERPS && interp; i++) {
        u64 ts = 0;
        if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(interp + p->interp_threads)))
            return 0;
        for (u32 j = 0; j < GT_PY_THREADS && ts; j++) {
            if (py_read(w, p->ts_size, ts))
                return 0;
            if (py_is_thread(p, w, tid)) {
                w->tstate = ts;
                w->interp_head = p->interp_head;
                return ts;
            }
            ts = py_word(w, p->ts_next);
        }
        if (bpf_probe_read_user(&interp, sizeof(interp), (void *)(interp + p->interp_next)))
            return 0;
    }
    return 0;
}

static __always_inline int py_same_stack(const struct py_stack *a, const struct py_stack *b)
{
    u32 n = a->n;
    if (n != b->n || n > GT_PY_DEPTH)
        return 0;
    for (u32 i = 0; i < n; i++)
        if (a->code[i] != b->code[i] || a->instr[i] != b->instr[i])
            return 0;
    return 1;
}

/* The calling thread's Python stack id (>= 0) in cuda_py_stacks; -1 when the
 * process is not a known CPython or the thread runs no Python, else -errno.
 * Walked at the call's entry (the Python frames are the same at its return), in
 * the uprobe programs: the uretprobe program already holds the native walk, and
 * the two loops in one program are more than the verifier follows. */
static __always_inline int cuda_py_stack_id(struct py_proc *p, struct py_walk *w, u32 pid,
                                            u32 tid)
{
    if (!py_thread_state(p, w, tid))
        return -1;
    u64 frame = py_word(w, p->ts_frame);
    if (p->cframe_frame != GT_PY_NONE &&
        (!frame || bpf_probe_read_user(&frame, sizeof(frame), (void *)(frame + p->cframe_frame))))
        return -1;
    struct py_stack *s = &w->s;
    /* the pid is part of the key: a code address means nothing in another process,
     * and each process's first sight of a stack must stop it (GT_PAUSE_PY) */
    w->h = py_mix(0x9e3779b97f4a7c15ULL, pid);
    w->n = 0;
    w->wbase = w->wend = 0;
    w->frame = frame;
    /* a shim frame (3.12+) takes a turn of its own: a few more turns than frames.
     * The frame address, like the count and hash, lives in the map value. */
    for (u32 i = 0; i < GT_PY_DEPTH + 16 && PY_LOAD(w->n) < GT_PY_DEPTH; i++) {
        frame = PY_LOAD(w->frame);
        if (!frame)
            break;
        u64 size = p->fr_size & (GT_PY_BLOCK - 1);
        if (frame < PY_LOAD(w->wbase) || frame + size > PY_LOAD(w->wend)) {
            u64 start = frame & p->page_mask;
            /* < GT_PY_PAGE + GT_PY_BLOCK: the mask only bounds it for the verifier */
            u64 len = (frame + size - start) & (GT_PY_WINDOW - 1);
            if (bpf_probe_read_user(w->win, len, (void *)start))
                break;
            w->wbase = start, w->wend = start + len;
        }
        u64 off = frame - PY_LOAD(w->wbase);  /* 8-aligned, as every field read as a word */
        u64 prev = *(u64 *)(w->win + ((off + p->fr_prev) & (GT_PY_WINDOW - 8)));
        u32 n = PY_LOAD(w->n);
        if (w->win[(off + p->fr_owner) & (GT_PY_WINDOW - 1)] == p->shim_owner) {
            s->code[(n - 1) & (GT_PY_DEPTH - 1)] |= (n > 0);
            w->frame = prev;
            continue;
        }
        u64 code = *(u64 *)(w->win + ((off + p->fr_code) & (GT_PY_WINDOW - 8)));
        /* a word even where the field is an int (3.10's f_lasti): user space keeps
         * the low half */
        u64 instr = *(u64 *)(w->win + ((off + p->fr_instr) & (GT_PY_WINDOW - 8)));
        u64 flag = (w->win[(off + p->fr_entry) & (GT_PY_WINDOW - 1)] & p->entry_mask) +
                   0xff;
        u64 entry = (flag >> 8) | p->entry_all;  /* 1: the byte was not 0, or always */
        s->code[n & (GT_PY_DEPTH - 1)] = code | entry;
        s->instr[n & (GT_PY_DEPTH - 1)] = instr;
        w->h = py_mix(py_mix(PY_LOAD(w->h), code | entry), instr);
        w->n = n + (code != 0);
        w->frame = prev;
    }
    u32 n = w->n;
    if (!n || n > GT_PY_DEPTH)
        return -1;
    s->n = n;
    s->_pad = 0;
    u64 h = py_mix(w->h, n);
    h ^= h >> 32;
    for (u32 k = 0; k < GT_CUDA_STACK_PROBES; k++) {
        u32 key = (u32)(h + k) & 0x7fffffff;
        struct py_stack *v = cuda_py_stacks.lookup(&key);
        if (!v) {
            int err = cuda_py_stacks.insert(&key, s);
            if (err == 0) {
                w->fresh = 1;
                return key;
            }
            if (err != -17)  /* EEXIST: another thread stored this key meanwhile */
                return err;
            v = cuda_py_stacks.lookup(&key);
            if (!v)
                return -17;
        }
        if (py_same_stack(v, s))
            return key;
    }
    return -17;
}

/* At an allocating call's entry: walk, and keep the id for its return. The
 * thread's scratch is looked up once (made only in a CPython process); without
 * it the return finds no id (-1). */
static __always_inline void cuda_py_enter(void *task, u32 pid, u32 tid)
{
    struct py_proc *p = cuda_py_procs.lookup(&pid);
    struct py_walk *w = cuda_py_scratch.task_storage_get(
        task, 0, p ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
    if (w) {
        w->fresh = 0;
        w->pending = p ? cuda_py_stack_id(p, w, pid, tid) : -1;
    }
}

/* At its return: the id the entry found (-1 when none); *fresh = 1 when that
 * stack was stored by this call. */
static __always_inline s32 cuda_py_take(void *task, u32 *fresh)
{
    struct py_walk *w = cuda_py_scratch.task_storage_get(task, 0, 0);
    if (!w)
        return -1;
    s32 id = w->pending;
    *fresh = w->fresh;
    w->pending = -1;
    w->fresh = 0;
    return id;
}

/* Stop `pid` for `kinds` (GT_PAUSE_*: why the recorder must act while it lives).
 * A new Python stack `py_id` (>= 0, GT_PAUSE_PY) is also named on cuda_py_wake,
 * whose thread (record/api/py_pauses.py) reads its code objects and continues the
 * process at once. Every probe that walks Python frames stops through here: the
 * API layer's allocating calls at their return, the torch_allocator layer's
 * malloc at its entry. */
static __always_inline void cuda_stop_for(u32 pid, u32 kinds, s32 py_id)
{
    struct cuda_config *cfg = cuda_cfg();
    if (!cfg)
        return;
    cuda_pause_for(pid, kinds, -1, cfg);
    if ((kinds & GT_PAUSE_PY) && py_id >= 0 && cfg->pause) {
        u64 wake = (u64)pid << 32 | (u32)py_id;
        cuda_py_wake.ringbuf_output(&wake, sizeof(wake), BPF_RB_FORCE_WAKEUP);
    }
}
