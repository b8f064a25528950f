/* Fault storm benchmark: write one byte to every page of a fresh
 * managed range, so every page takes one CPU write fault.
 *
 *   storm DEVDIR MIB [--wait] [--anon] [--slot K]
 *
 * DEVDIR/nvidia-uvm is mapped MAP_SHARED at offset == address (a managed range
 * to gputrace); --anon maps private anonymous memory instead (faults the probe
 * must filter out). Transparent huge pages are disabled on the range so each
 * 4 KiB page faults. Prints "faults N ns_per_fault X". With --wait it maps the
 * range, prints "READY <pid>" and waits for a line on stdin before touching.
 * --slot K maps at BASE + K * 64 GiB (concurrent storms touch distinct pages).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define BASE 0x320000000000ULL

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: storm DEVDIR MIB [--wait] [--anon] [--slot K]\n");
        return 2;
    }
    size_t len = (size_t)strtoull(argv[2], NULL, 10) << 20;
    int wait = 0, anon = 0;
    unsigned long long base = BASE;
    for (int i = 3; i < argc; i++) {
        wait |= strcmp(argv[i], "--wait") == 0;
        anon |= strcmp(argv[i], "--anon") == 0;
        if (strcmp(argv[i], "--slot") == 0 && i + 1 < argc)
            base = BASE + (strtoull(argv[++i], NULL, 10) << 36);
    }
    int fd = -1;
    if (!anon) {
        char path[4096];
        snprintf(path, sizeof path, "%s/nvidia-uvm", argv[1]);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            perror(path);
            return 1;
        }
    }
    int flags = MAP_FIXED | (anon ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED);
    volatile char *p = mmap((void *)base, len, PROT_READ | PROT_WRITE, flags, fd,
                            anon ? 0 : (off_t)base);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    madvise((void *)p, len, MADV_NOHUGEPAGE);
    if (wait) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    long pg = sysconf(_SC_PAGESIZE);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (size_t off = 0; off < len; off += (size_t)pg)
        p[off] = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    size_t n = len / (size_t)pg;
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("faults %zu ns_per_fault %.1f\n", n, ns / (double)n);
    munmap((void *)p, len);
    return 0;
}
