//! Node.js (`tests/workloads/node_blockers.js`): each blocked thread's
//! JavaScript frames equal V8's own view of them (the call sites the
//! thread printed just before it blocked), in order, among V8's native
//! frames (its entry and exit builtins, the C++ of the blocking call): the
//! main thread in a synchronous read, workers in `Atomics.wait` and
//! `execSync`, and one under a hot, optimized function. Traced with `-p`,
//! system-wide and in `--snapshot`, on Node.js 20 (the distribution's), 22
//! and 24 (npm's builds). One node process a release serves every check
//! of it.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

/// The node of release `major`: the distribution's 20, or one that
/// `scripts/setup --test` installed. None where it is missing (a failure
/// under CI).
fn node(major: u32) -> Option<PathBuf> {
    let node = if major == 20 {
        PathBuf::from("/usr/bin/node")
    } else {
        PathBuf::from(format!("/opt/offcputime-test/node/{major}/bin/node"))
    };
    let runs = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with(&format!("v{major}.")));
    if runs {
        return Some(node);
    }
    assert!(
        !is_ci(),
        "Node.js {major} ({}) is not installed (scripts/setup --test), and CI=true forbids \
         skipping",
        node.display()
    );
    eprintln!("skipped: Node.js {major} is not installed");
    None
}

/// The workload's node process, killed with its process group (the exec
/// worker's `sleep`) when dropped.
struct Workload(KillOnDrop);

impl Workload {
    fn pid(&self) -> u32 {
        self.0 .0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // SAFETY: a signal to the group the workload leads.
        unsafe { libc::kill(-(self.pid() as i32), libc::SIGKILL) };
    }
}

/// A thread's JavaScript frames as V8 reports them, innermost first: its
/// label, then each frame's function name as `CallSite.getFunctionName()`
/// gives it (`<anonymous>` for none).
type Reported = Vec<(String, Vec<String>)>;

/// The same frames' places: `file:line:column` each, as V8 reports them.
type Places = Vec<Vec<String>>;

/// Starts the workload under `node` (its FIFO in `dir`) and waits until
/// its threads are blocked; returns the process and what its threads
/// reported.
fn start(node: &Path, dir: &Path) -> (Workload, Reported) {
    let (w, reported, _) = start_placed(node, dir);
    (w, reported)
}

/// [`start`], with where each reported frame was.
fn start_placed(node: &Path, dir: &Path) -> (Workload, Reported, Places) {
    let fifo = dir.join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/node_blockers.js");
    let mut child = Workload(KillOnDrop(
        Command::new(node)
            // The hot function optimized for certain (the workload's
            // `%OptimizeFunctionOnNextCall`).
            .arg("--allow-natives-syntax")
            .arg(&script)
            .arg(&fifo)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // A group of its own: the exec worker's child goes with it.
            .process_group(0)
            .spawn()
            .expect("start node"),
    ));
    let out = BufReader::new(child.0 .0.stdout.take().unwrap());
    let mut reported: Reported = Vec::new();
    let mut places: Places = Vec::new();
    let mut workers = 0;
    for line in out.lines() {
        let line = line.expect("read the workload");
        if let Some(n) = line.strip_prefix("WORKERS ") {
            workers = n.parse().expect("WORKERS n");
        } else if let Some(said) = line.strip_prefix("OPTIMIZED ") {
            assert!(
                said.ends_with(" true"),
                "{}: V8 did not optimize the hot function: {said}",
                node.display()
            );
        } else if let Some(said) = line.strip_prefix("BASELINE execMain ") {
            assert!(
                said.starts_with("true"),
                "{}: V8 did not compile execMain to baseline code: {said}",
                node.display()
            );
        } else if let Some(label) = line.strip_prefix("THREAD ") {
            reported.push((label.to_string(), Vec::new()));
            places.push(Vec::new());
        } else if let Some(frame) = line.strip_prefix("FRAME ") {
            let (name, at) = frame.rsplit_once(' ').expect("a FRAME line");
            reported
                .last_mut()
                .expect("a THREAD line first")
                .1
                .push(name.to_string());
            places.last_mut().unwrap().push(at.to_string());
        } else if line == "READY" {
            assert_eq!(reported.len(), workers + 1, "{reported:?}");
            // Its read is the main thread's next call: let it block.
            std::thread::sleep(std::time::Duration::from_millis(300));
            return (child, reported, places);
        }
    }
    panic!("{}: the workload ended before READY", node.display());
}

