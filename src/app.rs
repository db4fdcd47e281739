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
    if std::env::var_os("OFFCPUTIME_VERIFIER_STATS").is_some() {
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
    set_libbpf_logging(config.verbose);
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

    let deadline = config.duration.map(|d| tracer.attached_at() + d);
    let mut deferred = Deferred::new(config.tracer.max_stack_depth as usize);
    if let Some(ms) = crate::tracer::test_stall_ms("OFFCPUTIME_TEST_STALL_COPY_WALK_MS") {
        // For tests: copied stacks wait this long for their walk, as if
        // their tables took that long (a large new program's do).
        deferred.stall_walks(Duration::from_millis(ms));
    }
    let mut collector = Collector {
        exits: Exits::default(),
        scan: None,
        stats: StatsLine::from_env(began),
        raised: None,
        python: tracer.python_store(),
        refreshing: HashMap::new(),
        refresh_failed: false,
        python_later: Vec::new(),
        python_gate: std::env::var_os("OFFCPUTIME_TEST_PYTHON_GATE").map(Into::into),
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
        if let Some(ms) = crate::tracer::test_stall_ms("OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS") {
            // For tests: the interval's end passed, its blocks under way
            // not cut yet for this long (a loaded machine's late wake-up).
            std::thread::sleep(Duration::from_millis(ms));
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
    // machine at the user's priority it waited seconds for a CPU (4.6 s
    // under 8,000 threads of examples/stackfarm).
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
                    "offcputime: {:.3} ms of off-CPU time in {} intervals was counted after the \
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
    report_denied(&registry, &symbolizer, config);
    if let Some(u) = &unwinder {
        report_unwinding(u, &deferred, &profile, config.verbose);
    }
    report_python(&mut registry, &profile, config.verbose, python_unwalked);
    report_namespaces(&registry, config.verbose);
    report_on_cpu(&profile, config);
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
            set_libbpf_logging(config.verbose);
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
    let sink = Sink::open(config.output.as_deref())?;
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
        match Sink::open(Some(path)) {
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

/// `-v`: the processes of other pid namespaces (containers) by their pid
/// there too, since the outputs show the host's.
/// `--on-cpu`: samples left out, and with `-v` what the samples were.
fn report_on_cpu(profile: &Profile, config: &Config) {
    let Some(hz) = config.tracer.on_cpu_hz else {
        return;
    };
    let c = &profile.counters;
    if c.oncpu_untimed > 0 {
        eprintln!(
            "offcputime: {} runs of threads outside CFS (real-time, deadline) are left out of \
             their running time: the tracepoint did not report their switch-in, and the \
             scheduler does not date it",
            c.oncpu_untimed
        );
    }
    if c.oncpu_orphan_samples > 0 {
        eprintln!(
            "offcputime: {} on-CPU samples of threads whose running time was not counted are \
             left out",
            c.oncpu_orphan_samples
        );
    }
    if config.verbose {
        let running: u64 = profile
            .samples
            .iter()
            .filter(|s| s.state == Some(profile::OffState::Running))
            .map(|s| s.total_ns)
            .sum();
        eprintln!(
            "offcputime: on-CPU: {} samples at {hz} Hz on each CPU ({} outside the window left \
             out); {:.3} s running in total, of which {:.3} s of {} threads (per interval, with \
             -i) that no sample caught",
            c.oncpu_samples,
            c.oncpu_outside,
            running as f64 / 1e9,
            c.oncpu_unsampled_ns as f64 / 1e9,
            c.oncpu_unsampled_threads,
        );
    }
}

fn report_namespaces(registry: &Registry, verbose: bool) {
    if !verbose {
        return;
    }
    let pids = registry.namespace_pids();
    if pids.is_empty() {
        return;
    }
    const SHOWN: usize = 20;
    let list: Vec<String> = pids
        .iter()
        .take(SHOWN)
        .map(|(pid, ns)| format!("{pid} is {ns}"))
        .collect();
    let more = match pids.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(", and {n} more"),
    };
    eprintln!(
        "offcputime: pids in their own pid namespace: {}{more}",
        list.join(", ")
    );
}

/// Processes and files the profiler had no right to read, and what that
/// cost, once each.
fn report_denied(registry: &Registry, symbolizer: &Symbolizer, config: &Config) {
    if !config.shape.mode.user() {
        return;
    }
    if symbolizer.unparsable() > 0 {
        eprintln!(
            "offcputime: the symbols of {} files could not be parsed (malformed): their frames \
             are named by file and offset",
            symbolizer.unparsable()
        );
    }
    if let Some(note) = registry.replaced_note() {
        eprintln!("offcputime: {note}");
    }
    for note in registry.jit_notes() {
        eprintln!("offcputime: {note}");
    }
    let d = registry.denied();
    if !d.processes.is_empty() {
        eprintln!(
            "offcputime: the memory maps of {} processes of other users could not be read \
             (that needs CAP_SYS_PTRACE): their user frames are [unknown]",
            d.processes.len()
        );
    }
    if let Some((first, why)) = d.files.first() {
        eprintln!(
            "offcputime: {} files mapped by traced processes could not be opened ({first}: \
             {why}{}): their frames are unnamed, their stacks walked with frame pointers",
            d.files.len(),
            if d.files.len() > 1 {
                ", and others"
            } else {
                ""
            },
        );
        if config.verbose {
            for (path, why) in &d.files[1..] {
                eprintln!("offcputime:   {path}: {why}");
            }
        }
    }
}

/// What could not be measured or shown. `missed`: the stacks that could
/// not be shown (of every interval, with -i); `unreadable`: how many stacks
/// of threads blocked since before the start have no user stack, and
/// whether this kernel could read such stacks at all.
fn report_losses(
    profile: &Profile,
    missed: usize,
    config: &Config,
    (unreadable, could, at_switch_in): (usize, bool, bool),
) {
    report_unreadable(
        config,
        unreadable,
        could,
        if at_switch_in {
            "stacks of threads blocked since before tracing started, or still blocked at its \
             end (the kprobe hook takes a block's stacks when it ends), show no user stack: \
             they are counted, but"
        } else {
            "stacks of threads blocked since before tracing started show no user stack: they \
             are counted from the start, but"
        },
    );
    report_missed(profile, missed, config, unreadable);
}

/// That `unreadable` user stacks, read from another task's context, could
/// not be read (`lead` says whose they are), and why; `could`: whether this
/// kernel reads them at all.
fn report_unreadable(config: &Config, unreadable: usize, could: bool, lead: &str) {
    if unreadable > 0 && config.shape.mode.user() {
        let why = if could {
            "their process's memory map was locked for writing when tracing started (a \
             thread in mmap, or one stuck in a page fault), and reading it could have held \
             up the start"
        } else {
            "this kernel cannot read another thread's user stack from BPF (Linux 5.18 and \
             later can)"
        };
        eprintln!("offcputime: {unreadable} {lead} {why}");
    }
}

/// What was lost, and why (bcc's warning and the counters'). `missed`: the
/// stacks that could not be shown, `unreadable` of them for a reason said
/// already.
fn report_missed(profile: &Profile, missed: usize, config: &Config, unreadable: usize) {
    let c = &profile.counters;
    let missed = missed.saturating_sub(if config.shape.mode.user() {
        unreadable
    } else {
        0
    });
    if missed > 0 {
        let full = c.user_stack_full + c.kernel_stack_full > 0;
        eprintln!(
            "WARNING: {missed} stack traces could not be displayed (stack storage full: \
             {} user and {} kernel captures; walk failed: {} user and {} kernel).{}",
            c.user_stack_full,
            c.kernel_stack_full,
            c.user_stack_error,
            c.kernel_stack_error,
            if full {
                " Consider increasing --stack-storage-size."
            } else {
                ""
            }
        );
    }
    if c.unseen_untimed > 0 {
        eprintln!(
            "WARNING: {} blocks were not counted: the kernel switched their thread back in \
             without reporting it, and only for normal (CFS) threads does it say when.",
            c.unseen_untimed
        );
    }
    if c.unwoken > 0 && config.tracer.states {
        eprintln!(
            "WARNING: {} blocks ended without the kernel reporting their wake-up (sched_wakeup): \
             their wait for a CPU is counted in the state they blocked in.",
            c.unwoken
        );
    }
    if c.state_guessed > 0 && (config.tracer.states || config.tracer.state.is_some()) {
        eprintln!(
            "WARNING: {} blocks began as another CPU was already waking their thread, and this \
             hook does not say which state the thread blocked in: they are counted as sleeps \
             (interruptible). The sched_switch tracepoint of Linux 5.18 and later says it.",
            c.state_guessed
        );
    }
    if c.wakers_full > 0 {
        eprintln!(
            "WARNING: {} wakers were not recorded because the table of wakers was full \
             (shown as [Missed Waker]). Consider increasing --stack-storage-size.",
            c.wakers_full
        );
    }
    if c.counts_full > 0 {
        eprintln!(
            "WARNING: {} blocks were not counted because the table of distinct stacks was full \
             ({} entries, one per thread and pair of stacks: twice --stack-storage-size, at \
             least 65536). Consider increasing --stack-storage-size.",
            c.counts_full,
            crate::tracer::counts_capacity(config.tracer.stack_storage_size),
        );
    }
    if c.no_task_storage > 0 {
        eprintln!(
            "WARNING: {} blocks were not timed (no per-task storage could be allocated).",
            c.no_task_storage
        );
    }
    if c.events_dropped > 0 && config.verbose {
        eprintln!(
            "offcputime: {} new-process notifications were dropped; \
             frames of processes that exited early may be unnamed",
            c.events_dropped
        );
    }
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

/// What DWARF unwinding did not cover, and with -v its tables' size.
/// What became of the Python frames of CPython processes: what could not
/// be shown is said (once each), the rest with `-v`.
fn report_python(registry: &mut Registry, profile: &Profile, verbose: bool, unwalked: bool) {
    if unwalked {
        let procs: Vec<Proc> = registry
            .processes()
            .filter_map(|(tgid, start)| {
                Some(Proc {
                    tgid,
                    start: start?,
                })
            })
            .collect();
        let found = procs
            .into_iter()
            .filter(|&p| registry.note_python(p).is_some())
            .count();
        if found > 0 {
            eprintln!(
                "offcputime: Python frames are not read on Linux {} (their walk needs bpf_loop: \
                 5.17): the stacks of {found} CPython processes show the interpreter's frames",
                crate::tracer::kernel::release()
            );
        }
    }
    for note in registry.python_notes() {
        eprintln!(
            "offcputime: the Python frames of {note}: its processes' stacks show the \
             interpreter's frames only"
        );
    }
    let s = registry.python_stats();
    let c = &profile.counters;
    if s.unmatched > 0 {
        eprintln!(
            "offcputime: {} user stacks of CPython processes show the interpreter's \
             _PyEval_EvalFrameDefault frames in place of some or all of their Python frames \
             (blocks that ended before the interpreter was known, threads whose own state was \
             not found, or walks cut short)",
            s.unmatched
        );
    }
    if c.py_unreadable + c.py_truncated > 0 {
        eprintln!(
            "offcputime: {} Python frames could not be read, and {} walks of Python frames \
             were cut short for room (--perf-max-stack-depth): shown as {} and {}",
            c.py_unreadable,
            c.py_truncated,
            crate::symbolize::PYTHON_UNREADABLE,
            crate::symbolize::PYTHON_CUT_SHORT
        );
    }
    if verbose && (s.processes > 0 || c.py_stacks > 0) {
        eprintln!(
            "offcputime: python: {} CPython processes; {} user stacks walked with their Python \
             frames ({} frames; {} walked again once their interpreter was known), {} of \
             threads without a state of their own; {} code objects named ({} could not be \
             read, {} notices lost)",
            s.processes,
            c.py_stacks,
            c.py_frames,
            c.py_refreshed,
            c.py_no_thread_state,
            s.codes_read,
            s.codes_unreadable,
            c.py_events_lost,
        );
    }
}

fn report_unwinding(u: &Unwinder, deferred: &Deferred, profile: &Profile, verbose: bool) {
    let c = &profile.counters;
    if c.unwind_not_ready > 0 {
        eprintln!(
            "offcputime: {} user stacks were walked with frame pointers because their process's \
             unwind tables were not ready yet (its first blocks)",
            c.unwind_not_ready
        );
    }
    let d = deferred.stats();
    if d.cut > 0 {
        eprintln!(
            "offcputime: {} user stacks taken before their process's unwind tables were ready \
             were cut short: deeper than the {} KiB of stack copied at the block",
            d.cut,
            crate::deferred::COPY_BYTES_ABOVE_SP >> 10
        );
    }
    let gaps = c.unwind_gap_frames + d.gap_frames as u64;
    if gaps > 0 {
        eprintln!(
            "offcputime: {gaps} user frames were found through frame pointers in code that its \
             object's call-frame information does not cover (assembly or a PLT without it, or \
             code built without unwind tables): they are right only where that code keeps frame \
             pointers"
        );
    }
    let missed = (d.unwalked + d.unstored + d.dropped + d.unfinished) as u64 + c.unwind_defer_lost;
    if missed > 0 {
        eprintln!(
            "offcputime: {missed} user stacks taken before their process's unwind tables were \
             ready are missed: {} of processes that exited before their mappings could be read \
             or whose tables could not be made, {} still waiting for their tables when the \
             trace ended, {} lost for want of room to copy or keep them (more new threads \
             blocking at once than the profiler could take in), {} for want of room to store \
             them (--stack-storage-size)",
            d.unwalked,
            d.unfinished,
            c.unwind_defer_lost + d.dropped as u64,
            d.unstored
        );
    }
    let (missing, more) = u.not_covered();
    if !missing.is_empty() {
        const SHOWN: usize = 3;
        for m in missing.iter().take(SHOWN) {
            if m.later {
                eprintln!(
                    "offcputime: no DWARF unwinding for {} in process {} at first: {}; frame \
                     pointers were used there until room was made (the tables of processes \
                     that had not blocked for {} s let go)",
                    m.what,
                    m.tgid,
                    m.why,
                    crate::unwind::COLD.as_secs()
                );
            } else {
                eprintln!(
                    "offcputime: no DWARF unwinding for {} in process {}: {}; frame pointers are \
                     used there",
                    m.what, m.tgid, m.why
                );
            }
        }
        if missing.len() + more > SHOWN {
            eprintln!(
                "offcputime: ... and {} more objects or processes without DWARF unwinding",
                missing.len() + more - SHOWN
            );
        }
    }
    if verbose {
        let s = u.stats();
        let mib = |n: usize, size: usize| (n * size) as f64 / (1 << 20) as f64;
        let row = std::mem::size_of::<crate::bpf::types::unwind_row>();
        let mapping = std::mem::size_of::<crate::bpf::types::unwind_mapping>();
        eprintln!(
            "offcputime: unwind tables: {} objects ({} without call-frame information), {} rows, \
             {} mappings of {} processes: {:.1} of {:.1} MiB, built in {:.0} ms; {} stacks walked \
             with them ({} cut short, {} proved unchanged since the thread's last walk), {} \
             frames through frame pointers ({} in code its object's tables do not cover)",
            s.objects,
            s.objects_without_cfi,
            s.rows,
            s.mappings,
            s.processes,
            mib(s.rows, row) + mib(s.mappings, mapping),
            mib(s.row_capacity, row) + mib(s.mapping_capacity, mapping),
            s.build_ms,
            c.unwind_dwarf,
            c.unwind_truncated,
            c.unwind_cached,
            c.unwind_fp_frames,
            c.unwind_gap_frames,
        );
        eprintln!(
            "offcputime: unwind tables: {} new processes used their parent's from the fork \
             ({} shared by userspace); {} user stacks of processes without tables of their own \
             walked through those of the files they map ({} files); {} user stacks taken before \
             their process's tables were ready copied and walked in userspace ({} walked, {} cut \
             short, {} frames through frame pointers)",
            c.unwind_forked,
            s.processes_forked,
            c.unwind_by_file,
            s.files,
            d.received,
            d.walked,
            d.cut,
            d.fp_frames,
        );
        eprintln!(
            "offcputime: unwind tables: {} processes let theirs go for room, not having blocked \
             for {} s ({} given them again at a later block); {} processes left without some \
             for want of room got them later; {} tables moved to put free rows together",
            s.processes_let_go,
            crate::unwind::COLD.as_secs(),
            s.processes_taken_back,
            s.processes_given_room,
            s.tables_moved,
        );
    }
}

/// What is done with the program's news while tracing (see
/// [`Tracer::wait`]): snapshots first, they are what names the frames of a
/// process that exits soon; then unwind tables: at once for processes whose
/// files all have theirs already (a new process of a known program), else
/// as soon as the builder thread has built those of its new files.
/// Processes that have exited give back what was kept for them (see
/// [`Exits`]).
struct Collector<'t> {
    exits: Exits,
    scan: Option<crate::tracer::StackScan<'t>>,
    stats: StatsLine,
    /// Raised to nice -20 while copied stacks wait for their tables: under
    /// thousands of new threads, at the user's priority, it waited seconds
    /// for a CPU, and the new processes' tables came that late, their
    /// first stacks lost. (Raised all the time, it perturbs the threads
    /// it measures.)
    raised: Option<crate::priority::Raised>,
    /// Where the BPF program is told of CPython processes (None with
    /// `--no-python`).
    python: Option<crate::tracer::PythonStore>,
    /// CPython processes noted while tracing, and when: their blocks
    /// under way are walked again with their Python frames for a while.
    refreshing: HashMap<u32, Instant>,
    /// The refresh failed once (said once).
    refresh_failed: bool,
    /// Processes whose mappings were read, to be looked at for an
    /// interpreter (with their address space).
    python_later: Vec<(Proc, u64)>,
    /// For tests: that waits until this file exists (as if reading the
    /// interpreter took that long: its first blocks are then walked
    /// before it is known).
    python_gate: Option<std::path::PathBuf>,
}

impl<'t> Collector<'t> {
    /// Tells the BPF program of the CPython processes among those whose
    /// mappings were read, once due.
    fn note_pythons(&mut self, registry: &mut Registry) {
        let Some(store) = &self.python else {
            self.python_later.clear();
            return;
        };
        if self.python_gate.as_ref().is_some_and(|g| !g.exists()) {
            return;
        }
        let now = Instant::now();
        for (p, mm) in std::mem::take(&mut self.python_later) {
            if note_python(store, registry, p, mm) {
                self.refreshing.insert(p.tgid, now);
            }
        }
    }

    /// Walks again the blocks under way of the CPython processes noted
    /// lately, walked before their interpreter was known (after their
    /// tables are written: the walk needs them).
    fn refresh_python(&mut self, tracer: &Tracer<'_>) {
        if self.refreshing.is_empty() {
            return;
        }
        let now = Instant::now();
        let done: Vec<u32> = self
            .refreshing
            .iter()
            .filter(|(_, &since)| now - since > PYTHON_REFRESH_FOR)
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in &done {
            self.refreshing.remove(tgid);
        }
        let tgids: Vec<u32> = self.refreshing.keys().copied().collect();
        if let Err(e) = tracer.refresh_python(&tgids, &done) {
            if !std::mem::replace(&mut self.refresh_failed, true) {
                eprintln!("offcputime: {e:#}");
            }
        }
    }

    /// Returns whether work is under way (see [`Tracer::wait`]). `walked`
    /// is told of each copied stack walked and stored, with its frames.
    #[allow(clippy::too_many_arguments)]
    fn on_events(
        &mut self,
        events: &[TaskEvent],
        stacks: Vec<crate::raw::RawUserStack>,
        tracer: &'t Tracer<'_>,
        registry: &mut Registry,
        unwinder: &mut Option<Unwinder>,
        deferred: &mut Deferred,
        walked: &mut dyn FnMut(u64, &[u64]),
    ) -> bool {
        // The address space of each process whose mappings were read now,
        // None where they could not be (it is gone): copied stacks are
        // walked only with tables of the mappings of their own.
        let mut spaces = Vec::new();
        for &ev in events {
            match ev {
                TaskEvent::New(p, space) => {
                    self.stats.processes += 1;
                    let now = registry.note_process(p.tgid, Some(p.start), false);
                    if now {
                        self.python_later.push((p, space.mm));
                    }
                    spaces.push(now.then_some(space));
                }
                TaskEvent::Changed(p, space) => {
                    let now = registry.note_process(p.tgid, Some(p.start), true);
                    if now {
                        self.python_later.push((p, space.mm));
                    }
                    spaces.push(now.then_some(space));
                }
                TaskEvent::PyCode {
                    proc, code, tag, ..
                } => registry.note_python_code(proc, code, tag),
                TaskEvent::Exited(p) => self.exits.exited(p),
                TaskEvent::Forked { child, parent, .. } => registry.forked(parent, child),
                TaskEvent::Mapped(p, vmas, n) => registry.note_mapped(p, &vmas[..n]),
            }
        }
        deferred.add(stacks);
        // Tables first: the stacks copied for processes that had none are
        // walked with them, before the processes that exited are let go.
        let busy = match unwinder.as_mut() {
            None => false,
            Some(u) => {
                let mut spaces = spaces.into_iter();
                for ev in events {
                    match *ev {
                        TaskEvent::New(p, space) | TaskEvent::Changed(p, space) => {
                            // Mappings not read now (the process is
                            // gone, or another) give no new tables: the
                            // copies of a process gone are given up now.
                            if spaces.next().flatten().is_none() {
                                use crate::deferred::ProcessTables;
                                let gone = crate::process::start_ticks(p.tgid) != Some(p.start);
                                if gone && u.slice(p.tgid, space).is_none() {
                                    deferred.unwalkable(p, space);
                                }
                                continue;
                            }
                            u.note_address_space(p.tgid, space);
                            u.note_process(registry, p.tgid);
                        }
                        TaskEvent::Forked {
                            child,
                            space,
                            parent,
                            map_start,
                            map_count,
                        } => {
                            u.forked(
                                parent,
                                child.tgid,
                                space,
                                (map_start as usize, map_count as usize),
                            );
                        }
                        TaskEvent::Exited(_) | TaskEvent::Mapped(..) | TaskEvent::PyCode { .. } => {
                        }
                    }
                }
                // Copies of processes whose tables were let go for room:
                // they block again, and get them back.
                for tgid in deferred.waiting_tgids() {
                    u.wanted(registry, tgid);
                }
                let building = u.poll(registry);
                if deferred.is_waiting() {
                    deferred.walk_ready(u, &|tgid| registry.start_of(tgid), &mut |id, frames| {
                        let stored = tracer.store_stack(id, frames);
                        if stored {
                            walked(id, frames);
                        }
                        stored
                    });
                }
                building
            }
        };
        self.note_pythons(registry);
        self.refresh_python(tracer);
        self.exits.sweep(registry);
        if self.scan.is_none() {
            self.scan = self.exits.due().map(|gone| tracer.scan_user_stacks(gone));
        }
        // A slice of the pass over the counts at a time, between reads of
        // events.
        let scanning = match &mut self.scan {
            None => false,
            Some(s) => match s.step(tracer, 4096) {
                None => true,
                Some(stacks) => {
                    let gone = self
                        .scan
                        .take()
                        .map(|s| s.procs().clone())
                        .unwrap_or_default();
                    let mut by_proc: HashMap<Proc, Vec<(u64, Vec<u64>)>> = HashMap::new();
                    for (p, id, frames) in stacks {
                        by_proc.entry(p).or_default().push((id, frames));
                    }
                    for &p in &gone {
                        registry.retire(p, by_proc.get(&p).map_or(&[][..], Vec::as_slice));
                        deferred.forget(p);
                        // Unless another process has its pid now, with
                        // tables of its own.
                        if !registry.has_pid(p.tgid) {
                            if let Some(u) = unwinder.as_mut() {
                                u.forget(p.tgid);
                            }
                            if let Some(store) = &self.python {
                                store.remove(p.tgid);
                            }
                        }
                    }
                    self.stats.exited += gone.len();
                    crate::give_back_freed_memory();
                    false
                }
            },
        };
        self.stats.maybe_print(unwinder.as_ref());
        if crate::priority::Lookout::take_raise() || deferred.is_waiting() {
            self.raised.get_or_insert_with(crate::priority::raise);
        } else {
            self.raised = None;
            crate::priority::Lookout::end_raise();
        }
        busy || scanning
    }
}

/// `-i`: the interval under way, and what was written so far.
struct Intervals {
    /// `--push`: where each interval is sent as well.
    pusher: Option<crate::push::Pusher>,
    schedule: crate::intervals::Schedule,
    /// The interval to write next.
    current: u32,
    /// The interval to take from the table next: later than `current`
    /// while intervals wait for their copied stacks (`held`).
    taken: u32,
    held: crate::intervals::Held,
    splitter: crate::intervals::Splitter,
    /// Some interval had off-CPU time.
    recorded: bool,
    /// Stacks that could not be shown, in every interval.
    missed: usize,
    /// Blocks (parts of blocks in an interval) and their time, in every
    /// interval.
    blocks: u64,
    total_ns: u64,
}

impl Intervals {
    /// Writes the current interval from what was taken from the table
    /// (`raw`: its entries and earlier ones), up to its end or `end`, and
    /// goes on to the next. Returns the interval's profile.
    fn write(
        &mut self,
        raw: crate::raw::RawProfile,
        end: Option<u64>,
        kernel_first: bool,
        (registry, symbolizer): (&mut Registry, &Symbolizer),
        config: &Config,
        sinks: &mut [Sink],
    ) -> Result<Profile> {
        use crate::intervals::{timestamp_line, write_part, NamePattern};
        let i = self.current;
        let start = self.schedule.start_of(i);
        let end = end.unwrap_or_else(|| self.schedule.end_of(i));
        let entries = self.splitter.interval(raw.entries, i);
        let mut raw = crate::raw::RawProfile { entries, ..raw };
        crate::oncpu::divide(&mut raw, config.shape.mode.user());
        let mut profile = profile::build(&raw, registry, symbolizer, kernel_first);
        let window = profile::Window::from_monotonic(start, end);
        let end_unix = window.start_unix_ns + window.duration_ns;
        profile.window = Some(window);
        if let Some(filter) = &config.filter {
            filter.apply(&mut profile, config.shape);
        }
        self.recorded |= !profile.samples.is_empty();
        self.missed += profile.missed_stacks(config.shape.mode);
        self.blocks += profile.off_cpu().map(|s| s.count).sum::<u64>();
        self.total_ns += profile.off_cpu().map(|s| s.total_ns).sum::<u64>();
        for ((path, format), sink) in config.outputs().zip(sinks.iter_mut()) {
            match path.and_then(NamePattern::new) {
                Some(pattern) => {
                    let name = pattern.name(u64::from(i) + 1, end_unix);
                    Sink::open(Some(&name))?.write(|out| render(&profile, config, format, out))?
                }
                None => sink.write_part(|out| {
                    let time = config.timestamp.then(|| timestamp_line(end_unix));
                    write_part(out, time.as_deref(), *format == Format::Text, |out| {
                        render(&profile, config, format, out)
                    })
                })?,
            }
        }
        if let (Some(pusher), Some(o)) = (&self.pusher, &config.push) {
            let mut pprof = Vec::new();
            crate::output::pprof::write(&profile, config.shape, &o.pprof, &mut pprof)
                .context("failed to build the pprof profile to push")?;
            pusher.push(
                profile.window.as_ref().map_or(0, |w| w.start_unix_ns),
                end_unix,
                pprof,
            );
        }
        self.current += 1;
        Ok(profile)
    }

    /// Writes the intervals held (see [`crate::intervals::Held`]) whose
    /// copied stacks are walked now or given up (no longer waiting in
    /// `deferred`), or that waited long enough.
    fn write_held(
        &mut self,
        deferred: &Deferred,
        kernel_first: bool,
        (registry, symbolizer): (&mut Registry, &Symbolizer),
        config: &Config,
        sinks: &mut [Sink],
    ) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let waiting = deferred.waiting_ids();
        for mut raw in self.held.ready(&|id| waiting.contains(&id), Instant::now()) {
            Deferred::complete(&mut raw);
            self.write(
                raw,
                None,
                kernel_first,
                (&mut *registry, symbolizer),
                config,
                sinks,
            )?;
        }
        Ok(())
    }

    /// `--push`: what is queued is sent, within a few seconds; what could
    /// not be sent is said.
    fn finish_push(&mut self, verbose: bool) {
        let Some(pusher) = self.pusher.take() else {
            return;
        };
        let url = pusher.endpoint().to_string();
        let s = pusher.finish(PUSH_DEADLINE);
        let total = s.sent + s.failed + s.dropped;
        if s.failed + s.dropped > 0 {
            eprintln!(
                "offcputime: {} of {total} intervals could not be pushed to {url} ({} failed after \
                 retries or at the end's {} s deadline, {} given up for a full queue; last error: \
                 {})",
                s.failed + s.dropped,
                s.failed,
                PUSH_DEADLINE.as_secs(),
                s.dropped,
                s.last_error.as_deref().unwrap_or("none")
            );
        } else if verbose {
            eprintln!(
                "offcputime: pushed {} intervals ({} bytes of pprof) to {url}",
                s.sent, s.bytes
            );
        }
    }
}

/// `--push`: how long the end waits for what is queued to be sent.
const PUSH_DEADLINE: Duration = Duration::from_secs(5);

/// `-i`, after the last interval: a file that got every interval is put in
/// place; one opened for a name pattern (to check it could be written)
/// is dropped, each interval having had a file of its own.
fn finish_interval_sinks(config: &Config, sinks: Vec<Sink>) -> Result<()> {
    let mut sinks = sinks.into_iter();
    for ((path, _), sink) in config.outputs().zip(sinks.by_ref()) {
        if path.and_then(crate::intervals::NamePattern::new).is_some() {
            sink.discard();
        } else if let Err(e) = sink.finish() {
            sinks.for_each(Sink::discard);
            return Err(e);
        }
    }
    Ok(())
}

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

/// Processes that have exited, until what was kept for them is given
/// back: their snapshot becomes the frames of the stacks counted for them,
/// and their unwind tables are freed. A process is let go at least
/// [`Exits::GRACE`] after it was seen exiting, when its threads have surely
/// stopped blocking, and those seen within [`Exits::EVERY`] are let go
/// together (one pass over the counts). Exits come from the BPF program; a sweep over the
/// processes kept finds those whose notice was lost.
#[derive(Default)]
struct Exits {
    pending: HashMap<Proc, Instant>,
    last_due: Option<Instant>,
    last_sweep: Option<Instant>,
}

impl Exits {
    const GRACE: Duration = Duration::from_secs(1);
    /// Processes let go together at most this often: each time is one
    /// pass over the counts.
    const EVERY: Duration = Duration::from_secs(3);
    const SWEEP_EVERY: Duration = Duration::from_secs(10);

    fn exited(&mut self, p: Proc) {
        self.pending.entry(p).or_insert_with(Instant::now);
    }

    /// Every SWEEP_EVERY: the processes kept whose /proc entry is gone, or
    /// is another process's now.
    fn sweep(&mut self, registry: &Registry) {
        let now = Instant::now();
        let last = *self.last_sweep.get_or_insert(now);
        if now.duration_since(last) < Self::SWEEP_EVERY {
            return;
        }
        self.last_sweep = Some(now);
        let gone: Vec<Proc> = registry
            .processes()
            .filter_map(|(tgid, start)| {
                let alive = crate::process::start_ticks(tgid);
                match (start, alive) {
                    (Some(s), a) if a != Some(s) => Some(Proc { tgid, start: s }),
                    (None, None) => Some(Proc { tgid, start: 0 }),
                    _ => None,
                }
            })
            .collect();
        for p in gone {
            self.exited(p);
        }
    }

    /// At most once per EVERY, the processes that exited at least GRACE
    /// ago.
    fn due(&mut self) -> Option<HashSet<Proc>> {
        let now = Instant::now();
        if self.pending.is_empty()
            || self
                .last_due
                .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return None;
        }
        self.last_due = Some(now);
        let due: HashSet<Proc> = self
            .pending
            .iter()
            .filter(|(_, &at)| now.duration_since(at) >= Self::GRACE)
            .map(|(&p, _)| p)
            .collect();
        self.pending.retain(|p, _| !due.contains(p));
        (!due.is_empty()).then_some(due)
    }
}

/// With `OFFCPUTIME_STATS_INTERVAL=SECONDS` in the environment, a line on
/// stderr every so often while tracing, for long runs and benchmarks: how
/// many processes came and went, the unwind tables' use and the resident
/// memory.
struct StatsLine {
    every: Option<Duration>,
    began: Instant,
    last: Instant,
    processes: usize,
    exited: usize,
}

impl StatsLine {
    fn from_env(began: Instant) -> StatsLine {
        let every = std::env::var("OFFCPUTIME_STATS_INTERVAL")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64);
        StatsLine {
            every,
            began,
            last: Instant::now(),
            processes: 0,
            exited: 0,
        }
    }

    fn maybe_print(&mut self, unwinder: Option<&Unwinder>) {
        let Some(every) = self.every else {
            return;
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let tables = unwinder.map_or(String::new(), |u| {
            let s = u.stats();
            format!(
                " objects={} rows={}/{} mappings={}/{} procs={} building={}",
                s.objects,
                s.rows,
                s.row_capacity,
                s.mappings,
                s.mapping_capacity,
                s.processes,
                u.building()
            )
        });
        let rss = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next().map(str::to_string))
            })
            .unwrap_or_default();
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        eprintln!(
            "offcputime: stats: t={:.1}s processes={} exited={}{tables} rss_kib={rss} fds={fds}",
            self.began.elapsed().as_secs_f64(),
            self.processes,
            self.exited,
        );
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
