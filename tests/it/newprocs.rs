//! New processes from their first block: a forked child walks its user
//! stack with its parent's unwind tables (it maps what its parent maps),
//! and no block of a process whose tables are not ready yet is walked with
//! frame pointers (its stack is copied and walked in userspace).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// Flags `tests/workloads/forker.c` is built with: no frame pointers.
pub const FORKER_FLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

/// Builds `tests/workloads/forker.c` without frame pointers.
pub(crate) fn build_forker(dir: &Path) -> PathBuf {
    c_workload("forker", FORKER_FLAGS, dir)
}

/// Whether `l` has every one of `frames`, root first in this order.
pub(crate) fn in_order(l: &Folded, frames: &[&str]) -> bool {
    let at: Vec<Option<usize>> = frames.iter().map(|f| l.pos(f)).collect();
    at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1])
}

/// How much of the forker's children's sleep (the lines `child` picks)
/// there is, and how much of it is under their whole stack: down to
/// `main` through `forker_child` and `forker_child_sleep`.
pub(crate) fn children_sleep(lines: &[Folded], child: impl Fn(&Folded) -> bool) -> (u64, u64) {
    let slept = sum_us_where(lines, &child);
    let whole = sum_us_where(lines, |l| {
        child(l)
            && in_order(
                l,
                &["main", "forker_child", "forker_child_sleep", "nanosleep"],
            )
    });
    (slept, whole)
}

/// Children forked 50 times a second, each sleeping 20 ms at once in its
/// own function: at least 99% of the children's sleep is under their whole
/// stack (down to `main` through `forker_child`), none walked with frame
/// pointers for want of tables. On each hook (the kernel matrix runs them
/// on every kernel; before 5.17, where there is no DWARF walk, the test
/// reports that it does not apply).
#[test]
fn forked_children_walk_with_their_parents_tables_tp_btf() {
    forked_children_walk_with_their_parents_tables("tp-btf");
}

#[test]
fn forked_children_walk_with_their_parents_tables_raw_tp() {
    forked_children_walk_with_their_parents_tables("raw-tp");
}

#[test]
fn forked_children_walk_with_their_parents_tables_kprobe() {
    on_kprobe(&[], forked_children_walk_with_their_parents_tables);
}

fn forked_children_walk_with_their_parents_tables(hook: &str) {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_forker(dir.path());
    // Forking until killed: starting the profiler takes seconds on an
    // emulated kernel of the matrix.
    let forker = KillOnDrop(Command::new(&exe).arg("600").spawn().expect("start forker"));
    // Its tables are built before the trace starts.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = profile(&["--hook", hook, "-v", "-f", "3"]);
    drop(forker);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if frame_pointers_only(&stderr) {
        eprintln!("matrix: forked children {hook}: {NO_DWARF_WALK}");
        return;
    }
    let lines = parse_folded(&out.stdout);
    let sleeps = |l: &Folded| l.comm() == "forker" && l.has("__x64_sys_clock_nanosleep");
    // The parent sleeps straight from main.
    let parent = |l: &Folded| {
        l.pos("main")
            .is_some_and(|i| l.frames.get(i + 1).is_some_and(|f| f == "nanosleep"))
    };
    let (children, whole) = children_sleep(&lines, |l| sleeps(l) && !parent(l));
    eprintln!("forked children: {whole} of {children} us under their whole stack");
    assert!(
        children > 1_000_000,
        "too little of the children's sleep was seen ({children} us):\n{stderr}"
    );
    assert!(
        whole * 100 >= children * 99,
        "only {whole} of {children} us of the children's sleep under their whole stack:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let forked = count_before_any(
        &stderr,
        &[
            "new process used its parent's from the fork",
            "new processes used their parent's from the fork",
        ],
    );
    assert!(forked > 50, "{stderr}");
    eprintln!("matrix: forked children {hook}: {whole} of {children} us whole, {forked} forks");
}

