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
use crate::output::{folded, pprof, speedscope, svg, text};
use crate::process::Proc;
use crate::process::Registry;
use crate::profile::{self, Profile};
use crate::raw::{StackRef, TaskEvent};
use crate::symbolize::{SymbolizeOptions, Symbolizer};
use crate::tracer::{check_environment, Tracer};
use crate::unwind::Unwinder;

mod collector;
mod exits;
mod interval_output;
mod report;

use collector::*;
use exits::*;
use interval_output::*;
use report::*;

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

fn set_libbpf_logging(verbose: bool, verifier_stats: bool) {
    if verifier_stats {
        // For start-up measurements: the verifier's line of statistics of
        // each program loaded.
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, |_, msg: String| {
            for line in msg.lines() {
                if line.starts_with("prog '") && line.contains("BEGIN PROG LOAD LOG")
                    || line.starts_with("verification time")
                    || line.starts_with("processed ")
                    || line.starts_with("stack depth ")
                {
                    eprintln!("libbpf: {line}");
                }
            }
        })));
        return;
    }
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

    fn install_python(&mut self, store: crate::tracer::PythonStore) {
        if self.unwinder.is_none() {
            // No tables: the processes are noted here.
            self.noted = processes_to_trace(self.config, self.cgroups);
            for &tgid in &self.noted {
                self.registry.note_process(tgid, None, false);
            }
        }
        for &tgid in &self.noted {
            if let Some(start) = self.registry.start_of(tgid) {
                // The address space is claimed by the first walk.
                note_python(&store, self.registry, Proc { tgid, start }, 0);
            }
        }
    }
}

/// Tells the BPF program where the interpreter of process `p` (its
/// mappings just read) keeps its threads' frames, if it is a CPython
/// process whose interpreter's layout is known.
fn note_python(
    store: &crate::tracer::PythonStore,
    registry: &mut Registry,
    p: Proc,
    mm: u64,
) -> bool {
    let Some(mut entry) = registry.note_python(p) else {
        // No interpreter (any more: an exec into another program).
        store.remove(p.tgid);
        return false;
    };
    entry.mm = mm;
    match store.set(p.tgid, &entry) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("offcputime: {e:#}");
            false
        }
    }
}

/// How long the blocks of a CPython process noted while tracing are
/// looked at again for their Python frames (see
/// [`Tracer::refresh_python`]): its tables may take a moment.
const PYTHON_REFRESH_FOR: Duration = Duration::from_secs(10);

/// Checks privileges and targets, and installs the signal handler.
fn prepare(config: &Config, stop: &Arc<AtomicBool>) -> Result<()> {
    check_environment()?;
    check_targets(&config.tracer)?;
    set_libbpf_logging(config.verbose, config.tracer.test.verifier_stats);
    let stop = stop.clone();
    ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
        .context("failed to install the SIGINT/SIGTERM handler")
}

