/*
 * forker: a process that forks a child every 20 ms for SECONDS (argument);
 * each child blocks at once, sleeping 20 ms (or CHILD_MS, the third
 * argument) under two functions of its own, and exits. With the second
 * argument "exec" each child first execs this program again ("NAME child
 * CHILD_MS", by its own path, so that the child's command is this
 * program's name), so that it is a new program image, not a copy of its
 * parent's.
 *
 * "forker reexec CHILD_MS": once a line is read from stdin, execs this
 * program again as a child that sleeps CHILD_MS: the same process, a new
 * image.
 *
 * "forker spawn FIFO": once a line is read from stdin, posix_spawn()s
 * /bin/true with the FIFO to open first, so that the child (which shares
 * its parent's memory until it execs) blocks opening it, and the parent
 * waits for it inside glibc's clone3 (a vfork), until a writer opens the
 * FIFO.
 *
 * "forker heavy MB ROUNDS": touches MB MiB of memory and execs itself
 * again ("forker heavy MB ROUNDS-1") from forker_exec, ROUNDS times, then
 * exits. Each exec frees the large address space it leaves inside the
 * execve call, where a thread is preempted on a busy CPU with its user
 * registers still the old image's.
 *
 * Built without frame pointers by the tests.
 */
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

static long child_ms = 20;

__attribute__((noinline)) void forker_child_sleep(void)
{
	struct timespec ts = { child_ms / 1000, child_ms % 1000 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	asm volatile("");
}

__attribute__((noinline)) void forker_child(void)
{
	forker_child_sleep();
	asm volatile("");
}

extern char **environ;

__attribute__((noinline)) void forker_exec(const char *self, char *const *args)
{
	execv(self, args);
	asm volatile("");
}

__attribute__((noinline)) int heavy(const char *self, const char *name, long mb, long rounds)
{
	char mbs[32], left[32];
	char *args[] = { (char *)name, "heavy", mbs, left, NULL };
	char *mem;

	if (rounds <= 0)
		return 0;
	mem = malloc(mb << 20);
	if (!mem)
		return 1;
	memset(mem, 1, mb << 20);
	/* Used, so that the compiler keeps the memory. */
	asm volatile("" : : "r"(mem) : "memory");
	snprintf(mbs, sizeof(mbs), "%ld", mb);
	snprintf(left, sizeof(left), "%ld", rounds - 1);
	forker_exec(self, args);
	perror("execv");
	return 1;
}

/* Returns once the child has opened the FIFO and exec'd. */
__attribute__((noinline)) int forker_spawn(const char *fifo, pid_t *pid)
{
	char *args[] = { "/bin/true", NULL };
	posix_spawn_file_actions_t fa;
	int err;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 3, fifo, O_RDONLY, 0);
	err = posix_spawn(pid, args[0], &fa, NULL, args, environ);
	asm volatile("");
	return err;
}

static int spawn_stalled(const char *fifo)
{
	char line[16];
	pid_t pid;
	int err;

	if (!fgets(line, sizeof(line), stdin))
		return 1;
	err = forker_spawn(fifo, &pid);
	if (err) {
		fprintf(stderr, "posix_spawn: %s\n", strerror(err));
		return 1;
	}
	waitpid(pid, NULL, 0);
	return 0;
}

int main(int argc, char **argv)
{
	struct timespec gap = { 0, 20 * 1000 * 1000 }, t0, now;
	char self[PATH_MAX], ms[32];
	ssize_t n;
	double secs;
	int exec = 0;

	if (argc > 2 && !strcmp(argv[1], "spawn"))
		return spawn_stalled(argv[2]);
	if (argc > 3 && !strcmp(argv[1], "heavy")) {
		n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n <= 0)
			return 1;
		self[n] = 0;
		return heavy(self, argv[0], atol(argv[2]), atol(argv[3]));
	}
	if (argc > 2 && !strcmp(argv[1], "reexec")) {
		char line[16];

		n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n <= 0 || !fgets(line, sizeof(line), stdin))
			return 1;
		self[n] = 0;
		execl(self, argv[0], "child", argv[2], (char *)NULL);
		perror("execl");
		return 1;
	}
	if (argc > 1 && !strcmp(argv[1], "child")) {
		if (argc > 2)
			child_ms = atol(argv[2]);
		forker_child();
		return 0;
	}
	secs = argc > 1 ? atof(argv[1]) : 5;
	exec = argc > 2 && !strcmp(argv[2], "exec");
	if (argc > 3)
		child_ms = atol(argv[3]);
	snprintf(ms, sizeof(ms), "%ld", child_ms);
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0) {
		perror("readlink /proc/self/exe");
		return 1;
	}
	self[n] = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		pid_t p;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9 > secs)
			break;
		p = fork();
		if (p == 0) {
			if (exec)
				execl(self, argv[0], "child", ms, (char *)NULL);
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
