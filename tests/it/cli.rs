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
        "--state",
        "--hook",
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
