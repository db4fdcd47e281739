/*
 * signals: a workload whose threads block inside signal handlers, for the
 * test of unwinding through signal frames (tests/it/signals.rs), which
 * compares the profiler's user stacks with gdb's.
 *
 * Each thread spins in spinN_<name>, three layers of its own functions,
 * until main sends it its signal (pthread_kill): the handler then runs on
 * top of the interrupted spin loop, and blocks in it under two more layers
 * of its own functions, for good.
 *
 *   thread        signal       handler's stack     blocks in
 *   sig_sleeper   SIGUSR1      the thread's        nanosleep, every 20 ms
 *   alt_sleeper   SIGUSR2      sigaltstack         nanosleep, every 20 ms
 *   sig_reader    SIGRTMIN     the thread's        read() of a pipe, forever
 *   alt_reader    SIGRTMIN+1   sigaltstack         read() of a pipe, forever
 *   main thread   SIGUSR1      its own             nanosleep, every 20 ms
 *   entry_fault   SIGSEGV      the thread's        nanosleep, every 20 ms
 *   rule_fault    SIGSEGV      the thread's        nanosleep, every 20 ms
 *
 * The two faulting threads are interrupted where a return address never
 * points: entry_fault at the first instruction of a function
 * (fault_at_entry), rule_fault at the first instruction after a push
 * (fault_after_push), where the unwind rule changes. Their interrupted pc
 * must be looked up as it is: looked up one byte earlier (as a return
 * address is), entry_fault's lands in the function laid out before
 * (behind_fault_entry, whose last byte has another rule) and rule_fault's
 * in the push, and either caller is then wrong.
 *
 * The readers block once, before the profiler starts: only its start
 * iterator sees them.  The main thread raises its signal itself (raise()),
 * from within main_level2.
 *
 * The functions are noinline and do a volatile write after each call, so
 * that none is inlined or turned into a tail call: every one is a frame.
 *
 * With the argument "wakers", the handlers wake other threads instead
 * (tests/it/signals.rs, --wakers): each writes a byte to a pipe every
 * 20 ms, forever, under three layers of its own functions, and a thread
 * of its own blocks reading that pipe:
 *
 *   waker         signal       handler's stack     wakes
 *   sig_waker     SIGUSR1      the thread's        sig_wakee
 *   alt_waker     SIGUSR2      sigaltstack         alt_wakee
 *   main thread   SIGRTMIN     its own             main_wakee
 *
 * The wakers are interrupted in the same spin loop as above; the main
 * thread raises its signal itself, from within main_level2.
 *
 * Prints its pid on the first line of stdout once every thread is in its
 * handler, then runs until killed.
 *
 * Build: cc -O2 -g -pthread -fomit-frame-pointer signals.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
/* Threads in their spin loops, and in their handlers. */
static volatile int spinning, handling;
/* Never written: the readers block on it for good. */
static int never[2];

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* The handlers' own functions. */

NOINLINE void handler_sleep2(void)
{
    struct timespec ts = {0, 20 * 1000000L};
    for (;;) {
        nanosleep(&ts, NULL);
        sink++;
    }
}

NOINLINE void handler_sleep1(void)
{
    handler_sleep2();
    sink++;
}

NOINLINE void handler_read2(void)
{
    char c;
    for (;;) {
        if (read(never[0], &c, 1) >= 0)
            sink++;
    }
}

NOINLINE void handler_read1(void)
{
    handler_read2();
    sink++;
}

NOINLINE void on_sleep_signal(int sig)
{
    (void)sig;
    __atomic_add_fetch(&handling, 1, __ATOMIC_SEQ_CST);
    handler_sleep1();
    sink++;
}

NOINLINE void on_read_signal(int sig)
{
    (void)sig;
    __atomic_add_fetch(&handling, 1, __ATOMIC_SEQ_CST);
    handler_read1();
    sink++;
}

/* The threads' own functions: a spin loop three layers down. */

NOINLINE void spin3(void)
{
    __atomic_add_fetch(&spinning, 1, __ATOMIC_SEQ_CST);
    for (;;)
        sink++;
}

NOINLINE void spin2(void)
{
    spin3();
    sink++;
}