/// Traces as `config` says and writes the report. `began` is when the
/// program started, for the start-up time that `-v` shows.
pub fn trace(config: &Config, began: Instant) -> Result<()> {
    // Opened first: a path that cannot be written fails now, before any
    // measurement, whatever else is wrong.
    let (sink, more_sinks) = open_sinks(config)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut symbolizer = Symbolizer::new(SymbolizeOptions {
        offsets: config.offsets,
        inline: config.inline,
        lines: config.lines,
        addresses: config.addresses,
    });
    let mut registry = Registry::new();
    let mut started = Instant::now();
    let mut objects = crate::tracer::Objects::default();
    let mut unwinder: Option<Unwinder> = None;
    let raised = crate::priority::raise();
    crate::hold_freed_memory(true);
    let started_tracer = prepare(config, &stop).and_then(|()| {
        started = Instant::now();
        Tracer::start(
            &mut objects,
            &config.tracer,
            &mut StartingTables {
                config: &config.tracer,
                cgroups: &config.cgroups,
                registry: &mut registry,
                unwinder: &mut unwinder,
                noted: Vec::new(),
                installed: false,
            },
        )
    });
    let mut tracer = match started_tracer {
        Ok((t, None)) => t,
        Ok((t, Some(why))) => {
            unwinder = None;
            eprintln!(
                "offcputime: DWARF unwinding is not available here ({why:#}); user stacks are \
                 walked with frame pointers"
            );
            t
        }
        Err(e) => {
            sink.discard();
            more_sinks.into_iter().for_each(Sink::discard);
            return Err(e);
        }
    };
    if config.verbose {
        eprintln!(
            "offcputime: attached {} {:.1} ms after start (load and attach {:.1} ms: {})",
            tracer.hook(),
            began.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3,
            tracer.phases(),
        );
    }
    eprintln!("{}", config.status_line());
    if config.tracer.sample_ns > 0 && !tracer.hook().stacks_at_switch_in() {
        eprintln!(
            "offcputime: --sample on {}: the stacks are walked at every switch-out, before a \
             block's length is known, so sampling saves little here (the finish_task_switch \
             kprobe, where the kernel has kprobes and no --state or -i is asked, walks only the \
             blocks taken)",
            tracer.hook()
        );
    }
    crate::hold_freed_memory(false);
    crate::give_back_freed_memory();
    if config.shape.mode.kernel() {
        symbolizer.warm_up_kernel();
    }

    let deadline = config.duration.map(|d| tracer.window_started_at() + d);
    let mut deferred = Deferred::new(config.tracer.max_stack_depth as usize);
    if let Some(stall) = config.tracer.test.stall_copy_walk {
        // For tests: copied stacks wait this long for their walk, as if
        // their tables took that long (a large new program's do).
        deferred.stall_walks(stall);
    }
    let mut collector = Collector {
        exits: Exits::default(),
        scan: None,
        stats: StatsLine::new(config.tracer.test.stats_interval, began),
        raised: None,
        python: tracer.python_store(),
        refreshing: HashMap::new(),
        refresh_failed: false,
        python_later: Vec::new(),
        python_gate: config.tracer.test.python_gate.clone(),
    };
    // Started before start-up's raise ends: under a burst of new threads
    // the loop may get no CPU from then on until the lookout raises it.
    let _lookout = tracer
        .copies_lost_counter()
        .map(crate::priority::Lookout::start);
    drop(raised);

    if config.interval.is_some() {
        symbolizer.keep_user_names();
    }
    let pusher = match &config.push {
        Some(o) => Some(crate::push::Pusher::start(o.clone())?),
        None => None,
    };
    let mut intervals = config.interval.map(|len| Intervals {
        pusher,
        schedule: crate::intervals::Schedule {
            start_ns: tracer.window_ns().0,
            len_ns: len.as_nanos().try_into().unwrap_or(u64::MAX),
        },
        current: 0,
        taken: 0,
        held: Default::default(),
        splitter: Default::default(),
        recorded: false,
        missed: 0,
        blocks: 0,
        total_ns: 0,
        running_ns: 0,
    });
    let mut sinks: Vec<Sink> = std::iter::once(sink).chain(more_sinks).collect();
    let kernel_first = tracer.hook().kernel_first_frame_is_ip();
    // Python frames asked for (not --no-python) where the kernel cannot
    // walk them: said at the end, if a CPython process was traced.
    let python_unwalked =
        config.tracer.python && config.tracer.user_stacks && tracer.python_store().is_none();
    loop {
        // With -i, the end of the current interval, unless the window
        // ends first.
        let cut = intervals
            .as_ref()
            .map(|i| i.schedule.end_of(i.taken))
            .filter(|&b| tracer.end_ns().is_none_or(|end| b < end));
        let until = match (deadline, cut.map(instant_of_monotonic)) {
            (Some(d), Some(c)) => Some(d.min(c)),
            (d, c) => d.or(c),
        };
        let mut failed = None;
        tracer.wait(until, &stop, |events, stacks| {
            let busy = collector.on_events(
                events,
                stacks,
                &tracer,
                &mut registry,
                &mut unwinder,
                &mut deferred,
                &mut |id, frames| {
                    if let Some(iv) = intervals.as_mut() {
                        iv.held.walked(id, frames);
                    }
                },
            );
            // Intervals taken while copies they count waited: written
            // once those are walked (just now, as a rule).
            if let (Some(iv), None) = (intervals.as_mut(), failed.as_ref()) {
                let written = iv.write_held(
                    &deferred,
                    kernel_first,
                    (&mut registry, &symbolizer),
                    config,
                    &mut sinks,
                );
                if let Err(e) = written {
                    failed = Some(e);
                    stop.store(true, Ordering::SeqCst);
                }
            }
            busy
        })?;
        if let Some(e) = failed {
            sinks.into_iter().for_each(Sink::discard);
            return Err(e);
        }
        let (Some(cut), Some(iv)) = (cut, intervals.as_mut()) else {
            break;
        };
        if stop.load(Ordering::SeqCst) || crate::raw::monotonic_ns() < cut {
            break;
        }
        if let Some(stall) = config.tracer.test.stall_before_cut {
            // For tests: the interval's end passed, its blocks under way
            // not cut yet for this long (a loaded machine's late wake-up).
            std::thread::sleep(stall);
        }
        tracer.cut(cut)?;
        // A switch-in that began before the cut may still be adding to
        // the interval on another CPU: a program runs for microseconds.
        std::thread::sleep(Duration::from_millis(2));
        let taken = tracer.take_intervals(iv.taken);
        iv.taken += 1;
        let written = taken.and_then(|raw| {
            // The copies of stacks its blocks were counted under were put
            // on the ring buffer before they were counted: all of them are
            // read now, and it is written once they are walked.
            match tracer.take_deferred() {
                Ok(stacks) => deferred.add(stacks),
                Err(e) => eprintln!("offcputime: {e:#}"),
            }
            iv.held.push(raw, Instant::now());
            iv.write_held(
                &deferred,
                kernel_first,
                (&mut registry, &symbolizer),
                config,
                &mut sinks,
            )
        });
        if let Err(e) = written {
            sinks.into_iter().for_each(Sink::discard);
            return Err(e);
        }
    }
    // A pass under way is left: what it was for keeps its snapshot.
    drop(collector);
    // The report, raised as start-up is (see priority.rs): on a busy
    // machine at the user's priority it waits seconds for a CPU (measured
    // under examples/stackfarm: docs/benchmarks-history.md).
    let _raised = crate::priority::raise();
    tracer.stop()?;
    let (window_start, window_end) = tracer.window_ns();
    let ended = Instant::now();
    let ended_cpu = process_cpu_ms();
    walk_deferred(
        &tracer,
        &mut deferred,
        &mut registry,
        unwinder.as_mut(),
        &mut |id, frames| {
            if let Some(iv) = intervals.as_mut() {
                iv.held.walked(id, frames);
            }
        },
    );
    if let Some(iv) = intervals.as_mut() {
        // Every copy is walked or given up by now.
        let written = iv.write_held(
            &deferred,
            kernel_first,
            (&mut registry, &symbolizer),
            config,
            &mut sinks,
        );
        if let Err(e) = written {
            sinks.into_iter().for_each(Sink::discard);
            return Err(e);
        }
    }

    let raw = match intervals {
        Some(_) => tracer.take_intervals(u32::MAX),
        None => tracer.read(),
    };
    let raw = match raw {
        Ok(mut raw) => {
            Deferred::complete(&mut raw);
            raw
        }
        Err(e) => {
            sinks.into_iter().for_each(Sink::discard);
            return Err(e);
        }
    };
    let read_ms = ended.elapsed().as_secs_f64() * 1e3;
    let mut built_ms = None;
    let unreadable = raw
        .entries
        .iter()
        .filter(|e| e.user_stack == StackRef::NotReadable)
        .count();
    let unreadable = (
        unreadable,
        tracer.start_user_stacks(),
        tracer.hook().stacks_at_switch_in(),
    );
    let kernel_stack_pairs = config
        .tracer
        .test
        .kstack_check
        .then(|| tracer.kernel_stack_pairs());
    drop(tracer);
    let (profile, missed, recorded) = match intervals.as_mut() {
        Some(iv) => {
            // The intervals not written yet, the last up to the window's
            // end: more than one when the trace ended while an interval
            // was being written.
            let last = iv.schedule.last_before(window_end).max(iv.current);
            let base = crate::raw::RawProfile {
                entries: Vec::new(),
                ..raw.clone()
            };
            let mut raw = Some(raw);
            let mut written = Err(anyhow::anyhow!("no interval was written"));
            while iv.current <= last {
                let end = (iv.current == last).then_some(window_end);
                let taken = raw.take().unwrap_or_else(|| base.clone());
                written = iv.write(
                    taken,
                    end,
                    kernel_first,
                    (&mut registry, &symbolizer),
                    config,
                    &mut sinks,
                );
                if written.is_err() {
                    break;
                }
            }
            let profile = match written {
                Ok(p) => p,
                Err(e) => {
                    sinks.into_iter().for_each(Sink::discard);
                    return Err(e);
                }
            };
            finish_interval_sinks(config, sinks)?;
            iv.finish_push(config.verbose);
            if iv.splitter.late.ns > 0 {
                eprintln!(
                    "offcputime: {:.3} ms of time in {} intervals was counted after the \
                     interval was written (switches the tracepoint did not report) and is left \
                     out",
                    iv.splitter.late.ns as f64 / 1e6,
                    iv.splitter.late.intervals
                );
            }
            (profile, iv.missed, iv.recorded)
        }
        None => {
            let mut raw = raw;
            crate::oncpu::divide(&mut raw, config.shape.mode.user());
            let mut profile = profile::build(&raw, &mut registry, &symbolizer, kernel_first);
            // What was read is let go before the output is made: at
            // 100,000 stacks its frames are tens of megabytes.
            drop(raw);
            built_ms = Some(ended.elapsed().as_secs_f64() * 1e3);
            profile.window = Some(profile::Window::from_monotonic(window_start, window_end));
            if let Some(filter) = &config.filter {
                filter_profile(filter, &mut profile, config);
            }
            let mut sinks = sinks.into_iter();
            for ((_, format), sink) in config.outputs().zip(sinks.by_ref()) {
                if let Err(e) = sink.write(|out| render(&profile, config, format, out)) {
                    sinks.for_each(Sink::discard);
                    return Err(e);
                }
            }
            let missed = profile.missed_stacks(config.shape.mode);
            let recorded = !profile.samples.is_empty();
            (profile, missed, recorded)
        }
    };
    if !recorded {
        eprintln!("offcputime: no off-CPU time was recorded for the chosen threads");
    }

    report_losses(&profile, missed, config, unreadable);
    report_kernel_stacks(&profile.counters, config.verbose, kernel_stack_pairs);
    report_denied(&registry, &symbolizer, config);
    if let Some(u) = &unwinder {
        report_unwinding(u, &deferred, &profile, config.verbose);
    }
    report_python(&mut registry, &profile, config.verbose, python_unwalked);
    report_namespaces(&registry, config.verbose);
    report_on_cpu(&profile, intervals.as_ref().map(|iv| iv.running_ns), config);
    if config.verbose {
        let (stacks, blocks, total_ns) = match &intervals {
            Some(iv) => (format!("{} intervals", iv.current), iv.blocks, iv.total_ns),
            None => (
                format!("{} stacks", profile.samples.len()),
                profile.off_cpu().map(|s| s.count).sum::<u64>(),
                profile.off_cpu().map(|s| s.total_ns).sum::<u64>(),
            ),
        };
        eprintln!(
            "offcputime: traced {:.3} s (CLOCK_MONOTONIC {:.6} to {:.6}); {stacks}, {blocks} blocks, \
             {:.3} s off-CPU in total; {} blocks under way at the start counted from it, {} in \
             progress at the end counted up to it; report in {:.1} ms (read {read_ms:.1} ms{}; \
             {:.1} ms of CPU)",
            (window_end - window_start) as f64 / 1e9,
            window_start as f64 / 1e9,
            window_end as f64 / 1e9,
            total_ns as f64 / 1e9,
            profile.counters.blocks_at_start,
            profile.counters.blocks_at_end,
            ended.elapsed().as_secs_f64() * 1e3,
            built_ms.map_or(String::new(), |b| format!(", symbolized and merged {:.1} ms", b - read_ms)),
            process_cpu_ms() - ended_cpu,
        );
        let c = &profile.counters;
        eprintln!(
            "offcputime: stack captures lost: storage full {} user / {} kernel, walk failed \
             {} user / {} kernel (no stack is dropped for a hash collision: stacks are keyed by a 64-bit hash of \
             their frames); {} blocks of kernel threads (no user stack); {} blocks untimed \
             (no task storage); {} new-process notifications dropped; {} switches the \
             tracepoint did not report (blocks closed where the kernel dates the switch)",
            c.user_stack_full,
            c.kernel_stack_full,
            c.user_stack_error,
            c.kernel_stack_error,
            c.kernel_thread_blocks,
            c.no_task_storage,
            c.events_dropped,
            c.unseen_switch_in,
        );
        if config.tracer.states {
            let mut by_state: std::collections::BTreeMap<_, u64> = Default::default();
            for s in &profile.samples {
                if let Some(st) = s.state {
                    *by_state.entry(st).or_default() += s.total_ns;
                }
            }
            let parts: Vec<String> = by_state
                .iter()
                .map(|(st, ns)| format!("{} {:.3} s", st.frame(), *ns as f64 / 1e9))
                .collect();
            eprintln!(
                "offcputime: by state: {}; {} wake-ups split a block, {} blocks ended with none seen",
                parts.join(", "),
                c.wakeups,
                c.unwoken
            );
        }
        if config.tracer.sample_ns > 0 {
            eprintln!(
                "offcputime: sampled below {} us: {} short blocks taken (each weighted up to \
                 it), {} left out; times and block counts are estimates",
                config.tracer.sample_ns / 1000,
                c.sampled_short,
                c.sampled_out
            );
        }
        if let Some(h) = intervals.as_ref().map(|iv| iv.held.stats()) {
            eprintln!(
                "offcputime: {} intervals waited for the stacks copied for them to be walked \
                 before they were written ({} stacks: {} walked, {} given up, {} still waiting \
                 at the {} s bound)",
                h.intervals,
                h.stacks,
                h.walked,
                h.given_up,
                h.late,
                crate::intervals::Held::WAIT.as_secs()
            );
        }
        if config.tracer.wakers {
            eprintln!(
                "offcputime: {} wakers recorded ({} distinct), {} lost for a full table",
                c.wakers,
                profile
                    .samples
                    .iter()
                    .filter_map(|s| s.waker.as_ref())
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
                c.wakers_full
            );
        }
    }
    Ok(())
}

