//! The kernel x hook matrix: `scripts/vmtest` boots Debian's 5.10, 6.1 and
//! 6.12 kernels in qemu and runs the hook tests of e2e.rs there (with this very
//! test binary). On this machine's kernel the same tests run as part of the
//! suite itself, so the matrix leaves out its host row (`--no-host`).
//!
//! Runs under CI=true; elsewhere only with OFFCPUTIME_VMTEST=1 (it takes a
//! few minutes under software emulation).

use std::process::Command;

use crate::util::*;

#[test]
fn kernel_matrix() {
    if !require_root() {
        return;
    }
    if !is_ci() && std::env::var_os("OFFCPUTIME_VMTEST").is_none() {
        eprintln!("skipped: set OFFCPUTIME_VMTEST=1 to boot the kernel matrix");
        return;
    }
    let _g = serial();
    let test_binary = std::env::current_exe().expect("test binary path");
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/vmtest"))
        .arg("--test-binary")
        .arg(&test_binary)
        .args(["--offcputime", env!("CARGO_BIN_EXE_offcputime")])
        .arg("--blocker")
        .arg(blocker_path())
        .arg("--markdown")
        .arg("--no-host")
        .output()
        .expect("run scripts/vmtest");
    let table = String::from_utf8_lossy(&out.stdout);
    // The cells that failed first (one line each, what a log cut to its
    // head or its tail keeps), then the table, then what vmtest said
    // (each failed test's output, which can run to pages).
    assert!(
        out.status.success(),
        "kernel matrix failed: {}\n{table}\n{}",
        failed_cells(&table),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every kernel of the matrix was booted and reported, and every cell
    // passed: the kprobe cells say "pass" on the Debian kernels, which
    // have kprobes; the DWARF walk's and the Java walk's are "n/a" only on
    // 5.10.
    let rows = matrix_rows(&table);
    for kernel in ["5.10.", "6.1.", "6.12."] {
        let row = rows
            .iter()
            .find(|r| r["kernel"].starts_with(kernel) || r["kernel"].ends_with(kernel))
            .unwrap_or_else(|| panic!("{kernel} missing from\n{table}"));
        for (hook, cell) in row {
            if hook == "kernel" || hook == "time" {
                continue;
            }
            // The cells of the DWARF walk's tests: "n/a" on 5.10 only,
            // which has no bpf_loop (vmtest checks the kernel's version).
            let dwarf = hook.starts_with("fork/") || hook.starts_with("signal/");
            // The Java and node cells': "n/a" on 5.10 only, where the
            // profiler says that it does not read their frames (the tests
            // check it does).
            let java = hook == "java";
            let node = hook == "node";
            let ok = cell.starts_with("pass")
                || (dwarf && kernel == "5.10." && cell == "n/a: no DWARF walk")
                || (java && kernel == "5.10." && cell == "n/a: no Java walk")
                || (node && kernel == "5.10." && cell == "n/a: no JavaScript walk");
            assert!(ok, "{kernel} {hook}: {cell}\n{table}");
        }
    }
}

/// The cells of vmtest's table that did not pass, as "kernel hook: cell"
/// on one line.
fn failed_cells(table: &str) -> String {
    let rows = if table.lines().any(|l| l.starts_with('|')) {
        matrix_rows(table)
    } else {
        return "no table".to_string();
    };
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|row| {
            let kernel = row.get("kernel").cloned().unwrap_or_default();
            row.iter()
                .filter(|(_, cell)| cell.starts_with("FAIL"))
                .map(move |(hook, cell)| format!("{kernel} {hook}: {cell}"))
        })
        .collect();
    if failed.is_empty() {
        "no cell says FAIL".to_string()
    } else {
        failed.join("; ")
    }
}

/// The rows of vmtest's Markdown table, column name to cell.
fn matrix_rows(table: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let cells = |l: &str| -> Vec<String> {
        l.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let mut lines = table.lines().filter(|l| l.starts_with('|'));
    let header = cells(
        lines
            .next()
            .unwrap_or_else(|| panic!("no table in\n{table}")),
    );
    for col in [
        "kernel",
        "tp_btf",
        "raw_tp",
        "kprobe",
        "auto",
        "kprobe=tp_btf",
        "fork/tp_btf",
        "signal/kprobe",
        "java",
        "node",
        "time",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "no column {col} in\n{table}"
        );
    }
    lines
        .filter(|l| !l.starts_with("|---"))
        .map(|l| header.iter().cloned().zip(cells(l)).collect())
        .collect()
}

/// The rules by which vmtest counts a cell as passed (its test ran, passed
/// and printed its `matrix:` line; "n/a" only where the kernel has no
/// kprobes) and a `--switch-cost` run as measured, on made-up outputs. No
/// VM, no privileges: it runs everywhere.
#[test]
fn vmtest_cell_rules() {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/vmtest"))
        .arg("--self-test")
        .output()
        .expect("run scripts/vmtest --self-test");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("self-test: ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
