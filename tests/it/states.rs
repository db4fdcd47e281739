//! `--states`: each block's time split by why the thread was off the CPU,
//! checked against the kernel's own accounting of every thread of the
//! `blocker` workload (`/proc/PID/task/TID/schedstat`: run time and
//! run-queue wait), on each hook.

use std::collections::BTreeMap;

use offcputime::output::{folded, svg, text, Shape};
use offcputime::profile::{sort_samples, OffState, Profile, StackMode};

use crate::golden::check;
use crate::util::*;

const STATES: [&str; 5] = ["[sleep]", "[io]", "[blocked]", "[runqueue]", "[stopped]"];

#[test]
fn states_tp_btf() {
    states("tp-btf");
}

#[test]
fn states_raw_tp() {
    states("raw-tp");
}

#[test]
fn states_kprobe() {
    on_kprobe(&["--states"], states);
}

/// Sleepers woken by a timer, a pipe write and a futex wake; a killable
/// wait (a vfork parent); three spinners on a two-CPU machine, two of them
/// pinned to one CPU. For every thread: the [runqueue] part within 2% of
/// the window of the run-queue wait the kernel counted, all parts together
/// the thread's off-CPU time by the kernel's accounting (within 2%), each
/// sleeper's time mostly [sleep], the vfork parent's [blocked].
fn states(hook: &str) {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "600", "--killable", "--pinned-spinners"]);
    let sleepers = ["wl-nanosleep", "wl-shortsleep", "wl-pipe", "wl-futex"];
    let spinners = ["wl-spin", "wl-pin-a", "wl-pin-b"];
    let comms: Vec<&str> = sleepers
        .iter()
        .chain(&spinners)
        .chain(&["wl-vfork"])
        .copied()
        .collect();
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let pid = wl.pid.to_string();
    let mut attempt = 1;
    let (out, (from, to), cpu) = loop {
        let clock = CpuClock::start(wl.pid, &tids);
        // The profiler on CPU 1, away from the two spinners pinned to CPU 0:
        // its start-up would hold them in the run queue for tens of ms, and
        // a wait under way at the window's start is added to the kernel's
        // run_delay whole, when it ends.
        let (out, window) =
            on_cpu_1(|| profile_window(&["--hook", hook, "--states", "-f", "-p", &pid, "2"], &[]));
        let cpu = clock.finish();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Under software emulation a virtual CPU can go on running code the
        // kernel has just patched (qemu's multi-threaded translation: the
        // 6.12 guest once died on a breakpoint the kernel had already
        // removed from try_to_wake_up), so a tracepoint can stay silent
        // there for a while after it is enabled. The profiler counts the
        // wake-ups it did not see; such a run measures the emulator, and is
        // made again. On real CPUs it is checked as it is.
        let unwoken = stderr
            .lines()
            .find(|l| l.contains("without the kernel reporting their wake-up"))
            .map(str::to_string);
        // Under emulation, too, a wake-up can be dated tens of
        // milliseconds away from the kernel's own clock of the run queue
        // (seen once on the 6.12 guest with the kprobe: the vfork parent's
        // [runqueue] 86 ms short over 26 switches, its off-CPU total right
        // to 1 ms, the same cell passing in the run before): that run is
        // made again too, and the last one is checked below as it is.
        let apart = || {
            let lines = parse_folded(&out.stdout);
            comms.iter().enumerate().find_map(|(i, comm)| {
                let (from, to) = window;
                let runqueue: u64 = lines
                    .iter()
                    .filter(|l| l.comm() == *comm && l.frames.get(1).is_some_and(|f| f == "[runqueue]"))
                    .map(|l| l.us)
                    .sum();
                let waited = cpu.waited_us(i, from, to);
                let bound = (to - from) as f64 / 1e3 * 0.02
                    + cpu.wait_under_way_us(i, from)
                    + cpu.wait_under_way_us(i, to)
                    + cpu.switches(i, from, to) * 1000.0;
                (*comm != "wl-spin" && (runqueue as f64 - waited).abs() >= bound).then(|| {
                    format!("{comm}: [runqueue] {runqueue} us, the kernel's run-queue wait {waited:.0} us")
                })
            })
        };
        match unwoken.or_else(|| emulated().then(apart).flatten()) {
            Some(line) if emulated() && attempt < 3 => {
                eprintln!("attempt {attempt}: {line}; once more");
                attempt += 1;
            }
            _ => break (out, window, cpu),
        }
    };
    let lines = parse_folded(&out.stdout);
    assert!(!lines.is_empty(), "no output");
    // Every line says its state, right after the command.
    for l in &lines {
        assert!(
            l.frames.len() > 1 && STATES.contains(&l.frames[1].as_str()),
            "no state frame: {l:?}"
        );
    }
    let window_us = (to - from) as f64 / 1e3;
    let by_state = |comm: &str| {
        let mut m: BTreeMap<&str, u64> = BTreeMap::new();
        for l in lines.iter().filter(|l| l.comm() == comm) {
            *m.entry(STATES.iter().find(|s| **s == l.frames[1]).unwrap())
                .or_default() += l.us;
        }
        m
    };
    // The kernel dates a thread's waits and runs a few microseconds away
    // from the tracepoints, at every switch (7 to 10 us measured on this
    // 2-CPU VM, see e2e.rs PER_SWITCH_US); under software emulation, where
    // a context switch takes hundreds of microseconds, by as much.
    let per_switch_us = if emulated() { 1000.0 } else { 12.0 };
    // How far the profiler's figures of thread `i` may be from the
    // kernel's: 2% of the window, the waits under way at its edges (the
    // kernel's run_delay has them whole; a few ms on an idle machine), and
    // the skew of every switch.
    let bound = |i: usize| {
        window_us * 0.02
            + cpu.wait_under_way_us(i, from)
            + cpu.wait_under_way_us(i, to)
            + cpu.switches(i, from, to) * per_switch_us
    };
    // The off-CPU time of thread `i` that was no wait for a CPU, by the
    // kernel's accounting.
    let waitless = |i: usize| cpu.off_cpu_us(i, from, to) - cpu.waited_us(i, from, to);
    for (i, comm) in comms.iter().enumerate() {
        let parts = by_state(comm);
        let skew = cpu.switches(i, from, to) * per_switch_us;
        let get = |s: &str| *parts.get(s).unwrap_or(&0) as f64;
        let total: f64 = parts.values().sum::<u64>() as f64;
        let runqueue = get("[runqueue]");
        let waited = cpu.waited_us(i, from, to);
        let off = cpu.off_cpu_us(i, from, to);
        eprintln!(
            "{comm}: {parts:?} = {total} us; the kernel: waited {waited:.0} us \
             (+/- {:.0} at the edges), off-CPU {off:.0} us of {window_us:.0}; {:.0} switches",
            cpu.wait_under_way_us(i, from) + cpu.wait_under_way_us(i, to),
            cpu.switches(i, from, to)
        );
        let share = |x: f64| x / window_us;
        if comm == &"wl-spin" {
            // Unpinned, it shares CPU 1 with the profiler's start-up: its
            // long wait under way at the window's start makes the kernel's
            // run_delay too large there. Never asleep, all its off-CPU
            // time is [runqueue]; checked below against the kernel's run
            // time instead.
        } else {
            // The kernel's figure is exact but for the waits under way
            // at the window's edges (a few ms on an idle machine).
            let edges = cpu.wait_under_way_us(i, from) + cpu.wait_under_way_us(i, to);
            assert!(
                (runqueue - waited).abs() < bound(i),
                "{comm}: [runqueue] {runqueue} us, the kernel's run-queue wait {waited:.0} us \
                 ({:.2}% of the window apart; waits under way at the edges: {edges:.0} us; \
                 {:.0} switches)",
                share((runqueue - waited).abs()) * 100.0,
                cpu.switches(i, from, to)
            );
        }
        if spinners.contains(comm) {
            // A spinner's run time leaves out the interrupts it took
            // (IRQ time accounting): its off-CPU time lies between its
            // run-queue wait and the window less its run time.
            assert!(
                total <= off + window_us * 0.02 + skew,
                "{comm}: {total} us off-CPU, the kernel: at most {off:.0}"
            );
            assert!(
                total >= off.min(waited) - window_us * 0.02 - skew,
                "{comm}: {total} us off-CPU, the kernel: at least {:.0}",
                off.min(waited)
            );
            assert!(
                share(total - runqueue) < 0.01,
                "{comm} never sleeps, yet {parts:?}"
            );
        } else {
            assert!(
                (total - off).abs() < window_us * 0.02 + skew,
                "{comm}: {total} us off-CPU in all states, by the kernel's accounting \
                 {off:.0} us ({:.0} switches)",
                cpu.switches(i, from, to)
            );
        }
    }
    // The sleepers' time off the CPU that was not a wait for one is
    // [sleep]: by the kernel's accounting, off-CPU time less run-queue
    // wait. (How much of the window that is depends on the machine's load:
    // under emulation beside other guests, the one that sleeps 1 ms at a
    // time waited 69% of the window for a CPU and slept 25% of it.)
    for comm in sleepers {
        let i = comms.iter().position(|c| *c == comm).unwrap();
        let parts = by_state(comm);
        let sleep = *parts.get("[sleep]").unwrap_or(&0) as f64;
        let slept = waitless(i);
        assert!(
            slept > window_us * 0.1 && sleep > slept - bound(i),
            "{comm}: {parts:?}; the kernel: off-CPU and not waiting for a CPU {slept:.0} us"
        );
    }
    // Two spinners sharing CPU 0: each waits for it about half the time.
    for comm in ["wl-pin-a", "wl-pin-b"] {
        let parts = by_state(comm);
        let rq = *parts.get("[runqueue]").unwrap_or(&0) as f64;
        assert!(rq > window_us * 0.3, "{comm}: {parts:?}");
    }
    // The vfork parent waits killably (TASK_UNINTERRUPTIBLE) for its
    // child to exit: [blocked]. It sleeps ([sleep], interruptibly) only in
    // waitpid, when the child has woken it but not finished exiting yet
    // (milliseconds under emulation).
    // Its time off the CPU that was no wait for one, by the kernel's
    // accounting, is that: under emulation beside other guests it waited
    // up to a third of the window for a CPU, so no share of the window is
    // asked of it.
    let parts = by_state("wl-vfork");
    let blocked = (*parts.get("[blocked]").unwrap_or(&0) + *parts.get("[io]").unwrap_or(&0)) as f64;
    let asleep = *parts.get("[sleep]").unwrap_or(&0) as f64;
    let i = comms.iter().position(|c| *c == "wl-vfork").unwrap();
    let waitless = waitless(i);
    assert!(
        waitless > window_us * 0.3 && blocked + asleep > waitless - bound(i),
        "wl-vfork: {parts:?}; the kernel: off-CPU and not waiting for a CPU {waitless:.0} us"
    );
    assert!(blocked > asleep * 4.0, "wl-vfork: {parts:?}");
    // (A block whose switch-in the kernel did not report has no kernel
    // stack, which is counted and said: not where it slept.)
    for l in lines.iter().filter(|l| {
        l.comm() == "wl-vfork" && l.frames[1] == "[sleep]" && !l.has("[Missed Kernel Stack]")
    }) {
        assert!(
            l.has("do_wait") || l.has("kernel_wait4"),
            "wl-vfork asleep elsewhere than in waitpid: {l:?}"
        );
    }
    for l in lines
        .iter()
        .filter(|l| l.comm() == "wl-vfork" && l.frames[1] == "[blocked]")
    {
        assert!(
            !l.has("do_wait") && !l.has("kernel_wait4"),
            "wl-vfork: waitpid counted as [blocked]: {l:?}"
        );
    }
    eprintln!("matrix: states {hook} ok");
}

