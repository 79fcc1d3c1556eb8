/* Blocks glibc allocates for itself and touches inside fork(), after
 * the fork handlers ran: the NSS configuration's state (made by the
 * first user lookup, read and locked by the parent's fork, written again
 * in the child) and an open FILE (fopen's; the child's fork resets its
 * lock). Both are made after a 64 MiB heap (so with ztier's library
 * started), then pushed out of a 16M budget by sweeping the heap before
 * each of 20 forks; each child writes to the FILE, looks the user up
 * again and exits. Under `ztier run` they were arena memory: the parent
 * faulted on the NSS state inside fork with the library's lock held and
 * hung (CPython's test_os, test_waitpid), and a child's write to the
 * FILE landed on a page of zeros before its library registered the
 * arena. Output is the same natively. */
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((64u << 20) / 8)

int main(void) {
    uint64_t *a = malloc(WORDS * 8);
    if (!a) return 1;
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 2654435761u;
    struct passwd *pw = getpwuid(getuid());
    if (!pw) return 1;
    char name[64];
    snprintf(name, sizeof name, "%s", pw->pw_name);
    FILE *f = fopen("/dev/null", "w");
    if (!f || fprintf(f, "parent\n") < 0 || fflush(f) != 0) return 1;
    int ok = 0, sum_ok = 1;
    for (int round = 0; round < 20; round++) {
        uint64_t s = 0;
        for (uint64_t i = 0; i < WORDS; i++) s += a[i];
        if (s != (uint64_t)(((unsigned __int128)(WORDS - 1) * WORDS / 2 * 2654435761u) & UINT64_MAX)) sum_ok = 0;
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            int good = fprintf(f, "child %d\n", round) > 0 && fflush(f) == 0;
            struct passwd *p = getpwuid(getuid());
            good = good && p && strcmp(p->pw_name, name) == 0 && fclose(f) == 0;
            _exit(good ? 0 : 1);
        }
        int st;
        if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
    }
    printf("forks 20, children ok %d, heap %s\n", ok, sum_ok ? "intact" : "CHANGED");
    return fclose(f) == 0 ? 0 : 1;
}
