/*
 * uffd-move-vs-copy: what installing and evicting a run of pages costs with
 * the two userfaultfd ways of moving pages, per page, as `ztier run` would
 * do them:
 *
 *   install  UFFDIO_COPY (a new page, charged, filled from a buffer)
 *            against UFFDIO_MOVE of a page already in memory (a recycled
 *            one, from a staging area)
 *   evict    UFFDIO_WRITEPROTECT + MADV_DONTNEED (what ztier run does)
 *            against UFFDIO_MOVE out to the staging area
 *
 * for runs of 1, 8 and 32 pages, once with the other CPU idle and once
 * with a second thread of the process running there (as the evictor or the
 * program does): a page-table change that needs a TLB flush then sends an
 * interrupt to that CPU and waits for it.
 *
 *   cc -O2 -pthread -o /tmp/uffd-move-vs-copy scripts/uffd-move-vs-copy.c
 *   /tmp/uffd-move-vs-copy            (root, or vm.unprivileged_userfaultfd=1;
 *                                      needs 2 CPUs and Linux >= 6.8 for MOVE)
 *
 * It changes no system setting.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Not in older headers. */
struct move_arg { uint64_t dst, src, len, mode; int64_t move; };
#define MOVE_IOCTL _IOWR(UFFDIO, 0x05, struct move_arg)
#define FEATURE_MOVE (1ULL << 16)
#define PAGE 4096
#define ITERS 20000

static volatile int stop;
static volatile char *busy_word;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *busy(void *arg) {
    (void)arg;
    pin(1);
    while (!stop) busy_word[0]++;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "uffd-move-vs-copy: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void reg(int fd, char *at, size_t len, uint64_t mode) {
    struct uffdio_register r = { .range = { (uintptr_t)at, len }, .mode = mode };
    if (ioctl(fd, UFFDIO_REGISTER, &r)) die("UFFDIO_REGISTER");
}

static void wp(int fd, char *at, size_t len, int on) {
    struct uffdio_writeprotect w = { .range = { (uintptr_t)at, len },
                                     .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0 };
    if (ioctl(fd, UFFDIO_WRITEPROTECT, &w)) die("UFFDIO_WRITEPROTECT");
}

static void move(int fd, char *dst, char *src, size_t len) {
    struct move_arg m = { (uintptr_t)dst, (uintptr_t)src, len, 0, 0 };
    if (ioctl(fd, MOVE_IOCTL, &m)) die("UFFDIO_MOVE");
}

static void run(int n, int with_busy) {
    size_t len = (size_t)n * PAGE;
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (fd < 0) die("userfaultfd");
    struct uffdio_api api = { .api = UFFD_API, .features = FEATURE_MOVE };
    if (ioctl(fd, UFFDIO_API, &api)) die("UFFDIO_API with UFFD_FEATURE_MOVE (Linux >= 6.8)");
    char *area = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *stage = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *buf = aligned_alloc(PAGE, len);
    if (area == MAP_FAILED || stage == MAP_FAILED || !buf) die("memory");
    madvise(area, len, MADV_NOHUGEPAGE);
    madvise(stage, len, MADV_NOHUGEPAGE);
    memset(buf, 7, len);
    memset(stage, 5, len); /* present before it is registered: nothing faults there */
    reg(fd, area, len, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
    reg(fd, stage, len, UFFDIO_REGISTER_MODE_MISSING);
    pthread_t t;
    stop = 0;
    if (with_busy && pthread_create(&t, NULL, busy, NULL)) die("pthread_create");
    usleep(10000);

    double copy_in = 0, wp_out = 0, move_in = 0, move_out = 0, t0;
    for (int i = 0; i < ITERS; i++) {
        struct uffdio_copy c = { .dst = (uintptr_t)area, .src = (uintptr_t)buf, .len = len };
        t0 = now();
        if (ioctl(fd, UFFDIO_COPY, &c)) die("UFFDIO_COPY");
        copy_in += now() - t0;
        area[0]++; /* the program touches it */
        t0 = now();
        wp(fd, area, len, 1);
        if (madvise(area, len, MADV_DONTNEED)) die("MADV_DONTNEED");
        wp_out += now() - t0;
    }
    for (int i = 0; i < ITERS; i++) {
        t0 = now();
        move(fd, area, stage, len);
        move_in += now() - t0;
        area[0]++;
        t0 = now();
        move(fd, stage, area, len);
        move_out += now() - t0;
    }
    stop = 1;
    if (with_busy) pthread_join(t, NULL);
    double k = 1e6 / ITERS / n;
    printf("%5d  %-10s  %8.2f  %8.2f  %12.2f  %8.2f\n", n, with_busy ? "busy" : "idle",
           copy_in * k, move_in * k, wp_out * k, move_out * k);
    munmap(area, len);
    munmap(stage, len);
    free(buf);
    close(fd);
}

int main(void) {
    pin(0);
    static char word[64];
    busy_word = word;
    printf("µs per page         install             evict\n");
    printf("pages  other CPU   UFFDIO_COPY  MOVE   WP+DONTNEED  MOVE\n");
    int runs[] = { 1, 8, 32 };
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 2; b++) run(runs[r], b);
    return 0;
}
