//! The measured profile: symbolized, merged stacks with their blocked time.
//!
//! Everything here is pure data; [`build`] is the one step that turns what
//! the kernel recorded ([`RawProfile`]) into it.

use std::sync::Arc;

use crate::process::registry::StackFrames;
use crate::process::Proc;
use crate::process::Registry;
pub use crate::raw::OffState;
use crate::raw::{LossCounters, RawProfile, StackRef, WakerRef};
use crate::symbolize::{AddrKind, Named, Symbolizer, UserFrame};

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
    /// A Python function: the "address" is the line it was at (0 where
    /// unknown), its source file is [`FrameInfo::file`].
    Python,
}

/// One frame of a stack: the function's name as the outputs show it, and
/// where it came from (see [`FrameInfo`]). Shared: the frames of one
/// address are made once, and every stack that has them holds them, so a
/// frame costs a stack a pointer (a profile of 100,000 stacks holds
/// millions of frames).
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
    /// A Python frame's source file (pprof and speedscope carry it).
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
        }
    }

    /// The waker's user and kernel parts (absent for the kinds that have
    /// no stacks).
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
            other => other.clone(),
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
        }
    }
}

/// `samples` with frames reduced to their names, merged where they then
/// look alike (see [`Profile::by_name`]).
fn samples_by_name<'a>(samples: impl Iterator<Item = &'a Sample>) -> Vec<Sample> {
    let samples: Vec<&Sample> = samples.collect();
    let mut merger = Merger::with_capacity(samples.len());
    // Each distinct part and frame reduced once: samples share their
    // parts, parts their frames (the samples, borrowed all along, keep
    // the addresses apart).
    let mut frames: ahash::AHashMap<usize, Frame> = ahash::AHashMap::new();
    let mut reduce = |f: &[Frame]| -> Part {
        Part::Frames(
            f.iter()
                .map(|f| {
                    frames
                        .entry(f.identity())
                        .or_insert_with(|| {
                            Frame::new(FrameInfo {
                                shown: f.shown.clone(),
                                ..FrameInfo::named(f.name.clone())
                            })
                        })
                        .clone()
                })
                .collect(),
        )
    };
    let mut named: ahash::AHashMap<usize, u32> = ahash::AHashMap::new();
    let mut number =
        |merger: &mut Merger, p: &Part, reduce: &mut dyn FnMut(&[Frame]) -> Part| match p {
            Part::Frames(f) => *named
                .entry(Arc::as_ptr(f) as *const Frame as usize)
                .or_insert_with(|| merger.part(reduce(f))),
            other => merger.part(other.clone()),
        };
    for s in samples {
        let user = number(&mut merger, &s.user, &mut reduce);
        let kernel = number(&mut merger, &s.kernel, &mut reduce);
        let waker = s.waker.as_ref().map(|w| {
            let reduced = w.map_parts(|p| match p {
                Part::Frames(f) => reduce(f),
                other => other.clone(),
            });
            merger.waker(reduced)
        });
        let container = merger.container(s.container.as_ref());
        merger.add(
            (
                s.tgid, s.pid, &s.comm, user, kernel, s.state, waker, container,
            ),
            s.total_ns,
            s.count,
        );
    }
    merger.samples()
}

/// The user stacks of a profile as numbers of their distinct frames, all
/// in one buffer.
struct UserStacks {
    /// Each stack of each process, and where the numbers of its frames
    /// are: start and length.
    list: Vec<(Proc, u64, usize, usize)>,
    numbers: Vec<u32>,
    /// The user stack of each entry, then of each waker (in the order of
    /// `RawProfile::wakers`), by its place in `list`; [`UserStacks::NONE`]
    /// for none stored.
    of: Vec<u32>,
}

impl UserStacks {
    const NONE: u32 = u32::MAX;
}

/// The numbers of the addresses of one process's stacks (see [`build`]):
/// the last found in each of a few hundred slots, before a hash map. The
/// slots are made only for a process with many return addresses: a trace
/// of many small processes does not pay 8 KiB each.
struct Known {
    recent: Box<[(u64, u32)]>,
    ips: ahash::AHashMap<u64, u32>,
    returns: ahash::AHashMap<u64, u32>,
}

impl Known {
    const SLOTS: usize = 512;
    /// Return addresses a process has before it gets the slots.
    const SLOTS_FROM: usize = 256;
    /// A slot that holds nothing: no frame has this number.
    const EMPTY: u32 = u32::MAX;

