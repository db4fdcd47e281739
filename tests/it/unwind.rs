//! Acceptance test of user-stack unwinding: the profiler's user stacks
//! against gdb's, function by function.
//!
//! The `blockers` workload (`tests/workloads/blockers.{c,rs}`) is built
//! three ways: C with frame pointers, C without, and Rust as a release build
//! (no frame pointers). Each thread blocks, again and again, in one libc
//! call under three layers of the workload's own functions. For each
//! build, the profiler (with each unwinder of [`UNWINDERS`]) and
//! libbpf-tools' `offcputime` trace the running workload; then gdb
//! attaches and backtraces every thread.
//!
//! What is compared, per thread: the addresses of gdb's real frames (not
//! its inline frames, which the symbolizer expands from the same
//! addresses, nor its tail-call frames, which gdb reconstructs from DWARF
//! call-site information: a tail call leaves nothing on the stack),
//! named by the library's own symbolizer exactly as the profiler names its
//! frames, against the profiler's dominant stack for that thread. Names come
//! from addresses, so glibc's aliases (`__GI___clock_nanosleep` for gdb,
//! `__clock_nanosleep` for the symbol table) play no part. Independently of
//! that symbolizer, the frames gdb puts in the workload binary itself must
//! appear in the profiler's stack by gdb's name for them, in the same
//! order.
//!
//! Each test prints one `unwind-match:` line per unwinder, with both stacks
//! side by side for every thread that does not match, and asserts that
//! [`ASSERTED`] matches every thread.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use offcputime::process::Registry;
use offcputime::symbolize::{AddrKind, SymbolizeOptions, Symbolizer, SIGNAL_FRAME_NAME};
use offcputime::unwind_table::SIGNAL_FRAME;

use crate::util::*;

/// The profiler's unwinders to measure: a label for the report and the
/// arguments that select it.
const UNWINDERS: &[(&str, &[&str])] = &[
    ("fp", &["--unwind", "fp"]),
    ("dwarf", &["--unwind", "dwarf"]),
];

/// The unwinder that must match gdb on every thread of every build.
const ASSERTED: &str = "dwarf";

/// The executable's name, and so the main thread's.
const EXE: &str = "blockers";

/// The threads compared: those that block under three layers of the
/// workload's own functions. (The helper threads that feed them are left
/// out: they also make short non-blocking syscalls that a snapshot could
/// catch.)
const THREADS: &[&str] = &[
    "sleeper",
    "pipe_reader",
    "cond_waiter",
    "mutex_waiter",
    "epoller",
    EXE,
];

/// How long each profiler traces, in seconds.
const TRACE_S: &str = "2";

/// gdb snapshots taken at most, for threads caught outside a syscall.
const SNAPSHOTS: usize = 5;

/// Where Debian's libbpf-tools installs the reference tool.
const LIBBPF_TOOLS: &str = "/usr/sbin/offcputime";

#[test]
fn gdb_agrees_c_fp() {
    check_build(Build::CFp);
}

#[test]
fn gdb_agrees_c_nofp() {
    check_build(Build::CNoFp);
}

#[test]
fn gdb_agrees_rust_release() {
    check_build(Build::RustRelease);
}

/// One build of the workload.
#[derive(Clone, Copy, Debug)]
enum Build {
    /// clang -O2 with frame pointers, leaf functions included.
    CFp,
    /// clang -O2 without frame pointers.
    CNoFp,
    /// rustc -O like a cargo release build: no frame pointers, line tables.
    RustRelease,
}

impl Build {
    fn name(self) -> &'static str {
        match self {
            Build::CFp => "c-fp",
            Build::CNoFp => "c-nofp",
            Build::RustRelease => "rust-release",
        }
    }

    /// The compiler, or None (the test is skipped) where it is missing
    /// outside CI.
    fn compiler(self) -> Option<PathBuf> {
        match self {
            Build::CFp | Build::CNoFp => require_tool("clang", &[]),
            Build::RustRelease => {
                // The rustc of the toolchain that builds these tests.
                let beside_cargo = Path::new(env!("CARGO")).with_file_name("rustc");
                require_tool("rustc", &[beside_cargo])
            }
        }
    }

    /// Compiles the workload into `dir/<build>/blockers`.
    fn compile(self, compiler: &Path, dir: &Path) -> PathBuf {
        let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads");
        let out_dir = dir.join(self.name());
        std::fs::create_dir_all(&out_dir).expect("build directory");
        let exe = out_dir.join(EXE);
        let mut cmd = Command::new(compiler);
        match self {
            Build::CFp | Build::CNoFp => {
                let fp: &[&str] = match self {
                    Build::CFp => &["-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"],
                    _ => &["-fomit-frame-pointer"],
                };
                cmd.args(["-O2", "-g", "-pthread"])
                    .args(fp)
                    .arg(workloads.join("blockers.c"))
            }
            Build::RustRelease => cmd
                .args(["--edition", "2021", "-C", "opt-level=3"])
                .args(["-C", "debuginfo=line-tables-only"])
                .arg(workloads.join("blockers.rs")),
        };
        let out = cmd.arg("-o").arg(&exe).output().expect("run the compiler");
        assert!(
            out.status.success(),
            "building {}: {cmd:?} failed: {}",
            self.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }
}

