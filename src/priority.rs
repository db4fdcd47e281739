//! Start-up and the report at a raised CPU priority, and the lookout.
//!
//! On a machine whose CPUs are all busy (thousands of runnable threads),
//! a profiler at the default priority waits seconds for a CPU at every
//! step of starting: the verifier, the unwind tables, the start iterator
//! (tens of seconds under `examples/stackfarm`'s thousands of threads:
//! docs/benchmarks-history.md). The threads that start tracing, and those
//! that write the report, run in the real-time class where allowed (nice
//! -20 otherwise: see [`raise_start`]), and go back to the priority they
//! had once the window is open and the lookout runs: the trace itself
//! runs at the user's priority, but for the thread that takes in the BPF
//! program's news while stacks copied for it wait for their processes'
//! tables (thousands of new threads at once), which the lookout raises
//! into the real-time class (see [`Lookout`]), as it does at the window's
//! end. Threads created while starting (the unwind table builders) are
//! raised with it and drop it the next time they call [`settle`].

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

/// Set once the window's end has come and the lookout raised the loop
/// for the trace's end (see [`Lookout::start`]).
static ENDING: AtomicBool = AtomicBool::new(false);

/// Thread `tid` (0: the calling one) into `SCHED_FIFO` at the lowest
/// priority, its children back in the normal class. False without the
/// privilege (`CAP_SYS_NICE` or `RLIMIT_RTPRIO`).
fn set_realtime(tid: libc::pid_t) -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `param` and changes the policy of
    // a thread of this process: the calling one, or a helper on the list
    // (under its lock; a helper leaves it as it ends, see helper_ends).
    unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0
    }
}

/// Thread `tid` (0: the calling one) back in the normal class. Without
/// `CAP_SYS_NICE` (in the real-time class by `RLIMIT_RTPRIO`) the kernel
/// refuses to clear the reset-on-fork flag that [`set_realtime`] set:
/// the thread then keeps it (its children start at nice 0).
fn set_normal_class(tid: libc::pid_t) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_realtime.
    unsafe {
        if libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) != 0 {
            libc::sched_setscheduler(tid, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &param);
        }
    }
}

/// Nice value of thread `tid` of this process (0: the calling one).
fn set_nice(tid: libc::pid_t, nice: i32) -> bool {
    // SAFETY: setpriority on a thread id of this process (as in
    // set_realtime).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 }
}

/// The calling thread's nice value (Linux: per thread).
fn set_this_thread(nice: i32) -> bool {
    set_nice(0, nice)
}

/// Raises the calling thread to nice -20 until the guard is dropped (no
/// effect without the privilege); [`raise_start`] raises it into the
/// real-time class.
pub struct Raised {
    active: bool,
    realtime: bool,
}

/// Set while start-up or the report runs in the real-time class (see
/// [`raise_start`]).
static START_REALTIME: AtomicBool = AtomicBool::new(false);

/// Start-up's and the report's raise: the calling thread into the
/// real-time class (`SCHED_FIFO` at its lowest priority) where allowed,
/// nice -20 otherwise, until [`Raised::leave_realtime`] or the guard's
/// drop. On a machine with hundreds of runnable threads, nice -20 gets a
/// sixth of a CPU or less: under `examples/stackfarm --procs 200 --depth
/// 40` (8,200 threads on 2 CPUs) start-up took 1.4–2.2 s to attached and
/// the report 0.6–0.8 s, against 0.27 s and 0.08 s in the real-time class
/// (docs/benchmarks-history.md). Nothing is measured meanwhile: the
/// window opens as start-up ends, microseconds before the caller leaves
/// the class (the builders idle by then), and the report starts once it
/// has closed. Threads that start-up and
/// the report start for their work join it ([`join_raise`]); the table
/// builders follow [`loading`].
pub fn raise_start() -> Raised {
    let mut raised = raise();
    if set_realtime(0) {
        raised.realtime = true;
        START_REALTIME.store(true, Ordering::Release);
        // Builders started before (a snapshot's, a report's) join it.
        let Ok(h) = HELPERS.lock() else {
            return raised;
        };
        if !h.0 {
            for &tid in &h.1 {
                set_realtime(tid);
            }
        }
    }
    raised
}

/// For a thread that start-up or the report starts for its work (a BPF
/// object's load, the reading of a table): it runs raised as its starter
/// does (a thread started from the real-time class starts in the normal
/// class, at nice 0). Not needed afterwards: such a thread ends before
/// its starter's raise does.
pub fn join_raise() {
    if START_REALTIME.load(Ordering::Acquire) {
        set_realtime(0);
    } else if RAISED.load(Ordering::Acquire) {
        set_this_thread(-20);
    }
}

