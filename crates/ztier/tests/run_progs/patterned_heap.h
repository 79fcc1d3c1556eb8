/* A heap of 96 MiB in 3,072 blocks of 32 KiB from malloc, each word a
 * pattern of its block and place, for the fork tests (earlyfork_main.c,
 * underscore_fork.c, rawfork.c): under a small budget most of it is cold
 * (evicted) when they fork, and a child checks it. */
#include <stdint.h>
#include <stdlib.h>

#define BLOCKS 3072
#define WORDS 4096
static uint64_t *block[BLOCKS];

static uint64_t pattern(unsigned b, unsigned i) { return (b * 0x9E3779B97F4A7C15u) ^ (i * 0xD1B54A32D192ED03u); }

/* Allocates and fills the heap; 0 if malloc failed. */
static int fill_heap(void) {
    for (unsigned b = 0; b < BLOCKS; b++) {
        block[b] = malloc(WORDS * 8);
        if (!block[b]) return 0;
        for (unsigned i = 0; i < WORDS; i++) block[b][i] = pattern(b, i);
    }
    return 1;
}

/* The words, every `step`th of each block (and its last), that do not
 * hold their pattern. */
static long wrong_words(unsigned step) {
    long n = 0;
    for (unsigned b = 0; b < BLOCKS; b++)
        for (unsigned i = 0; i < WORDS; i += step) n += block[b][i] != pattern(b, i);
    return n;
}
