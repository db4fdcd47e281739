//! Helpers shared by the tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The profiler; run as user nobody with the least privilege inside
/// [`as_least_privileged`].
pub fn offcputime() -> Command {
    LEAST_PRIVILEGED.with(|l| match &*l.borrow() {
        None => Command::new(env!("CARGO_BIN_EXE_offcputime")),
        Some((dir, caps)) => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(format!("--inh-caps=-all,{caps}"))
                .arg(format!("--ambient-caps={caps}"))
                .arg(dir.path().join("offcputime"));
            c
        }
    })
}

/// The capabilities README names as enough for everything: loading and
/// attaching (bpf, perfmon), other users' processes' mappings and files
/// (sys_ptrace), kernel symbols' addresses (syslog).
pub const LEAST_CAPS: &str = "+bpf,+perfmon,+sys_ptrace,+syslog";

thread_local! {
    /// Inside [`as_least_privileged`]: copies of the profiler and the
    /// workload where user nobody can read them, and the capabilities.
    static LEAST_PRIVILEGED: std::cell::RefCell<Option<(tempfile::TempDir, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with every profiler this thread starts (through
/// [`offcputime`]) run as user nobody with only `caps` (setpriv, ambient
/// capabilities), and the workload started from a copy that nobody may
/// read (the build directory may be private to root). The workload itself
/// runs as root: another user's process.
pub fn as_least_privileged<T>(caps: &str, f: impl FnOnce() -> T) -> T {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("offcputime-public-")
        .tempdir()
        .expect("temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (from, name) in [
        (
            PathBuf::from(env!("CARGO_BIN_EXE_offcputime")),
            "offcputime",
        ),
        (example_path("blocker"), "blocker"),
    ] {
        let to = dir.path().join(name);
        std::fs::copy(&from, &to).expect("copy a binary");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            LEAST_PRIVILEGED.with(|l| l.borrow_mut().take());
        }
    }
    LEAST_PRIVILEGED.with(|l| *l.borrow_mut() = Some((dir, caps.to_string())));
    let _reset = Reset;
    f()
}

/// The `blocker` example, built by `cargo test` next to the test binary
/// (inside [`as_least_privileged`], its public copy).
pub fn blocker_path() -> PathBuf {
    LEAST_PRIVILEGED.with(|l| match &*l.borrow() {
        Some((dir, _)) => dir.path().join("blocker"),
        None => example_path("blocker"),
    })
}

/// An example, built by `cargo test` next to the test binary.
pub fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/<name>
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = profile_dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} not built (run through cargo test)",
        p.display()
    );
    p
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether BPF end-to-end tests can run.  Outside CI, without root they are
/// skipped; under CI=true, they must run, so this panics.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if is_ci() {
        panic!("end-to-end tests need root to load BPF, and CI=true forbids skipping them");
    }
    eprintln!("skipped: not root (BPF end-to-end tests need root)");
    false
}

/// Running under CI (`CI=true`), where nothing may be skipped.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether this kernel can attach kprobes (`CONFIG_KPROBES`): the
/// `finish_task_switch` hook needs them.
pub fn has_kprobes() -> bool {
    std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

/// The line `scripts/vmtest` reads for a kernel without kprobes.
pub fn report_no_kprobes() {
    eprintln!("matrix: finish-task-switch unsupported (no CONFIG_KPROBES)");
}

/// A test of the `finish_task_switch` kprobe hook: `test` runs with the
/// hook's name where the kernel has kprobes; elsewhere (as root) the
/// profiler, asked for the hook with `args`, must fail with one line that
/// names what is missing, and the test says so for `scripts/vmtest`.
pub fn on_kprobe(args: &[&str], test: impl FnOnce(&str)) {
    if has_kprobes() {
        test("finish-task-switch");
        return;
    }
    if !require_root() {
        return;
    }
    let out = offcputime()
        .args(["--hook", "finish-task-switch"])
        .args(args)
        .args(["-f", "1"])
        .output()
        .expect("run offcputime");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CONFIG_KPROBES"), "{err}");
    report_no_kprobes();
}

/// The running kernel's version, (major, minor).
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// What a kernel-matrix test of the DWARF walk says on a kernel without
/// one (before 5.17): `scripts/vmtest` takes it only from such a kernel.
pub const NO_DWARF_WALK: &str = "n/a (no DWARF walk before 5.17)";

/// Whether the profiler ran its programs for kernels without `bpf_loop`
/// (before 5.17, or forced with OFFCPUTIME_TEST_LEGACY): user stacks walked
/// with frame pointers, which its stderr (of a run with the default
/// `--unwind dwarf`) must say, and only then.
pub fn frame_pointers_only(stderr: &str) -> bool {
    let said = stderr.contains("has no bpf_loop");
    let old = kernel_version() < (5, 17) || std::env::var_os("OFFCPUTIME_TEST_LEGACY").is_some();
    assert_eq!(
        said,
        old,
        "kernel {:?}: whether the profiler says DWARF unwinding needs bpf_loop: {stderr}",
        kernel_version()
    );
    said
}

/// Whether this runs under software emulation (qemu's TCG, as the kernel
/// matrix does where there is no KVM): its CPU model says so.
pub fn emulated() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains("QEMU TCG CPU"))
}