/// The calling thread's scheduling, for threads it starts to take: a
/// thread starts in the normal class at nice 0 (the real-time class is
/// set reset-on-fork), where the report's work wants the class its loop
/// was raised to.
#[derive(Clone, Copy)]
pub struct Class {
    realtime: bool,
    nice: i32,
}

/// The calling thread's class (see [`Class`]).
pub fn this_class() -> Class {
    // SAFETY: neither call has preconditions; errno is cleared first, as
    // getpriority may return -1 as a value.
    unsafe {
        let policy = libc::sched_getscheduler(0);
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        let nice = if nice == -1 && *libc::__errno_location() != 0 {
            0
        } else {
            nice
        };
        Class {
            realtime: policy >= 0 && policy & !libc::SCHED_RESET_ON_FORK == libc::SCHED_FIFO,
            nice,
        }
    }
}

impl Class {
    /// Whether it is the real-time class.
    pub fn realtime(self) -> bool {
        self.realtime
    }

    /// The calling thread into this class (where allowed: nothing
    /// changes otherwise).
    pub fn join(self) {
        if !(self.realtime && set_realtime(0)) && self.nice < 0 {
            set_this_thread(self.nice);
        }
    }
}

impl Raised {
    /// Out of the real-time class, still at nice -20 (for the few
    /// steps after the window has opened, before the lookout runs).
    pub fn leave_realtime(&mut self) {
        if std::mem::take(&mut self.realtime) {
            START_REALTIME.store(false, Ordering::Release);
            set_normal_class(0);
            if self.active {
                set_this_thread(-20);
            }
            // The builders as after start-up: nice -20 (see `settle`),
            // unless the lookout holds them in the real-time class.
            if !REALTIME.load(Ordering::Acquire) {
                lower_helpers();
            }
        }
    }
}