    fn new() -> Known {
        Known {
            recent: Box::default(),
            ips: ahash::AHashMap::new(),
            returns: ahash::AHashMap::new(),
        }
    }

    /// The number of address `addr` of kind `kind`: `find`'s, the first
    /// time.
    fn number(&mut self, addr: u64, kind: AddrKind, find: impl FnOnce() -> u32) -> u32 {
        if kind == AddrKind::Ip {
            return *self.ips.entry(addr).or_insert_with(find);
        }
        if self.recent.is_empty() {
            if self.returns.len() < Self::SLOTS_FROM {
                return *self.returns.entry(addr).or_insert_with(find);
            }
            self.recent = vec![(0, Self::EMPTY); Self::SLOTS].into_boxed_slice();
        }
        let slot = &mut self.recent[((addr ^ (addr >> 9)) as usize) % Self::SLOTS];
        if slot.1 != Self::EMPTY && slot.0 == addr {
            return slot.1;
        }
        let n = *self.returns.entry(addr).or_insert_with(find);
        *slot = (addr, n);
        n
    }
}

fn part_addrs(r: StackRef, stacks: &crate::raw::Stacks) -> Option<&[u64]> {
    match r {
        StackRef::Id(id) => stacks.get(&id),
        _ => None,
    }
}

fn kinds(frames: &[u64], first_is_ip: bool) -> impl Iterator<Item = (u64, AddrKind)> + '_ {
    frames.iter().enumerate().map(move |(i, &a)| {
        (
            a,
            if i == 0 && first_is_ip {
                AddrKind::Ip
            } else {
                AddrKind::Return
            },
        )
    })
}

/// What each frame of a user stack is, frame after frame: the instruction
/// pointer, then return addresses, except that after a signal frame the
/// interrupted code's pc is an instruction pointer again (see
/// [`UserFrame::Signal`]).
struct UserKinds {
    ip: bool,
}

impl UserKinds {
    fn new() -> UserKinds {
        UserKinds { ip: true }
    }

