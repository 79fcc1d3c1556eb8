/* MADV_POPULATE_READ and MADV_POPULATE_WRITE (Linux 5.14) of an 8 MiB
 * mapping gone cold under a 16M budget, and of a fresh one: both calls
 * succeed and the bytes read back. Natively and in every mode of
 * `ztier run` the same output (where faults are caught by signal or in
 * user mode only, the kernel's own faults fail, and the calls did, with
 * EFAULT). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif
int main(void) {
    size_t n = 8u << 20;
    char *a = mmap(NULL, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    char *big = malloc(48u << 20);
    memset(a, 3, n);
    memset(big, 1, 48u << 20);   /* a goes cold */
    int r1 = madvise(a, n, MADV_POPULATE_READ); int e1 = errno;
    int r2 = madvise(a, n, MADV_POPULATE_WRITE); int e2 = errno;
    char *b = mmap(NULL, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    int r3 = madvise(b, n, MADV_POPULATE_WRITE); int e3 = errno;
    long s = 0; for (size_t i = 0; i < n; i += 4096) s += a[i] + b[i];
    printf("populate read %d (%d) write %d (%d) fresh %d (%d) sum %ld\n", r1, r1 ? e1 : 0, r2, r2 ? e2 : 0, r3, r3 ? e3 : 0, s);
    return 0;
}
