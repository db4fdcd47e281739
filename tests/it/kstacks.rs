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

/// `OFFCPUTIME_TEST_KSTACK_CHECK`'s counts in `stderr`: the stacks
/// compared with the kernel's walk, and those that differ.
fn checked(stderr: &str) -> (u64, u64) {
    let compared = count_before_any(
        stderr,
        &[
            " stack compared with the kernel's walk",
            " stacks compared with the kernel's walk",
        ],
    );
    (
        compared,
        count_before_any(stderr, &[" differs\n", " differ\n"]),
    )
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
    let (compared, differ) = checked(&stderr);
    eprintln!("{hook}: {walked} walked, {compared} compared, {differ} differ");
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
    // Only threads that ran while they were walked (twice), on the kprobe
    // threads that ran between its two end iterators (5.18 on, where the
    // second reads user stacks), and blocks whose switch-in the kernel did
    // not report (their stack is taken then) may lack them, all said on
    // stderr: the stuck ones have theirs from the start.
    let lacking = if stderr.contains("lack the scheduler's frames")
        || stderr.contains("lacks the scheduler's frames")
    {
        assert_eq!(
            number_before(" where the kernel's unwind tables (ORC) could not be used"),
            0,
            "{hook}: {stderr}"
        );
        number_before(" of threads that ran while they were walked")
            + number_before(" of threads that ran between the kprobe's two end iterators")
    } else {
        0
    } + unseen_kernel_stacks(&stderr);
    eprintln!("matrix: {walked} walked, {differ} of {compared} differ, {lacking} lacking");
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

/// At the switches themselves: under the switches of `perf bench sched
/// pipe`, the blocker's waits and a file-system workload (writes with
/// fsync, directory walks), with the hook `hook` system-wide. With the
/// tracepoint on BTF (from 5.17), each block's kernel stack is walked at
/// its switch-in, or found the same as the thread's last; every one is
/// compared with the kernel's own walk of the same thread: none may differ.
fn at_switches_on(hook: &str) {
    if !require_root() {
        return;
    }
    let Some(perf) = require_tool("perf", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("synced");
    let pipe = GroupChild::spawn(
        std::process::Command::new(&perf)
            .args(["bench", "sched", "pipe", "-l", "2000000000"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    let fs = GroupChild::spawn(std::process::Command::new("sh").args([
        "-c",
        &format!(
            "while :; do for i in 1 2 3 4; do dd if=/dev/zero of={} bs=4096 \
                     count=16 conv=fsync 2>/dev/null; done; find /etc -xdev > /dev/null \
                     2>&1; done",
            file.display()
        ),
    ]));
    let wl = Workload::start(&["--io", "--seconds", "60"]);
    let (out, _) = profile_window(
        &["--hook", hook, "-f", "3"],
        &[("OFFCPUTIME_TEST_KSTACK_CHECK", "1")],
    );
    drop(wl);
    drop(fs);
    drop(pipe);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let number_before = |what: &str| count_before(&stderr, what);
    let walked = number_before(" walked with the kernel's ORC");
    let proved = number_before(" proved the same as one of the thread's last walks");
    let (compared, differ) = checked(&stderr);
    eprintln!("{hook}: {walked} walked, {proved} proved, {compared} compared, {differ} differ");
    eprintln!("matrix: {walked} walked, {proved} proved, {differ} of {compared} differ");
    assert_eq!(differ, 0, "{hook}: {stderr}");
    let at_switch_in = hook == "tp-btf" && !frame_pointers_only(&stderr);
    if at_switch_in {
        // perf's two threads block hundreds of thousands of times (a few
        // thousand in the emulated VMs).
        assert!(proved >= 1_000, "{hook}: {proved} proved: {stderr}");
        assert!(compared >= 10, "{hook}: {compared} compared: {stderr}");
    }
    // perf's waits in a pipe read, with the scheduler's frames innermost.
    let perf_lines: Vec<&Folded> = lines
        .iter()
        .filter(|l| l.frames.iter().any(|f| f.contains("pipe_read")))
        .filter(|l| l.comm() == "sched-pipe" || l.comm() == "perf")
        .collect();
    assert!(
        !perf_lines.is_empty(),
        "{hook}: no pipe read of perf: {lines:?}"
    );
    let main = perf_lines.iter().max_by_key(|l| l.us).unwrap();
    let last = main.frames.last().unwrap();
    assert!(
        last == "__schedule" || last.starts_with("finish_task_switch"),
        "{hook}: {:?}",
        main.frames
    );
    // The writes' waits for the disk (outside the VMs, whose files are in
    // memory).
    if std::env::var_os("OFFCPUTIME_TEST_WORKLOADS").is_none() {
        assert!(
            lines.iter().any(|l| l.comm() == "dd"
                && l.frames.iter().any(|f| f.contains("fsync"))
                && l.frames.iter().any(|f| f == "__schedule")),
            "{hook}: no wait of dd in fsync: {:?}",
            lines
                .iter()
                .filter(|l| l.comm() == "dd")
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn at_switches_the_same_as_the_kernels_tp_btf() {
    at_switches_on("tp-btf");
}

#[test]
fn at_switches_the_same_as_the_kernels_raw_tp() {
    at_switches_on("raw-tp");
}

#[test]
fn at_switches_the_same_as_the_kernels_kprobe() {
    on_kprobe(&[], at_switches_on);
}

/// The flags `tests/workloads/tunread.c` is built with (and by
/// scripts/vmtest for the kernel matrix).
/// A thread whose kernel stacks differ only in their outer frames
/// (`tests/workloads/kouter.c`: poll and ppoll in turn, six inner frames
/// the same), traced at switch-in where kernel stacks are proved rather
/// than walked: every proved stack is compared with the kernel's own walk
/// (`OFFCPUTIME_TEST_KSTACK_CHECK`), none may differ, and the thread's
/// time is half under each system call, as the workload spends it. A
/// proof that ignored the stack's deeper words would take one for the
/// other at most of its blocks.
#[test]
fn proofs_tell_outer_frames_apart() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("temporary directory");
    let exe = c_workload("kouter", &["-O2", "-g", "-pthread"], dir.path());
    let wl = GroupChild::ready(&exe, "kouter did not start");
    let pid = wl.0.id().to_string();
    let (out, _) = profile_window(
        &["-f", "-p", &pid, "2"],
        &[("OFFCPUTIME_TEST_KSTACK_CHECK", "1")],
    );
    drop(wl);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let number_before = |what: &str| count_before(&stderr, what);
    let proved = number_before(" proved the same as one of the thread's last walks");
    let walked = number_before(" walked with the kernel's ORC");
    let (compared, differ) = checked(&stderr);
    let under = |call: &str| sum_us_where(&lines, |l| l.comm() == "wl-poll" && l.has(call));
    let (poll, ppoll) = (under("__x64_sys_poll"), under("__x64_sys_ppoll"));
    let share = poll as f64 / (poll + ppoll).max(1) as f64;
    eprintln!(
        "kouter: {proved} proved, {walked} walked, {differ} of {compared} differ; poll {poll} \
         us, ppoll {ppoll} us"
    );
    assert_eq!(differ, 0, "{stderr}");
    assert!(compared >= 2, "{compared} compared: {stderr}");
    if !frame_pointers_only(&stderr) {
        assert!(proved >= 1_000, "{proved} proved: {stderr}");
        // Each of the threads' stacks is proved at its next block but
        // for a few: a proof checked against the shape of another
        // (the places of its words are kept once for all threads)
        // would fail, and be walked.
        assert!(
            walked * 20 <= proved,
            "{walked} walked, {proved} proved: {stderr}"
        );
    }
    assert!(
        (0.35..=0.65).contains(&share),
        "wl-poll: {poll} us under poll and {ppoll} us under ppoll, where the workload waits \
         as long in each"
    );
}

const TUNREAD_FLAGS: &[&str] = &["-O2", "-g", "-pthread", "-fomit-frame-pointer"];

/// Threads waiting in the tun driver's read, a module in Debian's kernels
/// (built in on some, this machine's among them): one for good (walked at
/// the start) and one woken every few milliseconds by a signal (walked at
/// its switch-ins). Their stacks must hold the driver's frames and end in
/// the scheduler's, and agree with the kernel's own walk; where tun is a
/// module, each walk must have gone through it with the module's own ORC
/// tables, none finished by the kernel's walk from the module's frame on.
fn through_a_module_on(hook: &str) {
    if !require_root() {
        return;
    }
    let _g = serial();
    // Where the kernel's tables are, the modules' too: the same looked up
    // by name as read from kallsyms.
    symbols_as_kallsyms_says();
    let module = std::path::Path::new("/sys/module/tun/initstate").exists();
    // The matrix's kernels have it as a module: the case this is for.
    let in_vm = std::env::var_os("OFFCPUTIME_TEST_WORKLOADS").is_some();
    assert!(module || !in_vm, "tun is not a loaded module in the VM");
    let dir = tempfile::tempdir().expect("temporary directory");
    let exe = c_workload("tunread", TUNREAD_FLAGS, dir.path());
    let tun = GroupChild::ready(&exe, "tunread did not start (no /dev/net/tun?)");
    let pid = tun.0.id().to_string();
    let (out, _) = profile_window(
        &["--hook", hook, "-f", "-p", &pid, "2"],
        &[("OFFCPUTIME_TEST_KSTACK_CHECK", "1")],
    );
    drop(tun);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let number_before = |what: &str| count_before(&stderr, what);
    let walked = number_before(" walked with the kernel's ORC");
    let spliced = number_before(" finished by the kernel's own walk from a module's");
    let (compared, differ) = checked(&stderr);
    eprintln!("{hook}: tun module {module}: {walked} walked, {spliced} finished by the kernel's walk, {differ} of {compared} differ");
    eprintln!("matrix: {walked} walked, {spliced} spliced, {differ} of {compared} differ");
    assert_eq!(differ, 0, "{hook}: {stderr}");
    assert!(compared >= 2, "{hook}: {compared} compared: {stderr}");
    if module {
        assert_eq!(
            spliced, 0,
            "{hook}: walks not through the module's tables: {stderr}"
        );
    }
    for comm in ["wl-tun-stuck", "wl-tun-read"] {
        let main = lines
            .iter()
            .filter(|l| l.comm() == comm)
            .max_by_key(|l| l.us)
            .unwrap_or_else(|| panic!("{hook}: no stack of {comm}: {lines:?}"));
        assert!(
            main.frames.iter().any(|f| f.starts_with("tun_")),
            "{hook}: {comm}: no frame of the tun driver: {:?}",
            main.frames
        );
        assert_eq!(
            main.frames.last().unwrap(),
            "__schedule",
            "{hook}: {comm}: {:?}",
            main.frames
        );
    }
}

#[test]
fn through_a_module_tp_btf() {
    through_a_module_on("tp-btf");
}

/// Where the kernel stack walk reads the kernel's ORC tables, looked up by
/// name by the profiler's BPF program (Linux 5.16 and later), is what
/// `/proc/kallsyms` says, each module's `struct module` included; before
/// 5.16 the lookup cannot load and kallsyms is read.
fn symbols_as_kallsyms_says() {
    use offcputime::ksyms::KernelOrc;
    use offcputime::tracer::kernel;
    let read = KernelOrc::load().expect("this kernel has ORC tables in kallsyms");
    let looked_up = KernelOrc::looked_up(kernel::lookup_symbols);
    match kernel::version() {
        Some(v) if v >= (5, 16) => {
            let looked_up = looked_up
                .expect("the lookup loads from 5.16")
                .expect("addresses are shown to root");
            assert_eq!(looked_up, read);
        }
        _ => assert!(looked_up.is_err(), "a lookup before 5.16: {looked_up:?}"),
    }
    assert_eq!(kernel::kernel_orc(), Some(read));
}

#[test]
fn symbols_looked_up_as_kallsyms_says() {
    if !require_root() {
        return;
    }
    symbols_as_kallsyms_says();
}