    /// The kind of the next frame, given whether it is a signal frame.
    fn next(&mut self, signal: bool) -> AddrKind {
        let kind = if self.ip {
            AddrKind::Ip
        } else {
            AddrKind::Return
        };
        self.ip = signal;
        kind
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

/// Symbolizes and merges what the kernel recorded.
pub fn build(
    raw: &RawProfile,
    reg: &mut Registry,
    sym: &Symbolizer,
    kernel_first_is_ip: bool,
) -> Profile {
    // Kernel frames, all at once.
    let mut kaddrs = Vec::new();
    let mut kernel_ids = ahash::AHashSet::new();
    for e in &raw.entries {
        if !kernel_ids.insert(e.kernel_stack) {
            continue;
        }
        if let Some(f) = part_addrs(e.kernel_stack, &raw.stacks) {
            kaddrs.extend(kinds(f, kernel_first_is_ip));
        }
    }
    // The wakers' kernel stacks are taken in a tracepoint: return
    // addresses only.
    for w in raw.wakers.values() {
        if let Some(f) = part_addrs(w.kernel_stack, &raw.stacks) {
            kaddrs.extend(kinds(f, false));
        }
    }
    let knames = sym.kernel(&kaddrs);

    // User frames: each stack as frames of objects (through the snapshot
    // of its process, or as kept when the process exited), then all named
    // object by object. A stack holds its frames by number: each distinct
    // (frame, kind) is looked up once here, and named and placed once.
    let mut user_stacks = UserStacks {
        list: Vec::new(),
        numbers: Vec::new(),
        of: vec![UserStacks::NONE; raw.entries.len() + raw.wakers.len()],
    };
    let mut distinct: Vec<(UserFrame, AddrKind)> = Vec::new();
    {
        let mut numbers: ahash::AHashMap<(UserFrame, AddrKind), u32> = ahash::AHashMap::new();
        let mut number = |fk: (UserFrame, AddrKind)| {
            *numbers.entry(fk).or_insert_with(|| {
                distinct.push(fk);
                (distinct.len() - 1) as u32
            })
        };
        // The number of each address of a process, found once: a
        // process's stacks have a few thousand addresses between them,
        // and 100,000 stacks of 45 frames millions.
        let mut by_address: ahash::AHashMap<Proc, Known> = ahash::AHashMap::new();
        // Each stack of each process once, in the order the stacks are
        // stored: tens of megabytes of frames read front to back rather
        // than in the order of the counts.
        // Each user stack an entry or a waker has, with where it is had:
        // entry `i` at `i`, the `j`th waker after the entries.
        let mut order: Vec<((usize, usize), Proc, u64, usize)> = raw
            .entries
            .iter()
            .map(|e| (e.tgid, e.start, e.user_stack))
            .chain(raw.wakers.values().map(|w| (w.tgid, w.start, w.user_stack)))
            .enumerate()
            .filter_map(|(at, (tgid, start, r))| match r {
                StackRef::Id(id) => Some((raw.stacks.span(&id)?, Proc { tgid, start }, id, at)),
                _ => None,
            })
            .collect();
        order.sort_unstable();
        let mut last = None;
        for (span, proc, id, had) in order {
            if last == Some((proc, id)) {
                user_stacks.of[had] = (user_stacks.list.len() - 1) as u32;
                continue;
            }
            last = Some((proc, id));
            user_stacks.of[had] = user_stacks.list.len() as u32;
            let addrs = raw.stacks.at(span);
            let at = user_stacks.numbers.len();
            if addrs.iter().any(|&a| crate::process::is_python_word(a)) {
                // Python frames in place of the interpreter's: frames
                // made stack by stack.
                let frames = reg.user_frames(proc, id, addrs);
                let mut kinds = UserKinds::new();
                user_stacks.numbers.extend(
                    frames
                        .iter()
                        .map(|&f| number((f, kinds.next(f == UserFrame::Signal)))),
                );
            } else {
                match reg.user_stack(proc, id) {
                    StackFrames::Kept(frames) => {
                        let mut kinds = UserKinds::new();
                        user_stacks.numbers.extend(
                            frames
                                .iter()
                                .map(|&f| number((f, kinds.next(f == UserFrame::Signal)))),
                        )
                    }
                    StackFrames::Mapped(mappings) => {
                        let known = by_address.entry(proc).or_insert_with(Known::new);
                        let mut kinds = UserKinds::new();
                        user_stacks.numbers.extend(addrs.iter().map(|&a| {
                            let k = kinds.next(a == crate::unwind_table::SIGNAL_FRAME);
                            known.number(a, k, || number((mappings.frame(a), k)))
                        }));
                    }
                }
            }
            let len = user_stacks.numbers.len() - at;
            user_stacks.list.push((proc, id, at, len));
        }
    }
    let unames = sym.user_names(reg, &distinct);

    // The files user frames are in, each once, numbered as the profile
    // lists them.
    let mut objects = Vec::new();
    let mut object_index: ahash::AHashMap<u32, u32> = ahash::AHashMap::new();
    for &(f, _) in &distinct {
        if let UserFrame::File { object, .. } = f {
            object_index.entry(object).or_insert_with(|| {
                objects.push(reg.object_info(object));
                (objects.len() - 1) as u32
            });
        }
    }
    // Where a user frame is: the offset in its file, or its address; a
    // signal frame is nowhere (a frame known by its name only).
    let place = |f: UserFrame| match f {
        UserFrame::File { object, offset } => (offset, Origin::Object(object_index[&object]), None),
        UserFrame::Unmapped(a) => (a, Origin::Unknown, None),
        UserFrame::Python { code, instr } => match reg.python_code(code) {
            Some(c) => (
                c.line(instr).map_or(0, u64::from),
                Origin::Python,
                Some(Arc::<str>::from(c.filename.as_str())),
            ),
            None => (0, Origin::Unknown, None),
        },
        UserFrame::Signal | UserFrame::PythonUnreadable | UserFrame::PythonCutShort => {
            (0, Origin::Unknown, None)
        }
    };
    // The frames of one address: functions inlined there, innermost
    // first, then the function itself.
    // `at`: the address as `--addresses` shows it (a user frame's in its
    // process, where `addr` is the offset in its file); None for a frame
    // that has none (a signal frame).
    let addresses = sym.options().addresses;
    let frames_at =
        |names: Vec<Named>, addr: u64, at: Option<u64>, origin: Origin, file: Option<Arc<str>>| {
            let last = names.len().saturating_sub(1);
            names.into_iter().enumerate().map(move |(i, n)| {
                let shown = if let (true, Some(at)) = (addresses, at) {
                    Some(format!("{at:#x}:{}", n.text()).into_boxed_str())
                } else {
                    n.shown.map(String::into_boxed_str)
                };
                Frame::new(FrameInfo {
                    name: n.name,
                    addr,
                    origin,
                    inlined: i < last,
                    shown,
                    file: file.clone(),
                })
            })
        };
    let unknown = || {
        vec![Named {
            name: "[unknown]".into(),
            shown: None,
        }]
    };

    let mut merger = Merger::with_capacity(raw.entries.len());
    // Each distinct part is made and numbered once, and shared (an `Arc`)
    // by every sample that has it: 100,000 samples of 30 frames each were
    // most of the report's time and memory when each had frames of its
    // own.
    let user_names =
        |f: UserFrame, k: AddrKind| unames.get(&(f, k)).cloned().unwrap_or_else(unknown);
    // The frames of each distinct user address, made once: the same in
    // every stack and process that has it, except where `--addresses`
    // shows the address in the process, or a perf map names JIT code.
    // All in one vector: the frames of distinct user address `n` are
    // `placed[spans[n]]`, and `words` their [`frame_word`]s.
    let mut placed: Vec<Frame> = Vec::new();
    let mut placed_words: Vec<u64> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    if !addresses {
        spans.reserve(distinct.len());
        for &(f, k) in &distinct {
            let (addr, origin, file) = place(f);
            let at = placed.len();
            placed.extend(frames_at(user_names(f, k), addr, None, origin, file));
            spans.push((at, placed.len() - at));
        }
        placed_words.extend(placed.iter().map(|f| frame_word(f)));
    }
    // Each user part made and numbered (see [`Merger::part`]; the part
    // itself is the merger's), in the order its frames were numbered.
    let mut user_parts: Vec<u32> = Vec::with_capacity(user_stacks.list.len());
    // The frames of the part being made, moved into it.
    let mut scratch: Vec<Frame> = Vec::new();
    let mut scratch_words: Vec<u64> = Vec::new();
    let jit_anywhere = reg.has_perf_maps();
    for &(proc, id, at, len) in &user_stacks.list {
        let numbers = &user_stacks.numbers[at..at + len];
        let jit = jit_anywhere && reg.perf_map(proc).is_some();
        let n = if !jit && !addresses {
            // Frames made before, and what each adds to the part's hash.
            for &n in numbers {
                let (at, len) = spans[n as usize];
                scratch.extend_from_slice(&placed[at..at + len]);
                scratch_words.extend_from_slice(&placed_words[at..at + len]);
            }
            let part = Part::Frames(scratch.drain(..).collect());
            let n = merger.part_words(part, &scratch_words);
            scratch_words.clear();
            n
        } else {
            let addrs = raw.stacks.get(&id).unwrap_or(&[]);
            for (i, &n) in numbers.iter().enumerate() {
                let (f, k) = distinct[n as usize];
                let at = addrs.get(i).copied().unwrap_or(0);
                let shown_at = (f != UserFrame::Signal).then_some(at);
                // JIT code: named by its runtime's perf map.
                let jitted = jit.then(|| sym.jit_name(reg, proc, f, at, k)).flatten();
                match jitted {
                    None if !addresses => {
                        let (at, len) = spans[n as usize];
                        scratch.extend_from_slice(&placed[at..at + len]);
                    }
                    _ => {
                        let (addr, origin, file) = place(f);
                        let names = jitted.map_or_else(|| user_names(f, k), |n| vec![n]);
                        scratch.extend(frames_at(names, addr, shown_at, origin, file));
                    }
                }
            }
            merger.part(Part::Frames(scratch.drain(..).collect()))
        };
        user_parts.push(n);
    }
    let UserStacks { of, .. } = user_stacks;
    // The user part of what is had at `had` (see [`UserStacks::of`]).
    let user_part = |merger: &mut Merger, had: usize, r: StackRef| match r {
        StackRef::Id(_) => match of.get(had).copied().unwrap_or(UserStacks::NONE) {
            // A stack the counts name but that was not stored.
            UserStacks::NONE => merger.part(Part::Missed),
            n => user_parts[n as usize],
        },
        _ => frameless(merger, r),
    };
    // Where each waker's user stack is had.
    let waker_at: ahash::AHashMap<u64, usize> = raw
        .wakers
        .keys()
        .enumerate()
        .map(|(j, &id)| (id, raw.entries.len() + j))
        .collect();
    let mut kernel_parts: ahash::AHashMap<(u64, bool), u32> = ahash::AHashMap::new();
    let mut kernel_part = |merger: &mut Merger, r: StackRef, first_is_ip: bool| match r {
        StackRef::Id(id) => *kernel_parts.entry((id, first_is_ip)).or_insert_with(|| {
            let part = match raw.stacks.get(&id) {
                None => Part::Missed,
                Some(frames) => {
                    // An address can be several frames: functions
                    // inlined there, innermost first.
                    let mut named: Vec<Frame> = kinds(frames, first_is_ip)
                        .flat_map(|k| {
                            let names = knames.get(&k).cloned().unwrap_or_else(unknown);
                            frames_at(names, k.0, Some(k.0), Origin::Kernel, None)
                        })
                        .collect();
                    let ours = profiler_frames(named.iter().map(|f| f.text()));
                    named.drain(..ours);
                    Part::Frames(named.into())
                }
            };
            merger.part(part)
        }),
        _ => frameless(merger, r),
    };

    let mut wakers: ahash::AHashMap<u64, u32> = ahash::AHashMap::new();
    for (i, e) in raw.entries.iter().enumerate() {
        let user = user_part(&mut merger, i, e.user_stack);
        let kernel = kernel_part(&mut merger, e.kernel_stack, kernel_first_is_ip);
        let waker = e.waker.map(|w| match w {
            WakerRef::Preempted => merger.waker(Waker::Preempted),
            WakerRef::NotWoken => merger.waker(Waker::NotWoken),
            WakerRef::Unseen => merger.waker(Waker::Unseen),
            WakerRef::MissedFull => merger.waker(Waker::Missed),
            WakerRef::Id(id) => match raw.wakers.get(&id) {
                None => merger.waker(Waker::Missed),
                Some(w) => match wakers.get(&id) {
                    Some(&n) => n,
                    None => {
                        let at = waker_at.get(&id).copied().unwrap_or(usize::MAX);
                        let user = user_part(&mut merger, at, w.user_stack);
                        let kernel = kernel_part(&mut merger, w.kernel_stack, false);
                        let (user, kernel) = (merger.part_of(user), merger.part_of(kernel));
                        let n = merger.waker(Waker::classify(w.comm.clone(), w.pid, user, kernel));
                        wakers.insert(id, n);
                        n
                    }
                },
            },
        });
        let container = merger.container(
            reg.container(Proc {
                tgid: e.tgid,
                start: e.start,
            })
            .as_ref(),
        );
        merger.add(
            (
                e.tgid, e.pid, &e.comm, user, kernel, e.state, waker, container,
            ),
            e.total_ns,
            e.count,
        );
    }
    let samples = merger.samples();
    Profile {
        samples,
        counters: raw.counters.clone(),
        objects,
        window: None,
    }
}

/// The frame of `--on-cpu` running time that no sample caught.
pub const NOT_SAMPLED: &str = "[not sampled]";

/// The number of the part a reference without frames stands for: none by
/// nature or request, or lost.
fn frameless(merger: &mut Merger, r: StackRef) -> u32 {
    merger.part(match r {
        StackRef::None => Part::Absent,
        StackRef::NotSampled => Part::Frames(Arc::new([Frame::named(NOT_SAMPLED)])),
        _ => Part::Missed,
    })
}

/// Blocked time (ns, blocks) summed by what makes a sample: process,
/// thread, command, stacks, state and waker. Parts and wakers are
/// numbered as they are made ([`Merger::part`], [`Merger::waker`]) and
/// compared by number: each distinct part is hashed once, not once per
/// sample.
struct Merger<'a> {
    parts: Parts,
    wakers: ahash::AHashMap<WakerKey, u32>,
    waker_list: Vec<Waker>,
    /// By address: equal containers are one `Arc` (the registry's).
    containers: ahash::AHashMap<usize, u32>,
    container_list: Vec<Arc<Container>>,
    sums: ahash::AHashMap<SumKey<'a>, (u64, u64)>,
}

/// A sample's identity, its parts, waker and container by number.
type SumKey<'a> = (
    u32,
    u32,
    &'a str,
    u32,
    u32,
    Option<OffState>,
    Option<u32>,
    Option<u32>,
);

