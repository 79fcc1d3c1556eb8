/* The descriptors a program sees are the ones it would see natively:
 * those of ztier's library (its userfaultfd, eventfd, control socket,
 * statistics file) are neither listed nor probed. A 48 MiB heap of
 * patterned words (cold under a 16M budget), then the process's open
 * descriptors as programs find them:
 * - listed with readdir from /proc/self/fd, /dev/fd, /proc/self/fdinfo
 *   and /proc/thread-self/fd, and with getdents64 (glibc's function, and
 *   the raw system call through syscall(2) with a buffer of one record,
 *   as CPython's subprocess reads the directory in a forked child);
 * - probed number by number below 1024 with fstat, fstatat and statx
 *   (AT_EMPTY_PATH), fcntl(F_GETFD) and dup, as CPython's
 *   test_subprocess (fd_status.py) and daemons do;
 * - closed number by number from 3: how many closes succeeded.
 * Then the heap is read back: the library still serves it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WORDS ((48u << 20) / 8)
#define MAXFD 1024

static uint64_t *a;

static int heap_ok(void) {
    for (uint64_t i = 0; i < WORDS; i++)
        if (a[i] != i * 2654435761u) return 0;
    return 1;
}

/* The numbers in directory `path` (its own descriptor left out), by readdir. */
static void by_readdir(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        printf("%s: %s\n", path, strerror(errno));
        return;
    }
    char seen[MAXFD] = {0};
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd != dirfd(d) && fd >= 0 && fd < MAXFD) seen[fd] = 1;
        else if (e->d_name[0] != '.' && fd != dirfd(d)) printf("%s: %s\n", path, e->d_name);
    }
    printf("%s by readdir:", path);
    for (int i = 0; i < MAXFD; i++)
        if (seen[i]) printf(" %d", i);
    printf("\n");
    closedir(d);
}

struct rec {
    uint64_t ino;
    int64_t off;
    uint16_t reclen;
    uint8_t type;
    char name[];
};

/* The same by getdents64: glibc's function (raw = 0) with a page of
 * buffer, or the system call through syscall(2) with one record's room. */
static void by_getdents(const char *path, int raw) {
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        printf("%s: %s\n", path, strerror(errno));
        return;
    }
    char buf[4096] __attribute__((aligned(8)));
    size_t room = raw ? 40 : sizeof buf;
    printf("%s by %s:", path, raw ? "syscall(SYS_getdents64)" : "getdents64");
    for (;;) {
        long n = raw ? syscall(SYS_getdents64, dir, buf, room) : (long)getdents64(dir, buf, room);
        if (n < 0) {
            printf(" error %s", strerror(errno));
            break;
        }
        if (n == 0) break;
        for (long at = 0; at < n;) {
            struct rec *r = (struct rec *)(buf + at);
            if (r->name[0] != '.' && atoi(r->name) != dir) printf(" %s", r->name);
            at += r->reclen;
        }
    }
    printf("\n");
    close(dir);
}

static void probe(const char *how, int (*open_)(int)) {
    printf("%s:", how);
    for (int fd = 0; fd < MAXFD; fd++)
        if (open_(fd)) printf(" %d", fd);
    printf("\n");
}

static int by_fstat(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0;
}
static int by_fstatat(int fd) {
    struct stat st;
    return fstatat(fd, "", &st, AT_EMPTY_PATH) == 0;
}
static int by_statx(int fd) {
    struct statx st;
    return statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &st) == 0;
}
static int by_fcntl(int fd) { return fcntl(fd, F_GETFD) >= 0; }
static int by_dup(int fd) {
    int d = dup(fd);
    if (d < 0) return 0;
    close(d);
    return 1;
}

int main(void) {
    a = malloc(WORDS * 8);
    if (!a) return 1;
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 2654435761u;
    by_readdir("/proc/self/fd");
    by_readdir("/dev/fd");
    by_readdir("/proc/self/fdinfo");
    by_readdir("/proc/thread-self/fd");
    by_getdents("/proc/self/fd", 0);
    by_getdents("/proc/self/fd", 1);
    probe("fstat", by_fstat);
    probe("fstatat", by_fstatat);
    probe("statx", by_statx);
    probe("fcntl(F_GETFD)", by_fcntl);
    probe("dup", by_dup);
    int closed = 0;
    for (int fd = 3; fd < MAXFD; fd++) closed += close(fd) == 0;
    printf("closes that succeeded from 3: %d\n", closed);
    printf("heap %s\n", heap_ok() ? "intact" : "CHANGED");
    return 0;
}
