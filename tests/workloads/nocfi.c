/*
 * nocfi: a function of hand-written assembly without call-frame
 * information (no .cfi directives, so no FDE) in a program that has it
 * elsewhere, calling a C function that sleeps 20 ms, for SECONDS
 * (argument, default 600). A walk with the program's tables finds no rule
 * for the assembly's return address and goes on through frame pointers.
 * Built with frame pointers by the tests, so that the guess is right
 * here: the profiler cannot know, and says so.
 */
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void nocfi_sleep(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	asm volatile("");
}

void nocfi_asm(void);
__asm__(".text\n"
	".globl nocfi_asm\n"
	".type nocfi_asm, @function\n"
	"nocfi_asm:\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	call nocfi_sleep\n"
	"	pop %rbp\n"
	"	ret\n"
	".size nocfi_asm, .-nocfi_asm\n");

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 600;
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		nocfi_asm();
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9 < secs);
	return 0;
}
