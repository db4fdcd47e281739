//! The program: parse, trace, report.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;

use crate::cli::{check_targets, Args, Config, Format, SnapshotConfig};
use crate::deferred::Deferred;
use crate::output::sink::Sink;
use crate::output::{folded, otlp, pprof, speedscope, svg, text};
use crate::process::Proc;
use crate::process::Registry;
use crate::profile::{self, Profile};
use crate::raw::{StackRef, TaskEvent};
use crate::symbolize::{SymbolizeOptions, Symbolizer};
use crate::text::count;
use crate::tracer::{check_environment, Tracer};
use crate::unwind::Unwinder;

mod collector;
mod exits;
mod interval_output;
mod outputs;
mod report;
mod session;

use collector::*;
use exits::*;
use interval_output::*;
use outputs::*;
use report::*;
use session::*;

/// What `main` should do after `run`.
pub enum Outcome {
    Done,
    /// `--help` or `--version` was printed.
    Info,
}

/// Parses the command line, traces, and writes the report to stdout.
pub fn run() -> Result<Outcome> {
    let began = Instant::now();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                // Not print!: a reader gone (`| head`) is an error to
                // return (it exits 0), not a panic.
                let mut out = io::stdout().lock();
                out.write_all(e.to_string().as_bytes())
                    .and_then(|()| out.flush())
                    .context("failed to write the help")?;
                return Ok(Outcome::Info);
            }
            // clap's first line, without its usage block.
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            anyhow::bail!("{first} (see --help)");
        }
    };
    let config = args.into_config()?;
    keep_large_allocations_apart();
    allow_open_files();
    match &config.snapshot {
        Some(snap) => snapshot(&config, snap, began)?,
        None => trace(&config, began)?,
    }
    Ok(Outcome::Done)
}

fn set_libbpf_logging(verbose: bool) {
    if verbose {
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, |_, msg: String| {
            eprint!("libbpf: {msg}")
        })));
    } else {
        // Failures are reported once, by us; libbpf's own log (verifier
        // output of a hook that is tried and skipped) is noise.
        libbpf_rs::set_print(None);
    }
}

/// The processes traced get their tables before tracing starts, not at
/// their first block: the stacks of threads blocked since before the start
/// are walked with them too. Their mappings are read and the tables built
/// while the BPF program loads, and written once it has.
struct StartingTables<'a> {
    config: &'a crate::tracer::TracerOptions,
    /// `--cgroup`'s directories: the processes in them are those traced.
    cgroups: &'a [std::path::PathBuf],
    registry: &'a mut Registry,
    unwinder: &'a mut Option<Unwinder>,
    /// The processes noted by `prepare`.
    noted: Vec<u32>,
    /// A store was given already (a hook loaded, then failed to attach).
    installed: bool,
}

impl<'a> StartingTables<'a> {
    /// Tables for the processes `config` traces, noted in `registry`;
    /// `unwinder` gets them.
    fn new(
        config: &'a Config,
        registry: &'a mut Registry,
        unwinder: &'a mut Option<Unwinder>,
    ) -> StartingTables<'a> {
        StartingTables {
            config: &config.tracer,
            cgroups: &config.cgroups,
            registry,
            unwinder,
            noted: Vec::new(),
            installed: false,
        }
    }
}

impl crate::tracer::StartTables for StartingTables<'_> {
    fn prepare(&mut self, capacity: crate::tracer::UnwindCapacity) {
        if self.unwinder.is_some() {
            return;
        }
        let mut u = Unwinder::without_store(capacity.rows as usize, capacity.mappings as usize);
        self.noted = processes_to_trace(self.config, self.cgroups);
        for &tgid in &self.noted {
            self.registry.note_process(tgid, None, false);
            u.note_process(&*self.registry, tgid);
        }
        self.registry.read_before_the_start(&self.noted);
        *self.unwinder = Some(u);
    }

    fn install(&mut self, store: crate::tracer::UnwindStore) {
        let registry = &*self.registry;
        let u = match self.unwinder.as_mut() {
            Some(u) if !self.installed => {
                u.set_store(registry, store);
                u
            }
            _ => {
                // Another attempt's maps: everything written again.
                let mut u = Unwinder::new(store);
                for &tgid in &self.noted {
                    u.note_process(registry, tgid);
                }
                self.unwinder.insert(u)
            }
        };
        self.installed = true;
        u.finish(registry, Duration::from_secs(10));
    }

    fn install_runtimes(&mut self, store: crate::tracer::RuntimeStore) {
        // Another attempt's store: the marks of the one before are void.
        self.registry.forget_runtimes_at_start();
        if self.unwinder.is_none() {
            // No tables: the processes are noted here.
            self.noted = processes_to_trace(self.config, self.cgroups);
            for &tgid in &self.noted {
                self.registry.note_process(tgid, None, false);
            }
            self.registry.read_before_the_start(&self.noted);
        }
        for &tgid in &self.noted {
            if let Some(start) = self.registry.start_of(tgid) {
                // The address space is claimed by the first walk.
                let p = Proc { tgid, start };
                if note_runtime(&store, self.registry, p, 0).is_some() {
                    self.registry.note_runtime_at_start(p);
                }
            }
        }
    }
}

