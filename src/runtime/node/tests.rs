//! Tests of the naming of JavaScript functions: against the nodes
//! installed (node 20 from Debian, 22 and 24 from npm, where
//! `scripts/setup --test` puts them: see [`nodes`]), whose heaps the tests
//! read while they wait, and over garbage.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::names::{Error, LineTable, Reader};
use super::v8dbg::{Layout, Metadata};
use crate::runtime::{Memory, ProcMem};

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The nodes installed, by major version; a missing one fails under
/// CI=true.
fn nodes() -> Vec<(u32, PathBuf)> {
    let npm = |v: &str| PathBuf::from(format!("/opt/offcputime-test/node/{v}/bin/node"));
    let mut found = Vec::new();
    for (major, path) in [
        (20, PathBuf::from("/usr/bin/node")),
        (22, npm("22")),
        (24, npm("24")),
    ] {
        if path.exists() {
            found.push((major, path));
        } else {
            assert!(!ci(), "{} is needed (CI=true)", path.display());
            eprintln!("skipped: {} not found", path.display());
        }
    }
    found
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn layouts_of_the_installed_nodes() {
    for (major, node) in nodes() {
        let l = Layout::read(&node).unwrap();
        let v = l.version.unwrap();
        let expected = match major {
            20 => (11, 3),
            22 => (12, 4),
            _ => (13, 6),
        };
        assert_eq!((v.major, v.minor), expected, "{}", node.display());
        assert!(l.scope_info_flags.is_some(), "{v}");
        assert_eq!(l.smi_shift, 32);
        assert_eq!(l.off_fp_function, -16);
        assert_eq!(
            l.interpreter_builtins.len(),
            4,
            "{:?}",
            l.interpreter_builtins
        );
        assert!(l.frame_types.interpreted != l.frame_types.baseline);
        let sizes = l.bytecode_sizes.as_ref().expect("the bytecodes' sizes");
        // Single, double and quadruple width: LdaSmi (an 8-bit operand
        // scaled) grows; the prefixes do not.
        let n = sizes.len() / 3;
        assert!(n > 150, "{n} bytecodes");
        assert_eq!([sizes[0], sizes[n], sizes[2 * n]], [1, 1, 1]);
    }
}

/// A missing symbol is an error that names it.
#[test]
fn a_missing_symbol_is_named() {
    let Some((_, node)) = nodes().into_iter().next() else {
        return;
    };
    let mut m = Metadata::read(&node).unwrap();
    m.values
        .retain(|k, _| !k.starts_with("class_SharedFunctionInfo__name_or_scope_info"));
    let e = Layout::from_metadata(&m).unwrap_err().to_string();
    assert!(
        e.contains("v8dbg_class_SharedFunctionInfo__name_or_scope_info__*"),
        "{e}"
    );
    let mut m = Metadata::read(&node).unwrap();
    m.values.remove("off_fp_function");
    let e = Layout::from_metadata(&m).unwrap_err().to_string();
    assert!(e.contains("v8dbg_off_fp_function"), "{e}");
    // Another V8 version: its compiled functions' names cannot be told.
    let mut m = Metadata::read(&node).unwrap();
    m.version.as_mut().unwrap().minor += 1;
    assert!(Layout::from_metadata(&m)
        .unwrap()
        .scope_info_flags
        .is_none());
}

/// The case the workload reports: what V8 says of the function.
#[derive(Debug)]
struct Case {
    label: String,
    fn_name: String,
    position: i64,
    /// From the CallSite inside the function (None: never called).
    site: Option<(String, Option<String>)>,
}

#[test]
fn names_read_from_running_nodes() {
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/node_names.js");
    let source: Vec<u16> = std::fs::read_to_string(&workload)
        .unwrap()
        .encode_utf16()
        .collect();
    let lines = LineTable::from_source(&source);
    for (major, node) in nodes() {
        let layout = Layout::read(&node).unwrap();
        let mut child = KillOnDrop(
            Command::new(&node)
                .args(["--allow-natives-syntax", "--expose-gc"])
                .arg(&workload)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdout = child.0.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Each %DebugPrint: the function's address, then its SFI's.
            let mut function = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
                if let Some(rest) = line.strip_prefix("DebugPrint: ") {
                    function = Some(hex(rest.split(':').next().unwrap()));
                } else if let Some(rest) = line.strip_prefix(" - shared_info: ") {
                    let _ = tx.send((
                        function.take().unwrap(),
                        hex(rest.split(' ').next().unwrap()),
                    ));
                }
            }
        });
        let mut cases = Vec::new();
        for line in BufReader::new(child.0.stderr.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(json) = line.strip_prefix("CASES ") {
                let v: serde_json::Value = serde_json::from_str(json).unwrap();
                for c in v.as_array().unwrap() {
                    let s = &c["site"];
                    cases.push(Case {
                        label: c["label"].as_str().unwrap().into(),
                        fn_name: c["fnName"].as_str().unwrap().into(),
                        position: c["position"].as_i64().unwrap(),
                        site: (!s.is_null()).then(|| {
                            (
                                s["name"].as_str().unwrap_or("").to_string(),
                                s["file"].as_str().map(str::to_string),
                            )
                        }),
                    });
                }
            } else if line == "READY" {
                break;
            } else {
                eprintln!("node {major}: {line}");
            }
        }
        assert!(cases.len() > 20, "node {major}: {} cases", cases.len());
        let pairs: Vec<(u64, u64)> = (0..cases.len())
            .map(|_| rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap())
            .collect();
        let mem = ProcMem::open(child.0.id()).unwrap();
        let reader = Reader::new(&layout, &mem);
        let mut failures = Vec::new();
        for (case, &(function, sfi)) in cases.iter().zip(&pairs) {
            // The metadata's JSFunction.shared holds the SFI.
            let mut b = [0u8; 8];
            mem.read(
                function - layout.heap_object_tag + layout.js_function_shared,
                &mut b,
            )
            .unwrap();
            assert_eq!(u64::from_le_bytes(b), sfi, "node {major}: {}", case.label);
            let got = reader.function(sfi);
            eprintln!("node {major}: {}: {got:?}", case.label);
            let got = match (got, &case.site) {
                (Ok(f), _) => f,
                // V8 12 on keeps an uncompiled function's inferred name
                // where the metadata does not say.
                (Err(Error::Unknown(_)), None) if major > 20 && case.fn_name.is_empty() => continue,
                (Err(e), _) => {
                    failures.push(format!("node {major}: {}: {e}", case.label));
                    continue;
                }
            };
            let (name, file) = match &case.site {
                // CallSite names the unnamed functions of code from eval
                // (and `new Function`) "eval", a name of no SFI.
                Some((name, None)) if name == "eval" => (String::new(), None),
                // A computed property key names the JSFunction (its own
                // "name" property, which CallSite prefers), not its SFI:
                // the SFI's name is the variable's it was assigned to.
                Some((_, file)) if case.label == "computed" => {
                    ("computed".to_string(), file.clone())
                }
                Some((name, file)) => (name.clone(), file.clone()),
                None if case.fn_name.is_empty() => {
                    // Never called: its inferred name (node 20).
                    (
                        "neverCalledInferred.inferredNever".to_string(),
                        Some(workload.display().to_string()),
                    )
                }
                None if case.label == "node builtin" => {
                    (case.fn_name.clone(), Some("node:path".to_string()))
                }
                None => (case.fn_name.clone(), Some(workload.display().to_string())),
            };
            if got.name != name {
                failures.push(format!(
                    "node {major}: {}: named {:?}, V8 says {name:?}",
                    case.label, got.name
                ));
            }
            if got.script_name != file {
                failures.push(format!(
                    "node {major}: {}: in {:?}, V8 says {file:?}",
                    case.label, got.script_name
                ));
            }
            let position = u32::try_from(case.position).ok();
            // V8 12 on: an uncompiled function's start is in its
            // uncompiled data, where the metadata does not say.
            let uncompiled_unknown = major > 20 && case.site.is_none();
            if got.start_position != position
                && !(uncompiled_unknown && got.start_position.is_none())
            {
                failures.push(format!(
                    "node {major}: {}: starts at {:?}, V8 says {position:?}",
                    case.label, got.start_position
                ));
            }
            // The line and column of the start, from the heap (the
            // script's line ends, or its source) as from the file.
            if let (Some(script), Some(p), "node builtin") =
                (got.script, position, case.label.as_str())
            {
                // Node's source, an external string (or its line ends).
                let table = LineTable::read(&reader, script).unwrap();
                assert!(table.line_column(p).is_some(), "node {major}: {table:?}");
            }
            if let (Some(script), Some(p), Some(_)) = (got.script, position, &file) {
                if file.as_deref() == Some(&*workload.display().to_string()) {
                    let table = LineTable::read(&reader, script).unwrap();
                    assert_eq!(
                        table.line_column(p),
                        lines.line_column(p),
                        "node {major}: {}",
                        case.label
                    );
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        let _ = child.0.stdin.take().unwrap().write_all(b"");
    }
}

/// Memory of random bytes: a small region, repeated over the whole
/// address space (so that pointers read from it lead back into it, and
/// walks of strings and ScopeInfos meet structure-like garbage), with
/// holes that cannot be read.
struct Garbage {
    bytes: Vec<u8>,
}

impl Memory for Garbage {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if addr >> 40 & 1 == 1 || buf.len() > 1 << 20 {
            return Err(std::io::Error::other("unmapped"));
        }
        let n = self.bytes.len() as u64;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.bytes[((addr + i as u64) % n) as usize];
        }
        Ok(())
    }
}

