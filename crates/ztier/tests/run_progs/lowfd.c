/* A program whose open() must get the lowest free descriptor every time,
 * while its heap is under pressure: 64 MiB swept 40 times under a 16M
 * budget, with an open of /dev/null (and its close) every 16 pages. The
 * library's own threads run beside it all along (the background evictor,
 * the handler): none of them may hold one of the program's numbers, even
 * for a moment. Prints how many of the 40960 opens got another
 * descriptor than 3 (natively 0). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAP (64u << 20)

int main(void) {
    char *heap = malloc(HEAP);
    if (!heap)
        return 1;
    memset(heap, 1, HEAP);
    long wrong = 0, opens = 0;
    for (int round = 0; round < 40; round++) {
        for (size_t i = 0; i < HEAP; i += 4096) {
            heap[i] += 1;
            if ((i >> 12) % 16 == 0) {
                int fd = open("/dev/null", O_RDONLY);
                opens++;
                if (fd != 3)
                    wrong++;
                if (fd >= 0)
                    close(fd);
            }
        }
    }
    long sum = 0;
    for (size_t i = 0; i < HEAP; i += 4096)
        sum += heap[i];
    printf("opens %ld, not the lowest free descriptor %ld, sum %ld\n", opens, wrong, sum);
    return 0;
}
