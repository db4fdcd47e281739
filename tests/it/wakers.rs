//! `--wakers`: each block with the stacks of the task that woke it, in bcc
//! `offwaketime`'s folded shape, checked on the `blocker wakers` workload
//! (sleepers woken by known functions of known threads, one of them in
//! another process, and one by its timer alone) on each hook.

use std::collections::BTreeMap;

use offcputime::output::Shape;
use offcputime::profile::{sort_samples, Frame, OffState, Part, Profile, StackMode, Waker};

use crate::golden::check;
use crate::svg::{flamegraph_pl, run_tool, same_brackets};
use crate::util::*;

#[test]
fn wakers_tp_btf() {
    wakers("tp-btf");
}

#[test]
fn wakers_raw_tp() {
    wakers("raw-tp");
}

#[test]
fn wakers_kprobe() {
    on_kprobe(&["--wakers"], wakers);
}

/// One folded line split at `--`: the blocked thread's frames (command
/// first) and the waker's (innermost first, its name last).
fn split(l: &Folded) -> (&[String], &[String]) {
    let at = l
        .frames
        .iter()
        .position(|f| f == "--")
        .unwrap_or_else(|| panic!("no -- in {l:?}"));
    (&l.frames[..at], &l.frames[at + 1..])
}

/// The profiler's stderr.
fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each sleeper's time by the name of its waker.
fn by_waker(lines: &[Folded], comm: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for l in lines.iter().filter(|l| l.comm() == comm) {
        let (_, waker) = split(l);
        *m.entry(waker.last().unwrap().clone()).or_default() += l.us;
    }
    m
}

