/* A sandbox's seccomp filter: 48 MiB written, then a filter that makes
 * every ioctl fail with EPERM (as an allow-list without ioctl does), then
 * the memory read back (cold under a 16M budget) and written to
 * /dev/null through system calls. The library's UFFDIO_COPY is an ioctl:
 * where it serves pages in the program's own thread (--fault-path
 * signal, and system calls' memory under a user-mode-only userfaultfd)
 * the filter forbids it, and the run must stop with a message that says
 * so; the default thread path serves them from its own thread, started
 * before the filter, and gives the native output. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HEAP (48u << 20)

int main(void) {
    char *a = malloc(HEAP);
    if (!a) return 2;
    for (size_t i = 0; i < HEAP; i++) a[i] = (char)(i / 4096 * 7);
    int null = open("/dev/null", O_WRONLY);
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {4, f};
    if (null < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p)) {
        perror("seccomp");
        return 2;
    }
    printf("filtered\n");
    fflush(stdout);
    long sum = 0;
    for (size_t i = 0; i < HEAP; i += 4096) sum += a[i];
    for (size_t i = 0; i < HEAP; i += 1 << 20)
        if (write(null, a + i, 4096) != 4096) {
            perror("write");
            return 3;
        }
    printf("sum %ld\n", sum);
    return 0;
}
