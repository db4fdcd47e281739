/*
 * A chain of waits with known lengths (tests/it/timeline.rs): "wl-producer"
 * sleeps 20 ms, then writes a byte to a pipe, over and over; "wl-worker"
 * waits for each byte in read(), then wakes the clients through a
 * condition variable; the clients ("wl-client0".. "wl-client2") wait on it.
 * Each of the worker's blocks is ended by the producer's write, each of the
 * clients' by the worker's broadcast: the clients' time is the producer's
 * sleep, through the worker.
 *
 *   chain SECONDS [CLIENTS]
 *
 * CLIENTS: how many clients (3 unless given, at most 200).
 * Prints "ready" once every thread runs, exits after SECONDS.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define CLIENTS 3
#define MOST_CLIENTS 200

static int pipefd[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned long generation;
static pthread_barrier_t started;

static __attribute__((noinline)) void producer_sleep(void)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

static void *producer(void *arg)
{
	char c = 'x';

	(void)arg;
	prctl(PR_SET_NAME, "wl-producer");
	pthread_barrier_wait(&started);
	for (;;) {
		producer_sleep();
		if (write(pipefd[1], &c, 1) != 1)
			exit(1);
	}
	return NULL;
}

static __attribute__((noinline)) int worker_read(char *c)
{
	return read(pipefd[0], c, 1);
}

static void *worker(void *arg)
{
	char c;

	(void)arg;
	prctl(PR_SET_NAME, "wl-worker");
	pthread_barrier_wait(&started);
	while (worker_read(&c) == 1) {
		pthread_mutex_lock(&lock);
		generation++;
		pthread_cond_broadcast(&changed);
		pthread_mutex_unlock(&lock);
	}
	exit(1);
}

static __attribute__((noinline)) void client_wait(unsigned long seen)
{
	while (generation == seen)
		pthread_cond_wait(&changed, &lock);
}

static void *client(void *arg)
{
	char name[16];

	snprintf(name, sizeof(name), "wl-client%ld", (long)arg);
	prctl(PR_SET_NAME, name);
	pthread_barrier_wait(&started);
	pthread_mutex_lock(&lock);
	for (;;)
		client_wait(generation);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	long i, clients = argc > 2 ? atol(argv[2]) : CLIENTS;

	if (argc < 2 || clients < 1 || clients > MOST_CLIENTS || pipe(pipefd))
		return 1;
	alarm(atoi(argv[1]));
	pthread_barrier_init(&started, NULL, clients + 3);
	pthread_create(&t, NULL, producer, NULL);
	pthread_create(&t, NULL, worker, NULL);
	for (i = 0; i < clients; i++)
		pthread_create(&t, NULL, client, (void *)i);
	pthread_barrier_wait(&started);
	printf("ready\n");
	fflush(stdout);
	pause();
	return 0;
}
