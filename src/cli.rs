//! Command line: flags (compatible with bcc's `offcputime`) to a validated
//! [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};

use crate::output::pprof::{PprofOptions, SampleType};
use crate::output::speedscope::SpeedscopeOptions;
use crate::output::svg::{self, SvgOptions};
use crate::output::Shape;
use crate::profile::StackMode;
use crate::tracer::{Hook, TracerOptions, Unwind, UnwindCapacity, MAX_STACK_DEPTH};

/// `--sample` at most 1 s: the BPF program's weights stay within 64 bits.
const MAX_SAMPLE_US: u64 = 1_000_000;
/// `--on-cpu`'s samples per second on each CPU: a few hundred, at a period
/// (3.236 ms, twice the golden ratio in ms) that no loop timed in whole
/// milliseconds keeps in step with: 2.004 ms (499 Hz) sampled a loop of
/// 1 + 3 ms at the same two points of it for seconds.
pub const DEFAULT_ON_CPU_HZ: u32 = 309;
/// ... and at most (each sample walks the stacks).
const MAX_ON_CPU_HZ: u32 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HookArg {
    /// the cheapest hook that attaches: tp_btf, then raw_tp, then kprobe;
    /// with -m above 1 (and no --state), the kprobe first where the kernel has
    /// kprobes, since it walks stacks only for blocks that pass
    Auto,
    /// the sched_switch tracepoint (tp_btf, falling back to raw_tp)
    SchedSwitch,
    /// a kprobe on finish_task_switch
    FinishTaskSwitch,
    /// tp_btf/sched_switch only
    TpBtf,
    /// raw_tp/sched_switch only
    RawTp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UnwindArg {
    /// frame pointers, walked by the kernel: misses callers of code built
    /// without them (most distribution libraries, release builds)
    Fp,
    /// DWARF call-frame information (.eh_frame, .debug_frame), walked in
    /// BPF with tables built for each process; frame pointers where there
    /// is none (JIT code)
    Dwarf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// folded stacks, one line per stack (as -f)
    Folded,
    /// bcc's multi-line report
    Report,
    /// a flame graph (as --svg)
    Svg,
    /// a gzipped pprof profile.proto, for go tool pprof, Pyroscope, Parca
    Pprof,
    /// speedscope's JSON file format
    Speedscope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupSortArg {
    /// fewest threads first, the stack most threads share last (BTstack)
    Asc,
    /// most threads first
    Desc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PushApiArg {
    /// Pyroscope's ingest API: POST PREFIX/ingest?format=pprof (Grafana
    /// Pyroscope, Grafana Alloy's pyroscope.receive_http)
    Pyroscope,
    /// Parca's WriteRaw through its HTTP gateway: POST PREFIX/profiles/writeraw
    Parca,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SampleTypeArg {
    /// offcpu/nanoseconds, as Grafana Alloy names off-CPU profiles
    Offcpu,
    /// wallclock/nanoseconds, as Parca's agent names them
    Wallclock,
}

/// Summarize off-CPU time by stack trace: where threads block, and for how
/// long.
#[derive(Parser, Debug)]
#[command(
    name = "offcputime",
    version,
    after_help = "Examples:\n  \
    offcputime             # trace off-CPU stack time until Ctrl-C\n  \
    offcputime 5           # trace for 5 seconds only\n  \
    offcputime -f 5        # 5 seconds, and output in folded format\n  \
    offcputime --svg 5 > offcpu.svg   # 5 seconds, as a flame graph\n  \
    offcputime -o out.svg 5           # the same, written to a file\n  \
    offcputime -o out.pb.gz 5         # 5 seconds, a pprof profile\n  \
    offcputime -o out.speedscope.json 5   # 5 seconds, for speedscope\n  \
    offcputime -m 1000     # trace only events that last more than 1000 usec\n  \
    offcputime -M 10000    # trace only events that last less than 10000 usec\n  \
    offcputime -p 185      # only trace threads for PID 185\n  \
    offcputime -t 188      # only trace thread 188\n  \
    offcputime -u          # only trace user threads (no kernel)\n  \
    offcputime -k          # only trace kernel threads (no user)\n  \
    offcputime -U          # only show user space stacks (no kernel)\n  \
    offcputime -K          # only show kernel space stacks (no user)\n  \
    offcputime --state 2   # only blocks in TASK_UNINTERRUPTIBLE"
)]
pub struct Args {
    /// Trace these processes only (comma-separated PIDs)
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PIDS",
        value_delimiter = ',',
        num_args = 1
    )]
    pub pid: Vec<String>,

    /// Trace these threads only (comma-separated TIDs)
    #[arg(
        short = 't',
        long = "tid",
        value_name = "TIDS",
        value_delimiter = ',',
        num_args = 1
    )]
    pub tid: Vec<String>,

    /// Trace only the tasks in this cgroup v2 directory and the cgroups
    /// below it (a pod's cgroup holds its containers'); may be given
    /// several times
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroup: Vec<PathBuf>,

    /// Each stack under a `[container ID]` frame at its root (folded,
    /// flame graph), one speedscope profile per container
    #[arg(long = "per-container")]
    pub per_container: bool,

    /// User threads only (no kernel threads)
    #[arg(short = 'u', long = "user-threads-only")]
    pub user_threads_only: bool,

    /// Kernel threads only (no user threads)
    #[arg(short = 'k', long = "kernel-threads-only")]
    pub kernel_threads_only: bool,

    /// Show stacks from user space only (no kernel space stacks)
    #[arg(short = 'U', long = "user-stacks-only")]
    pub user_stacks_only: bool,

    /// Show stacks from kernel space only (no user space stacks)
    #[arg(short = 'K', long = "kernel-stacks-only")]
    pub kernel_stacks_only: bool,

    /// Insert a delimiter between kernel and user stacks
    #[arg(short = 'd', long = "delimited")]
    pub delimited: bool,

    /// Output folded format, one line per stack (for flame graphs)
    #[arg(short = 'f', long = "folded")]
    pub folded: bool,

    /// Output a flame graph (SVG) instead of text
    #[arg(long = "svg", conflicts_with = "folded")]
    pub svg: bool,

    /// Output format [default: the report, or what -o FILE's name says]
    #[arg(
        long = "format",
        value_enum,
        value_name = "FORMAT",
        conflicts_with_all = ["folded", "svg"]
    )]
    pub format: Option<FormatArg>,

    /// Write the output to FILE instead of stdout ("-" is stdout). A FILE
    /// ending in .svg, .pb.gz, .speedscope.json, .folded or .txt gets that
    /// format unless -f, --svg or --format say otherwise. Given several
    /// times, one run writes each file in the format its name says
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Vec<PathBuf>,

    /// Name of the pprof sample type [default: offcpu]
    #[arg(
        long = "pprof-sample-type",
        value_enum,
        value_name = "NAME",
        help_heading = "pprof (--format pprof)"
    )]
    pub pprof_sample_type: Option<SampleTypeArg>,

    /// A thread_id label on each pprof sample
    #[arg(long = "thread-ids", help_heading = "pprof (--format pprof)")]
    pub thread_ids: bool,

    /// One speedscope profile per process instead of one per thread
    #[arg(
        long = "per-process",
        help_heading = "speedscope (--format speedscope)"
    )]
    pub per_process: bool,

    /// Flame graph title [default: "Off-CPU Time Flame Graph"]
    #[arg(
        long = "title",
        value_name = "TEXT",
        help_heading = "Flame graph (--svg)"
    )]
    pub title: Option<String>,

    /// Flame graph subtitle [default: what was traced]
    #[arg(
        long = "subtitle",
        value_name = "TEXT",
        help_heading = "Flame graph (--svg)"
    )]
    pub subtitle: Option<String>,

    /// Flame graph width in pixels [default: the browser window's]
    #[arg(
        long = "width",
        value_name = "PIXELS",
        help_heading = "Flame graph (--svg)"
    )]
    pub width: Option<String>,

    /// Leave out frames narrower than this percentage of the total [default: 0.01]
    #[arg(
        long = "minwidth",
        value_name = "PERCENT",
        help_heading = "Flame graph (--svg)"
    )]
    pub minwidth: Option<String>,

    /// Icicle graph: outermost frames at the top
    #[arg(long = "inverted", help_heading = "Flame graph (--svg)")]
    pub inverted: bool,

    /// Reverse the stacks: innermost frames at the root
    #[arg(long = "reverse", help_heading = "Flame graph (--svg)")]
    pub reverse: bool,

    /// Palette for user frames (io, hot, mem, wakeup, red, green, blue, aqua,
    /// yellow, purple, orange, java, js, perl, python, rust) [default: io];
    /// kernel frames get a contrasting colour
    #[arg(
        long = "colors",
        value_name = "PALETTE",
        help_heading = "Flame graph (--svg)"
    )]
    pub colors: Option<String>,

    /// Keep only stacks with a frame whose name matches this regular
    /// expression (the waker's frames count with --wakers); repeated, any
    /// of them
    #[arg(long = "grep", value_name = "REGEX")]
    pub grep: Vec<String>,

    /// Leave out stacks with a frame whose name matches this regular
    /// expression; repeated, any of them
    #[arg(long = "exclude", value_name = "REGEX")]
    pub exclude: Vec<String>,

    /// Report: one entry per stack, with the threads, processes and
    /// commands that blocked in it and their blocks and time
    #[arg(long = "group")]
    pub group: bool,

    /// Order of --group's entries [default: asc]
    #[arg(long = "group-sort", value_enum, value_name = "ORDER")]
    pub group_sort: Option<GroupSortArg>,

    /// Show address offsets, function sizes and modules
    /// (func+0x1a/0x90 [libc.so.6])
    #[arg(short = 's', long = "offset")]
    pub offset: bool,

    /// Show each frame's address before its name (0x7f3a5c1147e2:func)
    #[arg(long = "addresses")]
    pub addresses: bool,

    /// How user stacks are walked
    #[arg(long = "unwind", value_enum, default_value = "dwarf")]
    pub unwind: UnwindArg,

    /// Kernel memory for the DWARF unwind tables, in MiB (auto: 1/256 of
    /// the machine's memory, 16 to 128)
    #[arg(long = "unwind-memory", value_name = "MIB", default_value = "auto")]
    pub unwind_memory: String,

    /// Do not show inlined functions as frames of their own
    #[arg(long = "no-inline")]
    pub no_inline: bool,

    /// Add the source file and line to each frame (func (file.c:12)), where
    /// debug information has them
    #[arg(long = "lines")]
    pub lines: bool,

    /// The number of unique stack traces that can be stored and displayed
    #[arg(long = "stack-storage-size", value_name = "N", default_value = "16384")]
    pub stack_storage_size: String,

    /// Maximum depth of the stacks recorded (at most 127)
    #[arg(long = "perf-max-stack-depth", value_name = "N", default_value = "127")]
    pub perf_max_stack_depth: String,

    /// Only count blocks of at least this many microseconds
    #[arg(
        short = 'm',
        long = "min-block-time",
        value_name = "US",
        allow_negative_numbers = true
    )]
    pub min_block_time: Option<String>,

    /// Only count blocks of at most this many microseconds
    #[arg(
        short = 'M',
        long = "max-block-time",
        value_name = "US",
        allow_negative_numbers = true
    )]
    pub max_block_time: Option<String>,

    /// Sample the blocks shorter than this many microseconds (at most
    /// 1000000): each is taken with probability (its length / US) and
    /// counted as US long, so that totals of time and of blocks stay
    /// unbiased estimates; longer blocks are always taken, exactly. On the
    /// finish_task_switch kprobe (which --hook auto then prefers) the
    /// stacks of the blocks left out are never walked
    #[arg(long = "sample", value_name = "US")]
    pub sample: Option<String>,

    /// Only count blocks whose thread state at switch-out matches this
    /// bitmask (e.g. 1 = TASK_INTERRUPTIBLE, 2 = TASK_UNINTERRUPTIBLE; 0 means
    /// exactly TASK_RUNNING, i.e. preempted)
    #[arg(long = "state", value_name = "STATE")]
    pub state: Option<String>,

    /// Split off-CPU time by thread state: [sleep], [io], [blocked] until
    /// the wake-up, [runqueue] from the wake-up (or a preemption) until the
    /// thread runs, [stopped]; shown as a frame after the command name
    #[arg(long = "states")]
    pub states: bool,

    /// The time threads ran too, beside the time they waited: each
    /// thread's running time (exact, from its switches) shared between the
    /// stacks it was sampled in on the CPU, under a [running] frame after
    /// the command name ([running];[not sampled] where no sample caught it)
    #[arg(long = "on-cpu")]
    pub on_cpu: bool,

    /// --on-cpu: samples per second on each CPU (cpu-clock)
    #[arg(short = 'F', long = "frequency", value_name = "HZ")]
    pub frequency: Option<String>,

    /// With each block, the stacks of the task that woke it, taken at the
    /// wake-up (folded: bcc offwaketime's format, `--` then the waker's
    /// stacks innermost first and its command last)
    #[arg(long = "wakers")]
    pub wakers: bool,

    /// Keep the native view of CPython processes: the interpreter's C
    /// frames only, without the Python functions it was running in their
    /// place
    #[arg(long = "no-python")]
    pub no_python: bool,

    /// Instead of tracing: what every task waits in now, grouped by stack,
    /// with how long each has been off the CPU. STATES keeps the tasks in
    /// these states only: letters as /proc shows them (D, or DS: R S D T
    /// t X Z P I)
    #[arg(
        long = "snapshot",
        value_name = "STATES",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub snapshot: Option<String>,

    /// Where to hook the context switch
    #[arg(long = "hook", value_enum, default_value = "auto")]
    pub hook: HookArg,

    /// Print a profile every SECONDS, each holding exactly its own time
    /// (a block spanning an interval's end is split there), until the
    /// duration or Ctrl-C; with -o, {n} or {time} in the name gives a file
    /// per interval
    #[arg(short = 'i', long = "interval", value_name = "SECONDS")]
    pub interval: Option<String>,

    /// With -i, a line with the time (HH:MM:SS) before each interval
    #[arg(short = 'T', long = "timestamp")]
    pub timestamp: bool,

    /// With -i, send each interval as a pprof profile to this
    /// Pyroscope-compatible ingest endpoint (http://[user:password@]host[:port][/prefix])
    #[arg(
        long = "push",
        value_name = "URL",
        help_heading = "Continuous export (--push)"
    )]
    pub push: Option<String>,

    /// The application's name in the profiling backend (default: offcputime)
    #[arg(
        long = "app",
        value_name = "NAME",
        help_heading = "Continuous export (--push)"
    )]
    pub app: Option<String>,

    /// The backend's API
    #[arg(
        long = "push-api",
        value_enum,
        default_value = "pyroscope",
        help_heading = "Continuous export (--push)"
    )]
    pub push_api: PushApiArg,

    /// A label on every pushed profile (besides host=HOSTNAME); repeatable
    #[arg(
        long = "push-label",
        value_name = "KEY=VALUE",
        help_heading = "Continuous export (--push)"
    )]
    pub push_label: Vec<String>,

    /// Print details (hook used, counts of lost data) on stderr
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,

    /// Duration of the trace in seconds (default: until Ctrl-C)
    #[arg(value_name = "DURATION", allow_negative_numbers = true)]
    pub duration: Option<String>,
}

