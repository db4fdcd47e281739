/*
 * Stacks made to fool a user stack cache (tests/it/stackcache.rs).
 *
 * Each thread blocks in turn under two stacks that a cache keyed on too
 * little would take for one: three blocks of 2 ms under its "a" stack,
 * then three of 8 ms under its "b" stack, again and again.  At every
 * block the registers at kernel entry are the same (the same nanosleep,
 * reached at the same stack depth: the two paths have frames of the same
 * size); only stack memory tells the stacks apart.  A correct profile
 * gives "a" a fifth of the thread's time and "b" the rest.
 *
 *   sites: one function, `block`, called from two sites (`site_a`,
 *          `site_b`): they differ in one return address, one frame down.
 *   deep:  eight frames of `deep` above `block`, the same in both stacks;
 *          they differ only at the bottom, in `root_a` / `root_b`.
 *   paths: the same depth reached through two call paths (`path_a1` ...
 *          `path_a3`, `path_b1` ... `path_b3`): every return address
 *          differs, the stack pointer does not.
 *
 * Prints its pid, then runs until killed.  Built by the test with
 * -fno-optimize-sibling-calls (no tail calls), with and without frame
 * pointers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

/* Where every thread blocks. */
NOINLINE int block(long ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ms * 1000000L };
	int r = nanosleep(&ts, NULL);

	__asm__ volatile("" ::: "memory");
	return r;
}

NOINLINE int site_a(void)
{
	int r = block(2);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

NOINLINE int site_b(void)
{
	int r = block(8);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

NOINLINE int deep(int n, long ms)
{
	int r = n > 0 ? deep(n - 1, ms) : block(ms);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

NOINLINE int root_a(void)
{
	int r = deep(8, 2);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

NOINLINE int root_b(void)
{
	int r = deep(8, 8);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

#define LINK(name, next, ...)                          \
	NOINLINE int name(void)                        \
	{                                              \
		int r = next(__VA_ARGS__);             \
		__asm__ volatile("" ::: "memory");     \
		return r + 1;                          \
	}

LINK(path_a3, block, 2)
LINK(path_a2, path_a3)
LINK(path_a1, path_a2)
LINK(path_b3, block, 8)
LINK(path_b2, path_b3)
LINK(path_b1, path_b2)

struct pair {
	const char *name;
	int (*a)(void);
	int (*b)(void);
};

/* Keeps the calls' results used. */
static volatile int sink;

static void *run(void *arg)
{
	const struct pair *p = arg;
	int i;

	prctl(PR_SET_NAME, p->name);
	/* Sleeps of the length asked, not up to 50 us more. */
	prctl(PR_SET_TIMERSLACK, 1UL);
	/* One call site for both, so that below them the stacks are the
	 * same too. */
	for (i = 0;; i = (i + 1) % 6)
		sink += (i < 3 ? p->a : p->b)();
	return NULL;
}

int main(void)
{
	static const struct pair pairs[] = {
		{ "sites", site_a, site_b },
		{ "deep", root_a, root_b },
		{ "paths", path_a1, path_b1 },
	};
	pthread_t t[3];
	int i;

	for (i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, run, (void *)&pairs[i]);
	printf("%d\n", getpid());
	fflush(stdout);
	pthread_join(t[0], NULL);
	return 0;
}
