/* Work the recorder does not record: N operations of one kind, timed inside the
 * process. Usage: other KIND N [DEVDIR]
 *   null   ioctl(FIONREAD) on a mknod copy of /dev/null outside the device dir
 *          (the path is DEVDIR/../notnvidia, made by run.py)
 *   tty    ioctl(TCGETS) on a pseudo-terminal master
 *   sock   ioctl(FIONREAD) on a UDP socket
 *   mmap   mmap + munmap of 4 KiB of a regular file (one op = the pair)
 *   fault  a write fault on a fresh private anonymous page (THP off)
 *   getpid getpid(): a syscall that no probe of the recorder looks at
 * With DEVDIR the process first opens DEVDIR/nvidiactl, so it is a process the
 * recorder knows (its untraced work then goes through the fd lookup).
 * Prints "ops N elapsed_ns T ns_per_op X cpu_ns_per_op C": C is this thread's
 * CPU time (user + system, where the probes run), which time slices lost to
 * other processes on a shared machine do not inflate. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static double clock_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static double c0, c1;
static double now(void) { return clock_ns(CLOCK_MONOTONIC); }
#define START() (c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), now())
#define STOP() (c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID), now())

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: other KIND N [DEVDIR]\n");
        return 2;
    }
    const char *kind = argv[1];
    long n = atol(argv[2]);
    char path[4096];
    if (argc > 3) {
        snprintf(path, sizeof(path), "%s/nvidiactl", argv[3]);
        if (open(path, O_RDWR) < 0) {
            perror(path);
            return 1;
        }
    }
    int fd = -1, v = 0;
    double t0, t1;
    if (!strcmp(kind, "null") || !strcmp(kind, "tty") || !strcmp(kind, "sock")) {
        unsigned long req = FIONREAD;
        if (!strcmp(kind, "null")) {
            snprintf(path, sizeof(path), "%s/notnvidia", getenv("OTHER_DIR") ? getenv("OTHER_DIR") : "/tmp");
            fd = open(path, O_RDWR);
        } else if (!strcmp(kind, "tty")) {
            fd = posix_openpt(O_RDWR | O_NOCTTY);
            req = TCGETS;
        } else {
            fd = socket(AF_INET, SOCK_DGRAM, 0);
        }
        if (fd < 0) {
            perror(kind);
            return 1;
        }
        struct termios tio;
        void *arg = req == TCGETS ? (void *)&tio : (void *)&v;
        t0 = START();
        for (long i = 0; i < n; i++)
            ioctl(fd, req, arg);
        t1 = STOP();
    } else if (!strcmp(kind, "mmap")) {
        char tmpl[] = "/dev/shm/gputrace-other-XXXXXX";
        fd = mkstemp(tmpl);
        if (fd < 0 || ftruncate(fd, 4096) != 0) {
            perror("mkstemp");
            return 1;
        }
        unlink(tmpl);
        t0 = START();
        for (long i = 0; i < n; i++) {
            void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
            munmap(p, 4096);
        }
        t1 = STOP();
    } else if (!strcmp(kind, "fault")) {
        size_t len = (size_t)n * 4096;
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        madvise(p, len, MADV_NOHUGEPAGE);
        t0 = START();
        for (long i = 0; i < n; i++)
            p[i * 4096] = 1;
        t1 = STOP();
    } else if (!strcmp(kind, "getpid")) {
        t0 = START();
        for (long i = 0; i < n; i++)
            syscall(SYS_getpid);
        t1 = STOP();
    } else {
        fprintf(stderr, "unknown kind %s\n", kind);
        return 2;
    }
    printf("ops %ld elapsed_ns %.0f ns_per_op %.1f cpu_ns_per_op %.1f\n", n, t1 - t0,
           (t1 - t0) / n, (c1 - c0) / n);
    return 0;
}
