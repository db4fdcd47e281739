//! The BPF side: configure, load and attach the program, then read what it
//! measured.  This is the only module that touches libbpf-rs.

use std::collections::HashSet;
use std::io::Read;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{Iter, Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use crate::bpf::types;
use crate::bpf::OffcputimeSkel;
use crate::process::{ticks_of_ns, Proc};
use crate::raw::{
    monotonic_ns, stored_words, AddressSpace, LossCounters, MappedVma, OffState, RawBlock,
    RawEntry, RawProfile, RawUserStack, RawWaker, StackRef, Stacks, TaskEvent, WakerRef,
    MAPPED_VMAS,
};

mod attach;
mod batch;
mod core_btf;
mod cpuclock;
#[cfg(test)]
mod element_sizes;
pub mod kernel;
pub use kernel::check_environment;
mod load;
mod programs;
mod read;
mod snapshot;
#[cfg(test)]
mod stack_depth;
mod stores;

use attach::*;
use load::*;
pub use load::{Objects, Phases};
use programs::{Attach, Flavour, Part, Plan, Role};
pub use read::StackScan;
use read::*;
pub use snapshot::{states_mask, take_snapshot, RawSnapshot, RawTask, STATE_LETTERS};
use stores::UnwindArrays;
pub use stores::{RuntimeStore, UnwindStore};

/// Deepest stack the BPF program can record (`MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: u32 = 127;

/// The table a stored stack's id names (`STACK_ID_CLASS_SHORT` and
/// `STACK_ID_CLASS_MID` in offcputime.h: the stacks kept by their length).
const STACK_ID_CLASS_SHORT: u64 = 1 << 60;
const STACK_ID_CLASS_MID: u64 = 2 << 60;

/// Present where the kernel can attach kprobes (`CONFIG_KPROBES`).
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// Where the BPF program hooks the context switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// The cheapest that attaches: `tp_btf`, then `raw_tp`, then the kprobe.
    /// With a `-m` above the default 1 us (and no state filter) the kprobe
    /// comes first where the kernel has kprobes: it takes stacks at
    /// switch-in, only for the blocks that pass, instead of at every
    /// switch-out.
    Auto,
    /// `sched_switch` tracepoint: `tp_btf`, falling back to `raw_tp`.
    SchedSwitch,
    /// `tp_btf/sched_switch` only.
    TpBtf,
    /// `raw_tp/sched_switch` only.
    RawTp,
    /// kprobe on `finish_task_switch` (under whatever name the compiler
    /// gave it, e.g. `finish_task_switch.isra.0`).
    FinishTaskSwitch,
}

/// The hook that was actually attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachedHook {
    TpBtf,
    RawTp,
    Kprobe { symbol: String },
}

impl std::fmt::Display for AttachedHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachedHook::TpBtf => f.write_str("tp_btf/sched_switch"),
            AttachedHook::RawTp => f.write_str("raw_tp/sched_switch"),
            AttachedHook::Kprobe { symbol } => write!(f, "kprobe/{symbol}"),
        }
    }
}

impl AttachedHook {
    /// Whether the first kernel frame is the exact instruction pointer
    /// rather than a return address.
    pub fn kernel_first_frame_is_ip(&self) -> bool {
        matches!(self, AttachedHook::Kprobe { .. })
    }

    /// Whether a block's stacks are taken when it ends (the kprobe runs in
    /// the task switched in), not when it begins.
    pub fn stacks_at_switch_in(&self) -> bool {
        matches!(self, AttachedHook::Kprobe { .. })
    }
}

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwind {
    /// Frame pointers, by the kernel (`bpf_get_stack`).
    FramePointers,
    /// DWARF call-frame information, by the BPF program with tables built
    /// in userspace; frame pointers where an object has none.
    Dwarf,
}

/// Sizes of the DWARF unwind tables, fixed at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindCapacity {
    /// Rows of all objects' tables.
    pub rows: u32,
    /// Executable mappings of all processes.
    pub mappings: u32,
    /// Processes.
    pub processes: u32,
}

impl UnwindCapacity {
    /// The split of `bytes` of table memory: one mapping for every 64 rows.
    pub fn from_bytes(bytes: u64) -> UnwindCapacity {
        let row = std::mem::size_of::<types::unwind_row>() as u64;
        let mapping = std::mem::size_of::<types::unwind_mapping>() as u64;
        let rows = bytes * 64 / (64 * row + mapping);
        let mappings = (rows / 64).max(1);
        UnwindCapacity {
            rows: rows.clamp(1, u32::MAX as u64) as u32,
            mappings: mappings.min(u32::MAX as u64) as u32,
            processes: 65536,
        }
    }

    /// Bytes of kernel memory the two arrays take.
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * std::mem::size_of::<types::unwind_row>() as u64
            + self.mappings as u64 * std::mem::size_of::<types::unwind_mapping>() as u64
    }
}

/// Which runtimes' walkers: a build's (`.rodata`), or the runtimes whose
/// processes may run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeKinds {
    pub python: bool,
    pub java: bool,
    pub node: bool,
}

impl RuntimeKinds {
    pub const ALL: RuntimeKinds = RuntimeKinds {
        python: true,
        java: true,
        node: true,
    };

    pub fn has(self, kind: crate::runtime::Kind) -> bool {
        use crate::runtime::Kind;
        match kind {
            Kind::Python => self.python,
            Kind::Java => self.java,
            Kind::Node => self.node,
        }
    }

    /// The kinds that `has` says.
    pub fn of(has: impl Fn(crate::runtime::Kind) -> bool) -> RuntimeKinds {
        use crate::runtime::Kind;
        RuntimeKinds {
            python: has(Kind::Python),
            java: has(Kind::Java),
            node: has(Kind::Node),
        }
    }

    pub fn any(self) -> bool {
        self.python || self.java || self.node
    }

    /// Those of both.
    pub fn and(self, other: RuntimeKinds) -> RuntimeKinds {
        RuntimeKinds {
            python: self.python && other.python,
            java: self.java && other.java,
            node: self.node && other.node,
        }
    }

    /// Whose walkers they are, for stderr: "Python's walker", "Python's
    /// and Java's walkers".
    pub fn names(self) -> String {
        let names: Vec<String> = crate::runtime::RUNTIMES
            .iter()
            .filter(|s| self.has(s.kind))
            .map(|s| format!("{}'s", s.label))
            .collect();
        match names.as_slice() {
            [one] => format!("{one} walker"),
            [first @ .., last] => format!("{} and {last} walkers", first.join(", ")),
            [] => "no walker".into(),
        }
    }
}