/// Builds and runs the workload, has each unwinder and libbpf-tools trace
/// it, then gdb; prints the match rates and asserts that [`ASSERTED`]
/// matches every thread.
fn check_build(build: Build) {
    if !require_root() {
        return;
    }
    let (Some(gdb), Some(compiler)) = (require_tool("gdb", &[]), build.compiler()) else {
        return;
    };
    let libbpf_tools = libbpf_tools();
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build.compile(&compiler, dir.path());
    let wl = Running::start(&exe);

    // The profilers first, gdb after: its stops must not be traced.
    let mut sym = Naming::new(SymbolizeOptions {
        inline: true,
        ..SymbolizeOptions::default()
    });
    sym.reg.note_process(wl.pid, None, false);
    let mut measured: Vec<(&str, BTreeMap<String, Vec<String>>)> = UNWINDERS
        .iter()
        .map(|(label, args)| (*label, profiler_stacks(wl.pid, args)))
        .collect();
    if let Some(tool) = &libbpf_tools {
        measured.push(("libbpf-tools", libbpf_tools_stacks(tool, &mut sym, wl.pid)));
    }
    let gdb_frames = blocked_gdb_stacks(&gdb, dir.path(), wl.pid);
    let own = own_ranges(wl.pid, &exe);
    let expected: BTreeMap<&str, Expected> = THREADS
        .iter()
        .map(|&t| (t, expected_stack(&mut sym, wl.pid, &gdb_frames[t], &own)))
        .collect();
    drop(wl);

    let mut failed = Vec::new();
    for (unwinder, stacks) in &measured {
        let mismatches: Vec<String> = expected
            .iter()
            .filter_map(|(thread, exp)| mismatch(thread, exp, stacks.get(*thread)))
            .collect();
        println!(
            "unwind-match: build={} unwinder={unwinder} matched={}/{} threads",
            build.name(),
            THREADS.len() - mismatches.len(),
            THREADS.len()
        );
        for m in &mismatches {
            println!("{m}");
        }
        if *unwinder == ASSERTED {
            failed = mismatches;
        }
    }
    assert!(
        failed.is_empty(),
        "build {}: the {ASSERTED} unwinder disagrees with gdb on {} of {} threads \
         (stacks side by side above)",
        build.name(),
        failed.len(),
        THREADS.len(),
    );
}

/// A running workload, killed on drop.
pub(crate) struct Running {
    child: Child,
    pub pid: u32,
}

impl Running {
    /// Starts `exe` and waits for its pid (the first line it prints) and
    /// for its threads to settle into blocking.
    pub(crate) fn start(exe: &Path) -> Running {
        Running::start_with(exe, &[])
    }

