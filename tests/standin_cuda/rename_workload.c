/*
 * TEST STAND-IN workload: thread names (comm) that change while a process is
 * traced. In each phase one thread issues one RM_CONTROL ioctl on CTL (a mknod
 * copy of /dev/null named nvidiactl in the recorder's device folder: the
 * syscall layer records it, the node answers ENOTTY) and one cuMemAlloc_v2 of
 * 4096 bytes and its cuMemFree_v2 on the stand-in libcuda (the API layer):
 *
 *   rn-start          the main thread, named by prctl(PR_SET_NAME)
 *   rn-prctl          the main thread, renamed by prctl
 *   rn-prctl          a second thread, which inherits the name at its birth
 *   rn-proc           that thread again, after the main thread renamed it
 *                     through /proc/self/task/TID/comm while it waited
 *   rename_workload   the main thread after it exec'd itself (exec names it
 *                     after the file; same pid, same threads' storage)
 *
 * Usage: rename_workload CTL   (re-execs itself as: rename_workload CTL --after-exec)
 * Prints "PHASE <tid> <name>" for each phase, then "DONE"; exit 0 when every step worked.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_standin.h"

static const char *g_ctl;
static int g_fd = -1;
static int g_go[2], g_done[2];

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* one ioctl and one allocation and free, from the calling thread */
static void phase(void)
{
    unsigned char nvos54[32] = {0};
    char name[16] = {0};
    CUdeviceptr p;
    prctl(PR_GET_NAME, name);
    (void)ioctl(g_fd, 0xC020462AUL, nvos54);  /* ENOTTY from /dev/null: recorded anyway */
    if (cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p))
        die("cuMemAlloc_v2/cuMemFree_v2");
    printf("PHASE %ld %s\n", (long)syscall(SYS_gettid), name);
    fflush(stdout);
}

static void *second(void *arg)
{
    char c;
    (void)arg;
    long tid = syscall(SYS_gettid);
    phase();                                   /* rn-prctl, inherited */
    if (write(g_done[1], &tid, sizeof(tid)) != sizeof(tid) || read(g_go[0], &c, 1) != 1)
        die("pipe");
    phase();                                   /* rn-proc, set through /proc */
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    g_ctl = argv[1];
    g_fd = open(g_ctl, O_RDWR);
    if (g_fd < 0)
        die(g_ctl);
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        die("context");
    if (argc > 2 && !strcmp(argv[2], "--after-exec")) {
        phase();                               /* rename_workload, exec's name */
        printf("DONE\n");
        return 0;
    }
    prctl(PR_SET_NAME, "rn-start");
    phase();
    prctl(PR_SET_NAME, "rn-prctl");
    phase();
    pthread_t t;
    char path[64];
    if (pipe(g_go) || pipe(g_done) || pthread_create(&t, NULL, second, NULL))
        die("thread");
    long tid;
    if (read(g_done[0], &tid, sizeof(tid)) != sizeof(tid))
        die("pipe");
    snprintf(path, sizeof(path), "/proc/self/task/%ld/comm", tid);
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, "rn-proc", 7) != 7)
        die(path);
    close(fd);
    if (write(g_go[1], "x", 1) != 1 || pthread_join(t, NULL))
        die("join");
    close(g_fd);
    char *again[] = {argv[0], (char *)g_ctl, "--after-exec", NULL};
    execv(argv[0], again);  /* exec names the thread after this file */
    die("execv");
}