/// Tells the BPF program where the runtime of process `p` (its mappings
/// just read) keeps its threads' frames, if it runs a runtime whose frames
/// can be read (see [`crate::runtime`]); returns that runtime, if told.
fn note_runtime(
    store: &crate::tracer::RuntimeStore,
    registry: &mut Registry,
    p: Proc,
    mm: u64,
) -> Option<crate::runtime::Kind> {
    let Some(entry) = registry.note_runtime(p) else {
        // No runtime (any more: an exec into another program).
        store.remove(p.tgid);
        return None;
    };
    match store.set(p.tgid, mm, &entry) {
        Ok(()) => Some(entry.kind),
        Err(e) => {
            eprintln!("offcputime: {e:#}");
            None
        }
    }
}

/// How long the blocks of a runtime's process noted while tracing are
/// looked at again for their runtime's frames (see
/// [`Tracer::refresh_runtimes`]): its tables may take a moment.
const RUNTIME_REFRESH_FOR: Duration = Duration::from_secs(10);

/// Checks privileges and targets, and installs the signal handler.
fn prepare(config: &Config, stop: &Arc<AtomicBool>) -> Result<()> {
    check_environment()?;
    check_targets(&config.tracer)?;
    set_libbpf_logging(config.verbose);
    let stop = stop.clone();
    ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
        .context("failed to install the SIGINT/SIGTERM handler")
}

/// Traces as `config` says and writes the report. `began` is when the
/// program started, for the start-up time that `-v` shows.
pub fn trace(config: &Config, began: Instant) -> Result<()> {
    let mut objects = crate::tracer::Objects::default();
    let (mut session, mut tracer) = Session::start(config, began, &mut objects)?;
    session.run(&mut tracer)?;
    // The report, raised as start-up is (see priority.rs): on a busy
    // machine at the user's priority it waits seconds for a CPU (measured
    // under examples/stackfarm: docs/benchmarks-history.md).
    let _raised = crate::priority::raise_start();
    let (raw, end) = session.end(tracer)?;
    let written = session.write(raw, &end)?;
    session.report(&written, end);
    Ok(())
}

/// `--snapshot`: what every task waits in now, written as `config` says.
pub fn snapshot(config: &Config, snap: &SnapshotConfig, began: Instant) -> Result<()> {
    let mut outputs = Outputs::open(config)?;
    let symbolizer = symbolizer_for(config);
    let mut registry = Registry::new();
    registry.keep_call_glue(config.python_glue);
    let mut unwinder: Option<Unwinder> = None;
    let raw = take_snapshot(config, snap, &mut registry, &mut unwinder)?;
    eprintln!("{}", config.status_line());
    if config.verbose {
        eprintln!(
            "offcputime: snapshot of {} at CLOCK_MONOTONIC {:.6}, {:.1} ms after start",
            count(raw.tasks.len() as u64, "task", "tasks"),
            raw.seen_ns as f64 / 1e9,
            began.elapsed().as_secs_f64() * 1e3
        );
    }
    for e in &raw.runtime_code {
        if let crate::raw::TaskEvent::RuntimeCode {
            kind,
            proc,
            code,
            tag,
            at,
            ..
        } = *e
        {
            registry.note_runtime_code(kind, proc, code, tag, at);
        }
    }
    let mut taken = crate::snapshot::build(&raw, &mut registry, &symbolizer, config.shape);
    if let Some(filter) = &config.filter {
        let before = taken.tasks.len();
        let dropped = taken.retain(filter, config.shape);
        if before > 0 && dropped == before {
            eprintln!(
                "offcputime: no task was left by --grep/--exclude ({} left out)",
                count(before as u64, "task", "tasks")
            );
        } else if config.verbose {
            eprintln!(
                "offcputime: --grep/--exclude left out {dropped} of {}",
                count(before as u64, "task", "tasks")
            );
        }
    }
    let profile = taken.profile();
    outputs.write(config, |format, out| match format {
        Format::Text => {
            crate::output::snapshot::write(&taken, config.shape, snap.sort, config.verbose, out)
        }
        other => render(&profile, config, other, out),
    })?;
    if raw.tasks.is_empty() {
        eprintln!("offcputime: no task matched");
    }
    let unreadable = raw
        .tasks
        .iter()
        .filter(|t| t.user_stack == StackRef::NotReadable)
        .count();
    report_unreadable(
        config,
        unreadable,
        raw.user_stacks,
        crate::text::noun(
            unreadable as u64,
            "task shows no user stack:",
            "tasks show no user stack:",
        ),
    );
    report_missed(
        &profile,
        profile.missed_stacks(config.shape.mode),
        config,
        unreadable,
    );
    report_denied(&registry, &symbolizer, config);
    if let Some(u) = &unwinder {
        report_unwinding(u, &Deferred::new(0), &profile, config.verbose);
    }
    report_namespaces(&registry, config.verbose);
    Ok(())
}

