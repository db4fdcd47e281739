//! `--snapshot`: what every task is waiting in right now, read the way
//! crash's `foreach bt` and pykdump's BTstack read a crash dump.
//!
//! The tracer takes the snapshot ([`crate::tracer::take_snapshot`]: one
//! pass of a task iterator, each task's state letter, stacks and time off
//! the CPU); [`build`] names its frames with the same symbolizer as a
//! profile; [`crate::output::snapshot::groups`] merges the tasks that wait in the same
//! stack, for the report ([`crate::output::snapshot`]); and
//! [`Snapshot::profile`] makes a profile of it in which each task weighs one,
//! so that folded lines and flame graphs count tasks.

use std::collections::{BTreeMap, HashMap};

use crate::process::Registry;
use crate::profile::{self, Frame, Part, Profile, Sample};
use crate::raw::{LossCounters, RawEntry, RawProfile};
use crate::shape::Shape;

/// The order of the groups.
pub use crate::shape::GroupSort;
use crate::symbolize::Symbolizer;
use crate::tracer::RawSnapshot;

/// The frame that stands for the stacks of a task on a CPU: none are
/// taken of a running task.
pub const ON_CPU: &str = "[on CPU]";
/// ... and of a task that has exited (a zombie): it has no stacks left.
pub const EXITED: &str = "[exited]";

/// How long a task had been off the CPU when the snapshot saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OffCpu {
    /// For this many nanoseconds: since its last switch-out.
    For(u64),
    /// Not off the CPU: running when seen.
    Running,
    /// The kernel does not keep when it was switched out (a real-time or
    /// deadline task, or a kernel without `CONFIG_SCHED_INFO`).
    Unknown,
}

/// One task of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// Its command, ids and named stacks (its `total_ns` and `count` are
    /// not used).
    pub sample: Sample,
    /// Its state letter, as /proc shows it (`R`, `S`, `D`, `T`, `t`, `X`,
    /// `Z`, `P`, `I`).
    pub state: char,
    pub off_cpu: OffCpu,
}

/// Every task the snapshot kept.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub tasks: Vec<Task>,
    pub counters: LossCounters,
}

/// Tasks that wait in the same stack (as the report prints it).
#[derive(Clone, Debug)]
pub struct Group<'a> {
    /// The stack as the report prints it.
    pub stack: String,
    /// Ordered by pid.
    pub tasks: Vec<&'a Task>,
}

impl Group<'_> {
    /// Command -> how many of the tasks run it.
    pub fn commands(&self) -> BTreeMap<&str, usize> {
        let mut out = BTreeMap::new();
        for t in &self.tasks {
            *out.entry(t.sample.comm.as_str()).or_default() += 1;
        }
        out
    }

    /// State letter -> how many of the tasks are in it.
    pub fn states(&self) -> BTreeMap<char, usize> {
        let mut out = BTreeMap::new();
        for t in &self.tasks {
            *out.entry(t.state).or_default() += 1;
        }
        out
    }

    /// The task off the CPU for the shortest and for the longest time,
    /// among those whose time is known.
    pub fn youngest_oldest(&self) -> Option<(&Task, &Task)> {
        let known = || {
            self.tasks.iter().filter_map(|t| match t.off_cpu {
                OffCpu::For(ns) => Some((ns, t.sample.pid, *t)),
                _ => None,
            })
        };
        let youngest = known().min_by_key(|&(ns, pid, _)| (ns, pid))?.2;
        let oldest = known()
            .max_by_key(|&(ns, pid, _)| (ns, std::cmp::Reverse(pid)))?
            .2;
        Some((youngest, oldest))
    }
}

impl Snapshot {
    /// A profile in which each task weighs one microsecond: its folded
    /// lines and flame graph count tasks.
    pub fn profile(&self) -> Profile {
        let mut samples: Vec<Sample> = self
            .tasks
            .iter()
            .map(|t| Sample {
                total_ns: 1000,
                count: 1,
                ..t.sample.clone()
            })
            .collect();
        profile::sort_samples(&mut samples);
        Profile {
            samples,
            counters: self.counters.clone(),
            ..Default::default()
        }
    }

    /// Keeps the tasks whose stacks `filter` keeps (`--grep`,
    /// `--exclude`); returns how many were left out.
    pub fn retain(&mut self, filter: &crate::filter::StackFilter, shape: Shape) -> usize {
        let before = self.tasks.len();
        self.tasks.retain(|t| filter.keeps(&t.sample, shape));
        before - self.tasks.len()
    }
}

/// Names the frames of the tasks the tracer found. A task on a CPU gets
/// the frame [`ON_CPU`], an exited one [`EXITED`], in the part `shape`
/// shows, instead of stacks.
pub fn build(raw: &RawSnapshot, reg: &mut Registry, sym: &Symbolizer, shape: Shape) -> Snapshot {
    // The stacks are named as a profile's are: one entry a task.
    let entries = raw
        .tasks
        .iter()
        .map(|t| RawEntry {
            tgid: t.tgid,
            start: t.start,
            pid: t.pid,
            comm: t.comm.clone(),
            user_stack: t.user_stack,
            kernel_stack: t.kernel_stack,
            state: None,
            waker: None,
            interval: 0,
            span: 1,
            total_ns: 1,
            count: 1,
        })
        .collect();
    let named = profile::build(
        &RawProfile {
            entries,
            stacks: raw.stacks.clone(),
            wakers: HashMap::new(),
            counters: raw.counters.clone(),
        },
        reg,
        sym,
        false,
    );
    let mut by_task: HashMap<(u32, u32), Sample> = named
        .samples
        .into_iter()
        .map(|s| ((s.tgid, s.pid), s))
        .collect();
    let mut tasks = Vec::with_capacity(raw.tasks.len());
    for t in &raw.tasks {
        let Some(mut sample) = by_task.remove(&(t.tgid, t.pid)) else {
            continue;
        };
        let marker = if t.on_cpu {
            Some(ON_CPU)
        } else if matches!(t.state, 'Z' | 'X') {
            Some(EXITED)
        } else {
            None
        };
        if let Some(m) = marker {
            let part = Part::Frames([Frame::named(m)].into());
            if shape.mode.kernel() {
                sample.kernel = part;
            } else {
                sample.user = part;
            }
        }
        tasks.push(Task {
            sample,
            state: t.state,
            off_cpu: if t.on_cpu {
                OffCpu::Running
            } else {
                t.off_cpu_ns.map_or(OffCpu::Unknown, OffCpu::For)
            },
        });
    }
    tasks.sort_by_key(|t| (t.sample.tgid, t.sample.pid));
    Snapshot {
        tasks,
        counters: raw.counters.clone(),
    }
}
