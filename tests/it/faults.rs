//! Faults survived: too little stack storage, the profiler killed, signals
//! mid-run. (Closed pipes and missing privileges are in e2e.rs.)

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::util::*;

/// A child process, killed and reaped if the test ends before it does.
struct Reaped(Option<Child>);

impl Reaped {
    fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sets a flag when dropped: stops a helper thread however the test ends.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The profiler started in the background with `-v`, once it has attached.
struct Running {
    child: Reaped,
    /// All of stderr, once the process has ended.
    stderr: JoinHandle<String>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        Running::start_with_env(args, &[])
    }

    fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Running {
        let (child, stderr, rx) = spawn_verbose(args, env);
        let child = Reaped(Some(child));
        rx.recv_timeout(Duration::from_secs(20))
            .expect("offcputime did not attach");
        Running { child, stderr }
    }

    /// IDs of the BPF programs the process holds (from its fds' fdinfo).
    fn prog_ids(&self) -> Vec<u32> {
        let dir = format!("/proc/{}/fdinfo", self.child.id());
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(dir).expect("fdinfo").flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                if let Some(id) = line.strip_prefix("prog_id:") {
                    ids.push(id.trim().parse().unwrap());
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the exit: (status, stdout, stderr).
    fn finish(mut self) -> (std::process::ExitStatus, Vec<u8>, String) {
        let child = self.child.0.take().expect("running");
        let out = child.wait_with_output().expect("wait");
        (out.status, out.stdout, self.stderr.join().unwrap())
    }
}

/// What bpftool shows of the programs with these IDs.
#[derive(Debug)]
struct Listed {
    /// The IDs `bpftool prog show id N` succeeds for.
    progs: Vec<u32>,
    /// How many of them a link refers to.
    linked: usize,
}

fn listed(bpftool: &Path, ids: &[u32]) -> Listed {
    let progs = ids
        .iter()
        .copied()
        .filter(|id| {
            let out = std::process::Command::new(bpftool)
                .args(["prog", "show", "id", &id.to_string()])
                .output()
                .expect("bpftool");
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).starts_with(&format!("{id}: "))
        })
        .collect();
    let links = std::process::Command::new(bpftool)
        .args(["-j", "link", "show"])
        .output()
        .expect("bpftool");
    assert!(links.status.success(), "bpftool link show failed");
    let links = String::from_utf8_lossy(&links.stdout);
    let linked = ids
        .iter()
        .filter(|id| links.contains(&format!("\"prog_id\":{id},")))
        .count();
    Listed { progs, linked }
}

/// The programs with these IDs that bpftool still lists, and the links
/// that still refer to them; waits up to 5 s for the kernel to free them.
fn still_loaded(bpftool: &Path, ids: &[u32]) -> Option<Listed> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = listed(bpftool, ids);
        if left.progs.is_empty() && left.linked == 0 {
            return None;
        }
        if Instant::now() > deadline {
            return Some(left);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn no_program_left_attached_after_exit_ctrl_c_or_kill_9() {
    if !require_root() {
        return;
    }
    let Some(bpftool) = require_tool("bpftool", &["/usr/sbin/bpftool".into()]) else {
        return;
    };
    let _g = serial();
    for (how, args, sig) in [
        ("normal exit", &["-f", "2"][..], None),
        ("SIGINT", &["-f"][..], Some(libc::SIGINT)),
        ("SIGKILL", &["-f"][..], Some(libc::SIGKILL)),
    ] {
        let run = Running::start(args);
        let ids = run.prog_ids();
        // The switch hook, and the iterator loaded beside it.
        assert!(!ids.is_empty(), "{how}: no BPF program held");
        // The positive control: while the profiler runs, bpftool lists
        // every one of its programs, and a link attaches one of them (a
        // bpftool that cannot list anything would pass the check below).
        let listed = listed(&bpftool, &ids);
        assert_eq!(
            listed.progs, ids,
            "{how}: bpftool lists only {listed:?} of {ids:?}"
        );
        assert!(
            listed.linked > 0,
            "{how}: bpftool shows no link to any of {ids:?}"
        );
        if let Some(sig) = sig {
            std::thread::sleep(Duration::from_millis(300));
            run.signal(sig);
        }
        let (status, _, stderr) = run.finish();
        match sig {
            Some(libc::SIGKILL) => assert!(!status.success()),
            _ => assert!(status.success(), "{how}: {stderr}"),
        }
        let left = still_loaded(&bpftool, &ids);
        assert!(left.is_none(), "{how}: still loaded: {left:?}");
    }
}

#[test]
fn stack_storage_too_small() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "30"]);
    let comms = ["wl-nanosleep", "wl-pipe", "wl-futex"];
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let clock = CpuClock::start(wl.pid, &tids);
    // The workload alone has far more than 8 distinct stacks (the spinner
    // is preempted at a different address each time), and its sleepers
    // block so often that some of their stacks are among the first stored
    // (system-wide, which 8 stacks are stored first is chance).
    let pid = wl.pid.to_string();
    let out = profile(&["-v", "-f", "-p", &pid, "--stack-storage-size", "8", "3"]);
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (_, from, to) = verbose_window(&stderr);
    let lines = parse_folded(&out.stdout);

    // Lost stacks are counted and reported, with the hint.
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("WARNING: "))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        warning.contains("stack traces could not be displayed")
            && warning.contains("Consider increasing --stack-storage-size"),
        "{warning}"
    );
    let missed: u64 = warning
        .trim_start_matches("WARNING: ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let placeholders = lines
        .iter()
        .filter(|l| l.has("[Missed User Stack]") || l.has("[Missed Kernel Stack]"))
        .count() as u64;
    assert!(missed > 0 && placeholders > 0, "{warning}");
    assert!(
        placeholders <= missed,
        "{placeholders} lines with a missed stack, {missed} reported"
    );

    // No time is lost with the stacks: each blocking thread's total is
    // still within 2% of the window of the kernel's accounting.
    check_blocked_threads(&lines, &cpu, &comms, (from, to), "");
    // The stacks that were kept are whole and the right ones: a line whose
    // user stack was kept has the kernel stack of the same block, of the
    // call its wl_block_* function makes and no other sleep (and a
    // preempted spinner none of a sleep).
    let sleeps = ["do_nanosleep", "pipe_read|anon_pipe_read", "futex_wait"];
    let expected = [
        ("wl_block_nanosleep", sleeps[0]),
        ("wl_block_shortsleep", sleeps[0]),
        ("wl_block_feeder_sleep", sleeps[0]),
        ("wl_block_pipe_read", sleeps[1]),
        ("wl_block_futex_wait", sleeps[2]),
    ];
    let has_any = |l: &Folded, alts: &str| alts.split('|').any(|f| l.has(f));
    let mut whole = 0;
    for l in &lines {
        if l.has("[Missed User Stack]") || l.has("[Missed Kernel Stack]") {
            continue;
        }
        if let Some((_, kernel)) = expected.iter().find(|(user, _)| l.has(user)) {
            // (A thread can also be preempted in its wl_block_* function,
            // before the call: a kernel stack of no sleep.)
            for other in sleeps.iter().filter(|s| *s != kernel) {
                assert!(!has_any(l, other), "mismatched stack {:?}", l.frames);
            }
            if has_any(l, kernel) {
                whole += 1;
            }
        } else if l.has("wl_spin_thread") {
            assert!(
                !sleeps.iter().any(|s| has_any(l, s)),
                "mismatched stack {:?}",
                l.frames
            );
        }
    }
    assert!(
        whole > 0,
        "no line of a sleeping thread with both stacks kept, nothing checked: {lines:?}"
    );
}

