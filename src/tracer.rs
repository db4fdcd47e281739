//! The BPF side: configure, load and attach the program, then read what it
//! measured.  This is the only module that touches libbpf-rs.

use std::collections::HashSet;
use std::io::Read;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Iter, Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use crate::bpf::types;
use crate::bpf::{OffcputimeSkel, OffcputimeSkelBuilder};
use crate::process::{ticks_of_ns, Proc};
use crate::raw::{
    monotonic_ns, stored_words, AddressSpace, LossCounters, MappedVma, OffState, RawEntry,
    RawProfile, RawUserStack, RawWaker, StackRef, Stacks, TaskEvent, WakerRef, MAPPED_VMAS,
};

mod batch;
mod cpuclock;
pub mod kernel;
mod programs;
mod snapshot;
use programs::{Attach, Flavour, Plan, Role};
pub use snapshot::{states_mask, take_snapshot, RawSnapshot, RawTask, STATE_LETTERS};

/// Deepest stack the BPF program can record (`MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: u32 = 127;

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
    /// `--on-cpu`: the running time too, sampled on every CPU at this rate
    /// (Hz); None: off-CPU time only.
    pub on_cpu_hz: Option<u32>,
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
    /// Where to tell the program of CPython processes, once loaded and
    /// before the hook is attached (`--no-python`: never called).
    fn install_python(&mut self, store: PythonStore);
}

/// The program's table of CPython processes (`py_procs`, see `struct
/// py_proc`).
pub struct PythonStore {
    procs: libbpf_rs::MapHandle,
    /// A bit per pid of the processes in `procs` (see `py_pids`).
    pids: libbpf_rs::MapHandle,
    /// Whether any entry was written (`py_any`, alone in its section:
    /// until then no process pays for a lookup).
    any: libbpf_rs::MapHandle,
    any_set: std::cell::Cell<bool>,
}

impl PythonStore {
    fn new(skel: &OffcputimeSkel<'_>) -> Result<PythonStore> {
        Ok(PythonStore {
            procs: libbpf_rs::MapHandle::try_from(&skel.maps.py_procs)
                .context("failed to open the Python processes map")?,
            pids: libbpf_rs::MapHandle::try_from(&skel.maps.py_pids)
                .context("failed to open the Python processes map")?,
            any: libbpf_rs::MapHandle::try_from(&skel.maps.data_python)
                .context("failed to open the Python processes map")?,
            any_set: std::cell::Cell::new(false),
        })
    }

    /// Tells the program where the interpreter of process `tgid` keeps
    /// its threads' frames.
    pub fn set(&self, tgid: u32, entry: &types::py_proc) -> Result<()> {
        // SAFETY: py_proc is plain old data.
        let value = unsafe { plain::as_bytes(entry) };
        self.procs
            .update(&tgid.to_ne_bytes(), value, MapFlags::ANY)
            .with_context(|| format!("failed to note the interpreter of process {tgid}"))?;
        self.set_pid(tgid, true)
            .with_context(|| format!("failed to note the interpreter of process {tgid}"))?;
        if !self.any_set.get() {
            self.any
                .update(&0u32.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                .context("failed to note the first Python process")?;
            self.any_set.set(true);
        }
        Ok(())
    }

    /// Process `tgid` has exited, or runs another program now.
    pub fn remove(&self, tgid: u32) {
        let _ = self.set_pid(tgid, false);
        let _ = self.procs.delete(&tgid.to_ne_bytes());
    }

    /// Sets or clears the bit of pid `tgid` (pid_max is at most 2^22:
    /// every pid has one). A fork setting a bit of the same word meanwhile
    /// could be undone: that child's stacks would then have the
    /// interpreter's frames, and be counted and said as such.
    fn set_pid(&self, tgid: u32, on: bool) -> Result<()> {
        let word = tgid >> 6;
        let Some(old) = self.pids.lookup(&word.to_ne_bytes(), MapFlags::ANY)? else {
            return Ok(());
        };
        let old = u64::from_ne_bytes(old.as_slice().try_into().unwrap_or([0; 8]));
        let bit = 1u64 << (tgid & 63);
        let new = if on { old | bit } else { old & !bit };
        if new != old {
            self.pids
                .update(&word.to_ne_bytes(), &new.to_ne_bytes(), MapFlags::ANY)?;
        }
        Ok(())
    }
}

/// An open skeleton handed to the thread that loads it.
struct SendOpen<T>(T);

// SAFETY: the open skeleton is used by one thread at a time (moved to the
// loading thread, which hands back the loaded one); libbpf objects are not
// tied to the thread that made them.
unsafe impl<T> Send for SendOpen<T> {}

/// A pass over the counts for some processes' user stacks.
pub struct StackScan<'t> {
    procs: HashSet<Proc>,
    keys: Box<dyn Iterator<Item = Vec<u8>> + 't>,
    wanted: HashSet<(Proc, u64)>,
}

impl StackScan<'_> {
    /// The processes scanned for.
    pub fn procs(&self) -> &HashSet<Proc> {
        &self.procs
    }

    /// Reads up to `n` more entries; once the pass is over, the stacks
    /// found: each (process, stack id, frames) once.
    pub fn step(&mut self, tracer: &Tracer<'_>, n: usize) -> Option<Vec<(Proc, u64, Vec<u64>)>> {
        let mut read = 0;
        for key_bytes in self.keys.by_ref().take(n) {
            read += 1;
            let mut key = types::offcpu_key::default();
            if plain::copy_from_bytes(&mut key, &key_bytes).is_err() {
                continue;
            }
            let p = Proc {
                tgid: key.tgid,
                start: ticks_of_ns(key.process_start),
            };
            if self.procs.contains(&p) {
                if let StackRef::Id(id) = StackRef::from_raw(key.user_stack_id) {
                    self.wanted.insert((p, id));
                }
            }
        }
        if read == n {
            return None;
        }
        // A stack that cannot be read leaves its frames unnamed, nothing
        // else.
        Some(
            self.wanted
                .drain()
                .filter_map(|(p, id)| Some((p, id, tracer.stack(id).ok()??)))
                .collect(),
        )
    }
}

