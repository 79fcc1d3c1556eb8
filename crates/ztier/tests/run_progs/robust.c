/* Robust mutexes on the heap whose owner exits holding them.
 *
 * A thread locks 16 robust mutexes (half of them priority-inheriting),
 * each in its own heap block (so each on a page of its own), then waits
 * while the main thread touches 64 MiB (the mutexes' pages go cold),
 * then exits without unlocking them. At
 * the thread's exit the kernel walks its robust list, which runs through
 * the mutexes themselves, and marks each one's lock word with
 * FUTEX_OWNER_DIED: the next pthread_mutex_lock returns EOWNERDEAD. A
 * second thread already waiting on one of them (in the kernel) is woken
 * the same way. If the kernel cannot read or write a mutex (an evicted
 * page: an exiting thread's faults are not handed to a userfaultfd), the
 * walk stops there and the lockers wait forever (here they time out), or
 * glibc's lock of a priority-inheriting one fails an assertion (its owner
 * is gone without the mark).
 *
 * Next, a thread whose thread-specific data destructor (the program's
 * key, made after the library's) locks 4 more at its exit and waits
 * there while they go cold: the kernel's walk at its end must find them
 * too.
 *
 * Then the main thread leaves by pthread_exit holding 4 more, cold by
 * then, and the last thread finds them marked.
 *
 * Prints counts; the same natively. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MUTEXES 16
#define COLD (64u << 20)

static pthread_mutex_t *m[MUTEXES];
static sem_t ready, go;
static int waiter_result = -1;

static void *owner(void *arg) {
    (void)arg;
    for (int i = 0; i < MUTEXES; i++)
        if (pthread_mutex_lock(m[i])) { perror("lock"); exit(2); }
    sem_post(&ready);
    sem_wait(&go);
    return NULL; /* exits holding every one of them */
}

static struct timespec in_ms(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
    return t;
}

/* Locks `mx` waiting at most `ms`, and lets it go again (made consistent
 * first if its owner died); returns what the lock returned. */
static int lock_and_let_go(pthread_mutex_t *mx, long ms) {
    struct timespec t = in_ms(ms);
    int r = pthread_mutex_timedlock(mx, &t);
    if (r == EOWNERDEAD) pthread_mutex_consistent(mx);
    if (r == EOWNERDEAD || r == 0) pthread_mutex_unlock(mx);
    return r;
}

/* A robust mutex (priority-inheriting if `pi`) in a heap block of its
 * own, filled with `fill`, at byte `at` of it. */
static pthread_mutex_t *new_mutex(int pi, int fill, size_t at) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (pi) pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT);
    unsigned char *block = malloc(64 << 10);
    if (!block) { perror("malloc"); exit(2); }
    memset(block, fill, 64 << 10);
    pthread_mutex_t *mx = (pthread_mutex_t *)(block + at);
    pthread_mutex_init(mx, &a);
    pthread_mutexattr_destroy(&a);
    return mx;
}

static void *waiter(void *arg) {
    (void)arg;
    waiter_result = lock_and_let_go(m[0], 20000);
    return NULL;
}

static pthread_mutex_t *late[4];
static pthread_key_t late_key;

/* The program's destructor: locks late[] at the thread's exit, then
 * waits while they go cold. */
static void lock_late(void *v) {
    (void)v;
    for (int i = 0; i < 4; i++)
        if (pthread_mutex_lock(late[i])) { perror("lock"); exit(2); }
    sem_post(&ready);
    sem_wait(&go);
}

static void *late_owner(void *arg) {
    (void)arg;
    pthread_setspecific(late_key, late);
    return NULL; /* lock_late runs at the exit */
}

static volatile int main_left;

/* After the main thread has left holding m[0..4). */
static void *last(void *arg) {
    (void)arg;
    struct timespec pause = { 0, 100 * 1000000L };
    nanosleep(&pause, NULL);
    int died = 0;
    for (int i = 0; i < 4; i++) died += lock_and_let_go(m[i], 300) == EOWNERDEAD;
    printf("after the main thread left: owner died %d of 4\n", died);
    exit(main_left ? 0 : 2);
}

int main(void) {
    /* Every other one priority-inheriting: glibc marks its link in the
     * list (the low bit). */
    for (int i = 0; i < MUTEXES; i++) m[i] = new_mutex(i % 2, 0x5a, 1000 + 40 * i);
    sem_init(&ready, 0, 0);
    sem_init(&go, 0, 0);
    pthread_t o, w;
    if (pthread_create(&o, NULL, owner, NULL)) { perror("pthread_create"); return 2; }
    sem_wait(&ready);
    if (pthread_create(&w, NULL, waiter, NULL)) { perror("pthread_create"); return 2; }
    /* Cold: the mutexes' pages go out while this touches more than the
     * budget. */
    unsigned char *cold = malloc(COLD);
    if (!cold) { perror("malloc"); return 2; }
    unsigned long s = 0;
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < COLD; i += 4096) { cold[i] = (unsigned char)(i >> 12); s += cold[i]; }
    sem_post(&go);
    pthread_join(o, NULL);
    pthread_join(w, NULL);
    int died = 0, timed_out = 0, other = 0;
    for (int i = 1; i < MUTEXES; i++) {
        int r = lock_and_let_go(m[i], 300);
        died += r == EOWNERDEAD;
        timed_out += r == ETIMEDOUT;
        other += r != EOWNERDEAD && r != ETIMEDOUT;
    }
    printf("touched %lu\n", s);
    printf("the waiter got: %s\n", waiter_result == EOWNERDEAD ? "EOWNERDEAD" : strerror(waiter_result));
    printf("later lockers: owner died %d, timed out %d, other %d\n", died, timed_out, other);
    fflush(stdout);

    /* A destructor of the program's locks 4 more at its thread's exit. */
    if (pthread_key_create(&late_key, lock_late)) { perror("pthread_key_create"); return 2; }
    for (int i = 0; i < 4; i++) late[i] = new_mutex(i % 2, 0x69, 3000 + 40 * i);
    if (pthread_create(&o, NULL, late_owner, NULL)) { perror("pthread_create"); return 2; }
    sem_wait(&ready);
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < COLD; i += 4096) cold[i] ^= 2;
    sem_post(&go);
    pthread_join(o, NULL);
    died = 0;
    for (int i = 0; i < 4; i++) died += lock_and_let_go(late[i], 300) == EOWNERDEAD;
    printf("locked in a destructor: owner died %d of 4\n", died);
    fflush(stdout);

    /* The main thread leaves by pthread_exit holding 4 new ones (cold by
     * then: those above, used again and again, stay in); the last thread
     * finds them marked. */
    for (int i = 0; i < 4; i++) {
        m[i] = new_mutex(i % 2, 0x3c, 2000 + 40 * i);
        if (pthread_mutex_lock(m[i])) { perror("lock"); return 2; }
    }
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < COLD; i += 4096) cold[i] ^= 1;
    main_left = 1;
    if (pthread_create(&o, NULL, last, NULL)) { perror("pthread_create"); return 2; }
    pthread_exit(NULL);
}
