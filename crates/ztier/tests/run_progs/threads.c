/* 4 threads each fill 24 MiB with a pattern, then re-read it twice and
 * print a checksum. Under a small budget most of it is compressed.
 *
 * `threads pin`: thread i first binds itself to the i-th CPU of the set
 * it was started with, in turn, so the faults come from every CPU at
 * once whatever else the machine runs; and it re-reads 16 times, so that
 * the faults run to several of the library's sampling windows. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORDS (24u << 20) / 8
static uint64_t sums[4];
static int pin;
static int passes = 2;

/* Binds this thread to the id-th allowed CPU, in turn. */
static void pin_to(uintptr_t id) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) { perror("sched_getaffinity"); exit(2); }
    int n = CPU_COUNT(&set), k = (int)(id % (uintptr_t)n);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &set) && k-- == 0) {
            CPU_ZERO(&set);
            CPU_SET(c, &set);
            if (sched_setaffinity(0, sizeof set, &set)) { perror("sched_setaffinity"); exit(2); }
            return;
        }
    }
}

static void *work(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    if (pin) pin_to(id);
    uint64_t *a = malloc(WORDS * 8);
    if (!a) { perror("malloc"); exit(2); }
    for (uint64_t i = 0; i < WORDS; i++) a[i] = (i * 2654435761u) % 1000 + id;
    uint64_t s = 0;
    for (int r = 0; r < passes; r++)
        for (uint64_t i = 0; i < WORDS; i += 7) s += a[i] ^ r;
    sums[id] = s;
    free(a);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "pin") != 0)) {
        fprintf(stderr, "usage: threads [pin]\n");
        return 2;
    }
    pin = argc == 2;
    if (pin) passes = 16;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) printf("thread %d: %llu\n", i, (unsigned long long)sums[i]);
    return 0;
}
