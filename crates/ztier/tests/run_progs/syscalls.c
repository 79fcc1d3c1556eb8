/* System calls whose memory arguments lie in evicted heap pages: with a
 * user-mode-only userfaultfd the kernel's own access to such a page fails
 * with EFAULT unless ztier brings it back first. A 32 MiB buffer is filled,
 * pushed out by 32 MiB more, then written to a file, read back into
 * another evicted buffer, sent through a pipe with writev/readv and through
 * a socket pair with sendmsg/recvmsg (iovecs and msghdr in the heap), a
 * file opened by a path and stat'ed into heap memory, a child run by
 * execv with a heap argv, and one by system(). Prints checksums; the
 * same output is expected natively and under `ztier run`. argv[1]: a directory for the file. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1 << 20)

static uint64_t sum(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    uint64_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Touches `n` bytes of fresh memory so that older pages are evicted. */
static void push_out(size_t n) {
    unsigned char *p = malloc(n);
    fill(p, n, 99);
    printf("push %016llx\n", (unsigned long long)sum(p, 4096));
    free(p);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t n = 32 * MB;
    unsigned char *a = malloc(n), *b = malloc(n);
    fill(a, n, 1);
    printf("a %016llx\n", (unsigned long long)sum(a, n));
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/data.bin", argv[1]);
    push_out(48 * MB);

    /* write() from and read() into evicted buffers. */
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    if (fd < 0) die("open");
    if (write(fd, a, n) != (ssize_t)n) die("write");
    memset(b, 7, n);
    push_out(48 * MB);
    if (pread(fd, b, n, 0) != (ssize_t)n) die("pread");
    printf("read back %016llx\n", (unsigned long long)sum(b, n));
    struct stat *st = malloc(sizeof *st);
    push_out(48 * MB);
    if (fstat(fd, st) != 0) die("fstat");
    printf("size %lld\n", (long long)st->st_size);
    close(fd);

    /* writev/readv through a pipe, iovecs in the heap. */
    int pp[2];
    if (pipe(pp) != 0) die("pipe");
    struct iovec *iov = malloc(4 * sizeof *iov);
    for (int k = 0; k < 4; k++) iov[k] = (struct iovec){a + k * MB + 100, 10000};
    push_out(48 * MB);
    if (writev(pp[1], iov, 4) != 40000) die("writev");
    for (int k = 0; k < 4; k++) iov[k] = (struct iovec){b + (8 + k) * MB, 10000};
    push_out(48 * MB);
    if (readv(pp[0], iov, 4) != 40000) die("readv");
    uint64_t h = 0;
    for (int k = 0; k < 4; k++) h ^= sum(b + (8 + k) * MB, 10000) + k;
    printf("pipe %016llx\n", (unsigned long long)h);

    /* sendmsg/recvmsg on a socket pair, msghdr and iovecs in the heap. */
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sp) != 0) die("socketpair");
    struct msghdr *m = calloc(1, sizeof *m);
    m->msg_iov = iov;
    m->msg_iovlen = 2;
    iov[0] = (struct iovec){a + 20 * MB, 3000};
    iov[1] = (struct iovec){a + 21 * MB, 3000};
    push_out(48 * MB);
    if (sendmsg(sp[0], m, 0) != 6000) die("sendmsg");
    iov[0] = (struct iovec){b + 20 * MB, 6000};
    m->msg_iovlen = 1;
    push_out(48 * MB);
    if (recvmsg(sp[1], m, 0) != 6000) die("recvmsg");
    printf("dgram %016llx\n", (unsigned long long)sum(b + 20 * MB, 6000));

    /* A child run with a heap argv (execve reads the strings). */
    char **args = malloc(4 * sizeof *args);
    args[0] = strdup("sh");
    args[1] = strdup("-c");
    args[2] = strdup("echo child says hello");
    args[3] = NULL;
    fflush(stdout);
    push_out(48 * MB);
    pid_t c = fork();
    if (c == 0) {
        execv("/bin/sh", args);
        _exit(127);
    }
    int ws;
    waitpid(c, &ws, 0);
    printf("child exit %d\n", WEXITSTATUS(ws));
    /* system(): posix_spawn's vfork-like clone; the child execs the shell
     * with the environment. */
    fflush(stdout);
    push_out(48 * MB);
    printf("system %d\n", system("echo spawned by system"));

    /* open() by a path that was evicted, read the first page back. */
    push_out(48 * MB);
    fd = open(path, O_RDONLY);
    if (fd < 0) die("open again");
    if (read(fd, b, 4096) != 4096) die("read");
    printf("first page %016llx\n", (unsigned long long)sum(b, 4096));
    close(fd);
    unlink(path);
    return 0;
}
