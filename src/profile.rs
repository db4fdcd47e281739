//! The measured profile: symbolized, merged stacks with their blocked time.
//!
//! Everything here is pure data; [`build`] is the one step that turns what
//! the kernel recorded ([`RawProfile`]) into it.

use std::sync::Arc;

use crate::raw::LossCounters;
pub use crate::raw::OffState;

mod from_raw;
mod merge;
mod sources;

pub use from_raw::{build, build_each, kernel_addrs};
use merge::samples_by_name;
pub use sources::{FrameSource, MappedFrames, NameSource, Names, UserStack};

/// The user or the kernel part of a stack.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// No frames by nature or by request: a kernel thread's user stack,
    /// or a part that `-U`/`-K` left out.
    Absent,
    /// The stack was lost (stack storage full, or the walk failed).
    Missed,
    /// Frames, innermost (most recent) first.
    Frames(Arc<[Frame]>),
}

/// What a frame's address is an address in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// Nothing known: outside every mapping of its process, or a frame
    /// made up for a profile without addresses.
    #[default]
    Unknown,
    /// The kernel: the address is a kernel address.
    Kernel,
    /// A file, by index into [`Profile::objects`]: the address is an
    /// offset into the file, the same in every process that maps it.
    Object(u32),
    /// A function of a language runtime (see [`crate::runtime`]): the
    /// "address" is the line it was at (0 where unknown), its source file
    /// is [`FrameInfo::file`].
    Runtime(crate::runtime::Kind),
}

/// One frame of a stack: the function's name as the outputs show it, and
/// where it came from (see [`FrameInfo`]). Shared: the frames of one
/// address are made once, and every stack that has them holds them, so a
/// frame costs a stack a pointer (a large profile's stacks hold many
/// times more frames than there are distinct ones: see BENCHMARKS.md,
/// report time and peak RSS).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frame(Arc<FrameInfo>);

/// What a [`Frame`] is. Functions inlined at an address are frames of
/// their own with the same address and origin, `inlined` on all but the
/// outermost.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameInfo {
    /// Shared by every frame with this name.
    pub name: Arc<str>,
    pub addr: u64,
    pub origin: Origin,
    /// Inlined into the next (outer) frame, at the same address.
    pub inlined: bool,
    /// The frame as the text outputs (folded, report, flame graph,
    /// speedscope) show it, where that is more than its name: with `-s`,
    /// `read+0x15/0x90 [libc.so.6]`; with `--addresses`, the address
    /// first, `0x7f3a5c1147e2:read`. pprof, which has addresses and files
    /// of its own, keeps the bare name.
    pub shown: Option<Box<str>>,
    /// A runtime frame's source file (pprof and speedscope carry it).
    pub file: Option<Arc<str>>,
}

impl Frame {
    pub fn new(info: FrameInfo) -> Frame {
        Frame(Arc::new(info))
    }

    /// A frame known by its name only.
    pub fn named(name: impl Into<Arc<str>>) -> Frame {
        Frame::new(FrameInfo::named(name))
    }