/// A loaded and attached profiler.
pub struct Tracer<'obj> {
    skel: OffcputimeSkel<'obj>,
    /// `--on-cpu`: what dithers the period of the perf events the sampler
    /// is attached to (their descriptors are the links'): dropped first.
    cpu_clocks: Option<cpuclock::Dither>,
    links: Vec<Link>,
    hook: AttachedHook,
    attached_at: Instant,
    /// `attached_at` on the clock of the BPF program (CLOCK_MONOTONIC).
    attached_ns: u64,
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
    /// User stacks of processes without tables yet are copied for
    /// userspace to walk (`--unwind dwarf`, not the legacy programs).
    deferring: bool,
    /// ... and those read but not passed on by [`Tracer::wait`].
    deferred_left: std::cell::RefCell<Vec<RawUserStack>>,
    /// News read by a wait that ended before passing them on: the next
    /// wait passes them first.
    events_left: std::cell::RefCell<Vec<TaskEvent>>,
    /// Python frames are walked (see [`Tracer::python_store`]).
    python: bool,
}

/// How long each step of starting took.
#[derive(Debug)]
pub struct Phases {
    last: Instant,
    pub steps: Vec<(&'static str, Duration)>,
    /// What ran side by side during the load: the BPF object's load (the
    /// verifier, mostly) and the tables prepared meanwhile.
    pub overlapped: Option<(Duration, Duration)>,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            last: Instant::now(),
            steps: Vec::new(),
            overlapped: None,
        }
    }
}

impl Phases {
    fn mark(&mut self, what: &'static str) {
        let now = Instant::now();
        self.steps.push((what, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (what, d)) in self.steps.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{what} {:.1} ms", d.as_secs_f64() * 1e3)?;
        }
        if let Some((bpf, tables)) = self.overlapped {
            write!(
                f,
                "; during the load: BPF object {:.1} ms, tables prepared {:.1} ms",
                bpf.as_secs_f64() * 1e3,
                tables.as_secs_f64() * 1e3
            )?;
        }
        Ok(())
    }
}

/// Sets which of the object's programs load, by the program table; with
/// `OFFCPUTIME_VERIFIER_STATS` in the environment each of them prints the
/// verifier's statistics (time, instructions processed, states) through
/// libbpf's debug log (see set_libbpf_logging).
fn choose_programs(open: &mut crate::bpf::OpenOffcputimeSkel<'_>, plan: &Plan) -> Result<()> {
    let stats = std::env::var_os("OFFCPUTIME_VERIFIER_STATS").is_some();
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let load = plan.loads(programs::named(&name)?);
        prog.set_autoload(load);
        if load && stats {
            prog.set_log_level(4);
        }
    }
    Ok(())
}

/// The most attempts at loading the program one start makes: two
/// unwinders, three hooks, with and without user stacks at the start.
const ATTEMPTS: usize = 12;

/// Room for the BPF object of each attempt at loading the program (a
/// failed attempt's object is dropped in place; the one that loads lives
/// as long as the tracer).
pub struct Objects([MaybeUninit<OpenObject>; ATTEMPTS]);

impl Default for Objects {
    fn default() -> Objects {
        Objects(std::array::from_fn(|_| MaybeUninit::uninit()))
    }
}

/// One way of loading the program.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    unwind: Unwind,
    /// The switch hook; none for `--snapshot`.
    hook: Option<Hook>,
    /// The start (or snapshot) iterator reads user stacks.
    user_stacks: bool,
}

/// The attempts that failed, with why.
type Failures = Vec<(Attempt, anyhow::Error)>;

/// Tries `attempts` in order, each with an object of its own, until one
/// loads: what it gave, and the errors of those before it (of all, if none
/// loads).
fn first_that_loads<'obj, T>(
    objects: &'obj mut Objects,
    attempts: &[Attempt],
    mut load: impl FnMut(&'obj mut MaybeUninit<OpenObject>, &Attempt) -> Result<T>,
) -> (Option<(T, Attempt)>, Failures) {
    let mut errors = Vec::new();
    let mut room: &'obj mut [MaybeUninit<OpenObject>] = &mut objects.0;
    for a in attempts {
        let Some((object, rest)) = std::mem::take(&mut room).split_first_mut() else {
            errors.push((*a, anyhow!("more attempts at loading than room for them")));
            break;
        };
        room = rest;
        match load(object, a) {
            Ok(t) => return (Some((t, *a)), errors),
            Err(e) => errors.push((*a, e)),
        }
    }
    (None, errors)
}

/// The loaded program of a table entry.
fn program_of<'a>(
    skel: &'a OffcputimeSkel<'_>,
    p: &programs::Program,
) -> Result<libbpf_rs::ProgramMut<'a>> {
    use libbpf_rs::skel::Skel;
    skel.object()
        .progs_mut()
        .find(|prog| prog.name() == std::ffi::OsStr::new(p.name))
        .ok_or_else(|| anyhow!("the BPF object has no program {}", p.name))
}

/// Runs a task iterator program over every thread, once.
fn run_iterator(prog: &libbpf_rs::ProgramMut<'_>) -> Result<()> {
    iterator_output(prog, None).map(drop)
}

/// Runs a task iterator program over every thread, once, and returns what
/// it wrote. `settle`: how long the reading thread sleeps between creating
/// the iterator and reading it (see `snapshot_output`).
fn iterator_output(prog: &libbpf_rs::ProgramMut<'_>, settle: Option<Duration>) -> Result<Vec<u8>> {
    let link = prog
        .attach_iter_with_opts(libbpf_rs::IterOpts::None)
        .context("failed to attach the task iterator")?;
    let mut iter = Iter::new(&link).context("failed to create the task iterator")?;
    if let Some(settle) = settle {
        std::thread::sleep(settle);
    }
    let mut out = Vec::new();
    iter.read_to_end(&mut out)
        .context("failed to read the task iterator")?;
    Ok(out)
}

