/*
 * lz4hc-decode: how fast LZ4's decoder reads pages that LZ4 or LZ4HC
 * (a level) compressed, and what each compression costs. Both write the
 * LZ4 block format, so `ztier run`'s fault service would decode either
 * with the same `LZ4_decompress_safe`.
 *
 * The pages of a `.pages` corpus file (whole 4 KiB pages) are compressed
 * COPIES times over (each copy its own allocation, so the decoding does
 * not run from the cache as a small corpus would), then every copy is
 * decoded once, in random order. Prints the ratio and the mean µs a
 * page each way. Level 0 is plain LZ4 (`LZ4_compress_fast_extState`,
 * acceleration 1, as `ztier run` compresses); levels 1-12 are LZ4HC
 * (`LZ4_compress_HC_extStateHC_fastReset`).
 *
 * On this machine (python-dict.pages, 16 copies, three runs): LZ4
 * ratio 2.88, 4.15-4.19 µs to compress, 1.38-1.42 µs to decode; LZ4HC
 * level 3, 3.58, 11.95-12.11 and 1.14-1.15 µs; level 9, 3.76,
 * 35.75-36.00 and 1.05-1.15 µs.
 * docs/measurements/2026-11-26-corpus-builder-page-ins.md has the rest.
 *
 *   cc -O3 -o /tmp/lz4hc-decode scripts/lz4hc-decode.c $(scripts/lz4-src.sh scripts/lz4hc-decode.c)
 *   /tmp/lz4hc-decode ../shared/corpus/python-dict.pages 3 16
 *
 * It changes no system setting.
 */
#define LZ4_HC_STATIC_LINKING_ONLY
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lz4.h"
#include "lz4hc.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s FILE.pages LEVEL COPIES\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    int level = atoi(argv[2]), copies = atoi(argv[3]);
    static char buf[64 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int pages = (int)(n / 4096);
    if (pages == 0 || copies < 1 || level < 0 || level > 12) {
        fprintf(stderr, "no whole page in %s, or a bad LEVEL (0-12) or COPIES\n", argv[1]);
        return 2;
    }
    int total = pages * copies;
    char **c = malloc(sizeof(char *) * total);
    int *len = malloc(sizeof(int) * total);
    int *order = malloc(sizeof(int) * total);
    void *fast = malloc(LZ4_sizeofState());
    void *hc = malloc(LZ4_sizeofStateHC());
    if (!c || !len || !order || !fast || !hc) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    LZ4_initStreamHC(hc, LZ4_sizeofStateHC());
    char tmp[LZ4_COMPRESSBOUND(4096)], out[4096];
    size_t bytes = 0;
    double t0 = now();
    for (int i = 0; i < total; i++) {
        const char *src = buf + (size_t)(i % pages) * 4096;
        int k = level == 0 ? LZ4_compress_fast_extState(fast, src, tmp, 4096, sizeof tmp, 1)
                           : LZ4_compress_HC_extStateHC_fastReset(hc, src, tmp, 4096, sizeof tmp, level);
        if (k <= 0 || !(c[i] = malloc(k))) {
            fprintf(stderr, "compression of page %d failed\n", i);
            return 1;
        }
        memcpy(c[i], tmp, k);
        len[i] = k;
        bytes += k;
    }
    double t1 = now();
    srand(1);
    for (int i = 0; i < total; i++)
        order[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    double t2 = now();
    long bad = 0;
    for (int i = 0; i < total; i++) {
        int p = order[i];
        bad += LZ4_decompress_safe(c[p], out, len[p], 4096) != 4096;
        bad += out[p & 4095] != buf[(size_t)(p % pages) * 4096 + (p & 4095)];
    }
    double t3 = now();
    for (int i = 0; i < total && !bad; i++)
        bad += LZ4_decompress_safe(c[i], out, len[i], 4096) != 4096 ||
               memcmp(out, buf + (size_t)(i % pages) * 4096, 4096) != 0;
    if (bad) {
        fprintf(stderr, "pages did not round-trip\n");
        return 1;
    }
    printf("level %d: ratio %.2f, compress %.2f us/page, decode %.2f us/page\n", level,
           (double)pages * copies * 4096 / bytes, (t1 - t0) / total * 1e6, (t3 - t2) / total * 1e6);
    return 0;
}
