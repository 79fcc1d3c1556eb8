/*
 * ipi-cost: what a TLB shootdown costs the thread it interrupts. A thread
 * pinned to CPU 0 runs a fixed loop of arithmetic (no memory shared with
 * anyone) twice:
 *
 *   alone        nothing else in the process runs;
 *   shot down    a thread on CPU 1 changes the protection of a page of the
 *                same process back and forth (mprotect), so that every
 *                change is a TLB shootdown: an interrupt on CPU 0;
 *
 * then, without the loop, makes the same changes on CPU 0 while a thread
 * of the process sleeps on CPU 1 ("lazy"): a CPU whose threads of the
 * process all sleep gets no shootdown.
 *
 * It prints the loop's time both ways, the shootdowns each CPU took
 * (from /proc/interrupts, "TLB"), and the cost per shootdown taken:
 * (shot down - alone) / interrupts on CPU 0. This is why `ztier run`
 * makes its evictor's write protections on the program's CPU (the
 * `near` module of crates/ztier-preload).
 *
 *   cc -O2 -pthread -o /tmp/ipi-cost scripts/ipi-cost.c
 *   /tmp/ipi-cost     (any user; 2 CPUs or more)
 *
 * It changes no system setting.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LOOP 400000000L

static volatile int stop, go;
static char *page;
static long changes;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) { perror("sched_setaffinity"); exit(2); }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Shootdowns taken so far by CPUs 0 and 1. */
static void shootdowns(long out[2]) {
    FILE *f = fopen("/proc/interrupts", "r");
    char line[4096];
    out[0] = out[1] = -1;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "TLB:") && sscanf(strstr(line, "TLB:") + 4, "%ld %ld", &out[0], &out[1]) == 2) break;
    if (f) fclose(f);
}

static void change_protection(void) {
    mprotect(page, 4096, PROT_READ);
    mprotect(page, 4096, PROT_READ | PROT_WRITE);
    page[0]++;
    changes += 2;
}

static void *flusher(void *arg) {
    pin(*(int *)arg);
    while (!go) ;
    while (!stop) change_protection();
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    pin(1);
    while (!stop) usleep(1000);
    return NULL;
}

static double work(void) {
    volatile double x = 1.0;
    double t = now();
    for (long i = 0; i < LOOP; i++) x = x * 1.0000001 + 1e-9;
    return now() - t;
}

int main(void) {
    page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) { perror("mmap"); return 2; }
    page[0] = 1;
    pin(0);
    long a[2], b[2];

    shootdowns(a);
    double alone = work();
    shootdowns(b);
    printf("alone:      loop %.3f s, shootdowns cpu0 %ld cpu1 %ld\n", alone, b[0] - a[0], b[1] - a[1]);

    int cpu1 = 1;
    pthread_t t;
    stop = go = 0;
    changes = 0;
    pthread_create(&t, NULL, flusher, &cpu1);
    usleep(10000);
    shootdowns(a);
    go = 1;
    double shot = work();
    stop = 1;
    pthread_join(t, NULL);
    shootdowns(b);
    long taken = b[0] - a[0];
    printf("shot down:  loop %.3f s, %ld protection changes on cpu1, shootdowns cpu0 %ld cpu1 %ld\n", shot,
           changes, taken, b[1] - a[1]);
    if (taken > 0) printf("cost per shootdown taken: %.2f us\n", (shot - alone) / taken * 1e6);

    /* A sleeping thread of the process on CPU 1, the changes made on CPU 0. */
    stop = 0;
    changes = 0;
    pthread_create(&t, NULL, sleeper, NULL);
    usleep(10000);
    shootdowns(a);
    double s = now();
    for (int i = 0; i < 200000; i++) change_protection();
    s = now() - s;
    stop = 1;
    pthread_join(t, NULL);
    shootdowns(b);
    printf("lazy:       %ld changes on cpu0 in %.3f s (%.2f us each) with cpu1's thread asleep, shootdowns cpu0 %ld cpu1 %ld\n",
           changes, s, s / changes * 1e6, b[0] - a[0], b[1] - a[1]);
    return 0;
}
