/* Mappings asked for at an address. First as HotSpot's G1 asks for its
 * heap: a 64 MiB reservation hinted at 9 addresses in turn, each given
 * back if it is not where asked, then taken anywhere, made read-write
 * and filled (under `ztier run` the arena gives other addresses, so the
 * program gives back 9 and takes the 10th: its heap stays managed). Then
 * as ZGC reserves: the same length at one address after another until
 * one is where asked, which it must be (at most 64 tries), then used.
 * Then MAP_32BIT, which must be below 2 GiB. Before all, a 64 GiB
 * reservation, more than the arena has. Prints what it checked. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1ul << 20)
#define GB (1ul << 30)

static unsigned char *reserve(uintptr_t at, size_t len) {
    void *p = mmap((void *)at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Fills `len` bytes at `p` (made read-write) with a pattern of `seed`,
 * then counts the bytes that do not hold it. */
static long fill_and_check(unsigned char *p, size_t len, unsigned seed) {
    if (mprotect(p, len, PROT_READ | PROT_WRITE)) return -1;
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * seed + i / 4096);
    long wrong = 0;
    for (size_t i = 0; i < len; i++) wrong += p[i] != (unsigned char)(i * seed + i / 4096);
    return wrong;
}

int main(void) {
    /* Address space for later, as large as ztier's arena: the kernel's. */
    unsigned char *big = reserve(0, 64 * GB);
    printf("64 GiB reserved: %s\n", big ? "yes" : "no");
    /* G1: 9 hints, then anywhere. */
    size_t heap = 64 * MB;
    unsigned char *h = NULL;
    for (int k = 0; k < 9 && !h; k++) {
        uintptr_t at = 0x600000000000ul + k * 2 * GB;
        unsigned char *p = reserve(at, heap);
        if (p && (uintptr_t)p != at) munmap(p, heap);
        else h = p;
    }
    if (!h) h = reserve(0, heap);
    if (!h) return 2;
    printf("heap: %ld wrong bytes\n", fill_and_check(h, heap, 7));
    /* ZGC: where asked, or not at all. */
    size_t view = 32 * MB;
    unsigned char *z = NULL;
    int tries = 0;
    while (!z && tries < 64) {
        uintptr_t at = 0x680000000000ul + tries++ * GB;
        unsigned char *p = reserve(at, view);
        if (p && (uintptr_t)p != at) munmap(p, view);
        else z = p;
    }
    if (!z) {
        printf("no reservation where asked in %d tries\n", tries);
        return 3;
    }
    printf("reserved where asked: %ld wrong bytes\n", fill_and_check(z, view, 11));
    munmap(z, view);
    /* MAP_32BIT. */
    unsigned char *low = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (low == MAP_FAILED) return 4;
    printf("MAP_32BIT below 2 GiB: %s, %ld wrong bytes\n", (uintptr_t)low + MB <= 2 * GB ? "yes" : "no",
           fill_and_check(low, MB, 13));
    return 0;
}