/// What the BPF program is told at load time.
#[derive(Clone, Debug)]
pub struct TracerOptions {
    /// How long to trace: the end of the window is set in the BPF program
    /// when it opens the window. None: until stopped.
    pub duration: Option<Duration>,
    /// `-i`: the window cut into intervals of this length, each read on
    /// its own (see [`Tracer::cut`]).
    pub interval: Option<Duration>,
    pub tgids: Vec<u32>,
    pub tids: Vec<u32>,
    /// `--cgroup`: the ids of the cgroup v2 directories whose tasks (and
    /// their descendants') are traced; empty for all.
    pub cgroups: Vec<u64>,
    pub user_threads_only: bool,
    pub kernel_threads_only: bool,
    /// `--state`: None for all states.
    pub state: Option<u32>,
    pub min_block_ns: u64,
    pub max_block_ns: u64,
    /// `--sample`: blocks shorter than this are sampled (0: none).
    pub sample_ns: u64,
    pub user_stacks: bool,
    pub kernel_stacks: bool,
    pub stack_storage_size: u32,
    pub max_stack_depth: u32,
    pub hook: Hook,
    pub unwind: Unwind,
    pub unwind_capacity: UnwindCapacity,
    /// `--states`: each block split by thread state at its wake-up (a
    /// `sched_wakeup` hook beside the switch hook).
    pub states: bool,
    /// `--wakers`: the stacks of the task that woke each block (a
    /// `sched_waking` hook beside the switch hook).
    pub wakers: bool,
    /// The Python frames of CPython processes in their user stacks (off
    /// with `--no-python`).
    pub python: bool,
    /// The Java frames of HotSpot JVMs in their user stacks (off with
    /// `--no-java`).
    pub java: bool,
    /// The JavaScript frames of Node.js processes (V8's) in their user
    /// stacks (off with `--no-node`).
    pub node: bool,
    /// The runtimes whose processes may be running (see
    /// [`crate::runtime::maybe_running`]): the hooks load with their
    /// walkers only. Where they are not all those whose frames are read,
    /// the build with every one loads when the first process of another is
    /// noted (with none: without any, their builds with them when the
    /// first runtime's process is noted).
    pub runtimes_running: RuntimeKinds,
    /// `--on-cpu`: the running time too, sampled on every CPU at this rate
    /// (Hz); None: off-CPU time only.
    pub on_cpu_hz: Option<u32>,
    /// `--timeline`: each block at least this long (ns) sent as it ends
    /// (see [`Tracer::wait`]); None: no records.
    pub timeline_min_ns: Option<u64>,
    /// `--chains`: every thread's blocks sent, whatever the filters (which
    /// mark those they keep), and no counts kept: the profile is made of
    /// the records.
    pub chains: bool,
    /// What tests and benchmarks asked for through the environment.
    pub test: crate::test_env::TestEnv,
}

impl TracerOptions {
    /// Whether any language runtime's frames are read (see
    /// [`crate::runtime`]): only in user stacks.
    pub fn runtimes(&self) -> bool {
        (self.python || self.java || self.node) && self.user_stacks
    }

    /// The runtimes whose frames are read.
    pub fn runtime_kinds(&self) -> RuntimeKinds {
        RuntimeKinds::of(|k| self.runtime_on(k))
    }

    /// Whether the waker of each block is kept: `--wakers` counts by it,
    /// `--timeline` records it.
    /// Whether counts are keyed whole: where a mode sets a block's state,
    /// interval or waker (else they are in `counts_plain`, keyed by the
    /// thread and its stacks alone; see `struct offcpu_key_plain`). As
    /// the program's COUNTS_WHOLE.
    pub fn counts_whole(&self) -> bool {
        self.states || self.wakers || self.interval.is_some() || self.on_cpu_hz.is_some()
    }

    pub fn keeps_wakers(&self) -> bool {
        self.wakers || self.records_min_ns().is_some()
    }

    /// The shortest block sent as a record (`--timeline`, `--chains`:
    /// all), None: no records.
    pub fn records_min_ns(&self) -> Option<u64> {
        if self.chains {
            Some(1)
        } else {
            self.timeline_min_ns
        }
    }

    /// Whether the frames of runtime `kind` are read (its `--no-` flag
    /// not given).
    pub fn runtime_on(&self, kind: crate::runtime::Kind) -> bool {
        let flags = RuntimeKinds {
            python: self.python,
            java: self.java,
            node: self.node,
        };
        self.user_stacks && flags.has(kind)
    }
}

/// Where the runtimes' walkers were loaded (see
/// [`Tracer::runtime_walkers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeWalkers {
    /// No runtime's frames are read.
    Off,
    /// With the hooks: a runtime's process was running at the start (or
    /// the hooks have no builds without them). `refreshed`: the refresh
    /// of blocks walked before their process's runtime was noted loaded
    /// (a process noted while tracing), which those noted at the start do
    /// not need.
    WithTheHooks { refreshed: bool },
    /// Where the hooks loaded without some or all of them (`hooks`: the
    /// walkers they have, of the runtimes whose processes ran at the
    /// start), the build with every one:
    /// not at all: no process of another runtime was noted;
    NotNeeded { hooks: RuntimeKinds },
    /// its load failed when the first such process was noted: no other
    /// runtime's frames were read;
    Failed { hooks: RuntimeKinds },
    /// loaded when the first such process was noted, this long after the
    /// window opened; the load took `took`.
    Later {
        hooks: RuntimeKinds,
        after: Duration,
        took: Duration,
    },
}

impl std::fmt::Display for RuntimeWalkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeWalkers::Off => write!(f, "none read"),
            RuntimeWalkers::WithTheHooks { refreshed } => write!(
                f,
                "loaded with the hooks; the refresh of the blocks walked before their process's \
                 runtime was noted {}",
                match refreshed {
                    true => "loaded (a process noted while tracing)",
                    false => "not needed",
                }
            ),
            RuntimeWalkers::NotNeeded { hooks } if hooks.any() => write!(
                f,
                "{} loaded with the hooks (a process of theirs ran at the start); every \
                 runtime's not loaded (no other process of a runtime was noted)",
                hooks.names()
            ),
            RuntimeWalkers::NotNeeded { .. } => {
                write!(f, "not loaded (no process of a runtime was noted)")
            }
            RuntimeWalkers::Failed { hooks } if hooks.any() => write!(
                f,
                "{} loaded with the hooks; every runtime's could not be loaded when another \
                 process of a runtime was noted (said above): no other runtime's frames were read",
                hooks.names()
            ),
            RuntimeWalkers::Failed { .. } => write!(
                f,
                "could not be loaded when the first process of a runtime was noted (said \
                 above): no runtime's frames were read"
            ),
            RuntimeWalkers::Later { hooks, after, took } => {
                if hooks.any() {
                    write!(
                        f,
                        "{} loaded with the hooks (a process of theirs ran at the start); every \
                         runtime's ",
                        hooks.names()
                    )?;
                }
                write!(
                    f,
                    "loaded when the first process of a runtime was noted, {:.1} ms into the \
                     trace, in {:.1} ms (the blocks of its processes that ended before lack its \
                     frames)",
                    after.as_secs_f64() * 1e3,
                    took.as_secs_f64() * 1e3
                )
            }
        }
    }
}

