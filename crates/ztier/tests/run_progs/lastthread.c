/* A process ends when its last thread ends, whichever thread that is:
 * glibc calls exit(0) when the last thread it counts leaves (returns
 * from its function, or the main thread calls pthread_exit). A 48 MiB
 * heap of patterned words, then:
 * 1. a thread other than the main one forks; the child, whose only
 *    thread is that one, checks a slice of the heap and returns from the
 *    thread's function: the child ends with status 0. The parent's
 *    thread polls for it with waitpid(WNOHANG), as CPython's
 *    test.support.wait_process does, for 30 s at most (then kills it by
 *    its PID and says so);
 * 2. the main thread starts a last thread and calls pthread_exit; the
 *    last thread checks the whole heap, says so and returns: the process
 *    ends with status 0.
 * Under `ztier run` the library's own threads, which never end, kept
 * both processes alive (a zombie leader with the library's threads). */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORDS ((48u << 20) / 8)

static uint64_t *a;

static int check(uint64_t from, uint64_t n) {
    for (uint64_t i = from; i < from + n; i++)
        if (a[i] != i * 2654435761u) return 0;
    return 1;
}

static void *forker(void *arg) {
    (void)arg;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        printf("child of a thread: heap %s\n", check(0, WORDS / 3) ? "ok" : "WRONG");
        fflush(stdout);
        return NULL; /* the child's last thread: the child ends here */
    }
    int status = 0;
    for (int i = 0; i < 3000; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            printf("child of a thread: ended, status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            return NULL;
        }
        usleep(10000);
    }
    printf("child of a thread: still running after 30 s, killed\n");
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return NULL;
}

static void *last(void *arg) {
    (void)arg;
    usleep(20000); /* the main thread has left by then */
    printf("last thread: heap %s\n", check(0, WORDS) ? "ok" : "WRONG");
    fflush(stdout);
    return NULL; /* the process's last thread: the process ends here */
}

int main(void) {
    a = malloc(WORDS * 8);
    if (!a) return 1;
    for (uint64_t i = 0; i < WORDS; i++) a[i] = i * 2654435761u;
    pthread_t t;
    if (pthread_create(&t, NULL, forker, NULL) != 0 || pthread_join(t, NULL) != 0) return 1;
    if (pthread_create(&t, NULL, last, NULL) != 0) return 1;
    pthread_exit(NULL);
}