/// Whether folded frame `f` is one of V8's or the native code's rather
/// than a JavaScript function's: a builtin, C++ (qualified), a C
/// function of the libraries.
fn native(f: &str) -> bool {
    f.starts_with("Builtins_") || f.contains("::") || f.starts_with("uv_") || f.starts_with('[')
}

/// Checks that each thread the workload reported has a stack in folded
/// output `out` whose JavaScript frames are V8's, outermost first, with
/// only native frames between two of them, and deeper V8's exit into the
/// blocking call's C++ (the hot thread's innermost function among them,
/// inlined in its caller's optimized code). `what` says which run, for
/// failures.
fn frames_are_v8s(out: &[u8], reported: &Reported, what: &str) {
    let lines = parse_folded(out);
    let mut missing = String::new();
    for (label, frames) in reported {
        let want: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
        let found = lines.iter().any(|l| {
            let f: Vec<&str> = l.frames.iter().map(String::as_str).collect();
            (0..f.len()).any(|start| {
                let mut at = start;
                for (k, w) in want.iter().enumerate() {
                    if k == 0 {
                        if f[at] != *w {
                            return false;
                        }
                    } else {
                        at += 1;
                        while at < f.len() && f[at] != *w && native(f[at]) {
                            at += 1;
                        }
                        if at >= f.len() || f[at] != *w {
                            return false;
                        }
                    }
                }
                // Deeper, the blocking call: node's own JavaScript
                // (`readSync`, `execSync`), then V8's exit to its C++
                // (`Builtins_CEntry…`, `Builtins_CallApiCallback…`).
                f[at + 1..].iter().any(|f| f.starts_with("Builtins_C"))
            })
        });
        if !found {
            let ours: Vec<String> = lines
                .iter()
                .filter(|l| l.frames.iter().any(|f| f.starts_with("Builtins_JSEntry")))
                .map(|l| l.frames.join(";"))
                .collect();
            missing.push_str(&format!(
                "{label}: V8 says (outermost first)\n  {}\nthe profiler:\n  {}\n",
                want.join(";"),
                ours.join("\n  ")
            ));
        }
    }
    assert!(missing.is_empty(), "{what}:\n{missing}");
}

/// Checks folded output `out` of `--lines`: each thread's JavaScript
/// frames at V8's places, outermost first: a frame at its call, as V8
/// reports it, and the innermost a line below where it reported from (the
/// workload blocks on the line after its report).
fn lines_are_v8s(out: &[u8], reported: &Reported, places: &Places, what: &str) {
    let lines = parse_folded(out);
    let mut missing = String::new();
    for ((label, frames), at) in reported.iter().zip(places) {
        let mut want: Vec<String> = frames
            .iter()
            .zip(at)
            .map(|(name, at)| format!("{name} ({at})"))
            .collect();
        let (file_line, _column) = at[0].rsplit_once(':').unwrap();
        let (file, line) = file_line.rsplit_once(':').unwrap();
        want[0] = format!(
            "{} ({file}:{}:",
            frames[0],
            line.parse::<u32>().unwrap() + 1
        );
        want.reverse();
        let last = want.len() - 1;
        let found = lines.iter().any(|l| {
            let mut k = 0;
            for f in &l.frames {
                let hit = if k == last {
                    f.starts_with(&want[k])
                } else {
                    *f == want[k]
                };
                if hit {
                    k += 1;
                    if k == want.len() {
                        return true;
                    }
                } else if k > 0 && !native(f) {
                    k = 0;
                }
            }
            false
        });
        if !found {
            missing.push_str(&format!(
                "{label}: V8 says (outermost first)\n  {}\nthe profiler:\n  {}\n",
                want.join(";"),
                lines
                    .iter()
                    .filter(|l| l.frames.iter().any(|f| f.starts_with("processTimers")))
                    .map(|l| l.frames.join(";"))
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ));
        }
    }
    assert!(missing.is_empty(), "{what}:\n{missing}");
}