/// Which rendering of the profile is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// bcc's multi-line report.
    Text,
    /// Folded stacks (`-f`).
    Folded,
    /// A flame graph (`--svg`).
    Svg(SvgOptions),
    /// A gzipped pprof `profile.proto`.
    Pprof(PprofOptions),
    /// speedscope's JSON.
    Speedscope(SpeedscopeOptions),
}

/// What to trace and how to show it, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub tracer: TracerOptions,
    /// `--cgroup`'s directories, as given (their ids are in `tracer`).
    pub cgroups: Vec<PathBuf>,
    pub shape: Shape,
    pub format: Format,
    /// `None` is stdout.
    pub output: Option<PathBuf>,
    /// Further files written from the same profile (`-o` given several
    /// times), each in its own format.
    pub more_outputs: Vec<(PathBuf, Format)>,
    pub offsets: bool,
    /// `--addresses`.
    pub addresses: bool,
    /// `--group`, in this order (the report only).
    pub group: Option<crate::output::group::GroupSort>,
    /// `--grep` and `--exclude`.
    pub filter: Option<crate::filter::StackFilter>,
    /// Inlined functions as frames of their own.
    pub inline: bool,
    /// `file:line` on frames.
    pub lines: bool,
    pub verbose: bool,
    pub duration: Option<Duration>,
    /// `-i`: a profile for each interval of this length.
    pub interval: Option<Duration>,
    /// `-T`: a time line before each interval.
    pub timestamp: bool,
    /// `--push`: where each interval is sent, and how it is named.
    pub push: Option<crate::push::PushOptions>,
    /// `--snapshot`: one look at every task instead of tracing.
    pub snapshot: Option<SnapshotConfig>,
}

