/* fork with a thread running that glibc's own pthread_create made (looked
 * up in libc.so.6, as jemalloc's background thread in redis is made from
 * libjemalloc by dlsym(RTLD_NEXT)), and a cold heap. In the child that
 * thread is gone and its stack is in glibc's cache: the next
 * pthread_create there takes it and frees the old thread's DTV first.
 * Under `ztier run` that DTV was arena memory, evicted by then, and the
 * child's first pthread_create was the library's own, starting the
 * child's fault handler: the fault waited for the handler it was
 * starting (redis's BGSAVE child hung so). Each child checks a slice of
 * the heap, starts and joins a thread of its own, and exits 0. The
 * parent gives each child 30 s, then kills it (by its PID), says so and
 * forks no more. Output is the same natively. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HEAP (64 << 20)
#define SLICE (1 << 20)
#define CHILDREN 8

static int pipefd[2];
static long *heap;

static void *background(void *arg) {
    (void)arg;
    char c;
    /* Sleeps until the parent closes the pipe, as a background thread does. */
    while (read(pipefd[0], &c, 1) > 0) {
    }
    return NULL;
}

static long slice_sum(int k) {
    long s = 0;
    for (size_t i = 0; i < SLICE / sizeof(long); i++) s += heap[k * (SLICE / sizeof(long)) + i];
    return s;
}

static long expected(int k) {
    long s = 0;
    for (size_t i = 0; i < SLICE / sizeof(long); i++) s += (long)(k * (SLICE / sizeof(long)) + i) * 7;
    return s;
}

static void *child_thread(void *arg) {
    long k = (long)arg;
    return (void *)(slice_sum((int)k + 16) == expected((int)k + 16) ? 1L : 0L);
}

int main(void) {
    if (pipe(pipefd) != 0) return 1;
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    int (*glibc_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) =
        libc ? dlsym(libc, "pthread_create") : NULL;
    if (!glibc_create) {
        fprintf(stderr, "glibc's pthread_create not found\n");
        return 1;
    }
    /* The heap first (the library starts), then the thread, then the
     * whole heap written again: the thread's early allocations go cold. */
    heap = malloc(HEAP);
    memset(heap, 1, HEAP);
    pthread_t bg;
    if (glibc_create(&bg, NULL, background, NULL) != 0) return 1;
    for (size_t i = 0; i < HEAP / sizeof(long); i++) heap[i] = (long)i * 7;
    int ok = 0;
    for (int k = 0; k < CHILDREN; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            pthread_t t;
            void *r = NULL;
            if (pthread_create(&t, NULL, child_thread, (void *)(long)k) != 0 || pthread_join(t, &r) != 0) _exit(3);
            _exit(slice_sum(k) == expected(k) && r == (void *)1L ? 0 : 2);
        }
        int status = 0;
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec > 30) {
                printf("child %d hung: killed\n", k);
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                status = -1;
                break;
            }
            usleep(10000);
        }
        if (status == 0) ok++;
        else if (status == -1) break;
        else printf("child %d: status %#x\n", k, status);
    }
    close(pipefd[1]);
    pthread_join(bg, NULL);
    printf("children ok %d of %d\n", ok, CHILDREN);
    return ok == CHILDREN ? 0 : 1;
}