/// BPF tests run one at a time: they share the CPUs and the accuracy
/// checks should not see each other's load.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `blocker` workload, killed on drop.
pub struct Workload {
    pub child: Child,
    pub pid: u32,
    pub tids: Vec<(String, u32)>,
    pub child_pid: Option<u32>,
    /// What it prints after `ready` (the `tail` line of `--tail`).
    stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Workload {
    pub fn start(args: &[&str]) -> Workload {
        let mut child = Command::new(blocker_path())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start blocker");
        let stdout = child.stdout.take().expect("stdout");
        let mut pid = 0;
        let mut tids = Vec::new();
        let mut child_pid = None;
        let mut stdout = BufReader::new(stdout).lines();
        for line in stdout.by_ref() {
            let line = line.expect("read blocker output");
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["pid", p] => pid = p.parse().unwrap(),
                ["tid", name, t] => tids.push((name.to_string(), t.parse().unwrap())),
                ["child", p] => child_pid = Some(p.parse().unwrap()),
                ["ready"] => break,
                _ => {}
            }
        }
        assert!(pid > 0, "blocker did not report its pid");
        // Let every thread reach its steady state.
        std::thread::sleep(Duration::from_millis(200));
        Workload {
            child,
            pid,
            tids,
            child_pid,
            stdout,
        }
    }

    /// The next line the workload prints that starts with `prefix`, without
    /// it (waits for it).
    pub fn line_after(&mut self, prefix: &str) -> String {
        for line in self.stdout.by_ref() {
            if let Some(rest) = line.expect("read blocker output").strip_prefix(prefix) {
                return rest.to_string();
            }
        }
        panic!("the workload exited without printing {prefix:?}");
    }

