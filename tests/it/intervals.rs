//! `-i SECONDS` and `-T`: a profile per interval, each holding exactly its
//! own time, checked against the kernel's own accounting interval by
//! interval; Ctrl-C's partial last interval; a file per interval.

use std::process::Command;
use std::time::Duration;

use crate::newprocs::{build_forker, in_order};
use crate::util::*;

const STUCK: [&str; 4] = [
    "wl-stuck-cond",
    "wl-stuck-pipe",
    "wl-stuck-sleep",
    "wl-stuck-main",
];

/// Threads blocked for the whole run show each interval's full length in
/// each interval (to the microsecond: the parts are cut at the interval's
/// end exactly), and threads that block and run show, interval by
/// interval, what the kernel accounts (within 2% of the interval).
#[test]
fn intervals_hold_exactly_their_own_time() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "120"]);
    let stuck = Workload::start(&["stuck"]);
    let comms = ["wl-nanosleep", "wl-pipe", "wl-futex"];
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let pids = format!("{},{}", wl.pid, stuck.pid);
    let clock = CpuClock::start(wl.pid, &tids);
    let out = profile(&["-v", "-T", "-i", "1", "-f", "-p", &pids, "3.4"]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (_, from, to) = verbose_window(&stderr);
    let intervals = split_intervals(&out.stdout);
    assert_eq!(
        intervals.len(),
        4,
        "3.4 s in 1 s intervals: 4 profiles\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let times: Vec<&str> = intervals.iter().map(|(t, _)| t.as_str()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    // (Past midnight the order would wrap; the test would say so.)
    assert_eq!(times, sorted, "the time lines go forward");
    let mut whole = vec![0u64; comms.len()];
    for (k, (time, lines)) in intervals.iter().enumerate() {
        let a = from + k as u64 * 1_000_000_000;
        let b = (a + 1_000_000_000).min(to);
        let len_us = (b - a) as f64 / 1e3;
        for comm in STUCK {
            let got = sum_us(lines, comm) as f64;
            eprintln!("interval {k} ({time}): {comm} {got} us of {len_us:.0}");
            // Each line is rounded to the microsecond on its own.
            let lines_of = lines.iter().filter(|l| l.comm() == comm).count() as f64;
            assert!(
                (got - len_us).abs() <= lines_of + 1.0,
                "interval {k}: {comm} blocked all along, counted {got} us of a {len_us:.0} us \
                 interval"
            );
        }
        for (i, comm) in comms.iter().enumerate() {
            let got = sum_us(lines, comm) as f64;
            let expected = cpu.off_cpu_us(i, a, b);
            let stolen = cpu.stolen_us(a, b);
            whole[i] += got as u64;
            eprintln!(
                "interval {k}: {comm} {got} us, by the kernel's accounting {expected:.0} us \
                 (stolen from the VM: up to {stolen:.0} us)"
            );
            // Time stolen from the VM while the thread was switched in is
            // run time to the profile, not to the kernel: it can only make
            // the profile's off-CPU time the smaller.
            let slack = if got < expected { stolen } else { 0.0 };
            assert!(
                (got - expected).abs() < 0.02 * len_us + slack,
                "interval {k}: {comm} {got} us off-CPU, by the kernel's accounting {expected:.0} \
                 us in a {len_us:.0} us interval"
            );
        }
    }
    // Together, the window, as one profile of it would say.
    let all: Vec<Folded> = intervals.into_iter().flat_map(|(_, l)| l).collect();
    check_blocked_threads(&all, &cpu, &comms, (from, to), " (intervals summed)");
}

/// Ctrl-C (SIGINT) ends the trace at once and prints the interval under
/// way, up to then: here the third, of about half an interval.
#[test]
fn ctrl_c_prints_the_partial_interval() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let pid = stuck.pid.to_string();
    let (out, _, _) = profile_during(&["-T", "-i", "1", "-f", "-p", &pid], |child| {
        std::thread::sleep(Duration::from_millis(2500));
        // SAFETY: signals the profiler, our child.
        unsafe { libc::kill(child as i32, libc::SIGINT) };
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (_, from, to) = verbose_window(&stderr);
    let intervals = split_intervals(&out.stdout);
    assert_eq!(
        intervals.len(),
        3,
        "2.5 s in 1 s intervals, then Ctrl-C\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let last_us = (to - (from + 2_000_000_000)) as f64 / 1e3;
    assert!(
        (300_000.0..900_000.0).contains(&last_us),
        "the window ended {last_us:.0} us into the third interval"
    );
    for (k, (_, lines)) in intervals.iter().enumerate() {
        let len = if k < 2 { 1e6 } else { last_us };
        for comm in STUCK {
            let got = sum_us(lines, comm) as f64;
            assert!(
                (got - len).abs() <= 2.0 + lines.len() as f64,
                "interval {k}: {comm} counted {got} us of {len:.0} us"
            );
        }
    }
}

/// With `-o`, `{n}` in the name gives a file per interval (any format);
/// a name without it gets every interval one after the other (the report
/// and folded stacks only). The whole formats without a pattern, and -T
/// without -i, are refused in one line.
#[test]
fn a_file_per_interval() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let pid = stuck.pid.to_string();
    // Before 5.17 -i is refused, in one line that names the kernel and
    // what it lacks (the interval iterator's claims need the programs for
    // kernels with bpf_loop).
    if kernel_version() < (5, 17) || std::env::var_os("OFFCPUTIME_TEST_LEGACY").is_some() {
        let out = offcputime()
            .args(["-i", "0.5", "-p", &pid, "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("-i is not available on Linux") && err.contains("5.17"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        eprintln!("matrix: intervals refused before 5.17 (no bpf_loop)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("offcpu-{n}.svg");
    let folded = dir.path().join("all.folded");
    let out = profile(&[
        "-i",
        "0.5",
        "--states",
        "-p",
        &pid,
        "-o",
        svg.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
        "1.2",
    ]);
    assert!(out.stdout.is_empty());
    // On the default hook, not a fallback (with -i the switch hook's
    // chain of frames was once over the verifier's 512 bytes on 6.1 and
    // 6.12, and tp_btf fell back to raw_tp there).
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("could not be loaded"), "{err}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["all.folded", "offcpu-1.svg", "offcpu-2.svg", "offcpu-3.svg"],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in 1..=3 {
        let text = std::fs::read_to_string(dir.path().join(format!("offcpu-{n}.svg"))).unwrap();
        let svg = parse_svg(&text);
        assert!(
            svg.frames.iter().any(|f| f.name == "wl-stuck-sleep"),
            "offcpu-{n}.svg has no wl-stuck-sleep frame"
        );
    }
    // Three intervals (0.5, 0.5, 0.2 s) one after the other, each thread
    // [sleep] all along: 1.2 s in all.
    let lines = parse_folded(&std::fs::read(&folded).unwrap());
    for comm in STUCK {
        let got = sum_us_where(&lines, |l| l.comm() == comm && l.has("[sleep]")) as f64;
        assert!(
            (got - 1.2e6).abs() <= 10.0,
            "{comm}: {got} us of [sleep] in 1.2 s"
        );
    }

    for (args, says) in [
        (&["-i", "1", "--svg", "1"][..], "-o with {n}"),
        (
            &["-i", "1", "-o", "x.pb.gz", "1"][..],
            "needs {n} or {time}",
        ),
        (&["-T", "1"][..], "add -i"),
        (&["-i", "0", "1"][..], "must be positive"),
        (
            &["-i", "1", "--hook", "finish-task-switch", "1"][..],
            "sched_switch tracepoint",
        ),
    ] {
        let out = offcputime().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    eprintln!("matrix: intervals ok");
}

/// A block under way at an interval's end, that ends before the profiler
/// has cut the blocks at that end (held 500 ms by
/// `OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS`, as a loaded machine can), is
/// split there by its switch-in: each interval gets its own part once. A
/// thread that waits all along but for a wake-up 200 ms after each
/// interval's end (the cut not made yet) is off-CPU, interval by interval,
/// what the kernel says (within 2% of the interval), and never more than
/// the interval.
#[test]
fn a_block_ended_before_its_cut_is_split_once() {
    if !require_root() {
        return;
    }
    let _g = serial();
    const STALL_MS: u64 = 500;
    let mut waiter = PipeWaiter::start("iv-waiter");
    let clock = CpuClock::start(std::process::id(), &[waiter.tid]);
    let tid = waiter.tid.to_string();
    let stall = STALL_MS.to_string();
    let (mut child, stdout, lines, stderr) = spawn_lines(
        &["-T", "-i", "1", "-f", "-t", &tid, "3"],
        &[("OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS", &stall)],
    );
    // The window opened before this line was read: the intervals end at
    // most this much later.
    let attached = wait_for_line(&lines, "offcputime: attached ");
    let mut woken = Vec::new();
    for k in 1..=2u64 {
        let at = attached + k * 1_000_000_000 + 200_000_000;
        std::thread::sleep(Duration::from_nanos(at.saturating_sub(monotonic_ns())));
        woken.push(waiter.wake());
    }
    let status = child.wait().expect("wait for offcputime");
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let cpu = clock.finish();
    assert!(status.success(), "offcputime failed: {stderr}");
    let (_, from, to) = verbose_window(&stderr);
    for (k, &w) in woken.iter().enumerate() {
        let end = from + (k as u64 + 1) * 1_000_000_000;
        assert!(
            end < w && w < end + STALL_MS * 1_000_000,
            "wake-up {k} at {w}, not within the {STALL_MS} ms after the interval's end {end}: \
             not where the test put it"
        );
    }
    let intervals = split_intervals(&stdout);
    assert_eq!(intervals.len(), 3, "3 s in 1 s intervals\n{stderr}");
    for (k, (_, lines)) in intervals.iter().enumerate() {
        let a = from + k as u64 * 1_000_000_000;
        let b = (a + 1_000_000_000).min(to);
        let len_us = (b - a) as f64 / 1e3;
        let got = sum_us(lines, "iv-waiter") as f64;
        let expected = cpu.off_cpu_us(0, a, b);
        eprintln!("interval {k}: iv-waiter {got} us, the kernel: {expected:.0} us of {len_us:.0}");
        assert!(
            got <= len_us + 2.0,
            "interval {k}: iv-waiter {got} us off-CPU in a {len_us:.0} us interval"
        );
        assert!(
            (got - expected).abs() < 0.02 * len_us,
            "interval {k}: iv-waiter {got} us off-CPU, by the kernel's accounting {expected:.0} \
             us in a {len_us:.0} us interval"
        );
    }
}

/// New processes traced with `-i`: a program forks a child every 20 ms,
/// and each child execs it again (a new image, whose first block comes
/// before its tables: with the walk through files' tables turned off,
/// `OFFCPUTIME_NO_FILE_TABLES`, its stack is copied and walked in
/// userspace, as for a program new to the profiler) and
/// sleeps 500 ms at once under two functions of its own. Copied stacks
/// wait 300 ms for their walk (`OFFCPUTIME_TEST_STALL_COPY_WALK_MS`, as
/// the tables of a large new program take that long), so that at every
/// cut of 0.5 s intervals the copies of the children of the last 300 ms
/// still wait. Each interval is written once they are walked: in every
/// interval after the first, at least 99% of the children's sleep is under
/// their whole stack, and `-v` says that every cut's interval waited for
/// copies, that they were walked, and that no interval was written with
/// copies still waiting. The first interval also holds the sleeps under
/// way at the start of children forked while the profiler loaded: a child
/// that exits before the first events are read is gone before its
/// mappings can be, and its stack, copied by the start iterator, is
/// missed (and said to be); everything else is under the whole stack.
#[test]
fn intervals_wait_for_the_copied_stacks_they_count() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // A name of its own: the children's command is the program's name,
    // and the trace is of the whole system.
    let exe = dir.path().join("ivforker");
    std::fs::rename(build_forker(dir.path()), &exe).expect("rename the workload");
    let _forker = KillOnDrop(
        Command::new(&exe)
            .args(["10", "exec", "500"])
            .spawn()
            .expect("start forker"),
    );
    // Its parent's tables are built before the trace starts.
    std::thread::sleep(Duration::from_millis(500));
    let (out, (from, to)) = profile_window(
        &["-T", "-i", "0.5", "-f", "3"],
        &[
            ("OFFCPUTIME_TEST_STALL_COPY_WALK_MS", "300"),
            ("OFFCPUTIME_NO_FILE_TABLES", "1"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let intervals = split_intervals(&out.stdout);
    assert_eq!(intervals.len(), 6, "3 s in 0.5 s intervals\n{stderr}");
    // The children's sleeps (their kernel stacks are whole, those under
    // way at the start too).
    let sleeps = |l: &Folded| l.comm() == "ivforker" && l.has("do_nanosleep");
    // The parent sleeps straight from main.
    let parent = |l: &Folded| {
        l.pos("main")
            .is_some_and(|i| l.frames.get(i + 1).is_some_and(|f| f == "nanosleep"))
    };
    let mut all_missed = 0;
    for (k, (time, lines)) in intervals.iter().enumerate() {
        let a = from + k as u64 * 500_000_000;
        let len_us = ((a + 500_000_000).min(to) - a) as f64 / 1e3;
        let children = sum_us_where(lines, |l| sleeps(l) && !parent(l));
        let whole = sum_us_where(lines, |l| {
            sleeps(l)
                && in_order(
                    l,
                    &["main", "forker_child", "forker_child_sleep", "nanosleep"],
                )
        });
        let missed = sum_us_where(lines, |l| sleeps(l) && l.has("[Missed User Stack]"));
        eprintln!(
            "interval {k} ({time}): children asleep {children} us, {whole} us under their whole \
             stack, {missed} us missed"
        );
        // About 25 children asleep at any time.
        assert!(
            children as f64 > 2.0 * len_us,
            "interval {k}: only {children} us of the children's sleep in {len_us:.0} us\n{stderr}"
        );
        // Stacks of children gone before their mappings were read are
        // missed, and said to be: at most a 500 ms sleep each, over all
        // the intervals (in the first, children started before the trace;
        // later, children whose mappings a loaded machine read too late).
        let accounted = whole + missed;
        all_missed += missed;
        let gone = if all_missed == 0 {
            0
        } else {
            count_before(&stderr, "of processes that exited before their mappings")
        };
        if accounted * 100 < children * 99 || all_missed > gone * 500_000 {
            let mine: Vec<&Folded> = lines.iter().filter(|l| sleeps(l)).collect();
            panic!(
                "interval {k}: {whole} of {children} us of the children's sleep under their \
                 whole stack ({missed} us missed, {gone} copies of processes gone said): \
                 {mine:#?}\n{stderr}"
            );
        }
    }
    // Every cut found copies waiting (those of the children of its last
    // 300 ms), and each interval waited for them: none was written with
    // copies still waiting.
    let line = stderr
        .lines()
        .find(|l| l.contains(" waited for the stacks copied for "))
        .unwrap_or_else(|| panic!("no line of intervals waiting in:\n{stderr}"));
    let held = count_before_any(line, &["interval waited", "intervals waited"]);
    let walked = count_before(line, "walked, ");
    assert!(
        held >= 5 && walked >= 25,
        "{held} intervals waited for {walked} copies walked:\n{stderr}"
    );
    assert_eq!(count_before(line, "still waiting at the"), 0, "{stderr}");
    let copied = count_before_any(
        &stderr,
        &[
            "user stack taken before its process's tables were ready copied",
            "user stacks taken before their process's tables were ready copied",
        ],
    );
    // The forker makes 50 children a second (150 in the trace, each with
    // its first stack copied) on an idle machine; beside other tests'
    // load it made fewer (97 copies seen): at least 20 a second.
    assert!(copied >= 60, "{copied} stacks copied:\n{stderr}");
    // The copies got tables, those taken while a new image was still being
    // loaded too (its tables are read once it is loaded): at most 2% of
    // them still waiting for tables at the end (a process whose tables a
    // loaded machine had not made in the end's 5 s); with the copies of
    // the loader's early address spaces left waiting, about 5% are.
    let what = "still waiting for their tables when the trace ended";
    if stderr.contains(what) {
        let waiting = count_before(&stderr, what);
        assert!(
            waiting * 50 <= copied,
            "{waiting} of {copied} copies left waiting:\n{stderr}"
        );
    }
}
