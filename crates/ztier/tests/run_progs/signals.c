/* A program with signal handling of its own, for `--fault-path signal`
 * (where ztier serves faults in a SIGBUS handler of its own):
 *
 *  - it installs its own SIGBUS handler first, and reads it back later;
 *  - it raises a real SIGBUS (a store past the end of a truncated file
 *    mapping), which its handler must get, and leaves it by siglongjmp;
 *  - it blocks every signal (SIGBUS too) and then reads evicted memory;
 *  - a SIGSEGV handler whose mask blocks every signal reads evicted
 *    memory while it runs;
 *  - two threads, one with every signal blocked, fill and read back
 *    memory larger than the budget.
 *
 * Prints checksums and what the handlers saw; the same natively. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MB (1u << 20)
#define BIG (48u * MB)

static sigjmp_buf jump;
static volatile sig_atomic_t bus_seen, segv_seen;
static uint64_t *heap;
static volatile uint64_t in_handler;

static void on_bus(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)si; (void)ctx;
    bus_seen++;
    siglongjmp(jump, 1);
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)si; (void)ctx;
    /* Evicted memory read inside a handler that blocks every signal. */
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i += 512) s += heap[i];
    in_handler = s;
    segv_seen++;
    siglongjmp(jump, 2);
}

static uint64_t fill(uint64_t *a, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) a[i] = i * 2654435761u + seed;
    uint64_t s = 0;
    for (size_t i = 0; i < words; i += 3) s += a[i];
    return s;
}

static void *worker(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uint64_t *a = malloc(BIG);
    if (!a) { perror("malloc"); exit(2); }
    *(uint64_t *)arg = fill(a, BIG / 8, 7);
    free(a);
    return NULL;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL)) { perror("sigaction"); return 2; }

    heap = malloc(BIG);
    if (!heap) { perror("malloc"); return 2; }
    printf("fill: %llu\n", (unsigned long long)fill(heap, BIG / 8, 1));

    /* A real SIGBUS: past the end of a file mapping. */
    char path[4096];
    snprintf(path, sizeof path, "%s/short.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 4096)) { perror(path); return 2; }
    char *map = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 2; }
    if (sigsetjmp(jump, 1) == 0) {
        map[2 * 4096] = 1;
        printf("no SIGBUS past the end of the file\n");
    }
    printf("program's SIGBUS handler ran %d time(s)\n", (int)bus_seen);
    munmap(map, 3 * 4096);
    close(fd);
    unlink(path);

    /* Its handler is still what it installed. */
    struct sigaction now;
    sigaction(SIGBUS, NULL, &now);
    printf("SIGBUS handler is the program's: %s\n", now.sa_sigaction == on_bus ? "yes" : "no");

    /* Every signal blocked, evicted memory read. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i += 5) s += heap[i];
    sigprocmask(SIG_SETMASK, &old, NULL);
    printf("read with signals blocked: %llu\n", (unsigned long long)s);

    /* Evicted memory read inside a handler that blocks every signal. */
    uint64_t *other = malloc(BIG);
    if (!other) { perror("malloc"); return 2; }
    printf("fill other: %llu\n", (unsigned long long)fill(other, BIG / 8, 3));
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    if (sigsetjmp(jump, 1) == 0) {
        int *volatile bad = (int *)16;
        *(volatile int *)bad = 1;
        printf("no SIGSEGV\n");
    }
    printf("SIGSEGV handler ran %d time(s), read %llu\n", (int)segv_seen, (unsigned long long)in_handler);

    pthread_t t;
    uint64_t ts = 0;
    pthread_create(&t, NULL, worker, &ts);
    uint64_t ms = fill(other, BIG / 8, 5);
    pthread_join(t, NULL);
    printf("threads: %llu %llu\n", (unsigned long long)ts, (unsigned long long)ms);
    free(other);
    free(heap);
    return 0;
}