NOINLINE void spin1(void)
{
    spin2();
    sink++;
}

/* With `alt`, a stack of its own for the handlers (SA_ONSTACK). */
static void setup(const char *name, int alt)
{
    pthread_setname_np(pthread_self(), name);
    if (alt) {
        stack_t ss = {.ss_size = 64 * 1024};
        ss.ss_sp = malloc(ss.ss_size);
        if (!ss.ss_sp || sigaltstack(&ss, NULL))
            die("sigaltstack");
    }
}

NOINLINE void *sig_sleeper_main(void *arg)
{
    (void)arg;
    setup("sig_sleeper", 0);
    spin1();
    return NULL;
}

NOINLINE void *alt_sleeper_main(void *arg)
{
    (void)arg;
    setup("alt_sleeper", 1);
    spin1();
    return NULL;
}

NOINLINE void *sig_reader_main(void *arg)
{
    (void)arg;
    setup("sig_reader", 0);
    spin1();
    return NULL;
}

NOINLINE void *alt_reader_main(void *arg)
{
    (void)arg;
    setup("alt_reader", 1);
    spin1();
    return NULL;
}

/*
 * The faulting functions, in assembly so that their layout and unwind
 * rules are known: each loads from address 0. behind_fault_entry is never
 * called; it is laid out right before fault_at_entry, and its last byte's
 * rule (the CFA 16 bytes above the stack pointer) is not fault_at_entry's
 * first (8 bytes above).
 */
__asm__(".text\n"
        ".globl behind_fault_entry\n"
        ".type behind_fault_entry, @function\n"
        "behind_fault_entry:\n"
        ".cfi_startproc\n"
        "\tpushq %rbx\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_offset %rbx, -16\n"
        "\tud2\n"
        ".cfi_endproc\n"
        ".size behind_fault_entry, .-behind_fault_entry\n"
        ".globl fault_at_entry\n"
        ".type fault_at_entry, @function\n"
        "fault_at_entry:\n"
        ".cfi_startproc\n"
        "\tmovq 0, %rax\n"
        "\tret\n"
        ".cfi_endproc\n"
        ".size fault_at_entry, .-fault_at_entry\n"
        ".globl fault_after_push\n"
        ".type fault_after_push, @function\n"
        "fault_after_push:\n"
        ".cfi_startproc\n"
        "\tpushq %rbx\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_offset %rbx, -16\n"
        "\tmovq 0, %rax\n"
        "\tpopq %rbx\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore %rbx\n"
        "\tret\n"
        ".cfi_endproc\n"
        ".size fault_after_push, .-fault_after_push\n");

void fault_at_entry(void);
void fault_after_push(void);

NOINLINE void on_fault_signal(int sig)
{
    (void)sig;
    __atomic_add_fetch(&handling, 1, __ATOMIC_SEQ_CST);
    handler_sleep1();
    sink++;
}

NOINLINE void entry_fault2(void)
{
    fault_at_entry();
    sink++;
}

NOINLINE void entry_fault1(void)
{
    entry_fault2();
    sink++;
}

NOINLINE void rule_fault2(void)
{
    fault_after_push();
    sink++;
}

NOINLINE void rule_fault1(void)
{
    rule_fault2();
    sink++;
}

NOINLINE void *entry_fault_main(void *arg)
{
    (void)arg;
    setup("entry_fault", 0);
    entry_fault1();
    return NULL;
}

NOINLINE void *rule_fault_main(void *arg)
{
    (void)arg;
    setup("rule_fault", 0);
    rule_fault1();
    return NULL;
}

/* The signal the main thread raises. */
static int main_signal = SIGUSR1;

NOINLINE void main_level2(void)
{
    raise(main_signal);
    sink++;
}

NOINLINE void main_level1(void)
{
    main_level2();
    sink++;
}

static void handle(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa = {.sa_handler = fn, .sa_flags = flags};
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL))
        die("sigaction");
}

static void wait_for(volatile int *counter, int n)
{
    struct timespec ts = {0, 1000000L};
    while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) < n)
        nanosleep(&ts, NULL);
}

/* "wakers": the pipe each signal's handler writes, by signal number. */
static int wake_fd_of[_NSIG];

