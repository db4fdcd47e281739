//! Start-up at a raised CPU priority, and the lookout.
//!
//! On a machine whose CPUs are all busy (thousands of runnable threads),
//! a profiler at the default priority waits seconds for a CPU at every
//! step of starting: the verifier, the unwind tables, the start iterator
//! (tens of seconds under `examples/stackfarm`'s thousands of threads:
//! docs/benchmarks-history.md). The
//! threads that start tracing run at nice -20 where allowed, and go back to
//! the priority they had once the window is open and the lookout runs:
//! the trace itself runs at the user's priority, but for the thread that
//! takes in the BPF program's news while stacks copied for it wait for
//! their processes' tables (thousands of new threads at once), which the
//! lookout raises into the real-time class (see [`Lookout`]). Threads
//! created while starting (the unwind table builder) inherit the raised
//! priority and drop it the next time they call [`settle`].

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// The nice value to go back to.
static NORMAL: AtomicI32 = AtomicI32::new(0);
/// Set while start-up runs raised.
static RAISED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static SETTLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Set while the lookout holds the loop and the builders in the
/// real-time class.
static REALTIME: AtomicBool = AtomicBool::new(false);

/// Thread `tid` (0: the calling one) into `SCHED_FIFO` at the lowest
/// priority, its children back in the normal class. False without the
/// privilege (`CAP_SYS_NICE` or `RLIMIT_RTPRIO`).
fn set_realtime(tid: libc::pid_t) -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `param` and changes the policy of
    // a thread of this process (one that has exited fails harmlessly).
    unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0
    }
}

/// Thread `tid` (0: the calling one) back in the normal class.
fn set_normal_class(tid: libc::pid_t) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_realtime.
    unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
}

/// Nice value of thread `tid` of this process (0: the calling one).
fn set_nice(tid: libc::pid_t, nice: i32) -> bool {
    // SAFETY: setpriority on a thread id of this process; one that has
    // exited fails harmlessly.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 }
}

/// The calling thread's nice value (Linux: per thread).
fn set_this_thread(nice: i32) -> bool {
    set_nice(0, nice)
}

/// Raises the calling thread to nice -20 until the guard is dropped (no
/// effect without the privilege).
pub struct Raised {
    active: bool,
}

pub fn raise() -> Raised {
    // SAFETY: getpriority has no preconditions; errno tells -1 apart.
    let now = unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        if n == -1 && *libc::__errno_location() != 0 {
            return Raised { active: false };
        }
        n
    };
    // Already raised (by the lookout, see [`Lookout`]): the priority to
    // go back to is the one noted before.
    if now > -20 {
        NORMAL.store(now, Ordering::Relaxed);
    }
    let normal = NORMAL.load(Ordering::Relaxed);
    let active = normal > -20 && (now == -20 || set_this_thread(-20));
    RAISED.store(active, Ordering::Release);
    Raised { active }
}

/// Set by the lookout when it raised the event loop.
static LOOKED_OUT: AtomicBool = AtomicBool::new(false);

/// Rounds of news the event loop took (see [`Lookout::news_taken`]).
static NEWS_TAKEN: AtomicU64 = AtomicU64::new(0);
/// Set while the lookout finds news waiting that the loop is late with.
static NEWS_LATE: AtomicBool = AtomicBool::new(false);

/// How long news may wait unread, the loop taking none, before the
/// lookout raises it: a loop at the user's priority takes its news within
/// milliseconds where it gets a CPU at all; on a machine whose CPUs are
/// all busy it waited seconds, and the new processes of that news were
/// gone before their mappings could be read (their stacks all
/// `[unknown]`).
const NEWS_LATE_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// The lookout's news probes: whether news waits unread now.
pub type NewsWaiting = Box<dyn FnMut() -> bool + Send>;

