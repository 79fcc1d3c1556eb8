/* glibc's _Fork (2.34 on): a fork that runs no pthread_atfork handlers,
 * for a child that makes only async-signal-safe calls. 96 MiB of heap in
 * 3,072 blocks of 32 KiB, each word a pattern of its block, most of it
 * cold (evicted) at the fork under a small budget; the child checks
 * every word and exits with 0 if all hold their pattern, then the
 * parent checks them too. Linked alone (ztier's malloc) and with
 * ownalloc.c (a malloc of the program's own). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "patterned_heap.h"

int main(void) {
    if (!fill_heap()) return 3;
    fflush(stdout);
    pid_t pid = _Fork();
    if (pid < 0) return 4;
    if (pid == 0) _exit(wrong_words(1) ? 1 : 0);
    int status;
    if (waitpid(pid, &status, 0) != pid) return 5;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("_Fork: the child %s; the parent read %ld wrong words\n", ok ? "saw the heap" : "read wrong words",
           wrong_words(1));
    return ok ? 0 : 1;
}
