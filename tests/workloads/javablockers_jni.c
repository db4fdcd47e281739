// The native method of JavaBlockers.java: blocks in a read of a pipe that
// nobody writes, below a native function of its own.
#include <jni.h>
#include <unistd.h>

__attribute__((noinline)) static void jni_block_in_read(void)
{
	int fds[2];
	char c;

	if (pipe(fds) == 0)
		while (read(fds[0], &c, 1) < 0)
			;
	for (;;)
		pause();
}

JNIEXPORT void JNICALL Java_JavaBlockers_nativeBlock(JNIEnv *env, jclass cls)
{
	(void)env;
	(void)cls;
	jni_block_in_read();
}