/// `--snapshot`: what every task waits in now, written as `config` says.
pub fn snapshot(config: &Config, snap: &SnapshotConfig, began: Instant) -> Result<()> {
    let (sink, more_sinks) = open_sinks(config)?;
    let discard = |sink: Sink, more: Vec<Sink>| {
        sink.discard();
        more.into_iter().for_each(Sink::discard);
    };
    let symbolizer = Symbolizer::new(SymbolizeOptions {
        offsets: config.offsets,
        inline: config.inline,
        lines: config.lines,
        addresses: config.addresses,
    });
    let mut registry = Registry::new();
    let mut unwinder: Option<Unwinder> = None;
    let taken = check_environment()
        .and_then(|()| check_targets(&config.tracer))
        .and_then(|()| {
            set_libbpf_logging(config.verbose, config.tracer.test.verifier_stats);
            let _raised = crate::priority::raise();
            crate::tracer::take_snapshot(
                &config.tracer,
                snap.states,
                &mut StartingTables {
                    config: &config.tracer,
                    cgroups: &config.cgroups,
                    registry: &mut registry,
                    unwinder: &mut unwinder,
                    noted: Vec::new(),
                    installed: false,
                },
            )
        });
    let raw = match taken {
        Ok((raw, None)) => raw,
        Ok((raw, Some(why))) => {
            unwinder = None;
            eprintln!(
                "offcputime: DWARF unwinding is not available here ({why:#}); user stacks are \
                 walked with frame pointers"
            );
            raw
        }
        Err(e) => {
            discard(sink, more_sinks);
            return Err(e);
        }
    };
    eprintln!("{}", config.status_line());
    if config.verbose {
        eprintln!(
            "offcputime: snapshot of {} tasks at CLOCK_MONOTONIC {:.6}, {:.1} ms after start",
            raw.tasks.len(),
            raw.seen_ns as f64 / 1e9,
            began.elapsed().as_secs_f64() * 1e3
        );
    }
    let mut taken = crate::snapshot::build(&raw, &mut registry, &symbolizer, config.shape);
    if let Some(filter) = &config.filter {
        let before = taken.tasks.len();
        let dropped = taken.retain(filter, config.shape);
        if before > 0 && dropped == before {
            eprintln!("offcputime: no task was left by --grep/--exclude ({before} tasks left out)");
        } else if config.verbose {
            eprintln!("offcputime: --grep/--exclude left out {dropped} of {before} tasks");
        }
    }
    let profile = taken.profile();
    let mut sinks = std::iter::once(sink).chain(more_sinks);
    for ((_, format), sink) in config.outputs().zip(sinks.by_ref()) {
        let written = sink.write(|out| match format {
            Format::Text => {
                crate::output::snapshot::write(&taken, config.shape, snap.sort, config.verbose, out)
            }
            other => render(&profile, config, other, out),
        });
        if let Err(e) = written {
            sinks.for_each(Sink::discard);
            return Err(e);
        }
    }
    if raw.tasks.is_empty() {
        eprintln!("offcputime: no task matched");
    }
    let unreadable = (
        raw.tasks
            .iter()
            .filter(|t| t.user_stack == StackRef::NotReadable)
            .count(),
        raw.user_stacks,
    );
    report_unreadable(
        config,
        unreadable.0,
        unreadable.1,
        "tasks show no user stack:",
    );
    report_missed(
        &profile,
        profile.missed_stacks(config.shape.mode),
        config,
        unreadable.0,
    );
    report_denied(&registry, &symbolizer, config);
    if let Some(u) = &unwinder {
        report_unwinding(u, &Deferred::new(0), &profile, config.verbose);
    }
    report_namespaces(&registry, config.verbose);
    Ok(())
}