    pub fn tid(&self, name: &str) -> u32 {
        self.tids
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .expect(name)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a test waits for the profiler to say it attached.
pub const ATTACH_TIMEOUT_S: u64 = 240;

/// Runs the profiler to completion; panics with its stderr on failure.
pub fn profile(args: &[&str]) -> Output {
    let out = offcputime().args(args).output().expect("run offcputime");
    assert!(
        out.status.success(),
        "offcputime {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the profiler with `-v`, `args` and `env` to the end; it must
/// succeed. Returns its output and the window it traced (CLOCK_MONOTONIC
/// ns).
pub fn profile_window(args: &[&str], env: &[(&str, &str)]) -> (Output, (u64, u64)) {
    let out = offcputime()
        .arg("-v")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run offcputime");
    assert!(
        out.status.success(),
        "offcputime {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, from, to) = verbose_window(&String::from_utf8_lossy(&out.stderr));
    (out, (from, to))
}

/// Starts the profiler with `-v` (and `env`), stdout and stderr piped: the
/// child, a thread that collects all of stderr, and a channel that gets
/// the time (CLOCK_MONOTONIC ns) its "attached" line was read.
pub fn spawn_verbose(
    args: &[&str],
    env: &[(&str, &str)],
) -> (
    Child,
    std::thread::JoinHandle<String>,
    std::sync::mpsc::Receiver<u64>,
) {
    let mut child = offcputime()
        .envs(env.iter().copied())
        .arg("-v")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start offcputime");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if line.contains("offcputime: attached ") {
                let _ = tx.send(monotonic_ns());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (child, stderr, rx)
}

/// A run of the profiler (with `-v`) to completion, with `during` called
/// once it has attached, given its pid; panics with its stderr on failure.
/// Returns its output, and when (CLOCK_MONOTONIC ns) it was started and
/// its "attached" line was read: the window must start between the two.
pub fn profile_during(args: &[&str], during: impl FnOnce(u32)) -> (Output, u64, u64) {
    profile_during_with(args, &[], during)
}

/// [`profile_during`], with `env` set for the profiler.
pub fn profile_during_with(
    args: &[&str],
    env: &[(&str, &str)],
    during: impl FnOnce(u32),
) -> (Output, u64, u64) {
    let started = monotonic_ns();
    let (mut child, stderr, rx) = spawn_verbose(args, env);
    let mut stdout = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut all).expect("read stdout");
        all
    });
    // Loading takes seconds here, and over a minute in an emulated VM of
    // the kernel matrix on a loaded machine (67 s seen).
    let attached = rx.recv_timeout(Duration::from_secs(ATTACH_TIMEOUT_S));
    if attached.is_ok() {
        during(child.id());
    }
    let status = child.wait().expect("wait for offcputime");
    let out = Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap().into_bytes(),
    };
    let attached = attached.unwrap_or_else(|_| {
        panic!(
            "offcputime {args:?} did not attach: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success(),
        "offcputime {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, started, attached)
}

/// One line of folded output.
#[derive(Debug, Clone)]
pub struct Folded {
    pub frames: Vec<String>,
    pub us: u64,
}

impl Folded {
    pub fn comm(&self) -> &str {
        &self.frames[0]
    }
    pub fn has(&self, frame: &str) -> bool {
        self.frames.iter().any(|f| f == frame)
    }
    pub fn pos(&self, frame: &str) -> Option<usize> {
        self.frames.iter().position(|f| f == frame)
    }
}

pub fn parse_folded(stdout: &[u8]) -> Vec<Folded> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            let (stack, n) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad folded line {l:?}"));
            Folded {
                frames: stack.split(';').map(str::to_string).collect(),
                us: n.parse().unwrap_or_else(|_| panic!("bad count in {l:?}")),
            }
        })
        .collect()
}

/// One entry of the bcc-style report.
#[derive(Debug, Clone)]
pub struct Entry {
    pub frames: Vec<String>,
    pub comm: String,
    pub tid: u32,
    pub us: u64,
}

pub fn parse_report(stdout: &[u8]) -> Vec<Entry> {
    let text = String::from_utf8_lossy(stdout);
    let mut out = Vec::new();
    let mut frames = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("- ") {
            let rest = rest.trim();
            let open = rest.rfind(" (").expect("comm (tid)");
            let comm = rest[..open].to_string();
            let tid = rest[open + 2..rest.len() - 1].parse().expect("tid");
            let us = lines
                .next()
                .expect("total line")
                .trim()
                .parse()
                .expect("total");
            out.push(Entry {
                frames: std::mem::take(&mut frames),
                comm,
                tid,
                us,
            });
        } else {
            frames.push(t.to_string());
        }
    }
    out
}

/// The count before `what` in the `-v` output.
/// As [`count_before`], of the first of `whats` in `stderr`: a message's
/// words for a count of 1 and for more ("1 user stack was", "2 user stacks
/// were").
pub fn count_before_any(stderr: &str, whats: &[&str]) -> u64 {
    let what = whats
        .iter()
        .find(|w| stderr.contains(**w))
        .unwrap_or_else(|| panic!("none of {whats:?} in:\n{stderr}"));
    count_before(stderr, what)
}

pub fn count_before(stderr: &str, what: &str) -> u64 {
    let at = stderr
        .find(what)
        .unwrap_or_else(|| panic!("no {what:?} in:\n{stderr}"));
    let before = stderr[..at].trim_end();
    let start = before.rfind([' ', '(']).map_or(0, |i| i + 1);
    before[start..]
        .parse()
        .unwrap_or_else(|_| panic!("no count before {what:?} in:\n{stderr}"))
}

/// How many blocks `stderr` says have no kernel stack, their switch-in
/// not reported ("1 block has", "N blocks have").
pub fn unseen_kernel_stacks(stderr: &str) -> u64 {
    for what in [" blocks have no kernel stack", " block has no kernel stack"] {
        if stderr.contains(what) {
            return count_before(stderr, what);
        }
    }
    0
}

