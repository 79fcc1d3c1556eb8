/* New threads after the locale's data went cold. glibc's pthread_create
 * blocks every signal around its clone, and the new thread reads the
 * global locale's LC_CTYPE data (`__ctype_init`, in `start_thread`)
 * before it puts the creator's mask back; `setlocale` allocated that
 * data with malloc. With `ztier run --fault-path signal` a fault there
 * was a blocked SIGBUS, which killed the process. Here: setlocale, then
 * 20 rounds of 48 MiB written (a 16M budget: the data goes cold) and a
 * thread that uses the locale; before them, 5 rounds that end in a
 * SIGEV_THREAD timer's expiry, whose threads glibc starts by its internal
 * pthread_create (the dispatch handler catches their clone). Same
 * output natively. */
#define _GNU_SOURCE
#include <ctype.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG (48u << 20)

static volatile long timer_sum;
static volatile int ticks;

/* A SIGEV_THREAD timer's function: glibc runs it in a thread it starts
 * by its internal pthread_create (the library's does not see it). */
static void on_tick(union sigval v) {
    long sum = v.sival_int;
    for (int c = 0; c < 256; c++) sum += toupper(c) + (isalpha(c) != 0);
    __atomic_add_fetch(&timer_sum, sum, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ticks, 1, __ATOMIC_RELEASE);
}

static void *worker(void *arg) {
    long round = (long)arg;
    long sum = 0;
    for (int c = 0; c < 256; c++) sum += toupper(c) + (isalpha(c) != 0);
    return (void *)(sum + round);
}

int main(void) {
    /* The library starts at the program's first MiB: the locale's data
     * is allocated after, in the arena (as in the JVM). */
    char *big = malloc(BIG);
    if (!big) return 2;
    memset(big, 1, BIG);
    const char *l = setlocale(LC_ALL, "C.UTF-8");
    if (!l) {
        fprintf(stderr, "no C.UTF-8 locale\n");
        return 2;
    }
    printf("locale %s\n", l);
    /* First threads that glibc starts itself, before any of the
     * program's: a one-shot SIGEV_THREAD timer a round (the first starts
     * glibc's helper thread, each expiry a thread of the helper's). */
    for (int round = 0; round < 5; round++) {
        memset(big, round + 100, BIG);
        struct sigevent ev = {.sigev_notify = SIGEV_THREAD, .sigev_notify_function = on_tick};
        ev.sigev_value.sival_int = round;
        timer_t tm;
        struct itimerspec its = {.it_value = {.tv_nsec = 1000000}};
        if (timer_create(CLOCK_MONOTONIC, &ev, &tm) || timer_settime(tm, 0, &its, NULL)) return 4;
        for (int w = 0; w < 5000 && __atomic_load_n(&ticks, __ATOMIC_ACQUIRE) <= round; w++) usleep(1000);
        timer_delete(tm);
        if (ticks != round + 1) {
            printf("timer round %d: %d ticks\n", round, ticks);
            return 5;
        }
    }
    printf("timer threads after the locale went cold: %ld\n", timer_sum);
    long total = 0;
    for (long round = 0; round < 20; round++) {
        memset(big, (int)round, BIG);
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)round)) return 3;
        void *r;
        pthread_join(t, &r);
        total += (long)r + big[round * 4096];
    }
    printf("threads after the locale went cold: %ld\n", total);
    return 0;
}
