//! Real programs that start processes while they are traced, system-wide:
//! PostgreSQL forking a backend for every connection (pgbench `-C`), whose
//! backends must be walked with the postmaster's tables from their first
//! block, one of them exactly as gdb walks it; and the 200-process,
//! 8000-thread `stackfarm` started just after the profiler attached, whose
//! new images' first blocks must be walked from copies of their stacks,
//! not guessed with frame pointers.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use offcputime::symbolize::SymbolizeOptions;

use crate::unwind::{
    expected_stack, gdb_stacks, in_syscall, mismatch, own_ranges, GdbFrame, Naming, GDB_SCRIPT,
};
use crate::util::*;

/// The user the cluster runs as (PostgreSQL refuses to run as root).
const NOBODY: u32 = 65534;

/// The cluster's port: only the name of its socket, which is in the
/// test's own directory (no TCP), so it cannot clash with another server.
const PORT: &str = "54329";

/// The newest PostgreSQL's programs (`/usr/lib/postgresql/*/bin`). Outside
/// CI, without them the test is skipped; under `CI=true` it fails.
fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            ["initdb", "pg_ctl", "postgres", "pgbench", "psql"]
                .iter()
                .all(|p| bin.join(p).is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    let bin = found.pop().map(|(_, bin)| bin);
    if bin.is_none() {
        assert!(
            !is_ci(),
            "PostgreSQL (/usr/lib/postgresql/*/bin) is needed and CI=true forbids skipping \
             (scripts/setup --test installs it)"
        );
        eprintln!("skipped: PostgreSQL not found (scripts/setup --test installs it)");
    }
    bin
}

