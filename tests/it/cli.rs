//! Flag validation: every bad input is one line on stderr and exit 1,
//! checked before anything is loaded (no privileges needed).

use clap::Parser;
use offcputime::cli::Args;

use crate::util::offcputime;

fn config(args: &[&str]) -> anyhow::Result<offcputime::cli::Config> {
    let mut v = vec!["offcputime"];
    v.extend_from_slice(args);
    Args::try_parse_from(v)
        .map_err(anyhow::Error::from)?
        .into_config()
}

fn err(args: &[&str]) -> String {
    format!("{:#}", config(args).expect_err("should be rejected"))
}

#[test]
fn conflicting_flags() {
    assert!(err(&["-U", "-K"]).contains("mutually exclusive"));
    assert!(err(&["-u", "-k"]).contains("mutually exclusive"));
    assert!(err(&["-U", "-k"]).contains("kernel threads have no user stacks"));
    assert!(err(&["-m", "10", "-M", "5"]).contains("greater than"));
}

#[test]
fn bad_numbers() {
    assert!(err(&["0"]).contains("duration must be positive"));
    assert!(err(&["-5"]).contains("duration must be positive"));
    assert!(err(&["abc"]).contains("not a number"));
    assert!(err(&["-m", "-1"]).contains("must not be negative"));
    assert!(err(&["-p", "12,x"]).contains("invalid PID"));
    assert!(err(&["-t", "0"]).contains("invalid TID"));
    assert!(err(&["--perf-max-stack-depth", "128"]).contains("between 1 and 127"));
    assert!(err(&["--stack-storage-size", "0"]).contains("--stack-storage-size"));
    assert!(err(&["--state", "0x1ffffffff"]).contains("too large"));
    assert!(err(&["--sample", "0"]).contains("between 1 and 1000000"));
    assert!(err(&["--sample", "1000001"]).contains("between 1 and 1000000"));
    assert!(err(&["--sample", "1ms"]).contains("not a whole number"));
    assert!(err(&["--sample", "-5"]).contains("must not be negative"));
    assert!(err(&["--snapshot", "--sample", "1000"]).contains("--snapshot traces nothing"));
}

#[test]
fn sample_threshold() {
    let c = config(&["--sample", "1000", "1"]).unwrap();
    assert_eq!(c.tracer.sample_ns, 1_000_000);
    assert!(
        c.status_line().contains("(blocks under 1000 us sampled)"),
        "{}",
        c.status_line()
    );
    assert!(c.description().contains("blocks under 1000 us sampled"));
    assert_eq!(config(&[]).unwrap().tracer.sample_ns, 0);
}

#[test]
fn block_time_bounds_match_whole_microseconds() {
    let c = config(&["-m", "1000", "-M", "2000"]).unwrap();
    assert_eq!(c.tracer.min_block_ns, 1_000_000);
    // 2000.999 us is still "2000 us" as bcc counts it.
    assert_eq!(c.tracer.max_block_ns, 2_000_999);
    let c = config(&[]).unwrap();
    assert_eq!(c.tracer.min_block_ns, 1000);
    assert_eq!(c.tracer.max_block_ns, u64::MAX);
}

#[test]
fn lists_and_state() {
    let c = config(&["-p", "10,20,10", "--state", "0x2", "2.5"]).unwrap();
    assert_eq!(c.tracer.tgids, [10, 20]);
    assert_eq!(c.tracer.state, Some(2));
    assert_eq!(c.duration, Some(std::time::Duration::from_millis(2500)));
    let c = config(&["-p", "7", "-p", "8"]).unwrap();
    assert_eq!(c.tracer.tgids, [7, 8]);
}

#[test]
fn status_lines_as_bcc() {
    assert_eq!(
        config(&["5"]).unwrap().status_line(),
        "Tracing off-CPU time (us) of all threads by user + kernel stack for 5 secs."
    );
    assert_eq!(
        config(&["-p", "185", "-U"]).unwrap().status_line(),
        "Tracing off-CPU time (us) of PID 185 by user stack... Hit Ctrl-C to end."
    );
    assert_eq!(
        config(&["-k", "-K", "1"]).unwrap().status_line(),
        "Tracing off-CPU time (us) of kernel threads by kernel stack for 1 secs."
    );
}