/// `-v`'s `stderr` says of no copied user stack that it was still waiting
/// for its process's tables when the trace ended.
pub fn assert_no_copy_left_waiting(stderr: &str) {
    let what = "still waiting for their tables when the trace ended";
    if stderr.contains(what) {
        assert_eq!(count_before(stderr, what), 0, "{stderr}");
    }
}

/// Total of the lines that satisfy `keep`.
pub fn sum_us_where(lines: &[Folded], keep: impl Fn(&Folded) -> bool) -> u64 {
    lines.iter().filter(|l| keep(l)).map(|l| l.us).sum()
}

pub fn sum_us(lines: &[Folded], comm: &str) -> u64 {
    sum_us_where(lines, |l| l.comm() == comm)
}

/// An external program a test needs (a flame-graph tool, a browser).
/// Outside CI a missing tool skips the test; under CI=true it fails.
pub fn require_tool(name: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let home_cargo = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cargo/bin").join(name))
        .into_iter();
    let found = candidates
        .iter()
        .cloned()
        .chain(on_path)
        .chain(home_cargo)
        .find(|p| p.is_file());
    if found.is_none() {
        if is_ci() {
            panic!(
                "{name} is needed and CI=true forbids skipping (scripts/setup --test installs it)"
            );
        }
        eprintln!("skipped: {name} not found (scripts/setup --test installs it)");
    }
    found
}

/// One frame of a flame graph SVG.
#[derive(Debug, Clone)]
pub struct SvgFrame {
    pub name: String,
    /// Its time as the title gives it ("name (1,234 us, 5.67%)").
    pub us: u64,
    /// Position and size; inferno writes x and width in percent.
    pub x: f64,
    pub width: f64,
    pub y: f64,
    pub height: f64,
    /// `rgb(r,g,b)`.
    pub fill: (u8, u8, u8),
    /// The `class` of the frame's group (the viewer hides frames with "hide").
    pub class: String,
    pub label_hidden: bool,
}

#[derive(Debug)]
pub struct Svg {
    pub width: Option<f64>,
    /// Text of the element with this id.
    pub texts: std::collections::HashMap<String, String>,
    /// Classes of the elements with an id.
    pub classes: std::collections::HashMap<String, String>,
    pub frames: Vec<SvgFrame>,
}

impl Svg {
    pub fn frame(&self, name: &str) -> &SvgFrame {
        self.frames
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no frame {name:?} in the flame graph"))
    }
    pub fn total_us(&self) -> u64 {
        self.frame("all").us
    }
    /// (name, time) of every frame, sorted: what two renderings of the same
    /// stacks must agree on.
    pub fn frame_set(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self.frames.iter().map(|f| (f.name.clone(), f.us)).collect();
        v.sort();
        v
    }
}

