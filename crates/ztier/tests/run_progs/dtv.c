/* Where do new threads keep their DTV (glibc's table of thread-local
 * storage blocks, read by every __tls_get_addr)? Under `ztier run` it
 * must not be arena memory: the library reads its thread-locals while it
 * holds the lock the fault handler needs, so an evicted DTV deadlocked
 * the handler. Finds the arena as the one run of adjacent anonymous
 * mappings of 64 GiB or more (its parts differ in whether a core dump
 * takes them); natively there is none. Each thread also writes and reads a
 * thread-local of its own. The last two threads are made by glibc's own
 * pthread_create, looked up in libc.so.6 itself, as a library loaded
 * after ztier's finds it with dlsym(RTLD_NEXT) (jemalloc's background
 * thread in redis): the library's pthread_create never sees them. Prints
 * one line per thread (same natively). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 10
#define GLIBCS 2

static uintptr_t arena_lo, arena_hi;
static __thread long mine[64];
static const char *verdict[THREADS];

static void find_arena(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uintptr_t run_lo = 0, run_hi = 0;
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        char perms[8];
        unsigned long off;
        if (sscanf(line, "%lx-%lx %7s %lx", &lo, &hi, perms, &off) != 4 || strncmp(perms, "rw", 2) != 0 ||
            strchr(line, '/') != NULL) {
            run_lo = run_hi = 0;
            continue;
        }
        if (lo != run_hi) run_lo = lo;
        run_hi = hi;
        if (run_hi - run_lo >= (64ul << 30)) {
            arena_lo = run_lo;
            arena_hi = run_hi;
        }
    }
    if (f) fclose(f);
}

static void *work(void *arg) {
    uintptr_t id = (uintptr_t)arg, dtv;
    __asm__ volatile("mov %%fs:8, %0" : "=r"(dtv));
    for (int i = 0; i < 64; i++) mine[i] = (long)(id * 1000 + i);
    long s = 0;
    for (int i = 0; i < 64; i++) s += mine[i];
    int inside = dtv >= arena_lo && dtv < arena_hi;
    verdict[id] = inside ? "in the arena" : (s == (long)(id * 64000 + 2016) ? "ok" : "tls wrong");
    return NULL;
}

int main(void) {
    /* Memory first, so the arena's early pages are in use (and the
     * library has started: it waits for 1 MiB of requests). volatile:
     * the compiler may drop a malloc whose memory is never read. */
    char *volatile p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    find_arena();
    fprintf(stderr, "arena: %s\n", arena_hi ? "found" : "none");
    pthread_t t[THREADS];
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    int (*glibc_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) =
        libc ? dlsym(libc, "pthread_create") : NULL;
    if (!glibc_create) {
        fprintf(stderr, "glibc's pthread_create not found\n");
        return 1;
    }
    for (uintptr_t i = 0; i < THREADS; i++)
        (i < THREADS - GLIBCS ? pthread_create : glibc_create)(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) printf("thread %d dtv: %s\n", i, verdict[i]);
    free(p);
    return 0;
}
