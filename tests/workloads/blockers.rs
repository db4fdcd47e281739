//! blockers: a workload whose threads block forever, each in one known way,
//! under three layers of its own functions, for the unwinding acceptance
//! test (`tests/it/unwind.rs`), which compares the profiler's user stacks
//! with gdb's. `tests/workloads/blockers.c` is the same program in C; this
//! one uses std only, so that it builds with plain `rustc`:
//!
//! ```text
//! rustc --edition 2021 -C opt-level=3 -C debuginfo=line-tables-only blockers.rs
//! ```
//!
//! | thread         | blocks in (every 25-40 ms)        | fed by           |
//! |----------------|-----------------------------------|------------------|
//! | `sleeper`      | `std::thread::sleep` (nanosleep)  | -                |
//! | `pipe_reader`  | read of a `std::io::pipe()`       | `pipe_writer`    |
//! | `cond_waiter`  | `std::sync::Condvar::wait`        | `cond_signaller` |
//! | `mutex_waiter` | `std::sync::Mutex::lock`          | `mutex_holder`   |
//! | `epoller`      | `epoll_wait` with a timeout       | -                |
//! | main thread    | `JoinHandle::join`                | `joinee`         |
//!
//! Each blocking call is made from `levelN_*` functions: level1 calls level2
//! calls level3 calls std (or libc). They are `#[inline(never)]` and pass
//! their results through `black_box` after each call, so that every one
//! stays a frame (no inlining, no tail call).
//!
//! The main thread joins a `joinee` thread that sleeps 30 ms and exits, then
//! starts the next one: a thread blocked for the whole trace is never
//! switched, so no off-CPU profiler would see it.
//!
//! Prints its pid on the first line of stdout, then runs until killed.

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// `struct epoll_event` as x86_64 Linux lays it out (packed).
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct EpollEvent {
    events: u32,
    data: u64,
}

const EPOLL_CLOEXEC: i32 = 0o2000000;
const EPOLL_CTL_ADD: i32 = 1;
const EPOLLIN: u32 = 1;

extern "C" {
    fn epoll_create1(flags: i32) -> i32;
    fn epoll_ctl(epfd: i32, op: i32, fd: i32, event: *mut EpollEvent) -> i32;
    fn epoll_wait(epfd: i32, events: *mut EpollEvent, maxevents: i32, timeout: i32) -> i32;
}

// sleeper: nanosleep.

#[inline(never)]
fn level3_sleep() {
    thread::sleep(black_box(Duration::from_millis(25)));
    black_box(());
}

#[inline(never)]
fn level2_sleep() {
    level3_sleep();
    black_box(());
}

#[inline(never)]
fn level1_sleep() {
    level2_sleep();
    black_box(());
}

#[inline(never)]
fn sleeper_main() {
    loop {
        level1_sleep();
    }
}

// pipe_reader: read of a pipe that pipe_writer feeds a byte every 30 ms.

#[inline(never)]
fn level3_read(pipe: &mut std::io::PipeReader) {
    let mut byte = [0u8; 1];
    pipe.read_exact(black_box(&mut byte)).expect("read");
    black_box(byte);
}

#[inline(never)]
fn level2_read(pipe: &mut std::io::PipeReader) {
    level3_read(black_box(pipe));
    black_box(());
}

#[inline(never)]
fn level1_read(pipe: &mut std::io::PipeReader) {
    level2_read(black_box(pipe));
    black_box(());
}

#[inline(never)]
fn pipe_reader_main(mut pipe: std::io::PipeReader) {
    loop {
        level1_read(&mut pipe);
    }
}

#[inline(never)]
fn pipe_writer_main(mut pipe: std::io::PipeWriter) {
    loop {
        thread::sleep(Duration::from_millis(30));
        pipe.write_all(b"x").expect("write");
    }
}

// cond_waiter: Condvar::wait, signalled every 30 ms by cond_signaller.

static COND_FLAG: Mutex<bool> = Mutex::new(false);
static COND: Condvar = Condvar::new();

#[inline(never)]
fn level3_cond_wait() {
    let mut flag = COND_FLAG.lock().unwrap();
    while !*flag {
        flag = COND.wait(flag).unwrap();
    }
    *flag = false;
    black_box(&*flag);
}

#[inline(never)]
fn level2_cond_wait() {
    level3_cond_wait();
    black_box(());
}

#[inline(never)]
fn level1_cond_wait() {
    level2_cond_wait();
    black_box(());
}

#[inline(never)]
fn cond_waiter_main() {
    loop {
        level1_cond_wait();
    }
}

