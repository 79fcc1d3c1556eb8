/* Takes malloc's address, as CPython's allocator tables do. Built
 * without position independence (-no-pie, as Debian's python3.11 and
 * the official node are), the executable then has a canonical PLT entry
 * for malloc: an undefined dynamic symbol with a value (the stub's
 * address), which a lookup of "malloc" returns though the calls go to
 * the preloaded library's. Linked with ownalloc.c it has a malloc of
 * its own instead.
 *
 * Allocates 64 MiB in 1 MiB blocks through the pointer, fills them,
 * then reads them all back twice: prints the sum and "ok". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void *(*volatile alloc)(size_t);

int main(void) {
    alloc = malloc;
    enum { BLOCKS = 64, WORDS = (1 << 20) / sizeof(uint64_t) };
    uint64_t *b[BLOCKS], sum = 0;
    for (int i = 0; i < BLOCKS; i++) {
        b[i] = alloc(WORDS * sizeof(uint64_t));
        if (!b[i]) return 1;
        for (size_t w = 0; w < WORDS; w++) b[i][w] = (uint64_t)i * WORDS + w;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < BLOCKS; i++)
            for (size_t w = 0; w < WORDS; w += 7) sum += b[i][w];
    printf("sum %llu\nok\n", (unsigned long long)sum);
    return 0;
}
