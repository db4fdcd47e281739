/*
 * forker: a process that forks a child every 20 ms for SECONDS (argument);
 * each child blocks at once, sleeping 20 ms under two functions of its
 * own, and exits. With the argument "exec" each child first execs this
 * program again ("forker child"), so that it is a new program image, not
 * a copy of its parent's. Built without frame pointers by the tests.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

__attribute__((noinline)) void forker_child_sleep(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	asm volatile("");
}

__attribute__((noinline)) void forker_child(void)
{
	forker_child_sleep();
	asm volatile("");
}

int main(int argc, char **argv)
{
	struct timespec gap = { 0, 20 * 1000 * 1000 }, t0, now;
	double secs;
	int exec = 0;

	if (argc > 1 && !strcmp(argv[1], "child")) {
		forker_child();
		return 0;
	}
	secs = argc > 1 ? atof(argv[1]) : 5;
	exec = argc > 2 && !strcmp(argv[2], "exec");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		pid_t p;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9 > secs)
			break;
		p = fork();
		if (p == 0) {
			if (exec)
				execl("/proc/self/exe", "forker", "child", (char *)NULL);
			else
				forker_child();
			_exit(0);
		}
		nanosleep(&gap, NULL);
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
	while (wait(NULL) > 0)
		;
	return 0;
}
