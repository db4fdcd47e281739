//! `--timeline FILE`: the blocks in time, as a Perfetto trace read with
//! Perfetto's own protos (PyPI's `perfetto`, `tests/perfetto_read.py`,
//! which also checks what the trace processor needs of a trace). On a chain
//! of waits with known lengths (`tests/workloads/chain.c`: a producer that
//! sleeps 20 ms then writes a pipe, a worker that reads it and wakes the
//! clients through a condition variable): each thread's slices add up to
//! its off-CPU time in the folded output of the same run, each sleep of the
//! producer is one slice of 20 ms, and the blocks carry flows from the
//! wake-ups that ended them, on the waker's track with its stack. Under a
//! switch storm with the records read too late: those lost are counted and
//! said, and every block the profile counts is in the trace or among them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::util::*;

/// Where `scripts/setup --test` installs PyPI's perfetto.
const VENV_PYTHON: &str = "/opt/offcputime-test/perfetto-venv/bin/python3";

/// A Python that imports Perfetto's trace protos. Outside CI, none skips
/// the test; under CI=true it fails.
fn perfetto_python() -> Option<PathBuf> {
    python_with(
        VENV_PYTHON,
        "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        "perfetto",
    )
}

/// `tests/perfetto_read.py FILE`: the trace as JSON; the script must accept
/// it.
fn read_trace(python: &Path, file: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/perfetto_read.py");
    let out = Command::new(python)
        .arg(script)
        .arg(file)
        .output()
        .expect("run perfetto_read.py");
    assert!(
        out.status.success(),
        "perfetto_read.py refused {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("perfetto_read.py prints JSON")
}

/// A slice of the trace.
#[derive(Debug)]
struct Slice {
    tid: u64,
    ts: u64,
    dur: u64,
    name: String,
    category: String,
    stack: Vec<String>,
    args: HashMap<String, Value>,
    flows_in: Vec<u64>,
}

impl Slice {
    fn clipped(&self) -> bool {
        self.args.contains_key("under way at the start")
            || self.args.contains_key("under way at the end")
    }

    /// A wait of its own (not a preemption), whole in the window.
    fn whole_sleep(&self) -> bool {
        !self.clipped() && self.category == "sleep"
    }
}

/// A wake-up (or an on-CPU sample): an instant on a track.
#[derive(Debug)]
struct Instant {
    track: Value,
    ts: u64,
    stack: Vec<String>,
    category: Option<String>,
    flows_out: Vec<u64>,
}

struct Trace {
    /// Thread name by tid.
    threads: HashMap<u64, String>,
    slices: Vec<Slice>,
    instants: Vec<Instant>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

impl Trace {
    fn read(python: &Path, file: &Path) -> Trace {
        let v = read_trace(python, file);
        let threads = v["threads"]
            .as_array()
            .expect("threads")
            .iter()
            .map(|t| {
                (
                    t["tid"].as_u64().expect("tid"),
                    t["name"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let slices = v["slices"]
            .as_array()
            .expect("slices")
            .iter()
            .map(|s| Slice {
                tid: s["tid"].as_u64().expect("tid"),
                ts: s["ts"].as_u64().expect("ts"),
                dur: s["dur"].as_u64().expect("dur"),
                name: s["name"].as_str().unwrap_or("").to_string(),
                category: s["category"].as_str().unwrap_or("").to_string(),
                stack: strings(&s["stack"]),
                args: s["args"]
                    .as_object()
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default(),
                flows_in: numbers(&s["flows_in"]),
            })
            .collect();
        let instants = v["instants"]
            .as_array()
            .expect("instants")
            .iter()
            .map(|i| Instant {
                track: i["track"].clone(),
                ts: i["ts"].as_u64().expect("ts"),
                stack: strings(&i["stack"]),
                category: i["category"].as_str().map(str::to_string),
                flows_out: numbers(&i["flows_out"]),
            })
            .collect();
        Trace {
            threads,
            slices,
            instants,
        }
    }

    fn slices_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Slice> + 'a {
        self.slices
            .iter()
            .filter(move |s| self.threads.get(&s.tid).is_some_and(|n| n == name))
    }

    fn tid_of(&self, name: &str) -> u64 {
        *self
            .threads
            .iter()
            .find(|(_, n)| *n == name)
            .unwrap_or_else(|| panic!("no thread {name} in the trace"))
            .0
    }

    /// The wake-up each flow comes from.
    fn wakeups(&self) -> HashMap<u64, &Instant> {
        self.instants
            .iter()
            .flat_map(|i| i.flows_out.iter().map(move |f| (*f, i)))
            .collect()
    }
}

/// A workload of `tests/workloads/` started in a directory of its own,
/// with the Python that reads traces (None: the test is skipped).
struct Run {
    dir: tempfile::TempDir,
    wl: GroupChild,
    python: PathBuf,
    /// One BPF test at a time (util::serial), let go after the workload
    /// is gone: the last field, dropped last.
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Run {
    fn start(workload: &str) -> Option<Run> {
        if !require_root() {
            return None;
        }
        let python = perfetto_python()?;
        let serial = serial();
        let dir = tempfile::tempdir().expect("temporary directory");
        let exe = c_workload(workload, &["-O2", "-g", "-pthread"], dir.path());
        let wl = GroupChild::ready(&exe, &format!("{workload} did not start"));
        Some(Run {
            dir,
            wl,
            python,
            _serial: serial,
        })
    }

    fn pid(&self) -> String {
        self.wl.0.id().to_string()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `offcputime ARGS --timeline TRACE SECONDS` with `env`, which must
    /// succeed: its output, its stderr and the trace read.
    fn profile(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        seconds: &str,
    ) -> (std::process::Output, String, Trace) {
        let trace = self.path("trace.pftrace");
        let out = offcputime()
            .args(args)
            .arg("--timeline")
            .arg(&trace)
            .arg(seconds)
            .envs(env.iter().copied())
            .output()
            .expect("run offcputime");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let t = Trace::read(&self.python, &trace);
        (out, stderr, t)
    }
}

const CHAIN_THREADS: [&str; 5] = [
    "wl-producer",
    "wl-worker",
    "wl-client0",
    "wl-client1",
    "wl-client2",
];

/// The share of `slices` (none clipped at the window's ends) that a flow
/// reaches from a wake-up on `track` whose stack has `frame`.
fn woken_from(t: &Trace, slices: &[&Slice], track: &Value, frame: &str) -> f64 {
    let wakeups = t.wakeups();
    let from = slices
        .iter()
        .filter(|s| {
            s.flows_in.iter().any(|f| {
                wakeups
                    .get(f)
                    .is_some_and(|i| &i.track == track && i.stack.iter().any(|x| x == frame))
            })
        })
        .count();
    from as f64 / slices.len().max(1) as f64
}

#[test]
fn timeline_of_a_chain_of_waits() {
    let Some(run) = Run::start("chain") else {
        return;
    };
    let (folded, svg) = (run.path("chain.folded"), run.path("chain.svg"));
    let (folded_arg, svg_arg) = (folded.to_str().unwrap(), svg.to_str().unwrap());
    let (_, stderr, t) = run.profile(
        &[
            "-p",
            &run.pid(),
            "-m",
            "1000",
            "-o",
            folded_arg,
            "-o",
            svg_arg,
        ],
        &[],
        "4",
    );
    assert!(svg.is_file(), "the flame graph of the same run");
    let written = count_before_any(&stderr, &[" blocks of at least 1 ms"]);
    let lines = parse_folded(&std::fs::read(&folded).expect("the folded output"));
    assert_eq!(t.slices.len() as u64, written, "{stderr}");

    // Each thread's slices add up to its off-CPU time in the profile.
    for name in CHAIN_THREADS {
        let slices_ns: u64 = t.slices_of(name).map(|s| s.dur).sum();
        let folded_ns = sum_us(&lines, name) * 1000;
        let off = slices_ns.abs_diff(folded_ns) as f64 / folded_ns.max(1) as f64;
        assert!(
            folded_ns > 3_000_000_000 && off <= 0.005,
            "{name}: slices {slices_ns} ns, folded {folded_ns} ns\n{stderr}"
        );
        // Sleeps, and where the machine is busy preemptions (runnable
        // all along, no waker).
        for s in t.slices_of(name) {
            assert_eq!(s.args["state"], s.category.as_str(), "{s:?}");
            assert!(
                s.category == "sleep"
                    || (s.category == "runqueue" && s.args["waker"] == "[preempted]"),
                "{name}: {s:?}"
            );
        }
    }

    // A block under way at the end was not woken, or was woken and still
    // waited for a CPU there (its waker named, a thread with its tid, or
    // the interrupt or softirq that woke it, as a sleep's timer does; no
    // flow drawn); every other block's wake-up came after it began.
    let wakeups = t.wakeups();
    for s in &t.slices {
        if s.args.contains_key("under way at the end") {
            let waker = s.args["waker"].as_str().unwrap_or_default();
            assert!(
                s.flows_in.is_empty()
                    && (["[not woken]", "[interrupt]", "[softirq]"].contains(&waker)
                        || s.args.contains_key("waker tid")),
                "{s:?}"
            );
        }
        for f in &s.flows_in {
            let i = wakeups.get(f).expect("a flow's wake-up");
            assert!(
                (i.ts >= s.ts || s.args.contains_key("under way at the start"))
                    && i.ts < s.ts + s.dur,
                "a wake-up outside its block: {i:?} {s:?}"
            );
        }
    }

    // Each of the producer's sleeps is a slice of 20 ms until its wake-up
    // (its timer's: then it waits for a CPU until the slice ends), named
    // by its function, with its whole stack.
    let producer: Vec<&Slice> = t
        .slices_of("wl-producer")
        .filter(|s| s.whole_sleep())
        .collect();
    assert!(producer.len() >= 150, "{} sleeps in 4 s", producer.len());
    // (A wake-up that interrupts the wake-up hook on its CPU is missed by
    // the kernel's guard against a program running inside itself: the
    // block's waker is then unknown.)
    // A sleep is never shorter than its 20 ms (less the timer's slack);
    // on a virtual machine, whose CPUs its host may hold up, a few wake
    // late.
    let (mut woken, mut on_time) = (0, 0);
    for s in &producer {
        if let Some(i) = s.flows_in.first().and_then(|f| wakeups.get(f)) {
            woken += 1;
            let to_wake = i.ts - s.ts;
            assert!(
                to_wake >= 18_000_000 && to_wake <= s.dur,
                "a sleep of the producer is 20 ms to its wake-up: {s:?}"
            );
            on_time += u64::from(to_wake <= 22_000_000);
        } else {
            assert_eq!(s.args["waker"], "[unknown waker]", "{s:?}");
        }
        assert_eq!(s.name, "producer_sleep", "{s:?}");
        let at = |f: &str| s.stack.iter().position(|x| x == f);
        assert!(
            at("producer") < at("producer_sleep") && at("producer").is_some(),
            "the stack, outermost first: {:?}",
            s.stack
        );
        // (A kernel stack due at a switch-in the kernel did not report is
        // lost, and said.)
        let last = s.stack.last().map_or("", String::as_str);
        assert!(
            last.contains("schedule") || last == "[Missed Kernel Stack]",
            "the kernel frames last: {:?}",
            s.stack
        );
    }
    let missed = (t.slices.iter())
        .filter(|s| s.stack.last().is_some_and(|f| f == "[Missed Kernel Stack]"))
        .count() as u64;
    assert!(missed <= unseen_kernel_stacks(&stderr), "{stderr}");
    // Its timer's interrupt wakes it.
    let interrupts = Value::String("interrupts".into());
    let by_timer = woken_from(&t, &producer, &interrupts, "hrtimer_wakeup");
    assert!(
        by_timer >= 0.9,
        "{by_timer} of the producer's sleeps woken by its timer"
    );

    // The worker's blocks are ended by the producer's writes: flows from
    // instants on the producer's track, with its stack.
    assert!(
        woken as f64 >= producer.len() as f64 * 0.9 && on_time as f64 >= woken as f64 * 0.95,
        "{woken} of {} sleeps of the producer with their wake-up, {on_time} of them 20 ms \
         ±2 ms",
        producer.len()
    );
    let mut durations: Vec<u64> = producer.iter().map(|s| s.dur).collect();
    durations.sort_unstable();
    let median = durations[durations.len() / 2];
    assert!(
        (19_000_000..=21_000_000).contains(&median),
        "the producer's sleeps last {median} ns"
    );
    // (The worker also waits, now and then, for the mutex a client
    // holds: those blocks are named by the worker's own function.)
    let worker: Vec<&Slice> = t
        .slices_of("wl-worker")
        .filter(|s| s.whole_sleep())
        .collect();
    assert!(
        worker
            .iter()
            .all(|s| s.name == "worker_read" || s.name == "worker"),
        "{worker:?}"
    );
    let worker: Vec<&Slice> = worker
        .into_iter()
        .filter(|s| s.name == "worker_read")
        .collect();
    assert!(worker.len() >= 150, "{} reads in 4 s", worker.len());
    let producer_track = Value::from(t.tid_of("wl-producer"));
    let by_producer = woken_from(&t, &worker, &producer_track, "producer");
    assert!(
        by_producer >= 0.9,
        "{by_producer} of the worker's blocks from the producer"
    );
    assert!(
        worker
            .iter()
            .all(|s| s.args.get("waker tid") == Some(&producer_track)
                || s.args["waker"] == "[unknown waker]"),
        "{worker:?}"
    );
    // ... and the clients' by the worker's broadcast.
    let worker_track = Value::from(t.tid_of("wl-worker"));
    for c in ["wl-client0", "wl-client1", "wl-client2"] {
        let client: Vec<&Slice> = t.slices_of(c).filter(|s| s.whole_sleep()).collect();
        assert!(client.len() >= 150, "{c}: {} blocks", client.len());
        assert!(client.iter().all(|s| s.name == "client_wait"), "{client:?}");
        let by_worker = woken_from(&t, &client, &worker_track, "worker");
        assert!(
            by_worker >= 0.9,
            "{by_worker} of {c}'s blocks from the worker"
        );
    }
}

/// With `--on-cpu`, the samples of the threads on their tracks; with `-i`,
/// a block cut at an interval's end is one slice.
#[test]
fn timeline_with_on_cpu_samples_and_intervals() {
    let Some(run) = Run::start("chain") else {
        return;
    };
    let (out, stderr, t) = run.profile(
        &[
            "-p",
            &run.pid(),
            "-m",
            "1000",
            "-f",
            "--on-cpu",
            "-F",
            "997",
            "-i",
            "0.5",
        ],
        &[],
        "3",
    );
    let samples = count_before_any(&stderr, &[" on-CPU samples and", " on-CPU sample and"]);
    let running: Vec<&Instant> = t
        .instants
        .iter()
        .filter(|i| i.category.as_deref() == Some("running"))
        .collect();
    assert_eq!(running.len() as u64, samples, "{stderr}");
    assert!(
        running.iter().all(|i| !i.stack.is_empty()),
        "each sample with its stack"
    );
    // The profile's intervals, summed per thread, against the slices (a
    // block cut at an interval's end is one slice: none of the
    // producer's is cut short).
    let lines = parse_folded(&out.stdout);
    for name in CHAIN_THREADS {
        let slices_ns: u64 = t.slices_of(name).map(|s| s.dur).sum();
        let folded_ns = sum_us_where(&lines, |l| l.comm() == name && !l.has("[running]")) * 1000;
        let off = slices_ns.abs_diff(folded_ns) as f64 / folded_ns.max(1) as f64;
        assert!(
            off <= 0.005,
            "{name}: slices {slices_ns} ns, intervals {folded_ns} ns\n{stderr}"
        );
    }
    // The producer's sleeps, whole: none cut at an interval's end.
    let wakeups = t.wakeups();
    let producer: Vec<&Slice> = t
        .slices_of("wl-producer")
        .filter(|s| s.whole_sleep())
        .collect();
    assert!(producer.len() >= 100, "{} sleeps in 3 s", producer.len());
    // A sleep cut at an interval's end would be shorter than 18 ms; a
    // late wake-up is the machine's (a loaded VM wakes a few late), so
    // 95% are held to 22 ms.
    let timed: Vec<u64> = producer
        .iter()
        .filter_map(|s| Some(wakeups.get(s.flows_in.first()?)?.ts - s.ts))
        .collect();
    assert!(timed.len() * 10 >= producer.len() * 9, "{producer:?}");
    assert!(
        producer.iter().all(|s| s.dur >= 18_000_000) && timed.iter().all(|&w| w >= 18_000_000),
        "none cut short: {producer:?}"
    );
    let on_time = timed.iter().filter(|&&w| w <= 22_000_000).count();
    assert!(
        on_time * 100 >= timed.len() * 95,
        "{on_time} of {} on time: {producer:?}",
        timed.len()
    );
}

/// Under a switch storm, the records read too late (the reader stalled)
/// are lost, counted and said; every block the profile counts is in the
/// trace or among them.
#[test]
fn timeline_records_lost_are_counted_and_said() {
    let Some(run) = Run::start("kouter") else {
        return;
    };
    let (_, stderr, t) = run.profile(
        &["-p", &run.pid(), "-f", "-v", "--timeline-min", "1"],
        &[
            ("OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS", "0"),
            ("OFFCPUTIME_TEST_TIMELINE_RING_KB", "64"),
        ],
        "3",
    );
    let written = count_before_any(&stderr, &[" blocks of at least 0.001 ms"]);
    let lost = count_before_any(&stderr, &[" records (blocks or samples) lost"]);
    let counted = count_before_any(&stderr, &[" blocks, "]);
    assert!(lost > 0, "the ring buffer overflowed: {stderr}");
    assert_eq!(
        written + lost,
        counted,
        "every block counted is written or lost: {stderr}"
    );
    assert_eq!(t.slices.len() as u64, written);
}

/// The kernel matrix's cell (`scripts/vmtest`): on every hook, the blocks
/// of `blocker wakers` of at least 1 ms are sent and written with their
/// wake-ups, exactly the blocks the profile counts with `-m 1000`: none
/// lost, none made up. The trace is read by the tests above, on this
/// machine (the VMs have no Python).
#[test]
fn timeline_on_every_hook() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let w = Workload::start(&["wakers"]);
    let pid = w.pid.to_string();
    let hooks = hooks_here();
    for hook in &hooks {
        let trace = dir.path().join(format!("{hook}.pftrace"));
        let out = offcputime()
            .args([
                "-v",
                "-f",
                "-m",
                "1000",
                "--hook",
                hook,
                "-p",
                &pid,
                "--timeline",
            ])
            .arg(&trace)
            .arg("2")
            .output()
            .expect("run offcputime");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{hook}: {stderr}");
        let written = count_before_any(&stderr, &[" blocks of at least 1 ms"]);
        let counted = count_before_any(&stderr, &[" blocks, "]);
        let wakeups = count_before_any(&stderr, &[" wake-ups written", " wake-up written"]);
        assert!(
            written == counted && written >= 20 && wakeups >= 10,
            "{hook}: {written} blocks written, {counted} counted, {wakeups} wake-ups\n{stderr}"
        );
        assert!(
            !stderr.contains("lost for a full ring buffer"),
            "{hook}: {stderr}"
        );
        let size = std::fs::metadata(&trace).map_or(0, |m| m.len());
        assert!(size > 1000, "{hook}: the trace is {size} bytes");
    }
    eprintln!("matrix: timeline on {}", hooks.join(", "));
}

/// The filters apply to the timeline as to the profile: `-t`, `--state`
/// and `-M` keep the producer's and the worker's sleeps of at most 25 ms.
#[test]
fn timeline_follows_the_filters() {
    let Some(run) = Run::start("chain") else {
        return;
    };
    let tid = |name: &str| -> u64 {
        std::fs::read_dir(format!("/proc/{}/task", run.pid()))
            .expect("the workload's threads")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .find(|t| {
                std::fs::read_to_string(format!("/proc/{}/task/{t}/comm", run.pid()))
                    .is_ok_and(|c| c.trim() == name)
            })
            .unwrap_or_else(|| panic!("no thread {name}"))
    };
    let (producer, worker) = (tid("wl-producer"), tid("wl-worker"));
    let threads = format!("{producer},{worker}");
    let (_, stderr, t) = run.profile(&["-t", &threads, "--state", "1", "-M", "25000"], &[], "2");
    assert!(t.slices.len() >= 150, "{} slices\n{stderr}", t.slices.len());
    for s in &t.slices {
        assert!(
            (s.tid == producer || s.tid == worker) && s.category == "sleep" && s.dur <= 25_000_000,
            "{s:?}"
        );
    }
}
