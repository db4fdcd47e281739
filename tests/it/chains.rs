//! `--chains`: each block's wait followed into the threads that ended it,
//! on a workload whose chain is known (tests/workloads/chain.c): the
//! producer sleeps 20 ms and writes a pipe, the worker reads it and
//! signals a condition variable, the clients wait on it.

use crate::util::*;

const THREADS: [&str; 5] = [
    "wl-producer",
    "wl-worker",
    "wl-client0",
    "wl-client1",
    "wl-client2",
];

/// The chain workload, and its threads' ids in [`THREADS`]' order.
fn chain_workload(dir: &std::path::Path) -> (GroupChild, Vec<u32>) {
    let exe = c_workload("chain", &["-O2", "-g", "-pthread"], dir);
    let wl = GroupChild::ready(&exe, "chain did not start");
    let pid = wl.0.id();
    let mut tids = Vec::new();
    for name in THREADS {
        let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the workload's threads")
            .filter_map(|e| e.ok())
            .find(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .and_then(|e| e.file_name().to_str()?.parse().ok())
            .unwrap_or_else(|| panic!("no thread {name}"));
        tids.push(tid);
    }
    (wl, tids)
}

/// Each of [`THREADS`]' lines add up to its off-CPU time in the window by
/// the kernel's accounting (within 0.5% of the window, what a switch may
/// take, and time stolen by the host where the lines hold less).
fn each_adds_up(lines: &[Folded], cpu: &CpuSamples, (from, to): (u64, u64), stderr: &str) {
    let window_us = (to - from) as f64 / 1e3;
    let per_switch_us = if emulated() { 1000.0 } else { 12.0 };
    for (i, comm) in THREADS.iter().enumerate() {
        let total = sum_us(lines, comm) as f64;
        let off = cpu.off_cpu_us(i, from, to);
        let switches = cpu.switches(i, from, to);
        let stolen = if total < off {
            cpu.stolen_us(from, to)
        } else {
            0.0
        };
        assert!(
            (total - off).abs() <= window_us * 0.005 + switches * per_switch_us + stolen,
            "{comm}: its chains add up to {total} us, the kernel's off-CPU time is {off:.0} us \
             ({switches} switches)\n{stderr}"
        );
    }
}

/// The hops of a folded line: the frames of each, split at `--` (the
/// block's own first, its command first).
fn hops(l: &Folded) -> Vec<&[String]> {
    l.frames.split(|f| f == "--").collect()
}

/// A line's hop `i` is thread `comm` blocked in function `f`.
fn hop_is(l: &Folded, i: usize, comm: &str, f: &str) -> bool {
    hops(l)
        .get(i)
        .is_some_and(|h| h.first().is_some_and(|c| c == comm) && h.iter().any(|x| x == f))
}

/// Clients wait on the worker, which waits on the producer, which sleeps:
/// at least 90% of each client's time (but for what it and the threads it
/// waits for spent waiting for a CPU, by the kernel's accounting) ends in
/// the producer's sleep and its timer, through the worker's read; the
/// worker's in the producer's sleep; each thread's lines add up to its off-CPU time by the kernel's
/// accounting. With the filter on one client (the worker and the
/// producer filtered out, followed all the same) and one hop, the rest is
/// cut and said.
#[test]
fn chains_follow_a_wait_down_to_the_timer() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let (wl, tids) = chain_workload(dir.path());
    let pid = wl.0.id().to_string();
    let clock = CpuClock::start(wl.0.id(), &tids);
    let (out, (from, to)) = profile_window(&["--chains", "-p", &pid, "-f", "3"], &[]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    each_adds_up(&lines, &cpu, (from, to), &stderr);
    // Each block's time shared out whole: the lines add up to the blocks'.
    let followed = count_before(&stderr, " us in all") as i64;
    let shown = sum_us_where(&lines, |_| true) as i64;
    assert!(
        (shown - followed).abs() <= lines.len() as i64,
        "the chains hold {shown} us, the blocks followed {followed} us\n{stderr}"
    );
    // Only the process's threads are followed from (the main thread in
    // pause() besides the five).
    assert!(
        lines
            .iter()
            .all(|l| THREADS.contains(&l.comm()) || l.comm() == "chain"),
        "{lines:?}"
    );
    // Of a thread's time, the share its lines `keep` keep, left out the
    // time it and the threads it waits for (by their places in THREADS)
    // waited for a CPU, by the kernel's accounting (schedstat): after a
    // wake-up, that time stays at the waiting thread's stack, and a busy
    // machine makes more of it.
    let waited = |i: usize| cpu.waited_us(i, from, to) + cpu.wait_under_way_us(i, to);
    let share_of_chain = |comm: &str, on: &[usize], keep: &dyn Fn(&Folded) -> bool| {
        let waiting: f64 = on.iter().map(|&i| waited(i)).sum();
        let total = sum_us(&lines, comm) as f64;
        let kept = sum_us_where(&lines, |l| l.comm() == comm && keep(l)) as f64;
        eprintln!("{comm}: {kept} us of {total}, {waiting:.0} us waiting for CPUs down its chain");
        kept / (total - waiting).max(1.0)
    };
    let share = |comm: &str, keep: &dyn Fn(&Folded) -> bool| {
        let i = THREADS.iter().position(|t| *t == comm).expect("a thread");
        let on: Vec<usize> = match i {
            0 => vec![0],
            1 => vec![1, 0],
            _ => vec![i, 1, 0],
        };
        share_of_chain(comm, &on, keep)
    };
    let timer = |l: &Folded| l.frames.last().is_some_and(|f| f == "[timer]");
    // The producer's own sleeps end in its timer.
    let p = share("wl-producer", &|l| {
        hops(l).len() == 1 && timer(l) && l.has("producer_sleep")
    });
    assert!(p >= 0.9, "the producer's sleeps: {p:.3}\n{stderr}");
    let w = share("wl-worker", &|l| {
        hop_is(l, 0, "wl-worker", "worker_read")
            && hop_is(l, 1, "wl-producer", "producer_sleep")
            && hops(l).len() == 2
            && timer(l)
    });
    assert!(
        w >= 0.9,
        "the worker's reads in the producer's sleep: {w:.3}\n{stderr}"
    );
    for c in &THREADS[2..] {
        let through = share(c, &|l| {
            hop_is(l, 0, c, "client_wait")
                && hop_is(l, 1, "wl-worker", "worker_read")
                && hop_is(l, 2, "wl-producer", "producer_sleep")
                && hops(l).len() == 3
                && timer(l)
        });
        assert!(
            through >= 0.9,
            "{c}: {through:.3} of its time in the producer's sleep through the worker\n{stderr}"
        );
    }
    // The hops' stacks outermost first, as the block's own.
    let l = lines
        .iter()
        .find(|l| hop_is(l, 2, "wl-producer", "producer_sleep"))
        .expect("a chain to the producer");
    let h = hops(l)[2];
    let at = |f: &str| h.iter().position(|x| x == f);
    assert!(at("producer") < at("producer_sleep"), "{h:?}");

    // One client, one hop: the worker and the producer are left out by
    // the filter, and the worker's block followed all the same; deeper
    // than that is cut and said. The report and pprof carry the hops.
    let client0 = tids[2].to_string();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (out, _) = profile_window(
        &[
            "--chains",
            "--chain-depth",
            "1",
            "-t",
            &client0,
            "-o",
            &path("c.folded"),
            "-o",
            &path("c.txt"),
            "-o",
            &path("c.pb.gz"),
            "2",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&std::fs::read(path("c.folded")).expect("the folded file"));
    // The report: the hops first, innermost first, then the block's own
    // frames.
    let report = parse_report(&std::fs::read(path("c.txt")).expect("the report"));
    let longest = report.iter().max_by_key(|e| e.us).expect("an entry");
    let at = |f: &str| longest.frames.iter().position(|x| x == f);
    assert!(
        at("[deeper]") == Some(0) && at("worker_read") < at("--") && at("--") < at("client_wait"),
        "{longest:?}"
    );
    // pprof: the hops are frames of the sample's stack, leaf first.
    let mut gz = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&std::fs::read(path("c.pb.gz")).expect("pprof")[..]),
        &mut gz,
    )
    .expect("gunzip");
    let pprof: offcputime::output::profile_proto::Profile =
        prost::Message::decode(&gz[..]).expect("a pprof profile");
    let name_of_location = |id: u64| -> Vec<&str> {
        let loc = pprof
            .location
            .iter()
            .find(|l| l.id == id)
            .expect("location");
        (loc.line.iter())
            .map(|l| {
                let f = pprof.function.iter().find(|f| f.id == l.function_id);
                f.map_or("", |f| pprof.string_table[f.name as usize].as_str())
            })
            .collect()
    };
    let heaviest = pprof
        .sample
        .iter()
        .max_by_key(|s| s.value[0])
        .expect("a sample");
    let names: Vec<&str> = (heaviest.location_id.iter())
        .flat_map(|&id| name_of_location(id))
        .collect();
    let at = |f: &str| names.iter().position(|x| *x == f);
    assert!(
        at("[deeper]") == Some(0) && at("worker_read") < at("client_wait"),
        "{names:?}"
    );
    assert!(lines.iter().all(|l| l.comm() == "wl-client0"), "{lines:?}");
    let deeper = share_of(&lines, |l| {
        hop_is(l, 1, "wl-worker", "worker_read")
            && hops(l).len() == 2
            && l.frames.last().is_some_and(|f| f == "[deeper]")
    });
    assert!(deeper >= 0.9, "{deeper:.3} cut after the worker\n{stderr}");
    assert!(
        stderr.contains("went deeper than --chain-depth 1: cut there, [deeper]"),
        "{stderr}"
    );
}

