//! Containers: `--cgroup` traces the tasks of a cgroup v2 subtree, and
//! every stack says which container it came from. The test makes cgroups
//! named as container runtimes name theirs (a Kubernetes pod slice with two
//! containerd scopes, a docker scope) in the cgroup2 hierarchy, moves
//! `blocker` workloads into them, and checks which threads are traced,
//! their totals against the kernel's accounting, and the container's name
//! in the folded root frame, the report, pprof's labels, speedscope's
//! profiles and a pushed profile.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::formats::{go, tags};
use crate::util::*;

const ID_A: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const ID_B: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const ID_C: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
const ID_NS: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";
const POD_UID: &str = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901";

/// The threads of `blocker stuck`, blocked from start to end.
const STUCK: [&str; 4] = [
    "wl-stuck-main",
    "wl-stuck-cond",
    "wl-stuck-pipe",
    "wl-stuck-sleep",
];

/// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// beside the v1 controllers). None, a failure under CI, where it is not.
fn cgroup2() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let found = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    });
    if found.is_none() {
        assert!(
            !is_ci(),
            "cgroup2 is not mounted: the container tests cannot run"
        );
        eprintln!("skipped: cgroup2 is not mounted");
    }
    found
}

/// The test's own subtree of cgroups, removed on drop (its processes moved
/// back to the root first).
struct Tree {
    mount: PathBuf,
    root: PathBuf,
}

impl Tree {
    fn new(mount: &Path) -> Tree {
        let root = mount.join(format!("offcputime-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("make the test's cgroup");
        Tree {
            mount: mount.to_path_buf(),
            root,
        }
    }

    /// Makes the cgroup `rel` (and those above it) under the test's root.
    fn make(&self, rel: &str) -> PathBuf {
        let dir = self.root.join(rel);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dir
    }

    /// Moves process `pid` (all its threads) into cgroup `dir`.
    fn enter(dir: &Path, pid: u32) {
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", dir.display()));
    }

    /// The cgroup path of `dir` as /proc/PID/cgroup writes it.
    fn path_of(&self, dir: &Path) -> String {
        format!("/{}", dir.strip_prefix(&self.mount).unwrap().display())
    }

    /// Every cgroup of the tree, deepest first.
    fn dirs(&self) -> Vec<PathBuf> {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        walk(&e.path(), out);
                    }
                }
            }
            out.push(d.to_path_buf());
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // A task still exiting keeps its cgroup busy for a moment.
        for _ in 0..50 {
            for d in self.dirs() {
                if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in procs.split_whitespace() {
                        let _ = std::fs::write(self.mount.join("cgroup.procs"), pid);
                    }
                }
                let _ = std::fs::remove_dir(&d);
            }
            if !self.root.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !std::thread::panicking() {
            panic!(
                "the test's cgroups could not be removed: {}",
                self.root.display()
            );
        }
    }
}

/// What a root test of cgroups starts from: the test's cgroup tree, and
/// the lock that runs such tests one at a time. None (a failure under CI)
/// without root or cgroup2.
fn setup() -> Option<(std::sync::MutexGuard<'static, ()>, Tree)> {
    if !require_root() {
        return None;
    }
    let mount = cgroup2()?;
    let guard = serial();
    // The tree is made after the lock is taken and, bound after it,
    // removed before the lock is let go.
    Some((guard, Tree::new(&mount)))
}

impl Tree {
    /// Makes the pod's slice and a containerd container `id` in it.
    fn container(&self, id: &str) -> PathBuf {
        self.make(&format!("{}/cri-containerd-{id}.scope", pod_slice()))
    }
}

/// The systemd driver's name of a pod's slice.
fn pod_slice() -> String {
    format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        POD_UID.replace('-', "_")
    )
}

/// The folded lines under root frame `root`, without it.
fn under(lines: &[Folded], root: &str) -> Vec<Folded> {
    lines
        .iter()
        .filter(|l| l.frames[0] == root)
        .map(|l| Folded {
            frames: l.frames[1..].to_vec(),
            us: l.us,
        })
        .collect()
}

