/* mremap(MREMAP_MAYMOVE | MREMAP_FIXED): an 8 MiB patterned mapping,
 * pushed out of memory by 48 MiB of churn, moved (and grown to 12 MiB)
 * into the middle of the program's own inaccessible reservation; one
 * made read-only moved likewise (the protection goes with it); one
 * moved to a reservation the kernel made at a fixed address; and the
 * kernel's refusals: no MREMAP_MAYMOVE, an unaligned or overlapping
 * target. Prints what it found. */
#define _GNU_SOURCE
#include <errno.h>

#include "maps.h"

static void report(const char *what, void *got, void *want) {
    if (got == MAP_FAILED) printf("%s: failed: %s\n", what, strerror(errno));
    else printf("%s: %s\n", what, got == want ? "where asked" : "elsewhere");
}

int main(void) {
    unsigned char *a = filled(8 * MB, 7);
    churn();
    unsigned char *resv = map(16 * MB, PROT_NONE, MAP_NORESERVE, NULL);
    unsigned char *to = resv + 2 * MB;
    void *r = mremap(a, 8 * MB, 12 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    report("into a reservation", r, to);
    if (r != MAP_FAILED) {
        printf("  %ld wrong bytes, %s\n", wrong(to, 12 * MB, 8 * MB, 7), perms(to));
        memset(to + 11 * MB, 5, MB);
        churn();
        printf("  after a write and churn: %ld wrong in the first 8 MiB\n", wrong(to, 8 * MB, 8 * MB, 7));
    }

    unsigned char *ro = filled(4 * MB, 11);
    if (mprotect(ro, 4 * MB, PROT_READ)) return 4;
    churn();
    unsigned char *resv2 = map(8 * MB, PROT_NONE, MAP_NORESERVE, NULL);
    r = mremap(ro, 4 * MB, 4 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, resv2 + 4 * MB);
    report("read-only, into a reservation", r, resv2 + 4 * MB);
    if (r != MAP_FAILED) printf("  %ld wrong bytes, %s\n", wrong(r, 4 * MB, 4 * MB, 11), perms(r));

    unsigned char *far = map(4 * MB, PROT_NONE, MAP_FIXED_NOREPLACE | MAP_NORESERVE, (void *)0x6f0000000000ul);
    unsigned char *b = filled(4 * MB, 13);
    churn();
    r = mremap(b, 4 * MB, 4 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, far);
    report("to a fixed kernel reservation", r, far);
    if (r != MAP_FAILED) printf("  %ld wrong bytes, %s\n", wrong(r, 4 * MB, 4 * MB, 13), perms(r));

    unsigned char *c = filled(2 * MB, 17);
    report("without MREMAP_MAYMOVE", mremap(c, 2 * MB, 2 * MB, MREMAP_FIXED, resv + 14 * MB), NULL);
    report("unaligned", mremap(c, 2 * MB, 2 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, resv + 14 * MB + 1), NULL);
    report("overlapping", mremap(c, 2 * MB, 2 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, c + MB), NULL);
    printf("  the source still: %ld wrong bytes\n", wrong(c, 2 * MB, 2 * MB, 17));
    return 0;
}
