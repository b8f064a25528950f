/* The compiled reader of a PyTorch snapshot's regular trace entries (torch_scan.py).
 *
 * It reads the opcodes of a run of entries of one shape (their keys, in one order)
 * exactly as torch_patterns' byte patterns match them, and returns the run as
 * columns instead of a tuple of byte strings per entry: the four integers decoded,
 * and for the fields whose value is a memo reference or a small inline value (the
 * action, compile_context, user_metadata, frames) an index into the field's distinct
 * raw values, which the Python side names once each. Python's regular-expression
 * engine costs ~1.5 us an entry (10^7 entries: 15 s) and the tuples it builds as
 * much again; this costs ~0.1 us.
 *
 * An entry, as a pickler of protocol 4 or 5 writes it (FRAME opcodes, 9 bytes of
 * length hint, may stand before any opcode):
 *   EMPTY_DICT MEMOIZE MARK (key-ref value)* SETITEMS
 * key-ref: the exact bytes of the reference to the key's memo slot (BINGET or
 * LONG_BINGET). value, by field:
 *   action                      a reference
 *   addr, size, stream, time_us BININT1 | BININT2 | BININT | LONG1 of 1-9 bytes
 *   compile_context, metadata   NONE | a reference | SHORT_BINUNICODE "N/A" or ""
 *                               then MEMOIZE
 *   frames                      NONE | a reference | EMPTY_LIST MEMOIZE, then
 *                               optionally MARK (2 to 1000 references) APPENDS or
 *                               a reference APPEND
 * A LONG1 of 9 bytes (2^63 or more) stops the run: the per-entry path decides.
 * Between two entries of one run, APPENDS MARK (the pickler's batches of 1000) is
 * crossed when the entry after it matches too: the reader's state is the same.
 *
 * Nothing here trusts the input: every read is bounds-checked against the buffer,
 * and a run stops (no match) or pauses (needs more bytes) where the bytes end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F_ACTION, F_ADDR, F_SIZE, F_STREAM, F_TIME, F_CTX, F_META, F_FRAMES, NFIELDS };
#define NINTS 4
#define NKEYED 4
/* column of each field among the integers, or among the keyed fields */
static const int INT_COL[NFIELDS] = {-1, 0, 1, 2, 3, -1, -1, -1};
static const int KEYED_COL[NFIELDS] = {0, -1, -1, -1, -1, 1, 2, 3};

enum { OK = 0, NOMATCH = 1, TRUNC = 2 };

#define OP_FRAME 0x95
#define OP_MEMOIZE 0x94
#define OP_BINGET 0x68
#define OP_LONG_BINGET 0x6A
#define MAX_LIST_REFS 1000 /* a pickler's batch */

typedef struct {
    int field;
    Py_ssize_t len;
    const uint8_t *ref;
} Key;

typedef struct {
    const uint8_t *b;
    Py_ssize_t end;
} Buf;

/* FRAME opcodes at *p skipped; TRUNC when no opcode follows inside the buffer. */
static inline int frames(const Buf *s, Py_ssize_t *p) {
    while (*p < s->end && s->b[*p] == OP_FRAME) {
        if (*p + 9 > s->end)
            return TRUNC;
        *p += 9;
    }
    return *p < s->end ? OK : TRUNC;
}

static inline int ref(const Buf *s, Py_ssize_t *p) {
    uint8_t op = s->b[*p];
    Py_ssize_t n = op == OP_BINGET ? 2 : op == OP_LONG_BINGET ? 5 : 0;
    if (!n)
        return NOMATCH;
    if (*p + n > s->end)
        return TRUNC;
    *p += n;
    return OK;
}