/// A PostgreSQL cluster of the test's own, run as user nobody in a
/// temporary directory (data, log and socket), stopped when dropped.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(bin: &Path) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("offcputime-pg-")
            .tempdir()
            .expect("temporary directory");
        std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
        let cluster = Cluster {
            bin: bin.to_path_buf(),
            dir,
        };
        cluster.run(
            "initdb",
            &["-D", "data", "-A", "trust", "-U", "bench", "--no-sync"],
        );
        let options = format!(
            "-k {} -p {PORT} -c listen_addresses='' -c fsync=off",
            cluster.dir.path().display()
        );
        cluster.run(
            "pg_ctl",
            &[
                "-D", "data", "-l", "log", "-w", "-t", "60", "-o", &options, "start",
            ],
        );
        cluster
    }

    /// One of PostgreSQL's programs, run as nobody in the cluster's
    /// directory, its client defaults those of the cluster.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".to_string(),
        ])
        .arg(self.bin.join(program))
        .current_dir(self.dir.path())
        .env("PGHOST", self.dir.path())
        .env("PGPORT", PORT)
        .env("PGUSER", "bench")
        .env("PGDATABASE", "postgres");
        c
    }

    /// Runs a program to the end; it must succeed.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
        );
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let pid_file = self.dir.path().join("data/postmaster.pid");
        let postmaster: Option<i32> = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse().ok());
        let _ = self
            .command("pg_ctl")
            .args(["-D", "data", "-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // Whatever pg_ctl managed: no server outlives the test.
        if let Some(pid) = postmaster.filter(|_| pid_file.exists()) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The user frames of a report entry of `-d` (after the `--` between the
/// kernel's and the user's), innermost first.
fn user_part(e: &Entry) -> &[String] {
    match e.frames.iter().position(|f| f == "--") {
        Some(i) => &e.frames[i + 1..],
        None => &[],
    }
}

/// A user stack that reaches the program's start: `_start` outermost,
/// `main` in it.
fn from_start(user: &[String]) -> bool {
    user.last().is_some_and(|f| f == "_start") && user.iter().any(|f| f == "main")
}

/// How many user stacks `-v` says were walked with frame pointers for want
/// of tables (the line is there only if some were): all processes'.
fn fp_walked(stderr: &str) -> u64 {
    const WHAT: [&str; 2] = [
        "user stack was walked with frame pointers because",
        "user stacks were walked with frame pointers because",
    ];
    if WHAT.iter().any(|w| stderr.contains(w)) {
        count_before_any(stderr, &WHAT)
    } else {
        0
    }
}

/// gdb's stack of the single-threaded process `pid`, caught in a syscall
/// (up to 5 attaches).
fn blocked_gdb_stack(gdb: &Path, dir: &Path, pid: u32) -> Vec<GdbFrame> {
    let script = dir.join("frames.py");
    std::fs::write(&script, GDB_SCRIPT).expect("write the gdb script");
    let mut last = Vec::new();
    for _ in 0..5 {
        last = gdb_stacks(gdb, &script, pid)
            .into_values()
            .next()
            .unwrap_or_default();
        if in_syscall(pid, &last) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("gdb never caught process {pid} in a syscall; last: {last:#?}");
}

/// pgbench with a connection per transaction (`-C`: every transaction a
/// new backend forked by the postmaster) for 6 s, traced system-wide for
/// 4 s from 1 s in; a `psql` session opened once the profiler attached
/// (its backend a process new to the profiler) idles in between two
/// queries. Every user stack of a `postgres` process must reach
/// `_start` (none guessed with frame pointers), most of the backends must
/// have used the postmaster's tables from the fork, and the idle backend's
/// stack must be gdb's, frame by frame. On both tracepoint hooks (the
/// kprobe's, which this machine's kernel lacks, on the forked children of
/// the kernel matrix).
#[test]
fn postgres_connection_per_transaction_tp_btf() {
    postgres_connection_per_transaction("tp-btf");
}

#[test]
fn postgres_connection_per_transaction_raw_tp() {
    postgres_connection_per_transaction("raw-tp");
}

fn postgres_connection_per_transaction(hook: &str) {
    if !require_root() {
        return;
    }
    let (Some(bin), Some(gdb)) = (postgres_bin(), require_tool("gdb", &[])) else {
        return;
    };
    let _serial = serial();
    let pg = Cluster::start(&bin);
    pg.run("pgbench", &["-i", "-s", "1", "-q"]);
    // pgbench starts once the profiler traces (its start-up, the
    // verifier's, takes seconds on a busy machine): 4 s of its 6 s traced.
    let (mut profiler, stdout, lines, stderr) = spawn_lines(&["--hook", hook, "-d", "4"], &[]);
    wait_for_line(&lines, "offcputime: attached ");
    let mut bench = pg.command("pgbench");
    bench.args(["-C", "-c", "4", "-j", "2", "-T", "6"]);
    let bench = std::thread::spawn(move || bench.output().expect("run pgbench"));
    let mut psql = pg.command("psql");
    psql.args(["-X", "-A", "-t", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut psql = KillOnDrop(psql.spawn().expect("start psql"));
    let mut to_psql = psql.0.stdin.take().unwrap();
    let mut from_psql = BufReader::new(psql.0.stdout.take().unwrap());
    let mut query = |q: &str| {
        writeln!(to_psql, "{q}").expect("write to psql");
        let mut line = String::new();
        from_psql.read_line(&mut line).expect("read from psql");
        line.trim().to_string()
    };
    let backend: u32 = query("select pg_backend_pid();")
        .parse()
        .expect("the backend's pid");
    // A block of a second that ends; then it idles to the end of the trace.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(query("select 1;"), "1");

    let status = profiler.wait().expect("wait for offcputime");
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "offcputime failed: {stderr}");
    let bench = bench.join().unwrap();
    let bench_out = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "pgbench failed: {bench_out}{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let transactions: u64 = bench_out
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no transaction count from pgbench: {bench_out}"));

    // gdb of the idle backend, blocked waiting for its client, and the
    // profiler's names for its frames, while it is there.
    let dir = tempfile::tempdir().unwrap();
    let gdb_frames = blocked_gdb_stack(&gdb, dir.path(), backend);
    let mut sym = Naming::new(SymbolizeOptions {
        inline: true,
        ..SymbolizeOptions::default()
    });
    sym.reg.note_process(backend, None, false);
    let expected = expected_stack(&mut sym, backend, &gdb_frames, &[]);
    // gdb's own names of its frames in the postgres executable (those it
    // can name: the static functions of a stripped build are `??`).
    let own = own_ranges(backend, &bin.join("postgres"));
    let gdb_own: Vec<String> = gdb_frames
        .iter()
        .filter(|f| !f.inline && !f.tail_call && f.name != "??")
        .filter(|f| own.iter().any(|&(s, e)| f.pc > s && f.pc <= e))
        .map(|f| f.name.clone())
        .collect();
    drop(psql);

    let entries = parse_report(&stdout);
    let postgres: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.comm == "postgres" && !user_part(e).is_empty())
        .collect();
    let total: u64 = postgres.iter().map(|e| e.us).sum();
    let not_from_start: u64 = postgres
        .iter()
        .filter(|e| !from_start(user_part(e)))
        .map(|e| e.us)
        .sum();
    // The blocks in a system call, of the stacks the profiler could name
    // (a process that exits during the trace, before its names are read,
    // has its frames `[unknown]`): every one reaches `_start`. (Some others
    // legitimately stop short: a page fault in a library's destructor at
    // exit, which has no call-frame information, or under the dynamic
    // linker's `_dl_runtime_resolve`, whose frame is found through rbx.)
    let in_syscall_named = |e: &&&Entry| {
        e.frames.iter().any(|f| f.starts_with("entry_SYSCALL_64"))
            && user_part(e).iter().any(|f| f != "[unknown]")
    };
    let syscalls: Vec<&&Entry> = postgres.iter().filter(in_syscall_named).collect();
    let guessed: Vec<&&Entry> = syscalls
        .iter()
        .copied()
        .filter(|e| !from_start(user_part(e)))
        .collect();
    let forked = count_before_any(
        &stderr,
        &[
            "new process used its parent's from the fork",
            "new processes used their parent's from the fork",
        ],
    );
    let fp_walked = fp_walked(&stderr);
    let got: Option<Vec<String>> = entries
        .iter()
        .filter(|e| e.tid == backend && e.comm == "postgres")
        .max_by_key(|e| e.us)
        .map(|e| user_part(e).to_vec());
    eprintln!(
        "postgres ({hook}): {transactions} transactions (a backend each), {forked} new processes used \
         their parent's tables from the fork; {} postgres stacks ({total} us, {not_from_start} us \
         of them not from _start), {} blocked in a system call and named, {} of them not from \
         _start; {fp_walked} user stacks of the machine walked with frame pointers for want of \
         tables",
        postgres.len(),
        syscalls.len(),
        guessed.len()
    );

    assert!(
        guessed.is_empty(),
        "postgres stacks blocked in a system call that do not reach _start: {guessed:#?}\n{stderr}"
    );
    // Traced for 4 of pgbench's 6 s.
    assert!(
        forked * 2 > transactions,
        "{forked} forked processes used their parent's tables, for {transactions} \
         transactions:\n{stderr}"
    );
    let got = got.unwrap_or_else(|| panic!("no stack of the idle backend {backend}"));
    assert!(
        from_start(&got),
        "the idle backend's stack does not reach _start: {got:?}"
    );
    let mut rest = got.iter();
    assert!(
        gdb_own.iter().all(|n| rest.any(|g| g == n)),
        "gdb's names of the backend's frames ({}) not all in order in its stack {got:?}",
        gdb_own.join(" <- ")
    );
    if let Some(report) = mismatch("postgres backend", &expected, Some(&got)) {
        panic!("the idle backend's stack is not gdb's:\n{report}");
    }
    eprintln!(
        "postgres ({hook}): the idle backend's stack is gdb's ({} frames; gdb names {})",
        got.len(),
        gdb_own.join(" <- ")
    );
}

/// `stackfarm --procs 200 --depth 40` started right after the profiler
/// attached (system-wide, 3 s): 200 new images, their 8000 threads each
/// blocking every 50 ms under its own depth of `farm_level`. At least
/// 99.9% of the farm threads' time is under their whole stack (thread
/// `farm-D`: `clone3` outermost and D + 1 `farm_level` frames, fewer where
/// it was preempted on its way down, none before it gets there), at most
/// 0.1% of the machine's user stacks are missed for want of tables
/// (counted and said), and at most 0.1% are walked with frame pointers
/// for want of them.
///
/// The farm's processes are walked through the tables of the files they
/// map once the farm's program has tables; until then their blocks are
/// copied, at most one stack per 250 us per CPU, and the rest are missed.
/// What keeps that time short on a 2-core machine under 8,000 new threads:
/// the event loop takes the first notices at once (kallsyms is read on a
/// thread of its own), and the lookout raises the loop into the real-time
/// class when copies are lost (at nice -20 it got a sixth of a CPU and
/// missed from none to all of the farm's blocks, run to run).
#[test]
fn a_stackfarm_started_with_the_trace() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let farm = example_path("stackfarm");
    // Room for the farm's distinct stacks: 200 × 40 user stacks (each
    // process has its own addresses), with their kernel stacks.
    let (mut profiler, stdout, lines, stderr) = spawn_lines(
        &["-d", "-f", "--stack-storage-size", "65536", "3"],
        &[("OFFCPUTIME_STATS_INTERVAL", "0.5")],
    );
    wait_for_line(&lines, "offcputime: attached ");
    let _farm = KillOnDrop(
        Command::new(farm)
            .args(["--procs", "200", "--depth", "40", "--seconds", "10"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start stackfarm"),
    );
    let status = profiler.wait().expect("wait for offcputime");
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "offcputime failed: {stderr}");

    let lines = parse_folded(&stdout);
    let depth = |l: &Folded| l.comm().strip_prefix("farm-")?.parse::<usize>().ok();
    let whole = |l: &Folded| {
        let Some(d) = depth(l) else { return false };
        let user = &l.frames[1..l.pos("-").unwrap_or(l.frames.len())];
        let levels: Vec<usize> = (0..user.len())
            .filter(|&i| user[i] == "farm_level")
            .collect();
        // A thread caught before it reached `farm_level` (its start) has
        // none; one preempted on its way down, fewer, the innermost;
        // otherwise all of its own, in a row.
        let down = levels.len() <= d && user.last().is_some_and(|f| f == "farm_level");
        user.first()
            .is_some_and(|f| f == "clone3" || f == "__clone3")
            && (levels.is_empty()
                || (levels.len() == d + 1 || down) && levels.windows(2).all(|w| w[1] == w[0] + 1))
    };
    let farm_us = sum_us_where(&lines, |l| depth(l).is_some());
    let whole_us = sum_us_where(&lines, whole);
    let missed_us = sum_us_where(&lines, |l| {
        depth(l).is_some() && l.frames.get(1).is_some_and(|f| f == "[Missed User Stack]")
    });
    let threads: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter(|l| depth(l).is_some())
        .map(Folded::comm)
        .collect();
    let fp_walked = fp_walked(&stderr);
    let walked = count_before_any(
        &stderr,
        &[" stack walked with them", " stacks walked with them"],
    );
    let copied = count_before_any(
        &stderr,
        &[
            "user stack taken before its process's tables were ready",
            "user stacks taken before their process's tables were ready",
        ],
    );
    let by_file = count_before_any(
        &stderr,
        &[
            "user stack of processes without tables of their own walked through",
            "user stacks of processes without tables of their own walked through",
        ],
    );
    eprintln!(
        "stackfarm: {whole_us} of {farm_us} us of the farm threads' time under their whole \
         stack ({:.3}%, {missed_us} us missed, {} thread names); {walked} stacks walked with \
         tables ({by_file} through the files' tables), {copied} copied and walked in userspace, \
         {fp_walked} walked with frame pointers for want of tables",
        whole_us as f64 * 100.0 / farm_us.max(1) as f64,
        threads.len()
    );
    // The farm's lines not under their whole stack (but for those missed,
    // counted above), the longest first: printed before anything else is
    // checked, so that a log cut short still shows them.
    let mut partial: Vec<&Folded> = lines
        .iter()
        .filter(|l| {
            depth(l).is_some()
                && !whole(l)
                && l.frames.get(1).is_none_or(|f| f != "[Missed User Stack]")
        })
        .collect();
    partial.sort_by_key(|l| std::cmp::Reverse(l.us));
    eprintln!(
        "stackfarm: {} us in {} lines not under their whole stack (not missed)",
        partial.iter().map(|l| l.us).sum::<u64>(),
        partial.len()
    );
    for l in partial.iter().take(12) {
        eprintln!("stackfarm: partial {} {}", l.frames.join(";"), l.us);
    }
    for l in stderr.lines().filter(|l| {
        l.contains("unwind") || l.contains("missed") || l.contains("stats") || l.contains("dropped")
    }) {
        eprintln!("stackfarm: {l}");
    }
    assert_eq!(
        threads.len(),
        40,
        "not every farm thread was seen:\n{stderr}"
    );
    assert!(
        farm_us > 1_000_000_000,
        "too little of the farm's time ({farm_us} us):\n{stderr}"
    );
    assert!(
        whole_us * 1000 >= farm_us * 999,
        "only {whole_us} of {farm_us} us of the farm threads' time under their whole stack \
         ({missed_us} us missed); the others:\n{}\n{stderr}",
        lines
            .iter()
            .filter(|l| depth(l).is_some() && !whole(l))
            .take(20)
            .map(|l| format!("{} {}", l.frames.join(";"), l.us))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        copied + by_file > 0,
        "no first blocks walked through files' tables or copied:\n{stderr}"
    );
    let missed_lines = [
        "user stack taken before its process's unwind tables were ready is missed",
        "user stacks taken before their process's unwind tables were ready are missed",
    ];
    let missed = if missed_lines.iter().any(|l| stderr.contains(l)) {
        count_before_any(&stderr, &missed_lines)
    } else {
        0
    };
    assert!(
        missed * 1000 <= walked + copied,
        "{missed} user stacks missed for want of tables, of {walked} + {copied}:\n{stderr}"
    );
    assert!(
        fp_walked * 1000 <= walked + copied,
        "{fp_walked} user stacks walked with frame pointers, of {walked} + {copied}:\n{stderr}"
    );
}
