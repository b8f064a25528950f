/* ioctl storm: N RM_CONTROL ioctls (NVOS54, 32 bytes) on DEVDIR/nvidiactl, which
 * for the benchmark is a mknod copy of /dev/null (the fastest possible ioctl:
 * -ENOTTY). Prints the time per call, wall and this thread's CPU time (user +
 * system, where the probes run; not inflated by time slices lost to other
 * processes on a shared machine). Usage: storm DEVDIR N [--wait]
 * --wait: open the device, print "READY <pid>", wait for a line on stdin.
 * With STORM_UVM=1 in the environment: UVM_MIGRATE (cmd 51, 80 bytes of zeros:
 * five decoded fields) on DEVDIR/nvidia-uvm instead. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

struct nvos54 {
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
};

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: storm DEVDIR N [--wait]\n");
        return 2;
    }
    char path[4096];
    const char *uvm = getenv("STORM_UVM");
    int is_uvm = uvm && strcmp(uvm, "1") == 0;
    snprintf(path, sizeof(path), "%s/%s", argv[1], is_uvm ? "nvidia-uvm" : "nvidiactl");
    long n = atol(argv[2]);
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    if (argc > 3 && strcmp(argv[3], "--wait") == 0) {
        char line[16];
        printf("READY %d\n", getpid());
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    struct nvos54 p = {0xc1d00001, 0x5c000001, 0x00800280, 0, 0, 0, 0};
    uint64_t migrate[10] = {0};
    unsigned long req = is_uvm ? 51 : 0xc020462a;
    void *arg = is_uvm ? (void *)migrate : (void *)&p;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ca);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        ioctl(fd, req, arg);
    clock_gettime(CLOCK_MONOTONIC, &b);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cb);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    double cpu = (cb.tv_sec - ca.tv_sec) * 1e9 + (cb.tv_nsec - ca.tv_nsec);
    printf("calls %ld elapsed_ns %.0f ns_per_call %.1f cpu_ns_per_call %.1f\n", n, ns, ns / n,
           cpu / n);
    return 0;
}
