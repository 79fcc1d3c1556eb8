/* A stack overflow reported from a SIGSEGV handler on a small alternate
 * stack (8 KiB, as Rust's runtime gives each thread), the way Rust's
 * runtime reports one: the handler writes a message, makes a few more
 * system calls (signal masks, as abort does) and ends the process with
 * abort(). The thread that overflows has a 1 MiB stack; the heap holds
 * ballast that goes cold. Exits by SIGABRT after printing its message;
 * the same natively.
 *
 * With the argument "main" the main thread overflows instead, on its own
 * stack, and its alternate stack is set up first thing, before the heap
 * is allocated: before the library starts (it starts after 1 MiB of
 * allocations), as Rust's runtime sets up the main thread's. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALT 8192

static void on_segv(int sig) {
    (void)sig;
    static const char msg[] = "thread has overflowed its stack\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(3);
    sigset_t all, was;
    sigfillset(&all);
    for (int i = 0; i < 8; i++) {
        sigprocmask(SIG_BLOCK, &all, &was);
        sigprocmask(SIG_SETMASK, &was, NULL);
    }
    abort();
}

static uint64_t __attribute__((noinline)) deep(uint64_t n) {
    volatile unsigned char frame[4096];
    frame[n % 4096] = (unsigned char)n;
    if (n == UINT64_MAX) return 0;
    return deep(n + 1) + frame[(n * 7) % 4096];
}

static void *overflow(void *arg) {
    (void)arg;
    stack_t ss = { .ss_sp = malloc(ALT), .ss_size = ALT, .ss_flags = 0 };
    if (!ss.ss_sp || sigaltstack(&ss, NULL)) { perror("sigaltstack"); exit(2); }
    printf("%llu\n", (unsigned long long)deep(0));
    return NULL;
}

int main(int argc, char **argv) {
    int on_main = argc > 1 && strcmp(argv[1], "main") == 0;
    static unsigned char alt[ALT];
    if (on_main) {
        stack_t ss = { .ss_sp = alt, .ss_size = ALT, .ss_flags = 0 };
        if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); return 2; }
    }
    size_t n = 40u << 20;
    unsigned char *ballast = malloc(n);
    if (!ballast) return 2;
    for (size_t i = 0; i < n; i += 4096) ballast[i] = (unsigned char)(i >> 12);
    printf("ballast %zu MiB\n", n >> 20);
    fflush(stdout);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sa.sa_flags = SA_ONSTACK;
    if (sigaction(SIGSEGV, &sa, NULL)) { perror("sigaction"); return 2; }
    if (on_main) {
        printf("%llu\n", (unsigned long long)deep(0));
        return 0;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_t t;
    if (pthread_create(&t, &attr, overflow, NULL)) { perror("pthread_create"); return 2; }
    pthread_join(t, NULL);
    return 0;
}
