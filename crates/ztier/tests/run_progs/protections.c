/* Memory that is not plain read-write, as a JIT's and a runtime's is,
 * several times the budget: 48 MiB of data written then made read-only;
 * 16 MiB of code (a function per page: `lea eax, [rdi + k]; ret`)
 * written then made read-and-execute; 16 MiB mapped read-write-execute
 * at once; and 16 MiB of code mapped read-write-execute with MAP_FIXED
 * over half of a 32 MiB inaccessible reservation (how HotSpot commits
 * its code cache). Three rounds read all the data and call every
 * function, with 32 MiB of malloc churn between them. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1u << 20)
#define PAGE 4096

typedef int (*fn)(int);

/* Writes a function returning its argument plus `k0 + page` on every
 * page of `code`. */
static void emit(unsigned char *code, size_t len, int k0) {
    for (size_t p = 0; p < len / PAGE; p++) {
        unsigned char *c = code + p * PAGE;
        int32_t k = k0 + (int32_t)p;
        c[0] = 0x8d;
        c[1] = 0x87;
        memcpy(c + 2, &k, 4);
        c[6] = 0xc3;
    }
}

static long call_all(unsigned char *code, size_t len, int arg) {
    long s = 0;
    for (size_t p = 0; p < len / PAGE; p++) s += ((fn)(code + p * PAGE))(arg);
    return s;
}

static void *map(size_t len, int prot, int flags, void *at) {
    void *p = mmap(at, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

int main(void) {
    size_t dn = 48 * MB, cn = 16 * MB;
    unsigned char *data = map(dn, PROT_READ | PROT_WRITE, 0, NULL);
    for (size_t i = 0; i < dn; i++) data[i] = (unsigned char)(i * 7 + i / PAGE);
    if (mprotect(data, dn, PROT_READ)) return 3;
    unsigned char *rx = map(cn, PROT_READ | PROT_WRITE, 0, NULL);
    emit(rx, cn, 0);
    if (mprotect(rx, cn, PROT_READ | PROT_EXEC)) return 3;
    unsigned char *rwx = map(cn, PROT_READ | PROT_WRITE | PROT_EXEC, 0, NULL);
    emit(rwx, cn, 1 << 20);
    unsigned char *resv = map(2 * cn, PROT_NONE, MAP_NORESERVE, NULL);
    unsigned char *cache = map(cn, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_FIXED, resv + cn);
    emit(cache, cn, 2 << 20);
    for (int r = 0; r < 3; r++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < dn; i += 64) sum += data[i];
        printf("round %d: data %llu, read-execute %ld, read-write-execute %ld, fixed %ld\n", r,
               (unsigned long long)sum, call_all(rx, cn, r), call_all(rwx, cn, r), call_all(cache, cn, r));
        unsigned char *junk = malloc(32 * MB);
        if (!junk) return 4;
        memset(junk, r + 1, 32 * MB);
        free(junk);
    }
    return 0;
}
