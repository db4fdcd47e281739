//! User stacks through signal frames, against gdb's.
//!
//! The `signals` workload (`tests/workloads/signals.c`), built without
//! frame pointers, has threads blocked inside signal handlers: on the
//! thread's stack and on an alternate signal stack (`SA_ONSTACK`), each
//! interrupted in a spin loop of its own functions; and the main thread in
//! a handler of a signal it raised itself. Two of them block again and
//! again (their stacks are walked at switch-out), two only once, before the
//! profiler starts (walked by the start iterator, in another task).
//!
//! The profiler's stack of each thread, traced and in a `--snapshot`, must
//! be gdb's, frame for frame, named by the library's symbolizer, with
//! `[signal handler called]` where gdb says `<signal handler called>`; and
//! gdb's names of the workload's own frames, and of the signal frame, must
//! be in it in gdb's order (see [`crate::unwind`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use offcputime::symbolize::{SymbolizeOptions, SIGNAL_FRAME_NAME};

use crate::unwind::{
    expected_stack, gdb_stacks, in_syscall, mismatch, own_ranges, profiler_stacks, Expected,
    GdbFrame, Naming, Running, GDB_SCRIPT,
};
use crate::util::*;

/// The threads, by name (the main thread's is the executable's).
const THREADS: &[&str] = &[
    "sig_sleeper",
    "alt_sleeper",
    "sig_reader",
    "alt_reader",
    "signals",
];

/// Threads blocked since before the profiler started: only its start
/// iterator sees them.
const BLOCKED_BEFORE: &[&str] = &["sig_reader", "alt_reader"];

#[test]
fn gdb_agrees_through_signal_frames() {
    if !require_root() {
        return;
    }
    let (Some(gdb), Some(clang)) = (require_tool("gdb", &[]), require_tool("clang", &[])) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["-O2", "-g", "-pthread", "-fomit-frame-pointer"];
    let exe = build_workload(&clang, "signals", &flags, dir.path());
    let wl = Running::start(&exe);
    let pid = wl.pid.to_string();

    // The profiler first, gdb after: its stops must not be traced.
    let traced = profiler_stacks(wl.pid, &["--unwind", "dwarf"]);
    let snapshot = snapshot_stacks(&pid);
    let gdb_frames = blocked_gdb_stacks(&gdb, dir.path(), wl.pid);
    let mut sym = Naming::new(SymbolizeOptions {
        inline: true,
        ..SymbolizeOptions::default()
    });
    sym.reg.note_process(wl.pid, None, false);
    let own = own_ranges(wl.pid, &exe);
    let expected: BTreeMap<&str, Expected> = THREADS
        .iter()
        .map(|&t| (t, expected_stack(&mut sym, wl.pid, &gdb_frames[t], &own)))
        .collect();
    drop(wl);

    // The test's own premise: gdb saw every thread in a handler, and
    // names the signal frame as the profiler does.
    for (&t, exp) in &expected {
        let signal = gdb_frames[t].iter().filter(|f| f.signal).count();
        assert_eq!(signal, 1, "{t}: gdb shows no one signal frame");
        assert_eq!(
            exp.names
                .iter()
                .filter(|n| n.as_str() == SIGNAL_FRAME_NAME)
                .count(),
            1,
            "{t}: {:?}",
            exp.names
        );
    }

    let mut failed = Vec::new();
    for (what, stacks) in [("traced", &traced), ("snapshot", &snapshot)] {
        let mismatches: Vec<String> = expected
            .iter()
            .filter_map(|(t, exp)| mismatch(t, exp, stacks.get(*t)))
            .collect();
        println!(
            "signal-frames: {what} matched={}/{} threads",
            THREADS.len() - mismatches.len(),
            THREADS.len()
        );
        for m in &mismatches {
            println!("{m}");
        }
        failed.extend(mismatches.into_iter().map(|m| format!("{what}: {m}")));
    }
    assert!(
        failed.is_empty(),
        "the profiler disagrees with gdb through signal frames:\n{}",
        failed.join("")
    );
    // The threads blocked for good were seen by the start iterator: one
    // block, from the start of the trace.
    for t in BLOCKED_BEFORE {
        assert!(traced.contains_key(*t), "{t}: not traced");
    }
}

/// `--snapshot`'s user stack of each thread, innermost first.
fn snapshot_stacks(pid: &str) -> BTreeMap<String, Vec<String>> {
    let out = profile(&["--snapshot", "-p", pid, "-U", "-f", "--unwind", "dwarf"]);
    parse_folded(&out.stdout)
        .into_iter()
        .map(|l| {
            let comm = l.comm().to_string();
            (comm, l.frames[1..].iter().rev().cloned().collect())
        })
        .collect()
}

/// gdb's stack of each of [`THREADS`], from the first of a few attaches
/// that caught it blocked in a syscall (the sleepers wake every 20 ms).
fn blocked_gdb_stacks(gdb: &Path, dir: &Path, pid: u32) -> BTreeMap<String, Vec<GdbFrame>> {
    let script = dir.join("frames.py");
    std::fs::write(&script, GDB_SCRIPT).expect("write the gdb script");
    let mut found: BTreeMap<String, Vec<GdbFrame>> = BTreeMap::new();
    for _ in 0..5 {
        let stacks = gdb_stacks(gdb, &script, pid);
        for &t in THREADS {
            match stacks.get(t) {
                Some(frames) if !found.contains_key(t) && in_syscall(pid, frames) => {
                    found.insert(t.to_string(), frames.clone());
                }
                _ => {}
            }
        }
        if found.len() == THREADS.len() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(37));
    }
    panic!("gdb did not catch every thread in a syscall: {found:#?}");
}
