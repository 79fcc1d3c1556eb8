/* Many forks of a process whose heap is mostly evicted: 64 MiB of
 * patterned words, then 200 children (argv[1]: how many), each of which first closes every
 * descriptor from 3 to 99 that it does not know of, as a shell's
 * subshell does (some of them are not open: a blind close), then checks
 * a 1 MiB slice of the heap (which the parent read just before the
 * fork), writes its own pattern over it, checks it again (every tenth
 * child after pushing it out of memory) and exits; every tenth child
 * first forks a grandchild that checks another slice. The parent checks the whole heap at the end
 * (the children's writes are theirs alone). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((64u << 20) / 8)
#define SLICE ((1u << 20) / 8)

static uint64_t *a;

static int check(uint64_t from, uint64_t n, uint64_t salt) {
    for (uint64_t i = from; i < from + n; i++)
        if (a[i] != i * 2654435761u + salt) return 0;
    return 1;
}

/* Status 0 if the slice at `k` reads as the parent wrote it, and as this
 * process then writes it. */
static uint64_t slice_of(unsigned k) { return (uint64_t)(k * 7919u % (WORDS / SLICE)) * SLICE; }

static int child(unsigned k) {
    for (int fd = 3; fd < 100; fd++) close(fd);
    uint64_t from = slice_of(k);
    if (!check(from, SLICE, 0)) return 1;
    for (uint64_t i = from; i < from + SLICE; i++) a[i] = i * 2654435761u + k + 1;
    if (k % 10 == 5) {
        /* Its slice pushed out of memory before it is checked again: the
         * parent read it just before the fork, so a kept copy of the
         * parent's bytes must not stand for the child's. */
        uint64_t other = (from + WORDS / 2) % WORDS, sum = 0;
        for (uint64_t i = 0; i < WORDS / 3; i += 512) sum += a[(other + i) % WORDS];
        if (sum == 1) return 4;
    }
    return check(from, SLICE, k + 1) ? 0 : 2;
}

static int wait_ok(pid_t pid) {
    int st;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    unsigned children = argc > 1 ? (unsigned)atoi(argv[1]) : 200;
    a = malloc(WORDS * 8);
    if (!a) return 1;
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 2654435761u;
    unsigned ok = 0, grand = 0, grand_ok = 0;
    for (unsigned k = 0; k < children; k++) {
        /* The parent reads the child's slice first: under a budget it
         * comes back from the store, its copy kept there. */
        if (!check(slice_of(k), SLICE, 0)) return 5;
        pid_t pid = fork();
        if (pid == 0) {
            if (k % 10 == 0) {
                pid_t g = fork();
                if (g == 0) exit(child(k + 1000));
                if (!wait_ok(g)) exit(3);
            }
            exit(child(k));
        }
        if (k % 10 == 0) grand++;
        if (wait_ok(pid)) {
            ok++;
            grand_ok += k % 10 == 0;
        }
    }
    printf("children ok %u of %u, with their grandchildren %u of %u\n", ok, children, grand_ok, grand);
    printf("parent's heap intact: %d\n", check(0, WORDS, 0));
    return 0;
}