/// The binary itself: one line, exit 1, no usage dump, no panic.
#[test]
fn binary_errors_are_one_line() {
    for args in [
        &["-U", "-K"][..],
        &["0"],
        &["-5"],
        &["--no-such-flag"],
        &["-m", "9", "-M", "1"],
        &["--sample", "0"],
        &["--hook", "nope"],
    ] {
        let out = offcputime().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("offcputime: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn help_and_version_succeed() {
    let out = offcputime().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--pid",
        "--tid",
        "--user-threads-only",
        "--kernel-threads-only",
        "--user-stacks-only",
        "--kernel-stacks-only",
        "--delimited",
        "--folded",
        "--offset",
        "--stack-storage-size",
        "--perf-max-stack-depth",
        "--min-block-time",
        "--max-block-time",
        "--sample",
        "--state",
        "--hook",
        "--svg",
        "--output",
        "--title",
        "--subtitle",
        "--width",
        "--minwidth",
        "--inverted",
        "--reverse",
        "--colors",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    assert!(offcputime()
        .arg("--version")
        .output()
        .unwrap()
        .status
        .success());
}

/// `offcputime --help | head -1`: the reader is gone before the help is
/// written; the profiler exits 0, quietly, as with any closed pipe.
#[test]
fn help_into_a_closed_pipe() {
    let mut child = offcputime()
        .arg("--help")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.is_empty(), "{err}");
}

#[test]
fn output_formats() {
    use offcputime::cli::Format;
    assert_eq!(config(&[]).unwrap().format, Format::Text);
    assert_eq!(config(&["-f"]).unwrap().format, Format::Folded);
    let c = config(&["--svg", "-p", "7", "-m", "1000", "1"]).unwrap();
    let Format::Svg(o) = &c.format else {
        panic!("{:?}", c.format)
    };
    assert_eq!(o.title, "Off-CPU Time Flame Graph");
    assert_eq!(
        o.subtitle.as_deref(),
        Some("PID 7, user + kernel stacks, blocks of 1000 us or more")
    );
    assert_eq!(c.output, None);
    // A file named .svg gets a flame graph, unless -f says otherwise.
    let c = config(&["-o", "x.SVG"]).unwrap();
    assert!(matches!(c.format, Format::Svg(_)));
    assert_eq!(c.output.as_deref(), Some(std::path::Path::new("x.SVG")));
    assert_eq!(
        config(&["-f", "-o", "x.svg"]).unwrap().format,
        Format::Folded
    );
    assert_eq!(config(&["-o", "-"]).unwrap().output, None);

    let c = config(&[
        "--svg",
        "--title",
        "T",
        "--subtitle",
        "",
        "--width",
        "800",
        "--minwidth",
        "0.5",
        "--inverted",
        "--reverse",
        "--colors",
        "hot",
    ])
    .unwrap();
    let Format::Svg(o) = c.format else { panic!() };
    assert_eq!(o.title, "T");
    assert_eq!(o.subtitle, None);
    assert_eq!(o.width, Some(800));
    assert_eq!(o.min_width, 0.5);
    assert!(o.inverted && o.reverse);
    assert_eq!(
        o.palette,
        inferno::flamegraph::Palette::Basic(inferno::flamegraph::color::BasicPalette::Hot)
    );
}

#[test]
fn bad_flame_graph_flags() {
    assert!(err(&["--title", "x"]).contains("--title is a flame graph option: add --svg"));
    assert!(err(&["-f", "--inverted"]).contains("--inverted is a flame graph option"));
    assert!(err(&["--svg", "-f"]).contains("cannot be used with"));
    assert!(err(&["--svg", "--colors", "plaid"]).contains("one of: io, hot"));
    assert!(err(&["--svg", "--width", "10"]).contains("between 100 and"));
    assert!(err(&["--svg", "--minwidth", "101"]).contains("percentage"));
    assert!(err(&["--svg", "--minwidth", "x"]).contains("percentage"));
}

/// Bad output paths fail at once, in one line, before anything is traced,
/// and a run that cannot start leaves an existing file as it was.
#[test]
fn bad_output_paths() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let missing_parent = format!("{d}/no/such/dir/out.svg");
    for (path, expected) in [
        (d, "is a directory"),
        (missing_parent.as_str(), "No such file or directory"),
    ] {
        let out = offcputime().args(["-o", path, "1"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{path}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("cannot write the output to"), "{err}");
        assert!(err.contains(expected), "{err}");
    }

    // A PID that does not exist: the run fails before tracing; an existing
    // file keeps its contents and a new one is not left behind.
    let kept = dir.path().join("kept.folded");
    std::fs::write(&kept, "keep me\n").unwrap();
    let fresh = dir.path().join("fresh.folded");
    for path in [&kept, &fresh] {
        let out = offcputime()
            .args(["-f", "-p", "2147483647", "-o", path.to_str().unwrap(), "1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
    }
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "keep me\n");
    assert!(!fresh.exists());
}

/// A directory the user may not write to: as root the test drops to
/// nobody, whose lack of privileges must not hide the path's error.
#[test]
fn unwritable_output_path() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let target = locked.join("out.svg");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let out = if root {
        std::process::Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_offcputime"))
            .args(["-o", target.to_str().unwrap(), "1"])
            .output()
            .unwrap()
    } else {
        offcputime()
            .args(["-o", target.to_str().unwrap(), "1"])
            .output()
            .unwrap()
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write the output to"), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
}

/// `--on-cpu` and `-F`: the rate, its bounds, what it does not go with,
/// the status line, the flame graph's subtitle and pprof's sample type.
#[test]
fn on_cpu_flags() {
    use offcputime::cli::Format;
    use offcputime::output::pprof::SampleType;
    let c = config(&["--on-cpu", "5"]).unwrap();
    assert_eq!(c.tracer.on_cpu_hz, Some(offcputime::cli::DEFAULT_ON_CPU_HZ));
    assert_eq!(
        c.status_line(),
        "Tracing on- and off-CPU time (us, on-CPU sampled at 309 Hz) of all threads by user + \
         kernel stack for 5 secs."
    );
    assert_eq!(config(&[]).unwrap().tracer.on_cpu_hz, None);
    assert_eq!(
        config(&["--on-cpu", "-F", "99"]).unwrap().tracer.on_cpu_hz,
        Some(99)
    );
    assert!(err(&["-F", "99"]).contains("add --on-cpu"));
    for bad in ["0", "10001", "1.5", "x", "-3"] {
        assert!(
            err(&["--on-cpu", "-F", bad]).contains("-F/--frequency must be"),
            "{bad}"
        );
    }
    assert!(err(&["--on-cpu", "--snapshot"]).contains("--on-cpu"));
    let svg = config(&["--on-cpu", "--svg", "1"]).unwrap();
    match &svg.format {
        Format::Svg(o) => assert!(
            o.subtitle.as_deref().unwrap().contains("warm colours"),
            "{:?}",
            o.subtitle
        ),
        f => panic!("{f:?}"),
    }
    let pprof = |args: &[&str]| match config(args).unwrap().format {
        Format::Pprof(o) => (o.sample_type, o.on_cpu),
        f => panic!("{f:?}"),
    };
    assert_eq!(
        pprof(&["--on-cpu", "--format", "pprof"]),
        (SampleType::Wallclock, true)
    );
    assert_eq!(
        pprof(&[
            "--on-cpu",
            "--format",
            "pprof",
            "--pprof-sample-type",
            "offcpu"
        ]),
        (SampleType::Offcpu, true)
    );
    assert_eq!(pprof(&["--format", "pprof"]), (SampleType::Offcpu, false));
}

#[test]
fn timeline_flags() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let t = dir.path().join("t.pftrace");
    let t = t.to_str().unwrap();
    let c = config(&["--timeline", t, "5"]).unwrap();
    assert_eq!(c.tracer.timeline_min_ns, Some(1_000_000));
    assert_eq!(c.timeline.as_deref(), Some(std::path::Path::new(t)));
    let c = config(&["--timeline", t, "--timeline-min", "250", "5"]).unwrap();
    assert_eq!(c.tracer.timeline_min_ns, Some(250_000));
    assert_eq!(config(&["5"]).unwrap().tracer.timeline_min_ns, None);
    assert!(err(&["--timeline-min", "5"]).contains("--timeline-min is for --timeline FILE"));
    assert!(err(&["--timeline", t, "--timeline-min", "x"]).contains("--timeline-min"));
    assert!(err(&["--timeline", t, "--timeline-min", "3600000001"]).contains("too long"));
    assert!(err(&["--timeline", t, "-o", t]).contains("also an output"));
    assert!(err(&["--snapshot", "--timeline", t]).contains("--snapshot traces nothing"));
}

#[test]
fn chains_flags() {
    let c = config(&["--chains", "5"]).unwrap();
    assert_eq!(c.chain_depth, Some(5));
    assert!(c.tracer.chains);
    assert_eq!(c.tracer.records_min_ns(), Some(1));
    let c = config(&["--chains", "--chain-depth", "2", "5"]).unwrap();
    assert_eq!(c.chain_depth, Some(2));
    assert_eq!(config(&["5"]).unwrap().chain_depth, None);
    assert!(!config(&["5"]).unwrap().tracer.chains);
    assert!(err(&["--chain-depth", "2"]).contains("--chain-depth is for --chains"));
    assert!(err(&["--chains", "--chain-depth", "0"]).contains("between 1 and 32"));
    assert!(err(&["--chains", "--chain-depth", "33"]).contains("between 1 and 32"));
    // Cut at the intervals' edges; the waker's samples where it ran.
    assert!(config(&["--chains", "-i", "1", "5"]).is_ok());
    assert!(config(&["--chains", "--on-cpu", "5"]).is_ok());
    assert!(err(&["--chains", "--wakers"]).contains("--chains does not go with --wakers"));
    assert!(err(&["--snapshot", "--chains"]).contains("--snapshot traces nothing"));
}

#[test]
fn graph_flags() {
    let c = config(&["--graph", "5"]).unwrap();
    assert!(c.graph && c.tracer.chains);
    assert_eq!(c.chain_depth, Some(5));
    let c = config(&["--graph", "-o", "/tmp/g.dot", "5"]).unwrap();
    assert!(matches!(c.format, offcputime::cli::Format::Dot));
    assert!(err(&["-o", "/tmp/g.dot", "5"]).contains("add --graph"));
    assert!(err(&["--graph", "-i", "1"]).contains("--graph is the whole window's"));
    assert!(err(&["--snapshot", "--graph"]).contains("--snapshot traces nothing"));
}