/// A xorshift generator: reproducible garbage.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn garbage_is_an_error_never_a_panic() {
    let layouts: Vec<Layout> = nodes()
        .iter()
        .map(|(_, n)| Layout::read(n).unwrap())
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15;
    for layout in &layouts {
        assert!(layout.code.is_ok(), "{:?}", layout.code);
        for round in 0..200 {
            // Random bytes, some rounds with small values that look like
            // tagged pointers, Smis and instance types.
            let bytes: Vec<u8> = (0..4096)
                .map(|_| {
                    let v = xorshift(&mut state);
                    if round % 2 == 0 {
                        v as u8
                    } else {
                        [0, 1, 8, 16, 0x11, 0x19, (v >> 8) as u8][(v % 7) as usize]
                    }
                })
                .collect();
            let mem = Garbage { bytes };
            let reader = Reader::new(layout, &mem);
            for _ in 0..100 {
                let v = xorshift(&mut state);
                let sfi = if v & 1 == 0 { v & 0xffff | 1 } else { v | 1 };
                // Whatever it says, it returns.
                let _ = reader.function(sfi);
                let _ = LineTable::read(&reader, sfi);
                let _ = reader.string(sfi, 1 << 16);
                let _ = reader.bytecode_position(sfi, (v >> 40) as i64 % 300);
                let code = super::code::Code {
                    code: sfi,
                    start: v >> 20,
                    size: v >> 50,
                    kind: 15,
                };
                let _ = reader.optimized_frames(&code, code.start + (v & 0xff) + 1);
                let baseline = super::code::Code {
                    kind: layout.code.as_ref().unwrap().kind_baseline,
                    ..code
                };
                let _ = reader.baseline_position(&baseline, code.start + (v & 0xff) + 1);
            }
            // A search for a return address's code, through garbage.
            let mut map = None;
            let _ = reader.code_at(xorshift(&mut state) & 0xffff_ffff_fff0, &mut map);
        }
        let _ = reader_loops(layout);
    }
}

