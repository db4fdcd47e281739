//! Output formats against golden files in tests/data.  Re-bless with
//! `BLESS=1 cargo test golden`.

use std::path::PathBuf;

use offcputime::output::{folded, text, Shape};
use offcputime::profile::{sort_samples, Frame, Part, Profile, Sample, StackMode};

fn frames(names: &[&str]) -> Part {
    Part::Frames(names.iter().map(|&s| Frame::named(s)).collect())
}

/// A small profile with every case the formats distinguish: user + kernel,
/// a kernel thread, missed stacks, two threads that fold into one line, a
/// thread with its runtime's name, and a block shorter than half a
/// microsecond.
pub fn synthetic() -> Profile {
    let s = |comm: &str, pid: u32, user: Part, kernel: Part, total_ns: u64| Sample {
        comm: comm.to_string(),
        tgid: pid,
        pid,
        thread: None,
        user,
        kernel,
        state: None,
        waker: None,
        container: None,
        total_ns,
        count: 1,
    };
    let sleep_user = || frames(&["clock_nanosleep", "worker_sleep", "start_thread"]);
    let sleep_kernel = || {
        frames(&[
            "__schedule",
            "schedule",
            "do_nanosleep",
            "hrtimer_nanosleep",
        ])
    };
    let mut samples = vec![
        s("app", 100, sleep_user(), sleep_kernel(), 2_000_400_000),
        s("app", 101, sleep_user(), sleep_kernel(), 1_000_100_000),
        // A thread its runtime names beyond the kernel's 15 characters.
        Sample {
            thread: Some("app-pipe-reader-thread-1".into()),
            ..s(
                "app",
                102,
                frames(&["read", "reader_loop", "main"]),
                frames(&["__schedule", "schedule", "pipe_read", "vfs_read"]),
                1_500_000,
            )
        },
        s(
            "kworker/0:1",
            7,
            Part::Absent,
            frames(&["__schedule", "schedule", "worker_thread", "kthread"]),
            250_000,
        ),
        s(
            "lost",
            103,
            Part::Missed,
            frames(&["__schedule", "schedule", "futex_wait"]),
            3_000,
        ),
        s("lost", 104, frames(&["poll", "main"]), Part::Missed, 2_000),
        s("tiny", 105, frames(&["main"]), frames(&["__schedule"]), 400),
    ];
    sort_samples(&mut samples);
    Profile {
        samples,
        ..Default::default()
    }
}

pub fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    if std::env::var_os("BLESS").is_some() {
        // Blessing rewrites the expected output instead of checking it: a
        // CI run must never do that, and a run by hand must not pass
        // silently.
        assert!(
            !crate::util::is_ci(),
            "BLESS is set under CI=true: {name} would be rewritten instead of checked"
        );
        let old = std::fs::read_to_string(&path).ok();
        std::fs::write(&path, actual).expect("write golden file");
        eprintln!(
            "BLESS: {} {} (NOT CHECKED: this run compares nothing)",
            path.display(),
            match old {
                Some(o) if o == actual => "rewritten unchanged",
                Some(_) => "CHANGED",
                None => "created",
            }
        );
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} missing: run with BLESS=1", path.display()));
    assert_eq!(
        actual, expected,
        "{name} differs from the golden file (BLESS=1 to update)"
    );
}

