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

#define BLOCKS 3072
#define WORDS 4096
static uint64_t *block[BLOCKS];

static uint64_t pattern(unsigned b, unsigned i) { return (b * 0x9E3779B97F4A7C15u) ^ (i * 0xD1B54A32D192ED03u); }

static int heap_holds(void) {
    for (unsigned b = 0; b < BLOCKS; b++)
        for (unsigned i = 0; i < WORDS; i++)
            if (block[b][i] != pattern(b, i)) return 0;
    return 1;
}

int main(void) {
    for (unsigned b = 0; b < BLOCKS; b++) {
        block[b] = malloc(WORDS * 8);
        if (!block[b]) return 3;
        for (unsigned i = 0; i < WORDS; i++) block[b][i] = pattern(b, i);
    }
    const char *names[2] = {"SYS_fork", "SYS_clone"};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        fflush(stdout);
        long pid = k == 0 ? syscall(SYS_fork) : syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid < 0) return 4;
        if (pid == 0) _exit(heap_holds() ? 0 : 1);
        int status;
        if (waitpid((pid_t)pid, &status, 0) != pid) return 5;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        bad += !ok;
        printf("%s: the child %s\n", names[k], ok ? "saw the heap" : "read wrong words");
    }
    return bad;
}