/// A process that execs while the profiler loads, after its mappings were
/// read for the tables prepared beside the load and before the hooks
/// attach (no event says that exec): the tables of the image before are not
/// taken for the new one. The new image's sleep, under way at the start, is
/// under its whole stack (down to `main` through `forker_child`), with no
/// frame unnamed, on the plain build and the general one. (Before, the
/// first walk took the tables for whatever image it met: the stack ended in
/// `[unknown]` after a frame or two.) Beside it, a process that does not
/// exec (blocked reading stdin since before the start) is walked with the
/// tables prepared for it: its stack is whole, and the only user stack
/// walked otherwise (through the files' tables, or copied for userspace)
/// is the new image's.
#[test]
fn an_exec_while_the_profiler_loads_is_walked_as_the_new_image() {
    use std::io::Write;
    if !require_root() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_forker(dir.path());
    // The plain build, the general one, and the plain build with no walks
    // through the files' tables: the stack copied at the start for
    // userspace, which walks it with the mappings it reads after the
    // process's first notice.
    let no_file_tables = ("OFFCPUTIME_NO_FILE_TABLES", "1");
    let stall = ("OFFCPUTIME_TEST_STALL_BEFORE_ATTACH_MS", "1000");
    for (mode, env) in [
        (&[][..], &[stall][..]),
        (&["--states"][..], &[stall][..]),
        (&[][..], &[stall, no_file_tables][..]),
    ] {
        let mut forker = KillOnDrop(
            Command::new(&exe)
                .args(["reexec", "6000"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("start forker"),
        );
        let stay = KillOnDrop(
            Command::new(&exe)
                .args(["reexec", "6000"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("start forker"),
        );
        let pids = format!("{},{}", forker.0.id(), stay.0.id());
        // Their first image blocks reading stdin.
        std::thread::sleep(Duration::from_millis(300));
        let mut args = vec!["-f", "-p", &pids];
        args.extend(mode);
        args.push("2");
        let (mut child, stdout, lines, stderr) = spawn_lines(&args, env);
        wait_for_line(&lines, "the hooks attach in");
        forker.0.stdin.take().unwrap().write_all(b"exec\n").unwrap();
        assert!(child.wait().unwrap().success());
        let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
        let lines: Vec<Folded> = parse_folded(&stdout)
            .into_iter()
            .filter(|l| l.comm() == "forker")
            .collect();
        let (slept, whole) = children_sleep(&lines, |l| l.has("do_nanosleep"));
        let unnamed = sum_us_where(&lines, |l| l.has("[unknown]"));
        let stayed = sum_us_where(&lines, |l| l.has("ksys_read"));
        let stayed_whole = sum_us_where(&lines, |l| l.has("ksys_read") && l.has("main"));
        let by_files = count_before_any(
            &stderr,
            &[
                "user stack of processes without tables of their own",
                "user stacks of processes without tables of their own",
            ],
        );
        let copied = count_before_any(
            &stderr,
            &[
                "user stack taken before its process's tables",
                "user stacks taken before their process's tables",
            ],
        );
        eprintln!(
            "{mode:?} {env:?}: the process that did not exec {stayed_whole} of {stayed} us under \
             its whole stack; {by_files} user stacks walked through the files' tables, \
             {copied} copied"
        );
        assert!(
            stayed > 1_900_000 && stayed_whole == stayed && by_files + copied == 1,
            "{mode:?} {env:?}: the process that did not exec: {stayed_whole} of {stayed} us \
             under its whole stack; {by_files} user stacks walked through the files' tables and \
             {copied} copied, where only the new image's is: {lines:#?}\n{stderr}"
        );
        eprintln!(
            "{mode:?} {env:?}: {whole} of {slept} us of the new image's sleep under its whole \
             stack"
        );
        assert!(
            slept > 1_900_000 && whole * 100 >= slept * 99 && unnamed == 0,
            "{mode:?} {env:?}: {whole} of {slept} us under the whole stack, {unnamed} us with a \
             frame
             unnamed: {lines:#?}\n{stderr}"
        );
    }
}

/// Children that exec a new image before they block: their first blocks
/// come before userspace has read their mappings, and are walked in the
/// BPF program through the tables of the files they map (found in their
/// tree of mappings by inode), or from a copy of the stack where a file is
/// not known yet. At least 99% of the children's sleep is under their
/// whole stack, named even for children gone before their mappings could
/// be read.
#[test]
fn first_blocks_of_new_images_are_not_guessed() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_forker(dir.path());
    let mut forker = KillOnDrop(
        Command::new(&exe)
            .args(["6", "exec"])
            .spawn()
            .expect("start forker"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = profile(&["-v", "-f", "3"]);
    let _ = forker.0.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let by_file = count_before_any(
        &stderr,
        &[
            "user stack of processes without tables of their own walked through",
            "user stacks of processes without tables of their own walked through",
        ],
    );
    let copied = count_before_any(
        &stderr,
        &[
            "user stack taken before its process's tables were ready",
            "user stacks taken before their process's tables were ready",
        ],
    );
    let lines = parse_folded(&out.stdout);
    // The children exec /proc/self/exe: their command is "exe" or the
    // program's name, as the parent's. The parent sleeps in main itself.
    let parent = |l: &Folded| in_order(l, &["main", "nanosleep"]) && !l.has("forker_child");
    let child = |l: &Folded| {
        matches!(l.comm(), "exe" | "forker") && l.has("__x64_sys_clock_nanosleep") && !parent(l)
    };
    let (slept, whole) = children_sleep(&lines, child);
    eprintln!(
        "exec'd children: {whole} of {slept} us of their sleep under their whole stack; {by_file} \
         stacks walked through their files' tables, {copied} copied"
    );
    assert!(
        by_file > 50,
        "{by_file} stacks walked through files:\n{stderr}"
    );
    assert!(
        slept > 1_000_000,
        "{slept} us of the children's sleep:\n{stderr}"
    );
    assert!(
        whole * 100 >= slept * 99,
        "{whole} of {slept} us of the children's sleep under their whole stack:\n{}\n{stderr}",
        lines
            .iter()
            .filter(|l| child(l))
            .map(|l| format!("{} {}", l.frames.join(";"), l.us))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The news of a trace's last moments: children that exec a new image
/// (forked every 20 ms, each sleeping 3 s under its own functions), their
/// stacks copied for userspace (the walk through the files' tables turned
/// off, `OFFCPUTIME_NO_FILE_TABLES`), while the event loop reads no news
/// for the last second of the trace (`OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS`,
/// as where it gets no CPU). The news left when the trace stops (the
/// children's mappings, their copies) is read then: the children born in
/// that second, all alive at the end, are under their whole stack, and no
/// copy is left waiting for tables at the end.
#[test]
fn the_last_news_is_read_before_the_end() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A name of its own: the trace is of the whole system.
    let exe = dir.path().join("lastnews");
    std::fs::rename(build_forker(dir.path()), &exe).expect("rename the workload");
    let _forker = KillOnDrop(
        Command::new(&exe)
            .args(["30", "exec", "3000"])
            .spawn()
            .expect("start forker"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (out, _) = profile_window(
        &["-f", "2"],
        &[
            ("OFFCPUTIME_NO_FILE_TABLES", "1"),
            ("OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS", "1000"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let parent = |l: &Folded| in_order(l, &["main", "nanosleep"]) && !l.has("forker_child");
    let child =
        |l: &Folded| l.comm() == "lastnews" && l.has("__x64_sys_clock_nanosleep") && !parent(l);
    let (slept, whole) = children_sleep(&lines, child);
    eprintln!("children: {whole} of {slept} us of their sleep under their whole stack");
    // About 150 children asleep at any time, for 2 s.
    assert!(
        slept > 100_000_000,
        "{slept} us of the children's sleep:\n{stderr}"
    );
    assert!(
        whole * 100 >= slept * 99,
        "{whole} of {slept} us of the children's sleep under their whole stack:\n{}\n{stderr}",
        lines
            .iter()
            .filter(|l| child(l) && !l.has("forker_child_sleep"))
            .map(|l| format!("{} {}", l.frames.join(";"), l.us))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The copies made in the stalled second were walked at the end.
    let copied = count_before_any(
        &stderr,
        &[
            "user stack taken before its process's tables were ready copied",
            "user stacks taken before their process's tables were ready copied",
        ],
    );
    assert!(copied >= 40, "{copied} stacks copied:\n{stderr}");
    assert_no_copy_left_waiting(&stderr);
}

/// `posix_spawn`: the parent waits for its child (a vfork) inside glibc's
/// clone3, just after the syscall, where no FDE covers the code, and the
/// child starts there on a stack of its own. The forker's `spawn` mode
/// stalls the child in opening a FIFO, so that both stay blocked. The
/// parent's stack goes from `__clone3` through `posix_spawn` to `main` and
/// `_start`, the child's ends at `__clone3` under `__spawni_child` (as gdb
/// shows it), without a frame-pointer guess: walked at the switch-out of a
/// process new to the trace, by the start iterator, and in a snapshot.
#[test]
fn a_vfork_parent_and_its_child_walk_through_clone() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_forker(dir.path());
    let fifo = dir.path().join("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let mut forker = None;
    // The forker starts during the trace and spawns at once: its blocks
    // come before or just after its tables.
    let (traced, _, _) = profile_during(&["-f", "2"], |_| {
        use std::io::Write;
        let mut c = Command::new(&exe)
            .args(["spawn".as_ref(), fifo.as_os_str()])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("start forker");
        c.stdin.take().unwrap().write_all(b"go\n").unwrap();
        forker = Some(KillOnDrop(c));
    });
    let mut forker = forker.expect("the forker started");
    let parent = forker.0.id();
    let child = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(!child.is_empty(), "the spawned child is gone");
    let pids = format!("{parent},{child}");
    let at_start = profile(&["-v", "-f", "-p", &pids, "1"]);
    let snapshot = profile(&["-v", "--snapshot", "-f", "-p", &pids]);
    // Releases the child, then the parent.
    drop(std::fs::OpenOptions::new().write(true).open(&fifo));
    let _ = forker.0.wait();

    let parent_frames = [
        "_start",
        "main",
        "spawn_stalled",
        "forker_spawn",
        "__spawni",
        "__clone3",
    ];
    for (what, out) in [
        ("traced", &traced),
        ("at the start", &at_start),
        ("snapshot", &snapshot),
    ] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<Folded> = parse_folded(&out.stdout)
            .into_iter()
            .filter(|l| l.comm() == "forker")
            .collect();
        let stdout: Vec<String> = lines.iter().map(|l| l.frames.join(";")).collect();
        let stdout = stdout.join("\n");
        let user = |l: &Folded| -> Vec<String> {
            l.frames[1..]
                .iter()
                .take_while(|f| !f.starts_with("entry_SYSCALL"))
                .cloned()
                .collect()
        };
        let spawning = lines.iter().find(|l| l.has("forker_spawn"));
        let spawning = spawning.unwrap_or_else(|| panic!("{what}: no parent's stack:\n{stdout}"));
        assert!(
            in_order(spawning, &parent_frames) && user(spawning).last().unwrap() == "__clone3",
            "{what}: the parent's stack is not whole:\n{stdout}"
        );
        assert_eq!(spawning.frames[1], "_start", "{what}:\n{stdout}");
        let child_line = lines.iter().find(|l| l.has("__spawni_child"));
        let child_line =
            child_line.unwrap_or_else(|| panic!("{what}: no child's stack:\n{stdout}"));
        let u = user(child_line);
        assert_eq!(
            u.get(..2),
            Some(&["__clone3".to_string(), "__spawni_child".to_string()][..]),
            "{what}: the child's stack:\n{stdout}"
        );
        assert!(u.len() <= 4, "{what}: the child's stack:\n{stdout}");
        for l in &lines {
            assert!(!l.has("[unknown]"), "{what}:\n{stdout}");
        }
        if what != "traced" {
            assert_eq!(
                count_before_any(
                    &stderr,
                    &[
                        " frame through frame pointers",
                        "frames through frame pointers"
                    ]
                ),
                0,
                "{what}:\n{stderr}"
            );
        }
    }
}

/// A process that maps LLVM (the toolchain's `rustc`: 2.6 million unwind
/// rows), traced with `-p` under the default `--unwind-memory`, then
/// system-wide beside a storm of new processes that exec: its tables fit,
/// and its main thread's stack is walked with them from `_start` to the
/// compiler's read of its source, none with frame pointers for want of
/// tables.
#[test]
fn the_tables_of_a_compiler_fit_by_default() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let rustc = require_tool("rustc", &[]).expect("rustc");
    let mut compiler = KillOnDrop(
        Command::new(rustc)
            .args(["--crate-type", "lib", "-", "-o"])
            .arg(tempfile::tempdir().unwrap().path().join("x.rlib"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("start rustc"),
    );
    // Waiting for its source on stdin by then.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = compiler.0.id().to_string();
    let alone = profile(&["-v", "-f", "-p", &pid, "1"]);
    // Then system-wide, beside a fork storm of processes of their own.
    let dir = tempfile::tempdir().unwrap();
    let forker = KillOnDrop(
        Command::new(build_forker(dir.path()))
            .args(["600", "exec"])
            .spawn()
            .expect("start forker"),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let beside = profile(&["-v", "-f", "1"]);
    drop(forker);
    let _ = compiler.0.kill();
    for (what, out) in [("alone", &alone), ("system-wide", &beside)] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("do not fit") && !stderr.contains("without DWARF unwinding"),
            "{what}: {stderr}"
        );
        assert_rustc_read_whole(what, out);
        assert!(
            !stderr.contains("walked with frame pointers because"),
            "{what}: {stderr}"
        );
    }
}

/// The tables' memory follows what is in use: a system-wide trace starts
/// with room for a few processes' rows, and when `rustc` (2.6 million rows
/// with LLVM) starts during it, the rows grow to hold its tables (kept in
/// at most twice what they take), and its main thread's stack is walked
/// with them from `_start` to the compiler's read of its source (fed a
/// line every half second: it blocks again, with its tables once they are
/// built).
#[test]
fn the_tables_grow_for_a_compiler_started_during_the_trace() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let rustc = require_tool("rustc", &[]).expect("rustc");
    let dir = tempfile::tempdir().unwrap();
    let mut compiler = None;
    let (out, _, _) = profile_during(&["-f", "--unwind-memory", "128", "8"], |_| {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut c = KillOnDrop(
            Command::new(&rustc)
                .args(["--crate-type", "lib", "-", "-o"])
                .arg(dir.path().join("x.rlib"))
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("start rustc"),
        );
        // Its first read may block before its tables are built (its
        // stack is then copied, and deeper than a copy's 16 KiB): a line
        // of source every half second, and it blocks in its read again,
        // with its tables once they are built.
        for _ in 0..12 {
            std::thread::sleep(std::time::Duration::from_millis(500));
            let stdin = c.0.stdin.as_mut().expect("rustc's stdin");
            std::io::Write::write_all(stdin, b"// a comment\n").expect("feed rustc");
        }
        compiler = Some(c);
    });
    drop(compiler);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "... of N processes: X MiB in Y MiB allocated (at most Z), ..."
    let line = stderr
        .lines()
        .find(|l| l.contains("MiB allocated (at most"))
        .unwrap_or_else(|| panic!("no tables line:\n{stderr}"));
    let mib = |before: &str| -> f64 {
        let end = line.find(before).expect("tables line");
        let start = line[..end].trim_end().rfind(' ').map_or(0, |i| i + 1);
        line[start..end].trim().parse().expect("MiB")
    };
    let (used, allocated, most) = (mib(" MiB in "), mib(" MiB allocated"), mib("), built"));
    // rustc's rows alone are 19.8 MiB; the chunks are never given back,
    // so other processes' tables let go during the trace may have been
    // allocated too.
    assert!(
        used >= 15.0
            && allocated >= used
            && allocated <= 2.0 * used + 4.0
            && allocated < most / 2.0,
        "rows in use {used} MiB, allocated {allocated} MiB of at most {most}:\n{stderr}"
    );
    assert_rustc_read_whole("started during the trace", &out);
    assert!(!stderr.contains("do not fit"), "{stderr}");
}

/// `out` has a stack of rustc's main thread from `_start` to the
/// compiler's read of its source.
fn assert_rustc_read_whole(what: &str, out: &std::process::Output) {
    let whole = parse_folded(&out.stdout).iter().any(|l| {
        l.comm() == "rustc"
            && in_order(l, &["_start", "main", "rustc_driver_impl::run_compiler"])
            && l.frames.iter().any(|f| f.contains("read_to_string"))
    });
    assert!(
        whole,
        "{what}: no stack of rustc's main thread from _start to its read:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two compilers whose tables do not fit together in `--unwind-memory`:
/// the toolchain's `rustc` and a copy of it (its binary and libraries
/// copied, so other files with tables of their own). Each blocks, fed its
/// source a byte at a time, for a few seconds while the other waits: the
/// room goes to the one that blocks now (the other's tables are let go
/// once it has not blocked for a while, and made again when it blocks),
/// and each gets stacks from `_start` to its read.
#[test]
fn the_tables_go_to_the_processes_that_block_now() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let rustc = require_tool("rustc", &[]).expect("rustc");
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bin")).unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::copy(sysroot.join("bin/rustc"), dir.path().join("bin/rustc-copy")).unwrap();
    for e in std::fs::read_dir(sysroot.join("lib")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("librustc_driver") || name.starts_with("libLLVM") {
            std::fs::copy(e.path(), dir.path().join("lib").join(&name)).unwrap();
        }
    }
    let start = |exe: PathBuf, out: &str| {
        KillOnDrop(
            Command::new(exe)
                .args(["--crate-type", "lib", "-", "-o"])
                .arg(dir.path().join(out))
                .arg("--sysroot")
                .arg(&sysroot)
                // Each its own libraries (cargo points this at the
                // toolchain's for the tests it runs).
                .env_remove("LD_LIBRARY_PATH")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start rustc"),
        )
    };
    let mut first = start(sysroot.join("bin/rustc"), "a.rlib");
    let mut copy = start(dir.path().join("bin/rustc-copy"), "b.rlib");
    // Both waiting for their source by then.
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let pids = format!("{},{}", first.0.id(), copy.0.id());
    let mut a = first.0.stdin.take().unwrap();
    let mut b = copy.0.stdin.take().unwrap();
    let feed = |w: &mut std::process::ChildStdin, secs: f64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
        while std::time::Instant::now() < until {
            std::io::Write::write_all(w, b" ").expect("feed rustc");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // 30 MiB: one compiler's tables (20 MiB) and not two; what comes
    // free as they are let go lies in pieces (moved together).
    let (out, _, _) = profile_during(&["-f", "--unwind-memory", "30", "-p", &pids, "11"], |_| {
        // The copy blocks first (the first process noted has the room
        // at the start), then the first one.
        feed(&mut b, 4.5);
        feed(&mut a, 5.5);
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    for comm in ["rustc", "rustc-copy"] {
        let whole: u64 = lines
            .iter()
            .filter(|l| {
                l.comm() == comm
                    && in_order(l, &["_start", "main", "rustc_driver_impl::run_compiler"])
                    && l.frames.iter().any(|f| f.contains("read_to_string"))
            })
            .map(|l| l.us)
            .sum();
        let all: u64 = lines
            .iter()
            .filter(|l| l.comm() == comm)
            .map(|l| l.us)
            .sum();
        eprintln!("{comm}: {whole} of {all} us under stacks from _start to the read");
        assert!(
            whole > 0,
            "no stack of {comm} from _start to its read:\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let count = |after: &str| -> u64 {
        let tail = stderr.split(after).next().unwrap_or("");
        tail.rsplit(' ')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count before '{after}' in {stderr}"))
    };
    let either = |one: &str, many: &str| count(if stderr.contains(one) { one } else { many });
    let let_go = either(
        " process let its go for room",
        " processes let theirs go for room",
    );
    let given = either(" process left without some", " processes left without some");
    eprintln!("{let_go} processes let their tables go; {given} got tables later");
    for l in stderr.lines().filter(|l| l.contains("unwind tables")) {
        eprintln!("{l}");
    }
    assert!(let_go >= 2, "the room went to each in turn:\n{stderr}");
    assert!(given >= 1, "{stderr}");
}

/// A thread blocked inside an exec has the user registers of the image
/// being replaced while its address space may be the new one already (the
/// old one freed inside the call): its user stack is not walked from them
/// (which gave the old pc alone, named with the new image's mappings), but
/// missed and said; before the exec's point of no return, its stack is
/// the old image's, whole. The forker's `heavy` mode execs itself over
/// and over from 256 MiB of touched memory, on a CPU it shares with a
/// busy loop, so that it is preempted while the exec frees the old
/// memory.
#[test]
fn a_thread_inside_an_exec_is_not_walked_from_the_old_images_registers() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("bigexec");
    std::fs::rename(build_forker(dir.path()), &exe).expect("rename the workload");
    // One CPU this test may use, for both.
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let cpu = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|l| l.trim().split([',', '-']).next())
        .expect("the CPUs allowed")
        .to_string();
    let _busy = KillOnDrop(
        Command::new("taskset")
            .args(["-c", &cpu, "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("start a busy loop"),
    );
    let mut execs = KillOnDrop(
        Command::new("taskset")
            .args(["-c", &cpu])
            .arg(&exe)
            .args(["heavy", "256", "100000"])
            .spawn()
            .expect("start bigexec"),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        execs.0.try_wait().expect("bigexec's status").is_none(),
        "bigexec ended before the trace"
    );
    let pid = execs.0.id().to_string();
    let (out, _) = profile_window(&["-p", &pid, "-f", "2"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = parse_folded(&out.stdout);
    let in_exec = |l: &Folded| l.has("__x64_sys_execve");
    // The old image's stack, where its memory was still there, or none.
    let right = |l: &Folded| {
        l.frames.get(1).is_some_and(|f| f == "[Missed User Stack]")
            || in_order(l, &["main", "heavy", "forker_exec", "execve"])
    };
    // Preempted while the old memory is freed: the new address space in
    // place.
    let freeing = sum_us_where(&lines, |l| in_exec(l) && l.has("exit_mmap"));
    let wrong: Vec<String> = lines
        .iter()
        .filter(|l| in_exec(l) && !right(l))
        .map(|l| format!("{} {}", l.frames.join(";"), l.us))
        .collect();
    assert!(
        freeing > 10_000,
        "{freeing} us inside an exec freeing the old image's memory:\n{stderr}"
    );
    assert!(wrong.is_empty(), "{}\n{stderr}", wrong.join("\n"));
    assert!(
        stderr.contains("taken inside an exec, past its point of no return"),
        "the missed stacks are not said:\n{stderr}"
    );
}
