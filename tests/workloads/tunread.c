/*
 * Threads that wait in the tun driver's read (a module in most kernels):
 * "wl-tun-stuck" for good, "wl-tun-read" again and again, woken every few
 * milliseconds by a signal from "wl-tun-kick".  Prints "ready" once all
 * three run; exits after the number of seconds given (default 60).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static int tun;
static pthread_t reader;

static void on_kick(int sig)
{
	(void)sig;
}

static void *stuck(void *arg)
{
	char buf[2048];

	(void)arg;
	pthread_setname_np(pthread_self(), "wl-tun-stuck");
	for (;;)
		if (read(tun, buf, sizeof(buf)) < 0 && errno != EINTR)
			return NULL;
}

static void *kick(void *arg)
{
	struct timespec ms = { 0, 3 * 1000 * 1000 };

	(void)arg;
	pthread_setname_np(pthread_self(), "wl-tun-kick");
	for (;;) {
		nanosleep(&ms, NULL);
		pthread_kill(reader, SIGUSR1);
	}
	return NULL;
}

static void *again(void *arg)
{
	char buf[2048];

	(void)arg;
	pthread_setname_np(pthread_self(), "wl-tun-read");
	for (;;)
		if (read(tun, buf, sizeof(buf)) < 0 && errno != EINTR)
			return NULL;
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	struct ifreq ifr;
	pthread_t t;
	int seconds = argc > 1 ? atoi(argv[1]) : 60;

	tun = open("/dev/net/tun", O_RDWR);
	if (tun < 0) {
		perror("tunread: /dev/net/tun");
		return 1;
	}
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
	if (ioctl(tun, TUNSETIFF, &ifr) < 0) {
		perror("tunread: TUNSETIFF");
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_kick;
	sigaction(SIGUSR1, &sa, NULL);
	if (pthread_create(&t, NULL, stuck, NULL) || pthread_create(&reader, NULL, again, NULL) ||
	    pthread_create(&t, NULL, kick, NULL)) {
		fprintf(stderr, "tunread: pthread_create failed\n");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	sleep(seconds);
	return 0;
}
