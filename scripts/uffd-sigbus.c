/*
 * uffd-sigbus: what a missing-page fault costs when the faulting thread
 * installs its own page (UFFD_FEATURE_SIGBUS: the fault raises SIGBUS in
 * the thread, whose handler does UFFDIO_COPY and returns), against the
 * round trip `ztier run` makes through a handler thread on the same CPU
 * (poll, read the event, UFFDIO_COPY with DONTWAKE, UFFDIO_WAKE), for runs
 * of 1 and 8 pages a fault. Both copy from a cached buffer: nothing is
 * decompressed or looked up. Medians of 3 timings of 16384 pages each,
 * every thread pinned to the CPU it starts on; every page's content is
 * checked.
 *
 *   cc -O2 -pthread -o /tmp/uffd-sigbus scripts/uffd-sigbus.c
 *   /tmp/uffd-sigbus       (root, or any user: it asks for
 *                           UFFD_USER_MODE_ONLY; Linux >= 5.11)
 *
 * In-thread service is what `ztier run` does not do: in SIGBUS mode a
 * fault taken inside a system call (a read() into an evicted heap page, a
 * futex in the heap) is not raised as a signal but fails with EFAULT.
 * This program measures only what it would save. It changes no system
 * setting.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define PAGES 16384UL
#define FILL 0x5a

static int uffd;
static char *src;       /* the run's contents, 8 pages of FILL */
static char *area;      /* the registered range */
static unsigned long run; /* pages installed a fault */

static void die(const char *what) {
  perror(what);
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The run of `run` pages that holds `addr`, clipped to the area. */
static struct uffdio_copy run_of(uintptr_t addr, __u64 mode) {
  uintptr_t base = (uintptr_t)area;
  uintptr_t at = base + (addr - base) / (run * PAGE) * (run * PAGE);
  uintptr_t end = at + run * PAGE;
  if (end > base + PAGES * PAGE) end = base + PAGES * PAGE;
  struct uffdio_copy c = {.dst = at, .src = (uintptr_t)src, .len = end - at, .mode = mode};
  return c;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)uc;
  struct uffdio_copy c = run_of((uintptr_t)si->si_addr, 0);
  if (ioctl(uffd, UFFDIO_COPY, &c) != 0) {
    static const char msg[] = "uffd-sigbus: UFFDIO_COPY in the signal handler failed\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
    _exit(3);
  }
}

static void *handler_thread(void *arg) {
  (void)arg;
  for (;;) {
    struct pollfd p = {.fd = uffd, .events = POLLIN};
    if (poll(&p, 1, -1) < 0) die("poll");
    struct uffd_msg m;
    ssize_t n = read(uffd, &m, sizeof m);
    if (n != sizeof m) continue;
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    struct uffdio_copy c = run_of(m.arg.pagefault.address, UFFDIO_COPY_MODE_DONTWAKE);
    if (ioctl(uffd, UFFDIO_COPY, &c) != 0) die("UFFDIO_COPY");
    struct uffdio_range r = {.start = c.dst, .len = c.len};
    if (ioctl(uffd, UFFDIO_WAKE, &r) != 0) die("UFFDIO_WAKE");
  }
  return NULL;
}

static int open_uffd(__u64 features) {
  int fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  if (fd < 0) die("userfaultfd");
  struct uffdio_api api = {.api = UFFD_API, .features = features};
  if (ioctl(fd, UFFDIO_API, &api) != 0) die("UFFDIO_API");
  return fd;
}

/* Touches every page of a fresh registered area; returns µs a fault. */
static double one_timing(void) {
  area = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) die("mmap");
  struct uffdio_register reg = {.range = {(uintptr_t)area, PAGES * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) die("UFFDIO_REGISTER");
  double t = now();
  unsigned long sum = 0;
  for (unsigned long i = 0; i < PAGES; i++) sum += (unsigned char)area[i * PAGE];
  double e = now() - t;
  for (unsigned long i = 0; i < PAGES * PAGE; i += 512)
    if ((unsigned char)area[i] != FILL) {
      fprintf(stderr, "uffd-sigbus: byte %lu is not the fill byte\n", i);
      exit(2);
    }
  if (sum != (unsigned long)FILL * PAGES) {
    fprintf(stderr, "uffd-sigbus: wrong contents\n");
    exit(2);
  }
  if (munmap(area, PAGES * PAGE) != 0) die("munmap");
  return e / ((PAGES + run - 1) / run) * 1e6;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median3(void) {
  double t[3];
  for (int i = 0; i < 3; i++) t[i] = one_timing();
  qsort(t, 3, sizeof t[0], cmp);
  return t[1];
}

int main(void) {
  int cpu = sched_getcpu();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
  src = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (src == MAP_FAILED) die("mmap");
  memset(src, FILL, 8 * PAGE);
  printf("uffd-sigbus: all threads on CPU %d, %lu pages a timing, median of 3 (µs a fault)\n", cpu, PAGES);

  /* A handler thread on the same CPU. */
  uffd = open_uffd(0);
  pthread_t th;
  if (pthread_create(&th, NULL, handler_thread, NULL) != 0) die("pthread_create");
  for (run = 1; run <= 8; run += 7) printf("  handler thread,     %lu page(s) a fault  %6.2f\n", run, median3());
  /* The thread stays blocked in poll on this uffd; the process exits. */

  /* The faulting thread itself, through SIGBUS. */
  uffd = open_uffd(UFFD_FEATURE_SIGBUS);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  if (sigaction(SIGBUS, &sa, NULL) != 0) die("sigaction");
  for (run = 1; run <= 8; run += 7) printf("  in-thread (SIGBUS), %lu page(s) a fault  %6.2f\n", run, median3());
  return 0;
}