fn roots(lines: &[Folded]) -> BTreeSet<String> {
    lines.iter().map(|l| l.frames[0].clone()).collect()
}

fn frame(id: &str) -> String {
    format!("[container {}]", &id[..12])
}

/// The threads of a stuck workload, in [`STUCK`]'s order.
fn stuck_tids(w: &Workload) -> Vec<u32> {
    STUCK
        .iter()
        .map(|&n| w.tid(if n == "wl-stuck-main" { "main" } else { n }))
        .collect()
}

/// The names of a speedscope file's profiles.
fn profile_names(json: &str) -> BTreeSet<String> {
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    json["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

fn set(values: &[&str]) -> BTreeSet<String> {
    values.iter().map(|s| s.to_string()).collect()
}

/// A pod's cgroup traces exactly its two containers' threads, each for
/// the whole window by the kernel's accounting, under its container's root
/// frame and labels; one container's cgroup only that container; without
/// `--cgroup`, a docker container and a process in none are told apart.
#[test]
fn cgroup_of_a_pod_and_of_a_container() {
    let Some((_g, tree)) = setup() else { return };
    let Some(go) = go() else { return };
    let pod = tree.make(&pod_slice());
    let scope_a = tree.container(ID_A);
    let scope_b = tree.container(ID_B);
    let scope_c = tree.make(&format!("system.slice/docker-{ID_C}.scope"));
    let a = Workload::start(&["stuck"]);
    let b = Workload::start(&["stuck"]);
    let c = Workload::start(&["stuck"]);
    let outside = Workload::start(&["stuck"]);
    Tree::enter(&scope_a, a.pid);
    Tree::enter(&scope_b, b.pid);
    Tree::enter(&scope_c, c.pid);

    // The pod: both containers, nothing else.
    let dir = tempfile::tempdir().unwrap();
    let pb = dir.path().join("pod.pb.gz");
    let speedscope = dir.path().join("pod.speedscope.json");
    let report = dir.path().join("pod.txt");
    let folded = dir.path().join("pod.folded");
    let cpu_a = CpuClock::start(a.pid, &stuck_tids(&a));
    let cpu_b = CpuClock::start(b.pid, &stuck_tids(&b));
    let (out, (from, to)) = profile_window(
        &[
            "--per-container",
            "--cgroup",
            pod.to_str().unwrap(),
            "-o",
            folded.to_str().unwrap(),
            "-o",
            pb.to_str().unwrap(),
            "-o",
            speedscope.to_str().unwrap(),
            "-o",
            report.to_str().unwrap(),
            "2",
        ],
        &[],
    );
    let (cpu_a, cpu_b) = (cpu_a.finish(), cpu_b.finish());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&std::fs::read(&folded).unwrap());
    assert_eq!(
        roots(&lines),
        [frame(ID_A), frame(ID_B)].into_iter().collect(),
        "{stderr}"
    );
    for (id, cpu) in [(ID_A, &cpu_a), (ID_B, &cpu_b)] {
        let mine = under(&lines, &frame(id));
        let comms: BTreeSet<&str> = mine.iter().map(|l| l.comm()).collect();
        assert_eq!(comms, STUCK.iter().copied().collect(), "container {id}");
        let worst = check_blocked_threads(&mine, cpu, &STUCK, (from, to), &format!(" ({id})"));
        eprintln!(
            "container {}: worst {:.3}% of the window",
            &id[..12],
            worst * 100.0
        );
        assert!(worst < 0.005, "container {id}: {:.3}% off", worst * 100.0);
    }
    let t = tags(&go, &pb);
    assert_eq!(t["container_id"], set(&[ID_A, ID_B]), "{t:?}");
    assert_eq!(t["pod_uid"], set(&[POD_UID]), "{t:?}");
    assert_eq!(t["container_runtime"], set(&["containerd"]), "{t:?}");
    assert_eq!(
        t["cgroup"],
        set(&[&tree.path_of(&scope_a), &tree.path_of(&scope_b)]),
        "{t:?}"
    );
    assert_eq!(
        t["pid"],
        set(&[&a.pid.to_string(), &b.pid.to_string()]),
        "{t:?}"
    );
    let names = profile_names(&std::fs::read_to_string(&speedscope).unwrap());
    assert_eq!(
        names,
        set(&[
            &format!("container {}", &ID_A[..12]),
            &format!("container {}", &ID_B[..12])
        ])
    );
    let text = std::fs::read_to_string(&report).unwrap();
    for (w, id) in [(&a, ID_A), (&b, ID_B)] {
        let tid = w.tid("wl-stuck-sleep");
        let line = format!("wl-stuck-sleep ({tid}) in container {}", &id[..12]);
        assert!(text.contains(&line), "no {line:?} in the report:\n{text}");
    }

    // A snapshot of the pod: its report names the containers of each
    // group of tasks.
    let snap = profile(&["--snapshot", "--cgroup", pod.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&snap.stdout);
    assert!(
        text.contains(&format!("containers:      {} (4)", &ID_A[..12]))
            || text.contains(&format!("containers:      {} (1)", &ID_A[..12])),
        "{text}"
    );
    assert!(text.contains(&ID_B[..12]), "{text}");

    // Kernel stacks only (no process's mappings read): the containers all
    // the same.
    let out = profile(&[
        "-f",
        "-K",
        "--per-container",
        "--cgroup",
        pod.to_str().unwrap(),
        "1",
    ]);
    let lines = parse_folded(&out.stdout);
    assert_eq!(
        roots(&lines),
        [frame(ID_A), frame(ID_B)].into_iter().collect(),
        "-K"
    );

    // One container: only its threads, and so in what is pushed.
    let server = crate::push::Server::start(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let url = format!("http://127.0.0.1:{}", server.port);
    let out = profile(&[
        "-f",
        "--per-container",
        "--cgroup",
        scope_a.to_str().unwrap(),
        "-i",
        "0.5",
        "--push",
        &url,
        "1",
    ]);
    let lines = parse_folded(&out.stdout);
    assert_eq!(roots(&lines), [frame(ID_A)].into_iter().collect());
    let got = server.requests();
    assert_eq!(got.len(), 2, "{}", String::from_utf8_lossy(&out.stderr));
    for (k, req) in got.iter().enumerate() {
        let pushed = dir.path().join(format!("pushed-{k}.pb.gz"));
        std::fs::write(&pushed, &req.parts["profile"]).unwrap();
        let t = tags(&go, &pushed);
        assert_eq!(t["container_id"], set(&[ID_A]), "pushed {k}: {t:?}");
        assert_eq!(t["pod_uid"], set(&[POD_UID]), "pushed {k}: {t:?}");
        assert_eq!(
            t["cgroup"],
            set(&[&tree.path_of(&scope_a)]),
            "pushed {k}: {t:?}"
        );
    }

    // Without --cgroup: a docker container, and a process in none.
    let pids = format!("{},{}", c.pid, outside.pid);
    let pb = dir.path().join("all.pb.gz");
    let folded = dir.path().join("all.folded");
    profile(&[
        "--per-container",
        "-p",
        &pids,
        "-o",
        folded.to_str().unwrap(),
        "-o",
        pb.to_str().unwrap(),
        "1",
    ]);
    let lines = parse_folded(&std::fs::read(&folded).unwrap());
    assert_eq!(
        roots(&lines),
        [frame(ID_C), "[no container]".to_string()]
            .into_iter()
            .collect()
    );
    let t = tags(&go, &pb);
    assert_eq!(t["container_id"], set(&[ID_C]), "{t:?}");
    assert_eq!(t["container_runtime"], set(&["docker"]), "{t:?}");
    assert!(!t.contains_key("pod_uid"), "{t:?}");
    assert!(t["cgroup"].contains(&tree.path_of(&scope_c)), "{t:?}");
    drop(outside);
}

/// A process moved out of the traced cgroup stops being traced from its
/// next block: its threads' time ends where it was moved.
#[test]
fn cgroup_left_during_the_trace() {
    let Some((_g, tree)) = setup() else { return };
    let pod = tree.make(&pod_slice());
    let scope = tree.container(ID_A);
    let elsewhere = tree.make("elsewhere");
    let staying = Workload::start(&["stuck"]);
    let leaving = Workload::start(&[]);
    Tree::enter(&scope, staying.pid);
    Tree::enter(&scope, leaving.pid);
    let scope_b = tree.container(ID_B);
    let mut moved = 0;
    let mut arriving = None;
    let (out, _, _) = profile_during(
        &[
            "-f",
            "--per-container",
            "--cgroup",
            pod.to_str().unwrap(),
            "3",
        ],
        |_| {
            // A process started while tracing, outside, that moves itself
            // into the pod's other container and execs there.
            let script = format!(
                "sleep 0.2; echo $$ > {}/cgroup.procs && exec {} stuck",
                scope_b.display(),
                blocker_path().display()
            );
            arriving = Some(KillOnDrop(
                Command::new("sh")
                    .args(["-c", &script])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start sh"),
            ));
            std::thread::sleep(Duration::from_millis(1000));
            Tree::enter(&elsewhere, leaving.pid);
            moved = monotonic_ns();
        },
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (_, from, to) = verbose_window(&stderr);
    drop(arriving);
    let lines = parse_folded(&out.stdout);
    assert_eq!(
        roots(&lines),
        [frame(ID_A), frame(ID_B)].into_iter().collect(),
        "{stderr}"
    );
    // The arrival, from its first block in the pod, under its container.
    let arrived = under(&lines, &frame(ID_B));
    // (Its shell's blocks in the pod before the exec, and the new
    // program's before its threads are named, too.)
    let comms: BTreeSet<&str> = arrived.iter().map(|l| l.comm()).collect();
    let expected: BTreeSet<&str> = STUCK.iter().copied().collect();
    assert!(
        comms.is_superset(&expected)
            && comms
                .difference(&expected)
                .all(|c| ["sh", "blocker"].contains(c)),
        "{comms:?}"
    );
    let lines = under(&lines, &frame(ID_A));
    let window_us = (to - from) as f64 / 1e3;
    let before_us = moved.saturating_sub(from) as f64 / 1e3;
    // The stuck threads all along; the leaving process's sleeper (10 ms
    // sleeps) up to the move, give or take its block under way then.
    for comm in STUCK {
        let us = sum_us(&lines, comm) as f64;
        assert!(
            (us - window_us).abs() < 0.005 * window_us,
            "{comm}: {us} us in a {window_us} us window"
        );
    }
    let sleeper = sum_us(&lines, "wl-nanosleep") as f64;
    eprintln!(
        "wl-nanosleep: {sleeper} us; moved out {before_us:.0} us into a {window_us:.0} us window"
    );
    assert!(
        sleeper > before_us * 0.8 && sleeper < before_us + 50_000.0,
        "wl-nanosleep: {sleeper} us, but moved out {before_us:.0} us into the window"
    );
}

/// A workload in its own pid and mount namespace, inside a container's
/// cgroup: traced by its host pid, named, its files found, labelled, and
/// with -v its pid in its namespace.
#[test]
fn container_in_its_own_namespaces() {
    let Some((_g, tree)) = setup() else { return };
    let Some(go) = go() else { return };
    let scope = tree.make(&format!("system.slice/docker-{ID_NS}.scope"));
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec unshare --pid --mount --fork --mount-proc {} stuck",
        scope.display(),
        blocker_path().display()
    );
    let mut child = KillOnDrop(
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start unshare"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut ns_pid = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(p) = line.strip_prefix("pid ") {
            ns_pid = p.parse().unwrap();
        }
        if line == "ready" {
            break;
        }
    }
    assert_eq!(ns_pid, 1, "the workload is not pid 1 of its own namespace");
    // unshare's child, the workload, by its host pid.
    let unshare = child.0.id();
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("unshare's children");
    let host: u32 = children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("unshare has a child");
    // The namespace's init ignores what it has no handler for.
    struct Kill9(u32);
    impl Drop for Kill9 {
        fn drop(&mut self) {
            // SAFETY: a signal to a process this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let _kill = Kill9(host);
    let dir = tempfile::tempdir().unwrap();
    let pb = dir.path().join("ns.pb.gz");
    let folded = dir.path().join("ns.folded");
    let out = profile(&[
        "-v",
        "--per-container",
        "-p",
        &host.to_string(),
        "-o",
        folded.to_str().unwrap(),
        "-o",
        pb.to_str().unwrap(),
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&std::fs::read(&folded).unwrap());
    assert_eq!(
        roots(&lines),
        [frame(ID_NS)].into_iter().collect(),
        "{stderr}"
    );
    let lines = under(&lines, &frame(ID_NS));
    for (comm, f) in [
        ("wl-stuck-sleep", "wl_block_long_sleep"),
        ("wl-stuck-pipe", "wl_block_stuck_read"),
    ] {
        assert!(
            lines.iter().any(|l| l.comm() == comm && l.has(f)),
            "{comm}: no {f} frame (its files not found?): {lines:?}"
        );
    }
    let listed = stderr
        .lines()
        .find_map(|l| l.strip_prefix("offcputime: pids in their own pid namespace: "))
        .unwrap_or_else(|| panic!("-v does not list namespace pids: {stderr}"));
    assert!(
        listed.split(", ").any(|p| p == format!("{host} is 1")),
        "-v does not give the namespace pid of {host}: {listed}"
    );
    let t = tags(&go, &pb);
    assert_eq!(t["container_id"], set(&[ID_NS]), "{t:?}");
    assert_eq!(t["pid"], set(&[&host.to_string()]), "{t:?}");
}

/// A path that is not a cgroup v2 directory: one clear line, before
/// anything is traced.
#[test]
fn cgroup_that_is_not_one() {
    for (path, says) in [
        ("/nonexistent/cgroup", "/nonexistent/cgroup"),
        ("/tmp", "cgroup2"),
    ] {
        let out = offcputime().args(["--cgroup", path, "1"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--cgroup {path} was accepted");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "--cgroup {path}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `--cgroup` of a pod on every hook (the kernel matrix's `cgroup` cell):
/// its two containers' threads each for the whole window and nothing else;
/// in `--snapshot` its containers' tasks alone; with `--wakers` the
/// blocked threads of the pod, woken by a process outside it.
#[test]
fn cgroup_on_every_hook() {
    let Some((_g, tree)) = setup() else { return };
    let pod = tree.make(&pod_slice());
    let scope_a = tree.container(ID_A);
    let scope_b = tree.container(ID_B);
    let a = Workload::start(&["stuck"]);
    let b = Workload::start(&["wakers"]);
    let outside = Workload::start(&["stuck"]);
    Tree::enter(&scope_a, a.pid);
    // The futex waker, b's child, stays outside the pod.
    Tree::enter(&scope_b, b.pid);
    let pod_arg = pod.to_str().unwrap();
    let mut hooks = vec![];
    let mut check = |hook: &str| {
        let (out, (from, to)) = profile_window(
            &[
                "-f",
                "--per-container",
                "--hook",
                hook,
                "--cgroup",
                pod_arg,
                "1",
            ],
            &[],
        );
        let lines = parse_folded(&out.stdout);
        assert_eq!(
            roots(&lines),
            [frame(ID_A), frame(ID_B)].into_iter().collect(),
            "{hook}"
        );
        let window_us = (to - from) as f64 / 1e3;
        let mine = under(&lines, &frame(ID_A));
        for comm in STUCK {
            let us = sum_us(&mine, comm) as f64;
            assert!(
                (us - window_us).abs() < 0.02 * window_us,
                "{hook}: {comm}: {us} us in a {window_us} us window"
            );
        }
        let theirs = under(&lines, &frame(ID_B));
        // b's threads, not its child outside the pod.
        let comms: BTreeSet<&str> = theirs.iter().map(|l| l.comm()).collect();
        assert!(
            comms.contains("wl-futex-wait") && !comms.contains("wl-futex-waker"),
            "{hook}: {comms:?}"
        );
        hooks.push(hook.to_string());
    };
    check("tp-btf");
    check("raw-tp");
    // (Where the kernel has no kprobes, the e2e tests check that the hook
    // says so.)
    if has_kprobes() {
        check("finish-task-switch");
    }
    // The cgroup2 mount's root, which holds every task, and a cgroup one
    // level below it (the test's own tree): the walk up a task's cgroups
    // reaches both, on every hook.
    let mount = tree.mount.to_str().unwrap().to_string();
    let first_level = tree.root.to_str().unwrap().to_string();
    for hook in hooks.clone() {
        let out = profile(&[
            "-f",
            "--per-container",
            "--hook",
            &hook,
            "--cgroup",
            &mount,
            "1",
        ]);
        let lines = parse_folded(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = roots(&lines);
        assert!(
            all.contains(&frame(ID_A)) && all.contains(&frame(ID_B)),
            "{hook}: --cgroup of the root: {all:?}\n{stderr}"
        );
        // The workload outside the pod, in no container.
        let outside_pod = |l: &Folded| {
            l.frames[0] == "[no container]"
                && l.frames.get(1).is_some_and(|c| STUCK.contains(&c.as_str()))
        };
        assert!(
            lines.iter().any(outside_pod),
            "{hook}: --cgroup of the root misses a process outside the pod\n{stderr}"
        );
        let out = profile(&[
            "-f",
            "--per-container",
            "--hook",
            &hook,
            "--cgroup",
            &first_level,
            "1",
        ]);
        let lines = parse_folded(&out.stdout);
        assert_eq!(
            roots(&lines),
            [frame(ID_A), frame(ID_B)].into_iter().collect(),
            "{hook}: --cgroup of a first-level cgroup"
        );
    }

    let snap = profile(&["--snapshot", "-f", "--per-container", "--cgroup", pod_arg]);
    let lines = parse_folded(&snap.stdout);
    assert_eq!(
        roots(&lines),
        [frame(ID_A), frame(ID_B)].into_iter().collect(),
        "--snapshot"
    );

    let out = profile(&["--wakers", "-f", "--cgroup", scope_b.to_str().unwrap(), "1"]);
    let lines = parse_folded(&out.stdout);
    let comms: BTreeSet<&str> = lines.iter().map(|l| l.comm()).collect();
    assert!(!comms.contains("wl-futex-waker"), "{comms:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.comm() == "wl-futex-wait" && l.frames.last().unwrap() == "wl-futex-waker"),
        "the futex waiter's waker, outside the cgroup, is not named: {lines:?}"
    );
    drop(outside);
    eprintln!(
        "matrix: cgroup on {}, --snapshot, --wakers: the pod's threads only; the root and a \
         first-level cgroup",
        hooks.join(", ")
    );
}

/// Every output names the container of a sample, without root: the report's
/// thread line, `--group`'s containers, pprof's labels, and with
/// `--per-container` the folded root frame and speedscope's profiles.
#[test]
fn outputs_name_the_container() {
    use offcputime::container::{classify, Container};
    use offcputime::output::{folded, group, pprof, speedscope, text, Shape};
    use offcputime::profile::{Frame, Part, Profile, Sample};
    use std::sync::Arc;

    let pod = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        POD_UID.replace('-', "_")
    );
    let in_pod = Arc::new(classify(&format!("{pod}/cri-containerd-{ID_A}.scope")));
    let docker = Arc::new(classify(&format!("/system.slice/docker-{ID_C}.scope")));
    let service = Arc::new(classify("/system.slice/ssh.service"));
    let sample = |comm: &str, pid: u32, container: Option<&Arc<Container>>| Sample {
        comm: comm.to_string(),
        tgid: pid,
        pid,
        thread: None,
        user: Part::Frames(vec![Frame::named("wait"), Frame::named("main")].into()),
        kernel: Part::Absent,
        state: None,
        waker: None,
        container: container.cloned(),
        total_ns: 2_000_000,
        count: 1,
    };
    let profile = Profile {
        samples: vec![
            sample("app", 10, Some(&in_pod)),
            sample("db", 20, Some(&docker)),
            sample("sshd", 30, Some(&service)),
            sample("cron", 40, None),
        ],
        ..Default::default()
    };
    let shape = Shape {
        per_container: true,
        ..Shape::default()
    };
    let render = |f: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut out = Vec::new();
        f(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    };

    let text = render(&|w| folded::write(&profile, shape, w));
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "[container 0123456789ab];app;main;wait 2000",
            "[container c0ffee00c0ff];db;main;wait 2000",
            "[no container];cron;main;wait 2000",
            "[no container];sshd;main;wait 2000",
        ]
    );
    // Without --per-container, folded lines are as ever.
    let plain = render(&|w| folded::write(&profile, Shape::default(), w));
    assert!(plain.lines().all(|l| !l.starts_with('[')), "{plain}");

    let report = render(&|w| text::write(&profile, Shape::default(), w));
    for line in [
        "app (10) in container 0123456789ab",
        "db (20) in container c0ffee00c0ff",
    ] {
        assert!(report.contains(line), "no {line:?} in:\n{report}");
    }
    assert!(
        report.contains("sshd (30)\n") && report.contains("cron (40)\n"),
        "{report}"
    );

    let grouped = render(&|w| group::write(&profile, Shape::default(), group::GroupSort::Asc, w));
    assert!(
        grouped.contains("    containers:      0123456789ab (1), c0ffee00c0ff (1)\n"),
        "{grouped}"
    );

    let json = render(&|w| {
        speedscope::write(
            &profile,
            shape,
            &speedscope::SpeedscopeOptions::default(),
            w,
        )
    });
    let names = profile_names(&json);
    assert_eq!(
        names,
        set(&[
            "container 0123456789ab",
            "container c0ffee00c0ff",
            "no container"
        ])
    );

    let pb = pprof::build(&profile, Shape::default(), &pprof::PprofOptions::default());
    let labels = |pid: &str| -> BTreeMap<String, String> {
        let s = |i: i64| pb.string_table[i as usize].clone();
        pb.sample
            .iter()
            .map(|x| {
                x.label
                    .iter()
                    .map(|l| (s(l.key), s(l.str)))
                    .collect::<BTreeMap<_, _>>()
            })
            .find(|l| l["pid"] == pid)
            .unwrap()
    };
    let app = labels("10");
    assert_eq!(app["container_id"], ID_A);
    assert_eq!(app["container_runtime"], "containerd");
    assert_eq!(app["pod_uid"], POD_UID);
    assert_eq!(app["cgroup"], format!("{pod}/cri-containerd-{ID_A}.scope"));
    let db = labels("20");
    assert_eq!(db["container_id"], ID_C);
    assert!(!db.contains_key("pod_uid"));
    let sshd = labels("30");
    assert_eq!(sshd["cgroup"], "/system.slice/ssh.service");
    assert!(!sshd.contains_key("container_id"));
    assert!(!labels("40").contains_key("cgroup"));
}
