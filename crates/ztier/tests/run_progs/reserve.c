/* Reservations made over freed memory, as V8 and the JVM make them. A
 * one-page mapping is touched right after the pages behind it were given
 * back, so the page-ins that bring a run of zero pages at once may also
 * bring those free pages; under a small budget such pages become the
 * evictor's victims. Meanwhile the program reserves (PROT_NONE)
 * mappings that reuse the freed pages, commits part of each with
 * mprotect and fills it. Contents are checked; prints a summary. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define PG 4096
#define HOLES 256
#define ROUNDS 8000

static uint8_t *keep[HOLES];
static uint8_t tag[HOLES];
static uint8_t *fillv[64];

int main(void) {
    unsigned bad = 0, reserved = 0;
    for (unsigned r = 0; r < ROUNDS; r++) {
        unsigned k = r % HOLES;
        if (keep[k]) munmap(keep[k], PG);
        /* 16 pages; the last 15 go back at once, then the first is touched. */
        uint8_t *p = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 2; }
        munmap(p + PG, 15 * PG);
        p[0] = (uint8_t)r;
        keep[k] = p;
        tag[k] = (uint8_t)r;
        /* Pressure: 256 KiB written per round, 16 MiB kept. */
        unsigned f = r % 64;
        if (fillv[f]) munmap(fillv[f], 64 * PG);
        fillv[f] = mmap(NULL, 64 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fillv[f] == MAP_FAILED) { perror("mmap"); return 2; }
        for (unsigned i = 0; i < 64; i++) memset(fillv[f] + i * PG, (int)(r + i), PG);
        /* A reservation of 15 pages: the best fit is a freed hole. */
        uint8_t *q = mmap(NULL, 15 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (q == MAP_FAILED) { perror("mmap"); return 2; }
        if (mprotect(q, 4 * PG, PROT_READ | PROT_WRITE) != 0) { perror("mprotect"); return 2; }
        for (unsigned i = 0; i < 4 * PG; i++) bad += q[i] != 0;
        memset(q, 0x5a, 4 * PG);
        munmap(q, 15 * PG);
        reserved++;
        for (unsigned i = 0; i < HOLES; i++) bad += keep[i] && keep[i][0] != tag[i];
    }
    printf("rounds %u reserved %u wrong %u\n", ROUNDS, reserved, bad);
    return bad != 0;
}