/// What `--snapshot` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// The state letters asked for ("" for all).
    pub letters: String,
    /// The same as a mask of state indices (see `tracer::states_mask`).
    pub states: u32,
    /// The order of the groups.
    pub sort: crate::output::group::GroupSort,
}

fn parse_u64(what: &str, s: &str) -> Result<u64> {
    let s = s.trim();
    if s.starts_with('-') {
        bail!("{what} must not be negative: {s}");
    }
    let v = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        s.parse::<u64>()
    };
    v.with_context(|| format!("{what} is not a whole number: {s:?}"))
}

fn parse_ids(what: &str, items: &[String]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            bail!("empty {what} in list");
        }
        let id: u32 = item
            .parse()
            .ok()
            .filter(|&v: &u32| v > 0 && v <= i32::MAX as u32)
            .with_context(|| format!("invalid {what}: {item:?}"))?;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

fn parse_duration(s: &str) -> Result<Duration> {
    parse_seconds("duration", s)
}

fn parse_seconds(what: &str, s: &str) -> Result<Duration> {
    let s = s.trim();
    let secs: f64 = s
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .with_context(|| format!("{what} is not a number of seconds: {s:?}"))?;
    if secs <= 0.0 {
        bail!("{what} must be positive: {s}");
    }
    if secs > 1e9 {
        bail!("{what} is too long: {s}");
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Args {
    /// Checks the flags together and turns them into a [`Config`].
    pub fn into_config(self) -> Result<Config> {
        if self.user_threads_only && self.kernel_threads_only {
            bail!("-u/--user-threads-only and -k/--kernel-threads-only are mutually exclusive");
        }
        if self.user_stacks_only && self.kernel_stacks_only {
            bail!("-U/--user-stacks-only and -K/--kernel-stacks-only are mutually exclusive");
        }
        if self.user_stacks_only && self.kernel_threads_only {
            bail!("-U/--user-stacks-only with -k/--kernel-threads-only shows nothing: kernel threads have no user stacks");
        }
        let tgids = parse_ids("PID", &self.pid)?;
        let tids = parse_ids("TID", &self.tid)?;
        let cgroups = self
            .cgroup
            .iter()
            .map(|p| crate::container::cgroup_dir(p))
            .collect::<Result<Vec<_>>>()?;
        let min_us = match &self.min_block_time {
            Some(s) => parse_u64("-m/--min-block-time", s)?,
            None => 1,
        };
        let max_us = match &self.max_block_time {
            Some(s) => parse_u64("-M/--max-block-time", s)?,
            None => u64::MAX,
        };
        if min_us > max_us {
            bail!("-m/--min-block-time ({min_us}) is greater than -M/--max-block-time ({max_us})");
        }
        let sample_us = match &self.sample {
            Some(s) => parse_u64("--sample", s)?,
            None => 0,
        };
        if self.sample.is_some() && !(1..=MAX_SAMPLE_US).contains(&sample_us) {
            bail!("--sample must be between 1 and {MAX_SAMPLE_US} microseconds: {sample_us}");
        }
        let state = match &self.state {
            Some(s) => {
                let v = parse_u64("--state", s)?;
                Some(u32::try_from(v).with_context(|| format!("--state is too large: {v}"))?)
            }
            None => None,
        };
        let storage = parse_u64("--stack-storage-size", &self.stack_storage_size)?;
        if storage == 0 || storage > 1 << 24 {
            bail!(
                "--stack-storage-size must be between 1 and {}: {storage}",
                1 << 24
            );
        }
        let depth = parse_u64("--perf-max-stack-depth", &self.perf_max_stack_depth)?;
        if depth == 0 || depth > MAX_STACK_DEPTH as u64 {
            bail!("--perf-max-stack-depth must be between 1 and {MAX_STACK_DEPTH}: {depth}");
        }
        let unwind_mib = if self.unwind_memory == "auto" {
            auto_unwind_mib(crate::process::memory_total())
        } else {
            parse_u64("--unwind-memory", &self.unwind_memory)?
        };
        if !(1..=4096).contains(&unwind_mib) {
            bail!("--unwind-memory must be between 1 and 4096 MiB: {unwind_mib}");
        }
        let snapshot = self.snapshot_config()?;
        let duration = self.duration.as_deref().map(parse_duration).transpose()?;
        let interval = self
            .interval
            .as_deref()
            .map(|s| parse_seconds("-i/--interval", s))
            .transpose()?;
        if let Some(i) = interval {
            if i < Duration::from_millis(10) {
                bail!(
                    "-i/--interval must be at least 0.01 seconds: {}",
                    fmt_secs(i)
                );
            }
            if self.hook == HookArg::FinishTaskSwitch {
                bail!(
                    "-i needs the sched_switch tracepoint (--hook auto, sched-switch, tp-btf or \
                     raw-tp): the finish_task_switch kprobe takes stacks at switch-in, so a \
                     block under way at an interval's end would have none"
                );
            }
        } else if self.timestamp {
            bail!("-T/--timestamp dates each interval: add -i SECONDS");
        }
        let push = self.push_options(interval.is_some())?;
        let filter = crate::filter::StackFilter::new(&self.grep, &self.exclude)?;
        let group = if snapshot.is_some() {
            None
        } else {
            self.group()?
        };
        let outputs: Vec<Option<PathBuf>> = self
            .output
            .iter()
            .map(|p| Some(p.clone()).filter(|p| p.as_os_str() != "-"))
            .collect();
        let mut formats = self.formats(&outputs)?;
        if group.is_some() && formats.iter().any(|f| *f != Format::Text) {
            bail!(
                "--group merges threads in the report only: folded stacks, flame graphs, pprof \
                 and speedscope merge them already (without -f, --svg or --format, or with -o \
                 FILE.txt)"
            );
        }
        if interval.is_some() {
            let whole = |f: &Format| !matches!(f, Format::Text | Format::Folded);
            let paths = if outputs.is_empty() {
                vec![None]
            } else {
                outputs.clone()
            };
            let checked: Vec<(Option<PathBuf>, bool)> =
                paths.into_iter().zip(formats.iter().map(whole)).collect();
            crate::intervals::check_outputs(&checked)?;
        }
        let format = formats.remove(0);
        let output = outputs.first().cloned().flatten();
        let more_outputs: Vec<(PathBuf, Format)> =
            outputs.into_iter().skip(1).flatten().zip(formats).collect();

        let mode = if self.user_stacks_only {
            StackMode::UserOnly
        } else if self.kernel_stacks_only {
            StackMode::KernelOnly
        } else {
            StackMode::Both
        };
        let hook = match self.hook {
            HookArg::Auto => Hook::Auto,
            HookArg::SchedSwitch => Hook::SchedSwitch,
            HookArg::FinishTaskSwitch => Hook::FinishTaskSwitch,
            HookArg::TpBtf => Hook::TpBtf,
            HookArg::RawTp => Hook::RawTp,
        };
        let mut config = Config {
            tracer: TracerOptions {
                duration,
                interval,
                tgids,
                tids,
                cgroups: cgroups.iter().map(|c| c.id).collect(),
                user_threads_only: self.user_threads_only,
                kernel_threads_only: self.kernel_threads_only,
                state,
                // A block counts when its length in whole microseconds is
                // within [min, max], as in bcc.
                min_block_ns: min_us.saturating_mul(1000),
                max_block_ns: match max_us.checked_add(1).and_then(|m| m.checked_mul(1000)) {
                    Some(ns) => ns - 1,
                    None => u64::MAX,
                },
                sample_ns: sample_us * 1000,
                user_stacks: mode.user(),
                kernel_stacks: mode.kernel(),
                stack_storage_size: storage as u32,
                max_stack_depth: depth as u32,
                hook,
                unwind: match self.unwind {
                    UnwindArg::Fp => Unwind::FramePointers,
                    UnwindArg::Dwarf if mode.user() => Unwind::Dwarf,
                    // No user stacks: no tables to build.
                    UnwindArg::Dwarf => Unwind::FramePointers,
                },
                unwind_capacity: UnwindCapacity::from_bytes(unwind_mib << 20),
                states: self.states,
                wakers: self.wakers,
                python: !self.no_python,
                on_cpu_hz: self.on_cpu_hz()?,
                test: crate::test_env::TestEnv::from_env(),
            },
            shape: Shape {
                mode,
                delimited: self.delimited,
                per_container: self.per_container,
            },
            cgroups: cgroups.into_iter().map(|c| c.path).collect(),
            format,
            output,
            more_outputs,
            offsets: self.offset,
            addresses: self.addresses,
            group,
            filter,
            inline: !self.no_inline,
            lines: self.lines,
            verbose: self.verbose,
            duration,
            interval,
            timestamp: self.timestamp,
            push,
            snapshot,
        };
        let description = config.description();
        let more = config.more_outputs.iter_mut().map(|(_, f)| f);
        for format in std::iter::once(&mut config.format).chain(more) {
            if let Format::Svg(o) = format {
                if config.snapshot.is_some() {
                    o.count_name = "tasks".to_string();
                    if self.title.is_none() {
                        o.title = "Tasks by Stack".to_string();
                    }
                }
                o.subtitle = match o.subtitle.take() {
                    None => Some(description.clone()),
                    Some(s) if s.is_empty() => None,
                    some => some,
                };
            }
        }
        Ok(config)
    }
}

/// The format a file name says: `.svg`, `.pb.gz`, `.speedscope.json`,
/// `.folded`, `.txt` (in any case).
pub fn format_by_name(path: &std::path::Path) -> Option<FormatArg> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    [
        (".svg", FormatArg::Svg),
        (".pb.gz", FormatArg::Pprof),
        (".speedscope.json", FormatArg::Speedscope),
        (".folded", FormatArg::Folded),
        (".txt", FormatArg::Report),
    ]
    .into_iter()
    .find(|(ending, _)| name.len() > ending.len() && name.ends_with(ending))
    .map(|(_, f)| f)
}

impl Args {
    /// The format of each output (`None` is stdout): `--format`, `-f` or
    /// `--svg`, else what the file's name says, else the report. Several
    /// files each take the format their name says.
    fn formats(&self, outputs: &[Option<PathBuf>]) -> Result<Vec<Format>> {
        let explicit = match (self.format, self.folded, self.svg) {
            (Some(f), _, _) => Some(f),
            (None, true, _) => Some(FormatArg::Folded),
            (None, _, true) => Some(FormatArg::Svg),
            _ => None,
        };
        let kinds: Vec<FormatArg> = if outputs.len() > 1 {
            if explicit.is_some() {
                bail!(
                    "with several -o, each file's name says its format (.svg, .pb.gz, \
                     .speedscope.json, .folded, .txt): -f, --svg and --format are for one output"
                );
            }
            let mut seen = std::collections::HashSet::new();
            outputs
                .iter()
                .map(|o| {
                    let Some(path) = o else {
                        bail!("with several -o, stdout (-) cannot be one of them");
                    };
                    if !seen.insert(path) {
                        bail!("-o {} is given twice", path.display());
                    }
                    format_by_name(path).with_context(|| {
                        format!(
                            "-o {}: with several -o, each file's name must say its format \
                             (.svg, .pb.gz, .speedscope.json, .folded, .txt)",
                            path.display()
                        )
                    })
                })
                .collect::<Result<_>>()?
        } else {
            let by_name = outputs
                .first()
                .cloned()
                .flatten()
                .and_then(|p| format_by_name(&p));
            vec![explicit.or(by_name).unwrap_or(FormatArg::Report)]
        };
        let wants = |k: FormatArg| kinds.contains(&k);
        if !wants(FormatArg::Svg) {
            let svg_flags = [
                ("--title", self.title.is_some()),
                ("--subtitle", self.subtitle.is_some()),
                ("--width", self.width.is_some()),
                ("--minwidth", self.minwidth.is_some()),
                ("--inverted", self.inverted),
                ("--reverse", self.reverse),
                ("--colors", self.colors.is_some()),
            ];
            if let Some((flag, _)) = svg_flags.iter().find(|f| f.1) {
                bail!("{flag} is a flame graph option: add --svg");
            }
        }
        if !wants(FormatArg::Pprof) && self.push.is_none() {
            let pprof_flags = [
                ("--pprof-sample-type", self.pprof_sample_type.is_some()),
                ("--thread-ids", self.thread_ids),
            ];
            if let Some((flag, _)) = pprof_flags.iter().find(|f| f.1) {
                bail!("{flag} is a pprof option: add --format pprof (or --push)");
            }
        }
        if !wants(FormatArg::Speedscope) && self.per_process {
            bail!("--per-process is a speedscope option: add --format speedscope");
        }
        let svg = if wants(FormatArg::Svg) {
            Some(self.svg_options()?)
        } else {
            None
        };
        Ok(kinds
            .into_iter()
            .map(|k| match k {
                FormatArg::Folded => Format::Folded,
                FormatArg::Report => Format::Text,
                FormatArg::Svg => Format::Svg(svg.clone().unwrap_or_default()),
                FormatArg::Pprof => Format::Pprof(self.pprof_options()),
                FormatArg::Speedscope => Format::Speedscope(SpeedscopeOptions {
                    per_process: self.per_process,
                }),
            })
            .collect())
    }

    fn pprof_options(&self) -> PprofOptions {
        PprofOptions {
            sample_type: match self.pprof_sample_type {
                Some(SampleTypeArg::Wallclock) => SampleType::Wallclock,
                Some(SampleTypeArg::Offcpu) => SampleType::Offcpu,
                // Running and waiting: the time on the wall.
                None if self.on_cpu => SampleType::Wallclock,
                None => SampleType::Offcpu,
            },
            thread_ids: self.thread_ids,
            on_cpu: self.on_cpu,
        }
    }

    /// `--on-cpu` and `-F`: the sampling rate, checked.
    fn on_cpu_hz(&self) -> Result<Option<u32>> {
        let Some(f) = &self.frequency else {
            return Ok(self.on_cpu.then_some(DEFAULT_ON_CPU_HZ));
        };
        if !self.on_cpu {
            bail!("-F/--frequency is the on-CPU sampling rate: add --on-cpu");
        }
        match f.trim().parse::<u32>() {
            Ok(hz) if (1..=MAX_ON_CPU_HZ).contains(&hz) => Ok(Some(hz)),
            _ => bail!(
                "-F/--frequency must be a whole number of Hz from 1 to {MAX_ON_CPU_HZ}: {f:?}"
            ),
        }
    }

    /// `--push`, `--app` and `--push-label`, checked.
    fn push_options(&self, intervals: bool) -> Result<Option<crate::push::PushOptions>> {
        use crate::push::{check_app, parse_label, Endpoint, PushOptions};
        let Some(url) = &self.push else {
            if self.app.is_some() || !self.push_label.is_empty() {
                bail!("--app and --push-label name pushed profiles: add --push URL");
            }
            if self.push_api != PushApiArg::Pyroscope {
                bail!("--push-api says how to push: add --push URL");
            }
            return Ok(None);
        };
        if !intervals {
            bail!("--push sends each interval: add -i SECONDS (e.g. -i 10)");
        }
        let endpoint = Endpoint::parse(url)?;
        let app = self.app.clone().unwrap_or_else(|| "offcputime".to_string());
        check_app(&app)?;
        let mut labels = vec![("host".to_string(), hostname())];
        for l in &self.push_label {
            let (k, v) = parse_label(l)?;
            if let Some(old) = labels.iter_mut().find(|(n, _)| *n == k) {
                old.1 = v;
            } else {
                labels.push((k, v));
            }
        }
        Ok(Some(PushOptions {
            api: match self.push_api {
                PushApiArg::Pyroscope => crate::push::PushApi::Pyroscope,
                PushApiArg::Parca => crate::push::PushApi::Parca,
            },
            endpoint,
            app,
            labels,
            pprof: self.pprof_options(),
        }))
    }

    /// `--snapshot`, checked against the flags that only tracing takes,
    /// and the formats it can be written in.
    fn snapshot_config(&self) -> Result<Option<SnapshotConfig>> {
        let Some(letters) = &self.snapshot else {
            return Ok(None);
        };
        let letters = letters.trim();
        if let Some(d) = &self.duration {
            bail!("--snapshot looks at every task once: it takes no duration ({d:?})");
        }
        if letters.chars().any(|c| c.is_ascii_digit()) {
            bail!(
                "--snapshot {letters}: it looks at every task once and takes no duration; \
                 STATES are letters (--snapshot D)"
            );
        }
        let tracing_only = [
            ("--states", self.states),
            ("--on-cpu", self.on_cpu),
            ("--wakers", self.wakers),
            ("-m/--min-block-time", self.min_block_time.is_some()),
            ("-M/--max-block-time", self.max_block_time.is_some()),
            ("--sample", self.sample.is_some()),
            ("--state", self.state.is_some()),
            ("--hook", self.hook != HookArg::Auto),
            ("-i/--interval", self.interval.is_some()),
            ("-T/--timestamp", self.timestamp),
            ("--push", self.push.is_some()),
        ];
        if let Some((flag, _)) = tracing_only.iter().find(|f| f.1) {
            let hint = if flag.starts_with("--state") {
                " (to keep tasks by state, give their letters: --snapshot D)"
            } else {
                ""
            };
            bail!("{flag} is about blocks while tracing, and --snapshot traces nothing{hint}");
        }
        let explicit = match (self.format, self.folded, self.svg) {
            (Some(f), _, _) => Some(f),
            (None, true, _) => Some(FormatArg::Folded),
            (None, _, true) => Some(FormatArg::Svg),
            _ => None,
        };
        let by_name = self.output.iter().filter_map(|p| format_by_name(p));
        if let Some(f) = explicit
            .into_iter()
            .chain(by_name)
            .find(|f| matches!(f, FormatArg::Pprof | FormatArg::Speedscope))
        {
            bail!(
                "--snapshot counts tasks, and {} profiles are of time: write the report, \
                 folded stacks (-f) or a flame graph (--svg)",
                if f == FormatArg::Pprof {
                    "pprof"
                } else {
                    "speedscope"
                }
            );
        }
        let sort = match self.group_sort {
            Some(GroupSortArg::Desc) => crate::output::group::GroupSort::Desc,
            _ => crate::output::group::GroupSort::Asc,
        };
        Ok(Some(SnapshotConfig {
            letters: letters.to_string(),
            states: crate::tracer::states_mask(letters)?,
            sort,
        }))
    }

    /// `--group` and its order; `--group-sort` without it is an error.
    fn group(&self) -> Result<Option<crate::output::group::GroupSort>> {
        use crate::output::group::GroupSort;
        match (self.group, self.group_sort) {
            (false, Some(_)) => bail!("--group-sort is a --group option: add --group"),
            (false, None) => Ok(None),
            (true, Some(GroupSortArg::Desc)) => Ok(Some(GroupSort::Desc)),
            (true, _) => Ok(Some(GroupSort::Asc)),
        }
    }

    fn svg_options(&self) -> Result<SvgOptions> {
        let mut o = SvgOptions::default();
        if let Some(t) = &self.title {
            o.title = t.clone();
        }
        // `None` until into_config fills in the description; "" is none.
        o.subtitle = self.subtitle.clone();
        if let Some(w) = &self.width {
            let w = parse_u64("--width", w)?;
            if !(100..=1_000_000).contains(&w) {
                bail!("--width must be between 100 and 1000000 pixels: {w}");
            }
            o.width = Some(w as usize);
        }
        if let Some(m) = &self.minwidth {
            let v: f64 = m
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && (0.0..=100.0).contains(v))
                .with_context(|| {
                    format!("--minwidth must be a percentage between 0 and 100: {m:?}")
                })?;
            o.min_width = v;
        }
        o.inverted = self.inverted;
        o.reverse = self.reverse;
        if let Some(c) = &self.colors {
            o.palette = svg::parse_palette(c.trim()).map_err(anyhow::Error::msg)?;
        }
        Ok(o)
    }
}

