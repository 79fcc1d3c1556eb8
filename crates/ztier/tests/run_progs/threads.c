/* 4 threads each fill 24 MiB with a pattern, then re-read it twice and
 * print a checksum. Under a small budget most of it is compressed. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define WORDS (24u << 20) / 8
static uint64_t sums[4];

static void *work(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    uint64_t *a = malloc(WORDS * 8);
    if (!a) { perror("malloc"); exit(2); }
    for (uint64_t i = 0; i < WORDS; i++) a[i] = (i * 2654435761u) % 1000 + id;
    uint64_t s = 0;
    for (int r = 0; r < 2; r++)
        for (uint64_t i = 0; i < WORDS; i += 7) s += a[i] ^ r;
    sums[id] = s;
    free(a);
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) printf("thread %d: %llu\n", i, (unsigned long long)sums[i]);
    return 0;
}
