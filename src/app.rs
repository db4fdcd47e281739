//! The program: parse, trace, report.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;

use crate::cli::{check_targets, Args, Config, Format};
use crate::output::{folded, svg, text};
use crate::profile::{self, Profile};
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
                print!("{e}");
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
    trace(&config, began)?;
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
    let mut sink = Sink::open(config.output.as_deref())?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut symbolizer = Symbolizer::new(SymbolizeOptions {
        offsets: config.offsets,
        inline: config.inline,
        lines: config.lines,
    });
    let mut started = Instant::now();
    let mut object = MaybeUninit::uninit();
    let mut unwinder: Option<Unwinder> = None;
    let started_tracer = prepare(config, &stop).and_then(|()| {
        started = Instant::now();
        Tracer::start(&mut object, &config.tracer, &mut |store| {
            // The processes asked for get their tables before tracing
            // starts, not at their first block.
            let mut u = Unwinder::new(store);
            for &tgid in &config.tracer.tgids {
                symbolizer.note_process(tgid, false);
                u.note_process(&symbolizer, tgid, true);
            }
            unwinder = Some(u);
        })
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
            return Err(e);
        }
    };
    if let Some(d) = config.duration {
        tracer.end_after(d);
    }
    if config.verbose {
        eprintln!(
            "offcputime: attached {} {:.1} ms after start (load and attach {:.1} ms)",
            tracer.hook(),
            began.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3,
        );
    }
    eprintln!("{}", config.status_line());
    if config.shape.mode.kernel() {
        symbolizer.warm_up_kernel();
    }

    let deadline = config.duration.map(|d| tracer.attached_at() + d);
    // Snapshots first, they are what names the frames of a process that
    // exits soon; then unwind tables: at once for processes whose files
    // all have theirs already (a new process of a known program), and for
    // 20 ms at a time for the others, between reads of new events, so that
    // building tables for many new files (all of a busy system's, at the
    // start) holds up neither the next snapshots nor the next new
    // processes.
    let mut tables_wanted = std::collections::VecDeque::new();
    tracer.wait(deadline, &stop, |new| {
        for &(tgid, changed) in new {
            symbolizer.note_process(tgid, changed);
        }
        let Some(u) = &mut unwinder else {
            return false;
        };
        for &(tgid, _) in new {
            if !u.note_process(&symbolizer, tgid, false) && !tables_wanted.contains(&tgid) {
                tables_wanted.push_back(tgid);
            }
        }
        let began = Instant::now();
        while began.elapsed() < std::time::Duration::from_millis(20) {
            let Some(tgid) = tables_wanted.pop_front() else {
                break;
            };
            u.note_process(&symbolizer, tgid, true);
        }
        !tables_wanted.is_empty()
    })?;
    tracer.stop()?;
    let (window_start, window_end) = tracer.window_ns();
    let ended = Instant::now();

    let raw = tracer.read()?;
    let profile = profile::build(
        &raw,
        &mut symbolizer,
        tracer.hook().kernel_first_frame_is_ip(),
    );
    drop(tracer);

    sink.write(|out| match &config.format {
        Format::Text => text::write(&profile, config.shape, out),
        Format::Folded => folded::write(&profile, config.shape, out),
        Format::Svg(o) => svg::write(&profile, config.shape, o, out),
    })?;
    if profile.samples.is_empty() {
        eprintln!("offcputime: no off-CPU time was recorded for the chosen threads");
    }

    report_losses(&profile, config);
    if let Some(u) = &unwinder {
        report_unwinding(u, &profile, config.verbose);
    }
    if config.verbose {
        eprintln!(
            "offcputime: traced {:.3} s (CLOCK_MONOTONIC {:.6} to {:.6}); {} stacks, {} blocks, \
             {:.3} s off-CPU in total; {} blocks in progress at the end counted up to it; \
             report in {:.1} ms",
            (window_end - window_start) as f64 / 1e9,
            window_start as f64 / 1e9,
            window_end as f64 / 1e9,
            profile.samples.len(),
            profile.samples.iter().map(|s| s.count).sum::<u64>(),
            profile.total_ns() as f64 / 1e9,
            profile.counters.blocks_at_end,
            ended.elapsed().as_secs_f64() * 1e3,
        );
        let c = &profile.counters;
        eprintln!(
            "offcputime: stack captures lost: storage full {} user / {} kernel, walk failed \
             {} user / {} kernel (no stack is dropped for a hash collision: stacks are keyed by a 64-bit hash of \
             their frames); {} blocks of kernel threads (no user stack); {} blocks untimed \
             (no task storage); {} new-process notifications dropped",
            c.user_stack_full,
            c.kernel_stack_full,
            c.user_stack_error,
            c.kernel_stack_error,
            c.kernel_thread_blocks,
            c.no_task_storage,
            c.events_dropped,
        );
    }
    Ok(())
}

