/* 48 MiB of patterned heap in one large block and 8 MiB of small nodes
 * (the arena's two regions), then: fork without exec (the child checks
 * every word and node and changes half of the words; the parent's copy
 * must not change), fork + exec (argv[1] is run), and the parent checks
 * again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((48u << 20) / 8)

#define NODES (256u << 10)
struct node { struct node *next; uint64_t v[3]; };

/* The list of NODES small objects, built before the large block, so its
 * pages are the coldest and evicted first. */
static struct node *list;

static int check_list(void) {
    uint64_t n = 0;
    for (struct node *p = list; p; p = p->next, n++)
        if (p->v[0] != n * 7 || p->v[1] != ~n || p->v[2] != (n ^ 0x5555)) return 0;
    return n == NODES;
}

static int check(const uint64_t *a, uint64_t salt) {
    if (!check_list()) return 0;
    for (uint64_t i = 0; i < WORDS; i++)
        if (a[i] != i * 31 + salt) return 0;
    return 1;
}

int main(int argc, char **argv) {
    struct node **tail = &list;
    for (uint64_t n = 0; n < NODES; n++) {
        struct node *p = malloc(sizeof *p);
        p->next = NULL;
        p->v[0] = n * 7, p->v[1] = ~n, p->v[2] = n ^ 0x5555;
        *tail = p, tail = &p->next;
    }
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