fn folded(args: &[&str]) -> (Vec<u8>, String) {
    let (out, _) = profile_window(args, &[]);
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One run of `-p PID` in several formats, and the other paths that walk
/// user stacks: pprof has the workload's functions with their script, the
/// flame graph shows JavaScript functions in their own colour (teal),
/// `--grep` on a JavaScript function keeps the stacks through it, and with
/// `--wakers`, `-i` and `--on-cpu` every thread's JavaScript frames are
/// V8's.
fn every_output_has_v8s_view(pid: &str, reported: &Reported) {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = profile(&["-p", pid, "-o", &path("a.pb.gz"), "-o", &path("a.svg"), "2"]);
    let read = |name: &str| std::fs::read(path(name)).unwrap();
    let mut gz = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&read("a.pb.gz")[..]),
        &mut gz,
    )
    .unwrap();
    let pprof: offcputime::output::profile_proto::Profile =
        prost::Message::decode(&gz[..]).unwrap();
    let s = |i: i64| pprof.string_table[i as usize].as_str();
    for name in ["readInner", "readOuter", "waitHere", "runChild"] {
        let f = pprof.function.iter().find(|f| s(f.name) == name);
        assert!(
            f.is_some_and(|f| s(f.filename).ends_with("tests/workloads/node_blockers.js")),
            "pprof: no function {name} of node_blockers.js\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // JavaScript functions teal: green and blue over red.
    let svg = parse_svg(&String::from_utf8(read("a.svg")).unwrap());
    let functions: Vec<&SvgFrame> = svg
        .frames
        .iter()
        .filter(|f| f.name == "readInner" || f.name == "waitHere")
        .collect();
    assert!(!functions.is_empty());
    for f in functions {
        let (r, g, b) = f.fill;
        assert!(
            g > r + 40 && b > r + 40,
            "{} is not teal: {:?}",
            f.name,
            f.fill
        );
    }
    let out = profile(&["-p", pid, "-f", "--grep", "waitHere", "1"]);
    let lines = parse_folded(&out.stdout);
    assert!(
        !lines.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines.iter().all(|l| l.has("waitHere")));
    for how in [&["--wakers"][..], &["--on-cpu"], &["-i", "1"]] {
        let mut args = vec!["-p", pid, "-f"];
        args.extend_from_slice(how);
        args.push("2");
        let (out, stderr) = folded(&args);
        frames_are_v8s(&out, reported, &format!("{how:?}\n{stderr}"));
    }
}

/// One node release's checks: `-p` with its walk counted (`-v`), the
/// whole system, `--snapshot`, and `--no-node`'s native view.
fn javascript_frames_are_v8s(major: u32) {
    let Some(node) = node(major) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (proc_, reported, places) = start_placed(&node, dir.path());
    let pid = proc_.pid().to_string();
    let what = |how: &str| format!("Node.js {major} {how}");

    let (out, stderr) = folded(&["-p", &pid, "-f", "2"]);
    frames_are_v8s(&out, &reported, &what("-p"));
    assert!(stderr.contains("node: 1 process walked (V8 "), "{stderr}");
    assert!(!stderr.contains("could not be named"), "{stderr}");
    assert!(
        !stderr.contains("could not have their code read"),
        "{stderr}"
    );
    // The hot thread's optimized frame, its callee inlined: said so; and
    // the maglev thread's where there is one (Node 24).
    let maglev = reported.iter().any(|(label, _)| label == "maglev");
    assert_eq!(maglev, major >= 24, "Node.js {major}: {reported:?}");
    let inlined = stderr
        .split_once(" functions inlined in them shown")
        .or_else(|| stderr.split_once(" function inlined in them shown"))
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<u64>().ok());
    let optimized = if maglev { 2 } else { 1 };
    assert!(inlined.is_some_and(|n| n >= optimized), "{stderr}");
    // The exec thread's baseline frame (execMain), whose line --lines
    // checks below.
    let baseline = stderr
        .split_once(" baseline), ")
        .and_then(|(before, _)| before.rsplit('(').next()?.parse::<u64>().ok());
    assert!(baseline.is_some_and(|n| n >= 1), "{stderr}");
    assert!(stderr.contains(" 0 frames without a line"), "{stderr}");

    let (out, stderr) = folded(&["-p", &pid, "-f", "--lines", "1"]);
    lines_are_v8s(
        &out,
        &reported,
        &places,
        &what(&format!("--lines\n{stderr}")),
    );

    let (out, _) = folded(&["-f", "1"]);
    frames_are_v8s(&out, &reported, &what("system-wide"));

    if major == 20 {
        every_output_has_v8s_view(&pid, &reported);
    }

    let out = profile(&["--snapshot", "-p", &pid, "-f"]);
    frames_are_v8s(&out.stdout, &reported, &what("--snapshot"));

    // The native view: V8's entry into JavaScript, its exit to the
    // blocking call's C++, and no JavaScript function in between.
    let (out, _) = folded(&["-p", &pid, "-f", "--no-node", "1"]);
    let lines = parse_folded(&out);
    let functions: Vec<&str> = reported
        .iter()
        .flat_map(|(_, f)| f.iter().map(String::as_str))
        .filter(|f| *f != "<anonymous>")
        .collect();
    let native_view = lines.iter().any(|l| {
        l.frames.iter().any(|f| f == "Builtins_JSEntry")
            && l.frames.iter().any(|f| f.starts_with("node::fs::Read"))
    }) && !lines
        .iter()
        .any(|l| l.frames.iter().any(|f| functions.contains(&f.as_str())));
    assert!(
        native_view,
        "Node.js {major} --no-node: no native stack of the main thread's read, or \
         JavaScript functions named:\n{}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn javascript_frames_are_v8s_own_view_node20() {
    if !require_root() {
        return;
    }
    // Its process is not to be seen by the other tests that trace the
    // whole system.
    let _serial = serial();
    javascript_frames_are_v8s(20);
}

#[test]
fn javascript_frames_are_v8s_own_view_node22_and_24() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    javascript_frames_are_v8s(22);
    javascript_frames_are_v8s(24);
}