/// The DWARF unwind tables' part in starting (see [`Tracer::start`]).
pub trait StartTables {
    /// Runs while the BPF program loads on another thread (the verifier
    /// takes as long as the tables, and the two can use two CPUs): what
    /// can be done before there are maps to write into. Called before
    /// each attempt to load; only the first call has work to do.
    fn prepare(&mut self, capacity: UnwindCapacity);
    /// The maps to write the tables into, once loaded and before the hook
    /// is attached: the processes asked for have their tables from the
    /// first block on (again, if a hook loads but fails to attach and the
    /// next is tried: the last call's store is the one used).
    fn install(&mut self, store: UnwindStore);
    /// Where to tell the program of the processes of language runtimes,
    /// once loaded and before the hook is attached (no runtime's frames
    /// read, as with `--no-python`: never called).
    fn install_runtimes(&mut self, store: RuntimeStore);
}

/// The rings of the program's news as set up by [`Tracer::news_reader`]:
/// with the ring of copied stacks (`copies`), or without it yet.
struct NewsReader<'a> {
    ring: libbpf_rs::RingBuffer<'a>,
    copies: bool,
}

/// The loop's work on news read while the tracer does something long (see
/// [`Tracer::refresh_runtimes`]): the task events and copied stacks read.
/// What it leaves in them is left for the loop's next round.
pub type News<'a> = dyn FnMut(&mut Vec<TaskEvent>, &mut Vec<RawUserStack>) + 'a;

/// A loaded and attached profiler.
pub struct Tracer<'obj> {
    /// The switch hook and the hooks beside it; its object created the
    /// maps (and maps the global variables in memory).
    skel: OffcputimeSkel<'obj>,
    /// The start and interval iterators, on those maps (the end iterator
    /// loads beside the switch hook: see [`Role::part`]).
    iterators: OffcputimeSkel<'obj>,
    /// The programs loaded when first needed (see [`Part::Later`]).
    later: std::cell::RefCell<Later<'obj>>,
    /// When the runtimes' builds of the hooks began to load, and how long
    /// that took (see [`Plan::runtimes_later`]).
    walkers_loaded: std::cell::Cell<Option<(Instant, Duration)>>,
    /// The runtimes' walkers the hooks loaded with.
    hooks_runtimes: RuntimeKinds,
    /// Their load failed (said when it did).
    walkers_failed: std::cell::Cell<bool>,
    /// `OFFCPUTIME_VERIFIER_STATS`: the verifier's statistics of each
    /// program loaded, said on stderr.
    verifier_stats: bool,
    /// A test's stall of the later object's load (see
    /// [`crate::test_env::TestEnv`]).
    later_stall: Option<Duration>,
    /// `--on-cpu`: what dithers the period of the perf events the sampler
    /// is attached to (their descriptors are the links'): dropped first.
    cpu_clocks: Option<cpuclock::Dither>,
    links: Vec<Link>,
    hook: AttachedHook,
    /// When the window started (the program attached, the blocks under
    /// way claimed).
    window_started_at: Instant,
    /// The same on the clock of the BPF program (CLOCK_MONOTONIC).
    window_start_ns: u64,
    /// The end of tracing on that clock, once known.
    end_ns: Option<u64>,
    stopped: bool,
    /// `--wakers`: the wakers table is in use.
    wakers: bool,
    /// Which programs are loaded; with it, whether the start iterator
    /// could read the user stacks of threads blocked since before tracing
    /// started (sleepable iterator, Linux 5.18).
    plan: Plan,
    phases: Phases,
    /// Which build of the object the hooks and iterators are.
    build: Build,
    /// User stacks of processes without tables yet are copied for
    /// userspace to walk (`--unwind dwarf`, not the legacy programs).
    deferring: bool,
    /// ... and those read but not passed on by [`Tracer::wait`].
    deferred_left: std::cell::RefCell<Vec<RawUserStack>>,
    /// News read by a wait that ended before passing them on: the next
    /// wait passes them first.
    events_left: std::cell::RefCell<Vec<TaskEvent>>,
    /// Runtimes' frames are walked (see [`Tracer::runtime_store`]).
    runtimes: bool,
    /// `--timeline`: blocks are sent on their ring ...
    timeline: bool,
    /// ... and those read, not taken yet (see [`Tracer::take_blocks`]).
    blocks: std::cell::RefCell<Vec<RawBlock>>,
}

