//! `--snapshot`: the report, folded lines and flame graph of a snapshot
//! against golden files; its flags' errors; and, as root, a snapshot of
//! `blocker stuck` against what the kernel (`/proc/PID/task/TID/stack`)
//! and gdb say the threads are waiting in, its `D` filter, and its
//! off-CPU times against a sleeper that says when it went to sleep.

use std::collections::BTreeMap;

use offcputime::output::{folded, svg, Shape};
use offcputime::profile::{Frame, Part, Sample, StackMode};
use offcputime::snapshot::{GroupSort, OffCpu, Snapshot, Task};
use offcputime::symbolize::SymbolizeOptions;

use crate::golden::check;
use crate::util::*;

fn frames(names: &[&str]) -> Part {
    Part::Frames(names.iter().map(|&s| Frame::named(s)).collect())
}

/// Tasks parked in known places: three sleepers of two commands in one
/// stack, a pipe reader, a task in D, one on a CPU, a kernel thread and
/// a task whose off-CPU time the kernel does not keep.
fn synthetic() -> Snapshot {
    let task = |comm: &str, tgid: u32, pid: u32, user: Part, kernel: Part, state, off_cpu| Task {
        sample: Sample {
            comm: comm.to_string(),
            tgid,
            pid,
            thread: None,
            user,
            kernel,
            state: None,
            waker: None,
            container: None,
            total_ns: 0,
            count: 0,
        },
        state,
        off_cpu,
    };
    let sleep_user = || frames(&["clock_nanosleep", "worker_sleep", "start_thread"]);
    let sleep_kernel = || {
        frames(&[
            "hrtimer_nanosleep",
            "common_nsleep",
            "__x64_sys_clock_nanosleep",
        ])
    };
    Snapshot {
        tasks: vec![
            task(
                "app",
                100,
                100,
                sleep_user(),
                sleep_kernel(),
                'S',
                OffCpu::For(2_500_000_000),
            ),
            task(
                "app",
                100,
                101,
                sleep_user(),
                sleep_kernel(),
                'S',
                OffCpu::For(1_250_000_000),
            ),
            task(
                "helper",
                200,
                201,
                sleep_user(),
                sleep_kernel(),
                'S',
                OffCpu::For(7_000_000),
            ),
            task(
                "app",
                100,
                102,
                frames(&["read", "reader_loop", "main"]),
                frames(&["anon_pipe_read", "vfs_read", "ksys_read"]),
                'S',
                OffCpu::For(61_000_000_000),
            ),
            task(
                "spawner",
                300,
                300,
                frames(&["clone", "spawn", "main"]),
                frames(&["kernel_clone", "__do_sys_clone"]),
                'D',
                OffCpu::For(12_345_000),
            ),
            task(
                "spinner",
                400,
                400,
                Part::Absent,
                frames(&["[on CPU]"]),
                'R',
                OffCpu::Running,
            ),
            task(
                "kworker/0:1",
                7,
                7,
                Part::Absent,
                frames(&["worker_thread", "kthread", "ret_from_fork"]),
                'I',
                OffCpu::For(3_000_000),
            ),
            task(
                "rt-thread",
                500,
                500,
                frames(&["poll", "main"]),
                frames(&["do_sys_poll", "__x64_sys_poll"]),
                'S',
                OffCpu::Unknown,
            ),
            task(
                "rt-thread",
                500,
                501,
                frames(&["poll", "main"]),
                frames(&["do_sys_poll", "__x64_sys_poll"]),
                'S',
                OffCpu::For(4_000_000),
            ),
        ],
        ..Default::default()
    }
}

