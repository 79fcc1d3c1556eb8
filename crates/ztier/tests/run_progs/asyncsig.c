/* Asynchronous signals under memory pressure.
 *
 * 1. A profiler's pattern: a SIGPROF handler reads the heap (a cold page
 *    each tick) while the program allocates and frees large blocks,
 *    which ztier manages under its lock: the handler must never wait for
 *    a fault service that waits for that lock.
 * 2. A program that blocks SIGUSR1 and SIGTERM in every thread and takes
 *    them with sigwait in one thread: signals sent to the process must
 *    reach it, not a thread of ztier's (whose default action would end
 *    the process).
 *
 * The heap is touched before the signals start, so that the library has
 * started (and made its threads) first. Prints deterministic results;
 * the same natively. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define COLD (48u << 20)
#define ROUNDS 3000

static unsigned char *cold;
static volatile uint64_t ticks, seen;

static void on_prof(int sig) {
    (void)sig;
    uint64_t k = ticks++;
    seen += cold[(k * 4096 * 37 + 123) % COLD];
}

static sigset_t waited;
static volatile int usr1;

static void *waiter(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&waited, &sig)) return NULL;
        if (sig == SIGUSR1) usr1++;
        if (sig == SIGTERM) return NULL;
    }
}

int main(void) {
    cold = malloc(COLD);
    if (!cold) { perror("malloc"); return 2; }
    for (size_t i = 0; i < COLD; i += 4096) cold[i] = (unsigned char)(i >> 12);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prof;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGPROF, &sa, NULL)) { perror("sigaction"); return 2; }
    struct itimerval it = { { 0, 500 }, { 0, 500 } };
    if (setitimer(ITIMER_PROF, &it, NULL)) { perror("setitimer"); return 2; }
    uint64_t s = 0;
    /* At least ROUNDS rounds, and on until the profiler has ticked 50
     * times (only the first ROUNDS count in the result). */
    for (int r = 0; r < ROUNDS || ticks < 50; r++) {
        size_t n = (size_t)(1 + r % 7) << 20;
        unsigned char *p = malloc(n);
        if (!p) { perror("malloc"); return 2; }
        for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)r;
        if (r < ROUNDS) s += p[n / 2];
        free(p);
    }
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_PROF, &off, NULL);
    printf("allocations under a profiler: %llu\n", (unsigned long long)s);

    sigemptyset(&waited);
    sigaddset(&waited, SIGUSR1);
    sigaddset(&waited, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &waited, NULL)) { perror("pthread_sigmask"); return 2; }
    pthread_t t;
    if (pthread_create(&t, NULL, waiter, NULL)) { perror("pthread_create"); return 2; }
    for (int i = 0; i < 200; i++) {
        kill(getpid(), SIGUSR1);
        usleep(200);
    }
    kill(getpid(), SIGTERM);
    pthread_join(t, NULL);
    printf("sigwait took SIGUSR1: %s, then SIGTERM\n", usr1 > 0 ? "yes" : "no");
    return 0;
}