impl Config {
    /// Every output: the first (`None` is stdout), then the further files.
    pub fn outputs(&self) -> impl Iterator<Item = (Option<&std::path::Path>, &Format)> {
        std::iter::once((self.output.as_deref(), &self.format)).chain(
            self.more_outputs
                .iter()
                .map(|(p, f)| (Some(p.as_path()), f)),
        )
    }

    /// What was traced, in a few words: the flame graph's default subtitle.
    pub fn description(&self) -> String {
        let t = &self.tracer;
        let mut parts = vec![self.threads()];
        if let Some(snap) = &self.snapshot {
            if !snap.letters.is_empty() {
                parts.push(format!("state {}", snap.letters));
            }
            parts.push(format!("{} stacks, tasks now", self.stacks()));
            return parts.join(", ");
        }
        parts.push(format!("{} stacks", self.stacks()));
        if self.shape.per_container {
            parts.push("by container".to_string());
        }
        if t.min_block_ns > 1000 || t.max_block_ns != u64::MAX {
            let min = t.min_block_ns / 1000;
            parts.push(if t.max_block_ns == u64::MAX {
                format!("blocks of {min} us or more")
            } else {
                format!("blocks of {min} to {} us", t.max_block_ns / 1000)
            });
        }
        if t.sample_ns > 0 {
            parts.push(format!("blocks under {} us sampled", t.sample_ns / 1000));
        }
        if let Some(s) = t.state {
            parts.push(format!("state {s}"));
        }
        if t.states {
            parts.push("split by thread state".to_string());
        }
        if t.wakers {
            parts.push("with wakers".to_string());
        }
        if let Some(hz) = t.on_cpu_hz {
            parts.push(format!(
                "on-CPU time sampled at {hz} Hz in warm colours, off-CPU in cool ones"
            ));
        }
        parts.join(", ")
    }