/// Every output's sink, opened before anything is measured: the first
/// and the others.
fn open_sinks(config: &Config) -> Result<(Sink, Vec<Sink>)> {
    let sink = Sink::open(config.output.as_deref(), config.tracer.test.stall_in_write)?;
    match open_more(config, &sink) {
        Ok(more) => Ok((sink, more)),
        Err(e) => {
            sink.discard();
            Err(e)
        }
    }
}

/// The sinks of the outputs after the first, opened before tracing like
/// the first; a pprof profile is not written to a terminal.
fn open_more(config: &Config, first: &Sink) -> Result<Vec<Sink>> {
    if matches!(first, Sink::Stdout) && matches!(config.format, Format::Pprof(_)) {
        // SAFETY: isatty has no preconditions.
        if unsafe { libc::isatty(1) } == 1 {
            anyhow::bail!(
                "a pprof profile is gzipped binary data: write it with -o FILE.pb.gz, or \
                 redirect stdout"
            );
        }
    }
    let mut sinks = Vec::new();
    for (path, _) in &config.more_outputs {
        match Sink::open(Some(path), config.tracer.test.stall_in_write) {
            Ok(s) => sinks.push(s),
            Err(e) => {
                sinks.into_iter().for_each(Sink::discard);
                return Err(e);
            }
        }
    }
    Ok(sinks)
}