/// Loads `open` on a thread of its own (the verifier takes about as long as
/// the unwind tables take to prepare, and the two can use two CPUs) while
/// `meanwhile` runs on this one. Returns the loaded program, how long its
/// load took and how long `meanwhile` took.
fn load_while<'obj>(
    open: crate::bpf::OpenOffcputimeSkel<'obj>,
    meanwhile: impl FnOnce(),
) -> Result<(OffcputimeSkel<'obj>, (Duration, Duration))> {
    let open = SendOpen(open);
    std::thread::scope(|s| {
        let loader = std::thread::Builder::new()
            .name("bpf-load".into())
            .spawn_scoped(s, move || {
                // The whole wrapper moves, not just its field.
                let open = open;
                let began = Instant::now();
                SendOpen((open.0.load(), began.elapsed()))
            });
        let loader = match loader {
            Ok(l) => l,
            Err(e) => return Err(anyhow!(e).context("failed to start the loading thread")),
        };
        let began = Instant::now();
        crate::priority::loading(true);
        meanwhile();
        let prepared = began.elapsed();
        let loaded = loader.join();
        crate::priority::loading(false);
        match loaded {
            Ok(SendOpen((r, took))) => Ok((r?, (took, prepared))),
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// The processes, threads and cgroups of `-p`, `-t` and `--cgroup`, for
/// the program's filters.
fn fill_filters(skel: &OffcputimeSkel<'_>, opts: &TracerOptions) -> Result<()> {
    let one = [1u8];
    for tgid in &opts.tgids {
        skel.maps
            .tgids
            .update(&tgid.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    for tid in &opts.tids {
        skel.maps
            .tids
            .update(&tid.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    for id in &opts.cgroups {
        skel.maps
            .cgroups
            .update(&id.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    Ok(())
}

/// The load-time configuration of the program (its `.rodata`) and the
/// sizes of its maps, as `opts` say: shared by the tracer and the
/// snapshot.
fn configure(open: &mut crate::bpf::OpenOffcputimeSkel<'_>, opts: &TracerOptions) -> Result<()> {
    {
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
        rodata.filter_by_tgid = !opts.tgids.is_empty();
        rodata.filter_by_tid = !opts.tids.is_empty();
        rodata.filter_by_cgroup = !opts.cgroups.is_empty();
        rodata.user_threads_only = opts.user_threads_only;
        rodata.kernel_threads_only = opts.kernel_threads_only;
        rodata.filter_by_state = opts.state.is_some();
        rodata.state_mask = opts.state.unwrap_or(0);
        rodata.min_block_ns = opts.min_block_ns;
        rodata.max_block_ns = opts.max_block_ns;
        rodata.sample_ns = opts.sample_ns;
        rodata.want_user_stack = opts.user_stacks;
        rodata.want_kernel_stack = opts.kernel_stacks;
        rodata.notify_new_tasks = opts.user_stacks;
        rodata.stack_bytes = opts.max_stack_depth * 8;
        rodata.unwind_dwarf = opts.unwind == Unwind::Dwarf;
        // For measuring and testing the cache against the walk it saves.
        rodata.ucache_on = std::env::var_os("OFFCPUTIME_NO_STACK_CACHE").is_none();
        rodata.unwind_by_file = std::env::var_os("OFFCPUTIME_NO_FILE_TABLES").is_none();
        rodata.python_on = opts.python && opts.user_stacks;
        rodata.want_states = opts.states;
        rodata.want_wakers = opts.wakers;
        rodata.on_cpu_on = opts.on_cpu_hz.is_some();
        if opts.wakers {
            // Unreadable or hidden: userspace tells interrupts by
            // their frames' names alone.
            let entries = crate::ksyms::InterruptEntries::load().unwrap_or_default();
            if entries.irq == (0, 0) {
                eprintln!(
                    "offcputime: where interrupts enter the kernel is not known (kallsyms \
                     hides its addresses without CAP_SYSLOG, or has no x86-64 entry stubs): \
                     a wake-up from an interrupt may be shown as the task it interrupted"
                );
            }
            (rodata.irq_entry_start, rodata.irq_entry_end) = entries.irq;
            (rodata.softirq_start, rodata.softirq_end) = entries.softirq;
        }
        rodata.trace_duration_ns = opts
            .duration
            .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX).max(1));
        rodata.interval_ns = opts
            .interval
            .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX).max(1));
    }
    if opts.unwind == Unwind::Dwarf {
        let cap = opts.unwind_capacity;
        open.maps
            .unwind_rows
            .set_max_entries(cap.rows)
            .context("unwind rows map size")?;
        open.maps
            .unwind_maps
            .set_max_entries(cap.mappings)
            .context("unwind mappings map size")?;
        open.maps
            .unwind_procs
            .set_max_entries(cap.processes)
            .context("unwind processes map size")?;
        open.maps
            .unwind_files
            .set_max_entries(UNWIND_FILES)
            .context("unwind files map size")?;
        open.maps
            .deferred_stacks
            .set_max_entries(DEFERRED_RING_BYTES)
            .context("deferred stacks ring buffer size")?;
    }
    let depth_bytes = opts.max_stack_depth * 8;
    open.maps
        .stacks
        .set_value_size(depth_bytes)
        .context("stacks map value size")?;
    open.maps
        .stacks
        .set_max_entries(opts.stack_storage_size)
        .context("stacks map size")?;
    open.maps
        .counts
        .set_max_entries(counts_capacity(opts.stack_storage_size))
        .context("counts map size")?;
    // One slot per distinct waker (task and stacks), at most as many
    // as stacks; a single one without --wakers.
    open.maps
        .wakers
        .set_max_entries(if opts.wakers {
            opts.stack_storage_size
        } else {
            1
        })
        .context("wakers map size")?;
    open.maps
        .tgids
        .set_max_entries(opts.tgids.len().max(1) as u32)?;
    open.maps
        .tids
        .set_max_entries(opts.tids.len().max(1) as u32)?;
    open.maps
        .cgroups
        .set_max_entries(opts.cgroups.len().max(1) as u32)?;
    Ok(())
}

/// For tests: the milliseconds in environment variable `name`, a stall
/// that a test asks for to hold the profiler up at one point as a loaded
/// machine would (`OFFCPUTIME_TEST_STALL_*`). None, and so no stall, unless
/// it is set.
pub fn test_stall_ms(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
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
        let legacy = kernel::lacks_bpf_loop();
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
        let user_first =
            !legacy && std::env::var_os("OFFCPUTIME_TEST_NO_START_USER_STACKS").is_none();
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
        let (loaded, errors) = first_that_loads(objects, &attempts, |object, a| {
            let opts = TracerOptions {
                unwind: a.unwind,
                ..opts.clone()
            };
            let hook = a.hook.expect("tracing attempts have a hook");
            Self::try_start(object, &opts, hook, a.user_stacks, legacy, tables)
        });
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
        object: &'obj mut MaybeUninit<OpenObject>,
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
        let builder = OffcputimeSkelBuilder::default();
        let mut open = builder
            .open(object)
            .context("failed to open the BPF object")?;
        phases.mark("open");

        configure(&mut open, opts)?;
        let dwarf = opts.unwind == Unwind::Dwarf;
        if hook == Hook::FinishTaskSwitch {
            open.maps
                .rodata_data
                .as_deref_mut()
                .ok_or_else(|| anyhow!("BPF object has no .rodata"))?
                .stacks_at_switch_in = true;
        }

        let flavour = match hook {
            _ if legacy => Flavour::Legacy,
            Hook::TpBtf => Flavour::TaskStorage,
            _ => Flavour::ByTid,
        };
        let trusted = flavour == Flavour::TaskStorage;
        let modern = !legacy;
        // sched_switch passes the state the thread blocked in since 5.18,
        // the kernel that also made the user-stack start iterator load.
        open.maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| anyhow!("BPF object has no .rodata"))?
            .switch_has_prev_state = start_user_stacks && modern && hook != Hook::FinishTaskSwitch;
        let plan = Plan {
            flavour,
            hook: Some(hook),
            start_user_stacks,
            states: opts.states,
            wakers: opts.wakers,
            // New processes share their parent's unwind tables from the
            // fork.
            forks: dwarf && modern && opts.user_stacks,
            // -i's iterator, never with the legacy programs (refused in
            // start).
            cut: opts.interval.is_some() && modern,
            // The Python frames of new CPython processes' first blocks,
            // walked again once the interpreter is known (sleepable, task
            // storage).
            python_refresh: opts.python
                && opts.user_stacks
                && trusted
                && start_user_stacks
                && modern,
            on_cpu: opts.on_cpu_hz.is_some(),
        };
        choose_programs(&mut open, &plan)?;
        if trusted {
            // Only task-local storage is used; keep the tid map tiny.
            open.maps.task_data_by_tid.set_max_entries(1)?;
        }
        if trusted || opts.on_cpu_hz.is_none() {
            open.maps.run_by_tid.set_max_entries(1)?;
        }
        if legacy {
            // Before 5.11 tracing programs have no task-local storage,
            // and its map cannot even be created.
            open.maps
                .task_data_storage
                .set_autocreate(false)
                .context("task storage map")?;
            open.maps
                .ucache_storage
                .set_autocreate(false)
                .context("stack cache map")?;
            open.maps
                .run_storage
                .set_autocreate(false)
                .context("running time map")?;
        }

        let what = match hook {
            Hook::TpBtf => "tp_btf/sched_switch",
            Hook::RawTp => "raw_tp/sched_switch",
            _ => "kprobe/finish_task_switch",
        };
        let (skel, overlapped) = load_while(open, || {
            if dwarf {
                tables.prepare(opts.unwind_capacity);
            }
        })
        .with_context(|| format!("failed to load the BPF program ({what})"))?;
        phases.overlapped = Some(overlapped);

        phases.mark("load");
        fill_filters(&skel, opts)?;

        if dwarf {
            tables.install(UnwindStore::new(&skel)?);
        }
        if opts.python && opts.user_stacks && !legacy {
            tables.install_python(PythonStore::new(&skel)?);
        }

        phases.mark("tables");
        // The wake-up hook first: no wake-up of a block the switch hook
        // sees may be missed.
        let mut links = Vec::new();
        for (role, name) in [
            (Role::Wakeup, "sched_wakeup"),
            (Role::Waking, "sched_waking"),
            (Role::Fork, "sched_process_fork"),
        ] {
            if let Some(p) = plan.program(role) {
                let prog = program_of(&skel, p)?;
                let link = match p.attach {
                    Attach::TpBtf => prog.attach(),
                    Attach::RawTp(tp) => prog.attach_raw_tracepoint(tp),
                    other => bail!("{}: attached as {other:?}, not a tracepoint", p.name),
                };
                links.push(link.with_context(|| format!("failed to attach the {name} hook"))?);
            }
        }
        // The hook only notes switches until the start iterator, run next,
        // has claimed the blocks under way and opened the window.
        let switch = plan
            .program(Role::Switch)
            .ok_or_else(|| anyhow!("no switch program for {hook:?}"))?;
        let prog = program_of(&skel, switch)?;
        let (link, attached) = match switch.attach {
            Attach::TpBtf => (
                prog.attach()
                    .context("failed to attach tp_btf/sched_switch")?,
                AttachedHook::TpBtf,
            ),
            Attach::RawTp(tp) => (
                prog.attach_raw_tracepoint(tp)
                    .context("failed to attach raw_tp/sched_switch")?,
                AttachedHook::RawTp,
            ),
            Attach::Kprobe => {
                let symbol = kprobe_symbol.expect("resolved above");
                let link = prog.attach_kprobe(false, &symbol).with_context(|| {
                    let hint = if std::path::Path::new(KPROBE_PMU).exists() {
                        ""
                    } else {
                        " (this kernel has no kprobe support, CONFIG_KPROBES)"
                    };
                    format!("failed to attach kprobe to {symbol}{hint}")
                })?;
                (link, AttachedHook::Kprobe { symbol })
            }
            other => bail!("{}: attached as {other:?}", switch.name),
        };
        links.push(link);
        // --on-cpu: the samples begin before the window opens (and those
        // before it are left out), so that none of it goes unsampled.
        // libbpf's link closes the event's descriptor: the link owns it
        // once attached (those not attached yet are closed here).
        let cpu_clocks = match (opts.on_cpu_hz, plan.program(Role::OnCpu)) {
            (Some(hz), Some(p)) => {
                let sampler = program_of(&skel, p)?;
                let mut attached = Vec::new();
                for fd in cpuclock::open(hz)? {
                    use std::os::fd::AsRawFd;
                    let link = sampler
                        .attach_perf_event(fd.as_raw_fd())
                        .context("failed to attach the on-CPU sampler to cpu-clock")?;
                    attached.push(std::os::fd::IntoRawFd::into_raw_fd(fd));
                    links.push(link);
                }
                Some(cpuclock::Dither::start(attached, hz)?)
            }
            _ => None,
        };
        phases.mark("attach");
        if let Some(ms) = test_stall_ms("OFFCPUTIME_TEST_STALL_BEFORE_WINDOW_MS") {
            // For tests: the hook attached and the window not open yet for
            // this long (a loaded machine's start-up), said as it begins.
            eprintln!("offcputime: test: the window opens in {ms} ms");
            std::thread::sleep(Duration::from_millis(ms));
        }
        let (started_ns, end_ns) = Self::open_window(&skel, &plan)?;
        phases.mark("start iterator");
        let started_at = Instant::now()
            .checked_sub(Duration::from_nanos(
                monotonic_ns().saturating_sub(started_ns),
            ))
            .unwrap_or_else(Instant::now);
        if let Some(ms) = test_stall_ms("OFFCPUTIME_TEST_STALL_AFTER_ATTACH_MS") {
            // For tests: the attaching thread held up as a loaded machine
            // would.
            std::thread::sleep(Duration::from_millis(ms));
        }
        Ok(Tracer {
            skel,
            links,
            cpu_clocks,
            hook: attached,
            attached_at: started_at,
            attached_ns: started_ns,
            end_ns,
            stopped: false,
            wakers: opts.wakers,
            python: opts.python && opts.user_stacks && !legacy,
            plan,
            phases,
            deferring: dwarf && modern,
            deferred_left: Default::default(),
            events_left: Default::default(),
        })
    }

    /// Runs the start iterator: every thread blocked since before the hook
    /// was attached is claimed as blocked from the window's start, then the
    /// program opens the window (and sets its end, given a duration).
    /// Returns both ends, in CLOCK_MONOTONIC ns.
    fn open_window(skel: &OffcputimeSkel<'_>, plan: &Plan) -> Result<(u64, Option<u64>)> {
        let start = plan
            .program(Role::Start)
            .ok_or_else(|| anyhow!("no start iterator"))?;
        let prog = program_of(skel, start)?;
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
    pub fn attached_at(&self) -> Instant {
        self.attached_at
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
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&self.skel.maps.events, |data: &[u8]| {
                let mut ev = types::task_event::default();
                if plain::copy_from_bytes(&mut ev, data).is_ok() {
                    use types::task_event_kind as K;
                    let p = Proc {
                        tgid: ev.tgid,
                        start: ticks_of_ns(ev.process_start),
                    };
                    let space = AddressSpace {
                        mm: ev.mm,
                        exec_vm: ev.exec_vm,
                    };
                    let event = match K(ev.kind) {
                        K::TASK_EVENT_NEW => TaskEvent::New(p, space),
                        K::TASK_EVENT_CHANGED => TaskEvent::Changed(p, space),
                        K::TASK_EVENT_MAPPED => {
                            let mut m = types::mapped_event::default();
                            if plain::copy_from_bytes(&mut m, data).is_err() {
                                return 0;
                            }
                            let mut vmas = [MappedVma::default(); MAPPED_VMAS];
                            let n = (m.count as usize).min(MAPPED_VMAS).min(m.vma.len());
                            for (to, from) in vmas.iter_mut().zip(&m.vma[..n]) {
                                *to = MappedVma {
                                    start: from.start,
                                    end: from.end,
                                    offset: from.offset,
                                    dev: from.dev,
                                    ino: from.ino,
                                };
                            }
                            TaskEvent::Mapped(p, vmas, n)
                        }
                        K::TASK_EVENT_PYCODE => {
                            let mut c = types::py_code_event::default();
                            if plain::copy_from_bytes(&mut c, data).is_err() {
                                return 0;
                            }
                            TaskEvent::PyCode {
                                proc: p,
                                space,
                                code: c.code,
                                tag: c.tag,
                            }
                        }
                        K::TASK_EVENT_FORKED => TaskEvent::Forked {
                            child: p,
                            space,
                            parent: ev.parent,
                            map_start: ev.map_start,
                            map_count: ev.map_count,
                        },
                        _ => TaskEvent::Exited(p),
                    };
                    pending.borrow_mut().push(event);
                }
                0
            })
            .context("failed to set up the event ring buffer")?;
        // After the events: a round takes them first.
        if self.deferring {
            builder
                .add(&self.skel.maps.deferred_stacks, |data: &[u8]| {
                    if let Some(s) = RawUserStack::parse(data) {
                        stacks.borrow_mut().push(s);
                    }
                    0
                })
                .context("failed to set up the stack ring buffer")?;
        }
        let ringbuf = builder
            .build()
            .context("failed to set up the event ring buffer")?;
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
                wait_readable(ringbuf.epoll_fd(), timeout)
                    .context("failed to poll the event ring buffer")?;
            }
            let taken = ringbuf.consume_raw_n(RECORDS_PER_ROUND);
            if taken < 0 && taken != -libc::EINTR {
                return Err(std::io::Error::from_raw_os_error(-taken))
                    .context("failed to read the event ring buffer");
            }
            more = taken >= RECORDS_PER_ROUND as i32;
            if deadline.is_some_and(|d| Instant::now() >= d) || stop.load(Ordering::Relaxed) {
                break;
            }
            busy = on_events(&pending.take(), stacks.take());
        }
        self.deferred_left.borrow_mut().extend(stacks.take());
        self.events_left.borrow_mut().extend(pending.take());
        Ok(())
    }

    /// The user stacks copied for userspace that no wait passed on, and
    /// those left in the ring (once the trace is stopped, or between two
    /// waits).
    pub fn take_deferred(&self) -> Result<Vec<RawUserStack>> {
        let mut stacks = self.deferred_left.take();
        if !self.deferring {
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
        (self.attached_ns, end.max(self.attached_ns))
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
        let end = self
            .plan
            .program(Role::End)
            .ok_or_else(|| anyhow!("no end iterator"))?;
        let flush = program_of(&self.skel, end)?;
        run_iterator(&flush).context("failed to run the end iterator")
    }

    /// Reads the counts, the stacks they refer to and the loss counters.
    pub fn read(&self) -> Result<RawProfile> {
        self.read_counts(None)
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
        let cut = program_of(&self.skel, cut)?;
        run_iterator(&cut).context("failed to run the interval iterator")
    }

    /// `-i`: takes the counts of intervals up to `last` out of the table
    /// (those of later intervals stay), with the stacks they refer to and
    /// the loss counters so far.
    pub fn take_intervals(&self, last: u32) -> Result<RawProfile> {
        self.read_counts(Some(last))
    }

    fn read_counts(&self, take_through: Option<u32>) -> Result<RawProfile> {
        // Once the hooks are detached nothing writes the tables: the
        // stacks are read whole, in batches, on a thread of their own while
        // the counts are read (both are mostly the kernel copying: 100 MB
        // of stacks at 100,000 of them). Taking intervals out while tracing
        // goes key by key.
        if self.stopped && take_through.is_none() {
            let stacks = batch::Table::of(&self.skel.maps.stacks);
            return std::thread::scope(|scope| {
                let all = scope.spawn(move || {
                    let mut all = Stacks::default();
                    let outcome = batch::for_each_entry(stacks, |k, v| {
                        let id = u64::from_ne_bytes(k[..8].try_into().expect("8-byte key"));
                        all.insert_value(id, v);
                    });
                    // Where it failed, the stacks are looked up one by one.
                    matches!(outcome, Ok(batch::Outcome::Read)).then_some(all)
                });
                let mut profile = RawProfile::default();
                let wanted = self.read_entries(&mut profile, None)?;
                let all = all
                    .join()
                    .map_err(|_| anyhow!("the stack reader panicked"))?;
                self.finish_read(profile, wanted, all)
            });
        }
        let mut profile = RawProfile::default();
        let wanted = self.read_entries(&mut profile, take_through)?;
        self.finish_read(profile, wanted, None)
    }

    /// The counts into `profile` (see [`Tracer::read_counts`]): the ids of
    /// the stacks and wakers they name.
    fn read_entries(
        &self,
        profile: &mut RawProfile,
        take_through: Option<u32>,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let counts = &self.skel.maps.counts;
        // In batches once nothing writes the table; key by key where the
        // kernel has no batched lookup or it failed part way.
        let mut batched = Vec::new();
        let read_whole = self.stopped
            && take_through.is_none()
            && self
                .read_batched(counts, |k, v| {
                    batched.push(decode_entry(k, v)?);
                    Ok(())
                })
                .unwrap_or(false);
        if read_whole {
            profile.entries = batched;
        } else {
            let keys: Vec<Vec<u8>> = counts.keys().collect();
            for key_bytes in keys {
                let val_bytes = match take_through {
                    None => counts.lookup(&key_bytes, MapFlags::ANY)?,
                    Some(last) => {
                        let mut key = types::offcpu_key::default();
                        plain::copy_from_bytes(&mut key, &key_bytes)
                            .map_err(|e| anyhow!("bad key in counts map: {e:?}"))?;
                        if key.interval <= last {
                            counts.lookup_and_delete(&key_bytes)?
                        } else {
                            None
                        }
                    }
                };
                if let Some(val_bytes) = val_bytes {
                    profile.entries.push(decode_entry(&key_bytes, &val_bytes)?);
                }
            }
        }
        let mut wanted_stacks = Vec::new();
        let mut wanted_wakers = Vec::new();
        for e in &profile.entries {
            for s in [e.user_stack, e.kernel_stack] {
                if let StackRef::Id(id) = s {
                    wanted_stacks.push(id);
                }
            }
            if let Some(WakerRef::Id(id)) = e.waker {
                wanted_wakers.push(id);
            }
        }
        Ok((wanted_stacks, wanted_wakers))
    }

    /// The wakers and stacks the counts name, and the loss counters.
    /// `all`: every stored stack, where they were read whole.
    fn finish_read(
        &self,
        mut profile: RawProfile,
        (mut wanted_stacks, mut wanted_wakers): (Vec<u64>, Vec<u64>),
        all: Option<Stacks>,
    ) -> Result<RawProfile> {
        wanted_wakers.sort_unstable();
        wanted_wakers.dedup();
        for id in wanted_wakers {
            if let Some(w) = self.waker(id)? {
                for s in [w.user_stack, w.kernel_stack] {
                    if let StackRef::Id(id) = s {
                        wanted_stacks.push(id);
                    }
                }
                profile.wakers.insert(id, w);
            }
        }
        wanted_stacks.sort_unstable();
        wanted_stacks.dedup();
        match all {
            Some(mut all) => {
                // Stacks nothing counts are let go where they are many
                // (a stack looked up by the counts is found either way).
                if all.len() > wanted_stacks.len() + wanted_stacks.len() / 4 {
                    all.retain(|id| wanted_stacks.binary_search(&id).is_ok());
                }
                // A stack stored behind the batch as it went (by a hook
                // still returning after the detach) is looked up alone.
                for &id in &wanted_stacks {
                    if !all.contains_key(&id) {
                        if let Some(frames) = self.stack(id)? {
                            all.insert(id, &frames);
                        }
                    }
                }
                profile.stacks = all;
            }
            None => {
                profile.stacks.reserve(wanted_stacks.len());
                for id in wanted_stacks {
                    if let Some(frames) = self.stack(id)? {
                        profile.stacks.insert(id, &frames);
                    }
                }
            }
        }
        profile.counters = self.read_counters()?;
        Ok(profile)
    }

    /// Every entry of `map` given to `f`, in batches: true if done, false
    /// where the kernel has no batched lookup for it (nothing was given).
    fn read_batched<M: MapCore>(
        &self,
        map: &M,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let mut failed = None;
        let outcome = batch::for_each_entry(batch::Table::of(map), |k, v| {
            if failed.is_none() {
                if let Err(e) = f(k, v) {
                    failed = Some(e);
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(outcome == batch::Outcome::Read)
    }

    /// A pass over the counts for the user stacks counted so far for the
    /// processes in `procs`, done a slice at a time (see
    /// [`StackScan::step`]): the table holds every thread's stacks, tens
    /// of thousands on a busy machine, and reading it all at once would
    /// hold up the reading of events.
    pub fn scan_user_stacks(&self, procs: HashSet<Proc>) -> StackScan<'_> {
        // The wakers' stacks are few (one per distinct waker): all at once.
        let wanted = if self.wakers {
            self.waker_user_stacks(&procs).into_iter().collect()
        } else {
            HashSet::new()
        };
        // Key by key: the batched lookup of this libbpf-rs version gave
        // keys that matched no process under load (the soak test's
        // exited children lost their names), where the plain walk does not.
        let keys: Box<dyn Iterator<Item = Vec<u8>> + '_> = Box::new(self.skel.maps.counts.keys());
        StackScan {
            procs,
            keys,
            wanted,
        }
    }

    fn waker(&self, id: u64) -> Result<Option<RawWaker>> {
        let Some(bytes) = self
            .skel
            .maps
            .wakers
            .lookup(&id.to_ne_bytes(), MapFlags::ANY)?
        else {
            return Ok(None);
        };
        let mut w = types::waker_info::default();
        plain::copy_from_bytes(&mut w, &bytes)
            .map_err(|e| anyhow!("bad value in wakers map: {e:?}"))?;
        Ok(Some(RawWaker {
            tgid: w.tgid,
            start: ticks_of_ns(w.process_start),
            pid: w.pid,
            comm: comm_to_string(&w.comm),
            user_stack: StackRef::from_raw(w.user_stack_id),
            kernel_stack: StackRef::from_raw(w.kernel_stack_id),
        }))
    }

    /// The user stacks of the wakers of `procs` (`--wakers`): (process,
    /// stack id).
    fn waker_user_stacks(&self, procs: &HashSet<Proc>) -> Vec<(Proc, u64)> {
        let wakers = &self.skel.maps.wakers;
        let mut out = Vec::new();
        for key in wakers.keys() {
            let Ok(Some(bytes)) = wakers.lookup(&key, MapFlags::ANY) else {
                continue;
            };
            let mut w = types::waker_info::default();
            if plain::copy_from_bytes(&mut w, &bytes).is_err() {
                continue;
            }
            let p = Proc {
                tgid: w.tgid,
                start: ticks_of_ns(w.process_start),
            };
            if let (true, StackRef::Id(id)) =
                (procs.contains(&p), StackRef::from_raw(w.user_stack_id))
            {
                out.push((p, id));
            }
        }
        out
    }

    fn stack(&self, id: u64) -> Result<Option<Vec<u64>>> {
        read_stack(&self.skel, id)
    }

    fn read_counters(&self) -> Result<LossCounters> {
        read_counters(&self.skel)
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
            [C::CNT_UNWIND_DEFER_LOST]
                .iter()
                .filter_map(|c| map.lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY).ok()?)
                .flatten()
                .filter_map(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))
                .sum()
        }))
    }

    /// The blocks under way of processes `tgids` (CPython processes whose
    /// interpreter was just noted, and `done`: those no longer to be
    /// looked at), walked before their interpreter was known, are walked
    /// again with their Python frames (the `python_refresh` iterator).
    pub fn refresh_python(&self, tgids: &[u32], done: &[u32]) -> Result<()> {
        if !self.plan.python_refresh {
            return Ok(());
        }
        let map = &self.skel.maps.py_refresh;
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
        run_iterator(&self.skel.progs.python_refresh)
            .context("failed to run the Python frames iterator")
    }

    /// Where userspace tells the program of CPython processes, if their
    /// Python frames are walked.
    pub fn python_store(&self) -> Option<PythonStore> {
        self.python
            .then(|| PythonStore::new(&self.skel).ok())
            .flatten()
    }

    /// Stores `frames` (innermost first) as stack `id` among those the BPF
    /// program stored, where they are read as its own: a stack walked in
    /// userspace (see [`crate::deferred`]). False where the table is full
    /// (or refuses it).
    pub fn store_stack(&self, id: u64, frames: &[u64]) -> bool {
        let size = self.skel.maps.stacks.value_size() as usize;
        let mut value = vec![0u8; size];
        for (slot, f) in value.chunks_exact_mut(8).zip(frames) {
            slot.copy_from_slice(&f.to_ne_bytes());
        }
        self.skel
            .maps
            .stacks
            .update(&id.to_ne_bytes(), &value, MapFlags::ANY)
            .is_ok()
    }
}

/// The frames of the stored stack `id`, innermost first.
fn read_stack(skel: &OffcputimeSkel<'_>, id: u64) -> Result<Option<Vec<u64>>> {
    Ok(skel
        .maps
        .stacks
        .lookup(&id.to_ne_bytes(), MapFlags::ANY)?
        .map(|bytes| stack_frames(&bytes)))
}

/// One entry of the table of counts.
fn decode_entry(key_bytes: &[u8], val_bytes: &[u8]) -> Result<RawEntry> {
    let mut key = types::offcpu_key::default();
    let mut val = types::offcpu_val::default();
    plain::copy_from_bytes(&mut key, key_bytes)
        .map_err(|e| anyhow!("bad key in counts map: {e:?}"))?;
    plain::copy_from_bytes(&mut val, val_bytes)
        .map_err(|e| anyhow!("bad value in counts map: {e:?}"))?;
    Ok(RawEntry {
        tgid: key.tgid,
        start: ticks_of_ns(key.process_start),
        pid: key.pid,
        comm: comm_to_string(&key.comm),
        user_stack: StackRef::from_raw(key.user_stack_id),
        kernel_stack: StackRef::from_raw(key.kernel_stack_id),
        state: OffState::from_raw(key.state),
        waker: WakerRef::from_raw(key.waker_id),
        interval: key.interval,
        span: key.span.max(1),
        total_ns: val.total_ns,
        count: val.count,
    })
}

/// A stored stack's frames: its addresses up to the first 0.
fn stack_frames(bytes: &[u8]) -> Vec<u64> {
    let (words, len) = stored_words(bytes);
    words.take(len).collect()
}

/// The BPF program's counters of lost and incomplete data.
fn read_counters(skel: &OffcputimeSkel<'_>) -> Result<LossCounters> {
    let mut sums = [0u64; types::offcpu_counter::CNT_MAX.0 as usize];
    for (i, sum) in sums.iter_mut().enumerate() {
        let key = (i as u32).to_ne_bytes();
        if let Some(per_cpu) = skel.maps.counters.lookup_percpu(&key, MapFlags::ANY)? {
            for v in per_cpu {
                if v.len() >= 8 {
                    *sum += u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"));
                }
            }
        }
    }
    Ok(LossCounters::from_kernel(&sums))
}

/// An mmapable BPF array map that userspace writes through short-lived
/// mappings of just the pages written: the table lives in kernel memory
/// (its size fixed at load, see `-v`), and is not kept mapped, so that it
/// does not count as the profiler's resident memory beyond a write.
struct WindowedArray<T> {
    map: libbpf_rs::MapHandle,
    len: usize,
    _item: std::marker::PhantomData<T>,
}

/// Bytes written through one mapping at most.
const WINDOW_BYTES: usize = 1 << 20;

impl<T: Copy> WindowedArray<T> {
    fn new(map: &libbpf_rs::Map<'_>, what: &str) -> Result<WindowedArray<T>> {
        Ok(WindowedArray {
            map: libbpf_rs::MapHandle::try_from(map)
                .with_context(|| format!("failed to open the {what} table"))?,
            len: map.max_entries() as usize,
            _item: std::marker::PhantomData,
        })
    }

    /// Calls `f` with the whole array, mapped for reading for the call
    /// alone (the pages it reads are resident only meanwhile).
    fn read<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        use std::os::fd::{AsFd, AsRawFd};
        let bytes = self.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(f(&[]));
        }
        // SAFETY: a shared read-only mapping of the array's data, whose
        // size is a whole number of elements, unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                self.map.as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("failed to map an unwind table");
        }
        // SAFETY: the mapping holds `len` elements of T (plain old data,
        // any bytes a valid value); userspace writes the array only
        // through `write`, never while this borrow lives (both take the
        // store), and the BPF program only reads it.
        let items = unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), self.len) };
        let r = f(items);
        // SAFETY: the mapping made above, no longer borrowed.
        unsafe { libc::munmap(ptr, bytes) };
        Ok(r)
    }

    /// Writes `items` from element `start` on.
    fn write(&self, start: usize, items: &[T]) -> Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        let size = std::mem::size_of::<T>();
        let end = start
            .checked_add(items.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| anyhow!("write past the end of a table"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let per_window = (WINDOW_BYTES / size).max(1);
        let mut at = start;
        while at < end {
            let chunk = &items[at - start..(at - start + per_window).min(end - start)];
            let begin = at * size;
            let offset = begin / page * page;
            let bytes = (begin + std::mem::size_of_val(chunk) - offset).div_ceil(page) * page;
            // SAFETY: a shared mapping of whole pages inside the array's
            // data (elements of T are packed: their size is a multiple of
            // 8), unmapped below before anything else can use it.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.map.as_fd().as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error())
                    .context("failed to map an unwind table");
            }
            // SAFETY: `chunk` fits in the mapping from `begin - offset`;
            // the BPF program only reads the table.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    ptr.cast::<u8>().add(begin - offset).cast::<T>(),
                    chunk.len(),
                );
                libc::munmap(ptr, bytes);
            }
            at += chunk.len();
        }
        Ok(())
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
/// [`crate::deferred`]): room for 512 copies of 16 KiB between two reads.
const DEFERRED_RING_BYTES: u32 = 8 << 20;