    /// The same frame, by its address in memory: equal for clones.
    pub fn identity(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

impl FrameInfo {
    /// A frame known by its name only.
    pub fn named(name: impl Into<Arc<str>>) -> FrameInfo {
        FrameInfo {
            name: name.into(),
            addr: 0,
            origin: Origin::Unknown,
            inlined: false,
            shown: None,
            file: None,
        }
    }

    /// The frame as the text outputs show it (see [`FrameInfo::shown`]).
    pub fn text(&self) -> &str {
        self.shown.as_deref().unwrap_or(&self.name)
    }
}

impl std::ops::Deref for Frame {
    type Target = FrameInfo;
    fn deref(&self) -> &FrameInfo {
        &self.0
    }
}

/// Changing a frame changes this stack's copy only.
impl std::ops::DerefMut for Frame {
    fn deref_mut(&mut self) -> &mut FrameInfo {
        Arc::make_mut(&mut self.0)
    }
}

/// A frame reads as its function name wherever a name is wanted (the
/// frame rules: profiler frames, interrupt entries).
impl std::ops::Deref for FrameInfo {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

pub use crate::container::Container;
pub use crate::process::ObjectInfo;

/// Blocked time of one thread in one distinct pair of stacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub comm: String,
    pub tgid: u32,
    pub pid: u32,
    /// The thread's name in its runtime, where it has one longer than the
    /// kernel's 15 characters (a JVM's Java thread name).
    pub thread: Option<Arc<str>>,
    pub user: Part,
    pub kernel: Part,
    /// Why the thread was off the CPU (`--states`); None without it.
    pub state: Option<OffState>,
    /// Who ended the block (`--wakers`); None without it.
    pub waker: Option<Waker>,
    /// The process's cgroup and container, as seen at its first block;
    /// None where it could not be read.
    pub container: Option<Arc<Container>>,
    pub total_ns: u64,
    pub count: u64,
}

/// Who ended a block (`--wakers`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Waker {
    /// A task, with its stacks in its own context at the wake-up.
    Task {
        comm: String,
        pid: u32,
        user: Part,
        kernel: Part,
    },
    /// An interrupt (a timer, a device): its kernel frames, up to where
    /// it entered. The task it interrupted did not wake anybody.
    Interrupt { kernel: Part },
    /// A softirq (timers, network receive), run on the way out of an
    /// interrupt, by `ksoftirqd` or where a task re-enabled them: its
    /// kernel frames, up to where softirqs were run.
    Softirq { kernel: Part },
    /// No wake-up: the thread was preempted, runnable all along.
    Preempted,
    /// Not woken: still blocked when tracing ended.
    NotWoken,
    /// The wake-up was not seen (it came before tracing started).
    Unseen,
    /// Lost: the table of wakers was full.
    Missed,
    /// `--chains`: the block's wait followed down the chain of threads
    /// that ended it: the frames after the block's own, innermost
    /// (deepest) first, each hop's command and stacks after a `--` frame,
    /// ending in a source that is no thread (`[timer]`, ...), `[running]`
    /// or a blocked stack. The outputs show them as frames beyond the
    /// block's ([`crate::shape::leaf_first`]).
    Chain { frames: Part },
}

impl Waker {
    /// The name the waker stands under, as its command does for a task.
    pub fn name(&self) -> &str {
        match self {
            Waker::Task { comm, .. } => comm,
            Waker::Interrupt { .. } => "[interrupt]",
            Waker::Softirq { .. } => "[softirq]",
            Waker::Preempted => "[preempted]",
            Waker::NotWoken => "[not woken]",
            Waker::Unseen => "[unknown waker]",
            Waker::Missed => "[Missed Waker]",
            Waker::Chain { .. } => "[chain]",
        }
    }

    /// The waker's user and kernel parts (absent for the kinds that have
    /// no stacks, and for a chain, whose frames are the block's).
    pub fn parts(&self) -> (&Part, &Part) {
        match self {
            Waker::Task { user, kernel, .. } => (user, kernel),
            Waker::Interrupt { kernel } | Waker::Softirq { kernel } => (&Part::Absent, kernel),
            _ => (&Part::Absent, &Part::Absent),
        }
    }

    /// The waker with `f` applied to each of its parts.
    pub fn map_parts(&self, mut f: impl FnMut(&Part) -> Part) -> Waker {
        match self {
            Waker::Task {
                comm,
                pid,
                user,
                kernel,
            } => Waker::Task {
                comm: comm.clone(),
                pid: *pid,
                user: f(user),
                kernel: f(kernel),
            },
            Waker::Interrupt { kernel } => Waker::Interrupt { kernel: f(kernel) },
            Waker::Softirq { kernel } => Waker::Softirq { kernel: f(kernel) },
            Waker::Chain { frames } => Waker::Chain { frames: f(frames) },
            other => other.clone(),
        }
    }

    /// `--chains`: the frames beyond the block's own, innermost first.
    pub fn chain(&self) -> Option<&Part> {
        match self {
            Waker::Chain { frames } => Some(frames),
            _ => None,
        }
    }