fn wakers(hook: &str) {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["wakers"]);
    // The process of wl-futex-waker traced too: its unwind tables are then
    // built before tracing starts (a waker's process first seen waking
    // has its first stacks walked with frame pointers, as any new
    // process's first blocks).
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", wl.pid))
        .expect("children of the workload");
    let child: u32 = children
        .split_whitespace()
        .next()
        .and_then(|c| c.parse().ok())
        .expect("the futex waker's pid");
    let pid = format!("{},{child}", wl.pid);
    let (out, (from, to)) = profile_window(
        &[
            "--hook", hook, "--wakers", "--states", "-f", "-p", &pid, "2",
        ],
        &[],
    );
    let window_us = (to - from) as f64 / 1e3;
    // Before 5.17 user stacks are walked with frame pointers (said, and
    // checked): glibc's functions, built without them, hide their callers,
    // the workload's functions below; the wakers and their kernel stacks
    // are the same.
    let fp_only = frame_pointers_only(&String::from_utf8_lossy(&out.stderr));
    let lines = parse_folded(&out.stdout);
    assert!(!lines.is_empty(), "no output");
    for l in &lines {
        // The state right after the command, one `--`, a waker name last.
        let (blocked, waker) = split(l);
        assert!(blocked.len() > 1 && blocked[1].starts_with('['), "{l:?}");
        assert!(!waker.is_empty(), "{l:?}");
    }
    // (sleeper, its waker's name, a function the waker's stack must hold,
    // its own blocking function)
    let cases = [
        (
            "wl-cond-wait",
            "wl-signaller",
            "wake_by_signal",
            "wl_block_signalled",
        ),
        (
            "wl-pipe-wait",
            "wl-writer",
            "wake_by_write",
            "wl_block_written",
        ),
        (
            "wl-futex-wait",
            "wl-futex-waker",
            "wake_by_futex",
            "wl_block_shared_futex",
        ),
        (
            "wl-timer-wait",
            "[interrupt]",
            "hrtimer_wakeup",
            "wl_block_timer",
        ),
    ];
    for (sleeper, waker, function, blocks_in) in cases {
        let wakers = by_waker(&lines, sleeper);
        let total: u64 = wakers.values().sum();
        let by_it = *wakers.get(waker).unwrap_or(&0);
        eprintln!("{sleeper}: {wakers:?}");
        assert!(
            by_it as f64 > window_us * 0.8,
            "{sleeper}: only {by_it} us of {total} woken by {waker}: {wakers:?}"
        );
        // Its sleep ([sleep]) is woken by the waker's function, the
        // waker's stack innermost first from the wake-up itself.
        let woken: u64 = lines
            .iter()
            .filter(|l| l.comm() == sleeper && l.frames[1] == "[sleep]")
            .filter(|l| {
                let (blocked, w) = split(l);
                // (An interrupt's function is the kernel's.)
                let user_function = waker != "[interrupt]";
                w.last().unwrap() == waker
                    && w.iter().any(|f| f == "try_to_wake_up")
                    && (fp_only && user_function || w.iter().any(|f| f == function))
                    && (fp_only || blocked.iter().any(|f| f == blocks_in))
            })
            .map(|l| l.us)
            .sum();
        if woken as f64 <= window_us * 0.7 {
            let mut mine: Vec<&Folded> = lines.iter().filter(|l| l.comm() == sleeper).collect();
            mine.sort_by_key(|l| std::cmp::Reverse(l.us));
            // What the profiler said of its user stacks first (a log
            // keeps the end of a failure's output), then the lines.
            let stderr = stderr_of(&out);
            let said: Vec<&str> = stderr
                .lines()
                .filter(|l| l.contains("unwind") || l.contains("user stack"))
                .collect();
            panic!(
                "{sleeper}: {woken} us asleep in {blocks_in} and woken by {function} of \
                 {waker}; the profiler said:\n{}\nits lines: {:#?}",
                said.join("\n"),
                &mine[..mine.len().min(3)]
            );
        }
    }
    // An interrupt's frames stop at its entry, and it has no user part.
    for l in lines
        .iter()
        .filter(|l| l.frames.last().unwrap() == "[interrupt]")
    {
        let (_, w) = split(l);
        let entry = w
            .iter()
            .position(|f| f.starts_with("asm_sysvec_") || f == "asm_common_interrupt")
            .unwrap_or_else(|| panic!("no interrupt entry in {l:?}"));
        assert_eq!(entry, w.len() - 2, "{l:?}");
    }
    // The woken part of a sleep is [runqueue] with the same waker; a
    // preempted block has none.
    assert!(lines
        .iter()
        .any(|l| l.frames[1] == "[runqueue]" && split(l).1.last().unwrap() == "wl-signaller"));
    for l in lines.iter().filter(|l| split(l).1 == ["[preempted]"]) {
        assert_eq!(l.frames[1], "[runqueue]", "{l:?}");
    }
    eprintln!("matrix: wakers {hook} ok");
}

