/*
 * blockers: a workload whose threads block forever, each in one known way,
 * under three layers of its own functions, for the unwinding acceptance
 * test (tests/it/unwind.rs), which compares the profiler's user stacks with
 * gdb's. tests/workloads/blockers.rs is the same program in Rust.
 *
 *   thread        blocks in (every 25-40 ms)            fed by
 *   sleeper       nanosleep                             -
 *   pipe_reader   read() of a pipe                      pipe_writer
 *   cond_waiter   pthread_cond_wait                     cond_signaller
 *   mutex_waiter  pthread_mutex_lock                    mutex_holder
 *   epoller       epoll_wait with a timeout             -
 *   main thread   pthread_join                          joinee
 *
 * Each blocking call is made from levelN_* functions: level1 calls level2
 * calls level3 calls libc. They are noinline and do a volatile write after
 * each call, so that none is inlined or turned into a tail call: every one
 * is a frame.
 *
 * The main thread joins a `joinee` thread that sleeps 30 ms and exits, then
 * starts the next one: a thread blocked for the whole trace is never
 * switched, so no off-CPU profiler would see it.
 *
 * Prints its pid on the first line of stdout, then runs until killed.
 *
 * Build: clang -O2 -g -pthread [-fno-omit-frame-pointer
 * -mno-omit-leaf-frame-pointer | -fomit-frame-pointer] blockers.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

/* Written after every call so that the call is not the function's last act
 * (no tail call) and the function does not fold into its caller. */
static volatile unsigned long sink;

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* sleeper: nanosleep. */

NOINLINE void level3_sleep(void)
{
    struct timespec ts = {0, 25 * 1000000L};
    nanosleep(&ts, NULL);
    sink++;
}

NOINLINE void level2_sleep(void)
{
    level3_sleep();
    sink++;
}

NOINLINE void level1_sleep(void)
{
    level2_sleep();
    sink++;
}

NOINLINE void *sleeper_main(void *arg)
{
    (void)arg;
    for (;;)
        level1_sleep();
    return NULL;
}

/* pipe_reader: read() of a pipe that pipe_writer feeds a byte every 30 ms. */

static int pipe_fds[2];

NOINLINE void level3_read(void)
{
    char c;
    if (read(pipe_fds[0], &c, 1) != 1 && errno != EINTR)
        die("read");
    sink++;
}

NOINLINE void level2_read(void)
{
    level3_read();
    sink++;
}

NOINLINE void level1_read(void)
{
    level2_read();
    sink++;
}

NOINLINE void *pipe_reader_main(void *arg)
{
    (void)arg;
    for (;;)
        level1_read();
    return NULL;
}

NOINLINE void *pipe_writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        sleep_ms(30);
        if (write(pipe_fds[1], "x", 1) != 1)
            die("write");
    }
    return NULL;
}

/* cond_waiter: pthread_cond_wait, signalled every 30 ms by cond_signaller. */

static pthread_mutex_t cond_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int cond_flag;

NOINLINE void level3_cond_wait(void)
{
    pthread_mutex_lock(&cond_lock);
    while (!cond_flag)
        pthread_cond_wait(&cond, &cond_lock);
    cond_flag = 0;
    pthread_mutex_unlock(&cond_lock);
    sink++;
}

NOINLINE void level2_cond_wait(void)
{
    level3_cond_wait();
    sink++;
}

NOINLINE void level1_cond_wait(void)
{
    level2_cond_wait();
    sink++;
}

NOINLINE void *cond_waiter_main(void *arg)
{
    (void)arg;
    for (;;)
        level1_cond_wait();
    return NULL;
}

NOINLINE void *cond_signaller_main(void *arg)
{
    (void)arg;
    for (;;) {
        sleep_ms(30);
        pthread_mutex_lock(&cond_lock);
        cond_flag = 1;
        pthread_cond_signal(&cond);
        pthread_mutex_unlock(&cond_lock);
    }
    return NULL;
}