    /// A task's waker from its stacks: an interrupt or a softirq, where
    /// its kernel frames (innermost first) went through the entry of one,
    /// cut there; else the task.
    pub fn classify(comm: String, pid: u32, user: Part, kernel: Part) -> Waker {
        if let Part::Frames(frames) = &kernel {
            for (i, f) in frames.iter().enumerate() {
                let cut = || Part::Frames(frames[..=i].into());
                if is_softirq_frame(f) {
                    return Waker::Softirq { kernel: cut() };
                }
                if is_interrupt_entry_frame(f) {
                    return Waker::Interrupt { kernel: cut() };
                }
            }
        }
        Waker::Task {
            comm,
            pid,
            user,
            kernel,
        }
    }
}

/// Where softirqs are run (`__do_softirq` before 6.3).
fn is_softirq_frame(name: &str) -> bool {
    name == "handle_softirqs" || name == "__do_softirq"
}

/// The entry of a hardware interrupt on x86-64: the `asm_` stub of a
/// system vector or of a device interrupt (not of an exception: a page
/// fault runs in its task's context).
fn is_interrupt_entry_frame(name: &str) -> bool {
    name.starts_with("asm_sysvec_")
        || name == "asm_common_interrupt"
        || name == "asm_spurious_interrupt"
}

impl Sample {
    /// The thread's name: its runtime's (see [`Sample::thread`]), or the
    /// kernel's.
    pub fn thread_name(&self) -> &str {
        self.thread.as_deref().unwrap_or(&self.comm)
    }

    /// Total blocked time in microseconds, rounded to the nearest.
    pub fn total_us(&self) -> u64 {
        ns_to_us(self.total_ns)
    }
}

pub fn ns_to_us(ns: u64) -> u64 {
    (ns + 500) / 1000
}

/// Which parts of the stacks are shown (`-U`, `-K`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackMode {
    #[default]
    Both,
    UserOnly,
    KernelOnly,
}

impl StackMode {
    pub fn user(self) -> bool {
        self != StackMode::KernelOnly
    }
    pub fn kernel(self) -> bool {
        self != StackMode::UserOnly
    }
}

#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub samples: Vec<Sample>,
    pub counters: LossCounters,
    /// The files [`Origin::Object`] frames are in.
    pub objects: Vec<ObjectInfo>,
    /// The window traced, where known.
    pub window: Option<Window>,
    /// `--graph`: who waited for whom (see [`crate::chains`]).
    pub graph: Option<Arc<WaitGraph>>,
}

/// `--graph`: the wait-for graph of the window. A node is a thread (or the
/// threads of one name, where they are many) or a source that is no thread
/// (`[timer]`, `[disk]`, ...); an edge from a node to another holds the
/// time the first waited for the second, down the chains (a client that
/// waited for a worker that waited for a producer waited for both).
#[derive(Clone, Debug, Default)]
pub struct WaitGraph {
    pub nodes: Vec<WaitNode>,
    /// (from, to, ns), heaviest first.
    pub edges: Vec<(usize, usize, u64)>,
    /// The edges that count for the knots: at least this long.
    pub min_edge_ns: u64,
    /// Its knots (sets of nodes that wait only for each other, if for
    /// anyone, and that others wait for), heaviest first.
    pub knots: Vec<Knot>,
    pub window_ns: u64,
}

#[derive(Clone, Debug, Default)]
pub struct WaitNode {
    /// `comm (tid)`, `comm (N threads)`, or the source's name.
    pub name: String,
    /// A source that is no thread.
    pub pseudo: bool,
    /// Time the chains end at this node: a thread running, waiting for a
    /// CPU or blocked where it is not followed further; for a source, the
    /// waits it ended.
    pub own_ns: u64,
    /// What most of that time was: `[running]`, or the function a thread
    /// was blocked in; for a source, the thread and function waiting on
    /// it the longest.
    pub what: String,
}

/// A knot: nodes that wait for nobody outside it (edges of at least
/// [`WaitGraph::min_edge_ns`]), wPerf's bottleneck.
#[derive(Clone, Debug, Default)]
pub struct Knot {
    pub nodes: Vec<usize>,
    /// The time other nodes' chains waited on it.
    pub waited_ns: u64,
}

/// When the trace was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Its start, in nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
}

