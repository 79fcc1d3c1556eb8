/* A fork `child` handler registered before ztier's library starts
 * (earlyfork.c, linked in) reads the program's heap: 96 MiB in 3,072
 * blocks of 32 KiB, each word a pattern of its block, most of it cold
 * (evicted) at the fork under a small budget. The handler counts the
 * words of each block's first and last page that differ; the child
 * exits with 0 if none did, and the parent says so. Then the child
 * checks every word itself, after the handlers, and exits 2 if one
 * differs. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern void (*earlyfork_hook)(void);

#include "patterned_heap.h"

static volatile long wrong = -1;

/* Each block's first and last word. */
static void in_child_handler(void) { wrong = wrong_words(WORDS - 1); }

int main(void) {
    if (!fill_heap()) return 3;
    earlyfork_hook = in_child_handler;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 4;
    if (pid == 0) {
        if (wrong != 0) _exit(1);
        _exit(wrong_words(1) ? 2 : 0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return 5;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    printf("fork handler of a library: %s\n",
           code == 0 ? "the child saw the heap" : code == 1 ? "its handler read wrong words" : "the child read wrong words");
    return code;
}
