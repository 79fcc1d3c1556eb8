/* Coroutines on stacks from malloc (ucontext), and a thread on a stack
 * from malloc (pthread_attr_setstack), while those stacks go cold.
 *
 * Each coroutine recurses a varying depth on its own stack, makes system
 * calls at the bottom (getppid, an uncaught call of glibc's; clock_gettime
 * through the vDSO; a write and a read through a pipe, from the stack),
 * allocates and frees a large block (given back under the library's
 * lock), and switches back to the main
 * context. Between rounds the main context churns a buffer larger than
 * the budget, so the idle stacks' pages are evicted. A timer signal
 * (SIGALRM every 200 us, handler counting) lands wherever a thread runs,
 * coroutine stacks included: the kernel writes its frame there, below the
 * stack pointer, in pages that may be evicted or never touched. The
 * second part runs the same rounds in a thread whose stack is from
 * malloc. The third runs 200 short threads one after another, each on a
 * stack from malloc, whose thread-specific data destructor allocates,
 * frees and writes at its exit, and counts the mappings the process
 * gained meanwhile (natively none: each stack is freed after its join).
 * Prints deterministic results; the same natively. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NCO 24
#define STACK (256u << 10)
#define CHURN (40u << 20)
#define ROUNDS 40

static ucontext_t main_ctx, co_ctx[NCO];
static uint64_t co_sum[NCO];
static int co_round[NCO];
static int pipefd[2];
static volatile uint64_t alarms;
static unsigned char *churn;

static void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

/* Recursion with a frame of ~1.5 KiB, so that a deep call walks far down
 * the coroutine's stack. */
static uint64_t __attribute__((noinline)) dive(int k, int depth, uint64_t acc) {
    volatile unsigned char frame[1500];
    for (size_t i = 0; i < sizeof frame; i += 64) frame[i] = (unsigned char)(acc + i + depth);
    if (depth == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        acc += (uint64_t)(getppid() > 0);
        char b = (char)('a' + k % 26);
        if (write(pipefd[1], &b, 1) != 1) { perror("write"); exit(2); }
        char r;
        if (read(pipefd[0], &r, 1) != 1 || r != b) { perror("read"); exit(2); }
        /* A large block: its free gives pages back under the library's
         * lock, from this stack. */
        unsigned char *big = malloc(1u << 20);
        if (!big) { perror("malloc"); exit(2); }
        memset(big, k, 8192);
        acc += big[4097];
        free(big);
        return acc * 31 + (unsigned char)r;
    }
    uint64_t s = dive(k, depth - 1, acc * 7 + depth);
    for (size_t i = 0; i < sizeof frame; i += 64) s += frame[i];
    return s;
}

static void coroutine(int k) {
    for (;;) {
        int r = co_round[k];
        int depth = 20 + (int)((r * 37 + k * 11) % 140); /* 30-240 KiB deep */
        co_sum[k] += dive(k, depth, (uint64_t)r);
        swapcontext(&co_ctx[k], &main_ctx);
    }
}

static void churn_heap(int round) {
    for (size_t i = 0; i < CHURN; i += 4096) churn[i] = (unsigned char)(i >> 12) + (unsigned char)round;
}

static void *rounds(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        for (int k = 0; k < NCO; k++) {
            co_round[k] = r;
            if (swapcontext(&main_ctx, &co_ctx[k])) { perror("swapcontext"); exit(2); }
        }
        churn_heap(r);
    }
    return NULL;
}

static uint64_t thread_sum;

static void *on_own_stack(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        thread_sum += dive(r, 20 + (r * 53) % 140, (uint64_t)r);
        churn_heap(r);
    }
    return NULL;
}

static pthread_key_t exit_key;

/* At a short thread's exit: calls into malloc and the kernel. */
static void at_exit(void *v) {
    unsigned char *big = malloc(1u << 20);
    if (!big) { perror("malloc"); exit(2); }
    memset(big, 1, 8192);
    free(big);
    if (write(pipefd[1], v, 1) != 1) { perror("write"); exit(2); }
    char r;
    if (read(pipefd[0], &r, 1) != 1) { perror("read"); exit(2); }
}

static void *short_thread(void *arg) {
    pthread_setspecific(exit_key, arg);
    return NULL;
}

static int mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) { perror("maps"); exit(2); }
    int n = 0, c;
    while ((c = getc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

int main(void) {
    churn = malloc(CHURN);
    if (!churn) { perror("malloc"); return 2; }
    churn_heap(0);
    if (pipe(pipefd)) { perror("pipe"); return 2; }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGALRM, &sa, NULL)) { perror("sigaction"); return 2; }
    struct itimerval it = { { 0, 200 }, { 0, 200 } };
    if (setitimer(ITIMER_REAL, &it, NULL)) { perror("setitimer"); return 2; }

    for (int k = 0; k < NCO; k++) {
        void *stack = malloc(STACK);
        if (!stack) { perror("malloc"); return 2; }
        if (getcontext(&co_ctx[k])) { perror("getcontext"); return 2; }
        co_ctx[k].uc_stack.ss_sp = stack;
        co_ctx[k].uc_stack.ss_size = STACK;
        co_ctx[k].uc_link = &main_ctx;
        makecontext(&co_ctx[k], (void (*)(void))coroutine, 1, k);
    }
    rounds(NULL);
    uint64_t total = 0;
    for (int k = 0; k < NCO; k++) total = total * 1000003 + co_sum[k];
    printf("coroutines %d rounds %d sum %016llx\n", NCO, ROUNDS, (unsigned long long)total);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    void *tstack = malloc(STACK);
    if (!tstack || pthread_attr_setstack(&attr, tstack, STACK)) { perror("thread stack"); return 2; }
    pthread_t t;
    if (pthread_create(&t, &attr, on_own_stack, NULL)) { perror("pthread_create"); return 2; }
    pthread_join(t, NULL);
    printf("thread on a stack from malloc: sum %016llx\n", (unsigned long long)thread_sum);

    if (pthread_key_create(&exit_key, at_exit)) { perror("pthread_key_create"); return 2; }
    int before = 0;
    for (int i = 0; i < 200; i++) {
        void *st = malloc(STACK);
        if (!st || pthread_attr_setstack(&attr, st, STACK)) { perror("thread stack"); return 2; }
        if (pthread_create(&t, &attr, short_thread, "x")) { perror("pthread_create"); return 2; }
        pthread_join(t, NULL);
        free(st);
        if (i == 9) before = mappings();
    }
    int gained = mappings() - before;
    /* A few may come from the allocator; one or two a thread would not. */
    printf("190 short threads on stacks from malloc: mappings gained %s\n", gained < 20 ? "few" : "many");
    if (gained >= 20) fprintf(stderr, "mappings gained: %d\n", gained);

    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    printf("alarms seen: %s\n", alarms > 0 ? "yes" : "no");
    return 0;
}