    fn threads(&self) -> String {
        let t = &self.tracer;
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let who = if !t.tgids.is_empty() {
            format!("PID {}", list(&t.tgids))
        } else if !t.tids.is_empty() {
            format!("TID {}", list(&t.tids))
        } else if t.user_threads_only {
            "user threads".to_string()
        } else if t.kernel_threads_only {
            "kernel threads".to_string()
        } else {
            "all threads".to_string()
        };
        if self.cgroups.is_empty() {
            return who;
        }
        let paths: Vec<String> = self
            .cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let who = if who == "all threads" {
            "threads".to_string()
        } else {
            who
        };
        format!("{who} in cgroup {}", paths.join(", "))
    }

    fn stacks(&self) -> &'static str {
        match self.shape.mode {
            StackMode::Both => "user + kernel",
            StackMode::UserOnly => "user",
            StackMode::KernelOnly => "kernel",
        }
    }

    /// bcc's opening line: what is traced, by which stacks, for how long.
    pub fn status_line(&self) -> String {
        let (threads, stacks) = (self.threads(), self.stacks());
        if let Some(snap) = &self.snapshot {
            let states = if snap.letters.is_empty() {
                String::new()
            } else {
                format!(" in state {}", snap.letters)
            };
            return format!("Snapshot of {threads}{states} by {stacks} stack.");
        }
        let every = match self.interval {
            Some(i) => format!(", output every {} secs", fmt_secs(i)),
            None => String::new(),
        };
        let when = match self.duration {
            Some(d) => format!("{every} for {} secs.", fmt_secs(d)),
            None => format!("{every}... Hit Ctrl-C to end."),
        };
        let sampled = match self.tracer.sample_ns {
            0 => String::new(),
            ns => format!(" (blocks under {} us sampled)", ns / 1000),
        };
        let what = match self.tracer.on_cpu_hz {
            Some(hz) => format!("on- and off-CPU time (us, on-CPU sampled at {hz} Hz)"),
            None => "off-CPU time (us)".to_string(),
        };
        format!("Tracing {what} of {threads} by {stacks} stack{sampled}{when}")
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

/// This machine's name, as a label value (the characters that delimit
/// labels replaced).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| {
            if matches!(c, '{' | '}' | ',' | '=' | '"') || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}

