/* Memory the program unmapped is gone: a touch there is a SIGSEGV, as
 * the kernel makes it (ztier's arena kept such ranges read-write, and a
 * use after munmap read zeros unseen). Touched after munmap, after an
 * mremap that shrinks, and after an mremap that moves; then the same
 * addresses handed out again (by mmap and malloc) read zeros and take
 * writes, through a churn that pushes them out of memory (16M budget).
 * Prints what it found. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>

#include "maps.h"

static sigjmp_buf back;
static void on_segv(int sig) { siglongjmp(back, sig); }

/* What a read of *p gives: "reads N" or "SIGSEGV" (a buffer of its own
 * for each of the last four calls: a printf may make several). */
static const char *touch(volatile unsigned char *p) {
    static char out[4][32];
    static int k;
    char *o = out[k++ % 4];
    if (sigsetjmp(back, 1)) return "SIGSEGV";
    snprintf(o, sizeof out[0], "reads %d", *p);
    return o;
}

static long not(const unsigned char *p, size_t len, int v) {
    long w = 0;
    for (size_t i = 0; i < len; i++) w += p[i] != v;
    return w;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGSEGV, on_segv);
    unsigned char *a = map(8 * MB, PROT_READ | PROT_WRITE, 0, NULL);
    memset(a, 7, 8 * MB);
    churn();
    munmap(a, 8 * MB);
    printf("after munmap: %s, %s\n", touch(a), touch(a + 8 * MB - 1));

    unsigned char *b = map(8 * MB, PROT_READ | PROT_WRITE, 0, NULL);
    memset(b, 8, 8 * MB);
    if (mremap(b, 8 * MB, 2 * MB, 0) != b) return 4;
    printf("after shrinking: kept %s, cut %s\n", touch(b + MB), touch(b + 5 * MB));

    /* The first half of a mapping grown: the second half, made
     * read-only, is in the way, so it moves. */
    unsigned char *c = map(8 * MB, PROT_READ | PROT_WRITE, 0, NULL);
    memset(c, 9, 8 * MB);
    if (mprotect(c + 4 * MB, 4 * MB, PROT_READ)) return 5;
    unsigned char *moved = mremap(c, 4 * MB, 16 * MB, MREMAP_MAYMOVE);
    if (moved == MAP_FAILED || moved == c) return 5;
    printf("after a move: the old place %s, the half in the way %s\n", touch(c + MB), touch(c + 5 * MB));
    printf("  the new place %s, %ld wrong\n", touch(moved), not(moved, 4 * MB, 9));

    /* Reuse: many maps and unmaps, then everything read and written. */
    unsigned char *m[16];
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < 16; i++) {
            m[i] = map((size_t)(i % 4 + 1) * MB, PROT_READ | PROT_WRITE, 0, NULL);
            if (not(m[i], (size_t)(i % 4 + 1) * MB, 0)) printf("round %d map %d: not zeros\n", r, i);
            memset(m[i], i + 1, (size_t)(i % 4 + 1) * MB);
        }
        churn();
        long w = 0;
        for (int i = 0; i < 16; i++) {
            w += not(m[i], (size_t)(i % 4 + 1) * MB, i + 1);
            if (i % 2) munmap(m[i], (size_t)(i % 4 + 1) * MB);
        }
        for (int i = 0; i < 16; i += 2) munmap(m[i], (size_t)(i % 4 + 1) * MB);
        printf("round %d: %ld wrong, then unmapped: %s\n", r, w, touch(m[5]));
    }
    unsigned char *big = malloc(32 * MB);
    if (!big) return 6;
    memset(big, 3, 32 * MB);
    churn();
    printf("malloc after it all: %ld wrong\n", not(big, 32 * MB, 3));
    return 0;
}
