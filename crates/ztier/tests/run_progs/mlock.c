/* Locked memory (a key buffer kept out of swap, as gpg, ssh-agent and
 * libsodium's sodium_malloc do): mlock, mlock2(MLOCK_ONFAULT), a partial
 * munlock, and mlockall(MCL_CURRENT | MCL_FUTURE) in a forked child;
 * between them 48 MiB written elsewhere (a 16M budget: everything not
 * locked goes cold). Locked pages must stay resident (mincore) and every
 * byte read back as written. Natively and in every mode of `ztier run`
 * the same output. The child, all resident and over the budget under
 * mlockall, must use no CPU while it sleeps (ztier's evictor once spun
 * there for victims it could not take). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define P 4096
#define KEY (1u << 20)
#define HEAP (48u << 20)
static uint8_t *other;

static void chill(int round) { memset(other, round, HEAP); }

static int resident(const uint8_t *p, size_t len) {
    unsigned char v[KEY / P];
    if (mincore((void *)p, len, v)) return -1;
    int n = 0;
    for (size_t i = 0; i < len / P; i++) n += v[i] & 1;
    return n;
}

static int intact(const uint8_t *p, size_t len, int fill) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(fill + i / P)) return 0;
    return 1;
}

/* CPU time of the whole process (every thread), in seconds. */
static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static void fill(uint8_t *p, size_t len, int v) {
    for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(v + i / P);
}

int main(void) {
    uint8_t *key = aligned_alloc(P, KEY), *onfault = aligned_alloc(P, KEY);
    other = malloc(HEAP);
    if (!key || !onfault || !other) return 1;
    fill(key, KEY, 3);
    fill(onfault, KEY, 5);
    printf("mlock %d, mlock2 onfault %d\n", mlock(key, KEY), mlock2(onfault, KEY, MLOCK_ONFAULT));
    chill(1);
    printf("after pressure: key resident %d of %d, intact %d; on-fault intact %d\n", resident(key, KEY),
           KEY / P, intact(key, KEY, 3), intact(onfault, KEY, 5));
    /* The first half unlocked: it may go out now, and must come back. */
    printf("munlock half %d\n", munlock(key, KEY / 2));
    chill(2);
    printf("second half resident %d of %d, whole key intact %d\n", resident(key + KEY / 2, KEY / 2),
           KEY / P / 2, intact(key, KEY, 3));
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        int r = mlockall(MCL_CURRENT | MCL_FUTURE);
        uint8_t *more = aligned_alloc(P, 8u << 20);
        memset(more, 9, 8u << 20);
        long s = 0;
        for (size_t i = 0; i < (8u << 20); i += P) s += more[i];
        printf("child: mlockall %d, new memory resident %d of 256, sum %ld, key intact %d\n", r,
               resident(more, KEY), s, intact(key, KEY, 3));
        double t = cpu();
        usleep(500000);
        printf("child: CPU while asleep under mlockall under 0.1 s: %d\n", cpu() - t < 0.1);
        printf("child: munlockall %d\n", munlockall());
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    chill(3);
    printf("parent after: key intact %d, on-fault intact %d\n", intact(key, KEY, 3), intact(onfault, KEY, 5));
    printf("munlock %d %d\n", munlock(key + KEY / 2, KEY / 2), munlock(onfault, KEY));
    return 0;
}
