/* TEST STAND-IN: three small libraries between chain_program and the stand-in
 * libcuda, alternately built without and with frame pointers, as libcudart,
 * libc10_cuda and libtorch sit in the middle of a PyTorch stack. Not NVIDIA or
 * PyTorch code. One source, built three times (Makefile: CHAIN_LEVEL 1..3):
 *   chain_a (libchain_a.so, -fomit-frame-pointer) -> chain_b (libchain_b.so,
 *   frame pointers) -> chain_c (libchain_c.so, -fomit-frame-pointer) -> cuMemAlloc_v2
 * The libraries without frame pointers keep enough values live across their
 * call that they save and reuse %rbp as a plain register: no frame-pointer
 * chain runs through them (see tests/live/test_record_unwind_chain.py). */
#include <stddef.h>
#include "cuda_standin.h"

static volatile unsigned long sink; /* keeps the values below live */

#if CHAIN_LEVEL == 1
unsigned long chain_b(unsigned long size, unsigned long tag);
#define NAME chain_a
#define NEXT(size, tag) chain_b(size, tag)
#elif CHAIN_LEVEL == 2
unsigned long chain_c(unsigned long size, unsigned long tag);
#define NAME chain_b
#define NEXT(size, tag) chain_c(size, tag)
#else
static unsigned long next_alloc(unsigned long size, unsigned long tag)
{
    CUdeviceptr p = 0;
    (void)tag;
    return cuMemAlloc_v2(&p, size) ? 0 : p;
}
#define NAME chain_c
#define NEXT(size, tag) next_alloc(size, tag)

/* The program's CUDA set-up, here so that the program itself needs no libcuda:
 * the dynamic loader then opens libcuda after every chain library is mapped. */
__attribute__((visibility("default"))) int chain_init(void)
{
    CUdevice dev;
    CUcontext ctx;
    return cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev);
}

__attribute__((visibility("default"))) int chain_free(unsigned long p)
{
    return cuMemFree_v2((CUdeviceptr)p) != 0;
}
#endif

/* One device allocation of `size` bytes through the rest of the chain. */
__attribute__((visibility("default"), noinline)) unsigned long NAME(unsigned long size,
                                                                    unsigned long tag)
{
    char scratch[48 * CHAIN_LEVEL]; /* a frame of its own size at each level */
    unsigned long a = tag * 3 + size, b = tag ^ size, c = tag + 7, d = size >> 3, e = tag << 2;
    unsigned long p = NEXT(size, tag);
    __asm__ volatile("" ::: "memory"); /* not a tail call: each level keeps its frame */
    /* a..e live across the call: callee-saved registers, %rbp among them */
    for (unsigned i = 0; i < sizeof(scratch); i++)
        scratch[i] = (char)(tag + i);
    sink += a + b * c + d * e + (a ^ e) + (b - d) + (unsigned long)scratch[tag % sizeof(scratch)];
    return p;
}