/// A waker by content: its kind, command and pid, its parts by number.
type WakerKey = (u8, String, u32, u32, u32);

impl<'a> Merger<'a> {
    /// Room for about `samples` samples.
    fn with_capacity(samples: usize) -> Merger<'a> {
        Merger {
            parts: Parts::with_capacity(samples),
            wakers: ahash::AHashMap::new(),
            waker_list: Vec::new(),
            containers: ahash::AHashMap::new(),
            container_list: Vec::new(),
            sums: ahash::AHashMap::with_capacity(samples),
        }
    }

    /// The number of `container`: equal containers get one number.
    fn container(&mut self, container: Option<&Arc<Container>>) -> Option<u32> {
        let c = container?;
        Some(
            *self
                .containers
                .entry(Arc::as_ptr(c) as usize)
                .or_insert_with(|| {
                    self.container_list.push(c.clone());
                    (self.container_list.len() - 1) as u32
                }),
        )
    }

    /// The number of `part`: equal parts get one number.
    fn part(&mut self, part: Part) -> u32 {
        self.parts.number(part)
    }

    /// The number of a part of frames whose [`frame_word`]s are `words`.
    fn part_words(&mut self, part: Part, words: &[u64]) -> u32 {
        self.parts.number_words(part, words)
    }

    /// The part numbered `n`.
    fn part_of(&self, n: u32) -> Part {
        self.parts.list[n as usize].clone()
    }

    /// The number of `waker`: equal wakers get one number.
    fn waker(&mut self, w: Waker) -> u32 {
        let (wu, wk) = w.parts();
        let (wu, wk) = (self.parts.number(wu.clone()), self.parts.number(wk.clone()));
        let key = match &w {
            Waker::Task { comm, pid, .. } => (0, comm.clone(), *pid, wu, wk),
            Waker::Interrupt { .. } => (1, String::new(), 0, wu, wk),
            Waker::Softirq { .. } => (2, String::new(), 0, wu, wk),
            Waker::Preempted => (3, String::new(), 0, wu, wk),
            Waker::NotWoken => (4, String::new(), 0, wu, wk),
            Waker::Unseen => (5, String::new(), 0, wu, wk),
            Waker::Missed => (6, String::new(), 0, wu, wk),
        };
        *self.wakers.entry(key).or_insert_with(|| {
            self.waker_list.push(w);
            (self.waker_list.len() - 1) as u32
        })
    }

    fn add(&mut self, key: SumKey<'a>, ns: u64, count: u64) {
        let slot = self.sums.entry(key).or_default();
        slot.0 += ns;
        slot.1 += count;
    }

    /// The merged samples, in the order of [`sort_samples`].
    fn samples(self) -> Vec<Sample> {
        let Merger {
            parts,
            waker_list,
            container_list,
            sums,
            ..
        } = self;
        // Sorted as [`sort_samples`] sorts, by number where numbers are
        // equal: sorting the samples themselves moved 100,000 of them a
        // few hundred bytes at a time.
        let part = |a: u32, b: u32| {
            if a == b {
                std::cmp::Ordering::Equal
            } else {
                parts.list[a as usize].cmp(&parts.list[b as usize])
            }
        };
        let waker = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(a), Some(b)) if a != b => waker_list[a as usize].cmp(&waker_list[b as usize]),
            _ => a.cmp(&b),
        };
        let mut sums: Vec<(SumKey, (u64, u64))> = sums.into_iter().collect();
        sums.sort_unstable_by(|(a, (a_ns, a_n)), (b, (b_ns, b_n))| {
            a_ns.cmp(b_ns)
                .then_with(|| a.2.cmp(b.2))
                .then_with(|| a.1.cmp(&b.1))
                .then_with(|| part(a.3, b.3))
                .then_with(|| part(a.4, b.4))
                .then_with(|| a.5.cmp(&b.5))
                .then_with(|| waker(a.6, b.6))
                .then_with(|| (a.0, a_n).cmp(&(b.0, b_n)))
                .then_with(|| {
                    let c = |n: Option<u32>| n.map(|n| &container_list[n as usize]);
                    c(a.7).cmp(&c(b.7))
                })
        });
        // The last sample to have a part takes the merger's copy of it
        // rather than a clone: most parts are in one sample, and a clone
        // and the copy's drop each read the part's count, 100,000 reads
        // from all over memory.
        let mut uses = vec![0u32; parts.list.len()];
        for ((_, _, _, u, k, _, _, _), _) in &sums {
            uses[*u as usize] += 1;
            uses[*k as usize] += 1;
        }
        let mut list = parts.list;
        let mut take = |n: u32| {
            let n = n as usize;
            uses[n] -= 1;
            if uses[n] == 0 {
                std::mem::replace(&mut list[n], Part::Absent)
            } else {
                list[n].clone()
            }
        };
        sums.into_iter()
            .map(
                |((tgid, pid, comm, u, k, state, w, c), (total_ns, count))| Sample {
                    comm: comm.to_string(),
                    tgid,
                    pid,
                    user: take(u),
                    kernel: take(k),
                    state,
                    waker: w.map(|w| waker_list[w as usize].clone()),
                    container: c.map(|c| container_list[c as usize].clone()),
                    total_ns,
                    count,
                },
            )
            .collect()
    }
}

