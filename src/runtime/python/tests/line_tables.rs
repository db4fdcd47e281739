//! Line tables decoded as each installed CPython decodes them.

use super::*;
use std::process::Command;

/// Prints, for every code object compiled from the file it is given,
/// its line table and the line of each code unit: from `co_lines()`
/// (the ranges CPython decodes from the table), and from
/// `co_positions()` where there is one.
const DUMP_LINES: &str = r#"
import json, sys
src = open(sys.argv[1]).read()
out = []
def walk(co):
    units = len(co.co_code) // 2
    lines = [None] * units
    for start, end, line in co.co_lines():
        for off in range(start, min(end, 2 * units), 2):
            lines[off // 2] = line
    e = {"qualname": getattr(co, "co_qualname", co.co_name),
         "firstlineno": co.co_firstlineno,
         "linetable": co.co_linetable.hex(), "lines": lines}
    if hasattr(co, "co_positions"):
        e["positions"] = [p[0] for p in co.co_positions()]
    out.append(e)
    for c in co.co_consts:
        if isinstance(c, type(co)):
            walk(c)
walk(compile(src, sys.argv[1], "exec"))
json.dump(out, sys.stdout)
"#;

pub(super) fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The line table decoder gives CPython's line for every code unit of
/// every code object of a sample, in each installed version: from the
/// byte offset, and from what the BPF program records (`f_lasti` in
/// 3.10, the offset from the code object in 3.11 on).
#[test]
fn line_tables_decode_as_cpython_does() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("sample.py");
    std::fs::write(&source, sample_source()).unwrap();
    let dump = dir.path().join("dump.py");
    std::fs::write(&dump, DUMP_LINES).unwrap();
    for py in pythons() {
        let out = Command::new(&py.exe)
            .arg(&dump)
            .arg(&source)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {out:?}", py.exe.display());
        let codes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let layout = py.layout();
        let (mut units, mut none) = (0, 0);
        for code in codes.as_array().unwrap() {
            let name = code["qualname"].as_str().unwrap();
            let table = unhex(code["linetable"].as_str().unwrap());
            let first = code["firstlineno"].as_i64().unwrap() as i32;
            let start = layout.co_code_start.map_or(0, u32::from);
            let lines = match layout.frame_kind {
                FrameKind::Object310 => LineTable::pep626(table, first),
                _ => LineTable::locations(table, first, start),
            };
            let want = code["lines"].as_array().unwrap();
            for (i, want) in want.iter().enumerate() {
                let want = want.as_u64().map(|l| l as u32);
                let i = i as u32;
                let instr = match layout.frame_kind {
                    FrameKind::Object310 => i,
                    _ => start + 2 * i,
                };
                let at =
                    |what: &str| format!("{} {name}: code unit {i} ({what})", py.exe.display());
                assert_eq!(
                    lines.line_at_offset(2 * u64::from(i)),
                    want,
                    "{}",
                    at("offset")
                );
                assert_eq!(lines.line(instr), want, "{}", at("recorded"));
                if let Some(p) = code.get("positions") {
                    let p = p[i as usize].as_u64().map(|l| l as u32);
                    assert_eq!(p, want, "{}", at("co_positions against co_lines"));
                }
                units += 1;
                none += usize::from(want.is_none());
            }
            // Nothing beyond the bytecode.
            let end = 2 * want.len() as u64;
            assert_eq!(lines.line_at_offset(end), None, "{name}: beyond the end");
        }
        assert!(codes.as_array().unwrap().len() >= 12 && units > 500);
        assert!(
            none > 0,
            "{}: no instruction without a line",
            py.exe.display()
        );
        eprintln!(
            "{}: {units} code units, {none} without a line",
            py.exe.display()
        );
    }
}
