/*
 * TEST ONLY: a hostile FUSE filesystem for gputrace's recorder tests.
 *
 * One file, "f". FLUSH (sent on every close of an fd on it) is answered only for
 * the processes that opened the file; a FLUSH from anyone else is never answered,
 * which leaves the closing thread in uninterruptible sleep (beyond SIGKILL) until
 * this server exits or the connection is aborted. A traced process can use such a
 * file to freeze whoever takes one of its fds: this is how the recorder's fd check
 * is tested. Each unanswered FLUSH is logged to stderr as "HUNG FLUSH pid N".
 *
 * With CONTENT, "f" holds that file's bytes (read once at start: a library a traced
 * process can map); with HANG, only a FLUSH from a process whose command line holds
 * the text HANG is left unanswered, whoever opened the file (the recorder's compile
 * worker opens the libraries it reads itself).
 *
 * Usage: noflushfs MOUNTPOINT [CONTENT [HANG]]   (foreground, single-threaded;
 * unmount with fusermount3 -u, or kill it: that aborts the hung requests)
 */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_INO 2
#define MAX_OPENERS 64

static pid_t openers[MAX_OPENERS];
static int n_openers;
static char *content;
static size_t content_len;
static const char *hang;

static void fill(fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_mode = ino == FUSE_ROOT_ID ? (S_IFDIR | 0755) : (S_IFREG | 0666);
    st->st_nlink = ino == FUSE_ROOT_ID ? 2 : 1;
    st->st_size = ino == FUSE_ROOT_ID ? 0 : (off_t)content_len;
}

static pid_t tgid_of(pid_t tid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)tid);
    FILE *f = fopen(path, "r");
    pid_t out = tid;
    if (!f)
        return out;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Tgid:", 5)) {
            out = (pid_t)atoi(line + 5);
            break;
        }
    fclose(f);
    return out;
}

static void nf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    if (parent != FUSE_ROOT_ID || strcmp(name, "f")) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = FILE_INO;
    e.attr_timeout = e.entry_timeout = 3600.0;
    fill(FILE_INO, &e.attr);
    fuse_reply_entry(req, &e);
}

static void nf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    if (ino != FUSE_ROOT_ID && ino != FILE_INO) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct stat st;
    fill(ino, &st);
    fuse_reply_attr(req, &st, 3600.0);
}

static void nf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (ino != FILE_INO) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (n_openers < MAX_OPENERS)
        openers[n_openers++] = tgid_of(fuse_req_ctx(req)->pid);
    fi->direct_io = content == NULL; /* with content: page cache, so it can be mapped */
    fuse_reply_open(req, fi);
}

static void nf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    if (off < 0 || (size_t)off >= content_len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    size_t n = content_len - (size_t)off;
    fuse_reply_buf(req, content + off, n < size ? n : size);
}

static int cmdline_has(pid_t pid, const char *text)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!buf[i])
            buf[i] = ' ';
    buf[n] = 0;
    return strstr(buf, text) != NULL;
}

static void nf_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    pid_t pid = tgid_of(fuse_req_ctx(req)->pid);
    if (hang && !cmdline_has(pid, hang)) {
        fuse_reply_err(req, 0);
        return;
    }
    for (int i = 0; i < n_openers && !hang; i++)
        if (openers[i] == pid) {
            fuse_reply_err(req, 0);
            return;
        }
    fprintf(stderr, "HUNG FLUSH pid %d\n", (int)pid);
    /* never answered: the closing thread waits until this server goes away */
}

static void nf_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino, (void)fi;
    fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = nf_lookup,
    .getattr = nf_getattr,
    .open = nf_open,
    .read = nf_read,
    .flush = nf_flush,
    .release = nf_release,
};

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: noflushfs MOUNTPOINT [CONTENT [HANG]]\n");
        return 2;
    }
    if (argc >= 3) {
        FILE *f = fopen(argv[2], "rb");
        if (!f || fseek(f, 0, SEEK_END) || (content_len = (size_t)ftell(f)) == 0
            || fseek(f, 0, SEEK_SET) || !(content = malloc(content_len))
            || fread(content, 1, content_len, f) != content_len) {
            fprintf(stderr, "noflushfs: cannot read %s\n", argv[2]);
            return 2;
        }
        fclose(f);
    }
    if (argc == 4)
        hang = argv[3];
    char *fargv[] = {argv[0], NULL};
    struct fuse_args args = FUSE_ARGS_INIT(1, fargv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se)
        return 1;
    if (fuse_set_signal_handlers(se) || fuse_session_mount(se, argv[1])) {
        fuse_session_destroy(se);
        return 1;
    }
    setvbuf(stderr, NULL, _IOLBF, 0);
    fprintf(stderr, "MOUNTED\n");
    int rc = fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    fuse_opt_free_args(&args);
    return rc ? 1 : 0;
}