/// The same workload in the report and with -U/-K/-d, and the folded lines
/// drawn by flamegraph.pl and inferno-flamegraph unchanged, as
/// offwaketime's are.
#[test]
fn wakers_shapes_and_flame_graph_tools() {
    if !require_root() {
        return;
    }
    let (Some(pl), Some(inferno)) = (flamegraph_pl(), require_tool("inferno-flamegraph", &[]))
    else {
        return;
    };
    let _g = serial();
    let wl = Workload::start(&["wakers"]);
    let pid = wl.pid.to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["--wakers", "-p", &pid];
        args.extend_from_slice(extra);
        args.push("1");
        profile(&args).stdout
    };
    // -d: a `-` between the user and kernel parts, the waker's too.
    let d = parse_folded(&run(&["-f", "-d"]));
    let pipe = d
        .iter()
        .filter(|l| l.comm() == "wl-pipe-wait" && l.frames.last().unwrap() == "wl-writer")
        .max_by_key(|l| l.us)
        .expect("the pipe reader woken by the writer");
    let (blocked, waker) = split(pipe);
    assert!(blocked.iter().any(|f| f == "-"), "{pipe:?}");
    let dash = waker.iter().position(|f| f == "-").expect("waker's -");
    assert!(waker[..dash].iter().any(|f| f == "anon_pipe_write"));
    assert!(waker[dash..].iter().any(|f| f == "wake_by_write"));
    // -U: no kernel frames on either side; -K: no user frames.
    for l in parse_folded(&run(&["-f", "-U"])) {
        assert!(
            !l.frames
                .iter()
                .any(|f| f == "try_to_wake_up" || f == "schedule"),
            "{l:?}"
        );
    }
    for l in parse_folded(&run(&["-f", "-K"])) {
        assert!(!l.frames.iter().any(|f| f.starts_with("wake_by_")), "{l:?}");
    }
    // The report: the waker's line, its frames, `--`, then the sleeper's.
    let report = String::from_utf8(run(&[])).unwrap();
    assert!(report.contains("waker:           wl-writer ("), "{report}");
    assert!(report.contains("    --               --"), "{report}");
    // The flame graph tools draw exactly the folded lines.
    let f = run(&["-f"]);
    let folded = String::from_utf8(f).unwrap();
    let pl_svg = parse_svg(&run_tool(&pl, &["--minwidth=0", "--countname=us"], &folded));
    let inferno_svg = parse_svg(&run_tool(
        &inferno,
        &["--minwidth", "0", "--countname", "us"],
        &folded,
    ));
    assert_eq!(
        same_brackets(pl_svg.frame_set()),
        same_brackets(inferno_svg.frame_set())
    );
    let woken_by_write: u64 = inferno_svg
        .frames
        .iter()
        .filter(|f| f.name == "wake_by_write")
        .map(|f| f.us)
        .sum();
    assert!(woken_by_write > 500_000, "{woken_by_write}");
    // --svg: the waker's frames in a colour family of their own.
    let ours = parse_svg(&String::from_utf8(run(&["--svg"])).unwrap());
    let w = ours.frame("wake_by_write").fill;
    let k = ours.frame("anon_pipe_read").fill;
    assert!(w.1 > 200 && w.2 < 140, "waker frame {w:?}");
    assert_ne!(w, k);
}

/// The synthetic profile of the golden tests with a waker on every sample.
pub fn synthetic_wakers() -> Profile {
    let mut p = crate::states::synthetic_states();
    let frames = |names: &[&str]| Part::Frames(names.iter().map(|&s| Frame::named(s)).collect());
    for s in &mut p.samples {
        s.waker = Some(match (s.comm.as_str(), s.pid, s.state) {
            (_, _, Some(OffState::RunQueue)) if s.pid != 100 => Waker::Preempted,
            ("app", 100 | 101, _) => Waker::Interrupt {
                kernel: frames(&[
                    "try_to_wake_up",
                    "hrtimer_wakeup",
                    "__hrtimer_run_queues",
                    "hrtimer_interrupt",
                    "asm_sysvec_apic_timer_interrupt",
                ]),
            },
            ("app", _, _) => Waker::Task {
                comm: "writer".into(),
                pid: 200,
                user: frames(&["write", "wake_by_write", "main"]),
                kernel: frames(&["try_to_wake_up", "__wake_up_common", "pipe_write"]),
            },
            ("kworker/0:1", _, _) => Waker::Softirq {
                kernel: frames(&["try_to_wake_up", "call_timer_fn", "handle_softirqs"]),
            },
            ("lost", 103, _) => Waker::Missed,
            ("lost", _, _) => Waker::NotWoken,
            _ => Waker::Unseen,
        });
    }
    sort_samples(&mut p.samples);
    p
}

fn render(profile: &Profile, shape: Shape, format: &str) -> String {
    crate::states::render_as(profile, shape, format, "synthetic profile, with wakers")
}