/// Files whose tables the BPF program can find by their inode (see
/// `struct unwind_file`): more than the objects that fit in the rows of a
/// busy machine.
pub const UNWIND_FILES: u32 = 16384;

/// Entries of the table of blocked time (one per thread and pair of
/// stacks): twice the stacks that can be stored, at least 65536.
pub fn counts_capacity(stack_storage_size: u32) -> u32 {
    stack_storage_size.saturating_mul(2).max(65536)
}

/// The BPF program's DWARF unwind tables (see `offcputime.h`): rows and
/// mappings written in place, processes pointed at their mappings.  It
/// outlives the tracer's maps safely: the map handles hold their own
/// references.
pub struct UnwindStore {
    rows: WindowedArray<types::unwind_row>,
    mappings: WindowedArray<types::unwind_mapping>,
    procs: libbpf_rs::MapHandle,
    files: libbpf_rs::MapHandle,
    /// Changed after an entry of `files` is removed or rewritten (see
    /// `unwind_files_gen`).
    files_gen: libbpf_rs::MapHandle,
    files_gen_now: u64,
    files_written: std::collections::HashSet<(u64, u64)>,
    /// The generation of the next process tables written.
    next_gen: u64,
}

impl UnwindStore {
    fn new(skel: &OffcputimeSkel<'_>) -> Result<UnwindStore> {
        Ok(UnwindStore {
            rows: WindowedArray::new(&skel.maps.unwind_rows, "unwind rows")?,
            mappings: WindowedArray::new(&skel.maps.unwind_maps, "unwind mappings")?,
            procs: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_procs)
                .context("failed to open the unwind processes map")?,
            files: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_files)
                .context("failed to open the unwind files map")?,
            files_gen: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_files_gen)
                .context("failed to open the unwind files generation")?,
            files_gen_now: 0,
            files_written: Default::default(),
            next_gen: 1,
        })
    }
}

