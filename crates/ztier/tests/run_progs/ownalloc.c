/* A malloc of a program's own, linked into its executable, as rustc
 * has jemalloc: the program's calls and glibc's and the dynamic linker's
 * (a new thread's TLS, in pthread_create, and in glibc's internal one)
 * all come to it, not to the library's. Like jemalloc, it maps its
 * memory with mmap while it holds its lock, which is not recursive: a
 * call into it from inside that mmap waits for ever.
 *
 * Like jemalloc, it registers fork handlers at its first call (with
 * ownmalloc_early.c linked in, before the preloaded library starts):
 * `prepare` takes its lock and, with OWNMALLOC_TOUCH=1, reads the first
 * word of each of its chunks (cold, as jemalloc's mutexes in its
 * metadata), `parent` lets the lock go and `child` makes it anew and
 * writes those words.
 *
 * Its `calloc` ends the program when glibc's `__cxa_thread_atexit_impl`
 * calls it: a C program registers no thread-exit destructor, so the
 * call is the preloaded library's (a Rust thread-local with a
 * destructor, first used on some thread), and under `ztier run` that
 * may be where a fault is served, with the library's locks held, while
 * another thread holds this allocator's lock and waits for them.
 *
 * Linked with ownmalloc.c and with sigev_thread.c by the tests. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHUNK (4u << 20)
#define HEADER 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *cur, *end;
/* Its chunks, for `free` to check that a block is its own. */
static char *chunk_lo[1024], *chunk_hi[1024];
static unsigned chunks;
/* Calls so far, for the program to check that they came here. */
unsigned long ownalloc_calls;

/* A block of at least n bytes aligned to `align` (a power of two, at
 * least 16), its size kept in the 16 bytes before it. */
static volatile uint64_t touched;

static void touch_chunks(int write) {
    const char *on = getenv("OWNMALLOC_TOUCH");
    if (!on || strcmp(on, "1") != 0) return;
    for (unsigned k = 0; k < chunks; k++) {
        if (write)
            *(volatile char *)chunk_lo[k] = *(volatile char *)chunk_lo[k];
        else
            touched += *(volatile char *)chunk_lo[k];
    }
}

static void fork_prepare(void) {
    pthread_mutex_lock(&lock);
    touch_chunks(0);
}
static void fork_parent(void) { pthread_mutex_unlock(&lock); }
static void fork_child(void) {
    pthread_mutex_init(&lock, NULL);
    touch_chunks(1);
}

static void *take(size_t n, size_t align) {
    if (n > ((size_t)1 << 40)) {
        errno = ENOMEM;
        return NULL;
    }
    static int registered;
    if (!registered) {
        /* Called first from a library's constructor, with one thread. */
        registered = 1;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
    }
    pthread_mutex_lock(&lock);
    ownalloc_calls++;
    for (;;) {
        uintptr_t p = ((uintptr_t)cur + HEADER + align - 1) & ~(uintptr_t)(align - 1);
        if (cur && p + n <= (uintptr_t)end) {
            cur = (char *)((p + n + 15) & ~(uintptr_t)15);
            ((size_t *)p)[-1] = n;
            pthread_mutex_unlock(&lock);
            return (void *)p;
        }
        size_t len = n + align + HEADER > CHUNK ? (n + align + HEADER + 4095) & ~(size_t)4095 : CHUNK;
        /* Under the lock, as jemalloc grows its extents. */
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            pthread_mutex_unlock(&lock);
            errno = ENOMEM;
            return NULL;
        }
        if (chunks < 1024) {
            chunk_lo[chunks] = m;
            chunk_hi[chunks++] = (char *)m + len;
        }
        cur = m;
        end = (char *)m + len;
    }
}

static size_t size_of(void *p) { return ((size_t *)p)[-1]; }

void *malloc(size_t n) { return take(n, 16); }
/* Frees nothing, but a block that is not its own ends the program, as
 * jemalloc's `free` would go wrong on it: glibc frees each thread's DTV
 * with this `free` when it trims its cache of thread stacks (here at a
 * `pthread_join`), so a DTV moved elsewhere would come here. */
void free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&lock);
    int ours = 0;
    for (unsigned k = 0; k < chunks && !ours; k++) ours = (char *)p >= chunk_lo[k] && (char *)p < chunk_hi[k];
    pthread_mutex_unlock(&lock);
    if (!ours) {
        static const char m[] = "own malloc: free of a block not its own\n";
        if (write(2, m, sizeof m - 1) < 0) _exit(4);
        abort();
    }
}
extern int __cxa_thread_atexit_impl(void (*)(void *), void *, void *);

void *calloc(size_t n, size_t size) {
    /* Called from inside __cxa_thread_atexit_impl (its calloc call is
     * near its start). */
    if ((uintptr_t)__builtin_return_address(0) - (uintptr_t)&__cxa_thread_atexit_impl < 256) {
        static const char m[] = "own malloc: calloc from __cxa_thread_atexit_impl: a thread-exit destructor registered\n";
        if (write(2, m, sizeof m - 1) < 0) _exit(4);
        abort();
    }
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = take(n * size, 16);
    if (p) memset(p, 0, n * size);
    return p;
}
void *realloc(void *p, size_t n) {
    void *q = take(n, 16);
    if (p && q) memcpy(q, p, size_of(p) < n ? size_of(p) : n);
    return q;
}
void *memalign(size_t align, size_t n) { return take(n, align < 16 ? 16 : align); }
void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    void *p = memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) & ~(size_t)4095); }
size_t malloc_usable_size(void *p) { return p ? size_of(p) : 0; }