/// A thread that raises the event loop (thread `loop_tid`) as soon as the
/// BPF program finds no room to copy stacks for it (`copies`, a count that
/// grows with those lost, read every 10 ms), or its news (`news`: new
/// processes, whose mappings are read while they exist) has waited unread
/// for [`NEWS_LATE_AFTER`] with the loop taking none: a burst of new processes
/// (thousands of threads at once) otherwise keeps the loop, at the user's
/// priority, from a CPU for seconds before it can learn of them and raise
/// itself. Raised means the real-time class where allowed (`SCHED_FIFO`
/// at its lowest priority, for the lookout itself too): with 8,000 new
/// threads on two CPUs, nice -20 still left the loop a sixth of a CPU,
/// and the farm's blocks of the first seconds were missed. Otherwise nice
/// -20. Not at every copy: the loop raised whenever a new process appears
/// disturbs the threads it measures (a thread sleeping 1 ms at a time was
/// counted 50 ms over the kernel's accounting in 3 s). The loop and the
/// table builders leave the real-time class once no copy waits (see
/// [`Lookout::take_raise`] and [`Lookout::end_raise`]).
pub struct Lookout {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lookout {
    pub fn start(
        copies: Option<Box<dyn FnMut() -> u64 + Send>>,
        news: Option<NewsWaiting>,
    ) -> Lookout {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        // SAFETY: gettid has no preconditions.
        let loop_tid = unsafe { libc::gettid() };
        let thread = {
            let stop = stop.clone();
            let mut copies = copies.unwrap_or_else(|| Box::new(|| 0));
            let mut news = news;
            std::thread::Builder::new()
                .name("lookout".into())
                .spawn(move || {
                    // Without the privilege it could not raise the loop
                    // either.
                    let rt = set_realtime(0);
                    if !rt && !set_this_thread(-20) {
                        return;
                    }
                    let mut last = copies();
                    let mut late = LateNews::default();
                    while !stop.load(Ordering::Acquire) {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        let now = copies();
                        let news_late = news.as_mut().is_some_and(|waiting| {
                            late.check(waiting(), NEWS_TAKEN.load(Ordering::Acquire))
                        });
                        NEWS_LATE.store(news_late, Ordering::Release);
                        if (now != last || news_late) && !LOOKED_OUT.swap(true, Ordering::AcqRel) {
                            // The table builders too: the copies wait for
                            // the tables they build. They stay raised.
                            let helpers = HELPERS.lock().map(|h| h.1.clone()).unwrap_or_default();
                            for tid in helpers.into_iter().chain([loop_tid]) {
                                if !(rt && set_realtime(tid)) {
                                    set_nice(tid, -20);
                                }
                            }
                            REALTIME.store(rt, Ordering::Release);
                        }
                        last = now;
                    }
                })
                .ok()
        };
        Lookout { stop, thread }
    }

    /// For the event loop, once no copy waits: the lookout's real-time
    /// raise ends. The loop and the builders go back to the normal class
    /// (the builders at nice -20, as after start-up).
    pub fn end_raise() {
        if REALTIME.swap(false, Ordering::AcqRel) {
            let helpers = HELPERS.lock().map(|h| h.1.clone()).unwrap_or_default();
            for tid in helpers {
                set_normal_class(tid);
                set_nice(tid, -20);
            }
            set_normal_class(0);
        }
    }

    /// For the event loop: whether the lookout raised it since the last
    /// call (it then holds the raised priority as its own, see
    /// [`raise`], until nothing waits).
    pub fn take_raise() -> bool {
        LOOKED_OUT.swap(false, Ordering::AcqRel)
    }

    /// For the event loop: it took a round of news.
    pub fn news_taken() {
        NEWS_TAKEN.fetch_add(1, Ordering::AcqRel);
    }

