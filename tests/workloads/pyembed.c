/*
 * A program that has CPython mapped but starts its interpreter late, as
 * programs embedding it do (perf, gdb): it loads libpython (argv[1]) at
 * once, says "ready", blocks in nanosleep (10 ms at a time) with no
 * interpreter until file argv[2] exists, then starts one and runs
 * `embedded_wait` (10 ms sleeps) for argv[3] ms, and exits.
 *
 *     pyembed LIBPYTHON GO_FILE PYTHON_MS
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Kept out of line: the stack of the wait before the interpreter starts. */
__attribute__((noinline)) static void native_wait(const char *go)
{
	while (access(go, F_OK))
		sleep_ms(10);
}

int main(int argc, char **argv)
{
	void (*initialize)(void);
	int (*run)(const char *);
	char code[512];
	void *lib;

	if (argc != 4) {
		fprintf(stderr, "usage: pyembed LIBPYTHON GO_FILE PYTHON_MS\n");
		return 2;
	}
	lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		fprintf(stderr, "pyembed: %s\n", dlerror());
		return 1;
	}
	initialize = (void (*)(void))dlsym(lib, "Py_Initialize");
	run = (int (*)(const char *))dlsym(lib, "PyRun_SimpleString");
	if (!initialize || !run) {
		fprintf(stderr, "pyembed: %s\n", dlerror());
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	native_wait(argv[2]);
	initialize();
	snprintf(code, sizeof(code),
		 "import time\n"
		 "def embedded_wait(ms):\n"
		 "    end = time.monotonic() + ms / 1000\n"
		 "    while time.monotonic() < end:\n"
		 "        time.sleep(0.01)\n"
		 "embedded_wait(%ld)\n",
		 atol(argv[3]));
	return run(code) ? 1 : 0;
}
