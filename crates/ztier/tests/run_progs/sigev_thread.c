/* Threads glibc starts by its own internal pthread_create, which the
 * library does not see: the helper and notification threads of a
 * SIGEV_THREAD timer, and POSIX AIO's worker threads. A periodic timer's
 * function reads a cold heap page and writes another to a pipe at each
 * of 40 expirations (the main thread checks each), and aio_read fills
 * cold heap buffers
 * from a file (checked against the file). Natively and in every mode of
 * `ztier run` the same output; where system calls are caught, those
 * threads need dispatch from their first instruction, and their DTVs
 * (glibc's calloc, the library's arena) must not be evictable. Linked
 * with ownalloc.c too, a malloc of the program's own. */
#define _GNU_SOURCE
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HEAP (48u << 20)
#define TICKS 40
static uint8_t *heap, *other;
static int fds[2];
static volatile int fired, wrote;
static volatile uint64_t loads;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Makes the heap cold: under a 16M budget, writing 48 MiB elsewhere
 * evicts it. */
static void chill(int round) { memset(other, round, HEAP); }

static void fire(union sigval v) {
    (void)v;
    /* Expirations may overlap (each gets a thread): one at a time, in order. */
    pthread_mutex_lock(&lock);
    int k = fired;
    /* A large block: the library's page allocator and its lock, from
     * glibc's thread. */
    uint8_t *big = malloc(1 << 20);
    memset(big, k, 1 << 20);
    free(big);
    if (k < TICKS) {
        /* A cold heap page read here: a fault in glibc's thread itself. */
        loads += heap[(size_t)(k * 89 + 5) * 4096 + 17];
        if (write(fds[1], heap + (size_t)k * 97 * 4096, 4096) == 4096) wrote++;
        fired = k + 1;
    }
    pthread_mutex_unlock(&lock);
}

int main(void) {
    heap = malloc(HEAP);
    other = malloc(HEAP);
    for (size_t i = 0; i < HEAP; i++) heap[i] = (uint8_t)(i * 2654435761u >> 13);
    chill(1);
    if (pipe(fds)) return 1;
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD;
    ev.sigev_notify_function = fire;
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t)) { perror("timer_create"); return 1; }
    struct itimerspec its = {0};
    its.it_value.tv_nsec = 2000000;
    its.it_interval.tv_nsec = 2000000;
    timer_settime(t, 0, &its, 0);
    uint64_t check = 0;
    for (int k = 0; k < TICKS; k++) {
        uint8_t page[4096];
        if (read(fds[0], page, 4096) != 4096) { puts("short read"); return 1; }
        if (memcmp(page, heap + (size_t)k * 97 * 4096, 4096)) { printf("tick %d: pipe data differs\n", k); return 1; }
        check += page[9];
        if (k % 8 == 7) chill(k);
    }
    timer_delete(t);
    pthread_mutex_lock(&lock);
    printf("timer: %d pages written by its threads, check %llu, loads %llu\n", wrote, (unsigned long long)check,
           (unsigned long long)loads);
    pthread_mutex_unlock(&lock);

    /* POSIX AIO into cold buffers. */
    char path[] = "/tmp/ztier-sigev-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    unlink(path);
    static uint8_t data[1 << 20];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 + 7);
    if (write(fd, data, sizeof data) != (ssize_t)sizeof data) return 1;
    uint64_t sum = 0;
    for (int r = 0; r < 8; r++) {
        uint8_t *buf = heap + (size_t)r * (4u << 20);
        chill(r + 50);
        struct aiocb cb = {0};
        cb.aio_fildes = fd;
        cb.aio_buf = buf;
        cb.aio_nbytes = 64 << 10;
        cb.aio_offset = (off_t)r * (64 << 10);
        if (aio_read(&cb)) { perror("aio_read"); return 1; }
        const struct aiocb *list[1] = {&cb};
        while (aio_error(&cb) == EINPROGRESS) aio_suspend(list, 1, 0);
        ssize_t n = aio_return(&cb);
        if (n != 64 << 10 || memcmp(buf, data + (size_t)r * (64 << 10), 64 << 10)) {
            printf("aio read %d: %zd bytes, %s\n", r, n, n > 0 ? "data differs" : strerror(aio_error(&cb)));
            return 1;
        }
        sum += buf[100];
    }
    printf("aio: 8 reads into cold buffers, sum %llu\n", (unsigned long long)sum);
    return 0;
}
