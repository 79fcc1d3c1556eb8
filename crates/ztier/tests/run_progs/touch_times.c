/* Fills a heap of PAGES pages (argv[1], default 16384: 64 MiB) with a
 * pattern, then reads one word of each page in a shuffled order, timing
 * each first touch (clock_gettime around the read): under a small budget
 * and store almost every touch is a fault served from the store's next
 * tier. Prints the checksum of the words on stdout, and the touches'
 * p50, p90, p99 and max (µs) on stderr. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    uint64_t pages = argc > 1 ? strtoull(argv[1], 0, 10) : 16384;
    uint64_t *heap = malloc(pages * 4096);
    uint32_t *order = malloc(pages * sizeof *order);
    uint64_t *ns = malloc(pages * sizeof *ns);
    if (!heap || !order || !ns) return 1;
    for (uint64_t p = 0; p < pages; p++)
        for (int w = 0; w < 512; w++) heap[p * 512 + w] = (p * 2654435761u) ^ (w * 40503u) ^ (w & 7);
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < pages; i++) order[i] = i;
    for (uint32_t i = pages - 1; i > 0; i--) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint32_t j = x % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    uint64_t sum = 0;
    for (uint64_t i = 0; i < pages; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        sum += *(volatile uint64_t *)&heap[(uint64_t)order[i] * 512 + (i % 512)];
        clock_gettime(CLOCK_MONOTONIC, &b);
        ns[i] = (b.tv_sec - a.tv_sec) * 1000000000ull + b.tv_nsec - a.tv_nsec;
    }
    qsort(ns, pages, sizeof *ns, cmp);
    printf("%llu\n", (unsigned long long)sum);
    fprintf(stderr, "touch_times: %llu touches, p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us\n",
            (unsigned long long)pages, ns[pages / 2] / 1e3, ns[pages * 9 / 10] / 1e3, ns[pages * 99 / 100] / 1e3,
            ns[pages - 1] / 1e3);
    return 0;
}
