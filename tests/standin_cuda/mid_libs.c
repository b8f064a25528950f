/* TEST STAND-IN libraries for the whole-stack unwinder: built twice from this
 * file, libmid_a.so WITHOUT frame pointers (-DMID_A) and libmid_b.so with
 * them (-DMID_B), so that in
 *   main -> run_mid -> mid_outer (A) -> mid_middle (B) -> cache_alloc (C)
 *        -> grow_segment (C) -> cuMemAlloc_v2
 * a library without frame pointers sits in the middle of the stack, under
 * frame-pointer code, as libcudart and libc10_cuda sit under libtorch and
 * Python's interpreter. */
#include <stddef.h>
#include "cuda_standin.h"

#define EXPORT __attribute__((visibility("default"), noinline))

#ifdef MID_B
CUdeviceptr cache_alloc(size_t size, unsigned long tag);

/* Unused: most of the library's code in functions with frame pointers (what
 * the recorder's cfi check weighs, by bytes, against the loader's stubs), so
 * it gets no table and its frame is walked by its frame pointer. */
EXPORT CUdeviceptr mid_middle(size_t size, unsigned long tag);
EXPORT unsigned long mid_checksum(const unsigned char *p, size_t n)
{
    if (n == 0) /* a call: not a leaf, so it keeps its frame pointer */
        return (unsigned long)mid_middle(0, 0);
    unsigned long h = 1469598103934665603ul;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ul;
        h ^= h >> (p[i] & 31);
        h += (h << 7) ^ (h >> 11) ^ i;
    }
    return h ^ (h >> 33) ^ (h << 5) ^ n;
}

EXPORT CUdeviceptr mid_middle(size_t size, unsigned long tag)
{
    CUdeviceptr p = cache_alloc(size, tag);
    __asm__ volatile("" ::: "memory"); /* not a tail call: the frame stays */
    return p;
}
#endif

#ifdef MID_A
CUdeviceptr mid_middle(size_t size, unsigned long tag);

/* volatile: the call is not a tail call, and the frame holds locals */
EXPORT CUdeviceptr mid_outer(size_t size, unsigned long tag)
{
    volatile unsigned long spill[4] = {tag, tag + 1, tag + 2, tag + 3};
    CUdeviceptr p = mid_middle(size + spill[0] * 0, tag);
    __asm__ volatile("" ::: "memory");
    return p + spill[3] * 0;
}
#endif
