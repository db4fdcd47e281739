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
/// at least 90% of each client's time ends in the producer's sleep and its
/// timer, through the worker's read; the worker's in the producer's
/// sleep; each thread's lines add up to its off-CPU time by the kernel's
/// accounting. With the filter on one client (the worker and the
/// producer filtered out, followed all the same) and one hop, the rest is
/// cut and said.
#[test]
fn chains_follow_a_wait_down_to_the_timer() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let (wl, tids) = chain_workload(dir.path());
    let pid = wl.0.id().to_string();
    let clock = CpuClock::start(wl.0.id(), &tids);
    let (out, (from, to)) = profile_window(&["--chains", "-p", &pid, "-f", "3"], &[]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let window_us = (to - from) as f64 / 1e3;
    let per_switch_us = if emulated() { 1000.0 } else { 12.0 };
    for (i, comm) in THREADS.iter().enumerate() {
        let total = sum_us(&lines, comm) as f64;
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
    let share = |comm: &str, keep: &dyn Fn(&Folded) -> bool| {
        sum_us_where(&lines, |l| l.comm() == comm && keep(l)) as f64
            / sum_us(&lines, comm).max(1) as f64
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
    // than that is cut and said.
    let client0 = tids[2].to_string();
    let (out, _) = profile_window(
        &["--chains", "--chain-depth", "1", "-t", &client0, "-f", "2"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
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
    let w = Workload::start(&["wakers"]);
    let pid = w.pid.to_string();
    let mut hooks = vec!["tp-btf", "raw-tp"];
    // (Where the kernel has no kprobes, the e2e tests check that the hook
    // says so; the matrix line names the hooks this test ran.)
    if has_kprobes() {
        hooks.push("finish-task-switch");
    }
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
        for (waiter, waits_in, waker) in [
            ("wl-pipe-wait", "wl_block_written", "wl-writer"),
            ("wl-cond-wait", "wl_block_signalled", "wl-signaller"),
            ("wl-futex-wait", "wl_block_shared_futex", "wl-futex-waker"),
        ] {
            let s = share(waiter, &|l| {
                hop_is(l, 0, waiter, waits_in)
                    && hop_is(l, 1, waker, "nanosleep")
                    && hops(l).len() == 2
                    && timer(l)
            });
            assert!(
                s >= 0.75,
                "{hook}: {s:.3} of {waiter}'s time in {waker}'s sleep\n{stderr}"
            );
        }
        let t = share("wl-timer-wait", &|l| hops(l).len() == 1 && timer(l));
        assert!(
            t >= 0.75,
            "{hook}: wl-timer-wait's own timer {t:.3}\n{stderr}"
        );
    }
    eprintln!("matrix: chains on {}", hooks.join(", "));
}
