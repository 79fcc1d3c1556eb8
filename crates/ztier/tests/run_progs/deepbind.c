/* A plugin opened with RTLD_DEEPBIND (deep.c, built as ./libdeep.so), the
 * way PHP opens its extensions: blocks pass between the program and the
 * plugin both ways, freed and grown on the other side, small and large,
 * through a churn that pushes them out of memory (16M budget). Under
 * ztier run the plugin's malloc and free were glibc's while the
 * program's were ztier's, and the first block the plugin freed aborted
 * the program ("free(): invalid pointer"). Prints what it found. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    void *h = dlopen("./libdeep.so", RTLD_NOW | RTLD_DEEPBIND);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 2;
    }
    void (*drop)(void *) = (void (*)(void *))dlsym(h, "plugin_drop");
    char *(*copy)(const char *, size_t) = (char *(*)(const char *, size_t))dlsym(h, "plugin_copy");
    void *(*grow)(void *, size_t) = (void *(*)(void *, size_t))dlsym(h, "plugin_grow");
    if (!drop || !copy || !grow) return 3;
    long wrong = 0, sum = 0;
    for (int round = 0; round < 3; round++) {
        char *mine[64], *theirs[64];
        for (int i = 0; i < 64; i++) {
            size_t n = (i % 2) ? 100 + (size_t)i : ((size_t)1 << 20) + (size_t)i;
            mine[i] = malloc(n);
            memset(mine[i], i, n);
            theirs[i] = copy(mine[i], n);
            theirs[i] = grow(theirs[i], n + 4096);
        }
        char *churn = malloc(48u << 20);
        memset(churn, 1, 48u << 20);
        free(churn);
        for (int i = 0; i < 64; i++) {
            size_t n = (i % 2) ? 100 + (size_t)i : ((size_t)1 << 20) + (size_t)i;
            for (size_t k = 0; k < n; k += 97) wrong += (theirs[i][k] != (char)i) + (mine[i][k] != (char)i);
            sum += theirs[i][n - 1];
            drop(mine[i]);
            free(theirs[i]);
        }
    }
    printf("deep-bound plugin: %ld wrong bytes, sum %ld\n", wrong, sum);
    return dlclose(h);
}