static int integer(const Buf *s, Py_ssize_t *p, int64_t *out) {
    const uint8_t *b = s->b + *p;
    Py_ssize_t left = s->end - *p;
    switch (b[0]) {
    case 0x4B: /* BININT1 */
        if (left < 2)
            return TRUNC;
        *out = b[1];
        *p += 2;
        return OK;
    case 0x4D: /* BININT2 */
        if (left < 3)
            return TRUNC;
        *out = (int64_t)b[1] | (int64_t)b[2] << 8;
        *p += 3;
        return OK;
    case 0x4A: /* BININT: signed */
        if (left < 5)
            return TRUNC;
        *out = (int32_t)((uint32_t)b[1] | (uint32_t)b[2] << 8 | (uint32_t)b[3] << 16 |
                         (uint32_t)b[4] << 24);
        *p += 5;
        return OK;
    case 0x8A: { /* LONG1: n bytes, two's complement */
        if (left < 2)
            return TRUNC;
        int n = b[1];
        if (n < 1 || n > 9)
            return NOMATCH;
        if (left < 2 + n)
            return TRUNC;
        if (n == 9)
            return NOMATCH; /* past int64: the per-entry path */
        uint64_t v = 0;
        for (int k = n - 1; k >= 0; k--)
            v = v << 8 | b[2 + k];
        if (n < 8 && (b[1 + n] & 0x80))
            v |= ~(uint64_t)0 << (8 * n);
        *out = (int64_t)v;
        *p += 2 + n;
        return OK;
    }
    default:
        return NOMATCH;
    }
}

static int text(const Buf *s, Py_ssize_t *p) {
    const uint8_t *b = s->b;
    uint8_t op = b[*p];
    if (op == 'N') {
        *p += 1;
        return OK;
    }
    if (op == OP_BINGET || op == OP_LONG_BINGET)
        return ref(s, p);
    if (op != 0x8C) /* SHORT_BINUNICODE */
        return NOMATCH;
    if (*p + 2 > s->end)
        return TRUNC;
    int n = b[*p + 1];
    if (n != 0 && n != 3)
        return NOMATCH;
    if (*p + 2 + n > s->end)
        return TRUNC;
    if (n == 3 && memcmp(b + *p + 2, "N/A", 3) != 0)
        return NOMATCH;
    *p += 2 + n;
    int r = frames(s, p);
    if (r)
        return r;
    if (b[*p] != OP_MEMOIZE)
        return NOMATCH;
    *p += 1;
    return OK;
}

/* The optional items of a new frames list, at *p after its MEMOIZE: MARK refs APPENDS
 * or ref APPEND, each tried as the pattern's possessive group does; neither: none. */
static int list_items(const Buf *s, Py_ssize_t *p) {
    Py_ssize_t q = *p;
    int r = frames(s, &q);
    if (r)
        return r;
    if (s->b[q] == '(') {
        /* the references, read in one tight loop (this is most of an entry's bytes) */
        const uint8_t *b = s->b;
        Py_ssize_t t = q + 1, end = s->end;
        int count = 0;
        for (;;) {
            if (t >= end)
                return TRUNC;
            uint8_t op = b[t];
            Py_ssize_t width = op == OP_LONG_BINGET ? 5 : op == OP_BINGET ? 2 : 0;
            if (width && count == MAX_LIST_REFS)
                break;
            if (op == OP_FRAME)
                width = 9;
            else if (!width)
                break;
            else
                count++;
            if (t + width > end)
                return TRUNC;
            t += width;
        }
        if (count >= 2 && b[t] == 'e') {
            *p = t + 1;
            return OK;
        }
    }
    Py_ssize_t t = q;
    r = ref(s, &t);
    if (r == TRUNC)
        return r;
    if (r == OK) {
        r = frames(s, &t);
        if (r)
            return r;
        if (s->b[t] == 'a') {
            *p = t + 1;
            return OK;
        }
    }
    return OK; /* no items: the list stays empty, *p where it was */
}

static int list(const Buf *s, Py_ssize_t *p) {
    uint8_t op = s->b[*p];
    if (op == 'N') {
        *p += 1;
        return OK;
    }
    if (op == OP_BINGET || op == OP_LONG_BINGET)
        return ref(s, p);
    if (op != ']')
        return NOMATCH;
    *p += 1;
    int r = frames(s, p);
    if (r)
        return r;
    if (s->b[*p] != OP_MEMOIZE)
        return NOMATCH;
    *p += 1;
    return list_items(s, p);
}

/* ------------------------------------------------------------ distinct raw values */