/// With `-i`, each interval's chains are followed in it alone, cut at its
/// edges as the profile is: the main thread, in pause() all along, holds
/// each interval's length to the microsecond (its block under way at each
/// cut sent there, not woken by then); the clients' time ends in the
/// producer's sleep interval by interval; summed over the intervals each
/// thread's lines are its off-CPU time by the kernel's accounting.
#[test]
fn chains_are_cut_at_interval_edges() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let (wl, tids) = chain_workload(dir.path());
    let pid = wl.0.id().to_string();
    let clock = CpuClock::start(wl.0.id(), &tids);
    let (out, (from, to)) =
        profile_window(&["--chains", "-T", "-i", "1", "-f", "-p", &pid, "3"], &[]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let intervals = split_intervals(&out.stdout);
    assert_eq!(intervals.len(), 3, "{stderr}");
    let window_us = (to - from) as f64 / 1e3;
    let mut all: Vec<Folded> = Vec::new();
    for (k, (time, lines)) in intervals.iter().enumerate() {
        let len_us = if k < 2 { 1e6 } else { window_us - 2e6 };
        let main = sum_us(lines, "chain") as f64;
        let n = lines.iter().filter(|l| l.comm() == "chain").count() as f64;
        assert!(
            (main - len_us).abs() <= n + 1.0,
            "interval {k} ({time}): the main thread holds {main} us of {len_us}\n{stderr}"
        );
        for c in &THREADS[2..] {
            let through = sum_us_where(lines, |l| {
                l.comm() == *c
                    && hop_is(l, 2, "wl-producer", "producer_sleep")
                    && l.frames.last().is_some_and(|f| f == "[timer]")
            }) as f64
                / sum_us(lines, c).max(1) as f64;
            assert!(
                through >= 0.85,
                "interval {k}: {c}: {through:.3} in the producer's sleep\n{stderr}"
            );
        }
        all.extend(lines.iter().cloned());
    }
    each_adds_up(&all, &cpu, (from, to), &stderr);
}

