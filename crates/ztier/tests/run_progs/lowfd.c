/* A program whose open() must get the lowest free descriptor every time,
 * while its heap is under pressure: 64 MiB swept 40 times under a 16M
 * budget, with an open of /dev/null (and its close) every 16 pages. The
 * library's own threads run beside it all along (the background evictor,
 * the handler): none of them may hold one of the program's numbers, even
 * for a moment. Prints how many of the 40960 opens got another
 * descriptor than 3 (natively 0).
 *
 * `lowfd -`: then prints "ready" and opens and closes /dev/null every
 * 5 microseconds until its stdin is closed (while a test asks for its
 * live statistics, then closes it), and says how many of those opens got
 * another number. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HEAP (64u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Says on stderr what the first open that did not get descriptor 3 got,
 * and what held 3 then (if it still does). */
static void say_wrong(long n, int fd) {
    char held[256] = "";
    int e = errno;
    ssize_t k = readlink("/proc/self/fd/3", held, sizeof held - 1);
    if (k > 0)
        held[k] = 0;
    fprintf(stderr, "lowfd: open %ld got %d (%s), descriptor 3 was %s\n", n, fd, fd < 0 ? strerror(e) : "",
            fd == 3 || k <= 0 ? "free again" : held);
}

/* One open of /dev/null (and its close), the n-th: counted in *wrong if
 * it did not get descriptor 3, the first such said. */
static void open_once(long n, long *wrong) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd != 3 && (*wrong)++ == 0)
        say_wrong(n, fd);
    if (fd >= 0)
        close(fd);
}

int main(int argc, char **argv) {
    char *heap = malloc(HEAP);
    if (!heap)
        return 1;
    memset(heap, 1, HEAP);
    long wrong = 0, opens = 0;
    for (int round = 0; round < 40; round++) {
        for (size_t i = 0; i < HEAP; i += 4096) {
            heap[i] += 1;
            if ((i >> 12) % 16 == 0)
                open_once(++opens, &wrong);
        }
    }
    long sum = 0;
    for (size_t i = 0; i < HEAP; i += 4096)
        sum += heap[i];
    printf("opens %ld, not the lowest free descriptor %ld, sum %ld\n", opens, wrong, sum);
    if (argc > 1) {
        long more = 0, wrong_more = 0;
        /* Off the CPU it ran on, where the library's handler thread
         * is pinned: the two run at once, as on a busy machine. */
        int ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (ncpu > 1) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET((sched_getcpu() + 1) % ncpu, &set);
            sched_setaffinity(0, sizeof set, &set);
        }
        printf("ready\n");
        fflush(stdout);
        struct pollfd in = {.fd = 0, .events = POLLIN};
        /* Until stdin is closed (end of file or hang-up: readable). */
        while (poll(&in, 1, 0) <= 0) {
            for (int k = 0; k < 1000; k++) {
                open_once(++more, &wrong_more);
                /* Number 3 free most of the time, as in a program that
                 * opens now and then. */
                double t = now() + 5e-6;
                while (now() < t)
                    ;
            }
        }
        printf("then %s opens, not the lowest free descriptor %ld\n", more >= 1000 ? "many" : "few", wrong_more);
    }
    return 0;
}