fn render(shape: Shape, folded_format: bool) -> String {
    let mut out = Vec::new();
    if folded_format {
        folded::write(&synthetic(), shape, &mut out).unwrap();
    } else {
        text::write(&synthetic(), shape, &mut out).unwrap();
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn golden_folded() {
    check("synthetic.folded", &render(Shape::default(), true));
    check(
        "synthetic-delimited.folded",
        &render(
            Shape {
                mode: StackMode::Both,
                delimited: true,
                ..Shape::default()
            },
            true,
        ),
    );
    check(
        "synthetic-user.folded",
        &render(
            Shape {
                mode: StackMode::UserOnly,
                delimited: true,
                ..Shape::default()
            },
            true,
        ),
    );
    check(
        "synthetic-kernel.folded",
        &render(
            Shape {
                mode: StackMode::KernelOnly,
                delimited: false,
                ..Shape::default()
            },
            true,
        ),
    );
}

#[test]
fn golden_report() {
    check("synthetic.txt", &render(Shape::default(), false));
    check(
        "synthetic-delimited.txt",
        &render(
            Shape {
                mode: StackMode::Both,
                delimited: true,
                ..Shape::default()
            },
            false,
        ),
    );
}

#[test]
fn folded_merges_threads_and_rounds_once() {
    let lines = folded::lines(&synthetic(), Shape::default(), false);
    // Threads 100 and 101 fold into one line: 3000.5 ms summed in ns,
    // rounded once.
    let (stack, us) = &lines[0];
    assert_eq!(stack, "app;start_thread;worker_sleep;clock_nanosleep;hrtimer_nanosleep;do_nanosleep;schedule;__schedule");
    assert_eq!(*us, 3_000_500);
    // The block shorter than half a microsecond is not a line.
    assert!(lines.iter().all(|(s, _)| !s.starts_with("tiny")));
}

#[test]
fn frame_names_cannot_break_folded_lines() {
    let mut p = synthetic();
    let i = p
        .samples
        .iter()
        .position(|s| s.total_ns == 2_000_400_000)
        .expect("the 2 s sample");
    p.samples[i].user = frames(&["operator;weird", "main"]);
    let mut out = Vec::new();
    folded::write(&p, Shape::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    for line in text.lines() {
        assert!(!line.contains("operator;weird"), "{line}");
    }
    // The frame is still there, as one frame with the `;` replaced, in
    // its place in its own line with its own time.
    let want = "app;main;operator:weird;hrtimer_nanosleep;do_nanosleep;schedule;__schedule 2000400";
    assert!(
        text.lines().any(|l| l == want),
        "no line {want:?} in\n{text}"
    );
}

#[test]
fn profiler_frames_are_recognised() {
    use offcputime::profile::is_profiler_frame;
    for f in [
        "bpf_prog_6deef7357e7b4530_sched_switch_btf",
        "bpf_trace_run4",
        "__traceiter_sched_switch",
        "bpf_trace_run4+0x5a",
    ] {
        assert!(is_profiler_frame(f), "{f}");
    }
    for f in [
        "__schedule",
        "schedule",
        "bpf_map_lookup_elem",
        "finish_task_switch.isra.0",
    ] {
        assert!(!is_profiler_frame(f), "{f}");
    }
}

/// The profiler's frames on top of a kernel stack are dropped even where
/// the program's own is misnamed (kallsyms read without it).
#[test]
fn profiler_frames_on_top_of_a_stack() {
    use offcputime::profile::profiler_frames;
    fn stack(s: &str) -> Vec<&str> {
        s.split(';').collect()
    }
    for (frames, ours) in [
        (
            "bpf_prog_1_sched_switch_btf;bpf_trace_run4;__schedule;schedule",
            2,
        ),
        ("handshake_exit;bpf_trace_run4;__schedule;schedule", 2),
        (
            "handshake_exit;bpf_prog_1_f;bpf_trace_run4;__traceiter_sched_switch;__schedule",
            4,
        ),
        ("__schedule;schedule;do_nanosleep", 0),
        ("finish_task_switch.isra.0;__schedule;schedule", 0),
        // Deeper than the profiler's frames can be: not its own.
        ("a;b;c;d;e;f;bpf_trace_run4", 0),
    ] {
        assert_eq!(profiler_frames(stack(frames)), ours, "{frames}");
    }
}

/// `-i` to one output: each interval after the other, `-T`'s time line
/// before each, a blank line after each report.
#[test]
fn golden_intervals() {
    use offcputime::intervals::write_part;
    for (name, report) in [
        ("synthetic-intervals.txt", true),
        ("synthetic-intervals.folded", false),
    ] {
        let mut out = Vec::new();
        for time in ["10:00:01", "10:00:02"] {
            write_part(&mut out, Some(time), report, |o| {
                if report {
                    text::write(&synthetic(), Shape::default(), o)
                } else {
                    folded::write(&synthetic(), Shape::default(), o)
                }
            })
            .unwrap();
        }
        check(name, &String::from_utf8(out).unwrap());
    }
}
