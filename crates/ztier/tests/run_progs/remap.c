/* mmap / mremap / munmap / madvise on anonymous memory: contents must
 * survive moves and growth, released memory must read as zeros, and
 * mincore shows how much of a 64 MiB buffer is resident. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1u << 20)

static int pattern(const uint8_t *p, size_t n, unsigned salt) {
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (uint8_t)(i / 4096 + salt)) return 0;
    return 1;
}

int main(void) {
    size_t n = 32 * MB;
    uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < n; i += 4096) memset(p + i, (uint8_t)(i / 4096 + 1), 4096);
    uint8_t *q = mremap(p, n, 2 * n, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) { perror("mremap"); return 2; }
    printf("grown: %s\n", pattern(q, n, 1) ? "ok" : "wrong");
    int zero = 1;
    for (size_t i = n; i < 2 * n; i += 4096) zero &= q[i] == 0;
    printf("new part zero: %s\n", zero ? "ok" : "wrong");
    q = mremap(q, 2 * n, n / 2, 0);
    printf("shrunk: %s\n", pattern(q, n / 2, 1) ? "ok" : "wrong");
    madvise(q, n / 4, MADV_DONTNEED);
    zero = 1;
    for (size_t i = 0; i < n / 4; i += 4096) zero &= q[i] == 0;
    printf("dontneed zero: %s, rest: %s\n", zero ? "ok" : "wrong", pattern(q + n / 4, n / 4, 1 + (n / 4) / 4096) ? "ok" : "wrong");
    munmap(q, n / 2);
    uint8_t *r = mmap(NULL, 64 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    zero = 1;
    for (size_t i = 0; i < 64 * MB; i += 4096) zero &= r[i] == 0;
    for (size_t i = 0; i < 64 * MB; i += 4096) memset(r + i, (uint8_t)(i / 4096 + 3), 4096);
    printf("fresh zero: %s, written: %s\n", zero ? "ok" : "wrong", pattern(r, 64 * MB, 3) ? "ok" : "wrong");
    unsigned char v[64 * MB / 4096];
    mincore(r, 64 * MB, v);
    size_t res = 0;
    for (size_t i = 0; i < sizeof v; i++) res += v[i] & 1;
    fprintf(stderr, "resident_kib %zu\n", res * 4);
    return 0;
}