    /// For the event loop: the lookout finds it late with its news (it
    /// holds its raise until it is not).
    pub fn news_late() -> bool {
        NEWS_LATE.load(Ordering::Acquire)
    }
}

/// Since when news has waited with the loop taking none.
#[derive(Default)]
struct LateNews {
    since: Option<(std::time::Instant, u64)>,
}

impl LateNews {
    /// Whether news is late: it waits now (`waiting`), and has waited
    /// since [`NEWS_LATE_AFTER`] ago while the loop took no round
    /// (`taken`, the count of rounds taken).
    fn check(&mut self, waiting: bool, taken: u64) -> bool {
        match self.since {
            Some((at, t)) if waiting && t == taken => at.elapsed() >= NEWS_LATE_AFTER,
            _ => {
                self.since = waiting.then(|| (std::time::Instant::now(), taken));
                false
            }
        }
    }
}

impl Drop for Lookout {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        if self.active {
            RAISED.store(false, Ordering::Release);
            set_this_thread(NORMAL.load(Ordering::Relaxed));
        }
    }
}

/// For threads created during start-up: once start-up is over, go back to
/// the normal priority (once).
pub fn settle() {
    if RAISED.load(Ordering::Acquire) || SETTLED.with(|s| s.replace(true)) {
        return;
    }
    set_this_thread(NORMAL.load(Ordering::Relaxed));
}

/// Nice value of helper threads (the unwind table builders) while the BPF
/// object loads: above every thread of a busy machine at the default
/// priority, below the thread that loads the object (-20), which is the
/// start-up's critical path. With two CPUs the helpers then take the other
/// CPU rather than the loader's (at -10 they get about a tenth of a CPU
/// they share with it): 5–6 ms of start-up on this kind of machine. Once
/// the object is loaded they go back to -20 (see [`loading`]): on a
/// machine with thousands of runnable threads, the tables still being
/// built are then what start-up waits for.
const HELPER_NICE: i32 = -10;

/// Whether the BPF object is being loaded, and the helper threads started
/// raised (their kernel thread ids), under one lock so that none is left
/// lowered once the load is over.
static HELPERS: std::sync::Mutex<(bool, Vec<libc::pid_t>)> =
    std::sync::Mutex::new((false, Vec::new()));

/// For helper threads created during start-up (the unwind table builders):
/// below the loader while it loads, see [`HELPER_NICE`]. No effect unless
/// start-up runs raised; [`settle`] still brings them back to normal after
/// start-up.
pub fn below_loader() {
    if !RAISED.load(Ordering::Acquire) {
        return;
    }
    let Ok(mut h) = HELPERS.lock() else {
        return;
    };
    // SAFETY: gettid has no preconditions.
    h.1.push(unsafe { libc::gettid() });
    if h.0 {
        set_this_thread(HELPER_NICE.min(NORMAL.load(Ordering::Relaxed)));
    }
}

/// Marks the BPF object's load as under way (helpers started now are
/// lowered) or over (every helper lowered goes back to -20).
pub fn loading(on: bool) {
    let Ok(mut h) = HELPERS.lock() else {
        return;
    };
    h.0 = on;
    if !on && RAISED.load(Ordering::Acquire) {
        for &tid in &h.1 {
            set_nice(tid, -20);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// News is late only once it has waited [`NEWS_LATE_AFTER`] with the
    /// loop taking no round meanwhile; a round taken, or nothing waiting,
    /// starts the wait over.
    #[test]
    fn news_is_late_after_a_wait_without_a_round() {
        let mut late = LateNews::default();
        assert!(!late.check(true, 0));
        assert!(!late.check(true, 0));
        std::thread::sleep(NEWS_LATE_AFTER);
        assert!(late.check(true, 0));
        // A round taken: waiting again from now.
        assert!(!late.check(true, 1));
        std::thread::sleep(NEWS_LATE_AFTER);
        assert!(late.check(true, 1));
        // Nothing waiting: not late, and the next wait starts over.
        assert!(!late.check(false, 1));
        assert!(!late.check(true, 1));
    }
}
