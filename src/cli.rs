//! Command line: flags (compatible with bcc's `offcputime`) to a validated
//! [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};

use crate::output::otlp::OtlpOptions;
use crate::output::pprof::PprofOptions;
use crate::output::speedscope::SpeedscopeOptions;
use crate::output::svg::SvgOptions;
use crate::output::Shape;
use crate::tracer::TracerOptions;

mod config;
mod describe;
mod options;

/// `--sample` at most 1 s: the BPF program's weights stay within 64 bits.
const MAX_SAMPLE_US: u64 = 1_000_000;
/// `--timeline-min`'s default and its most (an hour).
const DEFAULT_TIMELINE_MIN_US: u64 = 1000;
const MAX_TIMELINE_MIN_US: u64 = 3_600_000_000;
/// `--chain-depth`'s default and its most.
const DEFAULT_CHAIN_DEPTH: u32 = 5;
const MAX_CHAIN_DEPTH: u32 = 32;
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
    /// an OpenTelemetry profiles request (OTLP, protobuf), for OTLP
    /// receivers (Pyroscope, the OpenTelemetry Collector)
    Otlp,
    /// --graph's wait-for graph in Graphviz's DOT language
    Dot,
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
    offcputime -o out.otlp 5          # 5 seconds, an OTLP profiles request\n  \
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
    /// ending in .svg, .pb.gz, .speedscope.json, .otlp, .folded or .txt gets that
    /// format unless -f, --svg or --format say otherwise. Given several
    /// times, one run writes each file in the format its name says
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Vec<PathBuf>,

    /// Name of the pprof (and OTLP) sample type [default: offcpu]
    #[arg(
        long = "pprof-sample-type",
        value_enum,
        value_name = "NAME",
        help_heading = "pprof (--format pprof)"
    )]
    pub pprof_sample_type: Option<SampleTypeArg>,

    /// A thread_id label on each pprof sample (thread.id attribute in OTLP)
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

    /// The most kernel memory the DWARF unwind tables may take, in MiB
    /// (auto: 1/256 of the machine's memory, 16 to 128); they grow as
    /// processes need them
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
    /// (from Linux 6.1: of each of three lengths, up to 24 frames, up to 56,
    /// longer)
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

    /// Why each block waited, down the chain: a block's wait is followed
    /// into the thread that woke it (the parts of the wait in which that
    /// thread was itself blocked, under its stacks, and on to who woke
    /// it, up to --chain-depth hops), ending in a thread running (with
    /// --on-cpu, its sampled stacks), waiting for a CPU, or a source that
    /// is no thread ([timer], [disk DEV], [network], [interrupt],
    /// [unknown]); folded: each hop after `--`, its command first, its
    /// stacks outermost first. Threads the filters leave out are followed
    /// too; with -i, each interval's waits inside it
    #[arg(long = "chains")]
    pub chains: bool,

    /// The wait-for graph of the window (implies --chains): threads and
    /// sources that are no thread, an edge from each to those it waited
    /// for, with the time; its knots (threads that others wait for and
    /// that wait for nobody else: the bottlenecks) said on stderr, ranked
    /// by the time waited on them. -o FILE.dot writes the graph (Graphviz)
    #[arg(long = "graph")]
    pub graph: bool,

    /// --chains: the most hops followed (default 5, at most 32)
    #[arg(long = "chain-depth", value_name = "N")]
    pub chain_depth: Option<String>,

    /// Also write a timeline to FILE (Perfetto's trace format: open it in
    /// ui.perfetto.dev): each block of at least --timeline-min as a slice
    /// on its thread's track, named by its innermost frame of the
    /// program's own code, with its stacks, its state and its waker, and
    /// an arrow from the wake-up (on the waker's track) to the block it
    /// ended
    #[arg(long = "timeline", value_name = "FILE")]
    pub timeline: Option<PathBuf>,

    /// --timeline: the shortest block written, in microseconds (default
    /// 1000)
    #[arg(long = "timeline-min", value_name = "US")]
    pub timeline_min: Option<String>,

    /// Keep the native view of CPython processes: the interpreter's C
    /// frames only, without the Python functions it was running in their
    /// place
    #[arg(long = "no-python")]
    pub no_python: bool,

    /// Keep CPython's call machinery between two Python frames
    /// (`_PyEval_Vector`, `_PyFunction_Vectorcall`, ...: on 3.10 between
    /// every two), hidden by default
    #[arg(long = "python-glue")]
    pub python_glue: bool,

    /// Keep the native view of JVM processes: the JVM's own frames, and
    /// the addresses of its code in place of the Java methods
    #[arg(long = "no-java")]
    pub no_java: bool,

    /// Keep the native view of Node.js processes: V8's own frames, and the
    /// addresses of its generated code in place of the JavaScript
    /// functions
    #[arg(long = "no-node")]
    pub no_node: bool,

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

    /// With -i, send each interval as an OTLP profiles request to this
    /// OTLP/HTTP receiver (http://[user:password@]host[:port][/prefix]:
    /// POST PREFIX/v1development/profiles)
    #[arg(
        long = "push-otlp",
        value_name = "URL",
        help_heading = "Continuous export (--push)"
    )]
    pub push_otlp: Option<String>,

    /// The application's name in the profiling backend (OTLP: service.name;
    /// default: offcputime)
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

    /// A label on every pushed profile (besides host=HOSTNAME; OTLP: a
    /// resource attribute); repeatable
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
    /// An OTLP `ExportProfilesServiceRequest` (protobuf).
    Otlp(OtlpOptions),
    /// `--graph`'s wait-for graph (Graphviz DOT).
    Dot,
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
    /// `--python-glue`: CPython's call machinery kept between two Python
    /// frames.
    pub python_glue: bool,
    /// `file:line` on frames.
    pub lines: bool,
    pub verbose: bool,
    pub duration: Option<Duration>,
    /// `-i`: a profile for each interval of this length.
    pub interval: Option<Duration>,
    /// `-T`: a time line before each interval.
    pub timestamp: bool,
    /// `--push` and `--push-otlp`: where each interval is sent, and how it
    /// is named.
    pub push: Vec<crate::push::PushOptions>,
    /// `--snapshot`: one look at every task instead of tracing.
    pub snapshot: Option<SnapshotConfig>,
    /// `--timeline`: where the blocks are written, in time.
    pub timeline: Option<PathBuf>,
    /// `--chains`: the most hops a wait is followed (None: no chains).
    pub chain_depth: Option<u32>,
    /// `--graph`: the wait-for graph too.
    pub graph: bool,
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

/// The format a file name says: `.svg`, `.pb.gz`, `.speedscope.json`,
/// `.otlp`, `.folded`, `.txt` (in any case).
pub fn format_by_name(path: &std::path::Path) -> Option<FormatArg> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    [
        (".svg", FormatArg::Svg),
        (".pb.gz", FormatArg::Pprof),
        (".speedscope.json", FormatArg::Speedscope),
        (".otlp", FormatArg::Otlp),
        (".folded", FormatArg::Folded),
        (".txt", FormatArg::Report),
        (".dot", FormatArg::Dot),
    ]
    .into_iter()
    .find(|(ending, _)| name.len() > ending.len() && name.ends_with(ending))
    .map(|(_, f)| f)
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
