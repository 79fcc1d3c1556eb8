/* A library whose constructor allocates, linked by ownmalloc.c as
 * libLLVM is by rustc: its constructor runs before the preloaded
 * library's (the dynamic linker orders a preloaded library after the
 * program's dependencies), and its `malloc` is the program's own. Built
 * with -shared -fPIC by the test that runs ownmalloc. */
#include <stdlib.h>

__attribute__((constructor)) static void allocate_early(void) {
    /* The program's allocator maps its first 4 MiB now, holding its
     * lock. */
    void *p = malloc(100);
    if (!p) abort();
    free(p);
}
