/* MADV_WIPEONFORK (a random generator's state, wiped so that a forked
 * child notices), MADV_KEEPONFORK over part of it, MADV_DONTFORK, and a
 * mapping made where a wiped one was unmapped: in a forked child the
 * wiped pages read as zeros, cold (evicted before the fork) or hot, and
 * nothing else does; the range kept from the child faults (SIGSEGV) in
 * it; the parent keeps its bytes. Natively and in every
 * mode of `ztier run` the same output. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define P 4096
#define HEAP (64u << 20)

static char *map(size_t n, int fill) {
    char *p = mmap(NULL, n * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(2);
    memset(p, fill, n * P);
    return p;
}

/* The byte each page is filled with (0 for a zero page, -1 if its
 * first and last bytes differ). */
static void show(const char *who, const char *name, const char *p, size_t n) {
    printf("%s %s:", who, name);
    for (size_t i = 0; i < n; i++) printf(" %d", p[i * P] == p[i * P + P - 1] ? p[i * P] : -1);
    printf("\n");
}

static sigjmp_buf caught;

static void on_segv(int sig) {
    (void)sig;
    siglongjmp(caught, 1);
}

/* In the child: does a read of `p` fault (SIGSEGV), as where nothing is
 * mapped? */
static void touch(const char *who, const char *name, const volatile char *p) {
    signal(SIGSEGV, on_segv);
    if (sigsetjmp(caught, 1)) {
        printf("%s %s: SIGSEGV\n", who, name);
        return;
    }
    printf("%s %s: read %d\n", who, name, p[0]);
}

int main(void) {
    char *heap = malloc(HEAP);
    if (!heap) return 1;
    char *cold = map(4, 11), *hot = map(4, 22), *dont = map(2, 33), *gone = map(4, 44);
    if (madvise(cold, 4 * P, MADV_WIPEONFORK) || madvise(hot, 4 * P, MADV_WIPEONFORK) ||
        madvise(hot + P, 2 * P, MADV_KEEPONFORK) || madvise(dont, 2 * P, MADV_DONTFORK) ||
        madvise(gone, 4 * P, MADV_WIPEONFORK)) {
        perror("madvise");
        return 1;
    }
    /* A mapping where the wiped one was (or anywhere): not wiped. */
    munmap(gone, 4 * P);
    char *again = map(4, 55);
    /* `cold` goes out of memory under a 16M budget; `hot` is touched last. */
    memset(heap, 1, HEAP);
    memset(hot, 22, 4 * P);
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        show("child", "wiped cold", cold, 4);
        show("child", "wiped hot, middle kept", hot, 4);
        show("child", "mapped after a wiped one", again, 4);
        touch("child", "not forked", dont);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    show("parent", "wiped cold", cold, 4);
    show("parent", "wiped hot, middle kept", hot, 4);
    show("parent", "not forked", dont, 2);
    show("parent", "mapped after a wiped one", again, 4);
    return 0;
}
