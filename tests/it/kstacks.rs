//! Kernel stacks of threads that are not running, whole: a block under
//! way at the start (and, with the kprobe hook, one still under way at
//! the end) shows the scheduler's frames as a switch-out does. The kernel's
//! walk of such a thread leaves out everything in .sched.text; offcputime
//! walks it with the kernel's ORC tables. `OFFCPUTIME_TEST_KSTACK_CHECK`
//! compares every such stack with the kernel's own walk of the same thread,
//! the frames it leaves out skipped: none may differ.

use std::collections::HashSet;

use crate::util::*;

/// The names of the functions the kernel's walk of a thread not running
/// leaves out (`.sched.text` and `.spinlock.text`), from kallsyms.
pub fn left_out_names() -> HashSet<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").expect("read /proc/kallsyms");
    let syms: Vec<(u64, &str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            Some((addr, kind, name))
        })
        .collect();
    let at = |name: &str| {
        syms.iter()
            .find(|(_, _, n)| *n == name)
            .map(|s| s.0)
            .unwrap_or_else(|| panic!("{name} is not in /proc/kallsyms"))
    };
    let ranges = [
        (at("__sched_text_start"), at("__sched_text_end")),
        (at("__lock_text_start"), at("__lock_text_end")),
    ];
    syms.iter()
        .filter(|(a, k, _)| matches!(*k, "t" | "T") && ranges.iter().any(|r| r.0 <= *a && *a < r.1))
        .map(|s| s.2.to_string())
        .collect()
}

/// The threads of `blocker --io`, each with the start of the name of a
/// kernel frame its main wait must show (a scheduler frame: in .sched.text;
/// `io_schedule` or `io_schedule_timeout`). The I/O thread's reads wait for
/// a disk only outside the kernel matrix's VMs, whose files are in memory.
const THREADS: [(&str, &str); 4] = [
    ("wl-nanosleep", "do_nanosleep"),
    ("wl-pipe", "schedule"),
    ("wl-futex", "schedule"),
    ("wl-io", "io_schedule"),
];

fn whole_on(hook: &str) {
    if !require_root() {
        return;
    }
    let _g = serial();
    // Threads blocked for good (each one a walk at the start), and threads
    // that block again and again (their blocks under way at the start,
    // and at switch-outs, must look the same).
    let stuck = Workload::start(&["stuck"]);
    let wl = Workload::start(&["--io", "--seconds", "60"]);
    let pids = format!("{},{}", stuck.pid, wl.pid);
    let (out, _) = profile_window(
        &["--hook", hook, "-f", "-p", &pids, "2"],
        &[("OFFCPUTIME_TEST_KSTACK_CHECK", "1")],
    );
    drop(wl);
    drop(stuck);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let number_before = |what: &str| count_before(&stderr, what);
    let walked = number_before(" walked with the kernel's ORC");
    let compared = number_before(" stacks compared with the kernel's walk");
    let differ = number_before(" differ\n");
    eprintln!("{hook}: {walked} walked, {compared} compared, {differ} differ");
    eprintln!("matrix: {walked} walked, {differ} of {compared} differ");
    // The four stuck threads at the start: one walk each at least, three
    // stacks (two wait on a futex alike).
    assert!(walked >= 4, "{hook}: {walked} walks: {stderr}");
    assert!(compared >= 3, "{hook}: {compared} compared: {stderr}");
    for (comm, sched) in [
        ("wl-stuck-sleep", "do_nanosleep"),
        ("wl-stuck-pipe", "schedule"),
        ("wl-stuck-cond", "schedule"),
    ] {
        let l = lines
            .iter()
            .filter(|l| l.comm() == comm)
            .max_by_key(|l| l.us)
            .unwrap_or_else(|| panic!("{hook}: no stack of {comm}: {lines:?}"));
        assert_eq!(
            l.frames.last().unwrap(),
            "__schedule",
            "{hook}: {comm}: {:?}",
            l.frames
        );
        assert!(l.has(sched), "{hook}: {comm}: no {sched}: {:?}", l.frames);
    }
    assert_eq!(differ, 0, "{hook}: {stderr}");
    // Only threads that ran while they were walked (twice), and on the
    // kprobe blocks still under way at the end where its end iterator reads
    // user stacks (5.18 on), may lack them: the stuck ones have theirs from
    // the start.
    let lacking = if stderr.contains("lack the scheduler's frames") {
        assert_eq!(
            number_before(" where the kernel's unwind tables (ORC) could not be used"),
            0,
            "{hook}: {stderr}"
        );
        number_before(" of threads that ran while they were walked")
            + number_before(" taken by the kprobe's end iterator with user stacks")
    } else {
        0
    };
    let in_vm = std::env::var_os("OFFCPUTIME_TEST_WORKLOADS").is_some();
    for (comm, sched) in THREADS {
        // The VMs' files are in memory: the I/O thread may not block at all.
        if in_vm && comm == "wl-io" {
            continue;
        }
        let mine: Vec<&Folded> = lines.iter().filter(|l| l.comm() == comm).collect();
        assert!(!mine.is_empty(), "{hook}: no stack of {comm}: {lines:?}");
        for l in mine
            .iter()
            .filter(|l| lacking == 0 || l.us == max_us(&mine))
        {
            // The innermost frames: the scheduler's, as at a switch-out
            // (the kprobe's stacks are taken in finish_task_switch).
            let last = l.frames.last().unwrap();
            assert!(
                last == "__schedule" || last.starts_with("finish_task_switch"),
                "{hook}: {comm}: a stack without the scheduler's frames: {:?}",
                l.frames
            );
        }
        // Where it waits most (a thread may also be switched out on its way
        // back to user mode, in exit_to_user_mode_loop).
        let main = mine.iter().max_by_key(|l| l.us).unwrap();
        assert!(
            main.frames.iter().any(|f| f.starts_with(sched)),
            "{hook}: {comm}: no {sched}: {:?}",
            main.frames
        );
    }
}

#[test]
fn blocked_at_the_start_whole_tp_btf() {
    whole_on("tp-btf");
}

#[test]
fn blocked_at_the_start_whole_raw_tp() {
    whole_on("raw-tp");
}

#[test]
fn blocked_at_the_start_whole_kprobe() {
    on_kprobe(&[], whole_on);
}

/// The most time of one of `lines`.
fn max_us(lines: &[&Folded]) -> u64 {
    lines.iter().map(|l| l.us).max().unwrap_or(0)
}
