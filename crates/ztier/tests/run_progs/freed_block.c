/* A large block freed, then work elsewhere, then a block of its size
 * again: malloc(1 MiB) (256 pages, beyond what ztier's allocator keeps
 * for reuse, so its free releases the pages), every page written, freed;
 * LOOPS rounds over a 4 KiB buffer (default 300000, ~600k references);
 * malloc(1 MiB) again (the same pages: best fit), every page written.
 * Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

#define BIG (1 << 20)

int main(int argc, char **argv) {
    unsigned loops = argc > 1 ? strtoul(argv[1], 0, 10) : 300000;
    volatile char *a = malloc(BIG);
    if (!a)
        return 1;
    for (int k = 0; k < BIG; k += 4096)
        a[k] = (char)k;
    free((void *)a);
    volatile unsigned *s = malloc(4096);
    if (!s)
        return 1;
    for (unsigned r = 0; r < loops; r++)
        s[r % 1024] += r;
    volatile char *b = malloc(BIG);
    if (!b)
        return 1;
    unsigned long sum = s[7];
    for (int k = 0; k < BIG; k += 4096) {
        b[k] = 1;
        sum += b[k];
    }
    printf("%lu\n", sum);
    return 0;
}
