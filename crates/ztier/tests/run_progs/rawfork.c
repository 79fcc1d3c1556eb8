/* Forks made by the program's own system calls, which no fork handler
 * sees: syscall(SYS_fork) and syscall(SYS_clone, SIGCHLD, 0, ...). 96 MiB
 * of heap in 3,072 blocks of 32 KiB, each word a pattern of its block,
 * most of it cold (evicted) at each fork under a small budget; each child
 * checks every word and exits with 0 if all hold their pattern. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "patterned_heap.h"

int main(void) {
    if (!fill_heap()) return 3;
    const char *names[2] = {"SYS_fork", "SYS_clone"};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        fflush(stdout);
        long pid = k == 0 ? syscall(SYS_fork) : syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid < 0) return 4;
        if (pid == 0) _exit(wrong_words(1) ? 1 : 0);
        int status;
        if (waitpid((pid_t)pid, &status, 0) != pid) return 5;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        bad += !ok;
        printf("%s: the child %s\n", names[k], ok ? "saw the heap" : "read wrong words");
    }
    return bad;
}
