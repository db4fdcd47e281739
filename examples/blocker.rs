//! `blocker`: a workload whose threads block in known, uniquely named ways.
//!
//! It exists so that an off-CPU profile of it can be checked, both by the
//! end-to-end tests of `offcputime` and by hand:
//!
//! ```text
//! cargo run --example blocker -- [--seconds N] [--child-ms M]
//! ```
//!
//! Every thread has its own name (which becomes its `comm`) and blocks in its
//! own `#[no_mangle]` function, which in turn calls a `#[no_mangle]`
//! `wl_block_*` function that makes the blocking libc call directly:
//!
//! | thread          | body                   | blocks in                                  |
//! |-----------------|------------------------|--------------------------------------------|
//! | `wl-nanosleep`  | `wl_nanosleep_thread`  | `wl_block_nanosleep` (10 ms nanosleep)     |
//! | `wl-shortsleep` | `wl_shortsleep_thread` | `wl_block_shortsleep` (1 ms nanosleep)     |
//! | `wl-pipe`       | `wl_pipe_thread`       | `wl_block_pipe_read` (1-byte pipe read)    |
//! | `wl-futex`      | `wl_futex_thread`      | `wl_block_futex_wait` (20 ms futex wait)   |
//! | `wl-spin`       | `wl_spin_thread`       | never blocks (busy loop, on-CPU only)      |
//! | `wl-reaper`     | `wl_reaper_thread`     | `wl_block_waitpid` (only with a child)     |
//! | main thread     | `wl_pipe_feeder`       | `wl_block_feeder_sleep` (20 ms nanosleep)  |
//!
//! Optional threads, for the tests that need them:
//!
//! | flag                | thread(s)              | does                                       |
//! |---------------------|------------------------|--------------------------------------------|
//! | `--killable`        | `wl-vfork`             | `wl_block_vfork`: a vfork-style clone whose child (`wl-vfork-child`) sleeps 100 ms; the parent waits in `TASK_KILLABLE` |
//! | `--pinned-spinners` | `wl-pin-a`, `wl-pin-b` | busy loops, both pinned to CPU 0: each is preempted for the other about half the time |
//! | `--io`              | `wl-io`                | `wl_block_io`: 4 KiB `O_DIRECT` reads of its own executable, one after the other: I/O waits (D, `in_iowait`) |
//! | `--tail`            | `wl-tail`              | 5 ms sleeps (`wl_block_tail_wait`) until SIGUSR1, then prints `tail <CLOCK_MONOTONIC ns> <its schedstat run + wait ns>` and waits 60 s in `poll` in `wl_block_tail` |
//! | `--brief MS`        | `wl-brief`             | started by the main thread on SIGUSR2; 1 ms sleeps (`wl_block_brief`) for MS ms, then prints `brief <tid> <first ns> <last ns> <cpu ns> <spawned ns>` (CLOCK_MONOTONIC at its first and last instruction, its CPU time, and when the main thread started creating it) and exits |
//!
//! `blocker jit exit|stay` is a JIT of one function: it writes its perf
//! map (`/tmp/perf-PID.map`, one line naming code it never runs), maps an
//! executable page holding a `nanosleep` system call, prints `ready PID`
//! and waits for a line on stdin; then it adds `wl_jit_last` (that page) to
//! its perf map, sleeps 300 ms in it, and exits (`exit`) or sleeps in
//! `wl_block_long_sleep` (`stay`). Nothing is mapped between the last line
//! and the sleep: only a reading of the map after it names the sleep.
//!
//! `blocker wakers` is another process, whose sleepers are woken by known
//! functions every 20 ms: `wl-cond-wait` (`wl_block_signalled`, a
//! condition variable) by `wake_by_signal` in `wl-signaller`; `wl-pipe-wait`
//! (`wl_block_written`, a pipe read) by `wake_by_write` in `wl-writer`;
//! `wl-futex-wait` (`wl_block_shared_futex`) by `wake_by_futex` in a child
//! process, `wl-futex-waker` (printed as `waker PID`); and `wl-timer-wait`
//! (`wl_block_timer`) by its timer alone.
//!
//! `blocker stuck` is another process altogether, whose threads are all
//! blocked for good from the start, until it is killed: `wl-stuck-cond` in
//! `wl_block_cond_wait` (a condition variable never signalled),
//! `wl-stuck-pipe` in `wl_block_stuck_read` (a pipe nobody writes),
//! `wl-stuck-sleep` in `wl_block_long_sleep` (a 1000 s nanosleep), and the
//! main thread, `wl-stuck-main`, in `wl_block_join` (pthread_join of the
//! first). It prints the same `pid`/`tid`/`ready` lines, then `asleep
//! <CLOCK_MONOTONIC ns>`: when `wl-stuck-sleep` began its sleep. With
//! `--vfork` (`blocker stuck --vfork`), `wl-stuck-vfork` waits too, in
//! `wl_block_stuck_vfork`, TASK_KILLABLE (D), for a vfork-style child
//! (`wl-vfork-child`) that sleeps 1000 s and is killed with it.
//!
//! The main thread feeds the pipe one byte every 20 ms. With `--child-ms M`
//! a child process (this executable re-run as `blocker child M`, comm
//! `wl-child`) sleeps M ms in `wl_child_sleep` (10 ms nanosleeps) and exits;
//! the `wl-reaper` thread waits for it.
//!
//! Once everything is started, stdout gets `pid <pid>`, one `tid <name> <tid>`
//! line per thread (kernel thread ids, `main` for the main thread), `child
//! <pid>` if a child was spawned, and finally `ready`. After `--seconds`
//! (default 30) the process exits with status 0. A child that is still
//! sleeping then (M longer than the run) is left to finish on its own.
//!
//! Build with frame pointers (`.cargo/config.toml` does this) so that
//! frame-pointer stack walking reaches these functions.

