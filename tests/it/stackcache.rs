//! The user stack cache (`struct ucache` in the BPF program): a thread's
//! stack is not walked again when the registers it blocks with, its
//! process's tables and every stack slot the last walk read are the same.
//! These tests try to fool it with the workload
//! `tests/workloads/stackcache.c`: threads that block under two stacks in
//! turn, with the same registers at kernel entry each time, the stacks
//! told apart only by stack memory (a function called from two sites, a
//! stack that changes below eight unchanged frames, the same depth
//! through two call paths, a return address that is the stack's end in
//! one and a frame more in the other, in the last slot a walk reads). The
//! time under each must be what the workload spends there (a fifth under
//! its "a" stack), the stacks the same as with the cache off, and the
//! cache must have been used.

use std::path::{Path, PathBuf};

use crate::unwind::Running;
use crate::util::*;

/// Each thread, and the frame that names its "a" and its "b" stack (an
/// "a" stack has its frame and not the "b" one: in `ends`, "b" is "a" and
/// a frame more).
const THREADS: &[(&str, &str, &str)] = &[
    ("sites", "site_a", "site_b"),
    ("deep", "root_a", "root_b"),
    ("paths", "path_a1", "path_b1"),
    ("ends", "tip", "outer_b"),
];

/// The workload's share of each thread's time under "a": 3 × 2 ms
/// against 3 × 8 ms (a few µs more for each sleep's way in and out).
const A_SHARE: f64 = 0.2;

#[test]
fn cache_not_fooled_without_frame_pointers() {
    check("-fomit-frame-pointer");
}

/// With frame pointers the walk starts from the frame pointer register,
/// which is then part of what must be the same.
#[test]
fn cache_not_fooled_with_frame_pointers() {
    check("-fno-omit-frame-pointer");
}

