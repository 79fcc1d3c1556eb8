/* glibc's _Fork from a signal handler, as a crash handler starts a
 * reporter: a one-shot SIGALRM 1 ms after each (40 in all) forks a child
 * that exits 7 and waits for it, while the program allocates and frees
 * small blocks all the time, so that the signal often interrupts malloc
 * or free. Prints how many children there were and how many exited 7. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#define FORKS 40
static volatile int forks, good;
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
    if (forks < FORKS) arm();
}
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    arm();
    void *keep[256] = {0};
    unsigned long n = 0;
    while (forks < FORKS) {
        unsigned k = (unsigned)(n * 2654435761u) % 256;
        free(keep[k]);
        keep[k] = malloc(16 + (n % 200));
        n++;
    }
    printf("_Fork in a signal handler: %d children, %d exited 7\n", forks, good);
    return 0;
}