/// Checks privileges and targets and takes the snapshot, raised as
/// start-up is (see priority.rs), with the unwind tables of the processes
/// traced (see [`StartingTables`]); falls back as [`fall_back`] says.
fn take_snapshot(
    config: &Config,
    snap: &SnapshotConfig,
    registry: &mut Registry,
    unwinder: &mut Option<Unwinder>,
) -> Result<crate::tracer::RawSnapshot> {
    check_environment()?;
    check_targets(&config.tracer)?;
    set_libbpf_logging(config.verbose);
    let raised = crate::priority::raise_start();
    let taken = crate::tracer::take_snapshot(
        &config.tracer,
        snap.states,
        &mut StartingTables::new(config, registry, unwinder),
    );
    drop(raised);
    Ok(fall_back(taken?, unwinder))
}

/// The symbolizer of the frames, as `config` names them: kernel frames as
/// the kernel prints them where it can, else from kallsyms.
fn symbolizer_for(config: &Config) -> Symbolizer {
    let symbolizer = Symbolizer::new(SymbolizeOptions {
        offsets: config.offsets,
        inline: config.inline,
        lines: config.lines,
        addresses: config.addresses,
    });
    if config.tracer.test.kallsyms_names {
        return symbolizer;
    }
    symbolizer.with_kernel_namer(crate::tracer::kernel::name_kernel_addresses)
}

/// Start-up's fallback: where DWARF unwinding could not be set up (`why`
/// of `started`), its tables are dropped and user stacks are walked with
/// frame pointers, which is said.
fn fall_back<T>((started, why): (T, Option<anyhow::Error>), unwinder: &mut Option<Unwinder>) -> T {
    if let Some(why) = why {
        *unwinder = None;
        eprintln!(
            "offcputime: DWARF unwinding is not available here ({why:#}); user stacks are \
             walked with frame pointers"
        );
    }
    started
}

/// `--grep`/`--exclude` applied; says so when nothing is left of a
/// profile that had stacks, and with -v how much was left out.
fn filter_profile(filter: &crate::filter::StackFilter, profile: &mut Profile, config: &Config) {
    let before = profile.samples.len();
    let dropped = filter.apply(profile, config.shape);
    if before > 0 && dropped == before {
        eprintln!(
            "offcputime: no stack was left by --grep/--exclude ({} left out)",
            count(before as u64, "stack", "stacks")
        );
    } else if config.verbose {
        eprintln!(
            "offcputime: --grep/--exclude left out {dropped} of {}",
            count(before as u64, "stack", "stacks")
        );
    }
}

/// Writes the profile in one format.
fn render(
    profile: &Profile,
    config: &Config,
    format: &Format,
    out: &mut dyn Write,
) -> io::Result<()> {
    match format {
        Format::Text => match config.group {
            Some(sort) => crate::output::group::write(profile, config.shape, sort, out),
            None => text::write(profile, config.shape, out),
        },
        Format::Folded => folded::write(profile, config.shape, out),
        Format::Svg(o) => svg::write(profile, config.shape, o, out),
        Format::Pprof(o) => pprof::write(profile, config.shape, o, out),
        Format::Speedscope(o) => speedscope::write(profile, config.shape, o, out),
        Format::Otlp(o) => otlp::write(profile, config.shape, o, out),
        Format::Dot => crate::output::dot::write(profile, out),
    }
}

