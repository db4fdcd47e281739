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

/// A thread's JavaScript frames as V8 reports them, innermost first: its
/// label, then each frame's function name as `CallSite.getFunctionName()`
/// gives it (`<anonymous>` for none).
type Reported = Vec<(String, Vec<String>)>;

/// Starts the workload under `node` (its FIFO in `dir`) and waits until
/// its threads are blocked; returns the process and what its threads
/// reported.
fn start(node: &Path, dir: &Path) -> (KillOnDrop, Reported) {
    let fifo = dir.join("fifo");
    let ok = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(ok.success(), "mkfifo failed");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/node_blockers.js");
    let mut child = KillOnDrop(
        Command::new(node)
            .arg(&script)
            .arg(&fifo)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start node"),
    );
    let out = BufReader::new(child.0.stdout.take().unwrap());
    let mut reported: Reported = Vec::new();
    for line in out.lines() {
        let line = line.expect("read the workload");
        if let Some(label) = line.strip_prefix("THREAD ") {
            reported.push((label.to_string(), Vec::new()));
        } else if let Some(frame) = line.strip_prefix("FRAME ") {
            let (name, _at) = frame.rsplit_once(' ').expect("a FRAME line");
            reported
                .last_mut()
                .expect("a THREAD line first")
                .1
                .push(name.to_string());
        } else if line == "READY" {
            assert_eq!(reported.len(), 4, "{reported:?}");
            // Its read is the main thread's next call: let it block.
            std::thread::sleep(std::time::Duration::from_millis(300));
            return (child, reported);
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
/// blocking call's C++. For the hot
/// thread, whose innermost function may be inlined into its caller's
/// optimized code, the frames from that caller out. `what` says which
/// run, for failures.
fn frames_are_v8s(out: &[u8], reported: &Reported, what: &str) {
    let lines = parse_folded(out);
    let mut missing = String::new();
    for (label, frames) in reported {
        let mut want: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
        if label == "hot" {
            want.pop();
        }
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

fn folded(args: &[&str]) -> (Vec<u8>, String) {
    let (out, _) = profile_window(args, &[]);
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One node release's checks: `-p` with its walk counted (`-v`), the
/// whole system, `--snapshot`, and `--no-node`'s native view.
fn javascript_frames_are_v8s(major: u32) {
    let Some(node) = node(major) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (proc_, reported) = start(&node, dir.path());
    let pid = proc_.0.id().to_string();
    let what = |how: &str| format!("Node.js {major} {how}");

    let (out, stderr) = folded(&["-p", &pid, "-f", "2"]);
    frames_are_v8s(&out, &reported, &what("-p"));
    assert!(stderr.contains("node: 1 processes walked (V8 "), "{stderr}");
    assert!(!stderr.contains("could not be named"), "{stderr}");

    let (out, _) = folded(&["-f", "1"]);
    frames_are_v8s(&out, &reported, &what("system-wide"));

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
