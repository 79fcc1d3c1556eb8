/* System calls made through glibc's wrappers that ztier enters directly
 * (read, write, pread64, pwrite64, lseek, close; readv, writev, send,
 * recv and the other socket calls, poll, epoll_wait, stat and friends,
 * open, file and directory calls, fcntl, pipe2, waitpid, eventfds,
 * __read_chk, syscall() itself), on buffers that go cold under the
 * budget, many times over; a futex wait through syscall() whose timeout
 * went cold; and a thread blocked in read() on a pipe, cancelled
 * with pthread_cancel (glibc's cancellation must still reach it); and
 * timeouts on an empty pipe, each left from a SIGALRM handler by
 * siglongjmp (or plain longjmp, which keeps the handler's signal mask):
 * a read() and a readv() of eight buffers (entered directly), a readv()
 * made with the program's own syscall instruction (caught by dispatch),
 * and a poll() each way; after each, calls on cold memory must still
 * work. Prints checksums; the same natively. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1u << 20)
#define FILE_BYTES (8u * MB)
#define BIG (40u * MB)
#define CALLS 20000

static int fds[2];
static sigjmp_buf timeout;
static jmp_buf plain;
static volatile int use_plain;

static void on_alarm(int sig) {
    (void)sig;
    if (use_plain) longjmp(plain, 1);
    siglongjmp(timeout, 1);
}

static uint64_t churn(uint64_t *a, uint64_t seed);

/* A system call made by the program's own instruction, not glibc's. */
static long own_syscall(long nr, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static void arm(void) {
    struct itimerval it = { { 0, 0 }, { 0, 50000 } };
    setitimer(ITIMER_REAL, &it, NULL);
}

/* After a timeout: a write and a readv on memory gone cold meanwhile,
 * with no other call of the thread in between. */
static int after_timeout(int *p, unsigned char *src, unsigned char *dst, uint64_t *big, size_t at, uint64_t seed) {
    (void)churn(big, seed);
    struct iovec w = { src + at * 4096, 4096 };
    if (writev(p[1], &w, 1) != 4096) { perror("writev after timeout"); return -1; }
    struct iovec v = { dst + (at + 3) * 4096, 4096 };
    if (readv(p[0], &v, 1) != 4096) { perror("readv after timeout"); return -1; }
    return memcmp(src + at * 4096, dst + (at + 3) * 4096, 4096) == 0;
}

static void *reader(void *arg) {
    (void)arg;
    char *buf = malloc(1 << 16);
    for (;;)
        if (read(fds[0], buf, 1 << 16) <= 0) break;
    return NULL;
}

static uint64_t churn(uint64_t *a, uint64_t seed) {
    for (size_t i = 0; i < BIG / 8; i++) a[i] = i * 2654435761u + seed;
    uint64_t s = 0;
    for (size_t i = 0; i < BIG / 8; i += 7) s += a[i];
    return s;
}

/* The other wrappers, on cold memory: a socket pair (send/recv,
 * sendto/recvfrom, sendmsg/recvmsg), writev/readv of six buffers, poll
 * and epoll_wait with their arrays in the heap, stat/lstat/fstat/fstatat
 * into heap structs and open of a heap path, and syscall(): gettid, a
 * futex wake and a futex wait with a timeout on a heap word. */
#define ROUNDS 1500
static int more_calls(const char *dir, unsigned char *src, unsigned char *dst, uint64_t *big) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return -1; }
    int ep = epoll_create1(0);
    if (ep < 0) { perror("epoll_create1"); return -1; }
    struct epoll_event *ev = malloc(4 * sizeof *ev);
    struct pollfd *pf = malloc(2 * sizeof *pf);
    struct stat *st = malloc(4 * sizeof *st);
    uint32_t *word = malloc(64);
    char *path = malloc(4096);
    struct msghdr *mh = malloc(sizeof *mh);
    struct iovec *iv = malloc(8 * sizeof *iv);
    if (!ev || !pf || !st || !word || !path || !mh || !iv) { perror("malloc"); return -1; }
    snprintf(path, 4096, "%s/more.bin", dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) { perror("open"); return -1; }
    struct epoll_event add = { EPOLLIN, { .fd = sv[1] } };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], &add)) { perror("epoll_ctl"); return -1; }
    uint64_t sum = 0, s = 0;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    for (int k = 0; k < ROUNDS; k++) {
        size_t a = (size_t)(k * 37) % 1500, b = (size_t)(k * 53 + 11) % 1500;
        if (k % 50 == 0) s += churn(big, 1000 + k);
        if (send(sv[0], src + a * 4096, 4096, 0) != 4096) { perror("send"); return -1; }
        pf[0] = (struct pollfd){ sv[1], POLLIN, 0 };
        if (poll(pf, 1, 1000) != 1) { perror("poll"); return -1; }
        if (epoll_wait(ep, ev, 4, 1000) != 1 || ev[0].data.fd != sv[1]) { perror("epoll_wait"); return -1; }
        if (recv(sv[1], dst + b * 4096, 4096, MSG_WAITALL) != 4096) { perror("recv"); return -1; }
        sum += memcmp(src + a * 4096, dst + b * 4096, 4096) == 0;
        if (sendto(sv[1], dst + b * 4096, 2048, 0, NULL, 0) != 2048) { perror("sendto"); return -1; }
        if (recvfrom(sv[0], dst + a * 4096, 2048, MSG_WAITALL, NULL, NULL) != 2048) { perror("recvfrom"); return -1; }
        for (int j = 0; j < 2; j++) iv[j] = (struct iovec){ src + ((a + 7 * j) % 1500) * 4096, 1024 };
        *mh = (struct msghdr){ .msg_iov = iv, .msg_iovlen = 2 };
        if (sendmsg(sv[0], mh, 0) != 2048) { perror("sendmsg"); return -1; }
        for (int j = 0; j < 2; j++) iv[j] = (struct iovec){ dst + ((b + 5 * j) % 1500) * 4096, 1024 };
        if (recvmsg(sv[1], mh, MSG_WAITALL) != 2048) { perror("recvmsg"); return -1; }
        for (int j = 0; j < 6; j++) iv[j] = (struct iovec){ src + ((a + 13 * j) % 1500) * 4096, 512 };
        if (pwritev(fd, iv, 6, 0) != 3072) { perror("pwritev"); return -1; }
        for (int j = 0; j < 6; j++) iv[j] = (struct iovec){ dst + ((b + 17 * j) % 1500) * 4096, 512 };
        if (preadv(fd, iv, 6, 0) != 3072) { perror("preadv"); return -1; }
        sum += dst[((b + 17 * 5) % 1500) * 4096 + 511];
        if (fstat(fd, st) || stat(path, st + 1) || lstat(path, st + 2) || fstatat(AT_FDCWD, path, st + 3, 0)) {
            perror("stat");
            return -1;
        }
        sum += st[0].st_size == 3072 && st[1].st_ino == st[0].st_ino && st[3].st_ino == st[2].st_ino;
        int f2 = open(path, O_RDONLY);
        if (f2 < 0 || close(f2)) { perror("open again"); return -1; }
        if ((pid_t)syscall(SYS_gettid) != tid || getpid() <= 0) { perror("gettid"); return -1; }
        *word = (uint32_t)k;
        if (syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0) != 0) { perror("futex wake"); return -1; }
        if (k % 100 == 0) {
            struct timespec ts = { 0, 1000 };
            if (syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, (uint32_t)k, &ts, NULL, 0) != -1 || errno != ETIMEDOUT) {
                perror("futex wait");
                return -1;
            }
        }
    }
    close(fd);
    unlink(path);
    close(ep);
    close(sv[0]);
    close(sv[1]);
    printf("more calls: %llu, churn %llu\n", (unsigned long long)sum, (unsigned long long)s);
    return 0;
}