#[inline(never)]
fn cond_signaller_main() {
    loop {
        thread::sleep(Duration::from_millis(30));
        *COND_FLAG.lock().unwrap() = true;
        COND.notify_one();
    }
}

// mutex_waiter: Mutex::lock of a mutex that mutex_holder keeps 30 ms at a
// time, releasing it for 1 ms in between. The waiter takes and drops it in
// a loop, so it only ever blocks in the lock.

static CONTENDED: Mutex<u64> = Mutex::new(0);

#[inline(never)]
fn level3_mutex_lock() {
    let mut n = CONTENDED.lock().unwrap();
    *n += 1;
    black_box(&*n);
}

#[inline(never)]
fn level2_mutex_lock() {
    level3_mutex_lock();
    black_box(());
}

#[inline(never)]
fn level1_mutex_lock() {
    level2_mutex_lock();
    black_box(());
}

#[inline(never)]
fn mutex_waiter_main() {
    loop {
        level1_mutex_lock();
    }
}

#[inline(never)]
fn mutex_holder_main() {
    loop {
        let guard = CONTENDED.lock().unwrap();
        thread::sleep(Duration::from_millis(30));
        drop(guard);
        thread::sleep(Duration::from_millis(1));
    }
}

// epoller: epoll_wait with a 40 ms timeout on an epoll fd watching a pipe
// that is never written.

#[inline(never)]
fn level3_epoll_wait(epfd: i32) {
    let mut ev = EpollEvent { events: 0, data: 0 };
    // SAFETY: `ev` has room for the one event asked for.
    let n = unsafe { epoll_wait(epfd, &mut ev, 1, black_box(40)) };
    // EINTR when a debugger attaches: epoll_wait is never restarted.
    let err = std::io::Error::last_os_error();
    assert!(
        n >= 0 || err.kind() == std::io::ErrorKind::Interrupted,
        "epoll_wait: {err}"
    );
    black_box(n);
}

#[inline(never)]
fn level2_epoll_wait(epfd: i32) {
    level3_epoll_wait(black_box(epfd));
    black_box(());
}

#[inline(never)]
fn level1_epoll_wait(epfd: i32) {
    level2_epoll_wait(black_box(epfd));
    black_box(());
}

#[inline(never)]
fn epoller_main(epfd: i32) {
    loop {
        level1_epoll_wait(epfd);
    }
}

// The main thread: JoinHandle::join of a thread that exits after 30 ms.

#[inline(never)]
fn level3_join(t: thread::JoinHandle<()>) {
    t.join().expect("join");
    black_box(());
}

#[inline(never)]
fn level2_join(t: thread::JoinHandle<()>) {
    level3_join(black_box(t));
    black_box(());
}

#[inline(never)]
fn level1_join(t: thread::JoinHandle<()>) {
    level2_join(black_box(t));
    black_box(());
}

#[inline(never)]
fn joinee_main() {
    thread::sleep(Duration::from_millis(30));
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(body)
        .expect("spawn")
}

/// An epoll fd watching the read end of a pipe that nobody writes.
fn idle_epoll() -> i32 {
    let (idle, writer) = std::io::pipe().expect("pipe");
    // SAFETY: plain syscalls on fds this function owns; `ev` is valid.
    let epfd = unsafe { epoll_create1(EPOLL_CLOEXEC) };
    assert!(epfd >= 0, "epoll_create1");
    let mut ev = EpollEvent {
        events: EPOLLIN,
        data: 0,
    };
    let rc = unsafe { epoll_ctl(epfd, EPOLL_CTL_ADD, idle.as_raw_fd(), &mut ev) };
    assert!(rc == 0, "epoll_ctl");
    // Both ends stay open for the life of the process.
    std::mem::forget((idle, writer));
    epfd
}

fn main() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    let epfd = idle_epoll();

    spawn("sleeper", sleeper_main);
    spawn("pipe_reader", move || pipe_reader_main(reader));
    spawn("pipe_writer", move || pipe_writer_main(writer));
    spawn("cond_waiter", cond_waiter_main);
    spawn("cond_signaller", cond_signaller_main);
    spawn("mutex_waiter", mutex_waiter_main);
    spawn("mutex_holder", mutex_holder_main);
    spawn("epoller", move || epoller_main(epfd));

    let mut out = std::io::stdout();
    writeln!(out, "{}", std::process::id()).expect("stdout");
    out.flush().expect("stdout");
    loop {
        level1_join(spawn("joinee", joinee_main));
    }
}
