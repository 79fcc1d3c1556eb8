/* malloc blocks freed with a page still protected, as a fiber library
 * leaves the guard page of a stack it allocated with posix_memalign:
 * glibc unmaps such a block (over its 128 KiB threshold), protection
 * and all, so the next malloc of that memory is plain read-write. 200
 * rounds of a 1 MiB block freed with a PROT_NONE guard page and one
 * freed read-only, each followed by mallocs of the same size that are
 * written whole; 64 MiB of heap churn in between, under a small budget
 * so that the blocks are evicted and faulted back too. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1u << 20)

int main(void) {
    long sum = 0;
    char *heap = malloc(64 * MB);
    if (!heap) return 1;
    for (int r = 0; r < 200; r++) {
        void *g, *ro;
        if (posix_memalign(&g, 4096, MB) || posix_memalign(&ro, 4096, MB)) return 1;
        memset(g, r, MB);
        memset(ro, r + 1, MB);
        if (mprotect(g, 4096, PROT_NONE) || mprotect(ro, MB, PROT_READ)) {
            perror("mprotect");
            return 2;
        }
        sum += ((char *)g)[4096] + ((char *)ro)[MB - 1];
        free(g);
        free(ro);
        for (int k = 0; k < 2; k++) {
            char *s = malloc(MB);
            memset(s, 3, MB);
            sum += s[0] + s[MB - 1];
            free(s);
        }
        if (r % 20 == 0) memset(heap, r, 64 * MB);
    }
    printf("guarded and read-only blocks freed: sum %ld\n", sum);
    return 0;
}
