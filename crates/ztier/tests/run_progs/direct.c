/* System calls made through glibc's wrappers that ztier enters directly
 * (read, write, pread64, pwrite64, lseek, close), on buffers that go
 * cold under the budget, many times over; and a thread blocked in read()
 * on a pipe, cancelled with pthread_cancel (glibc's cancellation must
 * still reach it); and timeouts: a read() (entered directly), a readv()
 * and a poll() (caught by dispatch) on an empty pipe, each left from a
 * SIGALRM handler by siglongjmp (or plain longjmp, which keeps the
 * handler's signal mask), after which calls on cold memory must still
 * work. Prints checksums; the same natively. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#define MB (1u << 20)
#define FILE_BYTES (8u * MB)
#define BIG (40u * MB)
#define CALLS 20000

static int fds[2];
static sigjmp_buf timeout;
static jmp_buf plain;
static volatile int use_plain;

static void on_alarm(int sig) {
    (void)sig;
    if (use_plain) longjmp(plain, 1);
    siglongjmp(timeout, 1);
}

static uint64_t churn(uint64_t *a, uint64_t seed);

static void arm(void) {
    struct itimerval it = { { 0, 0 }, { 0, 50000 } };
    setitimer(ITIMER_REAL, &it, NULL);
}

/* After a timeout: a write and a readv on memory gone cold meanwhile,
 * with no other call of the thread in between. */
static int after_timeout(int *p, unsigned char *src, unsigned char *dst, uint64_t *big, size_t at, uint64_t seed) {
    (void)churn(big, seed);
    struct iovec w = { src + at * 4096, 4096 };
    if (writev(p[1], &w, 1) != 4096) { perror("writev after timeout"); return -1; }
    struct iovec v = { dst + (at + 3) * 4096, 4096 };
    if (readv(p[0], &v, 1) != 4096) { perror("readv after timeout"); return -1; }
    return memcmp(src + at * 4096, dst + (at + 3) * 4096, 4096) == 0;
}

static void *reader(void *arg) {
    (void)arg;
    char *buf = malloc(1 << 16);
    for (;;)
        if (read(fds[0], buf, 1 << 16) <= 0) break;
    return NULL;
}

static uint64_t churn(uint64_t *a, uint64_t seed) {
    for (size_t i = 0; i < BIG / 8; i++) a[i] = i * 2654435761u + seed;
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i += 7) s += a[i];
    return s;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/direct.bin", dir);
    unsigned char *src = malloc(FILE_BYTES), *dst = malloc(FILE_BYTES);
    uint64_t *big = malloc(BIG);
    if (!src || !dst || !big) { perror("malloc"); return 2; }
    for (size_t i = 0; i < FILE_BYTES; i++) src[i] = (unsigned char)(i * 131 + (i >> 12));

    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) { perror("open"); return 2; }
    /* src goes cold while big is filled; then written out 4 KiB a call. */
    uint64_t s = churn(big, 1);
    for (size_t off = 0; off < FILE_BYTES; off += 4096)
        if (write(fd, src + off, 4096) != 4096) { perror("write"); return 2; }
    s += churn(big, 2);
    /* Random reads into a cold buffer, then random rewrites. */
    uint64_t x = 88172645463325252u, sum = 0;
    for (int k = 0; k < CALLS; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t page = x % (FILE_BYTES / 4096);
        if (pread64(fd, dst + page * 4096, 4096, (off_t)page * 4096) != 4096) { perror("pread64"); return 2; }
        sum += dst[page * 4096 + (k & 4095)];
        if (k % 4 == 0 && pwrite64(fd, src + page * 4096, 4096, (off_t)page * 4096) != 4096) {
            perror("pwrite64");
            return 2;
        }
        if (k % 1000 == 999) s += churn(big, 3 + k);
    }
    if (lseek(fd, 0, SEEK_END) != (off_t)FILE_BYTES) { perror("lseek"); return 2; }
    if (lseek(fd, 0, SEEK_SET) != 0) { perror("lseek"); return 2; }
    for (size_t off = 0; off < FILE_BYTES; off += 4096)
        if (read(fd, dst + off, 4096) != 4096) { perror("read"); return 2; }
    if (close(fd)) { perror("close"); return 2; }
    printf("same: %d, sum %llu, churn %llu\n", memcmp(src, dst, FILE_BYTES) == 0, (unsigned long long)sum,
           (unsigned long long)s);
    unlink(path);

    /* A read with a timeout, left by siglongjmp; then calls on memory
     * that went cold meanwhile, with no other call in between. */
    int p2[2];
    if (pipe(p2)) { perror("pipe"); return 2; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    if (sigaction(SIGALRM, &sa, NULL)) { perror("sigaction"); return 2; }
    char *small = malloc(16); /* from the arena: pinned for the read */
    if (!small) { perror("malloc"); return 2; }
    if (sigsetjmp(timeout, 1) == 0) {
        struct itimerval it = { { 0, 0 }, { 0, 50000 } };
        setitimer(ITIMER_REAL, &it, NULL);
        if (read(p2[0], small, 16) >= 0) { puts("read returned"); return 2; }
        perror("read");
        return 2;
    }
    uint64_t s2 = churn(big, 77);
    if (write(p2[1], src + 5 * 4096, 4096) != 4096) { perror("write after timeout"); return 2; }
    struct iovec v = { dst + 9 * 4096, 4096 };
    if (readv(p2[0], &v, 1) != 4096) { perror("readv after timeout"); return 2; }
    printf("after the timeout: %d, churn %llu\n", memcmp(src + 5 * 4096, dst + 9 * 4096, 4096) == 0,
           (unsigned long long)s2);
    /* The same around calls that dispatch catches (not entered directly). */
    if (sigsetjmp(timeout, 1) == 0) {
        arm();
        struct iovec v = { small, 16 };
        readv(p2[0], &v, 1);
        puts("readv returned");
        return 2;
    }
    int ok = after_timeout(p2, src, dst, big, 20, 78);
    if (ok < 0) return 2;
    printf("after the readv timeout: %d\n", ok);
    use_plain = 1;
    if (setjmp(plain) == 0) {
        arm();
        struct pollfd pf = { p2[0], POLLIN, 0 };
        poll(&pf, 1, -1);
        puts("poll returned");
        return 2;
    }
    ok = after_timeout(p2, src, dst, big, 40, 79);
    if (ok < 0) return 2;
    printf("after the poll timeout: %d\n", ok);

    if (pipe(fds)) { perror("pipe"); return 2; }
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL)) { perror("pthread_create"); return 2; }
    usleep(100000);
    pthread_cancel(t);
    void *res;
    pthread_join(t, &res);
    printf("reader cancelled: %d\n", res == PTHREAD_CANCELED);
    return 0;
}