NOINLINE void wake_write(int fd)
{
    char c = 1;
    if (write(fd, &c, 1) == 1)
        sink++;
}

NOINLINE void wake_loop2(int fd)
{
    struct timespec ts = {0, 20 * 1000000L};
    for (;;) {
        nanosleep(&ts, NULL);
        wake_write(fd);
        sink++;
    }
}

NOINLINE void wake_loop1(int fd)
{
    wake_loop2(fd);
    sink++;
}

NOINLINE void on_wake_signal(int sig)
{
    __atomic_add_fetch(&handling, 1, __ATOMIC_SEQ_CST);
    wake_loop1(wake_fd_of[sig]);
    sink++;
}

NOINLINE void wakee_read2(int fd)
{
    char c;
    for (;;) {
        if (read(fd, &c, 1) >= 0)
            sink++;
    }
}

NOINLINE void wakee_read1(int fd)
{
    wakee_read2(fd);
    sink++;
}

struct wakee {
    const char *name;
    int fd;
};

NOINLINE void *wakee_main(void *arg)
{
    struct wakee *w = arg;
    setup(w->name, 0);
    wakee_read1(w->fd);
    return NULL;
}

NOINLINE void *sig_waker_main(void *arg)
{
    (void)arg;
    setup("sig_waker", 0);
    spin1();
    return NULL;
}

NOINLINE void *alt_waker_main(void *arg)
{
    (void)arg;
    setup("alt_waker", 1);
    spin1();
    return NULL;
}

NOINLINE int wakers_main(void)
{
    static struct wakee wakees[] = {{"sig_wakee", 0}, {"alt_wakee", 0}, {"main_wakee", 0}};
    static void *(*const mains[])(void *) = {sig_waker_main, alt_waker_main};
    const int sigs[] = {SIGUSR1, SIGUSR2, SIGRTMIN};
    pthread_t t;
    int i, fds[2];

    for (i = 0; i < 3; i++) {
        if (pipe(fds))
            die("pipe");
        wakees[i].fd = fds[0];
        wake_fd_of[sigs[i]] = fds[1];
        if (pthread_create(&t, NULL, wakee_main, &wakees[i]))
            die("pthread_create");
    }
    handle(SIGUSR1, on_wake_signal, 0);
    handle(SIGUSR2, on_wake_signal, SA_ONSTACK);
    handle(SIGRTMIN, on_wake_signal, 0);
    for (i = 0; i < 2; i++) {
        if (pthread_create(&t, NULL, mains[i], NULL))
            die("pthread_create");
        wait_for(&spinning, i + 1);
        if (pthread_kill(t, sigs[i]))
            die("pthread_kill");
        wait_for(&handling, i + 1);
    }
    printf("%d\n", getpid());
    fflush(stdout);
    main_signal = SIGRTMIN;
    main_level1();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "wakers")) {
        wakers_main();
        sink++;
        return 0;
    }

    static void *(*const mains[])(void *) = {sig_sleeper_main, alt_sleeper_main,
                                             sig_reader_main, alt_reader_main};
    const int sigs[] = {SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMIN + 1};
    pthread_t t[4];
    int i;

    if (pipe(never))
        die("pipe");
    handle(SIGUSR1, on_sleep_signal, 0);
    handle(SIGUSR2, on_sleep_signal, SA_ONSTACK);
    handle(SIGRTMIN, on_read_signal, 0);
    handle(SIGRTMIN + 1, on_read_signal, SA_ONSTACK);
    for (i = 0; i < 4; i++) {
        if (pthread_create(&t[i], NULL, mains[i], NULL))
            die("pthread_create");
        wait_for(&spinning, i + 1);
        if (pthread_kill(t[i], sigs[i]))
            die("pthread_kill");
        wait_for(&handling, i + 1);
    }
    handle(SIGSEGV, on_fault_signal, 0);
    if (pthread_create(&t[0], NULL, entry_fault_main, NULL))
        die("pthread_create");
    wait_for(&handling, 5);
    if (pthread_create(&t[0], NULL, rule_fault_main, NULL))
        die("pthread_create");
    wait_for(&handling, 6);
    printf("%d\n", getpid());
    fflush(stdout);
    main_level1();
    return 0;
}
