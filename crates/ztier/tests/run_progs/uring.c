/* Reads and writes through io_uring into heap buffers that go cold under
 * the budget, as a program that prefers io_uring and falls back to
 * pread/pwrite when io_uring_setup fails (as libuv and liburing users
 * do). Each round writes 64 buffers of 16 KiB to a file and reads them
 * back into 64 others, between rounds a buffer larger than the budget is
 * filled. Prints a checksum of everything read; the same whichever way
 * the I/O went (which way goes to stderr). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BUFS 64
#define LEN (16u << 10)
#define ROUNDS 30
#define COLD (40u << 20)

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static int ring_init(struct ring *r) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, BUFS, &p);
    if (r->fd < 0) return -1;
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    unsigned char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    unsigned char *cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_CQ_RING);
    r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   r->fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) return -1;
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

/* BUFS reads or writes of LEN bytes each at offset k * LEN; returns the
 * number that did not complete in full. */
static int ring_batch(struct ring *r, int fd, unsigned char **bufs, int op) {
    unsigned tail = *r->sq_tail;
    for (unsigned k = 0; k < BUFS; k++) {
        unsigned i = (tail + k) & *r->sq_mask;
        struct io_uring_sqe *e = &r->sqes[i];
        memset(e, 0, sizeof *e);
        e->opcode = (uint8_t)op;
        e->fd = fd;
        e->addr = (uint64_t)(uintptr_t)bufs[k];
        e->len = LEN;
        e->off = (uint64_t)k * LEN;
        e->user_data = k;
        r->sq_array[i] = i;
    }
    __atomic_store_n(r->sq_tail, tail + BUFS, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, r->fd, BUFS, BUFS, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
        perror("io_uring_enter");
        exit(2);
    }
    int bad = 0, seen = 0;
    while (seen < BUFS) {
        unsigned head = *r->cq_head;
        while (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) && seen < BUFS) {
            struct io_uring_cqe *c = &r->cqes[head & *r->cq_mask];
            if (c->res != (int)LEN) {
                if (bad++ == 0) fprintf(stderr, "io_uring %s: %s\n", op == IORING_OP_READ ? "read" : "write",
                                        c->res < 0 ? strerror(-c->res) : "short");
            }
            head++;
            seen++;
        }
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        if (seen < BUFS && syscall(__NR_io_uring_enter, r->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
            perror("io_uring_enter");
            exit(2);
        }
    }
    return bad;
}

int main(void) {
    unsigned char *cold = malloc(COLD);
    unsigned char *out[BUFS], *in[BUFS];
    if (!cold) return 2;
    memset(cold, 1, COLD);
    for (int k = 0; k < BUFS; k++) {
        out[k] = malloc(LEN);
        in[k] = malloc(LEN);
        if (!out[k] || !in[k]) return 2;
    }
    char path[] = "/tmp/ztier-uring-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 2; }
    unlink(path);
    struct ring r;
    int uring = ring_init(&r) == 0;
    fprintf(stderr, uring ? "using io_uring\n" : "io_uring_setup failed (%s): using pread/pwrite\n", strerror(errno));
    uint64_t sum = 0;
    int failed = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < BUFS; k++)
            for (unsigned i = 0; i < LEN; i += 64) out[k][i] = (unsigned char)(round * 31 + k * 7 + i / 64);
        /* Everything goes cold before the I/O. */
        for (size_t i = 0; i < COLD; i += 4096) cold[i] = (unsigned char)(round + i);
        if (uring) {
            failed += ring_batch(&r, fd, out, IORING_OP_WRITE);
            failed += ring_batch(&r, fd, in, IORING_OP_READ);
        } else {
            for (int k = 0; k < BUFS; k++) failed += pwrite(fd, out[k], LEN, (off_t)k * LEN) != (ssize_t)LEN;
            for (int k = 0; k < BUFS; k++) failed += pread(fd, in[k], LEN, (off_t)k * LEN) != (ssize_t)LEN;
        }
        for (int k = 0; k < BUFS; k++)
            for (unsigned i = 0; i < LEN; i += 64) sum = sum * 1000003 + in[k][i];
    }
    printf("rounds %d, failed transfers %d, sum %016llx\n", ROUNDS, failed, (unsigned long long)sum);
    return failed != 0;
}
