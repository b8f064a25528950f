/* TEST STAND-IN program: a zombie that still holds GPU memory. Opens the stand-in
 * driver (cuInit, a context), prints "READY <pid>", waits for a line on stdin, then
 * allocates BYTES with cuMemAlloc_v2 and starts a thread; the main thread exits alone
 * (pthread_exit), so `ps` shows the process <defunct> while the thread keeps its
 * device files, its RM clients and the memory. The thread waits until the kernel
 * shows the main thread a zombie, prints "ZOMBIE <pid>", and exits the process when
 * stdin reaches its end (the memory is left to the driver's teardown). Linked by
 * link_program (standin_cuda.py) for tests/live/test_record_inherited_fds.py. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cuda_standin.h"

/* The state letter of /proc/PID/stat (the field after the parenthesized name). */
static char state_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

static void *keeper(void *arg)
{
    (void)arg;
    pid_t pid = getpid();
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 10000 && state_of(pid) != 'Z'; i++) /* at most 10 s */
        nanosleep(&ms, NULL);
    printf("ZOMBIE %d %c\n", (int)pid, state_of(pid));
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        ;
    exit(0);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    size_t bytes = strtoull(argv[1], NULL, 0);
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 3;
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 4;
    if (cuMemAlloc_v2(&p, bytes))
        return 5;
    pthread_t t;
    if (pthread_create(&t, NULL, keeper, NULL))
        return 6;
    pthread_exit(NULL);
}