/// A node process (Node.js 22) started while the whole system is traced,
/// and killed before the end: its blocked threads' JavaScript frames are
/// V8's, named while it ran. Its first blocks, before its unwind tables
/// are written (no walks through the tables of the files it maps:
/// `OFFCPUTIME_NO_FILE_TABLES`), are copied and walked in userspace: their
/// JavaScript frames too.
#[test]
fn a_node_started_during_the_trace_is_walked() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let Some(node) = node(22) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut reported = None;
    // The hooks loaded with Python's walker only, as where a CPython
    // process runs at the start: the build with every runtime's walker
    // loads once the node process is noted. Walks the first build kept
    // (through V8's frames by their frame pointers, without its walker)
    // prove nothing to the second.
    let (out, _, _) = profile_during_with(
        &["-f", "6"],
        &[
            ("OFFCPUTIME_NO_FILE_TABLES", "1"),
            ("OFFCPUTIME_TEST_RUNTIMES_AT_START", "python"),
        ],
        |_| {
            let (proc_, r) = start(&node, dir.path());
            reported = Some(r);
            // Its copies walked (and their frames read) while it lives.
            std::thread::sleep(std::time::Duration::from_secs(2));
            drop(proc_);
        },
    );
    let reported = reported.expect("node started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "runtimes' walkers: Python's walker loaded with the hooks (a process of theirs ran at \
             the start); every runtime's loaded when the first process of a runtime was noted"
        ),
        "{stderr}"
    );
    // Its own, and any other node of this release still exiting from an
    // earlier test on a loaded machine: at least one.
    let walked = count_before_any(
        &stderr,
        &[" process walked (V8 12.", " processes walked (V8 12."],
    );
    assert!(walked >= 1, "{stderr}");
    frames_are_v8s(&out.stdout, &reported, "started during the trace");
    // `N with a runtime's frames: M frames` of the copies walked.
    let copied = stderr
        .split_once(" with a runtime's frames: ")
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(
        copied.is_some_and(|n| n > 0),
        "no copied stack with JavaScript frames:\n{stderr}"
    );
}