/// The frames of the stacks in each of the stack tables of the running
/// profiler `pid` (by the tables' names): how many each stack has.
fn stored_stack_lengths(pid: u32) -> std::collections::BTreeMap<String, Vec<usize>> {
    use libbpf_rs::MapCore;
    let mut ids = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the profiler's fds")
        .flatten()
    {
        let is_map =
            std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().contains("bpf-map"));
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ));
        if let (true, Ok(info)) = (is_map, info) {
            if let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) {
                ids.insert(id.trim().parse::<u32>().expect("a map id"));
            }
        }
    }
    let mut found = std::collections::BTreeMap::new();
    for id in ids {
        let Ok(map) = libbpf_rs::MapHandle::from_map_id(id) else {
            continue;
        };
        let name = map.name().to_string_lossy().into_owned();
        if !["stacks", "stacks_short", "stacks_mid"].contains(&name.as_str()) {
            continue;
        }
        let lengths = map
            .keys()
            .filter_map(|k| map.lookup(&k, libbpf_rs::MapFlags::ANY).ok().flatten())
            .map(|v| {
                v.chunks_exact(8)
                    .take_while(|w| w.iter().any(|&b| b != 0))
                    .count()
            })
            .collect();
        found.insert(name, lengths);
    }
    found
}

/// From Linux 6.1 the stacks are kept in three tables by their length (up
/// to 24 frames, up to 56, longer: `STACK_SHORT_DEPTH` in offcputime.h),
/// each in elements of the kernel allocator's sizes. Threads blocked under
/// every depth from 1 to 100 calls of `farm_level` each have their whole
/// stack, and each table holds only stacks of its lengths (read from the
/// profiler's tables while it runs); before 6.1, all are in one.
#[test]
fn stacks_are_kept_by_their_length() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let mut farm = Reaped(Some(
        std::process::Command::new(example_path("stackfarm"))
            .args(["--procs", "1", "--depth", "100", "--seconds", "10"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start stackfarm"),
    ));
    let out = farm.0.as_mut().unwrap().stdout.take().unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut ready).expect("read");
    assert_eq!(ready.trim(), "ready");
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", farm.id()))
        .expect("the farm's worker");
    let worker = children
        .split_whitespace()
        .next()
        .expect("a worker")
        .to_string();
    let mut tables = Default::default();
    let (out, _, _) = profile_during(&["-f", "-p", &worker, "2"], |profiler| {
        std::thread::sleep(Duration::from_millis(1000));
        tables = stored_stack_lengths(profiler);
    });
    let lines = parse_folded(&out.stdout);
    for depth in 1..=100 {
        assert!(
            lines.iter().any(|l| {
                l.frames.iter().filter(|f| *f == "farm_level").count() == depth
                    && l.has("start_thread")
                    && l.has("schedule")
            }),
            "no whole stack of {depth} levels: {:?}",
            lines.iter().map(|l| l.frames.join(";")).collect::<Vec<_>>()
        );
    }
    let of = |name: &str| -> &Vec<usize> {
        tables
            .get(name)
            .unwrap_or_else(|| panic!("no table {name}: {tables:?}"))
    };
    if kernel_version() < (6, 1) {
        assert!(
            of("stacks_short").is_empty() && of("stacks_mid").is_empty(),
            "{tables:?}"
        );
        assert!(of("stacks").len() >= 100, "{tables:?}");
        return;
    }
    for (name, lengths, least) in [
        ("stacks_short", 1..=24, 10),
        ("stacks_mid", 25..=56, 25),
        ("stacks", 57..=127, 40),
    ] {
        let stored = of(name);
        assert!(
            stored.len() >= least && stored.iter().all(|n| lengths.contains(n)),
            "{name} holds {} stacks of {stored:?} frames (at least {least} of {lengths:?} wanted)",
            stored.len()
        );
    }
}

