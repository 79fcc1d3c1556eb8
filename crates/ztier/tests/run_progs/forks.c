/* 48 MiB of patterned heap, then: fork without exec (the child checks
 * every word and changes half of it; the parent's copy must not change),
 * fork + exec (argv[1] is run), and the parent checks again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((48u << 20) / 8)

static int check(const uint64_t *a, uint64_t salt) {
    for (uint64_t i = 0; i < WORDS; i++)
        if (a[i] != i * 31 + salt) return 0;
    return 1;
}

int main(int argc, char **argv) {
    uint64_t *a = malloc(WORDS * 8);
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 31 + 7;
    pid_t c = fork();
    if (c == 0) {
        if (!check(a, 7)) { printf("child: wrong data\n"); _exit(3); }
        for (uint64_t i = 0; i < WORDS; i += 2) a[i] = 0;
        uint64_t *b = malloc(WORDS * 4);   /* the child allocates too */
        for (uint64_t i = 0; i < WORDS / 2; i++) b[i] = i;
        uint64_t s = 0;
        for (uint64_t i = 0; i < WORDS / 2; i++) s += b[i];
        printf("child: ok %llu\n", (unsigned long long)s);
        fflush(stdout);
        exit(0);   /* exit, not _exit: the library writes its statistics at exit */
    }
    int st;
    waitpid(c, &st, 0);
    printf("fork child exit %d\n", WEXITSTATUS(st));
    fflush(stdout);
    if (argc > 1) {
        c = fork();
        if (c == 0) { execvp(argv[1], argv + 1); _exit(127); }
        waitpid(c, &st, 0);
        printf("exec child exit %d\n", WEXITSTATUS(st));
    }
    printf("parent: %s\n", check(a, 7) ? "ok" : "wrong data");
    return 0;
}
