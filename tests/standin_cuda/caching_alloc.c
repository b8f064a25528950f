/* TEST STAND-IN: a small "caching allocator" built WITHOUT frame pointers
 * (-O2 -fomit-frame-pointer), between caching_program and the stand-in libcuda,
 * as PyTorch's libc10_cuda sits between a program and libcuda. Not NVIDIA or
 * PyTorch code. Call chain of every segment it grows:
 *   cache_alloc (exported) -> grow_segment (static, noinline) -> cuMemAlloc_v2
 * Neither function sets up a frame pointer, and grow_segment keeps enough
 * values live across the call that it saves and reuses %rbp as a plain
 * register: a frame-pointer walk from cuMemAlloc_v2's caller reads no valid
 * chain through them (see tests/live/test_record_unwind.py). */
#include <stddef.h>
#include "cuda_standin.h"

#define SEGMENT (2u << 20) /* segments are whole multiples of 2 MiB */
#define MAX_SEGMENTS 64

struct segment {
    CUdeviceptr base;
    size_t size, used;
};
static struct segment segments[MAX_SEGMENTS];
static int nsegments;
static volatile unsigned long checksum; /* keeps the values below live */

__attribute__((noinline)) static struct segment *grow_segment(size_t want, unsigned long tag)
{
    size_t size = (want + SEGMENT - 1) / SEGMENT * SEGMENT;
    unsigned long a = tag * 3 + size, b = tag ^ want, c = tag + 7, d = want >> 3, e = tag << 2;
    CUdeviceptr base = 0;
    if (nsegments == MAX_SEGMENTS || cuMemAlloc_v2(&base, size))
        return NULL;
    /* a..e live across the call: callee-saved registers, %rbp among them */
    checksum += a + b * c + d * e + (a ^ e) + (b - d);
    struct segment *s = &segments[nsegments++];
    s->base = base, s->size = size, s->used = 0;
    return s;
}

/* A block of `size` bytes from a cached segment with room, else a new segment. */
__attribute__((visibility("default"), noinline)) CUdeviceptr cache_alloc(size_t size,
                                                                         unsigned long tag)
{
    char scratch[96]; /* a frame of its own size: its CFA is rsp + a constant */
    for (int i = 0; i < nsegments; i++) {
        struct segment *s = &segments[i];
        if (s->size - s->used >= size) {
            s->used += size;
            return s->base + s->used - size;
        }
    }
    struct segment *s = grow_segment(size, tag);
    if (s == NULL)
        return 0;
    for (unsigned i = 0; i < sizeof(scratch); i++)
        scratch[i] = (char)(tag + i);
    checksum += (unsigned long)scratch[tag % sizeof(scratch)];
    s->used = size;
    return s->base;
}

/* Every segment back to the driver (the program's exit path). */
__attribute__((visibility("default"), noinline)) int cache_release_all(void)
{
    int bad = 0;
    for (int i = 0; i < nsegments; i++)
        bad |= cuMemFree_v2(segments[i].base) != 0;
    nsegments = 0;
    return bad;
}

/* The allocation storm through this library (benchmarks/unwind_storm): k
 * allocations of 4 KiB into p[], each from two frames without frame pointers
 * (cache_storm -> storm_one -> cuMemAlloc_v2). Returns 0, or 1 on a failure. */
__attribute__((noinline)) static int storm_one(CUdeviceptr *p, unsigned long i)
{
    unsigned long a = i * 3, b = i ^ 5, c = i + 7; /* live across the call */
    int r = cuMemAlloc_v2(p, 4096);
    checksum += a + b * c;
    return r;
}

__attribute__((visibility("default"), noinline)) int cache_storm(CUdeviceptr *p, long k)
{
    char scratch[64];
    for (long i = 0; i < k; i++)
        if (storm_one(&p[i], (unsigned long)i))
            return 1;
    scratch[k & 63] = (char)k;
    checksum += (unsigned long)scratch[k & 63];
    return 0;
}
