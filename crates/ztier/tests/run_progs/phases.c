/* A working set left behind, then a new one: 48 MiB written, then read
 * 8 times in a scattered order (a loop larger than a 32M budget), then
 * never touched again; then a 20 MiB set read PASSES times (argv[1],
 * default 40) in one shuffled order, which fits a 32M budget once the
 * first set's pages leave. Prints a checksum of everything read. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define A_PAGES (48 * 256)
#define B_PAGES (20 * 256)

int main(int argc, char **argv) {
    int passes = argc > 1 ? atoi(argv[1]) : 40;
    uint64_t *a = malloc((size_t)A_PAGES * 4096), *b = malloc((size_t)B_PAGES * 4096);
    uint32_t *order = malloc(B_PAGES * sizeof *order);
    if (!a || !b || !order) return 1;
    uint64_t sum = 0;
    for (uint64_t p = 0; p < A_PAGES; p++)
        for (int w = 0; w < 512; w += 8) a[p * 512 + w] = p * 2654435761u + w;
    for (int pass = 0; pass < 8; pass++)
        for (uint64_t p = 0; p < A_PAGES; p++) sum += a[((p * 7919) % A_PAGES) * 512 + pass];
    for (uint64_t p = 0; p < B_PAGES; p++)
        for (int w = 0; w < 512; w += 8) b[p * 512 + w] = p * 40503u + w;
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < B_PAGES; i++) order[i] = i;
    for (uint32_t i = B_PAGES - 1; i > 0; i--) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint32_t j = x % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int pass = 0; pass < passes; pass++)
        for (uint32_t i = 0; i < B_PAGES; i++) sum += b[(uint64_t)order[i] * 512 + (i % 64) * 8] ^ pass;
    printf("%llu\n", (unsigned long long)sum);
    return 0;
}
