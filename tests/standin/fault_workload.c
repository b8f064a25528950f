/* TEST STAND-IN workload for CPU page faults on managed memory.
 *
 *   fault_workload DEVDIR [--wait]     touch the pattern below, print DONE
 *   fault_workload --print-expected    the faults a tracer must record (JSON)
 *
 * It maps DEVDIR/nvidia-uvm MAP_SHARED at offset == address (a managed range,
 * as libcuda maps one) and touches one byte at +0x40 of chosen pages. Touched
 * pages are 256 KiB apart so that no two share a 64 KiB fault-around window
 * (a read fault on a file mapping also maps cached neighbours in its window).
 * On this MAP_SHARED file mapping (FUSE has page_mkwrite):
 *   W  (write)            1 write fault
 *   R  (read)             1 read fault
 *   RR (read, read)       1 read fault
 *   RW (read, then write) 1 read fault + 1 write fault (the read maps the page
 *                         read-only; the write takes a write-protect fault)
 *   WR (write, then read) 1 write fault
 * Pages touched outside any managed range (never to be recorded): an anonymous
 * mapping, anonymous pages MAP_FIXED into the same 2 MiB blocks as managed
 * pages, a hole punched with munmap and refilled anonymously, and a managed
 * tail replaced by a MAP_FIXED anonymous mapping. With --wait both managed
 * ranges are mapped before READY <pid>; every touch comes after the "go" line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)
#define A_BASE 0x300000000000ULL /* managed range A: 8 MiB, 4 whole blocks */
#define A_LEN (8 * MiB)
#define B_BASE (A_BASE + 17 * MiB) /* managed range B: 4 MiB, not 2 MiB aligned */
#define B_LEN (4 * MiB)
#define ANON_BASE 0x310000000000ULL
#define SLOT (256 * KiB)
#define TOUCH 0x40

enum op { W, R, RR, RW, WR };
static const char *op_names[] = {"W", "R", "RR", "RW", "WR"};
struct touch {
    uint64_t addr;
    enum op op;
};

#define AT(block, slot) (A_BASE + (block) * 2 * MiB + (slot) * SLOT)
static const struct touch managed[] = {
    {AT(0, 0), W}, {AT(0, 1), W}, {AT(0, 2), W}, {AT(0, 3), W},
    {AT(0, 4), W}, {AT(0, 5), W}, {AT(0, 6), W}, {AT(0, 7), W},
    {AT(1, 0), R}, {AT(1, 1), R}, {AT(1, 2), R}, {AT(1, 3), R},
    {AT(1, 4), W}, {AT(1, 5), W}, {AT(1, 6), RR},
    {AT(2, 0), RW}, {AT(2, 1), RW}, {AT(2, 2), RW}, {AT(2, 3), WR},
    {AT(3, 7), W},
    /* range B after its changes below: [B, B+1M) and [B+2M, B+3.5M) stay managed */
    {B_BASE, W}, {B_BASE + SLOT, R}, {B_BASE + 2 * MiB, W}, {B_BASE + 3 * MiB, R},
};
#define NMANAGED (sizeof(managed) / sizeof(managed[0]))

/* Outside: in B's first block below B, in the munmap hole, in the replaced tail,
 * and in a private anonymous mapping. */
static const uint64_t outside[] = {
    B_BASE - 4 * KiB, B_BASE + MiB, B_BASE + MiB + 512 * KiB, B_BASE + 3 * MiB + 768 * KiB,
    ANON_BASE, ANON_BASE + 64 * KiB, ANON_BASE + 512 * KiB, ANON_BASE + 960 * KiB,
};
#define NOUTSIDE (sizeof(outside) / sizeof(outside[0]))

static void die(const char *what)
{
    fprintf(stderr, "fault_workload: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void *map_at(uint64_t addr, uint64_t len, int fd)
{
    int flags = (fd < 0 ? MAP_ANONYMOUS | MAP_PRIVATE : MAP_SHARED) | MAP_FIXED;
    void *p = mmap((void *)addr, len, PROT_READ | PROT_WRITE, flags, fd, fd < 0 ? 0 : (off_t)addr);
    if (p == MAP_FAILED)
        die("mmap");
    return p;
}

static void print_expected(void)
{
    unsigned reads = 0, writes = 0;
    printf("{\n  \"page_size\": 4096,\n  \"touch_offset\": %d,\n", TOUCH);
    printf("  \"managed_ranges\": [{\"address\": %llu, \"length\": %llu}, "
           "{\"address\": %llu, \"length\": %llu}],\n",
           A_BASE, A_LEN, B_BASE, B_LEN);
    printf("  \"pages\": [\n");
    for (unsigned i = 0; i < NMANAGED; i++) {
        enum op o = managed[i].op;
        unsigned r = (o == R || o == RR || o == RW), w = (o == W || o == RW || o == WR);
        reads += r, writes += w;
        printf("    {\"address\": %llu, \"op\": \"%s\", \"reads\": %u, \"writes\": %u}%s\n",
               (unsigned long long)managed[i].addr + TOUCH, op_names[o], r, w,
               i + 1 < NMANAGED ? "," : "");
    }
    printf("  ],\n  \"outside\": [");
    for (unsigned i = 0; i < NOUTSIDE; i++)
        printf("%llu%s", (unsigned long long)outside[i] + TOUCH, i + 1 < NOUTSIDE ? ", " : "");
    printf("],\n  \"faults\": %u,\n  \"reads\": %u,\n  \"writes\": %u\n}\n", reads + writes, reads,
           writes);
}

static void touch(uint64_t addr, enum op o)
{
    volatile unsigned char *p = (volatile unsigned char *)(addr + TOUCH);
    unsigned char v;
    switch (o) {
    case W: *p = 1; break;
    case R: v = *p; (void)v; break;
    case RR: v = *p; v = *p; (void)v; break;
    case RW: v = *p; *p = (unsigned char)(v + 1); break;
    case WR: *p = 2; v = *p; (void)v; break;
    }
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--print-expected") == 0) {
        print_expected();
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: fault_workload DEVDIR [--wait] | --print-expected\n");
        return 2;
    }
    int wait = argc >= 3 && strcmp(argv[2], "--wait") == 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/nvidia-uvm", argv[1]);
    int uvm = open(path, O_RDWR | O_CLOEXEC);
    if (uvm < 0)
        die(path);
    map_at(A_BASE, A_LEN, uvm);
    map_at(B_BASE, B_LEN, uvm);
    if (wait) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    /* B: anonymous pages just below it (same 2 MiB block), a hole, a replaced tail */
    map_at(B_BASE - 64 * KiB, 64 * KiB, -1);
    if (munmap((void *)(B_BASE + MiB), MiB) != 0)
        die("munmap");
    map_at(B_BASE + MiB, MiB, -1);
    map_at(B_BASE + 3 * MiB + 512 * KiB, 512 * KiB, -1);
    map_at(ANON_BASE, MiB, -1);
    for (unsigned i = 0; i < NMANAGED; i++)
        touch(managed[i].addr, managed[i].op);
    for (unsigned i = 0; i < NOUTSIDE; i++)
        touch(outside[i], W);
    munmap((void *)A_BASE, A_LEN);
    munmap((void *)B_BASE, B_LEN);
    close(uvm);
    printf("DONE\n");
    return 0;
}