/// With `--on-cpu`, where a wait is followed into a thread running, that
/// thread's samples there are its stacks: the first stage of a pipeline
/// (the only thread traced) waits mostly on the second working, which the
/// filter leaves out and is sampled all the same; the first stage's own
/// running time is there, the second's is not.
#[test]
fn chains_follow_into_running_samples() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let wl = pipeline(dir.path(), &[]);
    let pid = wl.0.id();
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the workload's threads")
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "wl-stage1")
        })
        .and_then(|e| e.file_name().to_str().map(str::to_string))
        .expect("wl-stage1");
    let (out, (from, to)) = profile_window(
        &["--chains", "--on-cpu", "-F", "499", "-t", &tid, "-f", "3"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    assert!(
        lines.iter().all(|l| l.comm() == "wl-stage1"),
        "only the thread traced: {lines:?}"
    );
    // Its waits go to the second stage: running, sampled or not, or (on a
    // busy machine) waiting for a CPU itself; where it was sampled, in its
    // work. (Measured on an idle machine: 0.97 of the time to the second
    // stage, 0.84 to its samples, 0.83 in its work; on a loaded one, more
    // of its runs are too short for a sample.)
    let stage2 = |l: &Folded| {
        hops(l)
            .get(1)
            .filter(|h| h.first().is_some_and(|c| c == "wl-stage2"))
            .map(|h| h.to_vec())
    };
    let running = |h: &[String]| h.get(1).is_some_and(|f| f == "[running]");
    let on_stage2 = share_of(&lines, |l| stage2(l).is_some());
    let ran = share_of(&lines, |l| stage2(l).is_some_and(|h| running(&h)));
    let sampled = share_of(&lines, |l| {
        stage2(l).is_some_and(|h| running(&h) && h.len() > 2)
    });
    let in_work = share_of(&lines, |l| {
        stage2(l).is_some_and(|h| running(&h) && h.iter().any(|f| f == "work"))
    });
    eprintln!(
        "to wl-stage2 {on_stage2:.3}, running {ran:.3}, sampled {sampled:.3}, in work {in_work:.3}"
    );
    assert!(
        on_stage2 >= 0.6 && sampled >= ran * 0.3 && in_work >= sampled * 0.9,
        "to wl-stage2 {on_stage2:.3}, running {ran:.3}, sampled {sampled:.3}, in its work \
         {in_work:.3}\n{stderr}"
    );
    // Its own running time, sampled, as --on-cpu shows it; all its time
    // is there, running and waiting.
    let own = share_of(&lines, |l| {
        hops(l).len() == 1 && l.frames.get(1).is_some_and(|f| f == "[running]")
    });
    assert!(own > 0.0, "no running samples of its own\n{stderr}");
    let total = sum_us_where(&lines, |_| true) as f64;
    let window_us = (to - from) as f64 / 1e3;
    assert!(
        (total - window_us).abs() <= window_us * 0.005,
        "{total} us of a {window_us} us window\n{stderr}"
    );
}

/// The share of all of `lines`' time in the lines `keep` keeps.
fn share_of(lines: &[Folded], keep: impl Fn(&Folded) -> bool) -> f64 {
    sum_us_where(lines, keep) as f64 / sum_us_where(lines, |_| true).max(1) as f64
}

/// `--chains` on every hook (a cell of the kernel matrix): the blocker's
/// sleepers, woken by threads that sleep 20 ms on a timer, followed into
/// them, the futex's waker in another process (outside `-p`) too; the
/// lines add up to the blocks followed; nothing lost.
#[test]
fn chains_on_every_hook() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let w = Workload::start(&["wakers"]);
    let pid = w.pid.to_string();
    let hooks = hooks_here();
    for hook in &hooks {
        let out = offcputime()
            .args(["-v", "-f", "--chains", "--hook", hook, "-p", &pid, "2"])
            .output()
            .expect("run offcputime");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{hook}: {stderr}");
        assert!(
            !stderr.contains("lost for a full ring buffer"),
            "{hook}: {stderr}"
        );
        let lines = parse_folded(&out.stdout);
        let followed = count_before(&stderr, " us in all") as i64;
        let shown = sum_us_where(&lines, |_| true) as i64;
        assert!(
            followed > 1_000_000 && (shown - followed).abs() <= lines.len() as i64,
            "{hook}: the chains hold {shown} us, the blocks followed {followed} us\n{stderr}"
        );
        let share = |comm: &str, keep: &dyn Fn(&Folded) -> bool| {
            sum_us_where(&lines, |l| l.comm() == comm && keep(l)) as f64
                / sum_us(&lines, comm).max(1) as f64
        };
        let timer = |l: &Folded| l.frames.last().is_some_and(|f| f == "[timer]");
        // (The hops by their threads: on 5.10 user stacks are walked
        // with frame pointers, which the C library has not: the caller
        // of its read or sleep is not in them.)
        for (waiter, waker) in [
            ("wl-pipe-wait", "wl-writer"),
            ("wl-cond-wait", "wl-signaller"),
            ("wl-futex-wait", "wl-futex-waker"),
        ] {
            let s = share(waiter, &|l| {
                hops(l).get(1).is_some_and(|h| h[0] == waker) && hops(l).len() == 2 && timer(l)
            });
            let mut top: Vec<&Folded> = lines.iter().filter(|l| l.comm() == waiter).collect();
            top.sort_by_key(|l| std::cmp::Reverse(l.us));
            assert!(
                s >= 0.75,
                "{hook}: {s:.3} of {waiter}'s time in {waker}'s sleep; its longest lines: \
                 {:?}\n{stderr}",
                &top[..top.len().min(3)]
            );
        }
        let t = share("wl-timer-wait", &|l| hops(l).len() == 1 && timer(l));
        assert!(
            t >= 0.75,
            "{hook}: wl-timer-wait's own timer {t:.3}\n{stderr}"
        );
        // With -i (from 5.17, on the tracepoints) and --on-cpu: the
        // interval iterator's and the sampler's builds for --chains load
        // and send.
        let args = ["-f", "--chains", "--on-cpu", "--hook", hook, "-p", &pid];
        let run = |args: &[&str]| offcputime().args(args).arg("2").output().expect("run");
        let mut out = run(&[&args[..], &["-i", "1"]].concat());
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // (-i is refused before 5.17, and with the kprobe.)
        if stderr.contains("-i is not available on Linux")
            || stderr.contains("-i needs the sched_switch tracepoint")
        {
            out = run(&args);
            stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        }
        assert!(out.status.success(), "{hook}: {stderr}");
        let lines = parse_folded(&out.stdout);
        assert!(
            lines.iter().any(|l| hops(l).len() > 1)
                && lines
                    .iter()
                    .any(|l| l.frames.get(1).is_some_and(|f| f == "[running]")),
            "{hook}: no chains or no running samples\n{stderr}"
        );
    }
    eprintln!("matrix: chains on {}", hooks.join(", "));
}

