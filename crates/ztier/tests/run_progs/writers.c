/* Two threads write counters into interleaved pages of one 48 MiB heap:
 * thread 0 owns the even pages, thread 1 the odd ones, each walked in
 * ascending order (4 words at pseudo-random offsets per page) for 6
 * rounds. Under a small budget the victims are every other page, and the
 * evictor keeps taking victims whose neighbours the other thread is
 * writing at that very moment, so a write lost while a page is evicted
 * (or a neighbour left write-protected for good) shows in the sums, which
 * must equal a native run's. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGES ((48u << 20) / 4096)
#define ROUNDS 6
static uint64_t *heap;

static void *work(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    uint64_t x = 88172645463325252ull + id * 7919;
    for (int r = 0; r < ROUNDS; r++)
        for (uint64_t p = id; p < PAGES; p += 2)
            for (int k = 0; k < 4; k++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                heap[p * 512 + (x >> 40) % 512] += p + r;
            }
    return NULL;
}

int main(void) {
    heap = calloc(PAGES * 512, 8);
    if (!heap) { perror("calloc"); return 2; }
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    uint64_t sum[2] = {0, 0}, h = 1469598103934665603ull;
    for (uint64_t w = 0; w < (uint64_t)PAGES * 512; w++) {
        sum[(w / 512) % 2] += heap[w];
        h = (h ^ heap[w]) * 1099511628211ull;
    }
    printf("even pages %llu, odd pages %llu, hash %016llx\n", (unsigned long long)sum[0],
           (unsigned long long)sum[1], (unsigned long long)h);
    return 0;
}