#[test]
fn golden_wakers() {
    let p = synthetic_wakers();
    let delimited = Shape {
        mode: StackMode::Both,
        delimited: true,
        ..Shape::default()
    };
    check("synthetic-wakers.folded", &render(&p, delimited, "folded"));
    check("synthetic-wakers.txt", &render(&p, delimited, "report"));
    check("synthetic-wakers.svg", &render(&p, delimited, "svg"));
    let folded = render(&p, Shape::default(), "folded");
    // offwaketime's order: the blocked thread root first, `--`, the
    // waker innermost first, its name last.
    let want = "app;[sleep];main;reader_loop;read;vfs_read;pipe_read;schedule;__schedule;--;\
                try_to_wake_up;__wake_up_common;pipe_write;write;wake_by_write;main;writer 1500";
    assert!(
        folded.lines().any(|l| l == want),
        "no {want:?} in\n{folded}"
    );
    // Interrupts have no user part and their own name.
    assert!(folded
        .lines()
        .any(|l| l.contains(";--;try_to_wake_up;hrtimer_wakeup;__hrtimer_run_queues;hrtimer_interrupt;asm_sysvec_apic_timer_interrupt;[interrupt] ")));
    assert_eq!(p.total_ns(), crate::golden::synthetic().total_ns());
}

/// What a task's stacks make of the waker: an interrupt or a softirq cut at
/// its entry, else the task.
#[test]
fn interrupts_and_softirqs_are_not_the_interrupted_task() {
    let frames = |names: &[&str]| Part::Frames(names.iter().map(|&s| Frame::named(s)).collect());
    let user = frames(&["spin", "main"]);
    let irq = Waker::classify(
        "busy".into(),
        7,
        user.clone(),
        frames(&[
            "try_to_wake_up",
            "hrtimer_wakeup",
            "asm_sysvec_apic_timer_interrupt",
            "spin_in_kernel",
            "do_syscall_64",
        ]),
    );
    assert_eq!(
        irq,
        Waker::Interrupt {
            kernel: frames(&[
                "try_to_wake_up",
                "hrtimer_wakeup",
                "asm_sysvec_apic_timer_interrupt"
            ])
        }
    );
    let soft = Waker::classify(
        "busy".into(),
        7,
        user.clone(),
        frames(&[
            "try_to_wake_up",
            "call_timer_fn",
            "handle_softirqs",
            "irq_exit_rcu",
            "asm_sysvec_apic_timer_interrupt",
        ]),
    );
    assert!(matches!(soft, Waker::Softirq { .. }), "{soft:?}");
    // A page fault is the task's own doing.
    let task = Waker::classify(
        "app".into(),
        7,
        user,
        frames(&["try_to_wake_up", "handle_mm_fault", "asm_exc_page_fault"]),
    );
    assert!(matches!(task, Waker::Task { .. }), "{task:?}");
}

/// pprof keeps the waker's name as a label of each sample (its stacks are
/// not a call chain of the blocked thread's); speedscope stacks it on top,
/// as the folded lines do.
#[test]
fn wakers_in_pprof_and_speedscope() {
    use offcputime::output::{pprof, speedscope};
    let p = synthetic_wakers();
    let pb = pprof::build(&p, Shape::default(), &pprof::PprofOptions::default());
    let s = |i: i64| pb.string_table[i as usize].as_str();
    let mut wakers: Vec<&str> = pb
        .sample
        .iter()
        .map(|sample| {
            let l = sample
                .label
                .iter()
                .find(|l| s(l.key) == "waker")
                .expect("every sample has a waker label");
            s(l.str)
        })
        .collect();
    wakers.sort();
    wakers.dedup();
    for want in ["writer", "[interrupt]", "[softirq]", "[not woken]"] {
        assert!(wakers.contains(&want), "{wakers:?}");
    }
    let mut out = Vec::new();
    speedscope::write(&p, Shape::default(), &Default::default(), &mut out).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let frames: Vec<&str> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for want in ["--", "wake_by_write", "writer", "[interrupt]"] {
        assert!(frames.contains(&want), "{frames:?}");
    }
}