/// `tests/workloads/pipeline.c` with `args`, once it says "ready".
fn pipeline(dir: &std::path::Path, args: &[&str]) -> GroupChild {
    let exe = c_workload("pipeline", &["-O2", "-g", "-pthread"], dir);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    GroupChild::ready_with(&exe, &args, "pipeline did not start")
}

/// Where the chains meet many threads, the threads of a pool are one node
/// of the graph: 48 clients of `chain.c` ("wl-client0" to "wl-client47")
/// are the node "wl-client (48 threads)", whose wait for the worker holds
/// most of their time; the producer's timer is the knot.
#[test]
fn graph_groups_a_pool_of_threads() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let exe = c_workload("chain", &["-O2", "-g", "-pthread"], dir.path());
    let wl = GroupChild::ready_with(&exe, &["48".as_ref()], "chain did not start");
    let pid = wl.0.id().to_string();
    let dot = dir.path().join("g.dot");
    let (out, (from, to)) = profile_window(
        &["--graph", "-p", &pid, "-o", dot.to_str().unwrap(), "3"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&dot).expect("the DOT file");
    assert!(
        text.contains("wl-client (48 threads)"),
        "no node of the 48 clients\n{text}\n{stderr}"
    );
    assert!(!text.contains("wl-client0"), "a client of its own\n{text}");
    let (knots, edges) = read_dot(&text);
    assert_eq!(knots, ["[timer]"], "{text}\n{stderr}");
    let window_ms = (to - from) as f64 / 1e6;
    let waited: f64 = (edges.iter())
        .filter(|e| e.0 == "wl-client" && e.1 == "wl-worker")
        .map(|e| e.2)
        .sum();
    // (Each client waits nearly all the window for the worker.)
    assert!(
        waited >= 48.0 * window_ms * 0.5,
        "the clients waited {waited} ms for the worker in a {window_ms} ms window\n{text}"
    );
}