    /// [`Running::start`] with arguments.
    pub(crate) fn start_with(exe: &Path, args: &[&str]) -> Running {
        let mut child = Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the workload's pid");
        let pid = line.trim().parse().expect("the workload prints its pid");
        std::thread::sleep(Duration::from_millis(300));
        Running { child, pid }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// libbpf-tools' `offcputime`. Outside CI, without it only the profiler is
/// measured; under `CI=true` it must be there.
fn libbpf_tools() -> Option<PathBuf> {
    let path = PathBuf::from(LIBBPF_TOOLS);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !is_ci(),
        "{LIBBPF_TOOLS} is needed and CI=true forbids skipping (scripts/setup --test installs libbpf-tools)"
    );
    eprintln!("libbpf-tools not measured: {LIBBPF_TOOLS} not found");
    None
}

/// What the profiler knows of processes and how it names their frames.
pub(crate) struct Naming {
    pub reg: Registry,
    pub sym: Symbolizer,
}

impl Naming {
    pub(crate) fn new(opts: SymbolizeOptions) -> Naming {
        Naming {
            reg: Registry::new(),
            sym: Symbolizer::new(opts),
        }
    }
}

/// Names of user frames, innermost first, as the profiler would print
/// them: each address through the library's symbolizer. The one place
/// that knows how an address becomes names (when inlined functions get
/// names of their own, one address will give several).
pub(crate) fn names_for(n: &mut Naming, pid: u32, frames: &[(u64, AddrKind)]) -> Vec<String> {
    let names = n.sym.user(&mut n.reg, pid, frames);
    frames
        .iter()
        .flat_map(|f| names[f].iter().map(|n| n.text().to_string()))
        .collect()
}

/// Frame 0 is where the thread is; every other frame's address is a
/// return address, except the one after a signal frame
/// ([`SIGNAL_FRAME`]), which is where the signal interrupted the code.
pub(crate) fn with_kinds(addrs: &[u64]) -> Vec<(u64, AddrKind)> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            (
                a,
                if i == 0 || addrs[i - 1] == SIGNAL_FRAME {
                    AddrKind::Ip
                } else {
                    AddrKind::Return
                },
            )
        })
        .collect()
}

/// The profiler's dominant user stack of each thread, innermost first:
/// `offcputime -p PID -U -f` with `args`, per thread name the folded line
/// with the most time.
pub(crate) fn profiler_stacks(pid: u32, args: &[&str]) -> BTreeMap<String, Vec<String>> {
    let pid = pid.to_string();
    let out = profile(&[&["-p", &pid, "-U", "-f"], args, &[TRACE_S]].concat());
    let mut best: BTreeMap<String, Folded> = BTreeMap::new();
    for line in parse_folded(&out.stdout) {
        let e = best.entry(line.comm().to_string()).or_insert(line.clone());
        if line.us > e.us {
            *e = line;
        }
    }
    best.into_iter()
        .map(|(comm, l)| (comm, l.frames[1..].iter().rev().cloned().collect()))
        .collect()
}

/// libbpf-tools' dominant user stack of each thread, innermost first.
/// With `-v` it prints every frame's address; the user addresses are
/// named by our symbolizer, as gdb's are, so that the comparison is of
/// unwinding alone. Its entries are per kernel and user stack: those with
/// the same user stack are added up before the largest is taken; those
/// without a user stack are left out.
fn libbpf_tools_stacks(tool: &Path, sym: &mut Naming, pid: u32) -> BTreeMap<String, Vec<String>> {
    let out = Command::new(tool)
        .args(["-v", "-p", &pid.to_string(), TRACE_S])
        .output()
        .expect("run libbpf-tools offcputime");
    assert!(
        out.status.success(),
        "libbpf-tools offcputime failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut totals: BTreeMap<(String, Vec<u64>), u64> = BTreeMap::new();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut user = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if let Some(frame) = line.strip_prefix('#') {
            // "#6  0x00007f65f7321c76 name+0xa56 (/usr/lib/.../libc.so.6+0x8dc76)"
            let addr = frame.split_whitespace().nth(1).expect("frame address");
            let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).expect(addr);
            if addr < 1 << 47 {
                user.push(addr);
            }
        } else if let Some(rest) = line.strip_prefix("- ") {
            // "-                mutex_waiter (10815)", then the total.
            let comm = rest.trim().rsplit_once(" (").expect("comm (tid)").0;
            let us: u64 = lines
                .next()
                .and_then(|l| l.trim().parse().ok())
                .expect("total");
            *totals
                .entry((comm.to_string(), std::mem::take(&mut user)))
                .or_default() += us;
        }
    }
    let mut best: BTreeMap<String, (u64, Vec<u64>)> = BTreeMap::new();
    // Entries whose user stack was lost ("[Missed User Stack]": a collision
    // in its stack map) say nothing about unwinding.
    for ((comm, addrs), us) in totals.into_iter().filter(|((_, a), _)| !a.is_empty()) {
        let e = best.entry(comm).or_default();
        if us > e.0 {
            *e = (us, addrs);
        }
    }
    best.into_iter()
        .map(|(comm, (_, addrs))| (comm, names_for(sym, pid, &with_kinds(&addrs))))
        .collect()
}

