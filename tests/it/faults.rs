//! Faults survived: too little stack storage, the profiler killed, signals
//! mid-run. (Closed pipes and missing privileges are in e2e.rs.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::util::*;

/// The profiler started in the background with `-v`, once it has attached.
struct Running {
    child: Child,
    /// All of stderr, once the process has ended.
    stderr: JoinHandle<String>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = offcputime()
            .arg("-v")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start offcputime");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines() {
                let line = line.unwrap_or_default();
                if line.contains("offcputime: attached ") {
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("offcputime did not attach");
        Running { child, stderr }
    }

    /// IDs of the BPF programs the process holds (from its fds' fdinfo).
    fn prog_ids(&self) -> Vec<u32> {
        let dir = format!("/proc/{}/fdinfo", self.child.id());
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(dir).expect("fdinfo").flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                if let Some(id) = line.strip_prefix("prog_id:") {
                    ids.push(id.trim().parse().unwrap());
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the exit: (status, stdout, stderr).
    fn finish(self) -> (std::process::ExitStatus, Vec<u8>, String) {
        let out = self.child.wait_with_output().expect("wait");
        (out.status, out.stdout, self.stderr.join().unwrap())
    }
}

/// The programs with these IDs that bpftool still lists, and the links
/// that still refer to them; waits up to 5 s for the kernel to free them.
fn still_loaded(ids: &[u32]) -> Vec<String> {
    let bpftool = require_tool("bpftool", &["/usr/sbin/bpftool".into()])
        .expect("bpftool (scripts/setup --test installs it)");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut left = Vec::new();
        for id in ids {
            let out = std::process::Command::new(&bpftool)
                .args(["prog", "show", "id", &id.to_string()])
                .output()
                .expect("bpftool");
            if out.status.success() {
                left.push(format!("prog {}", String::from_utf8_lossy(&out.stdout).trim()));
            }
        }
        let links = std::process::Command::new(&bpftool)
            .args(["-j", "link", "show"])
            .output()
            .expect("bpftool");
        let links = String::from_utf8_lossy(&links.stdout);
        for id in ids {
            if links.contains(&format!("\"prog_id\":{id},")) {
                left.push(format!("a link to prog {id}"));
            }
        }
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn no_program_left_attached_after_exit_ctrl_c_or_kill_9() {
    if !require_root() {
        return;
    }
    let _g = serial();
    for (how, args, sig) in [
        ("normal exit", &["-f", "2"][..], None),
        ("SIGINT", &["-f"][..], Some(libc::SIGINT)),
        ("SIGKILL", &["-f"][..], Some(libc::SIGKILL)),
    ] {
        let run = Running::start(args);
        let ids = run.prog_ids();
        // The switch hook, and the iterator loaded beside it.
        assert!(!ids.is_empty(), "{how}: no BPF program held");
        if let Some(sig) = sig {
            std::thread::sleep(Duration::from_millis(300));
            run.signal(sig);
        }
        let (status, _, stderr) = run.finish();
        match sig {
            Some(libc::SIGKILL) => assert!(!status.success()),
            _ => assert!(status.success(), "{how}: {stderr}"),
        }
        let left = still_loaded(&ids);
        assert!(left.is_empty(), "{how}: still loaded: {left:?}");
    }
}

#[test]
fn stack_storage_too_small() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "30"]);
    let comms = ["wl-nanosleep", "wl-pipe", "wl-futex"];
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let clock = CpuClock::start(wl.pid, &tids);
    // System-wide, so that far more than 8 distinct stacks compete.
    let out = profile(&["-v", "-f", "--stack-storage-size", "8", "3"]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (_, from, to) = verbose_window(&stderr);
    let lines = parse_folded(&out.stdout);

    // Lost stacks are counted and reported, with the hint.
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("WARNING: "))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        warning.contains("stack traces could not be displayed")
            && warning.contains("Consider increasing --stack-storage-size"),
        "{warning}"
    );
    let missed: u64 = warning
        .trim_start_matches("WARNING: ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let placeholders = lines
        .iter()
        .filter(|l| l.has("[Missed User Stack]") || l.has("[Missed Kernel Stack]"))
        .count() as u64;
    assert!(missed > 0 && placeholders > 0, "{warning}");
    assert!(
        placeholders <= missed,
        "{placeholders} lines with a missed stack, {missed} reported"
    );

    // No time is lost with the stacks: each blocking thread's total is
    // still within 2% of the window of the kernel's accounting.
    let window_us = (to - from) as f64 / 1e3;
    for (i, comm) in comms.iter().enumerate() {
        let total = sum_us(&lines, comm) as f64;
        let expected = cpu.off_cpu_us(i, from, to);
        assert!(
            (total - expected).abs() < 0.02 * window_us,
            "{comm}: {total} us off-CPU, by the kernel's accounting {expected:.0} us"
        );
    }
    // The stacks that were kept are whole and the right ones: a line of
    // wl-nanosleep with its user frames has the matching kernel frames.
    for l in lines.iter().filter(|l| l.comm() == "wl-nanosleep") {
        if l.has("wl_nanosleep_thread") && !l.has("[Missed Kernel Stack]") {
            let sleep = l.pos("do_nanosleep");
            assert!(sleep.is_some(), "mismatched stack {:?}", l.frames);
        }
    }
}