typedef struct {
    Py_ssize_t *off, *len; /* of each distinct value, in order of first use */
    Py_ssize_t *first;     /* the entry of its first use */
    Py_ssize_t count, cap;
    int32_t *slots; /* hash table of indices + 1 (0: empty) */
    uint64_t *hashes;
    Py_ssize_t nslots;
    Py_ssize_t empty; /* the index of the empty value (an absent field), once known */
    int has_empty;
} Distinct;

/* A hash of a raw value, 8 bytes a step (a frames list is ~100 bytes an entry). */
static uint64_t hash_of(const uint8_t *b, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, b + i, (size_t)(n - i));
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

/* *p resized to cap items of `size` bytes; -1, *p unchanged, when out of memory. */
static int resize(void **p, Py_ssize_t cap, size_t size) {
    void *v = realloc(*p, (size_t)cap * size);
    if (!v)
        return -1;
    *p = v;
    return 0;
}
#define RESIZE(p, cap) resize((void **)&(p), (cap), sizeof *(p))

static int distinct_grow(Distinct *d) {
    Py_ssize_t cap = d->cap ? d->cap * 2 : 16;
    if (RESIZE(d->off, cap) || RESIZE(d->len, cap) || RESIZE(d->first, cap) ||
        RESIZE(d->hashes, cap))
        return -1;
    d->cap = cap;
    /* the table stays at most half full */
    Py_ssize_t nslots = cap * 2;
    int32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots)
        return -1;
    for (Py_ssize_t i = 0; i < d->count; i++) {
        Py_ssize_t k = (Py_ssize_t)(d->hashes[i] & (uint64_t)(nslots - 1));
        while (slots[k])
            k = (k + 1) & (nslots - 1);
        slots[k] = (int32_t)(i + 1);
    }
    free(d->slots);
    d->slots = slots;
    d->nslots = nslots;
    return 0;
}

/* The index of the value b[off:off+len], added when new; -1 out of memory. */
static Py_ssize_t distinct_index(Distinct *d, const uint8_t *b, Py_ssize_t off,
                                 Py_ssize_t len, Py_ssize_t entry) {
    if (d->count + 1 > d->cap && distinct_grow(d) < 0)
        return -1;
    uint64_t h = hash_of(b + off, len);
    Py_ssize_t k = (Py_ssize_t)(h & (uint64_t)(d->nslots - 1));
    while (d->slots[k]) {
        Py_ssize_t i = d->slots[k] - 1;
        if (d->hashes[i] == h && d->len[i] == len && memcmp(b + d->off[i], b + off, len) == 0)
            return i;
        k = (k + 1) & (d->nslots - 1);
    }
    Py_ssize_t i = d->count++;
    d->off[i] = off;
    d->len[i] = len;
    d->first[i] = entry;
    d->hashes[i] = h;
    d->slots[k] = (int32_t)(i + 1);
    return i;
}

static void distinct_free(Distinct *d) {
    free(d->off);
    free(d->len);
    free(d->first);
    free(d->slots);
    free(d->hashes);
}

/* ------------------------------------------------------------ columns */

typedef struct {
    Py_ssize_t n, cap;
    int64_t *starts;       /* n + 1: where each entry starts, then where the run ends */
    int64_t *ints[NINTS];  /* addr, size, stream, time_us */
    int32_t *keyed[NKEYED]; /* action, compile_context, user_metadata, frames */
} Columns;

static int columns_grow(Columns *c) {
    Py_ssize_t cap = c->cap ? c->cap * 2 : 1024;
    if (RESIZE(c->starts, cap + 1))
        return -1;
    for (int k = 0; k < NINTS; k++)
        if (RESIZE(c->ints[k], cap))
            return -1;
    for (int k = 0; k < NKEYED; k++)
        if (RESIZE(c->keyed[k], cap))
            return -1;
    c->cap = cap;
    return 0;
}

static void columns_free(Columns *c) {
    free(c->starts);
    for (int k = 0; k < NINTS; k++)
        free(c->ints[k]);
    for (int k = 0; k < NKEYED; k++)
        free(c->keyed[k]);
}

