/*
 * uffd-cross-cpu: what a one-page missing-page fault costs with the
 * handler thread on the faulting thread's CPU (as `ztier run --pin main`
 * serves them) against a handler on the other CPU, blocking in poll() or
 * spinning on a non-blocking read(), with and without a SCHED_IDLE thread
 * that keeps the faulting thread's CPU busy while it waits (so that its
 * virtual CPU never halts, and the wake-up needs no halted CPU woken).
 * Every fault is served with UFFDIO_COPY from a cached page: nothing is
 * decompressed or looked up. Medians of 3 timings of 16384 pages each;
 * every page's content is checked.
 *
 *   cc -O2 -pthread -o /tmp/uffd-cross-cpu scripts/uffd-cross-cpu.c
 *   /tmp/uffd-cross-cpu    (root, or any user: it asks for
 *                           UFFD_USER_MODE_ONLY; Linux >= 5.11;
 *                           2 CPUs or more)
 *
 * It changes no system setting.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGES 16384
#define PAGE 4096L

struct setup {
    int handler_cpu;   /* CPU of the handler thread */
    int spin;          /* handler spins on read() instead of poll() */
    int keep_busy;     /* a SCHED_IDLE thread spins on the program's CPU */
};

static int uffd;
static atomic_int done;
static char src[PAGE] __attribute__((aligned(4096)));
static struct setup cur;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (pthread_setaffinity_np(pthread_self(), sizeof s, &s)) {
        fprintf(stderr, "cannot pin to CPU %d\n", cpu);
        exit(1);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *handler(void *arg) {
    (void)arg;
    pin(cur.handler_cpu);
    struct uffd_msg m;
    while (!atomic_load(&done)) {
        if (!cur.spin) {
            struct pollfd p = {uffd, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
        }
        if (read(uffd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT) continue;
        struct uffdio_copy c = {
            .dst = m.arg.pagefault.address & ~(PAGE - 1), .src = (uintptr_t)src, .len = PAGE, .mode = 0};
        if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) {
            perror("UFFDIO_COPY");
            exit(1);
        }
    }
    return 0;
}

static void *busy(void *arg) {
    (void)arg;
    pin(0);
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    while (!atomic_load(&done)) __asm__ volatile("pause");
    return 0;
}

/* µs per fault over one fresh registered region. */
static double one(void) {
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (uffd < 0) {
        perror("userfaultfd");
        exit(1);
    }
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api)) {
        perror("UFFDIO_API");
        exit(1);
    }
    char *r = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register reg = {
        .range = {(uintptr_t)r, PAGES * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (r == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
        perror("mmap/UFFDIO_REGISTER");
        exit(1);
    }
    atomic_store(&done, 0);
    pthread_t h, b;
    pthread_create(&h, 0, handler, 0);
    if (cur.keep_busy) pthread_create(&b, 0, busy, 0);
    usleep(20000);
    long sum = 0;
    double t = now();
    for (long i = 0; i < PAGES; i++) sum += ((volatile char *)r)[i * PAGE + 8 * (i % 64)];
    t = now() - t;
    atomic_store(&done, 1);
    pthread_join(h, 0);
    if (cur.keep_busy) pthread_join(b, 0);
    if (sum != PAGES * src[0]) {
        fprintf(stderr, "wrong content: sum %ld\n", sum);
        exit(1);
    }
    munmap(r, PAGES * PAGE);
    close(uffd);
    return t / PAGES * 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        fprintf(stderr, "needs 2 CPUs or more\n");
        return 1;
    }
    memset(src, 1, sizeof src);
    pin(0);
    const struct setup setups[] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {1, 1, 1}, {1, 0, 1}};
    const char *names[] = {
        "handler on the program's CPU, blocking",
        "handler on the other CPU, blocking",
        "handler on the other CPU, spinning",
        "handler on the other CPU, spinning; program's CPU kept busy",
        "handler on the other CPU, blocking; program's CPU kept busy",
    };
    for (unsigned k = 0; k < sizeof setups / sizeof setups[0]; k++) {
        cur = setups[k];
        double t[3];
        for (int i = 0; i < 3; i++) t[i] = one();
        qsort(t, 3, sizeof t[0], cmp);
        printf("%-62s %6.2f us a fault (%.2f-%.2f)\n", names[k], t[1], t[0], t[2]);
    }
    return 0;
}