/// Stacks the stacks table has no memory for at the moment (its
/// allocator's cache empty, as in a burst where it cannot refill) are kept
/// in its spill table and read as the others: here every one of them.
#[test]
fn stacks_refused_for_memory_are_spilled() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let wl = Workload::start(&["--seconds", "30"]);
    // The sleepers only: their few stacks fit the spill table.
    let comms = ["wl-nanosleep", "wl-pipe", "wl-futex", "wl-shortsleep"];
    let tids: Vec<String> = comms.iter().map(|c| wl.tid(c).to_string()).collect();
    let clock = CpuClock::start(wl.pid, &comms.map(|c| wl.tid(c)));
    let (out, (from, to)) = profile_window(
        &["-f", "-t", &tids.join(","), "2"],
        &[("OFFCPUTIME_TEST_SPILL_STACKS", "1")],
    );
    let cpu = clock.finish();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let spilled = count_before(&stderr, " kept in the spill table");
    assert!(spilled > 0, "{stderr}");
    assert!(
        stderr.contains(
            "stack captures lost: storage full 0 user / 0 kernel, walk failed 0 user / 0 kernel"
        ),
        "{stderr}"
    );
    // None missed, but for kernel stacks due at a switch-in the kernel did
    // not report (said apart).
    assert!(
        !lines.iter().any(|l| l.has("[Missed User Stack]")),
        "{lines:?}"
    );
    let missed_kernel = lines
        .iter()
        .filter(|l| l.has("[Missed Kernel Stack]"))
        .count() as u64;
    assert!(missed_kernel <= unseen_kernel_stacks(&stderr), "{stderr}");
    check_blocked_threads(&lines, &cpu, &comms, (from, to), "");
    // Whole: each sleeper's main stack from its thread's start to the
    // scheduler, through its own function and the kernel's sleep.
    for (comm, user, kernel) in [
        ("wl-nanosleep", "wl_block_nanosleep", "do_nanosleep"),
        ("wl-pipe", "wl_block_pipe_read", "pipe_read"),
        ("wl-futex", "wl_block_futex_wait", "futex_wait"),
    ] {
        let main = lines
            .iter()
            .filter(|l| l.comm() == comm)
            .max_by_key(|l| l.us)
            .unwrap_or_else(|| panic!("no stack of {comm}: {lines:?}"));
        assert!(
            main.has("start_thread")
                && main.has(user)
                && main.frames.last().unwrap() == "__schedule",
            "{comm}: {:?}",
            main.frames
        );
        assert!(
            main.frames.iter().any(|f| f.contains(kernel)),
            "{comm}: {:?}",
            main.frames
        );
    }
}

