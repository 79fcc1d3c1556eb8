/* Starts small (the library starts once a process has asked for 1 MiB),
 * then grows a block made before start-up with realloc to 48 MiB and
 * walks it twice: the grown block must be managed memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BYTES (48u << 20)

int main(void) {
    unsigned char *volatile small = malloc(1000);
    memset(small, 7, 1000);
    uint64_t *a = realloc(small, BYTES);
    if (!a) return 2;
    for (int i = 0; i < 1000; i++)
        if (((unsigned char *)a)[i] != 7) { printf("lost the old bytes\n"); return 3; }
    size_t words = BYTES / 8;
    for (size_t i = 125; i < words; i++) a[i] = i * 2654435761u;
    uint64_t s = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 125; i < words; i++) s += a[i] ^ (uint64_t)pass;
    printf("sum %llu\n", (unsigned long long)s);
    free(a);
    return 0;
}