fn report(shape: Shape, sort: GroupSort, verbose: bool) -> String {
    let mut out = Vec::new();
    offcputime::output::snapshot::write(&synthetic(), shape, sort, verbose, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn golden_snapshot_report() {
    check(
        "snapshot.txt",
        &report(Shape::default(), GroupSort::Asc, false),
    );
    check(
        "snapshot-verbose-desc.txt",
        &report(
            Shape {
                mode: StackMode::KernelOnly,
                delimited: false,
                ..Shape::default()
            },
            GroupSort::Desc,
            true,
        ),
    );
}

#[test]
fn golden_snapshot_folded_and_svg() {
    let profile = synthetic().profile();
    let shape = Shape {
        mode: StackMode::Both,
        delimited: true,
        ..Shape::default()
    };
    let mut out = Vec::new();
    folded::write(&profile, shape, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    check("snapshot.folded", &text);
    // Counts of tasks: the three sleepers of one stack and command fold
    // into one line of 2 (app) and one of 1 (helper).
    let lines = parse_folded(text.as_bytes());
    assert_eq!(lines.iter().map(|l| l.us).sum::<u64>(), 9);
    assert!(lines
        .iter()
        .any(|l| l.comm() == "app" && l.has("worker_sleep") && l.us == 2));

    let mut out = Vec::new();
    svg::write(
        &profile,
        shape,
        &svg::SvgOptions {
            title: "Tasks by Stack".into(),
            subtitle: Some("synthetic snapshot".into()),
            width: Some(1200),
            min_width: 0.0,
            count_name: "tasks".into(),
            ..Default::default()
        },
        &mut out,
    )
    .unwrap();
    let svg_text = String::from_utf8(out).unwrap();
    check("snapshot.svg", &svg_text);
    let graph = parse_svg(&svg_text);
    assert_eq!(graph.frame("all").us, 9);
    assert!(svg_text.contains("<title>app (3 tasks, 33.33%)</title>"));
}

/// Every flag that only tracing takes, and the time formats: one line on
/// stderr, a failure, before anything is loaded (no root needed).
#[test]
fn snapshot_refuses_tracing_flags() {
    for (args, says) in [
        (&["--snapshot", "5"][..], "takes no duration"),
        (&["--snapshot", "D", "5"], "takes no duration"),
        (&["--snapshot", "DQ"], "'Q' is not a task state letter"),
        (
            &["--snapshot", "--states"],
            "--states is about blocks while tracing",
        ),
        (
            &["--snapshot", "--wakers"],
            "--wakers is about blocks while tracing",
        ),
        (
            &["--snapshot", "-m", "1000"],
            "-m/--min-block-time is about blocks",
        ),
        (&["--snapshot", "--state", "2"], "--state is about blocks"),
        (&["--snapshot", "-i", "1"], "-i/--interval is about blocks"),
        (&["--snapshot", "-T"], "-T/--timestamp is about blocks"),
        (
            &["--snapshot", "--format", "pprof"],
            "pprof profiles are of time",
        ),
        (
            &["--snapshot", "-o", "x.speedscope.json"],
            "speedscope profiles are of time",
        ),
    ] {
        let out = offcputime().args(args).output().expect("run offcputime");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} wrote to stdout");
    }
}

/// One task of a `-v` report: (pid, comm, state, seconds off the CPU).
#[derive(Debug, Clone, PartialEq)]
struct Listed {
    pid: u32,
    comm: String,
    state: char,
    off_cpu_s: Option<f64>,
}

/// The tasks listed by `--snapshot -v`'s report.
fn listed(stdout: &[u8]) -> Vec<Listed> {
    let text = String::from_utf8_lossy(stdout);
    let mut out = Vec::new();
    let mut in_tasks = false;
    for line in text.lines() {
        if line.trim() == "tasks:" {
            in_tasks = true;
            continue;
        }
        if !line.starts_with("      ") {
            in_tasks = false;
            continue;
        }
        if !in_tasks {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let off_cpu_s = match f[3..] {
            ["off", "CPU", secs, "s"] => Some(secs.parse().expect("seconds")),
            _ => None,
        };
        out.push(Listed {
            pid: f[0].parse().expect("pid"),
            comm: f[1].to_string(),
            state: f[2].chars().next().expect("state"),
            off_cpu_s,
        });
    }
    out
}

/// A thread's kernel stack as the kernel prints it, innermost first,
/// function names only.
fn proc_stack(pid: u32, tid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stack"))
        .expect("read /proc/PID/task/TID/stack")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|f| f.split('+').next().unwrap_or(f).to_string())
        .collect()
}

/// The snapshot's stacks of a stuck workload, frame for frame: kernel
/// frames as `/proc/PID/task/TID/stack` names them (read at the same
/// time: the threads do not move) with the scheduler's frames, which it
/// leaves out, on top, user frames as gdb finds them (named
/// by the library's symbolizer, as in the unwinding test).
#[test]
fn snapshot_stacks_match_proc_and_gdb() {
    if !require_root() {
        return;
    }
    let Some(gdb) = require_tool("gdb", &[]) else {
        return;
    };
    let _g = serial();
    let wl = Workload::start(&["stuck"]);
    let threads = [
        "wl-stuck-main",
        "wl-stuck-cond",
        "wl-stuck-pipe",
        "wl-stuck-sleep",
    ];
    let tid = |name: &str| {
        if name == "wl-stuck-main" {
            wl.pid
        } else {
            wl.tid(name)
        }
    };
    let before: BTreeMap<&str, Vec<String>> = threads
        .iter()
        .map(|&t| (t, proc_stack(wl.pid, tid(t))))
        .collect();
    let out = profile(&["--snapshot", "-p", &wl.pid.to_string(), "-d", "-f"]);
    let after: BTreeMap<&str, Vec<String>> = threads
        .iter()
        .map(|&t| (t, proc_stack(wl.pid, tid(t))))
        .collect();
    assert_eq!(before, after, "the stuck threads moved");

    let lines = parse_folded(&out.stdout);
    let left_out = crate::kstacks::left_out_names();
    let mut user_of = BTreeMap::new();
    for &t in &threads {
        let line = lines
            .iter()
            .find(|l| l.comm() == t)
            .unwrap_or_else(|| panic!("no stack of {t}: {lines:?}"));
        assert_eq!(line.us, 1, "{t}: one task");
        let dash = line
            .pos("-")
            .unwrap_or_else(|| panic!("{t}: no user part: {line:?}"));
        let mut kernel: Vec<String> = line.frames[dash + 1..].to_vec();
        kernel.reverse();
        // The kernel's view leaves out the scheduler's frames; the
        // snapshot has them, as a switch-out does.
        assert_eq!(kernel[0], "__schedule", "{t}: {kernel:?}");
        let seen: Vec<String> = kernel
            .iter()
            .filter(|f| !left_out.contains(*f))
            .cloned()
            .collect();
        assert_eq!(seen, before[t], "{t}: kernel frames differ from /proc");
        let mut user: Vec<String> = line.frames[1..dash].to_vec();
        user.reverse();
        user_of.insert(t, user);
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("frames.py");
    std::fs::write(&script, crate::unwind::GDB_SCRIPT).expect("write the gdb script");
    let gdb_frames = crate::unwind::gdb_stacks(&gdb, &script, wl.pid);
    let mut sym = crate::unwind::Naming::new(SymbolizeOptions {
        inline: true,
        ..SymbolizeOptions::default()
    });
    sym.reg.note_process(wl.pid, None, false);
    let own = crate::unwind::own_ranges(wl.pid, &blocker_path());
    for &t in &threads {
        let frames = gdb_frames
            .get(t)
            .unwrap_or_else(|| panic!("gdb has no thread {t}: {gdb_frames:?}"));
        let expected = crate::unwind::expected_stack(&mut sym, wl.pid, frames, &own);
        assert_eq!(
            user_of[t], expected.names,
            "{t}: user frames differ from gdb's"
        );
    }
}

/// `--snapshot D` lists the thread waiting for its vfork child
/// (TASK_KILLABLE, D in /proc) and none of the sleepers; `DS` lists all.
#[test]
fn snapshot_d_lists_uninterruptible_only() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["stuck", "--vfork"]);
    let vfork = wl.tid("wl-stuck-vfork");
    let stat = std::fs::read_to_string(format!("/proc/{}/task/{vfork}/stat", wl.pid)).unwrap();
    let state = stat.rsplit_once(") ").unwrap().1.chars().next().unwrap();
    assert_eq!(state, 'D', "the vfork parent is not in D: {stat}");

    let pid = wl.pid.to_string();
    let out = profile(&["--snapshot", "D", "-p", &pid, "-v"]);
    let tasks = listed(&out.stdout);
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!((tasks[0].pid, tasks[0].state), (vfork, 'D'));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kernel_clone"), "{text}");
    if kernel_version() >= (5, 18) {
        assert!(
            text.contains("wl_block_stuck_vfork") || text.contains("__clone"),
            "{text}"
        );
    } else {
        // No sleepable iterator: no user stacks, and stderr says why.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("[Missed User Stack]"), "{text}");
        assert!(err.contains("Linux 5.18 and later can"), "{err}");
    }

    let all = listed(&profile(&["--snapshot", "DS", "-p", &pid, "-v"]).stdout);
    assert_eq!(all.len(), 5, "{all:?}");
    assert!(
        all.iter()
            .filter(|t| t.pid != vfork)
            .all(|t| t.state == 'S'),
        "{all:?}"
    );
    eprintln!("matrix: snapshot ok");
}

/// The off-CPU time of `wl-stuck-sleep`, which says when it went to
/// sleep, against the time of the snapshot (`-v`): within 2 ms (the
/// report shows milliseconds). `--grep` keeps its stack alone.
#[test]
fn snapshot_off_cpu_time_of_a_sleeper() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let mut wl = Workload::start(&["stuck"]);
    let asleep: u64 = wl.line_after("asleep ").trim().parse().expect("asleep ns");
    std::thread::sleep(std::time::Duration::from_millis(1300));
    let tid = wl.tid("wl-stuck-sleep");
    let out = profile(&[
        "--snapshot",
        "-p",
        &wl.pid.to_string(),
        "--grep",
        "wl_block_long_sleep",
        "-v",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at: f64 = stderr
        .split("CLOCK_MONOTONIC ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no snapshot time in {stderr}"));
    let tasks = listed(&out.stdout);
    assert_eq!(
        tasks.len(),
        1,
        "--grep kept more than the sleeper: {tasks:?}"
    );
    assert_eq!(tasks[0].pid, tid);
    let expected = at - asleep as f64 / 1e9;
    let got = tasks[0].off_cpu_s.expect("an off-CPU time");
    println!("snapshot: wl-stuck-sleep off CPU {got:.3} s, expected {expected:.4} s");
    assert!(expected > 1.2, "{expected}");
    assert!(
        (got - expected).abs() <= 0.002,
        "off CPU {got} s, expected {expected} s"
    );
}
