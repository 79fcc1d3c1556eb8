// Forked children that share their parent's pages after the parent has
// dropped them: the parent fills A MiB, forks K children that read it
// (and never write it), then sweeps B MiB of its own, which under a
// budget below A + B evicts its copies of A while the children still map
// them. It then prints on stderr the proportional set size of the
// mappings holding A and B, summed over itself and its children
// ("pss_kib N": what the command keeps resident of them, each shared page
// counted once), and the children read A again. stdout: the sums, the
// same every run.
//
// usage: sharedkids A_MIB B_MIB K
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t sum(const unsigned char *s, size_t n) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; i += 64) x += s[i];
    return x;
}

// Pss (KiB) of pid's mappings that contain any of the addresses.
static long pss(int pid, const uintptr_t *at, int n) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/smaps", pid);
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(2); }
    long total = 0;
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        long v;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = 0;
            for (int k = 0; k < n; k++) in |= at[k] >= lo && at[k] < hi;
        } else if (in && sscanf(line, "Pss: %ld kB", &v) == 1) {
            total += v;
        }
    }
    fclose(f);
    return total;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: sharedkids A_MIB B_MIB K\n"); return 2; }
    size_t a = (size_t)atoi(argv[1]) << 20, b = (size_t)atoi(argv[2]) << 20;
    int k = atoi(argv[3]);
    unsigned char *s = malloc(a);
    for (size_t i = 0; i < a; i++) s[i] = (unsigned char)((i * 2654435761u) >> 13);
    int go[2], back[2];
    if (pipe(go) || pipe(back)) return 2;
    int kids[64];
    for (int c = 0; c < k; c++) {
        kids[c] = fork();
        if (kids[c] < 0) return 2;
        if (kids[c] == 0) {
            close(go[1]);
            close(back[0]);
            uint64_t x[2] = {(uint64_t)c, sum(s, a) + sum(s, a)};
            write(back[1], x, sizeof x);
            char ch;
            read(go[0], &ch, 1);  // until the parent closes it
            x[1] = sum(s, a);
            write(back[1], x, sizeof x);
            _exit(0);
        }
    }
    close(go[0]);
    close(back[1]);
    uint64_t first[64], again[64], x[2];
    for (int c = 0; c < k; c++) {
        if (read(back[0], x, sizeof x) != sizeof x) return 3;
        first[x[0]] = x[1];
    }
    unsigned char *t = malloc(b);
    for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < b; i += 4096) t[i] = (unsigned char)((i >> 12) + r);
    sleep(1);
    uintptr_t at[2] = {(uintptr_t)s, (uintptr_t)t};
    long total = pss(getpid(), at, 2);
    for (int c = 0; c < k; c++) total += pss(kids[c], at, 2);
    fprintf(stderr, "pss_kib %ld\n", total);
    close(go[1]);
    for (int c = 0; c < k; c++) {
        if (read(back[0], x, sizeof x) != sizeof x) return 3;
        again[x[0]] = x[1];
    }
    while (wait(NULL) > 0) {}
    for (int c = 0; c < k; c++) printf("child %d %llu %llu\n", c, (unsigned long long)first[c], (unsigned long long)again[c]);
    printf("parent %llu\n", (unsigned long long)sum(t, b));
    return 0;
}
