/* A library that registers a fork handler in its constructor, as
 * libraries do at load: the constructor runs before the preloaded
 * library's (the dynamic linker orders a preloaded library after the
 * program's dependencies), so its handler is registered before the
 * library's own. Its `child` handler calls the hook the program set
 * (earlyfork_main.c). Built with -shared -fPIC by the test. */
#include <pthread.h>
#include <stdlib.h>

void (*earlyfork_hook)(void);

static void child(void) {
    if (earlyfork_hook) earlyfork_hook();
}

__attribute__((constructor)) static void register_handler(void) {
    if (pthread_atfork(NULL, NULL, child)) abort();
}