impl Window {
    /// The window of CLOCK_MONOTONIC times `start..end`, dated by the
    /// wall clock now.
    pub fn from_monotonic(start: u64, end: u64) -> Window {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid pointer to a timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let mono_now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        let wall_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Window {
            start_unix_ns: wall_now.saturating_sub(mono_now.saturating_sub(start)),
            duration_ns: end.saturating_sub(start),
        }
    }
}

impl Profile {
    /// Stacks that could not be shown (bcc's "stack traces could not be
    /// displayed"): samples with a missed part that the mode shows.
    pub fn missed_stacks(&self, mode: StackMode) -> usize {
        // Merged by name as the text outputs show them; only the samples
        // with a missed part (merging never joins one with a sample
        // without: their parts differ), not the whole profile again.
        samples_by_name(self.samples.iter().filter(|s| {
            (mode.user() && s.user == Part::Missed) || (mode.kernel() && s.kernel == Part::Missed)
        }))
        .len()
    }

    pub fn total_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.total_ns).sum()
    }

    /// The samples of off-CPU time: all but `--on-cpu`'s running time.
    pub fn off_cpu(&self) -> impl Iterator<Item = &Sample> {
        self.samples
            .iter()
            .filter(|s| s.state != Some(OffState::Running))
    }

    /// `--on-cpu`: the samples of running time.
    pub fn running(&self) -> impl Iterator<Item = &Sample> {
        self.samples
            .iter()
            .filter(|s| s.state == Some(OffState::Running))
    }

    /// The profile with frames reduced to their names, and the samples of
    /// a thread that then look alike merged: what the text outputs show,
    /// where two call sites in one function are one frame.
    pub fn by_name(&self) -> Profile {
        Profile {
            samples: samples_by_name(self.samples.iter()),
            counters: self.counters.clone(),
            objects: Vec::new(),
            window: self.window,
            graph: self.graph.clone(),
        }
    }
}

/// Frames the profiler itself adds on top of a kernel stack when the stack
/// is taken from inside the tracepoint.  Dropped, so that kernel stacks
/// start at the scheduler.
pub fn is_profiler_frame(name: &str) -> bool {
    name.starts_with("bpf_prog_")
        || name.starts_with("bpf_trace_run")
        || name.starts_with("__bpf_trace_")
        || name.starts_with("__traceiter_")
        || name.starts_with("bpf_trampoline_")
        || name.starts_with("__bpf_prog_enter")
        || name.starts_with("__bpf_prog_exit")
}

/// How many of a kernel stack's innermost frames (`names`, innermost
/// first) are the profiler's: those up to the outermost one named as the
/// profiler's among the first few. The program's own frame is named
/// `bpf_prog_...` only where kallsyms listed it when it was read (a list
/// read while programs were being freed can skip some): otherwise it takes
/// the name of whatever symbol precedes its address, and the frames the
/// tracepoint adds (`bpf_trace_run4`, ...) come after it.
pub fn profiler_frames<'a>(names: impl IntoIterator<Item = &'a str>) -> usize {
    names
        .into_iter()
        .take(PROFILER_FRAMES_MAX)
        .collect::<Vec<_>>()
        .iter()
        .rposition(|n| is_profiler_frame(n))
        .map_or(0, |i| i + 1)
}

/// At most this many frames of the profiler's on top of a kernel stack
/// (the program, its subprogram, the tracepoint's runner and iterator).
const PROFILER_FRAMES_MAX: usize = 6;

/// The frame of `--on-cpu` running time that no sample caught.
pub const NOT_SAMPLED: &str = "[not sampled]";

/// A total order, so that output is stable: by time, then by identity.
pub fn sort_samples(samples: &mut [Sample]) {
    samples.sort_by(|a, b| {
        a.total_ns
            .cmp(&b.total_ns)
            .then_with(|| a.comm.cmp(&b.comm))
            .then_with(|| a.pid.cmp(&b.pid))
            .then_with(|| a.user.cmp(&b.user))
            .then_with(|| a.kernel.cmp(&b.kernel))
            .then_with(|| a.state.cmp(&b.state))
            .then_with(|| a.waker.cmp(&b.waker))
    });
}