/// The key=value pairs of each `offcputime: stats:` line (see
/// OFFCPUTIME_STATS_INTERVAL), with rows and mappings as their use.
fn stats_lines(stderr: &str) -> Vec<std::collections::HashMap<String, f64>> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("offcputime: stats: "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| {
                    let v = v.trim_end_matches('s').split('/').next()?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect()
        })
        .collect()
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A long run, system-wide, under the highest switch rate `perf bench sched
/// pipe` makes, with short-lived processes starting and exiting all along:
/// memory stays flat after warm-up but for the frames of the stacks counted
/// for exited processes, the unwind tables hold only what the processes
/// alive map, the blocking threads of the workload still add up to the
/// kernel's own accounting, and processes that exited long before the end
/// still have their frames named.
///
/// 300 s under CI=true; elsewhere only when OFFCPUTIME_SOAK_S gives the
/// length (it holds the BPF test lock all that time).
#[test]
fn soak_switch_storm_and_short_lived_processes() {
    if !require_root() {
        return;
    }
    let secs: u64 = match std::env::var("OFFCPUTIME_SOAK_S") {
        Ok(s) => s.parse().expect("OFFCPUTIME_SOAK_S: seconds"),
        Err(_) if is_ci() => 300,
        Err(_) => {
            eprintln!("skipped: set OFFCPUTIME_SOAK_S=300 to run the soak test");
            return;
        }
    };
    let Some(perf) = require_tool("perf", &[]) else {
        return;
    };
    let _g = serial();

    // Two threads passing a token through pipes as fast as they can, and
    // the main thread waiting for them: for longer than the soak.
    let bench = Reaped(Some(
        std::process::Command::new(perf)
            .args(["bench", "sched", "pipe", "-T", "-l", "2000000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf bench"),
    ));
    // Beside it, threads that block in known ways, to check the numbers.
    let wl = Workload::start(&["--seconds", &(secs + 60).to_string()]);
    let comms = ["wl-nanosleep", "wl-pipe", "wl-futex"];
    let tids: Vec<u32> = comms.iter().map(|c| wl.tid(c)).collect();
    let clock = CpuClock::start(wl.pid, &tids);

    // Every child has its own addresses, so each adds stacks of its own:
    // storage for all of the run's (about 6,000 children, three or four
    // user stacks each), so that what is measured is how exited processes
    // are named, not how soon the default storage fills (a limit of its
    // own, see README).
    let run = Running::start_with_env(
        &["-f", "--stack-storage-size", "65536", &secs.to_string()],
        &[("OFFCPUTIME_STATS_INTERVAL", "5")],
    );
    let prof_pid = run.child.id();

    let started = Instant::now();

    // Short-lived processes: one every 50 ms, each sleeping 30 ms in
    // wl_child_sleep and exiting.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_spawner = SetOnDrop(stop.clone());
    let spawner = {
        let blocker = blocker_path();
        std::thread::spawn(move || {
            let mut spawned_at: Vec<Instant> = Vec::new();
            let mut children: Vec<Child> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                children.push(
                    std::process::Command::new(&blocker)
                        .args(["child", "30"])
                        .spawn()
                        .expect("spawn blocker child"),
                );
                spawned_at.push(Instant::now());
                children.retain_mut(|c| c.try_wait().ok().flatten().is_none());
                std::thread::sleep(Duration::from_millis(50));
            }
            for mut c in children {
                let _ = c.wait();
            }
            spawned_at
        })
    };

    // RSS of the profiler once a second while it traces.
    let mut rss: Vec<(Duration, u64)> = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        if let Some(kib) = rss_kib(prof_pid) {
            rss.push((started.elapsed(), kib));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let (status, stdout, stderr) = run.finish();
    drop(stop_spawner);
    let spawned = spawner.join().unwrap();
    let cpu = clock.finish();
    drop(bench);
    assert!(status.success(), "{stderr}");
    let (_, from, to) = verbose_window(&stderr);
    let lines = parse_folded(&stdout);

    // Memory: after a warm-up of a fifth of the run, RSS grows by no more
    // than 0.25 KiB per process started since (what is kept of an exited
    // process: its stacks as frames of objects, shared with every other
    // process of the same program). RSS settled after warm-up (the median
    // of the first quarter of the stretch compared) is compared with RSS
    // settled at the end (the median of its last quarter), as the profiler
    // reports it every 5 s when no table is being built: a table built for
    // a large program that starts meanwhile (some other test's, the
    // machine's) takes tens of MB for a moment and gives them back, which
    // is not growth. The stretch compared begins after the last object new
    // to the profiler (a program the machine started meanwhile): its
    // tables are mapped into the profiler, so resident, and they are what
    // that program needs, not growth per process. Of the stretches between
    // new objects after warm-up (other tests start programs: the kernel
    // matrix's VMs), the longest.
    let stats = stats_lines(&stderr);
    let warm = Duration::from_secs(secs / 5);
    let full = Duration::from_secs(secs);
    let after: Vec<_> = stats
        .iter()
        .filter(|s| s["t"] >= warm.as_secs_f64())
        .collect();
    let mut cuts = vec![warm];
    for w in after.windows(2) {
        if w[1]["objects"] != w[0]["objects"] {
            cuts.push(Duration::from_secs_f64(w[1]["t"]));
        }
    }
    cuts.push(full);
    let (since, end) = cuts
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b.saturating_sub(*a))
        .expect("two cuts at least");
    assert!(
        end.saturating_sub(since) * 5 >= full * 2,
        "new programs kept starting on the machine ({cuts:?} of {full:?}): no stretch of the run \
         long enough to compare memory in: {stats:?}"
    );
    let quarter = end.saturating_sub(since) / 4;
    let settled_between = |from: Duration, to: Duration| {
        let mut v: Vec<u64> = stats
            .iter()
            .filter(|s| s["building"] == 0.0)
            .filter(|s| (from.as_secs_f64()..to.as_secs_f64()).contains(&s["t"]))
            .map(|s| s["rss_kib"] as u64)
            .collect();
        v.sort_unstable();
        assert!(
            !v.is_empty(),
            "no settled RSS between {from:?} and {to:?}: {stats:?}"
        );
        v[v.len() / 2]
    };
    let at_warm = settled_between(since, since + quarter);
    let at_end = settled_between(end - quarter, end);
    let peak = rss.iter().map(|r| r.1).max().unwrap();
    // Processes started between the middles of the two windows.
    let (mid_warm, mid_end) = (since + quarter / 2, end - quarter / 2);
    let later = spawned
        .iter()
        .filter(|t| (mid_warm..mid_end).contains(&t.duration_since(started)))
        .count() as u64;
    eprintln!(
        "soak: RSS {at_warm} KiB settled at {since:?} (after warm-up, or a new object), \
         {at_end} KiB at {end:?} (before the next new object, or the end), peak {peak} KiB; {} \
         processes started, {later} between the two",
        spawned.len()
    );
    for l in stderr
        .lines()
        .filter(|l| l.starts_with("offcputime: stats:"))
    {
        eprintln!("soak: {l}");
    }
    assert!(later > 0, "no process started after warm-up");
    assert!(
        at_end.saturating_sub(at_warm) * 4 <= later,
        "RSS grew from {at_warm} to {at_end} KiB with {later} new processes (more than 0.25 KiB \
         each)"
    );

    // The unwind tables hold what the processes alive map: their use after
    // warm-up stays about what it was then, however many came and went,
    // and nothing is left without tables for want of room.
    let warm_s = warm.as_secs_f64();
    let at = |key: &str, when: &dyn Fn(f64) -> bool| -> Vec<u64> {
        stats
            .iter()
            .filter(|s| when(s["t"]))
            .map(|s| s[key] as u64)
            .collect()
    };
    let (before, after) = (
        at("mappings", &|t| t <= warm_s),
        at("mappings", &|t| t > warm_s),
    );
    assert!(
        !before.is_empty() && after.len() >= 10,
        "stats lines: {stats:?}"
    );
    // Every child that exited more than a few seconds before the end was
    // let go.
    let exited = stats.last().map_or(0.0, |s| s["exited"]) as u64;
    let long_gone = spawned
        .iter()
        .filter(|t| t.duration_since(started) + Duration::from_secs(10) < Duration::from_secs(secs))
        .count() as u64;
    assert!(
        exited >= long_gone,
        "only {exited} exited processes were let go, {long_gone} children were long gone"
    );
    // (Exited processes are let go together every few seconds: the use
    // moves within a band; compared with the band during warm-up.)
    let (warm_use, most) = (*before.iter().max().unwrap(), *after.iter().max().unwrap());
    eprintln!("soak: unwind mappings in use at most {warm_use} during warm-up, {most} after");
    assert!(
        most <= warm_use * 3 / 2 + 64,
        "unwind mappings in use grew from at most {warm_use} to {most}"
    );
    // (A large program of the machine's may find the tables full of what
    // the live processes map; the workload's files and processes never.)
    let refused: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("tables are full")
                || (l.contains("do not fit")
                    && ["blocker", "libc.so", "perf", "ld-linux"]
                        .iter()
                        .any(|f| l.contains(&format!("unwinding for {f}"))))
        })
        .collect();
    assert!(refused.is_empty(), "{refused:?}");

    // No time lost under the storm: the blocking threads of the workload
    // add up, over the whole run, to what the kernel says they were
    // off-CPU.
    let losses = stderr
        .lines()
        .filter(|l| l.starts_with("WARNING"))
        .collect::<Vec<_>>();
    check_blocked_threads(
        &lines,
        &cpu,
        &comms,
        (from, to),
        &format!("; warnings: {losses:?}"),
    );
    assert!(
        sum_us(&lines, "sched-pipe") > 0,
        "no time for perf bench's threads"
    );

    // Exited processes still named: of the time the children slept,
    // nearly all is under frames of their own (blocker::run_child) with no
    // unnamed frame. Each lives about 30 ms; one whose snapshot comes only
    // after it has exited, because every CPU is busy with the storm, keeps
    // unnamed frames (about 1.5% of the time on 2 CPUs).
    let slept = sum_us_where(&lines, |l| l.comm() == "wl-child" && l.has("do_nanosleep"));
    let named_stack =
        |l: &Folded| l.has("blocker::run_child") && !l.frames.iter().any(|f| f.starts_with('['));
    let named = sum_us_where(&lines, |l| {
        l.comm() == "wl-child" && l.has("do_nanosleep") && named_stack(l)
    });
    eprintln!("soak: children slept {slept} us, {named} us of it under named frames");
    if (named as f64) < 0.95 * slept as f64 {
        let mut unnamed: Vec<_> = lines
            .iter()
            .filter(|l| l.comm() == "wl-child" && l.has("do_nanosleep") && !named_stack(l))
            .collect();
        unnamed.sort_by_key(|l| std::cmp::Reverse(l.us));
        for l in unnamed.iter().take(5) {
            eprintln!("soak: unnamed: {} us {:?}", l.us, l.frames);
        }
    }
    assert!(
        slept > 0 && named as f64 >= 0.95 * slept as f64,
        "{named} of {slept} us named; warnings: {losses:?}"
    );
}

