/* A heap block of PAGES pages (default 1536, one malloc: the same pages
 * under valgrind lackey as under ztier run, whose layout of small objects
 * differs from glibc's), written once, then ROUNDS touches (default
 * 40000), each one write: 70% to a hot sixth of the block, 30% anywhere
 * in it. Deterministic (a fixed LCG); prints a checksum. cli_sim's
 * prediction test records it and runs it. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t pages = argc > 1 ? strtoul(argv[1], 0, 10) : 1536, hot = pages / 6;
    unsigned rounds = argc > 2 ? strtoul(argv[2], 0, 10) : 40000;
    char *m = malloc(pages * 4096);
    if (!m)
        return 1;
    unsigned long long x = 7, sum = 0;
    for (size_t p = 0; p < pages; p++)
        m[p * 4096 + (p % 4000)] = (char)p;
    for (unsigned r = 0; r < rounds; r++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t p = (x >> 33) % 10 < 7 ? (x >> 40) % hot : (x >> 20) % pages;
        m[p * 4096 + (r % 4000)] += 1;
        sum += m[p * 4096];
    }
    printf("%llu\n", sum);
    return 0;
}