/// The processes alive now whose threads are traced (none if no user
/// stacks are wanted): those of -p, those of the threads of -t, else all.
fn processes_to_trace(
    t: &crate::tracer::TracerOptions,
    cgroups: &[std::path::PathBuf],
) -> Vec<u32> {
    if !t.user_stacks {
        return Vec::new();
    }
    // --chains follows threads the filters leave out: all of them.
    if t.chains {
        return all_processes();
    }
    if t.kernel_threads_only {
        return Vec::new();
    }
    if !t.tgids.is_empty() {
        return t.tgids.clone();
    }
    if t.tids.is_empty() && !cgroups.is_empty() {
        return crate::container::processes_in(cgroups);
    }
    let tgid_of = |tid: u32| {
        std::fs::read_to_string(format!("/proc/{tid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))?
            .trim()
            .parse()
            .ok()
    };
    if !t.tids.is_empty() {
        let mut tgids: Vec<u32> = t.tids.iter().filter_map(|&tid| tgid_of(tid)).collect();
        tgids.sort_unstable();
        tgids.dedup();
        return tgids;
    }
    all_processes()
}

/// Every process alive now.
fn all_processes() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// How long the end of a trace waits for the tables of processes whose
/// stacks were copied for userspace (see [`Deferred`]).
const DEFERRED_TABLES_WAIT: Duration = Duration::from_secs(5);

/// The end of a trace: the stacks copied for userspace still in the ring
/// buffer are read, and every copy is walked with its process's tables,
/// waiting for those still being built (up to [`DEFERRED_TABLES_WAIT`]);
/// copies left are given up (reported missed). `walked` is told of each
/// copy walked and stored, with its frames.
fn walk_deferred(
    tracer: &Tracer<'_>,
    deferred: &mut Deferred,
    registry: &mut Registry,
    mut unwinder: Option<&mut Unwinder>,
    walked: &mut dyn FnMut(u64, &[u64]),
) {
    match tracer.take_deferred() {
        Ok(stacks) => deferred.add(stacks, &|p| registry.copy_mark(p)),
        // Their blocks are reported with missed user stacks.
        Err(e) => eprintln!("offcputime: {e:#}"),
    }
    deferred.end_stall();
    if let Some(u) = unwinder.as_deref_mut() {
        if deferred.is_waiting() {
            u.finish(registry, DEFERRED_TABLES_WAIT);
            collector::walk_copies(u, tracer, registry, deferred, walked, false);
        }
    }
    // A copy of an address space other than the last its process's
    // notices said was of an image an exec replaced, unless a notice was
    // lost (the copy's own image's, perhaps).
    let noted = |p: crate::raw::Proc| unwinder.as_deref().and_then(|u| u.noted_space(p.tgid));
    let all_news = tracer.no_news_lost();
    deferred.give_up(
        &|p| {
            crate::process::start_ticks(p.tgid) != Some(p.start)
                || crate::process::address_space_gone(p.tgid)
        },
        &|p, space| all_news && noted(p).is_some_and(|n| n.mm != 0 && n.mm != space.mm),
    );
}

/// `--push`: how long the end waits for what is queued to be sent.
const PUSH_DEADLINE: Duration = Duration::from_secs(5);

/// The Instant at which CLOCK_MONOTONIC reads `ns` (Instant is that clock).
fn instant_of_monotonic(ns: u64) -> Instant {
    let now = crate::raw::monotonic_ns();
    let now_i = Instant::now();
    if ns >= now {
        now_i + Duration::from_nanos(ns - now)
    } else {
        now_i
            .checked_sub(Duration::from_nanos(now - ns))
            .unwrap_or(now_i)
    }
}

/// The soft limit on open files raised to the hard one: every distinct
/// file the traced processes map is held open (by descriptor, so that it
/// is still named once deleted, or once its process has exited), and a
/// busy machine maps more than the usual soft limit of 1024.
fn allow_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Large buffers (tables being built, files read) are mapped apart and
/// unmapped when freed, instead of glibc's threshold rising after the
/// first one so that the next stay on the heap.
fn keep_large_allocations_apart() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// CPU time used by the whole process so far, in milliseconds (a report's
/// own cost, apart from the waits of a busy machine).
fn process_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}
