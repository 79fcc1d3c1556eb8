/* A thread made with the program's own clone() (not pthread_create)
 * writes 16 cold heap pages to a pipe with write(2), then reads the whole
 * heap. The main thread checks what arrived. Where system calls are
 * caught (user-mode-only, --fault-path signal) such a thread runs without
 * dispatch; its writes go through the library's export of write(), which
 * pins their pages. If one fails (EFAULT), the program says how many
 * pages it wrote and exits 1. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEAP (48u << 20)
static uint8_t *heap;
static volatile uint64_t sum;
static volatile int done, wrote_ok;
static int fds[2];

static int child(void *arg) {
    (void)arg;
    /* The heap went cold when `other` was written after it. */
    int ok = 0;
    for (int k = 0; k < 16; k++) {
        ssize_t w = write(fds[1], heap + (size_t)k * 4096, 4096);
        if (w != 4096) break;
        ok++;
    }
    wrote_ok = ok;
    uint64_t s = 0;
    for (size_t i = 0; i < HEAP; i += 4096) s += heap[i] + heap[i + 4095];
    sum = s;
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    return 0;
}

int main(void) {
    heap = malloc(HEAP);
    for (size_t i = 0; i < HEAP; i++) heap[i] = (uint8_t)(i * 2654435761u >> 13);
    uint8_t *other = malloc(HEAP);
    memset(other, 1, HEAP);
    if (pipe(fds)) return 1;
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    size_t sz = 1 << 20;
    char *stack = mmap(0, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    if (clone(child, stack + sz, flags, 0) < 0) { perror("clone"); return 1; }
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) sched_yield();
    uint64_t check = 0;
    if (wrote_ok != 16) { printf("the thread wrote %d of 16 pages\n", wrote_ok); return 1; }
    for (int k = 0; k < 16; k++) {
        uint8_t page[4096];
        if (read(fds[0], page, 4096) != 4096) { puts("short read"); return 1; }
        if (memcmp(page, heap + (size_t)k * 4096, 4096)) { puts("pipe data differs"); return 1; }
        check += page[7];
    }
    printf("sum %llu wrote %s check %llu other %d\n", (unsigned long long)sum, "ok",
           (unsigned long long)check, other[HEAP - 1]);
    return 0;
}