/// An I/O wait is `[io]`, a killable wait `[blocked]`, and neither is the
/// other: a thread reading its program's file with O_DIRECT, 4 KiB at a
/// time (`wl-io`: each read waits for the disk, `in_iowait`), and the
/// vfork parent (`wl-vfork`, TASK_KILLABLE, not an I/O wait). On each
/// hook that reads the state at the switch-out, for each: all its states
/// together its off-CPU time by the kernel's accounting (within 2% of the
/// window); the reader `[io]` for at least a tenth of the window (about
/// half of it here, the rest its waits for a CPU) and never `[blocked]`; the vfork parent `[blocked]`
/// for at least 80% of the window and never `[io]`.
#[test]
fn io_waits_are_io_and_killable_waits_blocked() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "600", "--killable", "--io"]);
    let comms = ["wl-io", "wl-vfork"];
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let pid = wl.pid.to_string();
    for hook in ["tp-btf", "raw-tp"] {
        let clock = CpuClock::start(wl.pid, &tids);
        let (out, (from, to)) =
            profile_window(&["--hook", hook, "--states", "-f", "-p", &pid, "2"], &[]);
        let cpu = clock.finish();
        let lines = parse_folded(&out.stdout);
        let window_us = (to - from) as f64 / 1e3;
        let per_switch_us = if emulated() { 1000.0 } else { 12.0 };
        for (i, comm) in comms.iter().enumerate() {
            let state = |s: &str| {
                sum_us_where(&lines, |l| {
                    l.comm() == *comm && l.frames.get(1).is_some_and(|f| f == s)
                }) as f64
            };
            let total = sum_us(&lines, comm) as f64;
            let (io, blocked) = (state("[io]"), state("[blocked]"));
            let off = cpu.off_cpu_us(i, from, to);
            let switches = cpu.switches(i, from, to);
            let stolen = cpu.stolen_us(from, to);
            eprintln!(
                "{hook} {comm}: [io] {io} us, [blocked] {blocked} us, all {total} us; the \
                 kernel: off-CPU {off:.0} us of {window_us:.0}, {switches:.0} switches \
                 (stolen from the VM: up to {stolen:.0} us)"
            );
            // Stolen time is run time to the profile, not to the kernel.
            let slack = if total < off { stolen } else { 0.0 };
            assert!(
                (total - off).abs() < window_us * 0.02 + switches * per_switch_us + slack,
                "{hook} {comm}: {total} us off-CPU in all states, by the kernel's accounting \
                 {off:.0} us"
            );
            if *comm == "wl-io" {
                assert!(
                    io > window_us * 0.1,
                    "{hook} wl-io: [io] {io} us of its {off:.0} us off-CPU, waiting for reads"
                );
                assert_eq!(
                    blocked, 0.0,
                    "{hook} wl-io: an I/O wait counted as [blocked]"
                );
                for l in lines
                    .iter()
                    .filter(|l| l.comm() == "wl-io" && l.frames[1] == "[io]")
                {
                    assert!(
                        l.has("wl_block_io"),
                        "{hook} wl-io: [io] outside its read: {l:?}"
                    );
                }
            } else {
                assert!(
                    blocked > window_us * 0.8,
                    "{hook} wl-vfork: [blocked] {blocked} us of a {window_us:.0} us window"
                );
                assert_eq!(io, 0.0, "{hook} wl-vfork: a killable wait counted as [io]");
            }
        }
    }
}