use std::hint::black_box;
use std::io::Write;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Set by the main thread when the run time is over; every loop checks it.
static STOP: AtomicBool = AtomicBool::new(false);

/// Futex word for `wl-futex`. It always stays 0, so FUTEX_WAIT with an
/// expected value of 0 always sleeps until its timeout.
static FUTEX_WORD: AtomicU32 = AtomicU32::new(0);

fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

fn timespec_ms(ms: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    }
}

/// `libc::nanosleep` for `ms` milliseconds (not resumed after a signal).
///
/// Always inlined into its `wl_block_*` callers so the blocking libc call is
/// made from the uniquely named function itself.
#[inline(always)]
fn nanosleep_ms(ms: u64) -> libc::c_int {
    let ts = timespec_ms(ms);
    // SAFETY: `ts` is a valid timespec; a null `rem` is allowed.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) }
}

// Each wl_block_* function passes the libc call's result through
// `black_box` afterwards, so the call is never in tail position and cannot
// be turned into a jump (which would drop the wl_block_* frame) in release
// builds.

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_nanosleep() -> libc::c_int {
    black_box(nanosleep_ms(10))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_shortsleep() -> libc::c_int {
    black_box(nanosleep_ms(1))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_pipe_read(fd: libc::c_int) -> libc::ssize_t {
    let mut byte = 0u8;
    // SAFETY: `byte` is a valid, writable 1-byte buffer for the whole call.
    let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
    black_box(n)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_futex_wait(word: &AtomicU32) -> libc::c_long {
    let timeout = timespec_ms(20);
    // SAFETY: FUTEX_WAIT reads the u32 at `word` (a live, aligned atomic) and
    // `timeout` (a valid relative timespec); uaddr2 and val3 are unused.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    black_box(r)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_feeder_sleep() -> libc::c_int {
    black_box(nanosleep_ms(20))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_nanosleep_thread() {
    while !stopped() {
        wl_block_nanosleep();
    }
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_shortsleep_thread() {
    while !stopped() {
        wl_block_shortsleep();
    }
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_pipe_thread(fd: libc::c_int) {
    while !stopped() {
        if wl_block_pipe_read(fd) <= 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                // EOF or a real error: don't spin on it.
                return;
            }
        }
    }
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_futex_thread() {
    while !stopped() {
        wl_block_futex_wait(&FUTEX_WORD);
    }
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_spin_thread() {
    let mut x: u64 = 1;
    while !stopped() {
        for i in 0..1_000_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    black_box(x);
}

/// Pins the calling thread to CPU 0.
fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it; sched_setaffinity reads `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `wl-pin-a`, `wl-pin-b`: spin on CPU 0, sharing it.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_pinned_spin_thread() {
    pin_to_cpu0();
    wl_spin_thread();
}

/// `wl_block_io`: one 4 KiB read at `offset` of `fd`, opened with
/// O_DIRECT: past the page cache, from the device, the thread waiting for
/// it in an I/O wait.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_io(fd: libc::c_int, buf: *mut u8, offset: i64) -> isize {
    // SAFETY: `buf` holds 4096 writable bytes.
    black_box(unsafe { libc::pread(fd, buf.cast(), 4096, offset) })
}

/// `wl-io`: direct reads of this executable's file, 4 KiB at a time, one
/// after the other, through the whole file and again.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_io_thread() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::env::current_exe().and_then(|p| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(p)
    });
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            eprintln!("blocker: opening this executable with O_DIRECT: {e}");
            return;
        }
    };
    let blocks = file.metadata().map_or(0, |m| m.len() / 4096).max(1);
    // O_DIRECT wants the buffer aligned (to the device's block size).
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: the layout has a non-zero size.
    let buf = unsafe { std::alloc::alloc(layout) };
    let mut i = 0;
    while !stopped() {
        if wl_block_io(file.as_raw_fd(), buf, (i % blocks * 4096) as i64) < 0 {
            eprintln!("blocker: direct read: {}", std::io::Error::last_os_error());
            return;
        }
        i += 1;
    }
}

/// The child of the vfork-style clone: names itself, sleeps 100 ms and
/// exits (returning from here makes glibc's clone call exit). Raw system
/// calls only: it runs on the parent's memory.
extern "C" fn vfork_child(_: *mut libc::c_void) -> libc::c_int {
    vfork_child_sleep(100);
    0
}

/// What a vfork-style child does: names itself `wl-vfork-child` and
/// sleeps `ms`, with raw system calls only.
#[inline(always)]
fn vfork_child_sleep(ms: u64) {
    let ts = timespec_ms(ms);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes; `ts` is a valid timespec and a null `rem` is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_NAME,
            c"wl-vfork-child".as_ptr(),
        );
        libc::syscall(
            libc::SYS_nanosleep,
            &ts,
            std::ptr::null_mut::<libc::timespec>(),
        );
    }
}

/// Clones `child` sharing this memory (CLONE_VM | CLONE_VFORK, as
/// posix_spawn does), on the stack `stack`..`stack + len`: the calling
/// thread waits, TASK_KILLABLE, until the child exits. Inlined: the
/// caller's frame is the one that blocks.
#[inline(always)]
fn clone_vfork(
    child: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack: *mut u8,
    len: usize,
) -> libc::pid_t {
    // The stack grows down from its (16-byte aligned) top.
    let top = (stack as usize + len) & !15;
    // SAFETY: `child` only makes raw system calls on its own stack `top`,
    // which stays valid: this thread is suspended until the child exits.
    unsafe {
        libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    }
}

/// Clones a child that shares this memory (CLONE_VM | CLONE_VFORK, as
/// posix_spawn does): this thread waits, TASK_KILLABLE, until the child
/// exits 100 ms later; then reaps it.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_vfork(stack: *mut u8, len: usize) -> libc::pid_t {
    let pid = clone_vfork(vfork_child, stack, len);
    if pid > 0 {
        let mut status = 0;
        // SAFETY: `status` is a valid, writable int.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    black_box(pid)
}

/// `wl-vfork`: vfork-style clones, one after the other.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_vfork_thread() {
    let mut stack = vec![0u8; 64 * 1024];
    while !stopped() {
        if wl_block_vfork(stack.as_mut_ptr(), stack.len()) < 0 {
            eprintln!(
                "blocker: vfork-style clone: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
    }
}

/// Set by SIGUSR1: `wl-tail` starts its long block.
static TAIL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigusr1(_: libc::c_int) {
    TAIL.store(true, Ordering::Relaxed);
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_tail_wait() -> libc::c_int {
    black_box(nanosleep_ms(5))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_tail() -> libc::c_int {
    // poll(2), not a sleep: its stack differs from the short sleeps' before
    // it even where a frame-pointer walk cannot see this function.
    // SAFETY: no descriptors to poll; only the timeout.
    black_box(unsafe { libc::poll(std::ptr::null_mut(), 0, 60_000) })
}

/// `wl-tail`: short sleeps until SIGUSR1, then one long block, whose start
/// it prints first.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_tail_thread() {
    while !TAIL.load(Ordering::Relaxed) {
        if stopped() {
            return;
        }
        wl_block_tail_wait();
    }
    // Its time on a CPU and waiting for one so far, by the kernel's
    // accounting: what it adds from here to the block (printing, a
    // preemption) is what the block's start may lie after the time printed.
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ran: u64 = schedstat
        .split_whitespace()
        .take(2)
        .filter_map(|n| n.parse::<u64>().ok())
        .sum();
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let line = format!(
        "tail {} {ran}\n",
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    );
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
    wl_block_tail();
}

/// Set by SIGUSR2: the main thread starts `wl-brief`.
static BRIEF: AtomicBool = AtomicBool::new(false);
static BRIEF_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static BRIEF_SPAWNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_sigusr2(_: libc::c_int) {
    BRIEF.store(true, Ordering::Relaxed);
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_brief() -> libc::c_int {
    black_box(nanosleep_ms(1))
}

/// `wl-brief`: lives `ms` ms in 1 ms sleeps, says how long it lived and ran,
/// and exits.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_brief_thread(ms: u64) {
    let first = clock_ns(libc::CLOCK_MONOTONIC);
    while clock_ns(libc::CLOCK_MONOTONIC) < first + ms * 1_000_000 {
        wl_block_brief();
    }
    let cpu = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let last = clock_ns(libc::CLOCK_MONOTONIC);
    let spawned = BRIEF_SPAWNED.load(Ordering::Relaxed);
    let line = format!("brief {} {first} {last} {cpu} {spawned}\n", gettid());
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

fn start_brief_thread() {
    let ms = BRIEF_MS.load(Ordering::Relaxed);
    BRIEF_SPAWNED.store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Relaxed);
    let _ = thread::Builder::new()
        .name("wl-brief".into())
        .spawn(move || wl_brief_thread(ms));
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_waitpid(pid: libc::pid_t) -> libc::pid_t {
    let mut status = 0;
    // SAFETY: `status` is a valid, writable int for the whole call.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    black_box(r)
}

/// `wl-reaper`: wait for (reap) the child process.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_reaper_thread(pid: libc::pid_t) {
    while wl_block_waitpid(pid) < 0 {
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Main thread: write one byte to the pipe every 20 ms for `run_ms`.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_pipe_feeder(fd: libc::c_int, run_ms: u64) {
    let start = Instant::now();
    let run = Duration::from_millis(run_ms);
    while start.elapsed() < run {
        let byte = 1u8;
        // SAFETY: `byte` is a valid 1-byte buffer; `fd` is our pipe's write end.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
        wl_block_feeder_sleep();
        if BRIEF.swap(false, Ordering::Relaxed) {
            start_brief_thread();
        }
    }
}

/// Child process body: sleep `ms` in total in 10 ms nanosleeps.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_child_sleep(ms: u64) {
    let start = Instant::now();
    let total = Duration::from_millis(ms);
    while start.elapsed() < total {
        let left = total.saturating_sub(start.elapsed()).as_millis() as u64;
        let ts = timespec_ms(left.clamp(1, 10));
        // SAFETY: `ts` is a valid timespec; a null `rem` is allowed.
        black_box(unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) });
    }
}

static mut STUCK_MUTEX: libc::pthread_mutex_t = libc::PTHREAD_MUTEX_INITIALIZER;
static mut STUCK_COND: libc::pthread_cond_t = libc::PTHREAD_COND_INITIALIZER;

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_cond_wait() -> libc::c_int {
    // SAFETY: the statics are initialized pthread objects, only ever used
    // through these pointers; the mutex is held around the wait.
    let r = unsafe {
        let (m, c) = (
            std::ptr::addr_of_mut!(STUCK_MUTEX),
            std::ptr::addr_of_mut!(STUCK_COND),
        );
        libc::pthread_mutex_lock(m);
        let r = libc::pthread_cond_wait(c, m);
        libc::pthread_mutex_unlock(m);
        r
    };
    black_box(r)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_stuck_read(fd: libc::c_int) -> libc::ssize_t {
    // readv, not read: the function must not be folded into
    // wl_block_pipe_read, its twin.
    let mut byte = 0u8;
    let iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    // SAFETY: `iov` describes `byte`, valid and writable for the whole call.
    let n = unsafe { libc::readv(fd, &iov, 1) };
    black_box(n)
}

/// When `wl-stuck-sleep` began its first sleep (CLOCK_MONOTONIC ns; 0:
/// not yet).
static LONG_SLEEP_FROM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_long_sleep() -> libc::c_int {
    if LONG_SLEEP_FROM.load(Ordering::Relaxed) == 0 {
        LONG_SLEEP_FROM.store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Relaxed);
    }
    black_box(nanosleep_ms(1_000_000))
}

/// The child of `wl-stuck-vfork`'s clone: killed with its parent thread,
/// it sleeps 1000 s on the parent's memory (raw system calls only).
extern "C" fn stuck_vfork_child(_: *mut libc::c_void) -> libc::c_int {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number.
    unsafe { libc::syscall(libc::SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    vfork_child_sleep(1_000_000);
    0
}

/// `wl-stuck-vfork`: waits, TASK_KILLABLE (D), for a vfork-style child
/// that sleeps 1000 s.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_stuck_vfork(stack: *mut u8, len: usize) -> libc::pid_t {
    black_box(clone_vfork(stuck_vfork_child, stack, len))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_join(thread: libc::pthread_t) -> libc::c_int {
    // SAFETY: `thread` is a joinable thread that is never joined elsewhere.
    black_box(unsafe { libc::pthread_join(thread, std::ptr::null_mut()) })
}

/// `blocker stuck`: every thread blocked for good (see the module docs).
/// `blocker jit`: see the module's documentation.
#[cfg(target_arch = "x86_64")]
fn run_jit(stay: bool) -> ExitCode {
    use std::io::{BufRead, Write};
    let fail = |what: &str| {
        eprintln!("blocker: {what}: {}", std::io::Error::last_os_error());
        ExitCode::FAILURE
    };
    let map_path = format!("/tmp/perf-{}.map", std::process::id());
    let mut map = match std::fs::File::create(&map_path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("blocker: {map_path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // With a frame pointer, as JIT code keeps them: push rbp; mov rbp, rsp;
    // mov eax, SYS_nanosleep; syscall; pop rbp; ret. The caller's two
    // arguments are the system call's.
    let code: [u8; 13] = [
        0x55, 0x48, 0x89, 0xe5, 0xb8, 35, 0, 0, 0, 0x0f, 0x05, 0x5d, 0xc3,
    ];
    // SAFETY: a fresh anonymous mapping, written before it is made
    // executable; nothing else refers to it.
    let page = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return fail("mmap");
        }
        std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len());
        if libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            return fail("mprotect");
        }
        p as usize
    };
    if writeln!(map, "{:x} 8 wl_jit_early", page + 64).is_err() {
        return fail("writing the perf map");
    }
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    if writeln!(map, "{page:x} {:x} wl_jit_last", code.len()).is_err() {
        return fail("writing the perf map");
    }
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 300_000_000,
    };
    // SAFETY: the page holds the code above, which takes the two
    // arguments of nanosleep and returns its result.
    let sleep: extern "C" fn(*const libc::timespec, *mut libc::timespec) -> i64 =
        unsafe { std::mem::transmute(page) };
    sleep(&ts, std::ptr::null_mut());
    if stay {
        loop {
            wl_block_long_sleep();
        }
    }
    ExitCode::SUCCESS
}

#[cfg(not(target_arch = "x86_64"))]
fn run_jit(_stay: bool) -> ExitCode {
    eprintln!("blocker: jit is written for x86-64 only");
    ExitCode::FAILURE
}

fn run_stuck() -> ExitCode {
    // SAFETY: as in run_child; 14 bytes including the NUL.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"wl-stuck-main".as_ptr()) };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("blocker: pipe2: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    // The write end stays open and unwritten: the read never returns.
    let read_fd = fds[0];
    let (tx, rx) = mpsc::channel();
    let names = ["wl-stuck-cond", "wl-stuck-pipe", "wl-stuck-sleep"];
    let cond = spawn_named("wl-stuck-cond", &tx, || loop {
        wl_block_cond_wait();
    });
    spawn_named("wl-stuck-pipe", &tx, move || loop {
        wl_block_stuck_read(read_fd);
    });
    spawn_named("wl-stuck-sleep", &tx, || loop {
        wl_block_long_sleep();
    });
    let vfork = std::env::args().any(|a| a == "--vfork");
    if vfork {
        spawn_named("wl-stuck-vfork", &tx, || {
            let mut stack = vec![0u8; 64 * 1024];
            loop {
                wl_block_stuck_vfork(stack.as_mut_ptr(), stack.len());
            }
        });
    }
    drop(tx);
    let mut report = format!("pid {}\ntid main {}\n", std::process::id(), gettid());
    for _ in 0..names.len() + usize::from(vfork) {
        let (name, tid) = rx.recv().expect("a thread died before reporting");
        report += &format!("tid {name} {tid}\n");
    }
    report += "ready\n";
    while LONG_SLEEP_FROM.load(Ordering::Relaxed) == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    report += &format!("asleep {}\n", LONG_SLEEP_FROM.load(Ordering::Relaxed));
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.as_bytes()).and_then(|()| out.flush());
    drop(out);
    use std::os::unix::thread::JoinHandleExt;
    let thread = cond.into_pthread_t();
    loop {
        wl_block_join(thread);
    }
}

static mut WAKE_MUTEX: libc::pthread_mutex_t = libc::PTHREAD_MUTEX_INITIALIZER;
static mut WAKE_COND: libc::pthread_cond_t = libc::PTHREAD_COND_INITIALIZER;
static WAKE_TURN: AtomicU32 = AtomicU32::new(0);

/// `wl-cond-wait`: waits on a condition variable until `wake_by_signal`
/// signals it.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_signalled() -> libc::c_int {
    // SAFETY: the statics are initialized pthread objects, only ever used
    // through these pointers; the mutex is held around the wait.
    let r = unsafe {
        let (m, c) = (
            std::ptr::addr_of_mut!(WAKE_MUTEX),
            std::ptr::addr_of_mut!(WAKE_COND),
        );
        libc::pthread_mutex_lock(m);
        let seen = WAKE_TURN.load(Ordering::Relaxed);
        let mut r = 0;
        while WAKE_TURN.load(Ordering::Relaxed) == seen && r == 0 {
            r = libc::pthread_cond_wait(c, m);
        }
        libc::pthread_mutex_unlock(m);
        r
    };
    black_box(r)
}

/// `wl-signaller`: signals the condition variable.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wake_by_signal() -> libc::c_int {
    // SAFETY: as in wl_block_signalled.
    let r = unsafe {
        let (m, c) = (
            std::ptr::addr_of_mut!(WAKE_MUTEX),
            std::ptr::addr_of_mut!(WAKE_COND),
        );
        libc::pthread_mutex_lock(m);
        WAKE_TURN.fetch_add(1, Ordering::Relaxed);
        let r = libc::pthread_cond_signal(c);
        libc::pthread_mutex_unlock(m);
        r
    };
    black_box(r)
}

/// `wl-pipe-wait`: reads a pipe that `wake_by_write` writes.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_written(fd: libc::c_int) -> libc::ssize_t {
    // Up to two bytes, not one: the function must not be folded into
    // wl_block_pipe_read, its twin.
    let mut bytes = [0u8; 2];
    // SAFETY: `bytes` is valid and writable for the whole call.
    black_box(unsafe { libc::read(fd, bytes.as_mut_ptr().cast(), bytes.len()) })
}

/// `wl-writer`: writes one byte to the pipe.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wake_by_write(fd: libc::c_int) -> libc::ssize_t {
    let byte = [b'w'];
    // SAFETY: writes one byte from a valid buffer.
    black_box(unsafe { libc::write(fd, byte.as_ptr().cast(), 1) })
}

/// `wl-futex-wait`: waits on a futex in memory shared with another
/// process, `wl-futex-waker`, which wakes it with `wake_by_futex`.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_shared_futex(word: &AtomicU32) -> libc::c_long {
    let seen = word.load(Ordering::Acquire);
    // SAFETY: FUTEX_WAIT (shared) on a valid, aligned u32, no timeout.
    black_box(unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            std::ptr::null::<libc::timespec>(),
        )
    })
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn wake_by_futex(word: &AtomicU32) -> libc::c_long {
    word.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE (shared) of one waiter on a valid, aligned u32.
    black_box(unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) })
}

/// `blocker wakers`: sleepers woken by known functions of known threads,
/// every 20 ms: `wl-cond-wait` by `wake_by_signal` (thread `wl-signaller`),
/// `wl-pipe-wait` by `wake_by_write` (`wl-writer`), `wl-futex-wait` by
/// `wake_by_futex` in another process (`wl-futex-waker`), and
/// `wl-timer-wait` by its own 20 ms timer only (`wl_block_timer`). Prints
/// the `pid`/`tid` lines, `waker PID` for the other process, and `ready`.
fn run_wakers() -> ExitCode {
    // SAFETY: a shared anonymous page for the cross-process futex.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        eprintln!("blocker: mmap: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    // SAFETY: the page is mapped, zeroed and aligned; an AtomicU32 over
    // its first word lives as long as the process.
    let word: &'static AtomicU32 = unsafe { &*(page as *const AtomicU32) };
    // SAFETY: fork with one thread so far; the child only makes raw system
    // calls and exits when its parent is gone.
    let child = unsafe { libc::fork() };
    if child < 0 {
        eprintln!("blocker: fork: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    if child == 0 {
        // SAFETY: PR_SET_NAME with a 15-byte literal; PR_SET_PDEATHSIG so
        // that the child ends with its parent.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, c"wl-futex-waker".as_ptr());
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        loop {
            nanosleep_ms(20);
            wake_by_futex(word);
        }
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("blocker: pipe2: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    let [read_fd, write_fd] = fds;
    let (tx, rx) = mpsc::channel();
    let names = [
        "wl-cond-wait",
        "wl-signaller",
        "wl-pipe-wait",
        "wl-writer",
        "wl-futex-wait",
        "wl-timer-wait",
    ];
    spawn_named("wl-cond-wait", &tx, || loop {
        wl_block_signalled();
    });
    spawn_named("wl-signaller", &tx, || loop {
        nanosleep_ms(20);
        wake_by_signal();
    });
    spawn_named("wl-pipe-wait", &tx, move || loop {
        if wl_block_written(read_fd) <= 0 {
            return;
        }
    });
    spawn_named("wl-writer", &tx, move || loop {
        nanosleep_ms(20);
        wake_by_write(write_fd);
    });
    spawn_named("wl-futex-wait", &tx, move || loop {
        wl_block_shared_futex(word);
    });
    spawn_named("wl-timer-wait", &tx, || loop {
        wl_block_timer();
    });
    drop(tx);
    let mut report = format!(
        "pid {}\ntid main {}\nwaker {child}\n",
        std::process::id(),
        gettid()
    );
    for _ in 0..names.len() {
        let (name, tid) = rx.recv().expect("a thread died before reporting");
        report += &format!("tid {name} {tid}\n");
    }
    report += "ready\n";
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.as_bytes()).and_then(|()| out.flush());
    drop(out);
    loop {
        wl_block_long_sleep();
    }
}

/// `wl-timer-wait`: a 20 ms sleep that only its timer ends.
#[inline(never)]
#[no_mangle]
pub extern "C" fn wl_block_timer() -> libc::c_int {
    // clock_nanosleep, not nanosleep: not to be folded into its twins.
    let ts = timespec_ms(20);
    // SAFETY: a relative sleep on a valid timespec.
    black_box(unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) })
}

fn run_child(ms: u64) -> ExitCode {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes;
    // this literal is 9 bytes including the NUL.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"wl-child".as_ptr()) };
    wl_child_sleep(ms);
    ExitCode::SUCCESS
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Spawn a named thread that reports its kernel tid on `tx`, then runs `body`.
fn spawn_named(
    name: &'static str,
    tx: &mpsc::Sender<(&'static str, libc::pid_t)>,
    body: impl FnOnce() + Send + 'static,
) -> thread::JoinHandle<()> {
    let tx = tx.clone();
    thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            tx.send((name, gettid())).expect("main thread gone");
            drop(tx);
            body();
        })
        .unwrap_or_else(|e| panic!("spawning {name}: {e}"))
}

struct Args {
    seconds: u64,
    child_ms: Option<u64>,
    killable: bool,
    pinned_spinners: bool,
    io: bool,
    tail: bool,
    brief_ms: Option<u64>,
}

const USAGE: &str = "usage: blocker [--seconds N] [--child-ms M] [--killable] \
                     [--pinned-spinners] [--io] [--tail] [--brief MS]";

fn parse_num(flag: &str, value: Option<String>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value.parse().map_err(|e| format!("{flag} {value:?}: {e}"))
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        seconds: 30,
        child_ms: None,
        killable: false,
        pinned_spinners: false,
        io: false,
        tail: false,
        brief_ms: None,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => parsed.seconds = parse_num("--seconds", args.next())?,
            "--child-ms" => parsed.child_ms = Some(parse_num("--child-ms", args.next())?),
            "--killable" => parsed.killable = true,
            "--pinned-spinners" => parsed.pinned_spinners = true,
            "--io" => parsed.io = true,
            "--tail" => parsed.tail = true,
            "--brief" => parsed.brief_ms = Some(parse_num("--brief", args.next())?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unexpected argument {other:?}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("stuck") {
        return run_stuck();
    }
    if argv.peek().map(String::as_str) == Some("wakers") {
        return run_wakers();
    }
    if argv.peek().map(String::as_str) == Some("jit") {
        argv.next();
        return run_jit(argv.next().as_deref() == Some("stay"));
    }
    if argv.peek().map(String::as_str) == Some("child") {
        argv.next();
        return match parse_num("child", argv.next()) {
            Ok(ms) => run_child(ms),
            Err(e) => {
                eprintln!("blocker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("blocker: {e}");
            return ExitCode::from(2);
        }
    };

    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("blocker: pipe2: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    let [read_fd, write_fd] = fds;

    let (tx, rx) = mpsc::channel();
    let mut names = vec![
        "wl-nanosleep",
        "wl-shortsleep",
        "wl-pipe",
        "wl-futex",
        "wl-spin",
    ];
    spawn_named("wl-nanosleep", &tx, || wl_nanosleep_thread());
    spawn_named("wl-shortsleep", &tx, || wl_shortsleep_thread());
    spawn_named("wl-pipe", &tx, move || wl_pipe_thread(read_fd));
    spawn_named("wl-futex", &tx, || wl_futex_thread());
    let spinner = spawn_named("wl-spin", &tx, || wl_spin_thread());
    if args.killable {
        names.push("wl-vfork");
        spawn_named("wl-vfork", &tx, || wl_vfork_thread());
    }
    if args.pinned_spinners {
        names.extend(["wl-pin-a", "wl-pin-b"]);
        spawn_named("wl-pin-a", &tx, || wl_pinned_spin_thread());
        spawn_named("wl-pin-b", &tx, || wl_pinned_spin_thread());
    }
    if args.io {
        names.push("wl-io");
        spawn_named("wl-io", &tx, || wl_io_thread());
    }
    if args.tail {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(libc::SIGUSR1, on_sigusr1 as *const () as libc::sighandler_t) };
        names.push("wl-tail");
        spawn_named("wl-tail", &tx, || wl_tail_thread());
    }

    if let Some(ms) = args.brief_ms {
        BRIEF_MS.store(ms, Ordering::Relaxed);
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(libc::SIGUSR2, on_sigusr2 as *const () as libc::sighandler_t) };
    }

    let mut child_pid = None;
    if let Some(ms) = args.child_ms {
        let exe = match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("blocker: current_exe: {e}");
                return ExitCode::FAILURE;
            }
        };
        let child = Command::new(exe)
            .arg("child")
            .arg(ms.to_string())
            .stdin(Stdio::null())
            .spawn();
        // The std `Child` is only used to spawn: wl_reaper_thread reaps it with
        // waitpid, and dropping a `Child` neither waits for nor kills it.
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                eprintln!("blocker: spawning child: {e}");
                return ExitCode::FAILURE;
            }
        };
        let pid = child.id() as libc::pid_t;
        child_pid = Some(pid);
        names.push("wl-reaper");
        spawn_named("wl-reaper", &tx, move || wl_reaper_thread(pid));
    }
    drop(tx);

    let mut tids = std::collections::HashMap::new();
    for _ in 0..names.len() {
        let (name, tid) = rx.recv().expect("a thread died before reporting");
        tids.insert(name, tid);
    }

    let mut out = std::io::stdout().lock();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut report = format!("pid {pid}\ntid main {}\n", gettid());
    for name in &names {
        report += &format!("tid {name} {}\n", tids[name]);
    }
    if let Some(c) = child_pid {
        report += &format!("child {c}\n");
    }
    report += "ready\n";
    // A vanished reader (e.g. a test that stopped reading) is not fatal.
    let _ = out.write_all(report.as_bytes()).and_then(|()| out.flush());
    drop(out);

    wl_pipe_feeder(write_fd, args.seconds.saturating_mul(1000));

    // Blocked threads notice STOP within their timeout (or stay blocked in
    // read, which exiting ends); the spinner is joined so it is seen to stop.
    STOP.store(true, Ordering::Relaxed);
    let _ = spinner.join();
    ExitCode::SUCCESS
}
