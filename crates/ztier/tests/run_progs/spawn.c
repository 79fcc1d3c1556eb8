/* New programs started from cold memory. A program that keeps what it
 * will run (a path, argv, an environment, posix_spawn's file actions)
 * since before its heap went cold, then starts it: posix_spawn with file
 * actions, posix_spawnp (a PATH search), system, popen, and vfork with
 * execv / execve. The kernel reads the path and both vectors in the
 * child's exec, and glibc's child reads the file actions with every
 * signal blocked; a vfork-like child has no syscall user dispatch. With
 * --fault-path signal or a user-mode-only userfaultfd such reads of
 * evicted pages failed: posix_spawn and system with "Bad address",
 * vfork's exec with it in the child (exit 127). A vfork child that
 * resets every handler it sees (CPython's) and then reads cold memory
 * must not lose the handler that serves its faults.
 *
 * Each round builds its command in malloc'd memory, writes 48 MiB three
 * times over (a 16M budget: the command goes cold; up to four times more
 * while it has not, as on a loaded machine, where the evictor lags), and
 * starts it. A command still resident after that is built again on a
 * new page, up to twice: a page that took a place the protected segment
 * freed while the evictor lagged stays resident behind the whole segment
 * (the replacement policy's, not this test's, to change). The
 * children's output goes to stdout, the same as natively; how many
 * rounds found argv, the environment, system's command and the file
 * actions' path evicted goes to stderr ("cold rounds N"). */
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#define BIG (48u << 20)
extern char **environ;

static char *big;

static void churn(int round) {
    for (int pass = 0; pass < 3; pass++) memset(big, round + pass, BIG);
}

static int evicted(const void *p) {
    unsigned char v = 0;
    mincore((void *)((unsigned long)p & ~4095ul), 4096, &v);
    return !(v & 1);
}

/* Each round's command lives in a new block of its own, so that no page
 * of it is shared with memory the program keeps using (stdio's buffers). */
static char *block, *next;

static void *take(size_t n) {
    void *p = next;
    next += (n + 15) & ~(size_t)15;
    return p;
}

static char *dup_printf(const char *fmt, int n) {
    char *s = take(64);
    snprintf(s, 64, fmt, n);
    return s;
}

static char *copy(const char *s) {
    return strcpy(take(strlen(s) + 1), s);
}

static int waited(pid_t pid, const char *how) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
        printf("%s: child status %#x\n", how, st);
        return 1;
    }
    return 0;
}

int main(void) {
    big = malloc(BIG);
    if (!big) return 2;
    int cold = 0, bad = 0;
    fflush(stdout);
    for (int round = 0; round < 12; round++) {
        int how = round % 6;
        /* An environment of its own, as a daemon builds for its jobs. */
        char **env, **av, *path, *line, *in;
        posix_spawn_file_actions_t fa;
        for (int built = 1;; built++) {
            next = block = malloc(64 << 10);
            env = take(4 * sizeof *env);
            env[0] = dup_printf("ROUND=%d", round);
            env[1] = copy("PATH=/usr/bin:/bin");
            env[2] = copy("LC_ALL=C");
            env[3] = NULL;
            av = take(4 * sizeof *av);
            av[0] = copy(how == 1 ? "sh" : "/bin/sh");
            av[1] = copy("-c");
            av[2] = dup_printf("echo \"round %d: ${ROUND:-inherited} $0\" >&5; cat <&6", round);
            av[3] = NULL;
            path = copy(av[0]);
            line = dup_printf("echo round %d: system", round);
            in = copy("/proc/self/comm");
            posix_spawn_file_actions_init(&fa);
            posix_spawn_file_actions_adddup2(&fa, 1, 5);
            posix_spawn_file_actions_addopen(&fa, 6, in, 0, 0);
            churn(round);
            for (int more = 0; more < 4 && !(evicted(av) && evicted(env) && evicted(line) && evicted(in)); more++)
                churn(round);
            if (built == 3 || (evicted(av) && evicted(env) && evicted(line) && evicted(in))) break;
            posix_spawn_file_actions_destroy(&fa);
        }
        cold += evicted(av) && evicted(env) && evicted(line) && evicted(in);
        fflush(stdout);
        pid_t pid = -1;
        int r = 0;
        switch (how) {
        case 0:
            r = posix_spawn(&pid, path, &fa, NULL, av, env);
            break;
        case 1:
            r = posix_spawnp(&pid, path, &fa, NULL, av, environ);
            break;
        case 2:
            r = system(line);
            if (r) printf("system: status %#x\n", r), bad++;
            r = 0;
            break;
        case 3: {
            FILE *f = popen(line, "r");
            char buf[128];
            if (!f) {
                printf("popen failed\n");
                bad++;
                break;
            }
            while (fgets(buf, sizeof buf, f)) printf("popen: %s", buf);
            int st = pclose(f);
            if (st) printf("popen: status %#x\n", st), bad++;
            break;
        }
        default:
            pid = vfork();
            if (pid == 0) {
                /* As CPython's _posixsubprocess does in its vfork child:
                 * every handler it sees set back to the default, then
                 * its own data read (here system's command, cold). */
                struct sigaction sa, dfl = {.sa_handler = SIG_DFL};
                for (int sig = 1; sig < NSIG; sig++) {
                    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa)) continue;
                    if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN) sigaction(sig, &dfl, NULL);
                }
                if (strlen(line) < 8) _exit(125);
                int fd = open(in, O_RDONLY);
                if (fd < 0 || dup2(fd, 6) < 0 || dup2(1, 5) < 0) _exit(126);
                if (how == 4) execv(path, av);
                else execve(path, av, env);
                _exit(127);
            }
        }
        if (r) printf("round %d: spawn failed: %s\n", round, strerror(r)), bad++;
        else if (pid > 0) bad += waited(pid, "round");
        fflush(stdout);
        posix_spawn_file_actions_destroy(&fa);
        /* The block is not freed: a block used again would be a hot
         * page (its refault distance short), kept through the writes. */
    }
    printf("programs started from cold memory: %d failed\n", bad);
    fprintf(stderr, "cold rounds %d\n", cold);
    return 0;
}