/// One frame of gdb's backtrace.
#[derive(Debug, Clone)]
pub(crate) struct GdbFrame {
    pub(crate) pc: u64,
    /// A call inlined into the frame below it (gdb's virtual frame, at the
    /// same pc).
    pub(crate) inline: bool,
    /// A frame gdb reconstructs from DWARF call-site information: a
    /// function that tail-called the one above it, and so left no return
    /// address on the stack. No stack walker can see it.
    pub(crate) tail_call: bool,
    /// A signal trampoline: gdb's `<signal handler called>`. The frame
    /// after it is the interrupted code, its pc not a return address.
    pub(crate) signal: bool,
    /// gdb's name for the frame: the function's DWARF name where there is
    /// one (unqualified for Rust at `line-tables-only`).
    pub(crate) name: String,
    /// The ELF symbol gdb finds for the frame's code (for callers, for the
    /// call instruction), demangled by gdb; empty for an inline frame or
    /// where there is none.
    elf_symbol: String,
}

/// Walks every thread's frames, innermost first, and prints one
/// tab-separated `FRAME` line per frame.
pub(crate) const GDB_SCRIPT: &str = r#"
import gdb

for setting in ("pagination off", "backtrace past-main on",
                "backtrace past-entry on", "debuginfod enabled off"):
    try:
        gdb.execute("set " + setting)
    except gdb.error:
        pass

def elf_symbol(addr):
    # "name + 12 in section .text [of /path]", "name in section ...",
    # or "No symbol matches ...".
    out = gdb.execute("info symbol %#x" % addr, to_string=True).strip()
    if out.startswith("No symbol"):
        return ""
    name = out.split(" in section ")[0]
    return name.rsplit(" + ", 1)[0] if " + " in name else name

for thread in gdb.selected_inferior().threads():
    thread.switch()
    frame = gdb.newest_frame()
    # The pc of the next real frame is a return address (not the first,
    # nor the one a signal interrupted).
    returned = False
    while frame is not None:
        kind = {gdb.INLINE_FRAME: 1, gdb.TAILCALL_FRAME: 2,
                gdb.SIGTRAMP_FRAME: 3}.get(frame.type(), 0)
        symbol = ""
        if kind == 0:
            symbol = elf_symbol(frame.pc() - (1 if returned else 0))
        if kind in (0, 3):
            returned = kind == 0
        print("FRAME\t%s\t%#x\t%d\t%s\t%s" % (thread.name, frame.pc(), kind,
                                             frame.name() or "??", symbol))
        try:
            frame = frame.older()
        except gdb.error:
            frame = None
"#;

/// gdb's backtrace of every thread of `pid`, by thread name, innermost
/// frame first: one attach, every thread walked from `gdb.newest_frame()`
/// through `older()`.
pub(crate) fn gdb_stacks(gdb: &Path, script: &Path, pid: u32) -> BTreeMap<String, Vec<GdbFrame>> {
    let out = Command::new(gdb)
        .args(["-nx", "-batch", "-p", &pid.to_string(), "-x"])
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut stacks: BTreeMap<String, Vec<GdbFrame>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("FRAME\t") else {
            continue;
        };
        let f: Vec<&str> = rest.split('\t').collect();
        let [thread, pc, kind, name, elf_symbol] = f[..] else {
            panic!("bad gdb line {line:?}");
        };
        stacks
            .entry(thread.to_string())
            .or_default()
            .push(GdbFrame {
                pc: u64::from_str_radix(pc.trim_start_matches("0x"), 16).expect(pc),
                inline: kind == "1",
                tail_call: kind == "2",
                signal: kind == "3",
                name: name.to_string(),
                elf_symbol: elf_symbol.to_string(),
            });
    }
    assert!(
        !stacks.is_empty(),
        "gdb printed no frames: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    stacks
}

/// Whether the thread whose innermost frames are `frames` is in a syscall:
/// the innermost real (non-inline) frame's pc is just after a `syscall`
/// instruction (`0f 05`), read from the process's memory. Nothing in this
/// depends on names.
pub(crate) fn in_syscall(pid: u32, frames: &[GdbFrame]) -> bool {
    let Some(pc) = frames
        .iter()
        .find(|f| !f.inline && !f.tail_call)
        .map(|f| f.pc)
    else {
        return false;
    };
    let mut insn = [0u8; 2];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|mem| mem.read_exact_at(&mut insn, pc - 2))
        .is_ok()
        && insn == [0x0f, 0x05]
}

