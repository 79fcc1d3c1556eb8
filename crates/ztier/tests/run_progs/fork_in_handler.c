/* glibc's _Fork from a signal handler, as a crash handler starts a
 * reporter: a one-shot SIGALRM 1 ms after each forks a child that exits
 * 7 and waits for it. 40 such forks while the program allocates and
 * frees small blocks all the time, so that the signal often interrupts
 * malloc or free; then 40 more while it reallocates, between 64 bytes
 * and 32 KiB, a block it allocated first of all — before ztier starts
 * (after the program's first MiB of requests), so glibc's, and glibc's
 * still under ztier: the signal often interrupts glibc's realloc,
 * holding glibc's allocator lock. Prints how many children there were
 * and how many exited 7, for each part. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#define FORKS 40
static volatile int forks, good, limit;
static void arm(void) {
    struct itimerval it = {{0, 0}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}
static void on_alarm(int s) {
    (void)s;
    pid_t p = _Fork();
    if (p == 0) _exit(7);
    if (p > 0) {
        int st;
        if (waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 7) good++;
        forks++;
    }
    if (forks < limit) arm();
}
int main(void) {
    char *early = malloc(64);
    /* Past the first MiB: ztier starts here. */
    free(malloc(2 << 20));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    limit = FORKS;
    arm();
    void *keep[256] = {0};
    unsigned long n = 0;
    while (forks < limit) {
        unsigned k = (unsigned)(n * 2654435761u) % 256;
        free(keep[k]);
        keep[k] = malloc(16 + (n % 200));
        n++;
    }
    printf("_Fork in a signal handler over malloc and free: %d children, %d exited 7\n", forks, good);
    forks = good = 0;
    limit = FORKS;
    arm();
    for (n = 0; forks < limit; n++) {
        early = realloc(early, n % 2 ? 64 : 32768);
        early[0] = (char)n;
    }
    printf("_Fork in a signal handler over glibc's realloc: %d children, %d exited 7\n", forks, good);
    free(early);
    return 0;
}
