/* Starts small (the library starts once a process has asked for 1 MiB),
 * then grows memory it got before start-up to 48 MiB and walks it twice:
 * the grown memory must be managed. How it grows is argv[1]:
 *   realloc  a 1000-byte malloc block grown with realloc (default);
 *   mremap   a 256 KiB anonymous mapping grown with mremap. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BYTES (48u << 20)
#define OLD 1000u

int main(int argc, char **argv) {
    int remap = argc > 1 && strcmp(argv[1], "mremap") == 0;
    uint64_t *a;
    if (remap) {
        unsigned char *m = mmap(NULL, 256 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 2;
        memset(m, 7, OLD);
        a = mremap(m, 256 << 10, BYTES, MREMAP_MAYMOVE);
        if (a == MAP_FAILED) return 2;
    } else {
        unsigned char *volatile small = malloc(OLD);
        memset(small, 7, OLD);
        a = realloc(small, BYTES);
        if (!a) return 2;
    }
    for (unsigned i = 0; i < OLD; i++)
        if (((unsigned char *)a)[i] != 7) { printf("lost the old bytes\n"); return 3; }
    size_t words = BYTES / 8;
    for (size_t i = 125; i < words; i++) a[i] = i * 2654435761u;
    uint64_t s = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 125; i < words; i++) s += a[i] ^ (uint64_t)pass;
    printf("sum %llu\n", (unsigned long long)s);
    if (remap) munmap(a, BYTES); else free(a);
    return 0;
}