/// gdb's stack of each of [`THREADS`], from the first of up to
/// [`SNAPSHOTS`] attaches that caught the thread blocked in a syscall (a
/// thread can be caught on the CPU between two blocks).
fn blocked_gdb_stacks(gdb: &Path, dir: &Path, pid: u32) -> BTreeMap<String, Vec<GdbFrame>> {
    let script = dir.join("frames.py");
    std::fs::write(&script, GDB_SCRIPT).expect("write the gdb script");
    let mut found: BTreeMap<String, Vec<GdbFrame>> = BTreeMap::new();
    let mut last = BTreeMap::new();
    for _ in 0..SNAPSHOTS {
        last = gdb_stacks(gdb, &script, pid);
        for &t in THREADS {
            if let Some(frames) = last.get(t) {
                if !found.contains_key(t) && in_syscall(pid, frames) {
                    found.insert(t.to_string(), frames.clone());
                }
            }
        }
        if found.len() == THREADS.len() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(37));
    }
    let missing: Vec<_> = THREADS
        .iter()
        .filter(|t| !found.contains_key(**t))
        .collect();
    panic!("gdb never caught {missing:?} in a syscall in {SNAPSHOTS} snapshots; last: {last:#?}");
}

/// The address ranges of the workload's executable in `pid`.
pub(crate) fn own_ranges(pid: u32, exe: &Path) -> Vec<(u64, u64)> {
    let exe = exe.canonicalize().expect("workload path");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5).map(Path::new) == Some(&exe))
        .map(|l| {
            let (s, e) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
            let hex = |x: &str| u64::from_str_radix(x, 16).unwrap();
            (hex(s), hex(e))
        })
        .collect()
}

/// What a thread's stack must be, by gdb.
pub(crate) struct Expected {
    /// gdb's frames named by our symbolizer, innermost first.
    pub(crate) names: Vec<String>,
    /// gdb's own names (ELF symbols, Rust hashes cut) of its frames in the
    /// workload binary, innermost first: the check that does not go through
    /// our symbolizer.
    own: Vec<String>,
    /// gdb's frames, for the report.
    gdb: Vec<GdbFrame>,
}

/// A Rust symbol without its `::h0123456789abcdef` hash.
fn without_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((base, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            base
        }
        _ => name,
    }
}

/// Whether a function in the workload binary is the workload's own: for
/// C all are (`level3_sleep`, `main`, `_start`); for Rust, those of the
/// `blockers` crate and the C symbols (`main`, `_start`). std's functions
/// linked in are left out of the name check (they are still compared by
/// address): which name an address gets there is a matter of alias and
/// demangler, not of unwinding. gdb demangles std's v0 symbols with their
/// crate hash (`std[e28293b1aa0f68bd]::thread::functions::sleep`), and
/// functions with identical code are folded into one that keeps every
/// symbol (gdb names `<PipeReader as Read>::read`
/// `<ChildStderr as Read>::read`).
fn is_workload_function(name: &str) -> bool {
    !name.contains("::") || name.starts_with(&format!("{EXE}::"))
}

/// The expected stack of a thread from gdb's frames. Inline frames share
/// the pc of the real frame they sit in and are left out: the symbolizer
/// names the real frame. (gdb's names for them are DWARF names, which for
/// Rust at `line-tables-only` are unqualified, so they are not in `own`
/// either.) gdb's `<signal handler called>` is the profiler's
/// [`SIGNAL_FRAME_NAME`], in `own` too, at its place among the workload's
/// frames.
pub(crate) fn expected_stack(
    sym: &mut Naming,
    pid: u32,
    frames: &[GdbFrame],
    own_ranges: &[(u64, u64)],
) -> Expected {
    let real: Vec<&GdbFrame> = frames
        .iter()
        .filter(|f| !f.inline && !f.tail_call)
        .collect();
    let pcs: Vec<u64> = real
        .iter()
        .map(|f| if f.signal { SIGNAL_FRAME } else { f.pc })
        .collect();
    let own = real
        .iter()
        .filter_map(|f| {
            if f.signal {
                return Some(SIGNAL_FRAME_NAME);
            }
            // (A return address may be one past its function's end.)
            let mine = own_ranges.iter().any(|&(s, e)| f.pc > s && f.pc <= e);
            let name = without_hash(&f.elf_symbol);
            (mine && is_workload_function(name)).then_some(name)
        })
        .map(str::to_string)
        .collect();
    Expected {
        names: names_for(sym, pid, &with_kinds(&pcs)),
        own,
        gdb: frames.to_vec(),
    }
}