pub fn raise() -> Raised {
    // SAFETY: getpriority has no preconditions; errno tells -1 apart.
    let now = unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        if n == -1 && *libc::__errno_location() != 0 {
            return Raised {
                active: false,
                realtime: false,
            };
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
    Raised {
        active,
        realtime: false,
    }
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
/// counted 50 ms over the kernel's accounting in 3 s). Nor where the loop
/// and the builders get a CPU when they want one (see [`Starving`]):
/// raised, they would only take it from the threads traced (a new
/// process blocking thousands of times before its tables were built,
/// pinned to one CPU of two, ran at half its speed while they were in
/// the real-time class). The loop and the table builders leave the
/// real-time class once no copy waits (see [`Lookout::take_raise`] and
/// [`Lookout::end_raise`]).
pub struct Lookout {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lookout {
    /// Starts the lookout (see [`Lookout`]). At `deadline`, the window's
    /// end, it also raises the loop for the end of the trace (the end
    /// iterators, the last news) and the report, which follows in the
    /// real-time class too (see [`raise_start`]): the window's end is
    /// dated by the BPF program, but a loop at the user's priority woke up
    /// for it 1–2 s late under `examples/stackfarm --procs 200 --depth
    /// 40`, and the whole run took that much longer.
    pub fn start(
        copies: Option<Box<dyn FnMut() -> u64 + Send>>,
        news: Option<NewsWaiting>,
        deadline: Option<std::time::Instant>,
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
                    let mut lost_at: Option<std::time::Instant> = None;
                    let mut starving = Starving::default();
                    while !stop.load(Ordering::Acquire) {
                        // Parked, not asleep: the drop wakes it at once
                        // (the trace's end waits for it). The look that
                        // follows is taken all the same: past the window's
                        // end it raises the loop for the end and the
                        // report, if no look has yet.
                        std::thread::park_timeout(std::time::Duration::from_millis(10));
                        if deadline.is_some_and(|d| std::time::Instant::now() >= d)
                            && !ENDING.swap(true, Ordering::AcqRel)
                            && !(rt && set_realtime(loop_tid))
                        {
                            set_nice(loop_tid, -20);
                        }
                        let now = copies();
                        let news_late = news.as_mut().is_some_and(|waiting| {
                            late.check(waiting(), NEWS_TAKEN.load(Ordering::Acquire))
                        });
                        NEWS_LATE.store(news_late, Ordering::Release);
                        if now != last {
                            lost_at = Some(std::time::Instant::now());
                        }
                        let wanted =
                            news_late || lost_at.is_some_and(|at| at.elapsed() < LOSS_WANTS_RAISE);
                        if !wanted {
                            starving = Starving::default();
                        } else if !LOOKED_OUT.load(Ordering::Acquire) {
                            // The table builders too: the copies wait for
                            // the tables they build. They stay raised.
                            // Under the lock: a helper that ended is off
                            // the list, its tid not another thread's.
                            if let Ok(h) = HELPERS.lock() {
                                let tids: Vec<libc::pid_t> =
                                    h.1.iter().copied().chain([loop_tid]).collect();
                                if starving.check(&tids, &waited_ns)
                                    && !LOOKED_OUT.swap(true, Ordering::AcqRel)
                                {
                                    for &tid in &tids {
                                        if !(rt && set_realtime(tid)) {
                                            set_nice(tid, -20);
                                        }
                                    }
                                    REALTIME.store(rt, Ordering::Release);
                                }
                            }
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
            lower_helpers();
            if !ENDING.load(Ordering::Acquire) {
                set_normal_class(0);
            }
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

/// How long a copy lost is a reason to raise the loop (the lookout looks
/// every 10 ms whether the threads it would raise wait for a CPU).
const LOSS_WANTS_RAISE: std::time::Duration = std::time::Duration::from_millis(100);

/// How long, between two of the lookout's looks (10 ms apart), a thread it
/// would raise must have waited for a CPU (runnable, not running) for the
/// raise to be of use.
const STARVED_NS: u64 = 3_000_000;

/// How long thread `tid` of this process has waited on a run queue, in
/// ns (`/proc/self/task/TID/schedstat`; None where the kernel keeps no
/// such count, or the thread is gone). The kernel adds a wait when the
/// thread runs again: a thread that has waited since before the last look
/// and still waits is seen at the look after it runs.
fn waited_ns(tid: libc::pid_t) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the threads the lookout would raise wait for a CPU: where
/// they get one when they want it, raising them only takes it from the
/// threads traced. Read only while there is a reason to raise them.
#[derive(Default)]
struct Starving {
    /// Each thread's time waited at the last look.
    last: Vec<(libc::pid_t, u64)>,
}

impl Starving {
    /// Whether any of `tids` waited `STARVED_NS` or more since the last
    /// look (`waited` reads a thread's time waited). True where no
    /// thread's can be read: then it cannot be told, and the raise is
    /// taken as before.
    fn check(&mut self, tids: &[libc::pid_t], waited: &dyn Fn(libc::pid_t) -> Option<u64>) -> bool {
        let now: Vec<(libc::pid_t, u64)> =
            tids.iter().filter_map(|&t| Some((t, waited(t)?))).collect();
        let starved = now.iter().any(|&(t, w)| {
            self.last
                .iter()
                .find(|&&(u, _)| u == t)
                .is_some_and(|&(_, before)| w.saturating_sub(before) >= STARVED_NS)
        });
        let unknown = now.is_empty();
        self.last = now;
        starved || unknown
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
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        self.leave_realtime();
        if self.active {
            RAISED.store(false, Ordering::Release);
            // Once the window has ended, the loop stays raised for the
            // trace's end (see [`Lookout::start`]).
            if !ENDING.load(Ordering::Acquire) {
                set_this_thread(NORMAL.load(Ordering::Relaxed));
            }
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
    } else {
        join_raise();
    }
}

/// The helpers in the normal class at nice -20, as after start-up (under
/// the list's lock: one that ended is off it, see [`helper_ends`]).
fn lower_helpers() {
    if let Ok(h) = HELPERS.lock() {
        for &tid in &h.1 {
            set_normal_class(tid);
            set_nice(tid, -20);
        }
    }
}

/// For a helper thread of [`below_loader`] as it ends: off the list of
/// those raised and lowered by tid (which another thread may take next).
pub fn helper_ends() {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    if let Ok(mut h) = HELPERS.lock() {
        h.1.retain(|&t| t != me);
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
        let realtime = START_REALTIME.load(Ordering::Acquire);
        for &tid in &h.1 {
            if !(realtime && set_realtime(tid)) {
                set_nice(tid, -20);
            }
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

    /// A thread starves once it waited `STARVED_NS` for a CPU between two
    /// looks; the first look of a thread only notes its time; where no
    /// thread's time can be read, the raise is taken.
    #[test]
    fn starving_is_waiting_for_a_cpu_between_two_looks() {
        let mut s = Starving::default();
        let at = |waits: [(libc::pid_t, u64); 2]| {
            move |t: libc::pid_t| waits.iter().find(|w| w.0 == t).map(|w| w.1)
        };
        assert!(!s.check(&[1, 2], &at([(1, 0), (2, 0)])));
        assert!(!s.check(&[1, 2], &at([(1, STARVED_NS - 1), (2, 5)])));
        assert!(s.check(&[1, 2], &at([(1, STARVED_NS - 1), (2, 5 + STARVED_NS)])));
        // A thread seen for the first time: noted, not judged.
        assert!(!s.check(&[3], &at([(3, 10 * STARVED_NS), (9, 0)])));
        assert!(s.check(&[], &at([(1, 0), (2, 0)])));
        assert!(s.check(&[7], &|_| None));
    }

    /// The lookout's reading of a thread's wait for a CPU: a thread kept
    /// from its CPU by a real-time one for 30 ms waited that long. Needs
    /// the kernel's counts (schedstat) and the privilege to enter the
    /// real-time class (root, as under CI).
    #[test]
    fn a_thread_kept_from_its_cpu_is_seen_starving() {
        let ci = std::env::var_os("CI").is_some();
        // SAFETY: gettid has no preconditions.
        if waited_ns(unsafe { libc::gettid() }).is_none() {
            assert!(!ci, "no schedstat for the threads under CI");
            eprintln!("skipped: no schedstat");
            return;
        }
        let pin = || {
            // SAFETY: a CPU set of CPU 0 for the calling thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
            }
        };
        let spin = |ms: u64| {
            let end = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            while std::time::Instant::now() < end {
                std::hint::spin_loop();
            }
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        // The victim wants its CPU until told to stop (a spin of a fixed
        // length could end before a loaded machine starts the bully).
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let victim = std::thread::spawn({
            let done = done.clone();
            move || {
                assert!(pin());
                // SAFETY: as above.
                tid_tx.send(unsafe { libc::gettid() }).unwrap();
                while !done.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
            }
        });
        let tid = tid_rx.recv().unwrap();
        let mut s = Starving::default();
        // The first look notes the time waited so far.
        assert!(!s.check(&[tid], &waited_ns));
        let bully = std::thread::spawn(move || {
            if !(pin() && set_realtime(0)) {
                return false;
            }
            spin(30);
            true
        });
        let bullied = bully.join().unwrap();
        // The kernel adds a wait to the thread's count when the thread runs
        // again: seen at one of the looks that follow (10 ms apart, as the
        // lookout's), however loaded the machine.
        let seen = (0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            s.check(&[tid], &waited_ns)
        });
        done.store(true, Ordering::Release);
        if !bullied {
            victim.join().unwrap();
            assert!(!ci, "no privilege to enter the real-time class under CI");
            eprintln!("skipped: no privilege for the real-time class");
            return;
        }
        victim.join().unwrap();
        assert!(seen, "the victim was not seen waiting");
    }

    /// The policy and nice value of thread `tid` (0: the calling one).
    fn class_of(tid: libc::pid_t) -> (i32, i32) {
        // SAFETY: both read a thread's scheduling settings; errno is
        // cleared first to tell getpriority's -1 from an error.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            (libc::sched_getscheduler(tid), nice)
        }
    }

    /// Start-up's raise: the real-time class for the caller and the
    /// threads that join it, nice -20 once it leaves the class, the
    /// user's priority after; a builder started meanwhile is in the class
    /// once the load is over and at nice -20 after. Needs the privilege
    /// (root, as under CI); without it the raise does nothing, and the
    /// test says so and fails under CI.
    #[test]
    fn start_up_runs_in_the_real_time_class_and_leaves_it() {
        // On a thread of its own, which ends with what it changed.
        std::thread::spawn(|| {
            let mut raised = raise_start();
            if !raised.realtime {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "no privilege to enter the real-time class under CI"
                );
                eprintln!("skipped: no privilege to enter the real-time class");
                return;
            }
            assert_eq!(class_of(0).0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK);
            // A loader thread joins it; a builder started during the
            // load is below it, and joins it once the load is over.
            let loader = std::thread::spawn(|| {
                let started = class_of(0).0;
                join_raise();
                (started, class_of(0).0)
            });
            assert_eq!(
                loader.join().unwrap(),
                (
                    libc::SCHED_OTHER,
                    libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK
                )
            );
            loading(true);
            let (tx, rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let builder = std::thread::spawn(move || {
                below_loader();
                // SAFETY: gettid has no preconditions.
                tx.send((unsafe { libc::gettid() }, class_of(0))).unwrap();
                let _ = done_rx.recv();
            });
            let (tid, during_load) = rx.recv().unwrap();
            assert_eq!(during_load, (libc::SCHED_OTHER, HELPER_NICE));
            loading(false);
            assert_eq!(
                class_of(tid).0,
                libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK
            );
            raised.leave_realtime();
            assert_eq!(class_of(0), (libc::SCHED_OTHER, -20));
            assert_eq!(class_of(tid), (libc::SCHED_OTHER, -20));
            drop(raised);
            assert_eq!(
                class_of(0),
                (libc::SCHED_OTHER, NORMAL.load(Ordering::Relaxed))
            );
            done_tx.send(()).unwrap();
            builder.join().unwrap();
            if let Ok(mut h) = HELPERS.lock() {
                h.1.retain(|&t| t != tid);
            }
        })
        .join()
        .unwrap();
    }
}