/// Runs `f` with this thread (and so the processes it starts) on CPU 1,
/// where there is one.
fn on_cpu_1<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: plain sched_{get,set}affinity of this thread, with valid sets.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old);
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(1, &mut one);
        let moved = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0;
        let out = f();
        if moved {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &old);
        }
        out
    }
}

/// The synthetic profile of the golden tests with a state on every
/// sample, the 2 s sleeper split into its sleep and its run-queue wait.
pub fn synthetic_states() -> Profile {
    let mut p = crate::golden::synthetic();
    let mut extra = Vec::new();
    for s in &mut p.samples {
        s.state = Some(match (s.comm.as_str(), s.pid) {
            ("app", 100) => {
                let mut rq = s.clone();
                rq.state = Some(OffState::RunQueue);
                rq.total_ns = 400_000;
                s.total_ns -= rq.total_ns;
                extra.push(rq);
                OffState::Sleep
            }
            ("app", _) => OffState::Sleep,
            ("kworker/0:1", _) => OffState::Blocked,
            ("lost", 103) => OffState::Io,
            ("lost", _) => OffState::Stopped,
            _ => OffState::RunQueue,
        });
    }
    p.samples.extend(extra);
    sort_samples(&mut p.samples);
    p
}

/// `profile` in the folded, report or SVG shape (a fixed width, every
/// frame drawn, `subtitle`): what the golden files of the opt-in modes hold.
pub fn render_as(profile: &Profile, shape: Shape, format: &str, subtitle: &str) -> String {
    let mut out = Vec::new();
    match format {
        "folded" => folded::write(profile, shape, &mut out).unwrap(),
        "report" => text::write(profile, shape, &mut out).unwrap(),
        _ => svg::write(
            profile,
            shape,
            &svg::SvgOptions {
                width: Some(1200),
                min_width: 0.0,
                subtitle: Some(subtitle.into()),
                ..Default::default()
            },
            &mut out,
        )
        .unwrap(),
    }
    String::from_utf8(out).unwrap()
}

