/* New threads after the locale's data went cold. glibc's pthread_create
 * blocks every signal around its clone, and the new thread reads the
 * global locale's LC_CTYPE data (`__ctype_init`, in `start_thread`)
 * before it puts the creator's mask back; `setlocale` allocated that
 * data with malloc. With `ztier run --fault-path signal` a fault there
 * was a blocked SIGBUS, which killed the process. Here: setlocale, then
 * 20 rounds of 48 MiB written (a 16M budget: the data goes cold) and a
 * thread that uses the locale. Same output natively. */
#define _GNU_SOURCE
#include <ctype.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG (48u << 20)

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