/// Parts numbered by content: equal parts get one number. Each part is
/// hashed once, when it is numbered; the table holds hashes, so growing
/// it does not hash the parts again.
struct Parts {
    hasher: ahash::RandomState,
    /// The last part numbered with each hash; `next` chains the others.
    heads: ahash::AHashMap<u64, u32>,
    next: Vec<u32>,
    list: Vec<Part>,
}

impl Parts {
    const END: u32 = u32::MAX;

    fn with_capacity(n: usize) -> Parts {
        Parts {
            hasher: ahash::RandomState::new(),
            heads: ahash::AHashMap::with_capacity(n),
            next: Vec::with_capacity(n),
            list: Vec::with_capacity(n),
        }
    }

    /// A hash that equal parts share, cheaper than hashing every name:
    /// the frames' addresses, origins and the lengths of their names
    /// (parts that differ only in names are told apart by comparing).
    fn hash(&self, part: &Part) -> u64 {
        match part {
            Part::Absent => self.hasher.hash_one(0u8),
            Part::Missed => self.hasher.hash_one(1u8),
            Part::Frames(frames) => self.hash_words(frames.iter().map(|f| frame_word(f))),
        }
    }

    /// The hash of a part of frames, from their [`frame_word`]s.
    fn hash_words(&self, words: impl Iterator<Item = u64>) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.hasher.build_hasher();
        h.write_u8(2);
        let mut len = 0usize;
        for w in words {
            h.write_u64(w);
            len += 1;
        }
        h.write_usize(len);
        h.finish()
    }

    /// The number of a part of frames whose [`frame_word`]s are `words`.
    fn number_words(&mut self, part: Part, words: &[u64]) -> u32 {
        let hash = self.hash_words(words.iter().copied());
        self.number_hashed(part, hash)
    }

    fn number(&mut self, part: Part) -> u32 {
        let hash = self.hash(&part);
        self.number_hashed(part, hash)
    }

    fn number_hashed(&mut self, part: Part, hash: u64) -> u32 {
        let head = self.heads.get(&hash).copied().unwrap_or(Self::END);
        let mut n = head;
        while n != Self::END {
            if self.list[n as usize] == part {
                return n;
            }
            n = self.next[n as usize];
        }
        let n = self.list.len() as u32;
        self.list.push(part);
        self.next.push(head);
        self.heads.insert(hash, n);
        n
    }
}

/// What a frame adds to the hash of a part (see [`Parts::hash`]): its
/// address, origin, the length of its name and whether it is inlined.
fn frame_word(f: &FrameInfo) -> u64 {
    let origin = match f.origin {
        Origin::Unknown => 0,
        Origin::Kernel => 1,
        Origin::Python => 2,
        Origin::Object(i) => 3 + u64::from(i),
    };
    f.addr.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (origin << 33)
        ^ ((f.name.len() as u64) << 1)
        ^ u64::from(f.inlined)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A user stack's first frame and the one after a signal frame are
    /// where the code was (looked up as they are); the others return
    /// addresses (looked up at the call before them).
    #[test]
    fn user_kinds_after_a_signal_frame() {
        let mut kinds = UserKinds::new();
        let got: Vec<AddrKind> = [false, false, true, false, false]
            .into_iter()
            .map(|signal| kinds.next(signal))
            .collect();
        use AddrKind::{Ip, Return};
        assert_eq!(got, [Ip, Return, Return, Ip, Return]);
    }
}
