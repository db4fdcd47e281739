//! Compiles the BPF programs and generates their Rust skeletons: the
//! profiler's, the kernel symbols' lookup, and the floor programs of the
//! overhead benchmark.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

fn skeleton(src: &str, name: &str) {
    let dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let out = dir.join(format!("{name}.skel.rs"));
    SkeletonBuilder::new()
        .source(src)
        // Kept for the tests that read the object itself (its frames).
        .obj(dir.join(format!("{name}.bpf.o")))
        .clang_args(["-Isrc/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(&out)
        .unwrap_or_else(|e| panic!("building {src} failed (is clang installed?): {e:#}"));
}

fn main() {
    skeleton("src/bpf/offcputime.bpf.c", "offcputime");
    skeleton("src/bpf/floor.bpf.c", "floor");
    skeleton("src/bpf/ksyms.bpf.c", "ksyms");
    println!("cargo:rerun-if-changed=src/bpf");
}