/* mutex_waiter: pthread_mutex_lock of a mutex that mutex_holder keeps 30 ms
 * at a time, releasing it for 1 ms in between. The waiter takes and drops
 * it in a loop, so it only ever blocks in the lock (between two holds it
 * spins through uncontended locks, on the CPU). */

static pthread_mutex_t contended = PTHREAD_MUTEX_INITIALIZER;

NOINLINE void level3_mutex_lock(void)
{
    pthread_mutex_lock(&contended);
    sink++;
    pthread_mutex_unlock(&contended);
}

NOINLINE void level2_mutex_lock(void)
{
    level3_mutex_lock();
    sink++;
}

NOINLINE void level1_mutex_lock(void)
{
    level2_mutex_lock();
    sink++;
}

NOINLINE void *mutex_waiter_main(void *arg)
{
    (void)arg;
    for (;;)
        level1_mutex_lock();
    return NULL;
}

NOINLINE void *mutex_holder_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&contended);
        sleep_ms(30);
        pthread_mutex_unlock(&contended);
        sleep_ms(1);
    }
    return NULL;
}

/* epoller: epoll_wait with a 40 ms timeout on an epoll fd watching a pipe
 * that is never written. */

static int epoll_fd;

NOINLINE void level3_epoll_wait(void)
{
    struct epoll_event ev;
    /* EINTR when a debugger attaches: epoll_wait is never restarted. */
    if (epoll_wait(epoll_fd, &ev, 1, 40) < 0 && errno != EINTR)
        die("epoll_wait");
    sink++;
}

NOINLINE void level2_epoll_wait(void)
{
    level3_epoll_wait();
    sink++;
}

NOINLINE void level1_epoll_wait(void)
{
    level2_epoll_wait();
    sink++;
}

NOINLINE void *epoller_main(void *arg)
{
    (void)arg;
    for (;;)
        level1_epoll_wait();
    return NULL;
}

/* The main thread: pthread_join of a thread that exits after 30 ms. */

NOINLINE void level3_join(pthread_t t)
{
    pthread_join(t, NULL);
    sink++;
}

NOINLINE void level2_join(pthread_t t)
{
    level3_join(t);
    sink++;
}

NOINLINE void level1_join(pthread_t t)
{
    level2_join(t);
    sink++;
}

NOINLINE void *joinee_main(void *arg)
{
    (void)arg;
    /* Named by itself (a prctl), so that main does not write its comm file. */
    pthread_setname_np(pthread_self(), "joinee");
    sleep_ms(30);
    return NULL;
}

static pthread_t spawn(const char *name, void *(*body)(void *))
{
    pthread_t t;
    int err = pthread_create(&t, NULL, body, NULL);
    if (err != 0) {
        fprintf(stderr, "pthread_create %s: error %d\n", name, err);
        exit(1);
    }
    err = pthread_setname_np(t, name);
    if (err != 0) {
        fprintf(stderr, "pthread_setname_np %s: error %d\n", name, err);
        exit(1);
    }
    return t;
}

int main(void)
{
    if (pipe(pipe_fds) != 0)
        die("pipe");
    int idle[2];
    if (pipe(idle) != 0)
        die("pipe");
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = idle[0]}};
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, idle[0], &ev) != 0)
        die("epoll_ctl");

    spawn("sleeper", sleeper_main);
    spawn("pipe_reader", pipe_reader_main);
    spawn("pipe_writer", pipe_writer_main);
    spawn("cond_waiter", cond_waiter_main);
    spawn("cond_signaller", cond_signaller_main);
    spawn("mutex_waiter", mutex_waiter_main);
    spawn("mutex_holder", mutex_holder_main);
    spawn("epoller", epoller_main);

    printf("%d\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        pthread_t joinee;
        int err = pthread_create(&joinee, NULL, joinee_main, NULL);
        if (err != 0) {
            fprintf(stderr, "pthread_create joinee: error %d\n", err);
            exit(1);
        }
        level1_join(joinee);
    }
    return 0;
}
