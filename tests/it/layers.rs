//! The crate's modules depend on each other one way: from the kernel side
//! (the records the BPF program reports) to the outputs and the binary. A
//! module may use only those before it in [`LAYERS`]; a `crate::` path to
//! one after it fails this test, and so does a module missing from the list
//! (a new module is placed in it on purpose). Comments are not read (a doc
//! link to a later stage is not a dependency), nor unit tests (`#[cfg(test)]
//! mod tests`: a test of a file reader may check what a later stage makes
//! of the file).

use std::collections::BTreeSet;
use std::path::Path;

/// The modules of `src/`, each after everything it uses.
const LAYERS: &[&str] = &[
    // Shared with the BPF program, and plain data and system helpers.
    "bpf",
    "priority",
    "test_env",
    "text",
    "raw",
    "oncpu",
    "container",
    "btf",
    // Files: object files, the kernel's symbols, unwind tables.
    "elf",
    "ksyms",
    "unwind_table",
    "jit",
    "runtime",
    // Processes, names, the unwinder that feeds the BPF program.
    "process",
    "symbolize",
    "deferred",
    "unwind",
    // The BPF program: load, attach, read.
    "tracer",
    "intervals",
    // The profile, as the outputs shape and filter it.
    "profile",
    "shape",
    "records",
    "chains",
    "filter",
    "snapshot",
    "output",
    "timeline",
    "push",
    // The binary.
    "cli",
    "app",
];

/// The module a file under `src/` belongs to (its first path component).
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The modules `code` names by `crate::NAME` or in `use crate::{NAME, ..}`.
fn used(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found
}

#[test]
fn modules_use_only_earlier_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut back = Vec::new();
    let mut unplaced = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let module = module_of(rel);
        // A module's unit tests in a file of their own, as in a `mod tests`
        // block: not read.
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        if ["lib", "main", "bpf", "hostile"].contains(&module.as_str()) {
            // The crate root and the binary (above every module), the BPF
            // sources, and the robustness tests of the file readers.
            continue;
        }
        let Some(mine) = rank(&module) else {
            unplaced.insert(module);
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let text = text
            .find("#[cfg(test)]\nmod tests")
            .map_or(text.as_str(), |at| &text[..at]);
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for dep in used(&code) {
            match rank(&dep) {
                Some(theirs) if theirs > mine => {
                    back.push(format!("{} uses crate::{dep}", rel.display()))
                }
                // Items of the crate root (lib.rs) and `self`/`super`.
                _ => {}
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules not in LAYERS (place each after what it uses): {unplaced:?}"
    );
    assert!(
        back.is_empty(),
        "uses of later modules (move the item down, or the user up):\n{}",
        back.join("\n")
    );
}
