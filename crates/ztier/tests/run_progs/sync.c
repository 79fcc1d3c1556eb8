/* Threads that wait on each other through glibc's mutexes, condition
 * variables and semaphores, whose futex calls glibc makes inside itself:
 * 64 sets of them, a page apart in the heap, going cold under the budget
 * between rounds while a buffer larger than it is filled.
 *
 *  1. two threads hand a turn back and forth under a mutex and a
 *     condition variable (pthread_cond_wait, pthread_cond_signal);
 *  2. the same with two semaphores (sem_post, sem_wait);
 *  3. timeouts whose times lie in the cold heap: pthread_cond_timedwait
 *     and pthread_cond_clockwait on a time already past, sem_timedwait
 *     and sem_clockwait on an empty semaphore, 2 ms ahead;
 *  4. four threads adding to counters under contended binary semaphores,
 *     with a broadcast to a waiter at the end.
 *
 * Prints the counts; the same natively. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SETS 64
#define ROUNDS 6000
#define COLD (40u << 20)

struct set {
    pthread_mutex_t m;
    pthread_cond_t c;
    sem_t ping, pong;
    int turn;
    struct timespec when;
    long counter;
};

static struct set *sets[SETS];
static unsigned char *cold;

static void churn(int round) {
    for (size_t i = 0; i < COLD; i += 4096) cold[i] = (unsigned char)(i >> 12) + (unsigned char)round;
}

static void *cond_partner(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        struct set *s = sets[r % SETS];
        pthread_mutex_lock(&s->m);
        while (s->turn != 1) pthread_cond_wait(&s->c, &s->m);
        s->turn = 0;
        pthread_cond_signal(&s->c);
        pthread_mutex_unlock(&s->m);
    }
    return NULL;
}

static void *sem_partner(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        struct set *s = sets[r % SETS];
        while (sem_wait(&s->ping) != 0) if (errno != EINTR) { perror("sem_wait"); exit(2); }
        sem_post(&s->pong);
    }
    return NULL;
}

#define ADDS 100000
static pthread_mutex_t done_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_c = PTHREAD_COND_INITIALIZER;
static int finished;

static void *adder(void *arg) {
    long k = (long)arg;
    for (int i = 0; i < ADDS; i++) {
        struct set *s = sets[(i + k) % 4];
        while (sem_wait(&s->pong) != 0) if (errno != EINTR) { perror("sem_wait"); exit(2); }
        s->counter += k + 1;
        sem_post(&s->pong);
    }
    pthread_mutex_lock(&done_m);
    finished++;
    pthread_cond_broadcast(&done_c);
    pthread_mutex_unlock(&done_m);
    return NULL;
}

static void *watcher(void *arg) {
    (void)arg;
    pthread_mutex_lock(&done_m);
    while (finished < 4) pthread_cond_wait(&done_c, &done_m);
    pthread_mutex_unlock(&done_m);
    return NULL;
}

int main(void) {
    cold = malloc(COLD);
    unsigned char *block = malloc((size_t)SETS * 4096);
    if (!cold || !block) { perror("malloc"); return 2; }
    churn(0);
    for (int k = 0; k < SETS; k++) {
        struct set *s = (struct set *)(block + (size_t)k * 4096 + (k % 4) * 1000);
        sets[k] = s;
        memset(s, 0, sizeof *s);
        pthread_mutex_init(&s->m, NULL);
        pthread_cond_init(&s->c, NULL);
        if (sem_init(&s->ping, 0, 0) || sem_init(&s->pong, 0, 0)) { perror("sem_init"); return 2; }
    }

    /* 1. Turns under a mutex and a condition variable. */
    pthread_t t;
    if (pthread_create(&t, NULL, cond_partner, NULL)) { perror("pthread_create"); return 2; }
    long turns = 0;
    for (int r = 0; r < ROUNDS; r++) {
        struct set *s = sets[r % SETS];
        pthread_mutex_lock(&s->m);
        s->turn = 1;
        pthread_cond_signal(&s->c);
        while (s->turn != 0) pthread_cond_wait(&s->c, &s->m);
        turns++;
        pthread_mutex_unlock(&s->m);
        if (r % 1000 == 999) churn(r);
    }
    pthread_join(t, NULL);
    printf("condition variable turns %ld\n", turns);

    /* 2. Turns with semaphores. */
    if (pthread_create(&t, NULL, sem_partner, NULL)) { perror("pthread_create"); return 2; }
    long posts = 0;
    for (int r = 0; r < ROUNDS; r++) {
        struct set *s = sets[r % SETS];
        sem_post(&s->ping);
        while (sem_wait(&s->pong) != 0) if (errno != EINTR) { perror("sem_wait"); return 2; }
        posts++;
        if (r % 1000 == 999) churn(r);
    }
    pthread_join(t, NULL);
    printf("semaphore turns %ld\n", posts);

    /* 3. Timeouts, their times in the cold heap. */
    int timed_out = 0;
    for (int r = 0; r < 40; r++) {
        struct set *s = sets[(r * 7) % SETS];
        churn(r);
        clock_gettime(CLOCK_REALTIME, &s->when);
        s->when.tv_sec -= 1;
        pthread_mutex_lock(&s->m);
        timed_out += pthread_cond_timedwait(&s->c, &s->m, &s->when) == ETIMEDOUT;
        clock_gettime(CLOCK_MONOTONIC, &s->when);
        s->when.tv_sec -= 1;
        timed_out += pthread_cond_clockwait(&s->c, &s->m, CLOCK_MONOTONIC, &s->when) == ETIMEDOUT;
        pthread_mutex_unlock(&s->m);
        churn(r + 1);
        clock_gettime(CLOCK_REALTIME, &s->when);
        s->when.tv_nsec += 2000000;
        if (s->when.tv_nsec >= 1000000000) { s->when.tv_sec++; s->when.tv_nsec -= 1000000000; }
        timed_out += sem_timedwait(&s->ping, &s->when) == -1 && errno == ETIMEDOUT;
        clock_gettime(CLOCK_MONOTONIC, &s->when);
        s->when.tv_nsec += 2000000;
        if (s->when.tv_nsec >= 1000000000) { s->when.tv_sec++; s->when.tv_nsec -= 1000000000; }
        timed_out += sem_clockwait(&s->ping, CLOCK_MONOTONIC, &s->when) == -1 && errno == ETIMEDOUT;
    }
    printf("timeouts %d of 160\n", timed_out);

    /* 4. Contended binary semaphores, and a broadcast. */
    for (int k = 0; k < 4; k++) sem_post(&sets[k]->pong);
    pthread_t w, adders[4];
    if (pthread_create(&w, NULL, watcher, NULL)) { perror("pthread_create"); return 2; }
    for (long k = 0; k < 4; k++)
        if (pthread_create(&adders[k], NULL, adder, (void *)k)) { perror("pthread_create"); return 2; }
    for (int k = 0; k < 4; k++) pthread_join(adders[k], NULL);
    pthread_join(w, NULL);
    long sum = 0;
    for (int k = 0; k < 4; k++) sum += sets[k]->counter;
    printf("counted %ld (expected %ld), finished %d\n", sum, (long)ADDS * (1 + 2 + 3 + 4), finished);
    return 0;
}