fn comm_to_string(comm: &[i8]) -> String {
    let bytes: Vec<u8> = comm
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl<'obj> Tracer<'obj> {
    /// Opens, configures, loads and attaches the BPF program. If the
    /// DWARF unwinder cannot load (it needs `bpf_loop`, Linux 5.17) and
    /// frame pointers can, tracing goes on with frame pointers, and the
    /// reason is returned too.
    ///
    /// `tables` prepares the DWARF unwind tables while the program loads,
    /// and writes them once it is loaded, before it is attached (see
    /// [`StartTables`]). Each attempt at loading takes an object of its
    /// own from `objects`.
    pub fn start(
        objects: &'obj mut Objects,
        opts: &TracerOptions,
        tables: &mut dyn StartTables,
    ) -> Result<(Tracer<'obj>, Option<anyhow::Error>)> {
        let legacy = opts.test.legacy || kernel::lacks_bpf_loop();
        let release = kernel::release();
        if legacy && opts.interval.is_some() {
            bail!(
                "-i is not available on Linux {release}: it needs bpf_loop and atomic \
                 claims in BPF (Linux 5.17 or newer)"
            );
        }
        // The unwinders to try, in order: DWARF, then frame pointers.
        let unwinds: &[Unwind] = if legacy {
            &[Unwind::FramePointers]
        } else if opts.unwind == Unwind::Dwarf {
            &[Unwind::Dwarf, Unwind::FramePointers]
        } else {
            &[Unwind::FramePointers]
        };
        let kprobe_first = (opts.min_block_ns > 1000 || opts.sample_ns > 0)
            && opts.state.is_none()
            && opts.interval.is_none()
            && std::path::Path::new(KPROBE_PMU).exists();
        let hooks: &[Hook] = match opts.hook {
            Hook::Auto if kprobe_first => &[Hook::FinishTaskSwitch, Hook::TpBtf, Hook::RawTp],
            Hook::Auto => &[Hook::TpBtf, Hook::RawTp, Hook::FinishTaskSwitch],
            Hook::SchedSwitch => &[Hook::TpBtf, Hook::RawTp],
            Hook::TpBtf => &[Hook::TpBtf],
            Hook::RawTp => &[Hook::RawTp],
            Hook::FinishTaskSwitch => &[Hook::FinishTaskSwitch],
        };
        // Each hook in turn, and each with a fresh object: a failed load
        // leaves nothing behind. The start iterator that reads user stacks
        // needs a kernel that lets BPF read another task's memory (5.18);
        // without it, blocks under way at the start have no user stack.
        // The test variable: as on a kernel without it. (Never without
        // bpf_loop: that came with 5.17.)
        let user_first = !legacy && !opts.test.no_start_user_stacks;
        let mut attempts = Vec::new();
        for &unwind in unwinds {
            for &hook in hooks {
                for user_stacks in [true, false] {
                    if user_stacks && !user_first {
                        continue;
                    }
                    attempts.push(Attempt {
                        unwind,
                        hook: Some(hook),
                        user_stacks,
                    });
                }
            }
        }
        let (loaded, errors) = first_that_loads(objects, &attempts, |room, a| {
            let opts = TracerOptions {
                unwind: a.unwind,
                ..opts.clone()
            };
            let hook = a.hook.expect("tracing attempts have a hook");
            Self::try_start(room, &opts, hook, a.user_stacks, legacy, tables)
        });
        // Where tp_btf was tried and raw_tp taken after it: said, for on a
        // kernel with BTF tp_btf should load (its failure is worth a
        // report), and raw_tp costs more per switch.
        if let Some((_, a)) = &loaded {
            if a.hook == Some(Hook::RawTp) {
                if let Some((_, e)) = errors.iter().find(|(t, _)| t.hook == Some(Hook::TpBtf)) {
                    eprintln!(
                        "offcputime: the tp_btf hook could not be loaded ({e:#}); tracing on \
                         raw_tp/sched_switch instead (a per-thread hash map instead of task \
                         storage: more cost per switch)"
                    );
                }
            }
        }
        // The error reported: that of the first unwinder, of the first
        // tracepoint hook tried (the first hook, if none is a tracepoint),
        // without user stacks at the start (if the attempt without them
        // fails too, its error is the one that says what is wrong with
        // the hook).
        let mut first_round: Vec<(Attempt, anyhow::Error)> = errors
            .into_iter()
            .filter(|(a, _)| a.unwind == unwinds[0] && !a.user_stacks)
            .collect();
        let reported = first_round
            .iter()
            .position(|(a, _)| a.hook != Some(Hook::FinishTaskSwitch))
            .unwrap_or(0);
        let error = (reported < first_round.len()).then(|| first_round.swap_remove(reported).1);
        match loaded {
            Some((tracer, a)) => {
                let why = if legacy {
                    (opts.unwind == Unwind::Dwarf).then(|| {
                        anyhow!("Linux {release} has no bpf_loop, which the DWARF walk needs: 5.17")
                    })
                } else if a.unwind != unwinds[0] {
                    error
                } else {
                    None
                };
                Ok((tracer, why))
            }
            None => Err(error.unwrap_or_else(|| anyhow!("no hook to try"))),
        }
    }

    fn try_start(
        room: &'obj mut load::Room,
        opts: &TracerOptions,
        hook: Hook,
        start_user_stacks: bool,
        legacy: bool,
        tables: &mut dyn StartTables,
    ) -> Result<Tracer<'obj>> {
        let kprobe_symbol = if hook == Hook::FinishTaskSwitch {
            Some(crate::ksyms::finish_task_switch()?)
        } else {
            None
        };
        let mut phases = Phases::default();
        let [hooks_room, iterators_room, later_room] = room.each_mut();
        let build = Build::for_run(opts, Some(hook));
        let mut open = open_build(hooks_room, build)?;
        phases.mark("open");

        configure(&mut open, opts)?;
        let dwarf = opts.unwind == Unwind::Dwarf;
        {
            let rodata = open
                .maps
                .rodata_data
                .as_deref_mut()
                .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
            hook_settings(rodata, opts, hook);
            if Build::of_settings(rodata) != build {
                bail!("the settings are not those of the {build:?} build the object was opened as");
            }
        }

        let modern = !legacy;
        let plan = plan_programs(&mut open, opts, hook, start_user_stacks, legacy, dwarf)?;
        let (runtime_settings, hooks_runtimes) = {
            let rodata = open
                .maps
                .rodata_data
                .as_deref_mut()
                .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
            let later = if plan.runtimes_later {
                RuntimeKinds::leave_out(rodata, opts.runtimes_running)
            } else {
                RuntimeKinds::of_build(rodata)
            };
            (later, RuntimeKinds::of_build(rodata))
        };
        let hooks_logs = choose_programs(&mut open, &plan, Some(Part::Hooks))?;

        let what = match hook {
            Hook::TpBtf => "tp_btf/sched_switch",
            Hook::RawTp => "raw_tp/sched_switch",
            _ => "kprobe/finish_task_switch",
        };
        let mut arrays = match dwarf {
            true => Some(UnwindArrays::new(&mut open, opts.unwind_capacity)?),
            false => None,
        };
        // The maps first (the hooks' object prepared: the kernel's BTF
        // read, the maps created, nothing verified), then the hooks and the
        // iterators load side by side on them while the tables are
        // prepared.
        {
            use libbpf_rs::AsRawLibbpf;
            let obj = open.open_object_mut().as_libbpf_object().as_ptr();
            // SAFETY: an open object, not yet prepared or loaded; the load
            // that follows goes on from where this leaves it.
            let rc = unsafe { libbpf_rs::libbpf_sys::bpf_object__prepare(obj) };
            if rc != 0 {
                // The kernel's BTF read, the relocations (CO-RE, the hooks'
                // targets) and the maps created: libbpf said which on
                // stderr.
                let why = match -rc {
                    errno if errno < 4000 => std::io::Error::from_raw_os_error(errno).to_string(),
                    code => format!("libbpf error {code}"),
                };
                bail!("failed to prepare the BPF object ({what}): {why}");
            }
        }
        phases.mark("maps");
        let shared = created_maps(open.open_object())?;
        let iterators_open: Opener<'_, 'obj> = {
            let (shared, plan) = (&shared, &plan);
            Box::new(move || open_on_maps(iterators_room, shared, plan, Part::Iterators, build))
        };
        let openers: Vec<Opener<'_, 'obj>> =
            vec![Box::new(move || Ok((open, hooks_logs))), iterators_open];
        let mut room = Ok(());
        let prepare = || {
            if let Some(arrays) = arrays.as_mut() {
                tables.prepare(opts.unwind_capacity);
                room = arrays.first_room();
            }
        };
        let (loaded, prepared) = load_side_by_side(
            openers,
            opts.test.verifier_stats,
            Meanwhile::Once(Box::new(prepare)),
        )
        .with_context(|| format!("failed to load the BPF program ({what})"))?;
        room?;
        let mut loaded = loaded.into_iter();
        let (Some((skel, hooks_took)), Some((iterators, iterators_took))) =
            (loaded.next(), loaded.next())
        else {
            bail!("the BPF program's objects did not all load");
        };
        phases.overlapped = vec![
            ("hooks", hooks_took),
            ("iterators", iterators_took),
            ("tables prepared", prepared),
        ];
        phases.mark("load");
        let later = match plan.runtime_refresh {
            true => Later::Unopened(later_room, runtime_settings),
            false => Later::None,
        };
        drop(shared);
        fill_filters(&skel, opts)?;

        if let Some(arrays) = arrays {
            tables.install(UnwindStore::new(&skel, arrays)?);
        }
        if opts.runtimes() && !legacy {
            tables.install_runtimes(RuntimeStore::new(&skel)?);
        }

        phases.mark("tables");
        if let Some(stall) = opts.test.stall_before_attach {
            // For tests: the tables of the processes found installed, and
            // the hooks not attached yet for this long (a loaded machine's
            // load), said as it begins.
            eprintln!(
                "offcputime: test: the hooks attach in {} ms",
                stall.as_millis()
            );
            std::thread::sleep(stall);
        }
        let (mut links, attached) = attach_hooks(&skel, &plan, hook, kprobe_symbol)?;
        let cpu_clocks = attach_on_cpu(&skel, opts, &plan, &mut links)?;
        phases.mark("attach");
        if let Some(stall) = opts.test.stall_before_window {
            // For tests: the hook attached and the window not open yet for
            // this long (a loaded machine's start-up), said as it begins.
            eprintln!(
                "offcputime: test: the window opens in {} ms",
                stall.as_millis()
            );
            std::thread::sleep(stall);
        }
        let (started_ns, end_ns) = Self::open_window(&skel, &iterators, &plan)?;
        phases.mark("start iterator");
        let started_at = Instant::now()
            .checked_sub(Duration::from_nanos(
                monotonic_ns().saturating_sub(started_ns),
            ))
            .unwrap_or_else(Instant::now);
        if let Some(stall) = opts.test.stall_after_attach {
            // For tests: the attaching thread held up as a loaded machine
            // would.
            std::thread::sleep(stall);
        }
        Ok(Tracer {
            skel,
            iterators,
            later: std::cell::RefCell::new(later),
            hooks_runtimes,
            walkers_loaded: Default::default(),
            walkers_failed: Default::default(),
            verifier_stats: opts.test.verifier_stats,
            later_stall: opts.test.stall_later_load,
            links,
            cpu_clocks,
            hook: attached,
            window_started_at: started_at,
            window_start_ns: started_ns,
            end_ns,
            stopped: false,
            wakers: opts.wakers,
            runtimes: opts.runtimes() && !legacy,
            plan,
            phases,
            build,
            deferring: dwarf && modern,
            deferred_left: Default::default(),
            events_left: Default::default(),
            timeline: opts.records_min_ns().is_some(),
            blocks: Default::default(),
        })
    }

    /// Runs the start iterator: every thread blocked since before the hook
    /// was attached is claimed as blocked from the window's start, then the
    /// program opens the window (and sets its end, given a duration).
    /// Returns both ends, in CLOCK_MONOTONIC ns.
    fn open_window(
        skel: &OffcputimeSkel<'_>,
        iterators: &OffcputimeSkel<'_>,
        plan: &Plan,
    ) -> Result<(u64, Option<u64>)> {
        let start = plan
            .program(Role::Start)
            .ok_or_else(|| anyhow!("no start iterator"))?;
        let prog = program_of(iterators, start)?;
        run_iterator(&prog).context("failed to run the start iterator")?;
        let bss = skel
            .maps
            .bss_data
            .as_deref()
            .ok_or_else(|| anyhow!("BPF object has no .bss"))?;
        // SAFETY: the mmap'ed .bss is shared with the running program.
        let (start, end) = unsafe {
            (
                std::ptr::read_volatile(&bss.trace_start_ns),
                std::ptr::read_volatile(&bss.trace_end_ns),
            )
        };
        if start == 0 {
            bail!("the start iterator did not open the window");
        }
        Ok((start, (end != 0).then_some(end)))
    }

    /// What the objects' CO-RE relocations were made against (see
    /// `core_btf`), for `-v`.
    pub fn core_relocations() -> String {
        core_btf::describe()
    }

    /// Which build of the object was loaded (see `load::Build`), for `-v`.
    pub fn build(&self) -> String {
        self.build.describe()
    }

    /// How long starting took, step by step.
    pub fn phases(&self) -> &Phases {
        &self.phases
    }

    /// Whether blocks under way at the start have user stacks.
    pub fn start_user_stacks(&self) -> bool {
        self.plan.start_user_stacks
    }

    pub fn hook(&self) -> &AttachedHook {
        &self.hook
    }

    /// When the window started: once the program was attached and the
    /// blocks under way claimed.
    pub fn window_started_at(&self) -> Instant {
        self.window_started_at
    }

    /// Waits until `deadline` (or forever) or until `stop` is set, calling
    /// `on_events` at least every 100 ms with what the program said of
    /// processes since the last call: a process seen blocking for the
    /// first time, while it still exists; seen again after its executable
    /// mappings changed; gone; and with the user stacks copied for it to
    /// walk. Calls stop with the trace: they must not
    /// delay its end. A call that returns true has work under way: the
    /// next comes within 5 ms. Stacks copied but not yet passed on when
    /// the wait ends are kept for [`Tracer::take_deferred`], news for the
    /// next wait (with `-i`, a wait ends at every interval's end).
    pub fn wait(
        &self,
        deadline: Option<Instant>,
        stop: &AtomicBool,
        mut on_events: impl FnMut(&[TaskEvent], Vec<RawUserStack>) -> bool,
    ) -> Result<()> {
        let pending = std::cell::RefCell::new(self.events_left.take());
        let stacks = std::cell::RefCell::new(Vec::<RawUserStack>::new());
        let mut news = self.news_reader(&pending, &stacks, None)?;
        let (mut busy, mut more) = (false, !pending.borrow().is_empty());
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let timeout = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    (d - now).min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            // Work under way elsewhere (tables being built): look again
            // soon for its results.
            let timeout = if busy {
                timeout.min(Duration::from_millis(5))
            } else {
                timeout
            };
            // A round takes at most RECORDS_PER_ROUND records: a flood
            // of copied stacks (thousands of threads of new processes)
            // must not keep the news that ends it (their processes'
            // mappings, hence tables) from being dealt with.
            if !more {
                wait_readable(news.ring.epoll_fd(), timeout)
                    .context("failed to poll the event ring buffer")?;
            }
            // A process's first copies come with the news of it, which
            // wakes this wait; the ring is mapped from then on.
            news = self.news_reader(&pending, &stacks, Some(news))?;
            let taken = news.ring.consume_raw_n(RECORDS_PER_ROUND);
            if taken < 0 && taken != -libc::EINTR {
                return Err(std::io::Error::from_raw_os_error(-taken))
                    .context("failed to read the event ring buffer");
            }
            more = taken >= RECORDS_PER_ROUND as i32;
            if deadline.is_some_and(|d| Instant::now() >= d) || stop.load(Ordering::Relaxed) {
                break;
            }
            crate::priority::Lookout::news_taken();
            busy = on_events(&pending.take(), stacks.take());
            // What the round read of the rings while it worked (see
            // `reading_news`) is the next round's.
            pending.borrow_mut().extend(self.events_left.take());
            stacks.borrow_mut().extend(self.deferred_left.take());
            more |= !pending.borrow().is_empty() || !stacks.borrow().is_empty();
        }
        self.deferred_left.borrow_mut().extend(stacks.take());
        self.events_left.borrow_mut().extend(pending.take());
        Ok(())
    }

    /// Wakes a wait on `epoll` once the ring of copied stacks holds any, as
    /// when it is mapped and read (the kernel polls the ring without its
    /// mapping): copies wait no longer for it.
    fn wake_on_copies(&self, epoll: i32) -> Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        if !self.deferring {
            return Ok(());
        }
        let fd = self.skel.maps.deferred_stacks.as_fd().as_raw_fd();
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::MAX,
        };
        // SAFETY: an epoll instance and a descriptor of ours, one event.
        if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut event) } != 0 {
            return Err(std::io::Error::last_os_error())
                .context("failed to watch the ring of copied stacks");
        }
        Ok(())
    }

    /// Runs `work` with a function that reads the program's rings (waiting
    /// up to 10 ms for news), for work that would otherwise leave them
    /// unread long enough to fill (the verifier's hundreds of
    /// milliseconds on the runtimes' walkers), and hands what it read to
    /// `between`, if any (the loop's work on news that cannot wait: new
    /// processes' tables); without it, what they held is the next round's
    /// of [`Tracer::wait`] (or of [`Tracer::drain`]).
    fn reading_news<R>(
        &self,
        mut between: Option<&mut News<'_>>,
        work: impl FnOnce(&mut dyn FnMut()) -> R,
    ) -> R {
        let pending = std::cell::RefCell::new(Vec::new());
        let stacks = std::cell::RefCell::new(Vec::new());
        let mut news: Option<NewsReader<'_>> = None;
        let mut read = || {
            // A ring that cannot be read now is read by the next round.
            news = self.news_reader(&pending, &stacks, news.take()).ok();
            match &news {
                Some(n) => {
                    let _ = wait_readable(n.ring.epoll_fd(), Duration::from_millis(10));
                    n.ring.consume_raw_n(usize::MAX);
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
            // Called with nothing read too: tables built meanwhile are
            // installed.
            if let Some(between) = between.as_deref_mut() {
                between(&mut pending.borrow_mut(), &mut stacks.borrow_mut());
            }
        };
        let out = work(&mut read);
        drop(news);
        self.events_left.borrow_mut().extend(pending.take());
        self.deferred_left.borrow_mut().extend(stacks.take());
        out
    }

    /// The rings of the program's news, read into `pending` and `stacks`
    /// (see [`Tracer::news_rings`]): `old` as it is, unless the ring of
    /// copied stacks has come to hold some since it was set up without.
    /// That ring is mapped only once it holds some: its 2 MiB, mapped
    /// twice over by the kernel, would be a fifth of the profiler's
    /// resident memory, and most traces copy none; until then a wait on
    /// the others wakes for copies too.
    fn news_reader<'a>(
        &'a self,
        pending: &'a std::cell::RefCell<Vec<TaskEvent>>,
        stacks: &'a std::cell::RefCell<Vec<RawUserStack>>,
        old: Option<NewsReader<'a>>,
    ) -> Result<NewsReader<'a>> {
        let copies = old.as_ref().is_some_and(|o| o.copies) || self.copies_waiting();
        if let Some(old) = old {
            if old.copies == copies {
                return Ok(old);
            }
            // Dropped before the rings are set up again.
        }
        let ring = self.news_rings(pending, stacks, copies)?;
        if !copies {
            self.wake_on_copies(ring.epoll_fd())?;
        }
        Ok(NewsReader { ring, copies })
    }

    /// Whether the ring of copied stacks holds any (asked of the kernel,
    /// without mapping the ring).
    fn copies_waiting(&self) -> bool {
        use std::os::fd::{AsFd, AsRawFd};
        if !self.deferring {
            return false;
        }
        let mut fd = libc::pollfd {
            fd: self.skel.maps.deferred_stacks.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, as said; no wait.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        // Where the kernel cannot say, the ring is mapped and read.
        n != 0 && (n < 0 || fd.revents != 0)
    }

    /// The rings of the program's news: events go to `pending`, copied
    /// stacks to `stacks` (a round takes the events first); the copies'
    /// ring only `with_copies`.
    fn news_rings<'a>(
        &'a self,
        pending: &'a std::cell::RefCell<Vec<TaskEvent>>,
        stacks: &'a std::cell::RefCell<Vec<RawUserStack>>,
        with_copies: bool,
    ) -> Result<libbpf_rs::RingBuffer<'a>> {
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&self.skel.maps.events, |data: &[u8]| {
                if let Some(event) = task_event(data) {
                    pending.borrow_mut().push(event);
                }
                0
            })
            .context("failed to set up the event ring buffer")?;
        if self.timeline {
            builder
                .add(&self.skel.maps.block_records, |data: &[u8]| {
                    if let Some(b) = decode_block(data) {
                        self.blocks.borrow_mut().push(b);
                    }
                    0
                })
                .context("failed to set up the block records' ring buffer")?;
        }
        if self.deferring && with_copies {
            builder
                .add(&self.skel.maps.deferred_stacks, |data: &[u8]| {
                    if let Some(s) = RawUserStack::parse(data) {
                        stacks.borrow_mut().push(s);
                    }
                    0
                })
                .context("failed to set up the stack ring buffer")?;
        }
        builder
            .build()
            .context("failed to set up the event ring buffer")
    }

    /// Runs of the wake-up hook (`--wakers`, `--timeline`) the kernel
    /// skipped: a wake-up from an interrupt that came while the hook ran
    /// for another on the same CPU (the kernel runs a program once at a
    /// time on a CPU). Their blocks' wakers are unknown. 0 where the kernel
    /// does not count them (before 5.12).
    pub fn wakeups_missed(&self) -> u64 {
        use libbpf_rs::skel::Skel;
        use libbpf_rs::AsRawLibbpf;
        let later = self.later.borrow();
        let mut objects = vec![self.skel.object()];
        if let Later::Loaded(skel) = &*later {
            objects.push(skel.object());
        }
        let mut missed = 0;
        for object in objects {
            for prog in object.progs() {
                if !prog.name().to_string_lossy().starts_with("sched_waking") {
                    continue;
                }
                // SAFETY: a program of a live object; -1 where not loaded.
                let fd = unsafe {
                    libbpf_rs::libbpf_sys::bpf_program__fd(prog.as_libbpf_object().as_ptr())
                };
                if fd < 0 {
                    continue;
                }
                let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
                let mut len = std::mem::size_of_val(&info) as u32;
                // SAFETY: the info struct and its size, a program's fd.
                let got = unsafe {
                    libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len)
                };
                if got == 0 {
                    missed += info.recursion_misses;
                }
            }
        }
        missed
    }

    /// `--timeline`: the block records read from their ring so far (by
    /// [`Tracer::wait`] and [`Tracer::drain`]), taken.
    pub fn take_blocks(&self) -> Vec<RawBlock> {
        self.blocks.take()
    }

    /// The same, with the records in their ring now read first (`-i`'s
    /// cut: the blocks that ended before it).
    pub fn take_blocks_now(&self) -> Result<Vec<RawBlock>> {
        if self.timeline {
            let mut builder = RingBufferBuilder::new();
            builder
                .add(&self.skel.maps.block_records, |data: &[u8]| {
                    if let Some(b) = decode_block(data) {
                        self.blocks.borrow_mut().push(b);
                    }
                    0
                })
                .context("failed to set up the block records' ring buffer")?;
            builder
                .build()
                .context("failed to set up the block records' ring buffer")?
                .consume()
                .context("failed to read the block records' ring buffer")?;
        }
        Ok(self.take_blocks())
    }

    /// Once the trace is stopped: the news no wait passed on (held over
    /// from the last, and left in the rings) handed to `on_events` in one
    /// round, so that the processes it tells of get their tables before
    /// the end walks the stacks copied for them.
    pub fn drain(
        &self,
        on_events: impl FnOnce(&[TaskEvent], Vec<RawUserStack>) -> bool,
    ) -> Result<()> {
        let pending = std::cell::RefCell::new(self.events_left.take());
        let stacks = std::cell::RefCell::new(self.deferred_left.take());
        self.news_rings(&pending, &stacks, self.copies_waiting())?
            .consume()
            .context("failed to read the event ring buffer")?;
        crate::priority::Lookout::news_taken();
        on_events(&pending.take(), stacks.take());
        Ok(())
    }

    /// The user stacks copied for userspace that no wait passed on, and
    /// those left in the ring (once the trace is stopped, or between two
    /// waits).
    pub fn take_deferred(&self) -> Result<Vec<RawUserStack>> {
        let mut stacks = self.deferred_left.take();
        if !self.copies_waiting() {
            return Ok(stacks);
        }
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&self.skel.maps.deferred_stacks, |data: &[u8]| {
                if let Some(s) = RawUserStack::parse(data) {
                    stacks.push(s);
                }
                0
            })
            .context("failed to set up the stack ring buffer")?;
        builder
            .build()
            .context("failed to set up the stack ring buffer")?
            .consume()
            .context("failed to read the stack ring buffer")?;
        Ok(stacks)
    }

    fn set_end(&mut self, end: u64) {
        self.end_ns = Some(end);
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: the mmap'ed .bss is shared with the running program;
            // a volatile store makes sure the write is not elided.
            unsafe { std::ptr::write_volatile(&mut bss.trace_end_ns, end) };
        }
    }

    /// The end of the window on CLOCK_MONOTONIC, once known (set ahead for
    /// a duration).
    pub fn end_ns(&self) -> Option<u64> {
        self.end_ns
    }

    /// The window traced, in CLOCK_MONOTONIC nanoseconds: from attach to
    /// the end set ahead or to the stop, whichever came first (now, if
    /// neither has come).
    pub fn window_ns(&self) -> (u64, u64) {
        let end = self.end_ns.unwrap_or_else(monotonic_ns);
        (self.window_start_ns, end.max(self.window_start_ns))
    }

    /// Ends tracing: blocks are counted up to now (or the end set ahead,
    /// if that came first), the hooks are detached, and blocks still in
    /// progress are added up to the end.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let now = monotonic_ns();
        if self.end_ns.is_none_or(|end| end > now) {
            self.set_end(now);
        }
        self.cpu_clocks = None;
        self.links.clear();
        if self.plan.flavour == Flavour::Legacy {
            // Those programs claim a block without atomic instructions:
            // no hook may still be running when the end iterator starts.
            kernel::wait_for_running_hooks();
        }
        if let Some(kstacks) = self.plan.program(Role::EndKernelStacks) {
            let kstacks = program_of(self.object_of(Role::EndKernelStacks), kstacks)?;
            run_iterator(&kstacks).context("failed to run the end iterator of kernel stacks")?;
        }
        let end = self
            .plan
            .program(Role::End)
            .ok_or_else(|| anyhow!("no end iterator"))?;
        let flush = program_of(self.object_of(Role::End), end)?;
        run_iterator(&flush).context("failed to run the end iterator")
    }

    /// The object the program of `role` loaded in (the later object's
    /// programs are run by it, not through here).
    fn object_of(&self, role: Role) -> &OffcputimeSkel<'obj> {
        match role.part() {
            Part::Hooks => &self.skel,
            Part::Iterators | Part::Later => &self.iterators,
        }
    }

    /// `-i`: counts the blocks under way up to `end_ns`, the end of an
    /// interval that the clock has passed; from then on they are counted
    /// from it. Blocks that end meanwhile are split there by the program.
    pub fn cut(&self, end_ns: u64) -> Result<()> {
        self.skel
            .maps
            .cut_at
            .update(&0u32.to_ne_bytes(), &end_ns.to_ne_bytes(), MapFlags::ANY)
            .context("failed to set the end of the interval")?;
        let cut = self
            .plan
            .program(Role::Cut)
            .ok_or_else(|| anyhow!("no interval iterator"))?;
        let cut = program_of(self.object_of(Role::Cut), cut)?;
        run_iterator(&cut).context("failed to run the interval iterator")
    }

    /// A count that grows with every user stack the BPF program could not
    /// copy for userspace for want of room (a flood of new threads),
    /// readable from another thread: None where it copies none.
    pub fn copies_lost_counter(&self) -> Option<Box<dyn FnMut() -> u64 + Send>> {
        if !self.deferring {
            return None;
        }
        let map = libbpf_rs::MapHandle::try_from(&self.skel.maps.counters).ok()?;
        Some(Box::new(move || {
            use types::offcpu_counter as C;
            [C::CNT_UNWIND_DEFER_LOST, C::CNT_UNWIND_DEFER_PACED]
                .iter()
                .filter_map(|c| map.lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY).ok()?)
                .flatten()
                .filter_map(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))
                .sum()
        }))
    }

    /// Whether the program's news (its ring of task events) has records
    /// unread, readable from another thread (see
    /// [`crate::priority::Lookout`]).
    pub fn news_waiting(&self) -> Option<crate::priority::NewsWaiting> {
        use std::os::fd::{AsFd, AsRawFd};
        let ring = libbpf_rs::MapHandle::try_from(&self.skel.maps.events).ok()?;
        Some(Box::new(move || {
            let mut fd = libc::pollfd {
                fd: ring.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, of a descriptor this closure owns; no
            // wait. A ring buffer is readable while records wait in it.
            unsafe { libc::poll(&mut fd, 1, 0) > 0 && fd.revents & libc::POLLIN != 0 }
        }))
    }

    /// The blocks under way of processes `tgids` (processes whose runtime
    /// was just noted, and `done`: those no longer to be looked at),
    /// walked before their runtime was known, are walked again with their
    /// runtime's frames (the `runtime_refresh` iterator).
    ///
    /// The walkers' load, where it is the first, takes the verifier
    /// hundreds of milliseconds: the news read meanwhile is handed to
    /// `between` as it comes, if given (new processes' tables are not to
    /// wait for it), or left for the loop's next round.
    pub fn refresh_runtimes(
        &self,
        tgids: &[u32],
        done: &[u32],
        between: Option<&mut News<'_>>,
    ) -> Result<()> {
        if !self.plan.runtime_refresh {
            return Ok(());
        }
        let map = &self.skel.maps.rt_refresh;
        for tgid in done {
            let _ = map.delete(&tgid.to_ne_bytes());
        }
        if tgids.is_empty() {
            return Ok(());
        }
        // A process that finds no room (more than the map holds at once)
        // is left out; the others are walked.
        let listed = tgids
            .iter()
            .filter(|tgid| {
                map.update(&tgid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                    .is_ok()
            })
            .count();
        if listed == 0 {
            return Ok(());
        }
        let mut later = self.later.borrow_mut();
        let loading = (!later.loaded()).then(Instant::now);
        let stats = (self.verifier_stats, self.later_stall);
        let loaded = self.reading_news(between, |read| {
            later.load(&self.skel, &self.plan, stats, read)
        });
        let later = match loaded {
            Ok(later) => later,
            Err(e) => {
                self.walkers_failed.set(self.plan.runtimes_later);
                return Err(e);
            }
        };
        if let Some(began) = loading.filter(|_| self.plan.runtimes_later) {
            self.walkers_loaded.set(Some((began, began.elapsed())));
        }
        run_iterator(&later.progs.runtime_refresh)
            .context("failed to run the runtimes' frames iterator")
    }

    /// The runtimes' walkers the hooks (and the start iterator) loaded
    /// with.
    pub fn hooks_runtimes(&self) -> RuntimeKinds {
        self.hooks_runtimes
    }

    /// Where the runtimes' walkers are (see [`Plan::runtimes_later`]).
    pub fn runtime_walkers(&self) -> RuntimeWalkers {
        match (
            self.runtimes,
            self.plan.runtimes_later,
            self.walkers_loaded.get(),
        ) {
            (false, _, _) => RuntimeWalkers::Off,
            (true, false, _) => RuntimeWalkers::WithTheHooks {
                refreshed: self.later.borrow().loaded(),
            },
            (true, true, None) if self.walkers_failed.get() => RuntimeWalkers::Failed {
                hooks: self.hooks_runtimes,
            },
            (true, true, None) => RuntimeWalkers::NotNeeded {
                hooks: self.hooks_runtimes,
            },
            (true, true, Some((began, took))) => RuntimeWalkers::Later {
                hooks: self.hooks_runtimes,
                after: began.saturating_duration_since(self.window_started_at),
                took,
            },
        }
    }

    /// Where userspace tells the program of the processes of runtimes, if
    /// their frames are walked.
    pub fn runtime_store(&self) -> Option<RuntimeStore> {
        self.runtimes
            .then(|| RuntimeStore::new(&self.skel).ok())
            .flatten()
    }

    /// Stores `frames` (innermost first) as stack `id` among those the BPF
    /// program stored, where they are read as its own: a stack walked in
    /// userspace (see [`crate::deferred`]). False where the table is full
    /// (or refuses it).
    pub fn store_stack(&self, id: u64, frames: &[u64]) -> bool {
        // In the table of its length, as the program stores its stacks
        // (where it keeps them by their length: the others are left a
        // single element then).
        let m = &self.skel.maps;
        let table = [&m.stacks_short, &m.stacks_mid]
            .into_iter()
            .find(|t| t.max_entries() > 1 && frames.len() <= t.value_size() as usize / 8)
            .unwrap_or(&m.stacks);
        let value = |size: u32| {
            let mut value = vec![0u8; size as usize];
            for (slot, f) in value.chunks_exact_mut(8).zip(frames) {
                slot.copy_from_slice(&f.to_ne_bytes());
            }
            value
        };
        let key = id.to_ne_bytes();
        match table.update(&key, &value(table.value_size()), MapFlags::ANY) {
            Ok(()) => true,
            // No memory at the moment (see `stacks_spill`).
            Err(e) if e.kind() == libbpf_rs::ErrorKind::OutOfMemory => m
                .stacks_spill
                .update(&key, &value(m.stacks_spill.value_size()), MapFlags::ANY)
                .is_ok(),
            Err(_) => false,
        }
    }
}

/// Records read from the ring buffers between two rounds of dealing with
/// them (see [`Tracer::wait`]).
const RECORDS_PER_ROUND: usize = 256;

/// Waits until the epoll descriptor `fd` (a ring buffer's) is readable, or
/// `timeout` has passed, or a signal came.
fn wait_readable(fd: i32, timeout: Duration) -> std::io::Result<()> {
    let mut event = libc::epoll_event { events: 0, u64: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one event's room, as said.
    let n = unsafe { libc::epoll_wait(fd, &mut event, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// The ring buffer of user stacks copied for userspace to walk (see
/// [`crate::deferred`]): room for 128 copies of 16 KiB between two reads,
/// which come as soon as it holds any, and while the runtimes' walkers
/// load. Copies are made only where a process's files have no tables
/// yet: a farm of 8,200 new threads made 10 to 200 (the rest walked
/// through its files' tables), a JVM's start 700 to 900; none was lost at
/// this size in the tests of new processes and runtimes started while
/// tracing, nor in a JVM's start with the walkers' load 1 s slower. Its
/// memory is pinned for the whole trace, and resident twice over once
/// mapped: 8 MiB was 45% of the profiler's kernel memory on an idle box.
const DEFERRED_RING_BYTES: u32 = 2 << 20;

/// `--timeline`'s ring buffer of block records: about 40,000 records
/// (104 bytes each with the ring's header) between two reads, which come
/// at least every 100 ms and as soon as an eighth of it holds records
/// (400,000 blocks a second of at least `--timeline-min` before any is
/// lost). The kernel maps its pages twice: 8 MiB resident once used.
const TIMELINE_RING_BYTES: u32 = 4 << 20;

/// Files whose tables the BPF program can find by their inode (see
/// `struct unwind_file`): more than the objects that fit in the rows of a
/// busy machine.
pub const UNWIND_FILES: u32 = 16384;

/// Entries of the table of blocked time (one per thread and pair of
/// stacks): twice the stacks that can be stored, at least 65536.
pub fn counts_capacity(stack_storage_size: u32) -> u32 {
    stack_storage_size.saturating_mul(2).max(65536)
}
