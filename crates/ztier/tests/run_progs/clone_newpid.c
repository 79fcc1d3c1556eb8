/* Children that glibc's clone() starts in new PID namespaces
 * (CLONE_NEWPID | SIGCHLD; root only), each PID 1 there: three in turn,
 * each checking every word of the patterned heap, most of it evicted at
 * the clone under a small budget, and saying its PID. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "patterned_heap.h"

#define CHILD_STACK (256 * 1024)

static int child(void *arg) {
    long wrong = wrong_words(1);
    printf("child %d: PID %d in its namespace, %ld wrong words\n", *(int *)arg, (int)getpid(), wrong);
    fflush(stdout);
    return wrong ? 1 : 0;
}

int main(void) {
    if (!fill_heap()) return 3;
    char *stack = malloc(CHILD_STACK);
    if (!stack) return 3;
    for (int k = 1; k <= 3; k++) {
        fflush(stdout);
        int pid = clone(child, stack + CHILD_STACK, CLONE_NEWPID | SIGCHLD, &k);
        if (pid < 0) {
            perror("clone(CLONE_NEWPID)");
            return 4;
        }
        int status;
        if (waitpid(pid, &status, 0) != pid) return 5;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 6;
    }
    return 0;
}