impl UnwindStore {
    /// After an entry of the files was removed or rewritten: walks kept
    /// in the stack cache that went through the old one are walked again.
    fn next_files_gen(&mut self) {
        self.files_gen_now += 1;
        // Failing, the cache could prove walks through entries gone:
        // remove every file entry then.
        if self
            .files_gen
            .update(
                &0u32.to_ne_bytes(),
                &self.files_gen_now.to_ne_bytes(),
                MapFlags::ANY,
            )
            .is_err()
        {
            for (dev, ino) in std::mem::take(&mut self.files_written) {
                let key = types::unwind_file_key { dev, ino };
                // SAFETY: plain old data.
                let _ = self.files.delete(unsafe { plain::as_bytes(&key) });
            }
        }
    }
}

impl crate::unwind::TableStore for UnwindStore {
    fn row_capacity(&self) -> usize {
        self.rows.len
    }

    fn mapping_capacity(&self) -> usize {
        self.mappings.len
    }

    fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()> {
        self.rows.write(start, rows)
    }

    fn write_mappings(&mut self, start: usize, mappings: &[types::unwind_mapping]) -> Result<()> {
        self.mappings.write(start, mappings)
    }

    fn set_process(
        &mut self,
        tgid: u32,
        start: u32,
        count: u32,
        space: AddressSpace,
    ) -> Result<()> {
        let proc = types::unwind_proc {
            map_start: start,
            map_count: count,
            mm: space.mm,
            exec_vm: space.exec_vm,
            gen: self.next_gen,
            // Not cold before it has had the chance to block.
            used: monotonic_ns(),
        };
        self.next_gen += 1;
        // SAFETY: unwind_proc is plain old data.
        let value = unsafe { plain::as_bytes(&proc) };
        self.procs
            .update(&tgid.to_ne_bytes(), value, MapFlags::ANY)
            .with_context(|| format!("failed to store the unwind tables of process {tgid}"))
    }