fn check(fp: &str) {
    if !require_root() {
        return;
    }
    let Some(clang) = require_tool("clang", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(&clang, fp, dir.path());
    let wl = Running::start(&exe);
    let pid = wl.pid.to_string();
    let args = ["-p", &pid, "-U", "-f", "3"];
    let (cached, _) = profile_window(&args, &[]);
    let (walked, _) = profile_window(&args, &[("OFFCPUTIME_NO_STACK_CACHE", "1")]);
    drop(wl);

    let proved =
        |out: &std::process::Output| proved_unchanged(&String::from_utf8_lossy(&out.stderr));
    let (hits, none) = (proved(&cached), proved(&walked));
    assert!(
        hits > 100,
        "{fp}: the cache was hardly used ({hits} stacks proved unchanged):\n{}",
        String::from_utf8_lossy(&cached.stderr)
    );
    assert_eq!(
        none, 0,
        "{fp}: OFFCPUTIME_NO_STACK_CACHE=1 still used the cache"
    );

    let (c, w) = (parse_folded(&cached.stdout), parse_folded(&walked.stdout));
    for &(thread, a, b) in THREADS {
        for (label, lines) in [("cache on", &c), ("cache off", &w)] {
            let under = |f: &str| {
                sum_us_where(lines, |l| {
                    l.comm() == thread && l.has(f) && (f == b || !l.has(b))
                })
            };
            let (ua, ub) = (under(a), under(b));
            let share = ua as f64 / (ua + ub).max(1) as f64;
            println!(
                "stackcache: {fp} {label} {thread}: {a} {ua} us, {b} {ub} us, share {share:.3}"
            );
            assert!(
                (share - A_SHARE).abs() < 0.04,
                "{fp}, {label}: thread {thread} has {ua} us under {a} and {ub} us under {b} \
                 ({:.1}% under {a}, the workload spends {:.0}% there)",
                share * 100.0,
                A_SHARE * 100.0
            );
        }
        assert_eq!(
            main_stacks(&c, thread),
            main_stacks(&w, thread),
            "{fp}: thread {thread}'s stacks differ with the cache on (left) and off (right)"
        );
    }
}

/// The thread `ends` alone (`-t`): its two stacks read the same slots
/// and differ only in the last one, so that only a check of every slot
/// tells them apart. Three blocks under one, three under the other: at
/// most two of each three can be proved unchanged since the walk before
/// (each change of stack must be walked). Only its sleeps are traced
/// (`--state 1`): a preemption on the way out of a sleep, at the same
/// user registers, would be proved unchanged too, and under load there
/// are many.
#[test]
fn cache_checks_the_last_slot_of_a_walk() {
    if !require_root() {
        return;
    }
    let Some(clang) = require_tool("clang", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    for fp in ["-fomit-frame-pointer", "-fno-omit-frame-pointer"] {
        let out = sleeps_of(&clang, fp, dir.path(), "ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (walked, proved) = (walked(&stderr), proved_unchanged(&stderr));
        let lines = parse_folded(&out.stdout);
        let (a, b) = (
            sum_us_where(&lines, |l| l.has("tip") && !l.has("outer_b")),
            sum_us_where(&lines, |l| l.has("outer_b")),
        );
        println!("stackcache: {fp} ends: {proved} of {walked} stacks proved unchanged; a {a} us, b {b} us");
        assert!(walked > 300, "{fp}: only {walked} stacks walked:\n{stderr}");
        assert!(
            proved * 3 <= walked * 2 + 3,
            "{fp}: {proved} of {walked} stacks of thread ends proved unchanged, at most two \
             thirds can be: stacks that differ in the last slot read were taken for one"
        );
        let share = a as f64 / (a + b).max(1) as f64;
        assert!(
            (share - A_SHARE).abs() < 0.04,
            "{fp}: thread ends has {a} us under its \"a\" stack and {b} us under \"b\""
        );
    }
}

/// The thread `turns` alone (`-t`, its sleeps only): it blocks in four
/// places in turn, each at a stack pointer of its own. The cache keeps
/// four walks of a thread, so after the first round each block is proved
/// unchanged (a cache of fewer would walk every one); and each place has
/// a quarter of the time.
#[test]
fn cache_keeps_four_places_of_a_thread() {
    let Some(lines) = proved_in_turn("turns", "the cache did not keep four walks") else {
        return;
    };
    let depth = |l: &Folded| l.frames.iter().filter(|f| *f == "turn").count();
    let total = sum_us_where(&lines, |l| depth(l) > 0);
    for d in 1..=4 {
        let share = sum_us_where(&lines, |l| depth(l) == d) as f64 / total.max(1) as f64;
        assert!(
            (share - 0.25).abs() < 0.04,
            "{:.1}% of the time of turns under {d} frames of turn, not a quarter",
            share * 100.0
        );
    }
}

/// The thread `widths` alone (`-t`, its sleeps only): it blocks under
/// `narrow` and `wide` in turn, walks of as many frames and slots whose
/// slots are at other places. The places are kept once per shape, for
/// every thread that blocks there: each block after the first two is
/// proved unchanged (a shape taken for the other's would prove neither);
/// and each place has half of the time.
#[test]
fn cache_keeps_places_of_walks_as_deep_apart() {
    let why = "the places of one were taken for the other's";
    let Some(lines) = proved_in_turn("widths", why) else {
        return;
    };
    let total = sum_us_where(&lines, |l| l.has("narrow") || l.has("wide"));
    let wide = sum_us_where(&lines, |l| l.has("wide"));
    let share = wide as f64 / total.max(1) as f64;
    assert!(
        (share - 0.5).abs() < 0.04,
        "{:.1}% of the time of widths under wide, not a half",
        share * 100.0
    );
}

/// The workload's thread `thread`, which blocks in a few places in turn,
/// traced alone (`sleeps_of`, without frame pointers): the stacks of all
/// but a twentieth of its blocks must be proved unchanged (else `why`).
/// Its profile; None where the test cannot run (said).
fn proved_in_turn(thread: &str, why: &str) -> Option<Vec<Folded>> {
    if !require_root() {
        return None;
    }
    let clang = require_tool("clang", &[])?;
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = sleeps_of(&clang, "-fomit-frame-pointer", dir.path(), thread);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (walked, proved) = (walked(&stderr), proved_unchanged(&stderr));
    println!("stackcache: {thread}: {proved} of {walked} stacks proved unchanged");
    assert!(walked > 1000, "only {walked} stacks walked:\n{stderr}");
    assert!(
        proved * 20 >= walked * 19,
        "{proved} of {walked} stacks of {thread}, which blocks in a few places in turn, \
         proved unchanged: {why}"
    );
    Some(parse_folded(&out.stdout))
}

/// The workload built with `fp` in `dir`, its thread `thread` traced alone
/// for 3 s, its sleeps only (`--state 1`), with `-v`.
fn sleeps_of(clang: &Path, fp: &str, dir: &Path, thread: &str) -> std::process::Output {
    let exe = compile(clang, fp, dir);
    let wl = Running::start(&exe);
    let tid = thread_named(wl.pid, thread);
    let (out, _) = profile_window(&["-t", &tid, "--state", "1", "-U", "-f", "3"], &[]);
    drop(wl);
    out
}

/// The id of the thread named `name` of process `pid`.
fn thread_named(pid: u32, name: &str) -> String {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the workload's threads")
        .flatten()
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .unwrap_or_else(|| panic!("the thread {name}"))
        .file_name()
        .into_string()
        .unwrap()
}

/// From `-v`: "... N stacks walked with them (...".
fn walked(stderr: &str) -> u64 {
    let at = stderr
        .find(" stacks walked with them")
        .unwrap_or_else(|| panic!("no unwind tables line in:\n{stderr}"));
    let before = &stderr[..at];
    let start = before.rfind(' ').map_or(0, |i| i + 1);
    before[start..]
        .parse()
        .expect("a count before \"stacks walked with them\"")
}

/// The stacks under which `thread` spent at least 1% of its time: a
/// preemption elsewhere may add a rare one to either run.
fn main_stacks(lines: &[Folded], thread: &str) -> Vec<String> {
    let total = sum_us(lines, thread);
    let mut stacks: Vec<String> = lines
        .iter()
        .filter(|l| l.comm() == thread && l.us * 100 >= total)
        .map(|l| l.frames.join(";"))
        .collect();
    stacks.sort();
    stacks
}

/// From `-v`: "... stacks walked with them (N cut short, N proved
/// unchanged since one of the thread's last walks) ...".
fn proved_unchanged(stderr: &str) -> u64 {
    let at = stderr
        .find(" proved unchanged")
        .unwrap_or_else(|| panic!("no unwind tables line in:\n{stderr}"));
    let before = &stderr[..at];
    let start = before.rfind(' ').map_or(0, |i| i + 1);
    before[start..]
        .parse()
        .expect("a count before \"proved unchanged\"")
}

fn compile(clang: &Path, fp: &str, dir: &Path) -> PathBuf {
    let flags = ["-O2", "-g", "-pthread", fp, "-fno-optimize-sibling-calls"];
    build_workload(clang, "stackcache", &flags, dir)
}
