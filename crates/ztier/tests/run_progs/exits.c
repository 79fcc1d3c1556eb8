/* Forked children that end without their exit handlers: a 64 MiB heap
 * of patterned words, then four children, each of which checks the
 * second or the third 16 MiB slice (cold under a 16M budget) and ends:
 * by _exit, by _Exit, by exit, and from a signal handler by _exit. Then
 * a vfork child that ends by _exit at once (it shares the parent's
 * memory and must not end anything of the parent's). The parent checks
 * the whole heap. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((64u << 20) / 8)
#define SLICE (WORDS / 4)

static uint64_t *a;

static int check(uint64_t from, uint64_t n) {
    for (uint64_t i = from; i < from + n; i++)
        if (a[i] != i * 2654435761u) return 0;
    return 1;
}

static void on_alarm(int sig) {
    (void)sig;
    _exit(check(2 * SLICE, SLICE) ? 0 : 1);
}

int main(void) {
    a = malloc(WORDS * 8);
    if (!a) return 1;
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 2654435761u;
    unsigned ok = 0;
    for (unsigned k = 0; k < 4; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (k == 3) {
                signal(SIGALRM, on_alarm);
                raise(SIGALRM);
                return 3;
            }
            int good = check((1 + k % 2) * SLICE, SLICE);
            if (k == 0) _exit(good ? 0 : 1);
            if (k == 1) _Exit(good ? 0 : 1);
            exit(good ? 0 : 1);
        }
        int st;
        if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
    }
    pid_t v = vfork();
    if (v == 0) _exit(7);
    int st;
    int vfork_ok = v > 0 && waitpid(v, &st, 0) == v && WIFEXITED(st) && WEXITSTATUS(st) == 7;
    printf("children ok %u of 4, vfork child %s\n", ok, vfork_ok ? "ok" : "failed");
    printf("heap intact: %d\n", check(0, WORDS));
    return 0;
}
