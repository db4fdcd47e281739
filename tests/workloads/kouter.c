/*
 * Two threads passing a byte back and forth through two pipes
 * (tests/it/kstacks.rs).  The thread "wl-poll" waits for it by poll() and
 * by ppoll() in turn, then reads it: each wait blocks under the same six
 * inner kernel frames (do_sys_poll, poll_schedule_timeout, down to
 * __schedule), reached from two system calls, so its two kernel stacks
 * differ only in their outer frames.  A kernel stack proved the same as
 * one of the thread's last walks without looking at its outer frames would
 * be taken for the other.  "wl-echo" sends the byte back.
 *
 *   kouter SECONDS
 *
 * Prints "ready" once both threads run, exits after SECONDS.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

static int there[2], back[2];

static void *echo(void *arg)
{
	char c;

	(void)arg;
	prctl(PR_SET_NAME, "wl-echo");
	while (read(there[0], &c, 1) == 1)
		if (write(back[1], &c, 1) != 1)
			break;
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	unsigned long i;
	char c = 'x';

	if (argc < 2 || pipe(there) || pipe(back))
		return 1;
	alarm(atoi(argv[1]));
	pthread_create(&t, NULL, echo, NULL);
	prctl(PR_SET_NAME, "wl-poll");
	printf("ready\n");
	fflush(stdout);
	for (i = 0;; i++) {
		struct pollfd p = { .fd = back[0], .events = POLLIN };

		if (write(there[1], &c, 1) != 1)
			return 1;
		if ((i & 1 ? ppoll(&p, 1, NULL, NULL) : poll(&p, 1, -1)) != 1)
			return 1;
		if (read(back[0], &c, 1) != 1)
			return 1;
	}
}