/// Whether `needles` appear in `haystack` in the same order.
fn in_order(needles: &[String], haystack: &[String]) -> bool {
    let mut rest = haystack.iter();
    needles.iter().all(|n| rest.any(|h| h == n))
}

/// None if the profiler's stack of `thread` matches gdb's; else a report
/// with both stacks side by side.
pub(crate) fn mismatch(thread: &str, exp: &Expected, got: Option<&Vec<String>>) -> Option<String> {
    let empty = Vec::new();
    let got = got.unwrap_or(&empty);
    let same = *got == exp.names;
    let own_ok = in_order(&exp.own, got);
    if same && own_ok {
        return None;
    }
    let mut report = format!("  mismatch: thread {thread}");
    if got.is_empty() {
        report.push_str(" (no stack)");
    }
    report.push('\n');
    report.push_str(&side_by_side(&exp.names, got));
    if !own_ok {
        report.push_str(&format!(
            "    gdb's names of the workload's frames, not all in order in the stack{}: {}\n",
            if same {
                " (the symbolizer agrees with itself, not with gdb)"
            } else {
                ""
            },
            exp.own.join(" <- ")
        ));
    }
    let gdb: Vec<String> = exp.gdb.iter().map(gdb_label).collect();
    report.push_str(&format!("    gdb: {}\n", gdb.join(" <- ")));
    Some(report)
}

/// A gdb frame for the report: its name (long generic Rust names cut),
/// marked if inline.
fn gdb_label(f: &GdbFrame) -> String {
    const MAX: usize = 60;
    let mut name: String = f.name.chars().take(MAX).collect();
    if name.len() < f.name.len() {
        name.push_str("...");
    }
    if f.inline {
        name.push_str(" [inline]");
    }
    if f.tail_call {
        name.push_str(" [tail call]");
    }
    if f.signal {
        name = "<signal handler called>".to_string();
    }
    name
}

/// Two stacks in columns, innermost frame first, rows that differ marked.
fn side_by_side(expected: &[String], got: &[String]) -> String {
    let width = expected.iter().map(|s| s.len()).max().unwrap_or(0).max(20);
    let mut out = format!("    {:width$}   profiler\n", "gdb (expected)");
    for i in 0..expected.len().max(got.len()) {
        let (e, g) = (expected.get(i), got.get(i));
        let mark = if e == g { ' ' } else { '!' };
        let e = e.map_or("", String::as_str);
        let g = g.map_or("", String::as_str);
        out.push_str(&format!("  {mark} {e:width$}   {g}\n"));
    }
    out
}

/// A frame found through frame pointers in code that its object's
/// call-frame information does not cover (`tests/workloads/nocfi.c`: a
/// function of assembly without CFI, in a program with it) is a guess the
/// profiler cannot check: it is counted apart in `-v` and said once on
/// stderr. The workload keeps frame pointers there, so the guess is
/// right, and the stack whole.
#[test]
fn frame_pointer_guesses_in_code_without_cfi_are_said() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = c_workload(
        "nocfi",
        &["-O2", "-g", "-fno-omit-frame-pointer"],
        dir.path(),
    );
    let wl = KillOnDrop(Command::new(&exe).spawn().expect("start nocfi"));
    let pid = wl.0.id().to_string();
    std::thread::sleep(Duration::from_millis(300));
    let out = profile(&["-v", "-f", "-p", &pid, "2"]);
    drop(wl);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let slept = sum_us_where(&lines, |l| l.has("nocfi_sleep"));
    let whole = sum_us_where(&lines, |l| {
        crate::newprocs::in_order(l, &["_start", "main", "nocfi_asm", "nocfi_sleep"])
    });
    assert!(slept > 1_000_000, "{slept} us:\n{stderr}");
    assert!(whole * 100 >= slept * 99, "{whole} of {slept} us whole");
    let gaps = count_before(&stderr, "in code its object's tables do not cover");
    let said = count_before_any(
        &stderr,
        &[
            "user frame was found through frame pointers in code that its object's call-frame",
            "user frames were found through frame pointers in code that its object's call-frame",
        ],
    );
    assert!(gaps >= 50, "{gaps} frames in the gap:\n{stderr}");
    assert_eq!(said, gaps, "{stderr}");
}
