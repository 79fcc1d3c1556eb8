/* hotset.c's touches over N separate blocks of 4300 bytes (default 1500,
 * the size of sqlite3's page buffers) instead of one block: ROUNDS
 * touches (default 40000), 70% to a hot sixth of the blocks, each writing
 * every 1024th byte of its block. glibc packs such blocks 4304 bytes
 * apart; ztier run's size classes put them in its 5120-byte class, so
 * the same program touches ~19% more pages live than a trace of glibc's
 * layout shows (cli_trace checks `ztier trace record --layout`).
 * Deterministic (a fixed LCG); prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 1500, hot = n / 6;
    unsigned rounds = argc > 2 ? strtoul(argv[2], 0, 10) : 40000;
    char **b = malloc(n * sizeof *b);
    if (!b)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (!(b[i] = malloc(4300)))
            return 1;
        for (int k = 0; k < 4300; k += 512)
            b[i][k] = (char)i;
    }
    unsigned long long x = 7, sum = 0;
    for (unsigned r = 0; r < rounds; r++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t i = (x >> 33) % 10 < 7 ? (x >> 40) % hot : (x >> 20) % n;
        for (int k = 0; k < 4300; k += 1024)
            b[i][k] += 1;
        sum += b[i][0];
    }
    printf("%llu\n", sum);
    return 0;
}