fn render(profile: &Profile, shape: Shape, format: &str) -> String {
    render_as(
        profile,
        shape,
        format,
        "synthetic profile, split by thread state",
    )
}

#[test]
fn golden_states() {
    let p = synthetic_states();
    let delimited = Shape {
        mode: StackMode::Both,
        delimited: true,
        ..Shape::default()
    };
    check(
        "synthetic-states.folded",
        &render(&p, Shape::default(), "folded"),
    );
    check("synthetic-states.txt", &render(&p, delimited, "report"));
    check("synthetic-states.svg", &render(&p, delimited, "svg"));
    // The state is the frame right after the command, and the states of
    // one thread add up to what it had without --states.
    let folded = render(&p, Shape::default(), "folded");
    assert!(folded
        .lines()
        .any(|l| l == "app;[runqueue];start_thread;worker_sleep;clock_nanosleep;hrtimer_nanosleep;do_nanosleep;schedule;__schedule 400"));
    let plain = crate::golden::synthetic();
    assert_eq!(p.total_ns(), plain.total_ns());
}

/// Each state has its own colour in the flame graph, whatever the
/// palette, and the graph's times are the folded ones.
#[test]
fn states_coloured_apart() {
    let p = synthetic_states();
    let g = parse_svg(&render(&p, Shape::default(), "svg"));
    let colours: Vec<(u8, u8, u8)> = ["[sleep]", "[io]", "[blocked]", "[runqueue]", "[stopped]"]
        .iter()
        .map(|s| g.frame(s).fill)
        .collect();
    let mut distinct = colours.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), colours.len(), "{colours:?}");
    assert_eq!(g.frame("[sleep]").fill, (60, 190, 200));
    assert_eq!(g.frame("[runqueue]").fill, (70, 190, 90));
    // Threads 100 (less its run-queue wait) and 101 asleep, and 102's
    // pipe read, in us.
    assert_eq!(g.frame("[sleep]").us, 3_001_600);
    assert_eq!(g.frame("[runqueue]").us, 400);
}

/// Blocks under way since before tracing started keep the state their
/// thread was in, and with --wakers, not woken in the window, say so.
#[test]
fn states_of_blocks_under_way_at_the_start() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let (out, (from, to)) = profile_window(
        &[
            "--states",
            "--wakers",
            "-f",
            "-p",
            &stuck.pid.to_string(),
            "1",
        ],
        &[],
    );
    let window_us = (to - from) as f64 / 1e3;
    let lines = parse_folded(&out.stdout);
    for comm in [
        "wl-stuck-cond",
        "wl-stuck-pipe",
        "wl-stuck-sleep",
        "wl-stuck-main",
    ] {
        let asleep: u64 = lines
            .iter()
            .filter(|l| l.comm() == comm && l.frames[1] == "[sleep]")
            .filter(|l| l.frames.last().map(String::as_str) == Some("[not woken]"))
            .map(|l| l.us)
            .sum();
        assert!(
            asleep as f64 >= 0.99 * window_us && asleep as f64 <= window_us + 1.0,
            "{comm}: {asleep} us [sleep] and not woken, in a {window_us:.0} us window: {lines:?}"
        );
    }
}
