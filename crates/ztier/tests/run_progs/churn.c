/* Releases the very pages the evictor is working on. A FIFO of 1 MiB
 * mappings, each filled when it is made; under a small budget the oldest
 * pages are the evictor's victims, and here the oldest mappings are
 * given back (munmap), released (MADV_DONTNEED, then read: zeros), or
 * made unreadable and readable again (mprotect) — over and over, while
 * the evictor reads and releases them without the manager's lock.
 * Contents are checked before each is given back; prints a summary. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1u << 20)
#define LIVE 40  /* mappings alive at once: 40 MiB */
#define ROUNDS 1500

static uint8_t *slot[LIVE];
static unsigned tag[LIVE];

static void fill(uint8_t *p, unsigned t) {
    for (size_t i = 0; i < MB; i += 4096) memset(p + i, (uint8_t)(t * 7 + i / 4096), 4096);
}

static int check(const uint8_t *p, unsigned t) {
    for (size_t i = 0; i < MB; i += 4096)
        if (p[i] != (uint8_t)(t * 7 + i / 4096) || p[i + 4095] != p[i]) return 0;
    return 1;
}

int main(void) {
    unsigned bad = 0, zeros_ok = 0, unmapped = 0, released = 0, protected_ = 0;
    for (unsigned r = 0; r < ROUNDS; r++) {
        unsigned k = r % LIVE;
        if (slot[k]) {
            uint8_t *p = slot[k];
            if (!check(p, tag[k])) bad++;
            switch (r % 3) {
            case 0:
                munmap(p, MB);
                unmapped++;
                break;
            case 1: {
                madvise(p, MB, MADV_DONTNEED);
                int z = 1;
                for (size_t i = 0; i < MB; i += 512) z &= p[i] == 0;
                zeros_ok += z;
                munmap(p, MB);
                released++;
                break;
            }
            default:
                /* Unreadable for a moment, then readable: contents stay. */
                mprotect(p, MB, PROT_NONE);
                mprotect(p, MB, PROT_READ | PROT_WRITE);
                if (!check(p, tag[k])) bad++;
                munmap(p, MB);
                protected_++;
                break;
            }
        }
        uint8_t *p = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 2; }
        fill(p, r);
        slot[k] = p;
        tag[k] = r;
    }
    for (unsigned k = 0; k < LIVE; k++)
        if (!check(slot[k], tag[k])) bad++;
    printf("rounds %u unmapped %u released %u (zeros %u) protected %u wrong %u\n", ROUNDS, unmapped,
           released, zeros_ok, protected_, bad);
    return bad != 0 || zeros_ok != released;
}
