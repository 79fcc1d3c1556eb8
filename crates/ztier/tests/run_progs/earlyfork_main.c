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

#define BLOCKS 3072
#define WORDS 4096
static uint64_t *block[BLOCKS];
static volatile long wrong = -1;

static uint64_t pattern(unsigned b, unsigned i) { return (b * 0x9E3779B97F4A7C15u) ^ (i * 0xD1B54A32D192ED03u); }

static void in_child_handler(void) {
    long n = 0;
    for (unsigned b = 0; b < BLOCKS; b++)
        for (unsigned i = 0; i < WORDS; i += WORDS - 1) n += block[b][i] != pattern(b, i);
    wrong = n;
}

int main(void) {
    for (unsigned b = 0; b < BLOCKS; b++) {
        block[b] = malloc(WORDS * 8);
        if (!block[b]) return 3;
        for (unsigned i = 0; i < WORDS; i++) block[b][i] = pattern(b, i);
    }
    earlyfork_hook = in_child_handler;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 4;
    if (pid == 0) {
        if (wrong != 0) _exit(1);
        for (unsigned b = 0; b < BLOCKS; b++)
            for (unsigned i = 0; i < WORDS; i++)
                if (block[b][i] != pattern(b, i)) _exit(2);
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return 5;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    printf("fork handler of a library: %s\n",
           code == 0 ? "the child saw the heap" : code == 1 ? "its handler read wrong words" : "the child read wrong words");
    return code;
}
