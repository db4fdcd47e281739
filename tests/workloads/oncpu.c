/*
 * oncpu: threads whose running and waiting are known, for the --on-cpu
 * test (tests/it/oncpu.rs).
 *
 *   thread     does
 *   spinner    runs all the time: 1 ms in spin_one, 3 ms in spin_three,
 *              by the thread's own CPU clock (so 1:3 even when preempted)
 *   duty       3 ms in spin_duty, then a 7 ms sleep: ~30% on the CPU
 *   blocked    reads a pipe nobody writes: off the CPU throughout
 *   main       pause()
 *
 * With the argument `bursts`, two threads instead (oc-burst1, oc-burst2)
 * that each sleep 1 ms and then run 45 ms, over and over.
 *
 * The spin functions are noinline and end with a volatile write, so each is
 * a frame of its own. Prints its pid on the first line of stdout, then a
 * line per thread ("tid NAME TID"), and runs until killed.
 *
 * Build: cc -O2 -g -pthread -fno-omit-frame-pointer oncpu.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

static long long cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Runs for `ns` of this thread's CPU time. */
static inline void spin_for(long long ns)
{
    long long end = cpu_ns() + ns;
    while (cpu_ns() < end) {
        for (int i = 0; i < 200; i++)
            sink++;
    }
}

NOINLINE void spin_one(void)
{
    spin_for(1000000);
    sink++;
}

NOINLINE void spin_three(void)
{
    spin_for(3000000);
    sink++;
}

NOINLINE void spin_duty(void)
{
    spin_for(3000000);
    sink++;
}

static void announce(const char *name)
{
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&print_lock);
    printf("tid %s %ld\n", name, (long)syscall(SYS_gettid));
    fflush(stdout);
    pthread_mutex_unlock(&print_lock);
}

static void *spinner(void *arg)
{
    announce("oc-spinner");
    for (;;) {
        spin_one();
        spin_three();
    }
    return arg;
}

static void *duty(void *arg)
{
    struct timespec nap = {0, 7000000};
    announce("oc-duty");
    for (;;) {
        spin_duty();
        nanosleep(&nap, NULL);
    }
    return arg;
}

static void *blocked(void *arg)
{
    int fds[2];
    char c;
    announce("oc-blocked");
    if (pipe(fds) != 0)
        exit(1);
    for (;;) {
        if (read(fds[0], &c, 1) < 0)
            exit(1);
    }
    return arg;
}

/* `bursts`: 1 ms asleep, then 45 ms of CPU, over and over: on a CPU at
 * most interval ends, each time since a switch-in. */
NOINLINE void spin_burst(void)
{
    spin_for(45000000);
    sink++;
}

static void *burst(void *arg)
{
    struct timespec nap = {0, 1000000};
    announce(arg);
    for (;;) {
        nanosleep(&nap, NULL);
        spin_burst();
    }
    return arg;
}

int main(int argc, char **argv)
{
    pthread_t t;
    printf("%d\n", getpid());
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "bursts") == 0) {
        pthread_create(&t, NULL, burst, "oc-burst1");
        pthread_create(&t, NULL, burst, "oc-burst2");
        for (;;)
            pause();
    }
    pthread_create(&t, NULL, spinner, NULL);
    pthread_create(&t, NULL, duty, NULL);
    pthread_create(&t, NULL, blocked, NULL);
    for (;;)
        pause();
}
