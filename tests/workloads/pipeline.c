/*
 * A three-stage pipeline whose middle stage is slow (tests/it/chains.rs):
 * "wl-stage1" puts items into a queue of 4 as fast as it can, "wl-stage2"
 * takes each, works on it for 2 ms of CPU time and puts it into a second
 * queue of 4, which "wl-stage3" empties. The first stage waits for room in
 * its queue, the last for items in its: both for the second stage, which
 * waits for nobody. With "pingpong", two threads instead, "wl-ping" and
 * "wl-pong", hand a token back and forth through two pipes, each waiting
 * for the other in turn.
 *
 *   pipeline SECONDS [pingpong]
 *
 * Prints "ready" once every thread runs, exits after SECONDS.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define ROOM 4

struct queue {
	pthread_mutex_t lock;
	pthread_cond_t not_empty, not_full;
	int items;
};

static struct queue q1 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
			   PTHREAD_COND_INITIALIZER, 0 };
static struct queue q2 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
			   PTHREAD_COND_INITIALIZER, 0 };
static pthread_barrier_t started;
static int ping[2], pong[2];

static __attribute__((noinline)) void put(struct queue *q)
{
	pthread_mutex_lock(&q->lock);
	while (q->items == ROOM)
		pthread_cond_wait(&q->not_full, &q->lock);
	q->items++;
	pthread_cond_signal(&q->not_empty);
	pthread_mutex_unlock(&q->lock);
}

static __attribute__((noinline)) void take(struct queue *q)
{
	pthread_mutex_lock(&q->lock);
	while (q->items == 0)
		pthread_cond_wait(&q->not_empty, &q->lock);
	q->items--;
	pthread_cond_signal(&q->not_full);
	pthread_mutex_unlock(&q->lock);
}

static double cpu_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static __attribute__((noinline)) void work(void)
{
	double until = cpu_seconds() + 0.002;

	while (cpu_seconds() < until)
		;
}

static void *stage1(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "wl-stage1");
	pthread_barrier_wait(&started);
	for (;;)
		put(&q1);
	return NULL;
}

static void *stage2(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "wl-stage2");
	pthread_barrier_wait(&started);
	for (;;) {
		take(&q1);
		work();
		put(&q2);
	}
	return NULL;
}

static void *stage3(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "wl-stage3");
	pthread_barrier_wait(&started);
	for (;;)
		take(&q2);
	return NULL;
}

static __attribute__((noinline)) void hand_over(int in, int out)
{
	char c;

	if (read(in, &c, 1) != 1 || write(out, &c, 1) != 1)
		exit(1);
}

static void *pinger(void *arg)
{
	char c = 'x';

	(void)arg;
	prctl(PR_SET_NAME, "wl-ping");
	pthread_barrier_wait(&started);
	if (write(ping[1], &c, 1) != 1)
		exit(1);
	for (;;)
		hand_over(pong[0], ping[1]);
	return NULL;
}

static void *ponger(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "wl-pong");
	pthread_barrier_wait(&started);
	for (;;)
		hand_over(ping[0], pong[1]);
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 10;
	int pingpong = argc > 2 && strcmp(argv[2], "pingpong") == 0;
	void *(*threads[3])(void *) = { stage1, stage2, stage3 };
	int n = 3;
	pthread_t t;

	if (pingpong) {
		if (pipe(ping) || pipe(pong))
			return 1;
		threads[0] = pinger;
		threads[1] = ponger;
		n = 2;
	}
	pthread_barrier_init(&started, NULL, n + 1);
	for (int i = 0; i < n; i++)
		if (pthread_create(&t, NULL, threads[i], NULL))
			return 1;
	pthread_barrier_wait(&started);
	printf("ready\n");
	fflush(stdout);
	sleep(seconds);
	return 0;
}
