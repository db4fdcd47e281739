//! Helpers shared by the tests.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub fn offcputime() -> Command {
    Command::new(env!("CARGO_BIN_EXE_offcputime"))
}

/// The `blocker` example, built by `cargo test` next to the test binary.
pub fn blocker_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/blocker
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = profile_dir.join("examples").join("blocker");
    assert!(
        p.exists(),
        "{} not built (run through cargo test)",
        p.display()
    );
    p
}

/// Whether BPF end-to-end tests can run.  Outside CI, without root they are
/// skipped; under CI=true, they must run, so this panics.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("end-to-end tests need root to load BPF, and CI=true forbids skipping them");
    }
    eprintln!("skipped: not root (BPF end-to-end tests need root)");
    false
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
        for line in BufReader::new(stdout).lines() {
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
        }
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

/// Total of the lines that satisfy `keep`.
pub fn sum_us_where(lines: &[Folded], keep: impl Fn(&Folded) -> bool) -> u64 {
    lines.iter().filter(|l| keep(l)).map(|l| l.us).sum()
}

pub fn sum_us(lines: &[Folded], comm: &str) -> u64 {
    sum_us_where(lines, |l| l.comm() == comm)
}