fn number(s: &str) -> f64 {
    s.trim_end_matches('%')
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// Parses a flame graph as XML: inferno's, or FlameGraph's flamegraph.pl's.
pub fn parse_svg(text: &str) -> Svg {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc =
        roxmltree::Document::parse_with_options(text, options).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    let mut texts = std::collections::HashMap::new();
    let mut classes = std::collections::HashMap::new();
    for n in root.descendants().filter(|n| n.is_element()) {
        if let Some(id) = n.attribute("id") {
            let t: String = n
                .descendants()
                .filter(|d| d.is_text())
                .filter_map(|d| d.text())
                .collect();
            texts.insert(id.to_string(), t);
            classes.insert(id.to_string(), n.attribute("class").unwrap_or("").into());
        }
    }
    let mut frames = Vec::new();
    for g in root.descendants().filter(|n| n.has_tag_name("g")) {
        let child = |tag: &str| g.children().find(|c| c.has_tag_name(tag));
        let (Some(title), Some(rect)) = (child("title"), child("rect")) else {
            continue;
        };
        let title = title.text().unwrap_or("");
        let Some(open) = title.rfind(" (") else {
            continue;
        };
        let name = &title[..open];
        let count: String = title[open + 2..]
            .split(' ')
            .next()
            .unwrap_or("")
            .chars()
            .filter(|c| *c != ',')
            .collect();
        let attr = |a: &str| number(rect.attribute(a).unwrap_or_else(|| panic!("rect {a}")));
        let fill = rect.attribute("fill").unwrap_or("");
        let rgb: Vec<u8> = fill
            .trim_start_matches("rgb(")
            .trim_end_matches(')')
            .split(',')
            .map(|c| c.trim().parse().unwrap_or(0))
            .collect();
        frames.push(SvgFrame {
            name: name.to_string(),
            us: count
                .parse()
                .unwrap_or_else(|_| panic!("count in {title:?}")),
            x: attr("x"),
            width: attr("width"),
            y: attr("y"),
            height: attr("height"),
            fill: (rgb[0], rgb[1], rgb[2]),
            class: g.attribute("class").unwrap_or("").to_string(),
            label_hidden: child("text").and_then(|t| t.attribute("visibility")) == Some("hidden"),
        });
    }
    Svg {
        width: root.attribute("width").map(number),
        texts,
        classes,
        frames,
    }
}

/// The kernel's own account of threads' time, sampled every 10 ms in the
/// background from `/proc/PID/task/TID/schedstat`: how long each ran
/// (`se.sum_exec_runtime`) and how long it waited for a CPU while runnable
/// (`sched_info.run_delay`). A thread's off-CPU time over any stretch of
/// the run is then known independently of the profiler.
pub struct CpuClock {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<Sample>>,
}

/// When (CLOCK_MONOTONIC ns, the clock of the profiler's window), per
/// thread (ran ns, waited ns, times switched in), and the machine's stolen
/// time (all CPUs, clock ticks of /proc/stat).
type Sample = (u64, Vec<(u64, u64, u64)>, u64);

/// The `steal` column of /proc/stat's first line: time the hypervisor ran
/// something else on this VM's CPUs, in clock ticks, all CPUs together.
fn stolen_ticks() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let first = s.lines().next()?.to_string();
            first.split_whitespace().nth(8)?.parse().ok()
        })
        .unwrap_or(0)
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A thread's `/proc/PID/task/TID/schedstat` at `path`: ns on a CPU, ns
/// waiting for one, times switched in.
pub fn schedstat(path: &str) -> Option<(u64, u64, u64)> {
    let s = std::fs::read_to_string(path).ok()?;
    let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((f.next()??, f.next()??, f.next()??))
}

pub struct CpuSamples {
    samples: Vec<Sample>,
}

