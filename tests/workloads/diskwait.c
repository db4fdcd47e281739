/*
 * Waiters on a mutex whose holder writes to disk (tests/it/chains.rs):
 * "wl-holder" takes the mutex, writes 4 KiB to a file with O_DIRECT and
 * fdatasync()s it, lets the mutex go, over and over; "wl-waiter0" and
 * "wl-waiter1" take the mutex and let it go at once. The waiters' time is
 * the holder's disk writes.
 *
 *   diskwait SECONDS DIR
 *
 * Prints "ready" once every thread runs, exits after SECONDS.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define WAITERS 2

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t started;
static int fd;
static void *block;

static __attribute__((noinline)) void write_through(void)
{
	if (pwrite(fd, block, 4096, 0) != 4096 || fdatasync(fd) != 0) {
		perror("diskwait: write");
		exit(1);
	}
}

static void *holder(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "wl-holder");
	pthread_barrier_wait(&started);
	for (;;) {
		pthread_mutex_lock(&lock);
		write_through();
		pthread_mutex_unlock(&lock);
	}
	return NULL;
}

static __attribute__((noinline)) void wait_turn(void)
{
	pthread_mutex_lock(&lock);
	pthread_mutex_unlock(&lock);
}

static void *waiter(void *arg)
{
	char name[16];

	snprintf(name, sizeof(name), "wl-waiter%ld", (long)arg);
	prctl(PR_SET_NAME, name);
	pthread_barrier_wait(&started);
	for (;;)
		wait_turn();
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 10;
	char path[4096];
	pthread_t t;

	snprintf(path, sizeof(path), "%s/diskwait.data", argc > 2 ? argv[2] : ".");
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
	if (fd < 0 || posix_memalign(&block, 4096, 4096)) {
		perror("diskwait: open");
		return 1;
	}
	memset(block, 'x', 4096);
	pthread_barrier_init(&started, NULL, WAITERS + 2);
	if (pthread_create(&t, NULL, holder, NULL))
		return 1;
	for (long i = 0; i < WAITERS; i++)
		if (pthread_create(&t, NULL, waiter, (void *)i))
			return 1;
	pthread_barrier_wait(&started);
	printf("ready\n");
	fflush(stdout);
	sleep(seconds);
	return 0;
}
