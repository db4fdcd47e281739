//! User stacks through signal frames, against gdb's.
//!
//! The `signals` workload (`tests/workloads/signals.c`), built without
//! frame pointers, has threads blocked inside signal handlers: on the
//! thread's stack and on an alternate signal stack (`SA_ONSTACK`), each
//! interrupted in a spin loop of its own functions; two interrupted by a
//! fault where a return address never points, at the first instruction of
//! a function and at the first instruction of a later unwind rule (its
//! interrupted pc must be looked up as it is, not one byte earlier); and
//! the main thread in a handler of a signal it raised itself. Two of them block again and
//! again (their stacks are walked at switch-out), two only once, before the
//! profiler starts (walked by the start iterator, in another task).
//!
//! The profiler's stack of each thread, traced and in a `--snapshot`, must
//! be gdb's, frame for frame, named by the library's symbolizer, with
//! `[signal handler called]` where gdb says `<signal handler called>`; and
//! gdb's names of the workload's own frames, and of the signal frame, must
//! be in it in gdb's order (see [`crate::unwind`]).
//!
//! With `--wakers`, the same workload's `wakers` mode wakes threads from
//! inside signal handlers (a pipe written every 20 ms, on the thread's
//! stack, on a `sigaltstack`, and in the main thread's handler of a signal
//! it raised): each waker's stack must go from the write through
//! `[signal handler called]` into the interrupted code and on to
//! `start_thread` or `main`, exactly as the source calls.

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
    "entry_fault",
    "rule_fault",
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

#[test]
fn wakers_in_signal_handlers_tp_btf() {
    wakers_in_signal_handlers("tp-btf");
}

#[test]
fn wakers_in_signal_handlers_raw_tp() {
    wakers_in_signal_handlers("raw-tp");
}

#[test]
fn wakers_in_signal_handlers_kprobe() {
    on_kprobe(&["--wakers"], wakers_in_signal_handlers);
}

/// Where a waker's handler interrupted it: a thread spinning in `spin3`
/// under its start function, or the main thread in `raise`.
#[derive(Clone, Copy, Debug)]
enum Interrupted {
    Thread(&'static str),
    Main,
}

/// The handler's frames from the write's caller to the signal frame,
/// innermost first, as `signals.c` calls them.
const HANDLER: &[&str] = &[
    "wake_write",
    "wake_loop2",
    "wake_loop1",
    "on_wake_signal",
    SIGNAL_FRAME_NAME,
];

/// Whether `user`, a waker's user frames innermost first, is the stack
/// `signals.c` implies for a write in its handler: glibc's write, the
/// handler's functions, the signal frame, then the interrupted code and
/// its callers down to the thread's or the process's start.
fn waker_stack_is(user: &[String], interrupted: Interrupted) -> bool {
    let Some(k) = user.iter().position(|f| f == HANDLER[0]) else {
        return false;
    };
    let libc_write = k > 0 && user[..k].iter().all(|f| f.contains("write"));
    if !libc_write || user.len() < k + HANDLER.len() || user[k..k + HANDLER.len()] != *HANDLER {
        return false;
    }
    let below = &user[k + HANDLER.len()..];
    match interrupted {
        // Interrupted in its spin loop, itself called from the thread's
        // start, and that from glibc's start_thread and clone.
        Interrupted::Thread(start) => {
            let expected = ["spin3", "spin2", "spin1", start, "start_thread"];
            below.len() == expected.len() + 1
                && below[..expected.len()] == expected
                && below[expected.len()].contains("clone")
        }
        // Interrupted in glibc's raise (its own frames, of whatever name),
        // called from main_level2, and on down to _start.
        Interrupted::Main => {
            let Some(j) = below.iter().position(|f| f == "main_level2") else {
                return false;
            };
            let expected = ["main_level2", "main_level1", "wakers_main", "main"];
            j > 0
                && below[..j].iter().any(|f| f.contains("raise"))
                && below.len() > j + expected.len()
                && below[j..j + expected.len()] == expected
                && below.last().is_some_and(|f| f == "_start")
        }
    }
}

/// Wakers inside signal handlers (see the module's documentation): at
/// least 80% of each woken thread's window must be woken by its waker,
/// with the whole stack `signals.c` implies, on hook `hook`.
pub const SIGNALS_FLAGS: &[&str] = &["-O2", "-g", "-pthread", "-fomit-frame-pointer"];

fn wakers_in_signal_handlers(hook: &str) {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = c_workload("signals", SIGNALS_FLAGS, dir.path());
    let wl = Running::start_with(&exe, &["wakers"]);
    let pid = wl.pid.to_string();
    let (out, (from, to)) = profile_window(
        &["--hook", hook, "--wakers", "-d", "-f", "-p", &pid, "2"],
        &[],
    );
    drop(wl);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Signal frames are followed by the DWARF walk only, which a kernel
    // before 5.17 cannot run (the kernel matrix's 5.10).
    if frame_pointers_only(&stderr) {
        eprintln!("matrix: signal wakers {hook}: {NO_DWARF_WALK}");
        return;
    }
    let window_us = (to - from) as f64 / 1e3;
    let lines = parse_folded(&out.stdout);
    // (woken thread, its waker's name, where the waker was interrupted)
    let cases = [
        (
            "sig_wakee",
            "sig_waker",
            Interrupted::Thread("sig_waker_main"),
        ),
        (
            "alt_wakee",
            "alt_waker",
            Interrupted::Thread("alt_waker_main"),
        ),
        ("main_wakee", "signals", Interrupted::Main),
    ];
    for (wakee, waker, interrupted) in cases {
        let mine: Vec<&Folded> = lines.iter().filter(|l| l.comm() == wakee).collect();
        // A line: the woken thread's stacks, `--`, the waker's kernel
        // frames, `-`, its user frames and its name.
        let parts = |l: &Folded| -> Option<(Vec<String>, Vec<String>, String)> {
            let at = l.pos("--")?;
            let (blocked, waker) = (&l.frames[..at], &l.frames[at + 1..]);
            let (name, frames) = waker.split_last()?;
            let user = frames
                .iter()
                .position(|f| f == "-")
                .map_or(&[][..], |d| &frames[d + 1..]);
            Some((blocked.to_vec(), user.to_vec(), name.clone()))
        };
        let woken: u64 = mine
            .iter()
            .filter(|l| {
                parts(l).is_some_and(|(blocked, user, name)| {
                    let reads = ["wakee_main", "wakee_read1", "wakee_read2"];
                    name == waker
                        && blocked
                            .windows(reads.len())
                            .any(|w| w.iter().eq(reads.iter()))
                        && waker_stack_is(&user, interrupted)
                })
            })
            .map(|l| l.us)
            .sum();
        eprintln!("{wakee} ({hook}): {woken} us of {window_us:.0} woken by {waker} in its handler");
        if woken as f64 <= window_us * 0.8 {
            let mut mine = mine.clone();
            mine.sort_by_key(|l| std::cmp::Reverse(l.us));
            panic!(
                "{wakee}: only {woken} us of a {window_us:.0} us window woken by {waker} \
                 through its signal frame ({hook}); its lines: {:#?}\n{stderr}",
                &mine[..mine.len().min(4)]
            );
        }
    }
    eprintln!("matrix: signal wakers {hook} ok");
}