/// The nodes of a DOT file that are in a knot, by name (up to " (" or the
/// label's first line's end), and
/// its edges with their weights in ms, by the nodes' names.
fn read_dot(text: &str) -> (Vec<String>, Vec<(String, String, f64)>) {
    let mut names = std::collections::HashMap::new();
    let mut knots = Vec::new();
    let mut edges = Vec::new();
    for line in text.lines().map(str::trim) {
        let Some((id, rest)) = line.split_once(' ') else {
            continue;
        };
        if let Some(label) = rest.strip_prefix("[label=\"") {
            let name = label
                .split(" (")
                .next()
                .and_then(|n| n.split("\\n").next())
                .unwrap_or("")
                .to_string();
            if rest.contains("class=\"knot\"") {
                knots.push(name.clone());
            }
            names.insert(id.to_string(), name);
        } else if let Some(to) = rest.strip_prefix("-> ") {
            let (to, attrs) = to.split_once(' ').expect("an edge's attributes");
            let ms: f64 = attrs
                .split("label=\"")
                .nth(1)
                .and_then(|l| l.split(" ms").next())
                .and_then(|v| v.parse().ok())
                .expect("an edge's time");
            edges.push((names[id].clone(), names[to].clone(), ms));
        }
    }
    (knots, edges)
}

