/* Signal handlers that make system calls on cold heap memory while their
 * thread is blocked in a system call: one thread blocked in glibc's
 * read() (which ztier enters directly), one in a read() made with the
 * program's own syscall instruction (which dispatch catches). Each
 * SIGUSR1 handler writes one cold heap page to a pipe, half through
 * glibc's write() and half with its own syscall instruction; the main
 * thread reads it back (with a timeout) and checks it. Prints counts;
 * the same natively. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BIG (40u << 20)
#define PAGES 48
#define ROUNDS 24

static int in_direct[2], in_own[2], out[2];
static unsigned char *cold;
static volatile int next_page, failed;

static long own_syscall(long nr, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static void on_usr1(int sig) {
    (void)sig;
    int e = errno;
    unsigned char *p = cold + 4096 * (size_t)(next_page % PAGES);
    if (write(out[1], p, 2048) != 2048) failed++;
    if (own_syscall(SYS_write, out[1], (long)(p + 2048), 2048) != 2048) failed++;
    next_page++;
    errno = e;
}

static void *blocked_direct(void *arg) {
    (void)arg;
    char c;
    while (read(in_direct[0], &c, 1) != 1) {
    }
    return NULL;
}

static void *blocked_own(void *arg) {
    (void)arg;
    char c;
    while (own_syscall(SYS_read, in_own[0], (long)&c, 1) != 1) {
    }
    return NULL;
}

/* Reads n bytes from out, waiting at most 5 s; returns the bytes read. */
static size_t read_back(unsigned char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = { out[0], POLLIN, 0 };
        if (poll(&pf, 1, 5000) != 1) break;
        ssize_t r = read(out[0], buf + got, n - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

int main(void) {
    uint64_t *big = malloc(BIG);
    cold = malloc(PAGES * 4096);
    unsigned char *buf = malloc(4096);
    if (!big || !cold || !buf) { perror("malloc"); return 2; }
    /* The budget's protected part fills up with big's pages first, so
     * that cold's pages join the probation that each pass runs through. */
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i++) big[i] = i;
    for (size_t i = 0; i < BIG / 8; i += 7) s += big[i];
    for (size_t i = 0; i < PAGES * 4096; i++) cold[i] = (unsigned char)(i * 7 + (i >> 12));
    if (pipe(in_direct) || pipe(in_own) || pipe(out)) { perror("pipe"); return 2; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL)) { perror("sigaction"); return 2; }
    pthread_t t[2];
    if (pthread_create(&t[0], NULL, blocked_direct, NULL) || pthread_create(&t[1], NULL, blocked_own, NULL)) {
        perror("pthread_create");
        return 2;
    }
    int matched = 0, short_reads = 0;
    for (int k = 0; k < ROUNDS; k++) {
        /* The heap page the handler will write goes cold meanwhile. */
        for (size_t i = 0; i < BIG / 8; i++) big[i] = i * 2654435761u + (uint64_t)k;
        for (size_t i = 0; i < BIG / 8; i += 7) s += big[i];
        usleep(10000);
        int page = next_page % PAGES;
        pthread_kill(t[k % 2], SIGUSR1);
        if (read_back(buf, 4096) != 4096) {
            short_reads++;
            continue;
        }
        matched += memcmp(buf, cold + 4096 * (size_t)page, 4096) == 0;
    }
    if (write(in_direct[1], "x", 1) != 1 || write(in_own[1], "x", 1) != 1) { perror("write"); return 2; }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    printf("handler pages matched %d of %d, short %d, failed calls %d, churn %llu\n", matched, ROUNDS, short_reads,
           failed, (unsigned long long)s);
    return 0;
}
