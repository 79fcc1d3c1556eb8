/* A program with a malloc of its own (ownalloc.c, linked in), as rustc
 * has jemalloc. Its first call comes from the constructor of a library
 * it links (ownmalloc_early.c), which runs before the preloaded
 * library's, as rustc's comes from one of libLLVM's.
 *
 * Then 96 MiB in blocks of 4 to 64 KiB, each filled with a pattern of
 * its own; seven more threads, started one after another while the
 * main thread already checks, and the main thread each check and sum an
 * eighth of the blocks (every eighth). Prints the sums of the even and
 * of the odd blocks. Each new thread's table of thread-local storage
 * (DTV) comes from this malloc, so from memory ztier manages, made just
 * before the thread starts, while the heap is being evicted around it.
 *
 * Then the program forks: the child allocates (the allocator's lock,
 * taken by its fork `prepare` handler, must be free), checks blocks 0
 * to 7 and exits with 0 if they hold their pattern; the parent prints
 * that. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern unsigned long ownalloc_calls;

#define BLOCKS 3072
static uint64_t *block[BLOCKS];
static size_t words[BLOCKS];

static uint64_t check(unsigned from) {
    uint64_t sum = 0;
    for (unsigned b = from; b < BLOCKS; b += 8)
        for (size_t i = 0; i < words[b]; i++) {
            if (block[b][i] != ((b * 0x9E3779B97F4A7C15u) ^ i)) {
                printf("block %u word %zu: %llx\n", b, i, (unsigned long long)block[b][i]);
                exit(1);
            }
            sum += block[b][i] >> 32;
        }
    return sum;
}

static void *checker(void *arg) { return (void *)(uintptr_t)check((unsigned)(uintptr_t)arg); }

int main(void) {
    size_t total = 0;
    for (unsigned b = 0; b < BLOCKS; b++) {
        words[b] = (4096 + (b * 7919u % 15) * 4096) / 8;
        block[b] = malloc(words[b] * 8);
        if (!block[b]) return 2;
        for (size_t i = 0; i < words[b]; i++) block[b][i] = (b * 0x9E3779B97F4A7C15u) ^ i;
        total += words[b] * 8;
    }
    /* Threads 1 to 7 check blocks 1 to 7 mod 8; the main thread, 0. */
    pthread_t t[8];
    uint64_t sum[8];
    for (unsigned k = 1; k < 8; k++)
        if (pthread_create(&t[k], NULL, checker, (void *)(uintptr_t)k)) return 3;
    sum[0] = check(0);
    for (unsigned k = 1; k < 8; k++) {
        void *r;
        pthread_join(t[k], &r);
        sum[k] = (uint64_t)(uintptr_t)r;
    }
    uint64_t even = 0, odd = 0;
    for (unsigned k = 0; k < 8; k++) *(k % 2 ? &odd : &even) += sum[k];
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 5;
    if (pid == 0) {
        char *p = malloc(100);
        if (!p) _exit(2);
        for (unsigned b = 0; b < 8; b++)
            for (size_t i = 0; i < words[b]; i++)
                if (block[b][i] != ((b * 0x9E3779B97F4A7C15u) ^ i)) _exit(1);
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return 6;
    printf("fork: child %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "saw its blocks" : "failed");
    printf("own malloc: %u blocks, %zu MiB, sums %llx %llx, called %s\n", BLOCKS, total >> 20,
           (unsigned long long)even, (unsigned long long)odd, ownalloc_calls > BLOCKS ? "for all" : "too few");
    return 0;
}