/// `sleep 600`, a process blocked the whole window: every run of it has
/// something to write.
fn sleeper() -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("start sleep"),
    )
}

/// The entries of a directory, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn lchown(path: &Path, uid: u32, gid: u32) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the path is NUL-terminated.
    assert_eq!(
        unsafe { libc::lchown(c.as_ptr(), uid, gid) },
        0,
        "lchown {}",
        path.display()
    );
}

/// A symbolic link planted in a sticky, world-writable directory by
/// another user is not followed (the kernel's `fs.protected_symlinks` is
/// 0 on some systems, this machine among them), nor is one among the
/// path's directories; the caller's own link is.
#[test]
fn output_symlink_planted_by_another_user() {
    use std::os::unix::fs::PermissionsExt;
    if !require_root() {
        return;
    }
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let public = tmp.path().join("public");
    let private = tmp.path().join("private");
    std::fs::create_dir(&public).unwrap();
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = private.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = public.join("attack.svg");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    lchown(&planted, 65534, 65534);
    let planted_dir = public.join("sub");
    std::os::unix::fs::symlink(&private, &planted_dir).unwrap();
    lchown(&planted_dir, 65534, 65534);

    let s = sleeper();
    let pid = s.0.id().to_string();
    for target in [planted.clone(), planted_dir.join("victim")] {
        let out = offcputime()
            .args(["-p", &pid, "-o", target.to_str().unwrap(), "0.5"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", target.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("cannot write the output to")
                && err.contains("symbolic link owned by another user (uid 65534)"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }
    assert_eq!(entries(&private), ["victim"]);

    // The caller's own link in the same directory leads to its target,
    // and stays a link.
    let mine = public.join("mine.folded");
    let target = private.join("mine.folded");
    std::os::unix::fs::symlink(&target, &mine).unwrap();
    let out = offcputime()
        .args(["-f", "-p", &pid, "-o", mine.to_str().unwrap(), "0.5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(std::fs::symlink_metadata(&mine)
        .unwrap()
        .file_type()
        .is_symlink());
    let written = std::fs::read_to_string(&target).unwrap();
    assert!(
        written.lines().any(|l| l.starts_with("sleep;")),
        "no stack of sleep in {}:\n{written}",
        target.display()
    );
}

/// A run killed while its report is being written leaves the old file
/// whole and nothing beside it; a run that completes replaces it, keeping
/// its permissions and owner.
#[test]
fn killed_while_writing_the_output() {
    use std::io::BufRead;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.folded");
    std::fs::write(&file, "keep me\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    lchown(&file, 65534, 65534);
    let s = sleeper();
    let pid = s.0.id().to_string();

    let mut p = offcputime()
        .args(["-f", "-p", &pid, "-o", file.to_str().unwrap(), "0.5"])
        .env("OFFCPUTIME_TEST_STALL_IN_WRITE_MS", "20000")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(p.stderr.take().unwrap()).lines();
    let stalled = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("stalling"));
    assert!(stalled.is_some(), "the profiler never reached its write");
    p.kill().unwrap();
    p.wait().unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");
    assert_eq!(
        entries(dir.path()),
        ["out.folded"],
        "left beside the output"
    );

    let out = offcputime()
        .args(["-f", "-p", &pid, "-o", file.to_str().unwrap(), "0.5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.lines().any(|l| l.starts_with("sleep;")),
        "{written}"
    );
    let m = std::fs::metadata(&file).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o640, 65534, 65534));
    assert_eq!(entries(dir.path()), ["out.folded"]);
}

/// The (name, offset, size) of every section of an ELF64 file.
fn elf_sections(d: &[u8]) -> Vec<(String, usize, usize)> {
    let u = |at: usize, w: usize| {
        let mut b = [0u8; 8];
        b[..w].copy_from_slice(&d[at..at + w]);
        u64::from_le_bytes(b) as usize
    };
    let (shoff, shnum, shstrndx) = (u(0x28, 8), u(0x3c, 2), u(0x3e, 2));
    let header = |i: usize| shoff + i * 64;
    let strtab = u(header(shstrndx) + 0x18, 8);
    (0..shnum)
        .map(|i| {
            let h = header(i);
            let name_at = strtab + u(h, 4);
            let end = d[name_at..].iter().position(|&c| c == 0).unwrap_or(0);
            let name = String::from_utf8_lossy(&d[name_at..name_at + end]).into_owned();
            (name, u(h + 0x18, 8), u(h + 0x20, 8))
        })
        .collect()
}

/// A program whose call-frame information, symbol tables and debug
/// sections are 30% random bytes, traced beside a sound one: the run ends
/// normally and the sound process's stacks are whole.
#[test]
fn corrupted_program_leaves_the_others_right() {
    use std::os::unix::fs::PermissionsExt;
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("blocker");
    let mut d = std::fs::read(blocker_path()).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut changed = 0;
    for (name, off, size) in elf_sections(&d) {
        let hit = name == ".eh_frame"
            || name == ".eh_frame_hdr"
            || name == ".symtab"
            || name == ".strtab"
            || name.starts_with(".debug_");
        if !hit || off + size > d.len() {
            continue;
        }
        for b in &mut d[off..off + size] {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed % 10 < 3 {
                *b = (seed >> 32) as u8;
                changed += 1;
            }
        }
    }
    assert!(changed > 10_000, "only {changed} bytes changed");
    std::fs::write(&bad, &d).unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut corrupt = KillOnDrop(
        std::process::Command::new(&bad)
            .args(["--seconds", "30"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the corrupted program"),
    );
    // It runs (nothing it needs to run was touched): wait for it.
    {
        use std::io::BufRead;
        let out = corrupt.0.stdout.take().unwrap();
        let ready = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l == "ready");
        assert!(ready, "the corrupted program did not start");
    }
    let sound = Workload::start(&["--seconds", "30"]);
    let pids = format!("{},{}", sound.pid, corrupt.0.id());
    for args in [vec!["-f", "-p", pids.as_str(), "2"], vec!["-f", "2"]] {
        let out = profile(&args);
        let lines = parse_folded(&out.stdout);
        let main = lines
            .iter()
            .filter(|l| l.comm() == "wl-nanosleep" && l.has("do_nanosleep"))
            .filter(|l| l.has("wl_block_nanosleep"))
            .max_by_key(|l| l.us)
            .unwrap_or_else(|| {
                panic!(
                    "{args:?}: no whole stack of the sound process: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert_eq!(
            main.frames[1..3],
            ["__clone3", "start_thread"],
            "{:?}",
            main.frames
        );
        // Both processes' threads are there; the sound one's time whole.
        let sound_us: u64 = lines
            .iter()
            .filter(|l| l.comm() == "wl-nanosleep")
            .map(|l| l.us)
            .sum();
        assert!(sound_us > 2 * 2_000_000 * 9 / 10, "{args:?}: {sound_us} us");
    }
}

/// Many programs (distinct files) that start, block and exit while the
/// whole system is traced: the descriptors of files no live process maps
/// are let go, and the exited programs' frames are still named, from
/// their files found again by path.
#[test]
fn descriptors_of_exited_programs_are_let_go() {
    use std::os::unix::fs::PermissionsExt;
    if !require_root() {
        return;
    }
    let Some(clang) = require_tool("clang", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("w.c");
    std::fs::write(
        &src,
        "#include <time.h>\n\
         __attribute__((noinline)) void fdtest_wait(void) {\n\
             struct timespec t = {0, 20000000};\n\
             for (int i = 0; i < 15; i++) nanosleep(&t, 0);\n\
         }\n\
         int main(void) { fdtest_wait(); return 0; }\n",
    )
    .unwrap();
    let exe = dir.path().join("w");
    let st = std::process::Command::new(&clang)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("run clang");
    assert!(st.success(), "clang failed");
    const N: usize = 120;
    let copies: Vec<std::path::PathBuf> = (0..N)
        .map(|i| {
            let p = dir.path().join(format!("fdw{i}"));
            std::fs::copy(&exe, &p).unwrap();
            p
        })
        .collect();

    let (mut child, stderr, attached) =
        spawn_verbose(&["-f", "10"], &[("OFFCPUTIME_STATS_INTERVAL", "1")]);
    attached
        .recv_timeout(Duration::from_secs(60))
        .expect("the profiler did not attach");
    // Twelve at a time, each living 0.3 s: done about 3.5 s in.
    for wave in copies.chunks(12) {
        let mut running: Vec<Child> = wave
            .iter()
            .map(|p| std::process::Command::new(p).spawn().expect("start a copy"))
            .collect();
        for c in &mut running {
            c.wait().unwrap();
        }
    }
    let mut stdout = Vec::new();
    std::io::Read::read_to_end(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(child.wait().unwrap().success());
    let stderr = stderr.join().unwrap();
    let fds: Vec<f64> = stats_lines(&stderr)
        .iter()
        .filter_map(|s| s.get("fds").copied())
        .collect();
    assert!(fds.len() >= 5, "too few stats lines: {stderr}");
    let (first, peak, last) = (
        fds[0],
        fds.iter().cloned().fold(0.0, f64::max),
        *fds.last().unwrap(),
    );
    eprintln!("descriptors: {first} at the start, at most {peak}, {last} at the end; {N} programs");
    // Every program was held open while it ran; once they have all been
    // let go, the count is back near where it started.
    assert!(
        peak >= first + 10.0,
        "the programs were never held open: {fds:?}"
    );
    assert!(
        last < first + 20.0,
        "{last} descriptors at the end, {first} at the start, after {N} programs came and went"
    );
    let lines = parse_folded(&stdout);
    let named = (0..N)
        .filter(|i| {
            let comm = format!("fdw{i}");
            lines
                .iter()
                .any(|l| l.comm() == comm && l.has("fdtest_wait") && l.has("main"))
        })
        .count();
    assert!(
        named >= N * 9 / 10,
        "only {named} of {N} exited programs have their own frames named"
    );
}