/* One entry at *p: OK (values in row n of the columns, *p past it), NOMATCH, TRUNC;
 * -1 out of memory. */
static int entry(const Buf *s, Py_ssize_t *p, const Key *keys, int nkeys, Columns *c,
                 Distinct *d) {
    Py_ssize_t q = *p;
    int r;
    static const uint8_t head[3] = {'}', OP_MEMOIZE, '('};
    for (int k = 0; k < 3; k++) {
        if ((r = frames(s, &q)))
            return r;
        if (s->b[q] != head[k])
            return NOMATCH;
        q++;
    }
    Py_ssize_t n = c->n;
    int64_t ints[NINTS] = {0};
    Py_ssize_t voff[NKEYED], vlen[NKEYED];
    for (int k = 0; k < NKEYED; k++)
        voff[k] = vlen[k] = 0; /* absent: the empty value */
    for (int k = 0; k < nkeys; k++) {
        if ((r = frames(s, &q)))
            return r;
        if (q + keys[k].len > s->end)
            return TRUNC;
        if (memcmp(s->b + q, keys[k].ref, keys[k].len) != 0)
            return NOMATCH;
        q += keys[k].len;
        if ((r = frames(s, &q)))
            return r;
        Py_ssize_t start = q;
        int f = keys[k].field;
        switch (f) {
        case F_ACTION:
            r = ref(s, &q);
            break;
        case F_CTX:
        case F_META:
            r = text(s, &q);
            break;
        case F_FRAMES:
            r = list(s, &q);
            break;
        default:
            r = integer(s, &q, &ints[INT_COL[f]]);
        }
        if (r)
            return r;
        if (KEYED_COL[f] >= 0) {
            voff[KEYED_COL[f]] = start;
            vlen[KEYED_COL[f]] = q - start;
        }
    }
    if ((r = frames(s, &q)))
        return r;
    if (s->b[q] != 'u')
        return NOMATCH;
    q++;
    if (n >= c->cap && columns_grow(c) < 0)
        return -1;
    for (int k = 0; k < NINTS; k++)
        c->ints[k][n] = ints[k];
    for (int k = 0; k < NKEYED; k++) {
        Py_ssize_t i = vlen[k] == 0 && d[k].has_empty
                           ? d[k].empty
                           : distinct_index(&d[k], s->b, voff[k], vlen[k], n);
        if (i < 0)
            return -1;
        if (vlen[k] == 0) {
            d[k].empty = i;
            d[k].has_empty = 1;
        }
        c->keyed[k][n] = (int32_t)i;
    }
    c->starts[n] = *p;
    c->n = n + 1;
    *p = q;
    return OK;
}

static PyObject *bytes_of(const void *v, Py_ssize_t size) {
    return PyBytes_FromStringAndSize((const char *)v, size);
}