impl CpuClock {
    pub fn start(pid: u32, tids: &[u32]) -> CpuClock {
        let paths: Vec<String> = tids
            .iter()
            .map(|t| format!("/proc/{pid}/task/{t}/schedstat"))
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        // The first sample is taken before `start` returns: a sampler that
        // got no CPU for a while on a loaded machine (CI's tests beside
        // it) once took it after the profiler's window had opened, and the
        // window's start was outside the stretch sampled.
        let (first, taken) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            // Real-time priority, so that the samples stay 10 ms apart on a
            // loaded machine (an emulated VM): the window's edges are
            // interpolated between them. It sleeps between samples.
            let param = libc::sched_param { sched_priority: 1 };
            // SAFETY: sets this thread's own policy; `param` is valid.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            let mut samples = Vec::new();
            loop {
                let now = monotonic_ns();
                let ran = paths
                    .iter()
                    .map(|p| {
                        schedstat(p)
                            .unwrap_or_else(|| panic!("{p}: unreadable (the thread is gone)"))
                    })
                    .collect();
                samples.push((now, ran, stolen_ticks()));
                if samples.len() == 1 {
                    let _ = first.send(());
                }
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return samples;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        // A sampler that panicked (a thread gone) says so at `finish`.
        let _ = taken.recv();
        CpuClock { stop, handle }
    }

    pub fn finish(self) -> CpuSamples {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        CpuSamples {
            samples: self.handle.join().expect("sampler"),
        }
    }
}

impl CpuSamples {
    /// Thread `i`'s counters (in the order given to `start`) at `t`, in
    /// ns, interpolated between the samples around it.
    fn at(&self, i: usize, t: u64) -> (f64, f64, f64) {
        let s = &self.samples;
        assert!(
            s.first().unwrap().0 <= t && t <= s.last().unwrap().0,
            "instant outside the sampled stretch"
        );
        let k = s.partition_point(|(at, ..)| *at <= t).clamp(1, s.len() - 1);
        let ((t0, a, _), (t1, b, _)) = (&s[k - 1], &s[k]);
        let span = t1 - t0;
        let f = if span > 0 {
            (t.saturating_sub(*t0) as f64 / span as f64).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let lerp = |x: u64, y: u64| x as f64 + (y as f64 - x as f64) * f;
        (
            lerp(a[i].0, b[i].0),
            lerp(a[i].1, b[i].1),
            lerp(a[i].2, b[i].2),
        )
    }

    /// Microseconds thread `i` was off-CPU between `from` and `to` (ns,
    /// CLOCK_MONOTONIC): the stretch minus the time it ran.
    pub fn off_cpu_us(&self, i: usize, from: u64, to: u64) -> f64 {
        let ran_ns = self.at(i, to).0 - self.at(i, from).0;
        (to - from) as f64 / 1e3 - ran_ns / 1e3
    }

    /// How much time the hypervisor may have taken from this VM's CPUs
    /// between `from` and `to` (us): 0 when the machine's steal counter did
    /// not move over the samples around them. Stolen time is time a
    /// switched-in thread did not run: the kernel leaves it out of the run
    /// time (paravirtual time accounting), while to the profiler the thread
    /// was on its CPU, so the window minus the run time overstates the
    /// thread's off-CPU time by up to this much. The counter is in whole
    /// ticks (truncated), so a tick for each CPU is added.
    pub fn stolen_us(&self, from: u64, to: u64) -> f64 {
        let s = &self.samples;
        let k0 = s.partition_point(|(at, ..)| *at <= from).max(1) - 1;
        let k1 = s.partition_point(|(at, ..)| *at < to).min(s.len() - 1);
        let ticks = s[k1].2.saturating_sub(s[k0].2);
        if ticks == 0 {
            return 0.0;
        }
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        (ticks as f64 + cpus) * 1e6 / hz
    }

    /// Microseconds thread `i` waited for a CPU between `from` and `to`:
    /// all its off-CPU time if it never blocks. (Unlike the stretch minus
    /// its run time, this leaves out interrupts taken while it ran, which
    /// kernels with IRQ time accounting subtract from the run time.)
    pub fn waited_us(&self, i: usize, from: u64, to: u64) -> f64 {
        (self.at(i, to).1 - self.at(i, from).1) / 1e3
    }

    /// How far [`CpuSamples::waited_us`] can be off at `t` (us): the kernel
    /// adds a run-queue wait to `run_delay` whole when it ends, so a wait
    /// under way at `t` is counted after it. Bounded by the growth of
    /// `run_delay` over the sampling interval in which the thread next
    /// reached a CPU (from the one holding `t`).
    pub fn wait_under_way_us(&self, i: usize, t: u64) -> f64 {
        let s = &self.samples;
        let k = s.partition_point(|(at, ..)| *at <= t).max(1);
        for w in s[k - 1..].windows(2) {
            let (a, b) = (&w[0].1[i], &w[1].1[i]);
            if b.2 > a.2 {
                return (b.1 - a.1) as f64 / 1e3;
            }
        }
        // No arrival sampled after `t`: the rest of the samples is all
        // the thread could have waited.
        (s.last().unwrap().0 - s[k - 1].0) as f64 / 1e3
    }

    /// How many times thread `i` was switched in between `from` and `to`.
    pub fn switches(&self, i: usize, from: u64, to: u64) -> f64 {
        self.at(i, to).2 - self.at(i, from).2
    }
}

/// Checks that each of `comms` (the threads `cpu` sampled, in that order)
/// was off-CPU, by the profile, within 2% of the window `from`..`to` (ns)
/// of what the kernel's own accounting says, and blocked for nearly all of
/// it. Returns the worst error as a share of the window.
pub fn check_blocked_threads(
    lines: &[Folded],
    cpu: &CpuSamples,
    comms: &[&str],
    (from, to): (u64, u64),
    context: &str,
) -> f64 {
    let window_us = (to - from) as f64 / 1e3;
    let mut worst: f64 = 0.0;
    for (i, comm) in comms.iter().enumerate() {
        let total = sum_us(lines, comm) as f64;
        let expected = cpu.off_cpu_us(i, from, to);
        let stolen = cpu.stolen_us(from, to);
        let err = (total - expected).abs() / window_us;
        eprintln!(
            "{comm}: {total} us off-CPU, by the kernel's accounting {expected:.0} us \
             (stolen from the VM: up to {stolen:.0} us)"
        );
        // Stolen time can only make the profile's off-CPU time the smaller.
        let slack = if total < expected {
            stolen / window_us
        } else {
            0.0
        };
        assert!(
            err < 0.02 + slack,
            "{comm}: {total} us off-CPU, by the kernel's accounting {expected:.0} us, \
             in a {window_us:.0} us window ({:.2}% off){context}",
            err * 100.0
        );
        assert!(total > window_us * 0.9, "{comm} blocked only {total} us");
        worst = worst.max(err);
    }
    worst
}

/// From `-v` output: the hook attached and the window traced, in
/// CLOCK_MONOTONIC ns.
pub fn verbose_window(stderr: &str) -> (String, u64, u64) {
    let after = |key: &str| {
        stderr
            .split(key)
            .nth(1)
            .unwrap_or_else(|| panic!("no '{key}' in {stderr}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let attached = after("attached ");
    let window = after("(CLOCK_MONOTONIC ");
    let ns = |s: &str| (s.trim_end_matches(");").parse::<f64>().expect(s) * 1e9) as u64;
    (attached[0].to_string(), ns(window[0]), ns(window[2]))
}

/// `-T`'s line before each interval: `HH:MM:SS`.
pub fn is_time_line(line: &str) -> bool {
    line.len() == 8
        && line.bytes().enumerate().all(|(i, b)| {
            if i == 2 || i == 5 {
                b == b':'
            } else {
                b.is_ascii_digit()
            }
        })
}

/// A thread of this process, with its own name (its `comm`), that waits in
/// a pipe read all along but when [`PipeWaiter::wake`] writes it a byte:
/// it then runs for an instant, notes when, and waits again. Its blocks
/// begin and end where a test wants them.
pub struct PipeWaiter {
    pub tid: u32,
    write: Option<std::fs::File>,
    woke: std::sync::mpsc::Receiver<u64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PipeWaiter {
    pub fn start(name: &str) -> PipeWaiter {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors are new and owned from here on.
        let (mut read, write) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (woke_tx, woke) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
                let mut byte = [0u8];
                while std::io::Read::read(&mut read, &mut byte).is_ok_and(|n| n == 1) {
                    let _ = woke_tx.send(monotonic_ns());
                }
            })
            .expect("start a waiting thread");
        PipeWaiter {
            tid: tid_rx.recv().unwrap(),
            write: Some(write),
            woke,
            thread: Some(thread),
        }
    }

    /// Wakes the thread; returns when (CLOCK_MONOTONIC ns) it ran, once it
    /// has. It is waiting again within microseconds.
    pub fn wake(&mut self) -> u64 {
        let write = self.write.as_mut().unwrap();
        std::io::Write::write_all(write, b"w").expect("write to the waiting thread");
        self.woke
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiting thread ran")
    }
}

impl Drop for PipeWaiter {
    fn drop(&mut self) {
        // The pipe closed: its read returns 0 and the thread ends.
        drop(self.write.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A profiler from [`spawn_lines`]: the child, a thread that collects its
/// stdout, the lines of its stderr as they come (CLOCK_MONOTONIC ns when
/// each was read, and the line), and the thread that reads them, which
/// returns them all.
pub type Lines = (
    Child,
    std::thread::JoinHandle<Vec<u8>>,
    std::sync::mpsc::Receiver<(u64, String)>,
    std::thread::JoinHandle<String>,
);

/// Starts the profiler with `-v` (and `env`), stdout and stderr piped.
pub fn spawn_lines(args: &[&str], env: &[(&str, &str)]) -> Lines {
    let mut child = offcputime()
        .envs(env.iter().copied())
        .arg("-v")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start offcputime");
    let mut stdout = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut all).expect("read stdout");
        all
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            let _ = tx.send((monotonic_ns(), line.clone()));
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (child, stdout, rx, stderr)
}

/// The first line from [`spawn_lines`] that contains `what`: when it was
/// read (CLOCK_MONOTONIC ns).
pub fn wait_for_line(lines: &std::sync::mpsc::Receiver<(u64, String)>, what: &str) -> u64 {
    loop {
        match lines.recv_timeout(Duration::from_secs(ATTACH_TIMEOUT_S)) {
            Ok((at, line)) if line.contains(what) => return at,
            Ok(_) => {}
            Err(e) => panic!("no line with {what:?} from offcputime: {e}"),
        }
    }
}

/// Builds `tests/workloads/NAME.c` into `dir/NAME` with `compiler` and
/// `flags`; panics with the compiler's output if that fails.
/// A C workload of `tests/workloads` in `dir`: the one built beforehand in
/// `$OFFCPUTIME_TEST_WORKLOADS` where that is set (the kernel matrix's VMs
/// have no compiler: `scripts/vmtest` builds them with the same flags),
/// else built with the system's `cc` and `flags`.
pub fn c_workload(name: &str, flags: &[&str], dir: &Path) -> PathBuf {
    if let Some(built) = std::env::var_os("OFFCPUTIME_TEST_WORKLOADS") {
        let exe = dir.join(name);
        std::fs::copy(Path::new(&built).join(name), &exe)
            .unwrap_or_else(|e| panic!("copy the prebuilt {name}: {e}"));
        return exe;
    }
    let cc = require_tool("cc", &[PathBuf::from("/usr/bin/cc")]).expect("a C compiler");
    build_workload(&cc, name, flags, dir)
}

pub fn build_workload(compiler: &Path, name: &str, flags: &[&str], dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(format!("{name}.c"));
    let exe = dir.join(name);
    let out = Command::new(compiler)
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", compiler.display()));
    assert!(
        out.status.success(),
        "building {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A child process in a process group of its own, the whole group killed
/// and the child reaped when dropped (`perf bench` forks its workers).
pub struct GroupChild(pub std::process::Child);

impl GroupChild {
    /// Workload `exe` run for 60 s, once it has said "ready" (else
    /// `failed`).
    pub fn ready(exe: &std::path::Path, failed: &str) -> GroupChild {
        GroupChild::ready_with(exe, &[], failed)
    }

    /// The same, with `args` after the 60.
    pub fn ready_with(
        exe: &std::path::Path,
        args: &[&std::ffi::OsStr],
        failed: &str,
    ) -> GroupChild {
        let mut c = GroupChild::spawn(
            std::process::Command::new(exe)
                .arg("60")
                .args(args)
                .stdout(std::process::Stdio::piped()),
        );
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(c.0.stdout.take().expect("its output")),
            &mut ready,
        )
        .expect("read the workload's output");
        assert_eq!(ready, "ready\n", "{failed}");
        c
    }

    pub fn spawn(cmd: &mut std::process::Command) -> GroupChild {
        use std::os::unix::process::CommandExt;
        GroupChild(cmd.process_group(0).spawn().expect("start a workload"))
    }
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// A Python that imports `module`: the one in the virtual environment
/// `scripts/setup --test` makes for package `package` (`venv_python`), or
/// the system's. Outside CI, none skips the test; under CI=true it fails.
pub fn python_with(venv_python: &str, module: &str, package: &str) -> Option<PathBuf> {
    let imports = |p: &Path| {
        Command::new(p)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let found = [PathBuf::from(venv_python), PathBuf::from("python3")]
        .into_iter()
        .find(|p| imports(p));
    if found.is_none() {
        if is_ci() {
            panic!(
                "Python with the {package} package is needed and CI=true forbids skipping \
                 (scripts/setup --test installs it in {venv_python})"
            );
        }
        eprintln!("skipped: no Python with {package} (scripts/setup --test installs it)");
    }
    found
}

/// The hooks this kernel has: the tracepoints', and the kprobe where it
/// has kprobes (where it has not, the e2e tests check that the hook says
/// so; a matrix line names the hooks its test ran).
pub fn hooks_here() -> Vec<&'static str> {
    let mut hooks = vec!["tp-btf", "raw-tp"];
    if has_kprobes() {
        hooks.push("finish-task-switch");
    }
    hooks
}

/// The intervals of `-T` output: each time line and the folded lines after
/// it.
pub fn split_intervals(stdout: &[u8]) -> Vec<(String, Vec<Folded>)> {
    let text = String::from_utf8_lossy(stdout);
    let mut out: Vec<(String, Vec<Folded>)> = Vec::new();
    for line in text.lines() {
        if is_time_line(line) {
            out.push((line.to_string(), Vec::new()));
        } else {
            let last = out
                .last_mut()
                .unwrap_or_else(|| panic!("a line before the first time line: {line:?}"));
            last.1.extend(parse_folded(line.as_bytes()));
        }
    }
    out
}
