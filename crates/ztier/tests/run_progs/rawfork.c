/* Forks made by the program's own system calls, which no fork handler
 * sees: syscall(SYS_fork) and syscall(SYS_clone, SIGCHLD, 0, ...), and
 * glibc's clone(fn, stack, SIGCHLD, arg), whose child runs fn on a stack
 * of its own (a static one, then one from malloc); then both clones with
 * CLONE_VFORK but not CLONE_VM (the parent waits until the child ends,
 * and the child has a copy of the memory all the same). 96 MiB
 * of heap in 3,072 blocks of 32 KiB, each word a pattern of its block,
 * most of it cold (evicted) at each fork under a small budget; each child
 * checks every word and exits with 0 if all hold their pattern. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "patterned_heap.h"

#define CHILD_STACK (64 * 1024)
static char static_stack[CHILD_STACK] __attribute__((aligned(16)));

/* A child of clone(): 0 if every word holds its pattern. */
static int check(void *arg) {
    (void)arg;
    return wrong_words(1) ? 1 : 0;
}

int main(void) {
    if (!fill_heap()) return 3;
    const char *names[6] = {"SYS_fork",           "SYS_clone",
                            "clone (static stack)", "clone (heap stack)",
                            "SYS_clone, CLONE_VFORK", "clone, CLONE_VFORK"};
    char *heap_stack = malloc(CHILD_STACK);
    if (!heap_stack) return 3;
    int bad = 0;
    for (int k = 0; k < 6; k++) {
        fflush(stdout);
        long pid = k == 0   ? syscall(SYS_fork)
                   : k == 1 ? syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0)
                   : k == 4 ? syscall(SYS_clone, CLONE_VFORK | SIGCHLD, 0, 0, 0, 0)
                   : k == 5 ? clone(check, static_stack + CHILD_STACK, CLONE_VFORK | SIGCHLD, NULL)
                            : clone(check, (k == 2 ? static_stack : heap_stack) + CHILD_STACK, SIGCHLD, NULL);
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
