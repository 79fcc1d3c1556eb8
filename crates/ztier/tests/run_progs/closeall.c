/* A program that closes every descriptor it did not open, as daemons do
 * at start-up: close_range, closefrom, a loop of close, the raw
 * close_range system call, and close_range with CLOSE_RANGE_UNSHARE.
 * Before each, its 48 MiB heap goes cold (a 16M budget and 48 MiB
 * written elsewhere); after each, the heap must read back as written and
 * the next open must get descriptor 3, the lowest free one. Natively and
 * in every mode of `ztier run` the same output: the library's own
 * descriptors (its userfaultfd, eventfd, control socket) must survive
 * the closes and stay out of the program's numbers. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/close_range.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HEAP (48u << 20)
static uint8_t *heap, *other;

static void chill(int round) { memset(other, round, HEAP); }

static int heap_ok(void) {
    for (size_t i = 0; i < HEAP; i += 4096)
        if (heap[i] != (uint8_t)(i / 4096 * 7 + 1) || heap[i + 4095] != (uint8_t)(i / 4096)) return 0;
    return 1;
}

static void check(const char *how) {
    int ok = heap_ok();
    int fd = open("/dev/null", O_RDONLY);
    printf("%s: heap %s, next descriptor %d\n", how, ok ? "intact" : "CHANGED", fd);
    fflush(stdout);
    if (fd >= 0) close(fd);
}

int main(void) {
    heap = malloc(HEAP);
    other = malloc(HEAP);
    if (!heap || !other) return 1;
    for (size_t i = 0; i < HEAP; i += 4096) {
        memset(heap + i, (uint8_t)(i / 4096 * 7 + 1), 4095);
        heap[i + 4095] = (uint8_t)(i / 4096);
    }
    chill(1);
    close_range(3, ~0U, 0);
    check("close_range(3, ~0U, 0)");
    chill(2);
    closefrom(3);
    check("closefrom(3)");
    chill(3);
    for (int fd = 3; fd < 4096; fd++) close(fd);
    check("close(3..4095)");
    chill(4);
    syscall(SYS_close_range, 3, ~0U, 0);
    check("syscall(SYS_close_range, 3, ~0U, 0)");
    chill(5);
    close_range(3, ~0U, CLOSE_RANGE_UNSHARE);
    check("close_range(3, ~0U, CLOSE_RANGE_UNSHARE)");
    return 0;
}
