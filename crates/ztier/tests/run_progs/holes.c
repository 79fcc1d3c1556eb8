/* A hole unmapped in the middle of a mapping is unmapped to every call,
 * as the kernel makes it: mincore, msync, mprotect, madvise, mlock and
 * munlock there fail with ENOMEM, mremap with EFAULT, and so do the same
 * calls over a range that takes in part of it (ztier's arena kept the
 * hole as an inaccessible mapping of its own: they succeeded, and the
 * mprotect made the hole usable again). A fixed mapping over the hole is
 * the program's: mmap never hands its addresses out again (ztier's arena
 * did, and two mappings shared pages), and MAP_FIXED_NOREPLACE maps a
 * hole, not memory in use. Unmapping the hole twice, or a range across
 * it, is fine, and a hint at the hole then is granted (ztier's arena
 * put the mapping elsewhere). Patterned memory through a 16M budget.
 * Prints what it found. */
#define _GNU_SOURCE
#include <errno.h>
#include <unistd.h>

#include "maps.h"

/* "ok", or the errno a call failed with. */
static const char *res(long r) {
    static char out[16][16];
    static int k;
    char *o = out[k++ % 16];
    if (r == 0) return "ok";
    snprintf(o, sizeof out[0], "%s", errno == ENOMEM ? "ENOMEM" : errno == EFAULT ? "EFAULT"
                                     : errno == EEXIST ? "EEXIST" : errno == EINVAL ? "EINVAL" : "other");
    return o;
}

/* mincore, msync, mprotect, madvise, mlock, munlock and mremap over
 * [p, p + len), in one line after `what`. */
static void calls(const char *what, unsigned char *p, size_t len) {
    static unsigned char v[1024];
    void *q = mremap(p, len, len, 0);
    printf("%s: mincore %s, msync %s, mprotect %s, madvise %s %s, mlock %s, munlock %s, mremap %s\n", what,
           res(mincore(p, len, v)), res(msync(p, len, MS_SYNC)), res(mprotect(p, len, PROT_READ | PROT_WRITE)),
           res(madvise(p, len, MADV_NORMAL)), res(madvise(p, len, MADV_DONTFORK) || madvise(p, len, MADV_DOFORK)),
           res(mlock(p, len)), res(munlock(p, len)), res(q == MAP_FAILED ? -1 : 0));
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned char *r = filled(4 * MB, 3);
    if (munmap(r + MB, MB)) return 4;
    unsigned char *h = r + MB;
    calls("the hole", h, 4096);
    calls("the hole's last page and the next", h + MB - 4096, 8192);
    calls("the page before it and its first", h - 4096, 8192);
    void *grown = mremap(h - 4096, 8192, 16384, MREMAP_MAYMOVE);
    printf("mremap growing the page before it and its first: %s\n", res(grown == MAP_FAILED ? -1 : 0));
    calls("either side of it", r, MB);
    printf("either side, after: %ld and %ld wrong bytes\n", wrong(r, MB, MB, 3), wrong(h + MB, 2 * MB, 2 * MB, 3) == 0 ? 0L : 1L);
    void *nr = mmap(r, MB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("MAP_FIXED_NOREPLACE over memory in use: %s\n", res(nr == MAP_FAILED ? -1 : 0));

    /* A fixed mapping over half the hole, then many mappings of its size. */
    unsigned char *f = mmap(h, MB / 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    void *g = mmap(h + MB / 2, MB / 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (f != h || g != h + MB / 2) return 5;
    for (size_t i = 0; i < MB; i++) h[i] = pat(i, 7);
    calls("mapped again", h, MB);
    int overlap = 0;
    unsigned char *m[32];
    for (int i = 0; i < 32; i++) {
        m[i] = filled(MB, (unsigned)i + 11);
        overlap += m[i] < h + MB && h < m[i] + MB;
    }
    long w = wrong(h, MB, MB, 7) + wrong(r, MB, MB, 3) + wrong(h + MB, 2 * MB, 2 * MB, 3);
    for (int i = 0; i < 32; i++) w += wrong(m[i], MB, MB, (unsigned)i + 11);
    printf("32 mappings after it: %d over the fixed one, %ld wrong bytes\n", overlap, w);

    /* Unmapped twice and across: a hole again, and mappings after it
     * still get their own memory. */
    printf("munmap of the fixed one %s, again %s, across it %s\n", res(munmap(h, MB)), res(munmap(h, MB)),
           res(munmap(h - 4096, MB + 8192)));
    calls("a hole again", h - 4096, 4096);
    unsigned char *hinted = mmap(h, MB / 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("a hint at the hole: %s\n", hinted == h ? "granted" : "elsewhere");
    if (hinted == MAP_FAILED) return 7;
    memset(hinted, 0x33, MB / 2);
    unsigned char *n[8];
    for (int i = 0; i < 8; i++) n[i] = filled(MB, (unsigned)i + 50);
    w = wrong(r, MB - 4096, MB - 4096, 3);
    for (size_t i = 0; i < MB / 2; i++) w += hinted[i] != 0x33;
    for (int i = 0; i < 8; i++) w += wrong(n[i], MB, MB, (unsigned)i + 50);
    for (int i = 0; i < 32; i++) w += wrong(m[i], MB, MB, (unsigned)i + 11);
    printf("8 more mappings: %ld wrong bytes\n", w);
    return 0;
}
