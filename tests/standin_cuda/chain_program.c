/* TEST STAND-IN program for the native unwinder with a library without frame
 * pointers in the middle of the stack: frame pointers kept here and in
 * libchain_b.so, none in libchain_a.so and libchain_c.so (chain_libs.c):
 *   main -> run -> chain_a -> chain_b -> chain_c -> cuMemAlloc_v2
 * Usage: chain_program [N]: N allocations of 1 MiB through the chain, the
 * process's FIRST device allocation among them (no warm-up call), then each
 * freed. Prints "chain N". Linked to libchain_a and libchain_c only: the
 * dynamic loader maps all three chain libraries before it opens libcuda. */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_standin.h"

unsigned long chain_a(unsigned long size, unsigned long tag);
int chain_init(void); /* libchain_c.so: cuInit, the device, a context */
int chain_free(unsigned long p); /* libchain_c.so: cuMemFree_v2 */

#define MAX 64

__attribute__((noinline)) static int run(long n, unsigned long *p)
{
    for (long i = 0; i < n; i++) {
        p[i] = chain_a(1u << 20, (unsigned long)i);
        if (p[i] == 0)
            return 1;
    }
    __asm__ volatile("" ::: "memory"); /* not a tail call */
    return 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3;
    unsigned long p[MAX];
    if (n < 1 || n > MAX || chain_init() != 0)
        return 2;
    if (run(n, p))
        return 1;
    for (long i = 0; i < n; i++)
        if (chain_free(p[i]))
            return 1;
    printf("chain %ld\n", n);
    return 0;
}
