//! The measured profile: symbolized, merged stacks with their blocked time.
//!
//! Everything here is pure data; [`build`] is the one step that turns what
//! the kernel recorded ([`RawProfile`]) into it.

use std::collections::HashMap;

use crate::process::Proc;
use crate::symbolize::{AddrKind, Symbolizer, UserFrame};
pub use crate::tracer::OffState;
use crate::tracer::{LossCounters, RawProfile, StackRef, WakerRef};

/// The user or the kernel part of a stack.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// No frames by nature or by request: a kernel thread's user stack,
    /// or a part that `-U`/`-K` left out.
    Absent,
    /// The stack was lost (stack storage full, or the walk failed).
    Missed,
    /// Frame names, innermost (most recent) first.
    Frames(Vec<String>),
}

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

    /// A task's waker from its stacks: an interrupt or a softirq, where
    /// its kernel frames (innermost first) went through the entry of one,
    /// cut there; else the task.
    pub fn classify(comm: String, pid: u32, user: Part, kernel: Part) -> Waker {
        if let Part::Frames(frames) = &kernel {
            for (i, f) in frames.iter().enumerate() {
                let cut = || Part::Frames(frames[..=i].to_vec());
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
}

impl Profile {
    /// Stacks that could not be shown (bcc's "stack traces could not be
    /// displayed"): samples with a missed part that the mode shows.
    pub fn missed_stacks(&self, mode: StackMode) -> usize {
        self.samples
            .iter()
            .filter(|s| {
                (mode.user() && s.user == Part::Missed)
                    || (mode.kernel() && s.kernel == Part::Missed)
            })
            .count()
    }

    pub fn total_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.total_ns).sum()
    }
}

fn part_addrs(r: StackRef, stacks: &HashMap<u64, Vec<u64>>) -> Option<&[u64]> {
    match r {
        StackRef::Id(id) => stacks.get(&id).map(Vec::as_slice),
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

/// What each frame of a user stack is: the instruction pointer, then
/// return addresses.
fn user_kinds() -> impl Iterator<Item = AddrKind> {
    std::iter::once(AddrKind::Ip).chain(std::iter::repeat(AddrKind::Return))
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

/// Symbolizes and merges what the kernel recorded.
pub fn build(raw: &RawProfile, sym: &mut Symbolizer, kernel_first_is_ip: bool) -> Profile {
    // Kernel frames, all at once.
    let mut kaddrs = Vec::new();
    for e in &raw.entries {
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
    // object by object.
    let mut user_stacks: HashMap<(Proc, u64), Vec<UserFrame>> = HashMap::new();
    let mut distinct = std::collections::HashSet::new();
    for e in &raw.entries {
        if let (StackRef::Id(id), Some(addrs)) =
            (e.user_stack, part_addrs(e.user_stack, &raw.stacks))
        {
            let proc = Proc {
                tgid: e.tgid,
                start: e.start,
            };
            user_stacks.entry((proc, id)).or_insert_with(|| {
                let frames = sym.user_frames(proc, id, addrs);
                distinct.extend(frames.iter().copied().zip(user_kinds()));
                frames
            });
        }
    }
    for w in raw.wakers.values() {
        if let (StackRef::Id(id), Some(addrs)) =
            (w.user_stack, part_addrs(w.user_stack, &raw.stacks))
        {
            let proc = Proc {
                tgid: w.tgid,
                start: w.start,
            };
            user_stacks.entry((proc, id)).or_insert_with(|| {
                let frames = sym.user_frames(proc, id, addrs);
                distinct.extend(frames.iter().copied().zip(user_kinds()));
                frames
            });
        }
    }
    let distinct: Vec<(UserFrame, AddrKind)> = distinct.into_iter().collect();
    let unames = sym.user_names(&distinct);
    drop(distinct);

    let user_part = |proc: Proc, r: StackRef| match r {
        StackRef::None => Part::Absent,
        StackRef::MissedFull | StackRef::MissedError | StackRef::NotReadable => Part::Missed,
        StackRef::Id(id) => match user_stacks.get(&(proc, id)) {
            None => Part::Missed,
            Some(frames) => Part::Frames(
                frames
                    .iter()
                    .zip(user_kinds())
                    .flat_map(|(&f, k)| {
                        unames
                            .get(&(f, k))
                            .cloned()
                            .unwrap_or_else(|| vec!["[unknown]".to_string()])
                    })
                    .collect(),
            ),
        },
    };
    let kernel_part = |r: StackRef, first_is_ip: bool| match r {
        StackRef::None => Part::Absent,
        StackRef::MissedFull | StackRef::MissedError | StackRef::NotReadable => Part::Missed,
        StackRef::Id(id) => match raw.stacks.get(&id) {
            None => Part::Missed,
            Some(frames) => {
                // An address can be several frames: functions inlined
                // there, innermost first.
                let mut named: Vec<String> = kinds(frames, first_is_ip)
                    .flat_map(|k| {
                        knames
                            .get(&k)
                            .cloned()
                            .unwrap_or_else(|| vec!["[unknown]".to_string()])
                    })
                    .collect();
                let ours = named.iter().take_while(|n| is_profiler_frame(n)).count();
                named.drain(..ours);
                Part::Frames(named)
            }
        },
    };

    // (tgid, pid, comm, user, kernel, state, waker) -> (total ns, blocks)
    type MergeKey = (
        u32,
        u32,
        String,
        Part,
        Part,
        Option<OffState>,
        Option<Waker>,
    );
    let mut merged: HashMap<MergeKey, (u64, u64)> = HashMap::new();
    for e in &raw.entries {
        let user = user_part(
            Proc {
                tgid: e.tgid,
                start: e.start,
            },
            e.user_stack,
        );
        let kernel = kernel_part(e.kernel_stack, kernel_first_is_ip);
        let waker = e.waker.map(|w| match w {
            WakerRef::Preempted => Waker::Preempted,
            WakerRef::NotWoken => Waker::NotWoken,
            WakerRef::Unseen => Waker::Unseen,
            WakerRef::MissedFull => Waker::Missed,
            WakerRef::Id(id) => match raw.wakers.get(&id) {
                None => Waker::Missed,
                Some(w) => Waker::classify(
                    w.comm.clone(),
                    w.pid,
                    user_part(
                        Proc {
                            tgid: w.tgid,
                            start: w.start,
                        },
                        w.user_stack,
                    ),
                    kernel_part(w.kernel_stack, false),
                ),
            },
        });
        let slot = merged
            .entry((e.tgid, e.pid, e.comm.clone(), user, kernel, e.state, waker))
            .or_default();
        slot.0 += e.total_ns;
        slot.1 += e.count;
    }
    let mut samples: Vec<Sample> = merged
        .into_iter()
        .map(
            |((tgid, pid, comm, user, kernel, state, waker), (total_ns, count))| Sample {
                comm,
                tgid,
                pid,
                user,
                kernel,
                state,
                waker,
                total_ns,
                count,
            },
        )
        .collect();
    sort_samples(&mut samples);
    Profile {
        samples,
        counters: raw.counters.clone(),
    }
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
