//! Compiles the BPF programs and generates their Rust skeletons: the
//! profiler's, the kernel symbols' lookup, and the floor programs of the
//! overhead benchmark. For the profiler's object, also the types its CO-RE
//! relocations name (`offcputime.core.rs`: `bpf::CORE_TYPES`), for the
//! tracer to relocate it against those of the kernel's types only.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

#[path = "src/btf.rs"]
#[allow(dead_code)]
mod btf;

fn out_dir() -> PathBuf {
    PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
}

fn skeleton(src: &str, name: &str) {
    let dir = out_dir();
    let out = dir.join(format!("{name}.skel.rs"));
    SkeletonBuilder::new()
        .source(src)
        // Kept for the tests that read the object itself (its frames).
        .obj(dir.join(format!("{name}.bpf.o")))
        .clang_args(["-Isrc/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(&out)
        .unwrap_or_else(|e| panic!("building {src} failed (is clang installed?): {e:#}"));
}

/// Writes `NAME.core.rs`: the (kind, name) of each type the CO-RE
/// relocations of `NAME.bpf.o` name, as `CORE_TYPES`.
fn core_types(name: &str) {
    let dir = out_dir();
    let object = std::fs::read(dir.join(format!("{name}.bpf.o"))).expect("the object just built");
    let types = btf::relocated_types(&object)
        .unwrap_or_else(|e| panic!("{name}.bpf.o: its CO-RE relocations: {e}"));
    let mut code = String::from(
        "/// The types (BTF kind, name) the CO-RE relocations of the BPF object name.\n\
         pub const CORE_TYPES: &[(u32, &str)] = &[\n",
    );
    for (kind, name) in types {
        code.push_str(&format!("    ({kind}, {name:?}),\n"));
    }
    code.push_str("];\n");
    std::fs::write(dir.join(format!("{name}.core.rs")), code).expect("OUT_DIR is writable");
}

fn main() {
    skeleton("src/bpf/offcputime.bpf.c", "offcputime");
    core_types("offcputime");
    skeleton("src/bpf/floor.bpf.c", "floor");
    skeleton("src/bpf/ksyms.bpf.c", "ksyms");
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-changed=src/btf.rs");
}