    fn remove_process(&mut self, tgid: u32) {
        // Not there (never stored) is fine.
        let _ = self.procs.delete(&tgid.to_ne_bytes());
    }

    fn set_file(&mut self, key: &types::unwind_file_key, file: &types::unwind_file) -> Result<()> {
        // SAFETY: both are plain old data.
        let (k, v) = unsafe { (plain::as_bytes(key), plain::as_bytes(file)) };
        self.files
            .update(k, v, MapFlags::ANY)
            .context("failed to store the unwind tables of a file")?;
        if !self.files_written.insert((key.dev, key.ino)) {
            self.next_files_gen();
        }
        Ok(())
    }

    fn remove_file(&mut self, key: &types::unwind_file_key) {
        // SAFETY: plain old data.
        let _ = self.files.delete(unsafe { plain::as_bytes(key) });
        if self.files_written.remove(&(key.dev, key.ino)) {
            self.next_files_gen();
        }
    }

    fn read(
        &self,
        f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping]),
    ) -> Result<()> {
        self.rows
            .read(|rows| self.mappings.read(|mappings| f(rows, mappings)))?
    }

    fn last_used(&self, tgid: u32) -> Option<u64> {
        let bytes = self
            .procs
            .lookup(&tgid.to_ne_bytes(), MapFlags::ANY)
            .ok()
            .flatten()?;
        let mut proc = types::unwind_proc::default();
        plain::copy_from_bytes(&mut proc, &bytes).ok()?;
        Some(proc.used)
    }
}

/// Checks, before loading anything, what the kernel and our privileges
/// allow, so that the user gets one clear sentence instead of a libbpf
/// error code.
pub fn check_environment() -> Result<()> {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing); \
             offcputime needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    let cap_eff = crate::process::effective_capabilities();
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    // (With the privilege to load: without it every probe says no.)
    if has(CAP_SYS_ADMIN) {
        return kernel::check_minimum();
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| *n)
        .collect();
    if !missing.is_empty() {
        bail!(
            "missing privilege: {} (run as root, or grant {} to the binary)",
            missing.join(" and "),
            missing.join(", ").to_lowercase()
        );
    }
    kernel::check_minimum()
}
