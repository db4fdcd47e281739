//! Compiles the BPF program and generates its Rust skeleton.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/offcputime.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
        .join("offcputime.skel.rs");
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args(["-Isrc/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(&out)
        .unwrap_or_else(|e| panic!("building {SRC} failed (is clang installed?): {e:#}"));
    println!("cargo:rerun-if-changed=src/bpf");
}
