/* mremap moves that keep what the kernel keeps: a read-only mapping
 * grown (moved, or grown in place: the new part read-only too); an
 * inaccessible one grown; and MREMAP_DONTUNMAP, which moves the pages
 * and leaves the old range mapped, with its protection, reading zeros
 * (read-write, read-only, and to a fixed address), with the kernel's
 * refusals (no MREMAP_MAYMOVE, another length). Each source is pushed
 * out of memory first (48 MiB of churn at a 16M budget). Prints what it
 * found. */
#define _GNU_SOURCE
#include <errno.h>

#include "maps.h"

static void *report(const char *what, void *got) {
    if (got == MAP_FAILED) printf("%s: failed: %s\n", what, strerror(errno));
    else printf("%s: done\n", what);
    return got;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* A read-only mapping grown, with another mapping made right after
     * it (in ztier's arena that one sits next to it: it must move). */
    unsigned char *ro = filled(4 * MB, 11);
    unsigned char *next = filled(MB, 3);
    if (mprotect(ro, 4 * MB, PROT_READ)) return 4;
    churn();
    unsigned char *r = report("read-only, grown", mremap(ro, 4 * MB, 8 * MB, MREMAP_MAYMOVE));
    if (r != MAP_FAILED)
        printf("  %ld wrong bytes, %s, the new part %s\n", wrong(r, 8 * MB, 4 * MB, 11), perms(r),
               perms(r + 6 * MB));

    unsigned char *none = filled(2 * MB, 5);
    unsigned char *next2 = filled(MB, 3);
    if (mprotect(none, 2 * MB, PROT_NONE)) return 4;
    churn();
    r = report("inaccessible, grown", mremap(none, 2 * MB, 4 * MB, MREMAP_MAYMOVE));
    if (r != MAP_FAILED) {
        printf("  %s, the new part %s\n", perms(r), perms(r + 3 * MB));
        if (mprotect(r, 4 * MB, PROT_READ)) return 4;
        printf("  made readable: %ld wrong bytes\n", wrong(r, 4 * MB, 2 * MB, 5));
    }

    unsigned char *d = filled(32 * MB, 19);
    churn();
    r = report("MREMAP_DONTUNMAP", mremap(d, 32 * MB, 32 * MB, MREMAP_MAYMOVE | MREMAP_DONTUNMAP));
    if (r != MAP_FAILED) {
        printf("  moved: %ld wrong bytes, %s; the old range: %s, %ld bytes not zero\n",
               wrong(r, 32 * MB, 32 * MB, 19), perms(r), perms(d), wrong(d, 32 * MB, 0, 19));
        memset(d, 9, MB);
        churn();
        long w = 0;
        for (size_t i = 0; i < MB; i++) w += d[i] != 9;
        printf("  after a write to the old range and churn: %ld wrong there, %ld in the moved\n", w,
               wrong(r, 32 * MB, 32 * MB, 19));
    }

    unsigned char *ro2 = filled(4 * MB, 23);
    if (mprotect(ro2, 4 * MB, PROT_READ)) return 4;
    churn();
    r = report("MREMAP_DONTUNMAP, read-only", mremap(ro2, 4 * MB, 4 * MB, MREMAP_MAYMOVE | MREMAP_DONTUNMAP));
    if (r != MAP_FAILED)
        printf("  moved: %ld wrong bytes, %s; the old range: %s, %ld bytes not zero\n",
               wrong(r, 4 * MB, 4 * MB, 23), perms(r), perms(ro2), wrong(ro2, 4 * MB, 0, 23));

    unsigned char *e = filled(4 * MB, 29);
    unsigned char *resv = map(8 * MB, PROT_NONE, MAP_NORESERVE, NULL);
    churn();
    r = report("MREMAP_DONTUNMAP into a reservation",
               mremap(e, 4 * MB, 4 * MB, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, resv + 2 * MB));
    if (r != MAP_FAILED)
        printf("  %s; %ld wrong bytes, %s; the old range %ld bytes not zero\n",
               r == resv + 2 * MB ? "where asked" : "elsewhere", wrong(r, 4 * MB, 4 * MB, 29), perms(r),
               wrong(e, 4 * MB, 0, 29));

    unsigned char *c = filled(2 * MB, 31);
    report("MREMAP_DONTUNMAP without MREMAP_MAYMOVE", mremap(c, 2 * MB, 2 * MB, MREMAP_DONTUNMAP));
    report("MREMAP_DONTUNMAP to another length", mremap(c, 2 * MB, 4 * MB, MREMAP_MAYMOVE | MREMAP_DONTUNMAP));
    printf("  the source still: %ld wrong bytes\n", wrong(c, 2 * MB, 2 * MB, 31));
    (void)next;
    (void)next2;
    return 0;
}
