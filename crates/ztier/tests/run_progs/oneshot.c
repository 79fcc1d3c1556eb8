/* One-shot handlers (SA_RESETHAND), and handlers that install handlers,
 * under memory pressure.
 *
 * 1. A handler in the System V style: SIGUSR1's handler is one-shot; it
 *    reads a cold heap page, then installs itself again with sigaction.
 *    Another thread sends SIGUSR1 to the main thread each time the
 *    handler has done so, while the main thread allocates and frees
 *    large blocks (which ztier manages under its lock): the signal often
 *    comes in ztier's code, and the handler must still run as the
 *    program's code (its sigaction caught) and never while the lock is
 *    held. The sender waits for each handler to finish, so no signal
 *    comes while the action is the default.
 * 2. What sigaction reports after a one-shot delivery: the default
 *    action, with the flags and mask the program gave.
 * 3. In forked children: a one-shot handler's signal sent a second time
 *    takes the default action (ends the child); so does a System V
 *    signal() handler (SA_RESETHAND | SA_NODEFER) that raises its own
 *    signal again.
 *
 * Prints deterministic results; the same natively. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define COLD (48u << 20)
#define ROUNDS 3000
#define SIGNALS 400

static unsigned char *cold;
static volatile uint64_t seen;
static volatile int handled, armed, stop;
static pthread_t main_thread;

static void arm(void);

static void on_usr1(int sig) {
    (void)sig;
    int k = handled;
    seen += cold[((size_t)k * 4096 * 41 + 77) % COLD];
    arm();
    handled = k + 1;
    __atomic_store_n(&armed, 1, __ATOMIC_RELEASE);
}

static void arm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    if (sigaction(SIGUSR1, &sa, NULL)) { perror("sigaction"); exit(2); }
}

static void *sender(void *arg) {
    (void)arg;
    for (int i = 0; i < SIGNALS && !stop; i++) {
        while (!__atomic_load_n(&armed, __ATOMIC_ACQUIRE) && !stop) usleep(20);
        if (stop) break;
        __atomic_store_n(&armed, 0, __ATOMIC_RELAXED);
        pthread_kill(main_thread, SIGUSR1);
        usleep(100);
    }
    return NULL;
}

static void on_usr2(int sig) { (void)sig; }

static void raise_again(int sig) { raise(sig); }

/* Runs f in a child; returns the signal that ended it (0 if it exited). */
static int in_child(void (*f)(void)) {
    pid_t p = fork();
    if (p < 0) { perror("fork"); exit(2); }
    if (p == 0) {
        f();
        _exit(0);
    }
    int st;
    if (waitpid(p, &st, 0) != p) { perror("waitpid"); exit(2); }
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void twice(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGUSR2, &sa, NULL);
    raise(SIGUSR2);
    raise(SIGUSR2);
}

static void sysv(void) {
    sysv_signal(SIGUSR2, raise_again);
    raise(SIGUSR2);
}

int main(void) {
    cold = malloc(COLD);
    if (!cold) { perror("malloc"); return 2; }
    for (size_t i = 0; i < COLD; i += 4096) cold[i] = (unsigned char)(i >> 12);

    /* 1. */
    main_thread = pthread_self();
    arm();
    armed = 1;
    pthread_t t;
    if (pthread_create(&t, NULL, sender, NULL)) { perror("pthread_create"); return 2; }
    uint64_t s = 0;
    for (int r = 0; r < ROUNDS || handled < 50; r++) {
        size_t n = (size_t)(1 + r % 7) << 20;
        unsigned char *p = malloc(n);
        if (!p) { perror("malloc"); return 2; }
        for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)r;
        if (r < ROUNDS) s += p[n / 2];
        free(p);
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("allocations with one-shot handlers re-armed: %llu, 50 or more handled: %s\n",
           (unsigned long long)s, handled >= 50 ? "yes" : "no");

    /* 2. */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    if (sigaction(SIGUSR2, &sa, NULL)) { perror("sigaction"); return 2; }
    if (sigaction(SIGUSR2, NULL, &old)) { perror("sigaction"); return 2; }
    printf("before: handler set %d, one-shot %d, restart %d, siginfo %d, mask has SIGINT %d\n",
           old.sa_handler == on_usr2, !!(old.sa_flags & SA_RESETHAND), !!(old.sa_flags & SA_RESTART),
           !!(old.sa_flags & SA_SIGINFO), sigismember(&old.sa_mask, SIGINT));
    raise(SIGUSR2);
    if (sigaction(SIGUSR2, NULL, &old)) { perror("sigaction"); return 2; }
    printf("after: default %d, one-shot %d, restart %d, siginfo %d, onstack %d, mask has SIGINT %d\n",
           old.sa_handler == SIG_DFL, !!(old.sa_flags & SA_RESETHAND), !!(old.sa_flags & SA_RESTART),
           !!(old.sa_flags & SA_SIGINFO), !!(old.sa_flags & SA_ONSTACK), sigismember(&old.sa_mask, SIGINT));

    /* 3. */
    printf("a one-shot signal sent twice ended the child by signal %d\n", in_child(twice));
    printf("a System V handler raising its signal ended the child by signal %d\n", in_child(sysv));
    return 0;
}
