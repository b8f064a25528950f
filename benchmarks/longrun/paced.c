/* A steady ioctl load for the long-run benchmark: RATE RM_CONTROL ioctls per
 * second on DEVDIR/nvidiactl (a mknod copy of /dev/null) for SECONDS, issued in
 * 1 ms batches on an absolute schedule (a late batch is caught up, so the
 * average rate holds). Usage: paced DEVDIR RATE SECONDS. Prints the calls made. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
    if (argc < 4) {
        fprintf(stderr, "usage: paced DEVDIR RATE SECONDS\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/nvidiactl", argv[1]);
    long rate = atol(argv[2]), secs = atol(argv[3]);
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    struct nvos54 p = {0xc1d00001, 0x5c000001, 0x00800280, 0, 0, 0, 0};
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long done = 0, ms = 0, total = rate * secs;
    while (done < total) {
        ms++;
        long due = rate * ms / 1000;
        for (; done < due && done < total; done++)
            ioctl(fd, 0xc020462a, &p);
        t.tv_nsec += 1000000;
        if (t.tv_nsec >= 1000000000) {
            t.tv_nsec -= 1000000000;
            t.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
    }
    printf("calls %ld\n", done);
    return 0;
}
