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
 *   ends:  `tip` calls `block` with its own return address replaced,
 *          while it blocks, by 0 (the end of the stack: "a") or by an
 *          address in `outer_b` (whose call-frame information says it is
 *          the outermost frame: "b").  The two walks read the same slots,
 *          and differ only in the last one.
 *
 * And a thread `turns` blocks in four places in turn (1 ms under one,
 * two, three and four frames of `turn`): a thread the cache must keep
 * four walks of, each proved at its next turn.  A thread `widths` blocks
 * in two places in turn, under `narrow` and `wide`: walks of as many
 * frames and slots, whose slots are at other places (wide's frame is
 * larger), each proved at its next turn.
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

/*
 * long tip(long ms, unsigned long ra): block(ms), with the slot of its own
 * return address holding `ra` meanwhile (the real one kept in rbx).  Its
 * call-frame information covers no register the walk restores, so that
 * the slot is the last one a walk through it reads.  `outer_b_ret` is a
 * return address in `outer_b`, the outermost frame by its call-frame
 * information (the return address undefined).
 */
long tip(long ms, unsigned long ra);
void outer_b_ret(void);
__asm__(".text\n"
	".globl tip\n"
	".type tip, @function\n"
	"tip:\n"
	".cfi_startproc\n"
	"	push %rbx\n"
	".cfi_adjust_cfa_offset 8\n"
	".cfi_rel_offset %rbx, 0\n"
	"	mov 8(%rsp), %rbx\n"
	"	mov %rsi, 8(%rsp)\n"
	"	call block@PLT\n"
	"	mov %rbx, 8(%rsp)\n"
	"	pop %rbx\n"
	".cfi_adjust_cfa_offset -8\n"
	".cfi_restore %rbx\n"
	"	ret\n"
	".cfi_endproc\n"
	".size tip, .-tip\n"
	".globl outer_b\n"
	".type outer_b, @function\n"
	"outer_b:\n"
	".cfi_startproc\n"
	".cfi_undefined %rip\n"
	"	nop\n"
	"	nop\n"
	".globl outer_b_ret\n"
	"outer_b_ret:\n"
	"	ud2\n"
	".cfi_endproc\n"
	".size outer_b, .-outer_b\n");

NOINLINE int ends_a(void)
{
	int r = (int)tip(2, 0);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

NOINLINE int ends_b(void)
{
	int r = (int)tip(8, (unsigned long)outer_b_ret);

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

NOINLINE int turn(int n)
{
	int r = n > 0 ? turn(n - 1) : block(1);

	__asm__ volatile("" ::: "memory");
	return r + 1;
}

static void *turns(void *arg)
{
	int i;

	(void)arg;
	prctl(PR_SET_NAME, "turns");
	prctl(PR_SET_TIMERSLACK, 1UL);
	for (i = 0;; i = (i + 1) % 4)
		sink += turn(i);
	return NULL;
}

/* A function with a frame of `size` bytes more, calling block(1). */
#define ROOMY(name, size)                                      \
	NOINLINE int name(void)                                \
	{                                                      \
		char room[size];                               \
		int r;                                         \
                                                               \
		/* Kept on the stack, its whole size. */       \
		__asm__ volatile("" : : "r"(room) : "memory"); \
		r = block(1);                                  \
		__asm__ volatile("" : : "r"(room) : "memory"); \
		return r;                                      \
	}

ROOMY(narrow, 16)
ROOMY(wide, 512)

static void *widths(void *arg)
{
	int i;

	(void)arg;
	prctl(PR_SET_NAME, "widths");
	prctl(PR_SET_TIMERSLACK, 1UL);
	for (i = 0;; i ^= 1)
		sink += i ? wide() : narrow();
	return NULL;
}

int main(void)
{
	static const struct pair pairs[] = {
		{ "sites", site_a, site_b },
		{ "deep", root_a, root_b },
		{ "paths", path_a1, path_b1 },
		{ "ends", ends_a, ends_b },
	};
	pthread_t t[6];
	int i;

	for (i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, run, (void *)&pairs[i]);
	pthread_create(&t[4], NULL, turns, NULL);
	pthread_create(&t[5], NULL, widths, NULL);
	printf("%d\n", getpid());
	fflush(stdout);
	pthread_join(t[0], NULL);
	return 0;
}