/// Fails if a `-p`/`-t` names no existing process or thread.
pub fn check_targets(tracer: &TracerOptions) -> Result<()> {
    for pid in &tracer.tgids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("no process with PID {pid}"))?;
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .map(str::trim);
        if tgid != Some(pid.to_string().as_str()) {
            bail!("{pid} is a thread, not a process: use -t {pid} to trace it");
        }
    }
    for tid in &tracer.tids {
        if !std::path::Path::new(&format!("/proc/{tid}")).exists() {
            bail!("no thread with TID {tid}");
        }
    }
    Ok(())
}

/// `--unwind-memory auto`: 1/256 of the machine's memory (`total` bytes,
/// where known), at least 16 MiB and at most 128: room for the tables of
/// the largest programs (a compiler that maps LLVM needs about 20 MiB) on
/// any machine of 4 GiB or more.
fn auto_unwind_mib(total: Option<u64>) -> u64 {
    total.map_or(16, |t| (t >> 20) / 256).clamp(16, 128)
}

#[cfg(test)]
mod unwind_memory_tests {
    use super::auto_unwind_mib;

    #[test]
    fn auto_unwind_memory_follows_the_machine() {
        assert_eq!(auto_unwind_mib(None), 16);
        assert_eq!(auto_unwind_mib(Some(2 << 30)), 16);
        assert_eq!(auto_unwind_mib(Some(24 << 30)), 96);
        assert_eq!(auto_unwind_mib(Some(1 << 40)), 128);
    }
}