/// A node process started while the walkers load (set off by a CPython
/// process, the load stalled 2.5 s): the news read meanwhile, taken in as
/// it comes for other processes, stops at node's, whose tables would let
/// the hooks without V8's walker walk its JavaScript through V8's
/// trampolines by their frame pointers, naming none of its functions.
/// Its blocks are copied and walked with V8's frames once the load ends:
/// next to none of its time is under V8's entry with no function named.
#[test]
fn a_node_started_during_the_walkers_load_is_walked_with_its_frames() {
    if !require_root() {
        return;
    }
    let Some(python) = crate::python::interpreter("3.12") else {
        return;
    };
    let Some(node) = node(22) else {
        return;
    };
    if kernel_version() < (5, 18) {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut reported = None;
    let mut sleeper = None;
    let (out, _, _) = profile_during_with(
        &["-f", "6"],
        &[
            ("OFFCPUTIME_TEST_RUNTIMES_AT_START", "0"),
            ("OFFCPUTIME_TEST_STALL_LATER_LOAD_MS", "2500"),
        ],
        |_| {
            sleeper = Some(KillOnDrop(
                Command::new(&python)
                    .args(["-c", "import time; time.sleep(5)"])
                    .spawn()
                    .expect("start python"),
            ));
            // Noted within 100 ms: the load has begun.
            std::thread::sleep(std::time::Duration::from_millis(400));
            let (proc_, r) = start(&node, dir.path());
            reported = Some(r);
            std::thread::sleep(std::time::Duration::from_secs(2));
            drop(proc_);
        },
    );
    drop(sleeper);
    let reported = reported.expect("node started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    // V8's walker names each JavaScript frame (or says it could not):
    // its interpreter's entry, or a frame of V8's code space unnamed, is
    // a walk by frame pointers without it.
    let by_frame_pointers =
        |l: &Folded| l.has("Builtins_InterpreterEntryTrampoline") || l.has("[js frame unreadable]");
    let in_v8 = |l: &Folded| l.frames.iter().any(|f| f.starts_with("Builtins_JSEntry"));
    let unnamed = sum_us_where(&lines, |l| in_v8(l) && by_frame_pointers(l));
    let named = sum_us_where(&lines, |l| in_v8(l) && !by_frame_pointers(l));
    eprintln!("node under its functions {named} us, under V8's entry with none {unnamed} us");
    assert!(named >= 2_000_000, "{named} us named\n{stderr}");
    // Left: the copies of node's first blocks, walked once the load has
    // ended, where V8 had moved or freed some of their functions by then
    // (said: "could not be named"), about 1% of its time. Walked by the
    // hooks without the walker: near half.
    assert!(
        unnamed * 20 < named,
        "{unnamed} us under V8's entry with no function named, {named} us named:\n{stderr}"
    );
    frames_are_v8s(&out.stdout, &reported, "started during the walkers' load");
}

/// The kernel matrix's node cell (`scripts/vmtest`: Debian's node 20 and
/// the workload at their paths here): one node process traced with `-p`,
/// each thread's JavaScript frames V8's, the process walked. Where the walk
/// needs what the kernel lacks (before 5.17, or with
/// OFFCPUTIME_TEST_LEGACY), the profiler says that it does not read
/// JavaScript frames, and each thread keeps its native stack, no
/// JavaScript function in it.
#[test]
fn debian_node_20_in_the_matrix() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let Some(node) = node(20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (proc_, reported) = start(&node, dir.path());
    let pid = proc_.pid().to_string();
    let (out, stderr) = folded(&["-p", &pid, "-f", "2"]);
    if frame_pointers_only(&stderr) {
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("JavaScript frames are not read"))
            .collect();
        assert!(
            said.len() == 1 && said[0].contains(" 1 Node.js "),
            "not said once that the process's JavaScript frames are not read:\n{stderr}"
        );
        // Stacks of the process, through frame pointers (node's C++ keeps
        // none: how far they go is not checked).
        let lines = parse_folded(&out);
        assert!(
            lines.iter().any(|l| l.comm() == "node"),
            "no stack of the process:\n{}",
            String::from_utf8_lossy(&out)
        );
        assert!(
            !lines
                .iter()
                .any(|l| l.has("readInner") || l.has("waitHere")),
            "JavaScript frames where none are read:\n{}",
            String::from_utf8_lossy(&out)
        );
        eprintln!("matrix: node 20 -p: {NO_NODE_WALK}");
        return;
    }
    frames_are_v8s(&out, &reported, "-p");
    assert!(
        stderr.contains("node: 1 process walked (V8 11."),
        "{stderr}"
    );
    eprintln!(
        "matrix: node 20 -p: the JavaScript frames of {} threads V8's",
        reported.len()
    );
}

/// What [`debian_node_20_in_the_matrix`] says on a kernel without the
/// walk (before 5.17: no bpf_loop); `scripts/vmtest` takes it only from
/// such a kernel.
const NO_NODE_WALK: &str = "n/a (no JavaScript walk before 5.17)";
