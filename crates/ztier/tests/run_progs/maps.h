/* Helpers of the mapping programs (remap_fixed.c, remap_move.c,
 * unmapped.c): patterned anonymous mappings, churn that pushes them out
 * of memory at a 16M budget, and what /proc/self/maps says of them. */
#ifndef ZTIER_MAPS_H
#define ZTIER_MAPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1ul << 20)

static inline unsigned char *map(size_t len, int prot, int flags, void *at) {
    void *p = mmap(at, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

static inline unsigned char pat(size_t i, unsigned seed) { return (unsigned char)(i * seed + i / 4096 + 1); }

static inline unsigned char *filled(size_t len, unsigned seed) {
    unsigned char *p = map(len, PROT_READ | PROT_WRITE, 0, NULL);
    for (size_t i = 0; i < len; i++) p[i] = pat(i, seed);
    return p;
}

static inline void churn(void) {
    unsigned char *j = malloc(48 * MB);
    if (!j) exit(3);
    memset(j, 1, 48 * MB);
    free(j);
}

/* Bytes of [p, p + len) that are not the pattern (or zero past `had`). */
static inline long wrong(const unsigned char *p, size_t len, size_t had, unsigned seed) {
    long w = 0;
    for (size_t i = 0; i < len; i++) w += p[i] != (i < had ? pat(i, seed) : 0);
    return w;
}

/* The permissions /proc/self/maps shows for the mapping holding `p`. */
static inline const char *perms(const void *p) {
    static char out[4][8];
    static int k;
    char *o = out[k++ % 4];
    FILE *f = fopen("/proc/self/maps", "r");
    unsigned long lo, hi;
    char pr[8];
    strcpy(o, "none");
    while (f && fscanf(f, "%lx-%lx %7s%*[^\n]", &lo, &hi, pr) == 3)
        if (lo <= (uintptr_t)p && (uintptr_t)p < hi) strcpy(o, pr);
    if (f) fclose(f);
    return o;
}

#endif