PyDoc_STRVAR(scan_doc,
"scan(buf, pos, spec) -> (n, stop, paused, starts, ints, keyed)\n\n"
"The entries of one shape from buf[pos]: spec is, per key in the entry's order, its\n"
"field (FAST_KEYS index), the length of its reference and the reference's bytes.\n"
"n entries matched; stop: where the first entry not matched starts; paused: the\n"
"buffer ended inside it. starts: int64 x (n + 1), where each entry starts (then\n"
"stop); ints: int64 x 4n, addr, size, stream, time_us columns one after another;\n"
"keyed: per action, compile_context, user_metadata, frames, (int32 x n indices,\n"
"[distinct raw values, in order of first use], int64 first use of each).");

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, spec;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*ny*", &view, &pos, &spec))
        return NULL;
    PyObject *result = NULL;
    Key keys[NFIELDS];
    int nkeys = 0;
    Columns c = {0};
    Distinct d[NKEYED] = {{0}};
    const uint8_t *sp = spec.buf;
    Py_ssize_t i = 0;
    while (i < spec.len) {
        if (nkeys == NFIELDS || i + 2 > spec.len || sp[i] >= NFIELDS || sp[i + 1] == 0 ||
            i + 2 + sp[i + 1] > spec.len) {
            PyErr_SetString(PyExc_ValueError, "bad spec");
            goto done;
        }
        keys[nkeys].field = sp[i];
        keys[nkeys].len = sp[i + 1];
        keys[nkeys].ref = sp + i + 2;
        nkeys++;
        i += 2 + sp[i + 1];
    }
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto done;
    }
    if (columns_grow(&c) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Buf s = {view.buf, view.len};
    Py_ssize_t p = pos;
    int paused = 0;
    for (;;) {
        int r = entry(&s, &p, keys, nkeys, &c, d);
        if (r == OK) {
            /* the pickler's next batch (APPENDS MARK) is crossed when an entry follows */
            Py_ssize_t q = p;
            if ((r = frames(&s, &q)) == OK && s.b[q] == 'e') {
                q++;
                if ((r = frames(&s, &q)) == OK && s.b[q] == '(') {
                    Py_ssize_t t = ++q;
                    if ((r = entry(&s, &t, keys, nkeys, &c, d)) == OK) {
                        c.starts[c.n - 1] = q;
                        p = t;
                        continue;
                    }
                }
                if (r == OK)
                    r = NOMATCH; /* the end of the list: the reader's APPENDS */
            } else if (r == OK) {
                continue; /* the next entry of this batch */
            }
        }
        if (r < 0) {
            PyErr_NoMemory();
            goto done;
        }
        paused = r == TRUNC;
        break;
    }
    c.starts[c.n] = p;
    {
        PyObject *ints = PyBytes_FromStringAndSize(NULL, c.n * NINTS * (Py_ssize_t)sizeof(int64_t));
        if (!ints)
            goto done;
        for (int k = 0; k < NINTS; k++)
            memcpy(PyBytes_AS_STRING(ints) + k * c.n * sizeof(int64_t), c.ints[k],
                   c.n * sizeof(int64_t));
        PyObject *keyed = PyTuple_New(NKEYED);
        if (!keyed) {
            Py_DECREF(ints);
            goto done;
        }
        for (int k = 0; k < NKEYED; k++) {
            PyObject *values = PyList_New(d[k].count);
            PyObject *first = bytes_of(d[k].first, d[k].count * (Py_ssize_t)sizeof(Py_ssize_t));
            PyObject *index = bytes_of(c.keyed[k], c.n * (Py_ssize_t)sizeof(int32_t));
            if (!values || !first || !index) {
                Py_XDECREF(values);
                Py_XDECREF(first);
                Py_XDECREF(index);
                Py_DECREF(keyed);
                Py_DECREF(ints);
                goto done;
            }
            for (Py_ssize_t j = 0; j < d[k].count; j++) {
                PyObject *v = bytes_of(s.b + d[k].off[j], d[k].len[j]);
                if (!v) {
                    Py_DECREF(values);
                    Py_DECREF(first);
                    Py_DECREF(index);
                    Py_DECREF(keyed);
                    Py_DECREF(ints);
                    goto done;
                }
                PyList_SET_ITEM(values, j, v);
            }
            PyObject *col = PyTuple_Pack(3, index, values, first);
            Py_DECREF(index);
            Py_DECREF(values);
            Py_DECREF(first);
            if (!col) {
                Py_DECREF(keyed);
                Py_DECREF(ints);
                goto done;
            }
            PyTuple_SET_ITEM(keyed, k, col);
        }
        PyObject *starts = bytes_of(c.starts, (c.n + 1) * (Py_ssize_t)sizeof(int64_t));
        if (!starts) {
            Py_DECREF(keyed);
            Py_DECREF(ints);
            goto done;
        }
        result = Py_BuildValue("(nniNNN)", c.n, p, paused, starts, ints, keyed);
    }
done:
    columns_free(&c);
    for (int k = 0; k < NKEYED; k++)
        distinct_free(&d[k]);
    PyBuffer_Release(&view);
    PyBuffer_Release(&spec);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_entry_scan",
    .m_doc = "The compiled reader of a PyTorch snapshot's regular trace entries.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__entry_scan(void) { return PyModule_Create(&module); }
