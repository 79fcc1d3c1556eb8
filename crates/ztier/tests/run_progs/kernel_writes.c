/* Memory the kernel writes outside any system call of the program, for
 * user-mode-only mode and `--fault-path signal` (where the kernel's own
 * faults on missing pages are not served, and a failed write kills):
 *
 *  - an alternate signal stack from malloc, each signal's frame written
 *    there by the kernel; the stack goes cold between signals while a
 *    buffer larger than the budget is filled and summed;
 *  - a thread that sets its own alternate stack, replaces it with
 *    another, frees the first and disables the second;
 *  - a forked child that keeps the alternate stack it inherited while a
 *    thread of its own sets and drops another;
 *  - an rseq area from malloc (when glibc has not registered its own,
 *    GLIBC_TUNABLES=glibc.pthread.rseq=0), whose cpu_id the kernel
 *    writes on the way back to user space after the thread is moved to
 *    another CPU, once after each pass.
 *
 * Prints checksums and what the handlers saw; the same natively. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1u << 20)
#define BIG (48u * MB)
#define ALT (64u * 1024)

static volatile sig_atomic_t on_alt, off_alt;
static __thread char *alt_lo, *alt_hi;

static void on_usr1(int sig) {
    (void)sig;
    char here;
    if (&here >= alt_lo && &here < alt_hi) on_alt++;
    else off_alt++;
}

static uint64_t pass(uint64_t *a, uint64_t seed) {
    for (size_t i = 0; i < BIG / 8; i++) a[i] = i * 2654435761u + seed;
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i += 5) s += a[i];
    return s;
}

static char *set_alt(void) {
    char *p = malloc(ALT);
    if (!p) { perror("malloc"); exit(2); }
    stack_t ss = { .ss_sp = p, .ss_size = ALT, .ss_flags = 0 };
    if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); exit(2); }
    alt_lo = p;
    alt_hi = p + ALT;
    return p;
}

static void *worker(void *arg) {
    uint64_t *a = arg;
    uint64_t s = 0;
    char *first = set_alt();
    for (int k = 0; k < 3; k++) {
        s += pass(a, 100 + k);
        pthread_kill(pthread_self(), SIGUSR1);
    }
    char *second = set_alt();
    free(first);
    for (int k = 0; k < 3; k++) {
        s += pass(a, 200 + k);
        pthread_kill(pthread_self(), SIGUSR1);
    }
    stack_t off = { .ss_flags = SS_DISABLE };
    if (sigaltstack(&off, NULL)) { perror("sigaltstack"); exit(2); }
    free(second);
    s += pass(a, 300);
    printf("thread: %llu\n", (unsigned long long)s);
    return NULL;
}

static void *child_worker(void *arg) {
    char *p = set_alt();
    pass(arg, 600);
    pthread_kill(pthread_self(), SIGUSR1);
    stack_t off = { .ss_flags = SS_DISABLE };
    if (sigaltstack(&off, NULL)) { perror("sigaltstack"); exit(2); }
    free(p);
    return NULL;
}

/* The kernel's struct rseq (32 bytes, 32-aligned). */
struct rseq_area {
    uint32_t cpu_id_start, cpu_id;
    uint64_t rseq_cs;
    uint32_t flags, node_id, mm_cid, end[1];
};

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    if (sigaction(SIGUSR1, &sa, NULL)) { perror("sigaction"); return 2; }

    uint64_t *a = malloc(BIG);
    if (!a) { perror("malloc"); return 2; }
    set_alt();
    uint64_t s = 0;
    for (int k = 0; k < 6; k++) {
        s += pass(a, k);
        raise(SIGUSR1);
    }
    printf("main: %llu\n", (unsigned long long)s);

    pthread_t t;
    if (pthread_create(&t, NULL, worker, a)) { perror("pthread_create"); return 2; }
    pthread_join(t, NULL);

    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        on_alt = off_alt = 0;
        uint64_t c = pass(a, 500);
        raise(SIGUSR1);
        pthread_t t2;
        if (pthread_create(&t2, NULL, child_worker, a)) { perror("pthread_create"); _exit(2); }
        pthread_join(t2, NULL);
        for (int k = 0; k < 2; k++) {
            c += pass(a, 501 + k);
            raise(SIGUSR1);
        }
        printf("child: %llu, signals on the alternate stack %d, elsewhere %d\n", (unsigned long long)c,
               (int)on_alt, (int)off_alt);
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 2; }
    printf("child ended: %s %d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));

    struct rseq_area *r = aligned_alloc(32, 4096);
    if (!r) { perror("aligned_alloc"); return 2; }
    memset(r, 0, 4096);
    r->cpu_id = (uint32_t)-1;
    int registered = syscall(SYS_rseq, r, 32, 0, 0x53053053) == 0;
    if (registered) {
        cpu_set_t was, one;
        sched_getaffinity(0, sizeof was, &was);
        int ok = 1;
        s = 0;
        for (int k = 0; k < 8; k++) {
            s += pass(a, 400 + k);
            /* Moved to another CPU: the kernel writes the new cpu_id on
             * the way back to user space. */
            int cpu = -1;
            for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &was) && seen++ == k % CPU_COUNT(&was)) { cpu = c; break; }
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            if (sched_setaffinity(0, sizeof one, &one)) { perror("sched_setaffinity"); return 2; }
            ok &= r->cpu_id == (uint32_t)cpu;
        }
        sched_setaffinity(0, sizeof was, &was);
        syscall(SYS_rseq, r, 32, 1 /* RSEQ_FLAG_UNREGISTER */, 0x53053053);
        printf("rseq: own, cpu_id valid %d, %llu\n", ok, (unsigned long long)s);
    } else {
        printf("rseq: registered by glibc\n");
    }
    free(r);
    printf("signals on the alternate stack %d, elsewhere %d\n", (int)on_alt, (int)off_alt);
    return 0;
}
