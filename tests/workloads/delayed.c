/*
 * Blocks that Linux 6.12's fair scheduler dequeues late
 * (tests/it/chains.rs): on CPU 0, "wl-spin" spins and "wl-burst" spins
 * 3 ms then sleeps 1 ms, over and over. Running beside the spinner,
 * the burst thread has used more than its share when it sleeps, so the
 * scheduler leaves it on its run queue (a delayed dequeue) until its
 * timer wakes it: a wake-up of a thread still queued that ends a block.
 *
 *   delayed SECONDS
 *
 * Prints "ready" once both threads run, exits after SECONDS.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t started;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_cpu_0(const char *name)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(0, &set);
	sched_setaffinity(0, sizeof(set), &set);
	prctl(PR_SET_NAME, name);
	pthread_barrier_wait(&started);
}

static void *spin(void *arg)
{
	on_cpu_0("wl-spin");
	for (;;)
		;
	return arg;
}

static __attribute__((noinline)) void burst_sleep(void)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 1000 * 1000 };

	nanosleep(&ts, NULL);
}

static void *burst(void *arg)
{
	on_cpu_0("wl-burst");
	for (;;) {
		double until = now() + 0.003;

		while (now() < until)
			;
		burst_sleep();
	}
	return arg;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 10;
	pthread_t t;

	pthread_barrier_init(&started, NULL, 3);
	if (pthread_create(&t, NULL, spin, NULL) || pthread_create(&t, NULL, burst, NULL))
		return 1;
	pthread_barrier_wait(&started);
	printf("ready\n");
	fflush(stdout);
	sleep(seconds);
	return 0;
}
