//! The kernel x hook matrix: `scripts/vmtest` boots Debian's 6.1 and 6.12
//! kernels in qemu and runs the hook tests of e2e.rs there (with this very
//! test binary), and on this machine's kernel.
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
        .output()
        .expect("run scripts/vmtest");
    let table = String::from_utf8_lossy(&out.stdout);
    eprintln!("{table}");
    assert!(
        out.status.success(),
        "kernel matrix failed:\n{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every kernel of the matrix was booted and reported.
    for kernel in ["6.1.", "6.12.", "(host)"] {
        assert!(table.contains(kernel), "{kernel} missing from\n{table}");
    }
}