fn report_losses(profile: &Profile, config: &Config) {
    let c = &profile.counters;
    let missed = profile.missed_stacks(config.shape.mode);
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
    if c.counts_full > 0 {
        eprintln!(
            "WARNING: {} blocks were not counted because the table of distinct stacks was full.",
            c.counts_full
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

/// What DWARF unwinding did not cover, and with -v its tables' size.
fn report_unwinding(u: &Unwinder, profile: &Profile, verbose: bool) {
    let c = &profile.counters;
    if c.unwind_not_ready > 0 {
        eprintln!(
            "offcputime: {} user stacks were walked with frame pointers because their process's \
             unwind tables were not ready yet (its first blocks)",
            c.unwind_not_ready
        );
    }
    let missing = u.not_covered();
    if !missing.is_empty() {
        const SHOWN: usize = 3;
        for m in missing.iter().take(SHOWN) {
            eprintln!(
                "offcputime: no DWARF unwinding for {} in process {}: {}; frame pointers are \
                 used there",
                m.what, m.tgid, m.why
            );
        }
        if missing.len() > SHOWN {
            eprintln!(
                "offcputime: ... and {} more objects or processes without DWARF unwinding",
                missing.len() - SHOWN
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
             with them ({} cut short), {} frames through frame pointers",
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
            c.unwind_fp_frames,
        );
    }
}

/// Where the report goes: stdout, or a file opened before tracing.
enum Sink {
    Stdout,
    File {
        file: File,
        path: PathBuf,
        /// It did not exist before: remove it if nothing is written.
        created: bool,
    },
}

impl Sink {
    fn open(path: Option<&Path>) -> Result<Sink> {
        let Some(path) = path else {
            return Ok(Sink::Stdout);
        };
        let show = path.display();
        if path.is_dir() {
            anyhow::bail!("cannot write the output to {show}: it is a directory");
        }
        let created = !path.exists();
        // Not truncated until the report is written: a run that fails to
        // start leaves an existing file as it was.
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("cannot write the output to {show}"))?;
        Ok(Sink::File {
            file,
            path: path.to_path_buf(),
            created,
        })
    }

    /// Removes a file this run created, when there is nothing to write.
    fn discard(self) {
        if let Sink::File {
            path,
            created: true,
            ..
        } = self
        {
            let _ = std::fs::remove_file(path);
        }
    }

    fn write(&mut self, render: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
        match self {
            Sink::Stdout => {
                let stdout = io::stdout();
                let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
                render(&mut out)
                    .and_then(|()| out.flush())
                    .context("failed to write the report")
            }
            Sink::File { file, path, .. } => {
                let written = || -> io::Result<()> {
                    // Devices and pipes are neither truncated nor synced.
                    let regular = file.metadata()?.is_file();
                    if regular {
                        file.set_len(0)?;
                    }
                    let mut out = BufWriter::with_capacity(64 * 1024, &*file);
                    render(&mut out)?;
                    out.flush()?;
                    if regular {
                        file.sync_data()?;
                    }
                    Ok(())
                };
                written()
                    .with_context(|| format!("failed to write the report to {}", path.display()))
            }
        }
    }
}
