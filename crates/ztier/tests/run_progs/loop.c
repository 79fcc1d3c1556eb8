/* Loops over a 64 MiB heap, page by page in one fixed shuffled order,
 * PASSES times: a working set larger than the budget, reused cyclically
 * (a garbage collector's full-heap pass has this shape). The order is
 * shuffled so sequential prefetch cannot hide the faults. Prints a
 * checksum of everything read. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGES (64 * 256)
#define PASSES 8

int main(void) {
    uint64_t *heap = malloc((size_t)PAGES * 4096);
    uint32_t *order = malloc(PAGES * sizeof *order);
    if (!heap || !order) return 1;
    for (uint64_t p = 0; p < PAGES; p++)
        for (int w = 0; w < 512; w += 8) heap[p * 512 + w] = p * 2654435761u + w;
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < PAGES; i++) order[i] = i;
    for (uint32_t i = PAGES - 1; i > 0; i--) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint32_t j = x % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    uint64_t sum = 0;
    for (int pass = 0; pass < PASSES; pass++)
        for (uint32_t i = 0; i < PAGES; i++) sum += heap[(uint64_t)order[i] * 512 + (i % 64) * 8] ^ pass;
    printf("%llu\n", (unsigned long long)sum);
    return 0;
}
