/* A program that crashes with its heap cold: PAGES pages of one large
 * block and OBJS small blocks, each starting with a numbered marker
 * ("ztier-core-page-%08d", "ztier-core-obj-%08d"), then one of:
 *   abort  abort() (SIGABRT)
 *   segv   a write through a null pointer (SIGSEGV)
 *   bus    a read past the end of a truncated file mapping (SIGBUS)
 *   chain  a SIGSEGV handler of its own that puts back the action it
 *          found and returns, so the fault comes again (CPython's
 *          faulthandler does this)
 * Before it, the program asks for its SIGSEGV action and puts SIGABRT's
 * default back: both must look as natively (the default).
 * A core dump must hold every marker, as natively. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGES 6144
#define OBJS 32768
#define OBJ 128

static struct sigaction found;

static void put_back(int sig) { sigaction(sig, &found, NULL); }

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "abort";
    char *big = malloc((size_t)PAGES * 4096);
    if (!big) return 2;
    for (int i = 0; i < PAGES; i++) {
        char *p = big + (size_t)i * 4096;
        memset(p, 'a' + i % 26, 4096);
        snprintf(p, 64, "ztier-core-page-%08d", i);
    }
    for (int i = 0; i < OBJS; i++) {
        char *o = malloc(OBJ);
        if (!o) return 2;
        memset(o, 'A' + i % 26, OBJ);
        snprintf(o, 64, "ztier-core-obj-%08d", i);
    }
    struct sigaction q;
    sigaction(SIGSEGV, NULL, &q);
    void (*was)(int) = signal(SIGABRT, SIG_DFL);
    printf("filled %d pages and %d objects, then %s; SIGSEGV shown as default: %d, SIGABRT was: %d\n", PAGES,
           OBJS, kind, q.sa_handler == SIG_DFL && q.sa_flags == 0, was == SIG_DFL);
    fflush(stdout);
    if (!strcmp(kind, "abort")) abort();
    if (!strcmp(kind, "segv")) *(volatile int *)(long)argc = 0 * argc;
    if (!strcmp(kind, "bus")) {
        int fd = open("crash-mapped", O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, 4096)) return 3;
        volatile char *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED || ftruncate(fd, 0)) return 3;
        return m[0];
    }
    if (!strcmp(kind, "chain")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = put_back;
        sigaction(SIGSEGV, &sa, &found);
        *(volatile int *)(long)argc = 0;
    }
    return 4;
}
