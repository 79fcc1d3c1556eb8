/* A plugin opened with RTLD_DEEPBIND (by deepbind.c), as PHP opens its
 * extensions: it frees blocks the program allocated, and hands the
 * program blocks to free. */
#include <stdlib.h>
#include <string.h>

void plugin_drop(void *p) { free(p); }

char *plugin_copy(const char *s, size_t n) {
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void *plugin_grow(void *p, size_t n) { return realloc(p, n); }