/// A cons string whose parts are itself, its map a map: an error, not
/// an endless walk.
fn reader_loops(layout: &Layout) -> Result<(), Error> {
    let mut bytes = vec![0u8; 256];
    let tag = layout.heap_object_tag;
    let put = |b: &mut Vec<u8>, at: u64, v: u64| {
        b[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes())
    };
    // The string at 0, its map at 128, the meta map at 192 (its own map).
    put(&mut bytes, layout.heap_object_map, 128 + tag);
    put(&mut bytes, 128 + layout.heap_object_map, 192 + tag);
    put(&mut bytes, 192 + layout.heap_object_map, 192 + tag);
    bytes[(192 + layout.map_instance_type) as usize..][..2]
        .copy_from_slice(&layout.type_map.to_le_bytes());
    let cons = layout.strings.cons_tag | layout.strings.one_byte_tag;
    bytes[(128 + layout.map_instance_type) as usize..][..2].copy_from_slice(&cons.to_le_bytes());
    bytes[layout.string_length as usize..][..4].copy_from_slice(&100u32.to_le_bytes());
    put(&mut bytes, layout.cons_first, tag);
    put(&mut bytes, layout.cons_second, tag);
    let mem = Garbage { bytes };
    let r = Reader::new(layout, &mem);
    let e = r.string(tag, 1 << 16).unwrap_err();
    assert!(e.to_string().contains("too many parts"), "{e}");
    assert!(matches!(e, Error::Unreadable(_)), "{e}");
    Err(e)
}
