/* Two children that glibc's clone() starts in new PID namespaces
 * (CLONE_NEWPID | SIGCHLD; root only), each PID 1 there, alive at the
 * same time: each checks every word of the patterned heap, most of it
 * evicted at the clone under a small budget, says so, and waits. Then
 * the parent prints the children's PIDs (as the rest of the machine sees
 * them) and waits for a line on stdin, for its asker to ask each child
 * for its statistics meanwhile, before it lets them end. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "patterned_heap.h"

#define CHILD_STACK (256 * 1024)

static int ready[2], release[2];

static int child(void *arg) {
    long wrong = wrong_words(1);
    printf("child %d: PID %d in its namespace, %ld wrong words\n", *(int *)arg, (int)getpid(), wrong);
    fflush(stdout);
    close(release[1]);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) return 2;
    /* Until the parent closes its end. */
    while (read(release[0], &c, 1) > 0) {
    }
    return wrong ? 1 : 0;
}

int main(void) {
    if (!fill_heap()) return 3;
    if (pipe(ready) || pipe(release)) return 3;
    int pids[2], ks[2] = {1, 2};
    for (int k = 0; k < 2; k++) {
        char *stack = malloc(CHILD_STACK);
        if (!stack) return 3;
        fflush(stdout);
        pids[k] = clone(child, stack + CHILD_STACK, CLONE_NEWPID | SIGCHLD, &ks[k]);
        if (pids[k] < 0) {
            perror("clone(CLONE_NEWPID)");
            return 4;
        }
        char c;
        if (read(ready[0], &c, 1) != 1) return 5;
    }
    printf("pids %d %d\n", pids[0], pids[1]);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 5;
    close(release[1]);
    for (int k = 0; k < 2; k++) {
        int status;
        if (waitpid(pids[k], &status, 0) != pids[k]) return 5;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 6;
    }
    printf("both ended\n");
    return 0;
}