/* Still more wrappers, on heap memory that goes cold between rounds:
 * paths for access/mkdir/rename/readlink/rmdir/unlink, a pipe2 array, a
 * struct flock for fcntl, eventfd_read's value, waitpid's status, uname,
 * getrusage and sched_getaffinity's structs, glibc's fortified
 * __read_chk, and usleep. */
extern ssize_t __read_chk(int fd, void *buf, size_t n, size_t size);
#define OTHER_ROUNDS 300
static int other_calls(const char *dir, uint64_t *big) {
    char *a = malloc(64 << 10), *b = malloc(64 << 10), *link = malloc(64 << 10), *got = malloc(64 << 10);
    int *fds = malloc(64 << 10);
    struct flock *lk = malloc(64 << 10);
    uint64_t *value = malloc(64 << 10);
    int *status = malloc(64 << 10);
    struct utsname *un = malloc(64 << 10);
    struct rusage *ru = malloc(64 << 10);
    cpu_set_t *cpus = malloc(64 << 10);
    if (!a || !b || !link || !got || !fds || !lk || !value || !status || !un || !ru || !cpus) {
        perror("malloc");
        return -1;
    }
    snprintf(a, 4096, "%s/other-a", dir);
    snprintf(b, 4096, "%s/other-b", dir);
    snprintf(link, 4096, "%s/other-link", dir);
    if (symlink("other-target", link)) { perror("symlink"); return -1; }
    int ev = eventfd(0, 0);
    if (ev < 0) { perror("eventfd"); return -1; }
    uint64_t sum = 0, s = 0;
    for (int k = 0; k < OTHER_ROUNDS; k++) {
        if (k % 30 == 0) s += churn(big, 2000 + k);
        if (mkdir(a, 0700) || access(a, F_OK) || rename(a, b) || access(a, F_OK) == 0 || rmdir(b)) {
            perror("mkdir/access/rename/rmdir");
            return -1;
        }
        ssize_t n = readlink(link, got, 4096);
        if (n != 12 || memcmp(got, "other-target", 12)) { perror("readlink"); return -1; }
        if (pipe2(fds, O_CLOEXEC)) { perror("pipe2"); return -1; }
        fds[2] = dup2(fds[1], 100);
        if (fds[2] != 100 || write(100, b, 64) != 64 || __read_chk(fds[0], got, 64, 65536) != 64) {
            perror("dup2/__read_chk");
            return -1;
        }
        sum += memcmp(got, b, 64) == 0;
        int f = open(b, O_CREAT | O_RDWR, 0600);
        *lk = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10 };
        if (f < 0 || fcntl(f, F_GETLK, lk) || lk->l_type != F_UNLCK || fcntl(f, F_GETFD) < 0) {
            perror("fcntl");
            return -1;
        }
        close(f);
        unlink(b);
        close(fds[0]);
        close(fds[1]);
        close(100);
        if (eventfd_write(ev, (eventfd_t)k + 1) || eventfd_read(ev, value) || *value != (uint64_t)k + 1) {
            perror("eventfd");
            return -1;
        }
        if (uname(un) || getrusage(RUSAGE_SELF, ru) || sched_getaffinity(0, sizeof *cpus, cpus)) {
            perror("uname/getrusage/sched_getaffinity");
            return -1;
        }
        sum += strcmp(un->sysname, "Linux") == 0 && CPU_COUNT(cpus) > 0;
        if (k % 50 == 0) {
            pid_t c = fork();
            if (c == 0) _exit(7);
            if (c < 0 || waitpid(c, status, 0) != c || !WIFEXITED(*status) || WEXITSTATUS(*status) != 7) {
                perror("fork/waitpid");
                return -1;
            }
            sum += 1;
            usleep(1);
        }
    }
    unlink(link);
    close(ev);
    printf("other calls: %llu, churn %llu\n", (unsigned long long)sum, (unsigned long long)s);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/direct.bin", dir);
    unsigned char *src = malloc(FILE_BYTES), *dst = malloc(FILE_BYTES);
    uint64_t *big = malloc(BIG);
    if (!src || !dst || !big) { perror("malloc"); return 2; }
    /* A futex wait whose timeout, written once, went cold meanwhile
     * (the kernel reads it before anything else). */
    struct timespec *cold = malloc(BIG);
    if (!cold) { perror("malloc"); return 2; }
    *cold = (struct timespec){ 0, 1000 };
    for (size_t i = 0; i < BIG / 8; i++) big[i] = i;
    uint32_t word = 1;
    errno = 0;
    long w = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 1, cold, NULL, 0);
    printf("futex wait with a cold timeout: %ld, %s\n", w, strerror(errno));
    free(cold);
    for (size_t i = 0; i < FILE_BYTES; i++) src[i] = (unsigned char)(i * 131 + (i >> 12));

    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) { perror("open"); return 2; }
    /* src goes cold while big is filled; then written out 4 KiB a call. */
    uint64_t s = churn(big, 1);
    for (size_t off = 0; off < FILE_BYTES; off += 4096)
        if (write(fd, src + off, 4096) != 4096) { perror("write"); return 2; }
    s += churn(big, 2);
    /* Random reads into a cold buffer, then random rewrites. */
    uint64_t x = 88172645463325252u, sum = 0;
    for (int k = 0; k < CALLS; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t page = x % (FILE_BYTES / 4096);
        if (pread64(fd, dst + page * 4096, 4096, (off_t)page * 4096) != 4096) { perror("pread64"); return 2; }
        sum += dst[page * 4096 + (k & 4095)];
        if (k % 4 == 0 && pwrite64(fd, src + page * 4096, 4096, (off_t)page * 4096) != 4096) {
            perror("pwrite64");
            return 2;
        }
        if (k % 1000 == 999) s += churn(big, 3 + k);
    }
    if (lseek(fd, 0, SEEK_END) != (off_t)FILE_BYTES) { perror("lseek"); return 2; }
    if (lseek(fd, 0, SEEK_SET) != 0) { perror("lseek"); return 2; }
    for (size_t off = 0; off < FILE_BYTES; off += 4096)
        if (read(fd, dst + off, 4096) != 4096) { perror("read"); return 2; }
    if (close(fd)) { perror("close"); return 2; }
    printf("same: %d, sum %llu, churn %llu\n", memcmp(src, dst, FILE_BYTES) == 0, (unsigned long long)sum,
           (unsigned long long)s);
    unlink(path);

    /* A read with a timeout, left by siglongjmp; then calls on memory
     * that went cold meanwhile, with no other call in between. */
    int p2[2];
    if (pipe(p2)) { perror("pipe"); return 2; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    if (sigaction(SIGALRM, &sa, NULL)) { perror("sigaction"); return 2; }
    char *small = malloc(16); /* from the arena: pinned for the read */
    if (!small) { perror("malloc"); return 2; }
    if (sigsetjmp(timeout, 1) == 0) {
        struct itimerval it = { { 0, 0 }, { 0, 50000 } };
        setitimer(ITIMER_REAL, &it, NULL);
        if (read(p2[0], small, 16) >= 0) { puts("read returned"); return 2; }
        perror("read");
        return 2;
    }
    uint64_t s2 = churn(big, 77);
    if (write(p2[1], src + 5 * 4096, 4096) != 4096) { perror("write after timeout"); return 2; }
    struct iovec v = { dst + 9 * 4096, 4096 };
    if (readv(p2[0], &v, 1) != 4096) { perror("readv after timeout"); return 2; }
    printf("after the timeout: %d, churn %llu\n", memcmp(src + 5 * 4096, dst + 9 * 4096, 4096) == 0,
           (unsigned long long)s2);
    /* A readv of eight buffers, entered directly: each one pinned while
     * it blocks, and all of them unpinned by the jump. */
    if (sigsetjmp(timeout, 1) == 0) {
        arm();
        struct iovec v8[8];
        for (int k = 0; k < 8; k++) v8[k] = (struct iovec){ dst + (100 + 2 * k) * 4096, 4096 };
        readv(p2[0], v8, 8);
        puts("readv of eight returned");
        return 2;
    }
    int ok = after_timeout(p2, src, dst, big, 20, 78);
    if (ok < 0) return 2;
    printf("after the readv timeout: %d\n", ok);
    /* The same around a call that dispatch catches (not entered directly). */
    if (sigsetjmp(timeout, 1) == 0) {
        arm();
        struct iovec v = { small, 16 };
        own_syscall(SYS_readv, p2[0], (long)&v, 1);
        puts("own readv returned");
        return 2;
    }
    ok = after_timeout(p2, src, dst, big, 30, 80);
    if (ok < 0) return 2;
    printf("after the own readv timeout: %d\n", ok);
    use_plain = 1;
    if (setjmp(plain) == 0) {
        arm();
        struct pollfd pf = { p2[0], POLLIN, 0 };
        poll(&pf, 1, -1);
        puts("poll returned");
        return 2;
    }
    ok = after_timeout(p2, src, dst, big, 40, 79);
    if (ok < 0) return 2;
    printf("after the poll timeout: %d\n", ok);
    /* The plain longjmp kept SIGALRM blocked, as the handler had it. */
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alrm, NULL);
    if (setjmp(plain) == 0) {
        arm();
        struct pollfd pf = { p2[0], POLLIN, 0 };
        own_syscall(SYS_poll, (long)&pf, 1, -1);
        puts("own poll returned");
        return 2;
    }
    ok = after_timeout(p2, src, dst, big, 50, 81);
    if (ok < 0) return 2;
    printf("after the own poll timeout: %d\n", ok);
    use_plain = 0;

    if (more_calls(dir, src, dst, big)) return 2;
    if (other_calls(dir, big)) return 2;

    if (pipe(fds)) { perror("pipe"); return 2; }
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL)) { perror("pthread_create"); return 2; }
    usleep(100000);
    pthread_cancel(t);
    void *res;
    pthread_join(t, &res);
    printf("reader cancelled: %d\n", res == PTHREAD_CANCELED);
    return 0;
}