/// `--grep`/`--exclude` applied; says so when nothing is left of a
/// profile that had stacks, and with -v how much was left out.
fn filter_profile(filter: &crate::filter::StackFilter, profile: &mut Profile, config: &Config) {
    let before = profile.samples.len();
    let dropped = filter.apply(profile, config.shape);
    if before > 0 && dropped == before {
        eprintln!("offcputime: no stack was left by --grep/--exclude ({before} stacks left out)");
    } else if config.verbose {
        eprintln!("offcputime: --grep/--exclude left out {dropped} of {before} stacks");
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
    }
}

/// The processes alive now whose threads are traced (none if no user
/// stacks are wanted): those of -p, those of the threads of -t, else all.
fn processes_to_trace(
    t: &crate::tracer::TracerOptions,
    cgroups: &[std::path::PathBuf],
) -> Vec<u32> {
    if t.kernel_threads_only || !t.user_stacks {
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
    unwinder: Option<&mut Unwinder>,
    walked: &mut dyn FnMut(u64, &[u64]),
) {
    match tracer.take_deferred() {
        Ok(stacks) => deferred.add(stacks),
        // Their blocks are reported with missed user stacks.
        Err(e) => eprintln!("offcputime: {e:#}"),
    }
    deferred.end_stall();
    if let Some(u) = unwinder {
        if deferred.is_waiting() {
            u.finish(registry, DEFERRED_TABLES_WAIT);
            deferred.walk_ready(u, &|tgid| registry.start_of(tgid), &mut |id, frames| {
                let stored = tracer.store_stack(id, frames);
                if stored {
                    walked(id, frames);
                }
                stored
            });
        }
    }
    deferred.give_up();
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