/// A three-stage pipeline whose middle stage works 2 ms of CPU on each
/// item: the first stage waits for room, the last for items, both for the
/// middle one, which waits for nobody: `--graph`'s knot, first on stderr,
/// the edges into it most of the window. Two threads handing a token back
/// and forth wait for each other in turn: their knot is both; the chains
/// keep every block's time whole.
#[test]
fn graph_knots_a_slow_stage_and_a_ping_pong() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let wl = pipeline(dir.path(), &[]);
    let dot = dir.path().join("p.dot");
    let pid = wl.0.id().to_string();
    let (out, (from, to)) = profile_window(
        &["--graph", "-p", &pid, "-o", dot.to_str().unwrap(), "3"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&dot).expect("the DOT file");
    let (knots, edges) = read_dot(&text);
    // The knot is the middle stage. Under load the last stage falls
    // behind at moments and the middle one waits for room: the last joins
    // the knot then, waited on a small part of the time the middle one is.
    let waited_on = |node: &str| -> f64 { edges.iter().filter(|e| e.1 == node).map(|e| e.2).sum() };
    assert!(knots.iter().any(|k| k == "wl-stage2"), "{text}\n{stderr}");
    for k in knots.iter().filter(|k| *k != "wl-stage2") {
        assert!(
            waited_on(k) <= waited_on("wl-stage2") * 0.1,
            "{k} in the knot, waited on {} ms\n{text}\n{stderr}",
            waited_on(k)
        );
    }
    let first = stderr
        .lines()
        .find(|l| l.contains("  1. "))
        .unwrap_or_else(|| panic!("no knot said\n{stderr}"));
    assert!(first.contains("waited on wl-stage2 ("), "{stderr}");
    let window_ms = (to - from) as f64 / 1e6;
    for stage in ["wl-stage1", "wl-stage3"] {
        let ms: f64 = (edges.iter())
            .filter(|e| e.0 == stage && e.1 == "wl-stage2")
            .map(|e| e.2)
            .sum();
        assert!(
            ms >= window_ms * 0.5,
            "{stage} waited {ms} ms of {window_ms} for wl-stage2\n{text}"
        );
    }
    drop(wl);

    let wl = pipeline(dir.path(), &["pingpong"]);
    let pid = wl.0.id().to_string();
    let folded = dir.path().join("pp.folded");
    let (out, _) = profile_window(
        &[
            "--graph",
            "-p",
            &pid,
            "-o",
            dot.to_str().unwrap(),
            "-o",
            folded.to_str().unwrap(),
            "3",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&dot).expect("the DOT file");
    let (mut knots, edges) = read_dot(&text);
    knots.sort();
    assert_eq!(knots, ["wl-ping", "wl-pong"], "{text}\n{stderr}");
    for (a, b) in [("wl-ping", "wl-pong"), ("wl-pong", "wl-ping")] {
        assert!(
            edges.iter().any(|e| e.0 == a && e.1 == b && e.2 > 100.0),
            "{a} -> {b}\n{text}"
        );
    }
    let lines = parse_folded(&std::fs::read(&folded).expect("the folded file"));
    let followed = count_before(&stderr, " us in all") as i64;
    let shown = sum_us_where(&lines, |_| true) as i64;
    assert!(
        (shown - followed).abs() <= lines.len() as i64,
        "the chains hold {shown} us, the blocks followed {followed} us\n{stderr}"
    );
}

/// Waiters on a mutex whose holder writes 4 KiB with O_DIRECT and
/// fdatasync()s it, over and over (tests/workloads/diskwait.c): the
/// waiters' time is followed into the holder's writes, and from there to
/// the disk's completions; the graph's heaviest knot is `[disk]`.
#[test]
fn chains_end_in_the_disk() {
    if !require_root() {
        return;
    }
    let _g = serial();
    // On the disk the build is on (a tmpfs has no O_DIRECT).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory");
    let exe = c_workload("diskwait", &["-O2", "-g", "-pthread"], dir.path());
    let wl = GroupChild::ready_with(&exe, &[dir.path().as_os_str()], "diskwait did not start");
    let pid = wl.0.id().to_string();
    let (out, _) = profile_window(&["--graph", "-p", &pid, "-f", "3"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let share = |comm: &str, keep: &dyn Fn(&Folded) -> bool| {
        sum_us_where(&lines, |l| l.comm() == comm && keep(l)) as f64
            / sum_us(&lines, comm).max(1) as f64
    };
    let disk = |l: &Folded| l.frames.last().is_some_and(|f| f.starts_with("[disk"));
    let named = format!("[disk {}]", disk_of(dir.path()));
    let on_named = |l: &Folded| l.frames.last().is_some_and(|f| *f == named);
    let in_holder = |l: &Folded| hop_is(l, 1, "wl-holder", "write_through");
    let own = share("wl-holder", &|l| {
        hops(l).len() == 1 && l.has("write_through") && disk(l)
    });
    eprintln!("wl-holder: {own:.3} of its time its own writes, ending in [disk]");
    // (Measured on an idle machine: about 0.55 of the holder's time, and
    // of each waiter's 0.58 in the holder's writes, 0.45 ending in
    // [disk]; the rest is running and waiting for a CPU, which a loaded
    // machine makes more of.)
    assert!(own >= 0.2, "wl-holder: {own:.3}\n{stderr}");
    // The disk named: that of the file written (measured: 99.9% of the
    // time ending in a disk; the rest, a flush's completion whose disk was
    // not seen, is [disk]).
    let named_share =
        sum_us_where(&lines, on_named) as f64 / sum_us_where(&lines, |l| disk(l)).max(1) as f64;
    assert!(
        named_share >= 0.75,
        "{named_share:.3} of the disk time ends in {named}\n{stderr}"
    );
    for w in ["wl-waiter0", "wl-waiter1"] {
        let through = share(w, &|l| hop_is(l, 0, w, "wait_turn") && in_holder(l));
        let to_disk = share(w, &|l| in_holder(l) && disk(l));
        eprintln!("{w}: {through:.3} in the holder's writes, {to_disk:.3} ending in [disk]");
        assert!(
            through >= 0.35 && to_disk >= 0.15,
            "{w}: {through:.3} in the holder's writes, {to_disk:.3} ending in [disk]\n{stderr}"
        );
    }
    let first = stderr
        .lines()
        .find(|l| l.contains("  1. "))
        .unwrap_or_else(|| panic!("no knot said\n{stderr}"));
    assert!(first.contains(&format!("waited on {named}")), "{stderr}");
    // Every wake-up seen: on Linux 6.12 and later a thread blocked in a
    // delayed dequeue is still on its run queue when it is woken (about
    // one I/O wait in nine here was taken for no block's end).
    let unseen: f64 = stderr
        .split("% ending in a wake-up not seen")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no share of wake-ups not seen\n{stderr}"));
    assert!(
        unseen <= 3.0,
        "{unseen}% of the time ends in a wake-up not seen\n{stderr}"
    );
}

/// A thread that sleeps after using more than its share of a CPU: on
/// Linux 6.12 and later the scheduler leaves it on its run queue (a
/// delayed dequeue) until its timer wakes it. That wake-up ends its block
/// all the same: its waker is the timer, not a wake-up unseen (before
/// this was known, three quarters of its time ended in `[unknown]`; now
/// none, and about 0.3 in its sleep's `[timer]`, the rest waiting for the
/// CPU beside the spinner). On older kernels the same holds without the
/// delay.
#[test]
fn wake_ups_of_threads_in_a_delayed_dequeue_are_seen() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let exe = c_workload("delayed", &["-O2", "-g", "-pthread"], dir.path());
    let wl = GroupChild::ready(&exe, "delayed did not start");
    let pid = wl.0.id().to_string();
    let (out, _) = profile_window(&["--chains", "-p", &pid, "-f", "2"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let total = sum_us(&lines, "wl-burst") as f64;
    let unknown = sum_us_where(&lines, |l| {
        l.comm() == "wl-burst" && l.frames.last().is_some_and(|f| f == "[unknown]")
    }) as f64;
    let timer = sum_us_where(&lines, |l| {
        l.comm() == "wl-burst"
            && l.has("burst_sleep")
            && l.frames.last().is_some_and(|f| f == "[timer]")
    }) as f64;
    assert!(
        total > 100_000.0 && unknown <= total * 0.02 && timer >= total * 0.15,
        "wl-burst: {total} us off-CPU, {unknown} us ending in [unknown], {timer} us in its \
         sleep's [timer]\n{stderr}"
    );
}

/// The disk a directory's file system is on, as the kernel names it (a
/// partition's disk).
fn disk_of(dir: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).expect("the directory").dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}"))
        .unwrap_or_else(|e| panic!("no block device {major}:{minor} for {dir:?}: {e}"));
    let disk = if sys.join("partition").exists() {
        sys.parent().expect("a partition's disk").to_path_buf()
    } else {
        sys
    };
    disk.file_name().unwrap().to_string_lossy().into_owned()
}
