/* glibc starts the thread of a SIGEV_THREAD timer by its own internal
 * pthread_create, which the library does not see. The timer's function
 * writes 16 cold heap pages to a pipe; the main thread checks what
 * arrived. Natively and in full mode all 16 arrive; where system calls
 * are caught, that thread runs without dispatch (see rawclone.c). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define HEAP (48u << 20)
static uint8_t *heap;
static int fds[2];
static volatile int done, ok;
static void fire(union sigval v) {
    (void)v;
    int n = 0;
    for (int k = 0; k < 16; k++) if (write(fds[1], heap + (size_t)k * 4096, 4096) == 4096) n++;
    ok = n;
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}
int main(void) {
    heap = malloc(HEAP);
    for (size_t i = 0; i < HEAP; i++) heap[i] = (uint8_t)(i * 2654435761u >> 13);
    uint8_t *other = malloc(HEAP);
    memset(other, 1, HEAP);
    if (pipe(fds)) return 1;
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD;
    ev.sigev_notify_function = fire;
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t)) { perror("timer_create"); return 1; }
    struct itimerspec its = {0};
    its.it_value.tv_nsec = 1000000;
    timer_settime(t, 0, &its, 0);
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) usleep(1000);
    if (ok != 16) {
        printf("the timer thread wrote %d of 16 pages\n", ok);
        return 1;
    }
    uint64_t check = 0;
    for (int k = 0; k < 16; k++) {
        uint8_t page[4096];
        if (read(fds[0], page, 4096) != 4096 || memcmp(page, heap + (size_t)k * 4096, 4096)) {
            puts("pipe data differs");
            return 1;
        }
        check += page[9];
    }
    printf("the timer thread wrote 16 pages, check %llu, other %d\n", (unsigned long long)check, other[5]);
    return 0;
}
