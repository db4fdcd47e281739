use super::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A missing interpreter or tool: a failure under CI=true, else a
/// skip, said.
fn missing(what: &str) {
    assert!(!ci(), "{what} is needed (CI=true)");
    eprintln!("skipped: {what} not found");
}

/// An interpreter the tests run: its executable, the object that holds
/// the interpreter (the shared libpython, or the executable itself),
/// and the version it says it is.
#[derive(Debug)]
struct Python {
    exe: PathBuf,
    object: PathBuf,
    version: (u8, u8, u8),
}

impl Python {
    fn minor(&self) -> u8 {
        self.version.1
    }
    fn layout(&self) -> &'static Layout {
        layout(self.version.0, self.version.1).unwrap()
    }
}

/// pyenv's newest 3.10, 3.11, 3.12 and 3.13 (shared builds), and
/// Debian's /usr/bin/python3.11 (the interpreter linked into a non-PIE
/// executable).
fn pythons() -> Vec<Python> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"))
        .join("versions");
    let mut found = Vec::new();
    for minor in 10..=13u8 {
        let newest = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let micro: u8 = name.strip_prefix(&format!("3.{minor}."))?.parse().ok()?;
                Some((micro, e.path()))
            })
            .max();
        let Some((_, dir)) = newest else {
            missing(&format!(
                "pyenv's CPython 3.{minor} (under {})",
                root.display()
            ));
            continue;
        };
        let exe = dir.join(format!("bin/python3.{minor}"));
        let object = dir.join(format!("lib/libpython3.{minor}.so.1.0"));
        if !exe.exists() || !object.exists() {
            missing(&format!("{} and {}", exe.display(), object.display()));
            continue;
        }
        found.push(Python {
            version: version_of(&exe),
            exe,
            object,
        });
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Python {
            version: version_of(&debian),
            exe: debian.clone(),
            object: debian,
        });
    } else {
        missing("/usr/bin/python3.11");
    }
    found
}

/// What the interpreter says its version is.
fn version_of(exe: &Path) -> (u8, u8, u8) {
    let out = Command::new(exe)
        .args(["-c", "import sys; print(*sys.version_info[:3])"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {out:?}", exe.display());
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<u8> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}

/// Python source with loops, multi-line expressions (with line jumps
/// of more than 127 both ways), try/except/finally, a comprehension,
/// nested functions, a class, a coroutine, a lambda and a line longer
/// than 254 bytes of bytecode.
fn sample_source() -> String {
    let gap = "\n".repeat(150);
    let far = vec!["        x"; 140].join(",\n");
    let plus = vec!["a"; 200].join(" + ");
    format!(
        r#"import sys

def loops(n):
    total = 0
    for i in range(n):
        while total < i:
            total += 1
        else:
            total -= 1
    return total

def multiline(a, b):
    x = (a +
         b *
         a)
    y = max(
        a,{gap}
        b,
    )
    return x, y

def handler(v):
    try:
        r = 1 / v
    except ZeroDivisionError as e:
        r = None
    except (TypeError,
            ValueError):
        r = -1
    finally:
        v = 0
    return r

def comprehension(xs):
    return [x * 2 for x in xs if x % 3]

def outer(k):
    def inner(j):
        return j + k
    return inner

def far_call(f, x):
    return f(
{far}
    )

def long_line(a):
    return {plus}

class Thing:
    @staticmethod
    def method(q):
        async def coro():
            return q
        return lambda: q
{gap}
if __name__ == "__main__":
    loops(3)
"#
    )
}

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

fn unhex(s: &str) -> Vec<u8> {
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

#[test]
fn inspect_finds_the_interpreters() {
    for py in pythons() {
        let file = File::open(&py.object).unwrap();
        let name = py.object.file_name().unwrap().to_str().unwrap();
        let interp = inspect(&file, name).unwrap().expect("an interpreter");
        let want_micro = if py.minor() == 10 { 0 } else { py.version.2 };
        assert_eq!(interp.version, (3, py.minor(), want_micro), "{py:?}");
        assert_eq!(interp.layout, Some(py.layout()), "{py:?}: {interp:?}");
        assert_eq!(interp.unsupported, None);
        assert!(!interp.free_threaded);
        // The symbols, as nm has them.
        let nm = nm(&py.object);
        let sym = |n: &str| nm.get(n).copied();
        assert_eq!(Some(interp.runtime), sym("_PyRuntime").map(|s| s.0));
        let (start, size) = sym("_PyEval_EvalFrameDefault").unwrap();
        assert_eq!(interp.eval, (start, start + size));
        assert!(size > 0x1000, "{py:?}: the eval loop is {size} bytes");
        assert_eq!(Some(interp.code_type), sym("PyCode_Type").map(|s| s.0));
        assert_eq!(
            interp.eval_cold,
            sym("_PyEval_EvalFrameDefault.cold").map(|(s, n)| (s, s + n))
        );
        // And under another name, 3.10's version is not known.
        let other = inspect(&file, "libinterp.so").unwrap().unwrap();
        if py.minor() == 10 {
            assert_eq!(other.layout, None);
            assert!(other.unsupported.is_some());
        } else {
            assert_eq!(other, interp);
        }
    }
    // Not interpreters: libc; pyenv's python3.12 executable, which has
    // the interpreter in its libpython; the stable-ABI shim.
    let libc = File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    assert_eq!(inspect(&libc, "libc.so.6").unwrap(), None);
    for py in pythons().iter().filter(|p| p.exe != p.object) {
        let exe = File::open(&py.exe).unwrap();
        let name = py.exe.file_name().unwrap().to_str().unwrap();
        assert_eq!(inspect(&exe, name).unwrap(), None, "{py:?}");
    }
    let text = File::open("/proc/self/maps").unwrap();
    assert!(inspect(&text, "python3.12").is_err());
}

/// `nm`'s symbols of a file (its full table, or its dynamic one if
/// it has none): name to (value, size).
fn nm(path: &Path) -> BTreeMap<String, (u64, u64)> {
    let run = |dynamic: bool| {
        let mut cmd = Command::new("nm");
        if dynamic {
            cmd.arg("-D");
        }
        let out = cmd.arg("-S").arg(path).output().expect("nm (binutils)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut text = run(false);
    if text.trim().is_empty() {
        text = run(true);
    }
    text.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            if t.len() != 4 {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            let name = t[3].split('@').next()?.to_string();
            Some((name, (hex(t[0])?, hex(t[1])?)))
        })
        .collect()
}

#[test]
fn names_tell_versions() {
    let v = |n: &str| {
        let named = version_in_name(n);
        (named.version, named.free_threaded, named.debug)
    };
    assert_eq!(v("libpython3.10.so.1.0"), (Some((3, 10)), false, false));
    assert_eq!(v("libpython3.12.so"), (Some((3, 12)), false, false));
    assert_eq!(v("python3.11"), (Some((3, 11)), false, false));
    assert_eq!(v("python3.13t"), (Some((3, 13)), true, false));
    assert_eq!(v("libpython3.13t.so.1.0"), (Some((3, 13)), true, false));
    assert_eq!(v("libpython3.12d.so.1.0"), (Some((3, 12)), false, true));
    assert_eq!(v("libpython3.so"), (None, false, false));
    assert_eq!(v("python3"), (None, false, false));
    assert_eq!(v("python3.10-config"), (None, false, false));
    assert_eq!(v("python3.1000"), (None, false, false));
    assert_eq!(v("python3.300"), (None, false, false));
    assert_eq!(v("libc.so.6"), (None, false, false));
    assert_eq!(v(""), (None, false, false));
}

/// `inspect` over copies of a libpython whose headers, program headers
/// and symbols (values and sizes of the ones it reads) are mutated: an
/// answer or an error, never a panic.
#[test]
fn inspect_mutated_interpreters() {
    use std::io::Write;
    let Some(py) = pythons().into_iter().find(|p| p.minor() == 13) else {
        return missing("CPython 3.13");
    };
    let original = std::fs::read(&py.object).unwrap();
    let file = File::open(&py.object).unwrap();
    let elf = Elf::read(&file).unwrap();
    // Where .dynsym's entries of the symbols read are.
    let dynsym = elf.section(".dynsym").unwrap();
    let dynstr = elf
        .read_section(&file, elf.section(".dynstr").unwrap())
        .unwrap();
    let table = elf.read_section(&file, dynsym).unwrap();
    let mut entries = Vec::new();
    for (i, sym) in table.chunks_exact(24).enumerate() {
        let name = &dynstr[u32_at(sym, 0).unwrap() as usize..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
        if SYMBOLS.iter().any(|s| s.as_bytes() == name) {
            entries.push(i);
        }
    }
    assert_eq!(entries.len(), 4, "the symbols read in .dynsym");
    let dynsym_at = original
        .windows(table.len().min(64))
        .position(|w| w == &table[..table.len().min(64)])
        .unwrap();
    let mut areas = vec![(0usize, 64usize), (64, 56 * 12)];
    for i in entries {
        areas.push((dynsym_at + i * 24 + 8, 16));
    }
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&original).unwrap();
    let f = f.as_file();
    let mut rng = crate::hostile::Rng(0x2545_f491_4f6c_dd1d);
    let mut next = || rng.next();
    let values = [
        0u64,
        1,
        8,
        0xfff,
        0x7fff_ffff,
        0xffff_ffff,
        1 << 40,
        u64::MAX - 7,
        u64::MAX,
    ];
    let mut answers = 0;
    for _ in 0..300 {
        let (start, len) = areas[(next() % areas.len() as u64) as usize];
        let at = start + (next() as usize % len) / 8 * 8;
        let v = values[(next() % values.len() as u64) as usize];
        let width = [1usize, 2, 4, 8][(next() % 4) as usize];
        f.write_all_at(&v.to_le_bytes()[..width], at as u64)
            .unwrap();
        if let Ok(Some(interp)) = inspect(f, "libpython3.13.so.1.0") {
            answers += 1;
            if interp.layout.is_none() {
                assert!(interp.unsupported.is_some());
            }
        }
        f.write_all_at(&original[at..at + width], at as u64)
            .unwrap();
    }
    assert!(answers > 0);
}

/// The start of 3.13's `_PyRuntime`, from the file.
fn runtime_bytes(py: &Python) -> Vec<u8> {
    let file = File::open(&py.object).unwrap();
    let name = py.object.file_name().unwrap().to_str().unwrap();
    let interp = inspect(&file, name).unwrap().unwrap();
    let segments = crate::elf::load_segments(&file).unwrap();
    let size = usize::from(py.layout().debug_offsets.unwrap().size);
    read_at_vaddr(&file, &segments, interp.runtime, size).unwrap()
}

/// 3.13's own offsets agree with the table, and a table that differs
/// from them in any one value the check covers is refused, as is a
/// runtime of another version, a free-threaded one, and too few bytes.
#[test]
fn debug_offsets_check_the_table() {
    let mut any = false;
    for py in pythons().iter().filter(|p| p.minor() >= 13) {
        any = true;
        let bytes = runtime_bytes(py);
        let table = py.layout();
        check_debug_offsets(&bytes, table).unwrap();
        let header = layout::debug_header(&bytes, table).unwrap();
        assert_eq!(
            header.version >> 8,
            u64::from_be_bytes([0, 0, 0, 0, 0, 3, 13, py.version.2])
        );
        assert!(!header.free_threaded);

        let pos = table.debug_offsets.unwrap();
        let corrupt: [fn(&mut Layout); 22] = [
            |l| l.interpreters_head += 8,
            |l| l.interp_threads_head += 8,
            |l| l.ts_next += 8,
            |l| l.ts_thread_id += 8,
            |l| l.ts_native_thread_id = None,
            |l| l.ts_frame += 8,
            |l| l.f_code += 8,
            |l| l.f_previous += 8,
            |l| l.f_instr += 8,
            |l| l.f_entry += 1,
            |l| l.ob_type = 0,
            |l| l.co_filename += 8,
            |l| l.co_name += 8,
            |l| l.co_qualname = Some(0),
            |l| l.co_linetable += 8,
            |l| l.co_firstlineno += 4,
            |l| l.co_code_start = None,
            |l| l.str_length += 8,
            |l| l.str_state += 8,
            |l| l.str_ascii_data += 8,
            |l| l.bytes_size += 8,
            |l| l.bytes_data += 8,
        ];
        for (i, corrupt) in corrupt.iter().enumerate() {
            let mut bad = table.clone();
            corrupt(&mut bad);
            let err = check_debug_offsets(&bytes, &bad).unwrap_err();
            eprintln!("corruption {i}: {err}");
        }
        // Another minor version, free-threaded, cut short, no cookie.
        let mut other = bytes.clone();
        other[usize::from(pos.version) + 2] = 12;
        let err = check_debug_offsets(&other, table).unwrap_err();
        assert!(err.contains("3.12"), "{err}");
        let mut threaded = bytes.clone();
        threaded[usize::from(pos.free_threaded)] = 1;
        let err = check_debug_offsets(&threaded, table).unwrap_err();
        assert!(err.contains("free-threaded"), "{err}");
        assert!(
            layout::debug_header(&threaded, table)
                .unwrap()
                .free_threaded
        );
        let err = check_debug_offsets(&bytes[..100], table).unwrap_err();
        assert!(err.contains("fewer"), "{err}");
        let mut cookie = bytes.clone();
        cookie[0] = b'y';
        let err = check_debug_offsets(&cookie, table).unwrap_err();
        assert!(err.contains("cookie"), "{err}");
        // Before 3.13 there is nothing to check.
        check_debug_offsets(&[], layout(3, 12).unwrap()).unwrap();
    }
    if !any {
        missing("CPython 3.13");
    }
}

/// The interpreters' own code agrees on `tss_key`:
/// `PyGILState_GetThisThreadState` passes `&_PyRuntime.autoTSSkey` to
/// `PyThread_tss_get` (`lea OFF(%rax),%rdi`, in a shared libpython
/// reaching `_PyRuntime` through the GOT), or, linked into Debian's
/// executable, loads the key itself for `pthread_getspecific` (`mov
/// _PyRuntime+OFF(%rip),%edi`: OFF is `tss_key + 4`).
#[test]
fn tss_key_is_where_the_interpreter_reads_it() {
    for py in pythons() {
        let file = File::open(&py.object).unwrap();
        let elf = Elf::read(&file).unwrap();
        let [Some(f)] = <[_; 1]>::try_from(
            elf.symbols(
                &file,
                SymbolTable::Dynamic,
                &["PyGILState_GetThisThreadState"],
            )
            .unwrap(),
        )
        .unwrap() else {
            panic!("{py:?}: no PyGILState_GetThisThreadState");
        };
        let out = match Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(format!("--start-address={:#x}", f.value))
            .arg(format!("--stop-address={:#x}", f.value + f.size))
            .arg(&py.object)
            .output()
        {
            Ok(out) => out,
            Err(_) => return missing("objdump (binutils)"),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let hex = |s: &str| {
            let s = s.trim_start_matches("0x");
            let end = s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len());
            u64::from_str_radix(&s[..end], 16).unwrap()
        };
        let tss = u64::from(py.layout().tss_key);
        let mut seen = false;
        for line in text.lines() {
            if let Some(at) = line.find("lea    0x") {
                if line.contains("(%rax),%r") {
                    assert_eq!(hex(&line[at + 7..]), tss, "{py:?}: {line}");
                    seen = true;
                    break;
                }
            }
            if line.contains(",%edi") {
                if let Some(at) = line.find("<_PyRuntime@@Base+0x") {
                    assert_eq!(hex(&line[at + 18..]), tss + 4, "{py:?}: {line}");
                    seen = true;
                    break;
                }
            }
        }
        assert!(seen, "{py:?}: no access to the key in\n{text}");
    }
}

/// Every version's tag words are adjacent, the offsets fit what
/// [`read_code`] reads, and each kind of frame has its fields.
#[test]
fn the_table_is_consistent() {
    for minor in 10..=13 {
        let l = layout(3, minor).unwrap();
        assert_eq!(l.version, (3, minor));
        assert_eq!(l.tag_at, l.co_filename);
        assert_eq!(l.co_name, l.tag_at + 8);
        let third = if minor == 10 {
            Some(l.co_linetable)
        } else {
            l.co_qualname
        };
        assert_eq!(third, Some(l.tag_at + 16));
        assert_eq!(l.ob_type, 8);
        assert!(usize::from(l.co_linetable.max(l.tag_at + 16)) + 8 <= CODE_HEAD);
        match l.frame_kind {
            FrameKind::Object310 => {
                assert!(l.co_code.is_some() && l.co_code_start.is_none());
                assert!(l.cframe_current_frame.is_none() && l.co_qualname.is_none());
            }
            FrameKind::Interp311 => {
                assert!(l.co_code.is_none() && l.co_code_start.is_some());
                assert!(l.cframe_current_frame.is_some());
            }
            FrameKind::Interp312 => {
                assert!(l.co_code_start.is_some());
                assert_eq!(l.owner_cstack, 3);
                assert_eq!(l.cframe_current_frame.is_some(), minor == 12);
            }
        }
        assert_eq!(l.debug_offsets.is_some(), minor >= 13);
    }
    assert_eq!(layout(3, 9), None);
    assert_eq!(layout(3, 14), None);
    assert_eq!(layout(2, 7), None);
}

/// The tag is FNV-1a over three words, folded after each: fixed values,
/// so that the BPF program's copy can be checked against them.
#[test]
fn tag_of_known_words() {
    let words = |a: u64, b: u64, c: u64| {
        let mut w = [0u8; 24];
        w[..8].copy_from_slice(&a.to_le_bytes());
        w[8..16].copy_from_slice(&b.to_le_bytes());
        w[16..].copy_from_slice(&c.to_le_bytes());
        w
    };
    // Step by step, for the first.
    let mut h: u64 = 0xcbf29ce484222325;
    for w in [0x7f00_1234_5678u64, 0x7f00_1234_9abc, 0x7f00_1234_def0] {
        h ^= w;
        h = h.wrapping_mul(0x100000001b3);
        h ^= h >> 32;
    }
    let w = words(0x7f00_1234_5678, 0x7f00_1234_9abc, 0x7f00_1234_def0);
    assert_eq!(tag(&w), h as u32);
    assert_eq!(tag(&words(0, 0, 0)), 0x57c1_2087);
    assert_eq!(tag(&w), 0xb9a3_ea6c);
    assert_ne!(tag(&words(1, 0, 0)), tag(&words(0, 1, 0)));
}

/// A process's memory made of a few regions: what a hostile or
/// half-torn-down process may show.
#[derive(Clone)]
struct Fake(BTreeMap<u64, Vec<u8>>);

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let (start, data) = self.0.range(..=addr).next_back().ok_or_else(eof)?;
        let from = usize::try_from(addr - start).map_err(|_| eof())?;
        let to = from.checked_add(buf.len()).ok_or_else(eof)?;
        buf.copy_from_slice(data.get(from..to).ok_or_else(eof)?);
        Ok(())
    }
}

const FAKE_CODE_TYPE: u64 = 0x5000;
const FAKE_CODE: u64 = 0x10_0000;
const FAKE_NAME: u64 = 0x20_0000;
const FAKE_QUALNAME: u64 = 0x30_0000;
const FAKE_FILENAME: u64 = 0x40_0000;
const FAKE_TABLE: u64 = 0x50_0000;

fn put(b: &mut [u8], at: u16, v: &[u8]) {
    b[usize::from(at)..usize::from(at) + v.len()].copy_from_slice(v);
}

/// A compact `str` as `l`'s version lays it out, of the smallest kind
/// that holds `s`.
fn fake_str(l: &Layout, s: &str) -> Vec<u8> {
    let points: Vec<u32> = s.chars().map(u32::from).collect();
    let max = points.iter().copied().max().unwrap_or(0);
    let (kind, ascii) = match max {
        0..0x80 => (1u32, true),
        0x80..0x100 => (1, false),
        0x100..0x10000 => (2, false),
        _ => (4, false),
    };
    let data = if ascii {
        l.str_ascii_data
    } else {
        l.str_compact_data
    };
    let mut b = vec![0u8; usize::from(data)];
    put(&mut b, 8, &0x6000u64.to_le_bytes());
    put(&mut b, l.str_length, &(points.len() as u64).to_le_bytes());
    let mut state = kind << l.str_kind_shift | 1 << l.str_compact_bit;
    state |= u32::from(ascii) << l.str_ascii_bit;
    if let Some(ready) = l.str_ready_bit {
        state |= 1 << ready;
    }
    put(&mut b, l.str_state, &state.to_le_bytes());
    for p in points {
        b.extend_from_slice(&p.to_le_bytes()[..kind as usize]);
    }
    b.extend_from_slice(&[0; 4]);
    b
}

/// A process with one code object at FAKE_CODE.
fn fake_process(l: &Layout, name: &str, qualname: &str, filename: &str) -> Fake {
    let mut code = vec![0u8; CODE_HEAD];
    put(&mut code, l.ob_type, &FAKE_CODE_TYPE.to_le_bytes());
    put(&mut code, l.co_name, &FAKE_NAME.to_le_bytes());
    put(&mut code, l.co_filename, &FAKE_FILENAME.to_le_bytes());
    if let Some(q) = l.co_qualname {
        put(&mut code, q, &FAKE_QUALNAME.to_le_bytes());
    }
    put(&mut code, l.co_linetable, &FAKE_TABLE.to_le_bytes());
    put(&mut code, l.co_firstlineno, &7i32.to_le_bytes());
    let mut table = vec![0u8; usize::from(l.bytes_data)];
    put(&mut table, l.bytes_size, &4u64.to_le_bytes());
    table.extend_from_slice(&[0x80 | 13 << 3, 4, 0x80 | 15 << 3, 0]);
    Fake(BTreeMap::from([
        (FAKE_CODE, code),
        (FAKE_NAME, fake_str(l, name)),
        (FAKE_QUALNAME, fake_str(l, qualname)),
        (FAKE_FILENAME, fake_str(l, filename)),
        (FAKE_TABLE, table),
    ]))
}

fn all_layouts() -> [&'static Layout; 4] {
    [10, 11, 12, 13].map(|minor| layout(3, minor).unwrap())
}

#[test]
fn reads_every_kind_of_str() {
    for l in all_layouts() {
        let filename = "/src/\u{3a9}/\u{20000}/x.py";
        let p = fake_process(l, "m\u{e9}thode", "Klasse.m\u{e9}thode", filename);
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name, "m\u{e9}thode");
        let qualname = if l.co_qualname.is_some() {
            "Klasse.m\u{e9}thode"
        } else {
            "m\u{e9}thode"
        };
        assert_eq!(code.qualname, qualname);
        assert_eq!(code.filename, filename);
        assert_eq!(code.firstlineno, 7);
        let mut words = [0u8; 24];
        p.read(FAKE_CODE + u64::from(l.tag_at), &mut words).unwrap();
        assert_eq!(code.tag, tag(&words));
        // UCS-2, and lone surrogates.
        let mut p = fake_process(l, "\u{3a9}mega", "q", "f");
        let name = p.0.get_mut(&FAKE_NAME).unwrap();
        let at = usize::from(l.str_compact_data) + 2;
        name[at..at + 2].copy_from_slice(&0xdc80u16.to_le_bytes());
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name, "\u{3a9}\u{fffd}ega");
        // Cut at MAX_NAME_CHARS.
        let long = "x".repeat(3000);
        let p = fake_process(l, &long, "q", "f");
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name.chars().count(), MAX_NAME_CHARS + 1);
        assert!(code.name.ends_with("x\u{2026}"));
        // The line table: +2 from line 7 for one code unit, then none.
        let start = l.co_code_start.map_or(0, u32::from);
        let instr = |unit: u32| match l.frame_kind {
            FrameKind::Object310 => unit,
            _ => start + 2 * unit,
        };
        if l.frame_kind != FrameKind::Object310 {
            assert_eq!(code.line(instr(0)), Some(9));
            assert_eq!(code.line(instr(1)), None);
        }
    }
}

/// Whatever a process's memory holds, reading a code object returns
/// (an error, or names within the bounds), with no panic and no
/// allocation beyond what the bounds allow.
#[test]
fn hostile_code_objects_are_refused() {
    for l in all_layouts() {
        let good = fake_process(l, "name", "qual", "file.py");
        let read = |p: &Fake| read_code(p, FAKE_CODE, FAKE_CODE_TYPE, l);
        let malformed = |p: &Fake| matches!(read(p), Err(Unreadable::Malformed(_)));
        let memory = |p: &Fake| matches!(read(p), Err(Unreadable::Memory(_)));
        let with = |region: u64, at: u16, v: &[u8]| {
            let mut p = good.clone();
            put(p.0.get_mut(&region).unwrap(), at, v);
            p
        };
        assert!(matches!(
            read(&with(FAKE_CODE, l.ob_type, &[1])),
            Err(Unreadable::NotCode)
        ));
        assert!(malformed(&with(FAKE_CODE, l.co_name, &[0; 8])));
        assert!(malformed(&with(FAKE_CODE, l.co_linetable, &[0; 8])));
        assert!(memory(&with(FAKE_CODE, l.co_filename, &[1; 8])));
        assert!(memory(&with(FAKE_CODE, l.co_filename, &[0xff; 8])));
        let str_state = |p: &Fake| u32_at(&p.0[&FAKE_NAME], usize::from(l.str_state)).unwrap();
        let state = str_state(&good);
        let kind_mask = 7 << l.str_kind_shift;
        for bad in [
            state & !kind_mask | 3 << l.str_kind_shift,
            state & !kind_mask,
            state & !(1 << l.str_compact_bit),
            state & !kind_mask | 2 << l.str_kind_shift,
        ] {
            assert!(malformed(&with(FAKE_NAME, l.str_state, &bad.to_le_bytes())));
        }
        if let Some(ready) = l.str_ready_bit {
            let bad = state & !(1 << ready);
            assert!(malformed(&with(FAKE_NAME, l.str_state, &bad.to_le_bytes())));
        }
        assert!(malformed(&with(
            FAKE_NAME,
            l.str_length,
            &(-1i64).to_le_bytes()
        )));
        assert!(memory(&with(
            FAKE_NAME,
            l.str_length,
            &i64::MAX.to_le_bytes()
        )));
        let ascii_data = usize::from(l.str_ascii_data);
        let mut p = good.clone();
        p.0.get_mut(&FAKE_NAME).unwrap()[ascii_data] = 0xe9;
        assert!(malformed(&p), "an ASCII str with a byte above 127");
        assert!(malformed(&with(
            FAKE_TABLE,
            l.bytes_size,
            &(-1i64).to_le_bytes()
        )));
        assert!(memory(&with(
            FAKE_TABLE,
            l.bytes_size,
            &i64::MAX.to_le_bytes()
        )));
        for addr in [0, 8, u64::MAX, u64::MAX - 100, FAKE_CODE + 1] {
            assert!(read_code(&good, addr, FAKE_CODE_TYPE, l).is_err());
        }
        // A str at the very end of the address space.
        let mut p = good.clone();
        put(
            p.0.get_mut(&FAKE_CODE).unwrap(),
            l.co_name,
            &(u64::MAX - 4).to_le_bytes(),
        );
        p.0.insert(u64::MAX - 4, vec![0; 4]);
        assert!(read(&p).is_err());

        // Random bytes anywhere.
        let mut rng = crate::hostile::Rng(0x2545_f491_4f6c_dd1d ^ u64::from(l.version.1));
        let mut next = || rng.next();
        let regions: Vec<u64> = good.0.keys().copied().collect();
        for _ in 0..3000 {
            let mut p = good.clone();
            for _ in 0..1 + next() % 4 {
                let region = regions[(next() % regions.len() as u64) as usize];
                let data = p.0.get_mut(&region).unwrap();
                let at = (next() % data.len() as u64) as usize;
                data[at] = next() as u8;
            }
            if let Ok(code) = read(&p) {
                assert!(code.name.chars().count() <= MAX_NAME_CHARS + 1);
                for instr in [0, 1, 100, 200, 201, u32::MAX] {
                    code.line(instr);
                }
            }
        }
    }
}

/// A child process, killed (by its own id) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prints, as one line of JSON, what it knows of some code objects
/// (their address, names, file, first line, line table, the addresses
/// of the objects the tag hashes) and of the three functions on its
/// stack, then blocks two calls deep.
const LIVE: &str = r#"
import dis, json, sys, time

def target(x):
    return x + 1

SRC = '''
def f_\u00e9():
    pass
def f_\u03a9():
    pass
def f_\U00020000():
    pass
class K:
    def method(self):
        def inner():
            pass
        return inner
'''
ns = {}
exec(compile(SRC, "f\u00efl\u00e9_\u03a9_\U00020000.py", "exec"), ns)

def third(co):
    return co.co_qualname if sys.version_info >= (3, 11) else co.co_linetable

def describe(co):
    return {"addr": id(co), "name": co.co_name,
            "qualname": getattr(co, "co_qualname", co.co_name),
            "filename": co.co_filename, "firstlineno": co.co_firstlineno,
            "linetable": co.co_linetable.hex(),
            "words": [id(co.co_filename), id(co.co_name), id(third(co))],
            "instructions": [[i.offset, i.opname] for i in dis.get_instructions(co)]}

def blocked():
    print(json.dumps({
        "codes": [describe(c) for c in [
            target.__code__, ns["f_\u00e9"].__code__, ns["f_\u03a9"].__code__,
            ns["f_\U00020000"].__code__, ns["K"].method.__code__,
            ns["K"]().method().__code__]],
        "stack": [describe(c) for c in [
            blocked.__code__, caller.__code__, sys._getframe(2).f_code]],
    }), flush=True)
    time.sleep(600)  # LINE blocked

def caller():
    blocked()  # LINE caller

caller()  # LINE module
"#;

/// A process's memory, read with the test's own `ProcMem`.
fn read_u64(mem: &dyn Memory, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn read_u32(mem: &dyn Memory, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    mem.read(addr, &mut b).unwrap();
    u32::from_le_bytes(b)
}

/// One Python frame of a thread: its code object, the instruction as
/// the BPF program records it, and its `is_entry` or `owner` byte.
#[derive(Debug)]
struct Frame {
    code: u64,
    instr: u32,
    entry: u8,
}

/// The frames of the first thread of the first interpreter, newest
/// first, walked as the BPF program walks them.
fn walk(mem: &dyn Memory, runtime: u64, l: &Layout) -> (u64, Vec<Frame>) {
    let interp = read_u64(mem, runtime + u64::from(l.interpreters_head));
    let ts = read_u64(mem, interp + u64::from(l.interp_threads_head));
    assert_ne!(ts, 0);
    let mut frame = read_u64(mem, ts + u64::from(l.ts_frame));
    if let Some(current) = l.cframe_current_frame {
        frame = read_u64(mem, frame + u64::from(current));
    }
    let mut frames = Vec::new();
    while frame != 0 && frames.len() < 64 {
        let code = read_u64(mem, frame + u64::from(l.f_code));
        let instr = match l.frame_kind {
            FrameKind::Object310 => read_u32(mem, frame + u64::from(l.f_instr)),
            _ => read_u64(mem, frame + u64::from(l.f_instr)).wrapping_sub(code) as u32,
        };
        let mut entry = [0u8];
        if l.frame_kind != FrameKind::Object310 {
            mem.read(frame + u64::from(l.f_entry), &mut entry).unwrap();
        }
        frames.push(Frame {
            code,
            instr,
            entry: entry[0],
        });
        frame = read_u64(mem, frame + u64::from(l.f_previous));
    }
    (ts, frames)
}

/// The load bias of `object` in process `pid`, from its maps.
fn bias_in(pid: u32, object: &Path) -> u64 {
    let object = std::fs::canonicalize(object).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let segments = crate::elf::load_segments(&File::open(&object).unwrap()).unwrap();
    for line in maps.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 6 || Path::new(t[5]) != object {
            continue;
        }
        let start = u64::from_str_radix(t[0].split('-').next().unwrap(), 16).unwrap();
        let offset = u64::from_str_radix(t[2], 16).unwrap();
        return crate::elf::load_bias(&segments, start, offset).unwrap();
    }
    panic!("{} not mapped in {pid}:\n{maps}", object.display());
}

/// Each interpreter, blocked in `time.sleep` two calls deep: its code
/// objects read through `/proc/PID/mem` are what it says they are (names
/// of every kind of `str`, file, first line, line table), their tags
/// are those of the addresses it gives, and its frames, walked with the
/// table's offsets from `_PyRuntime`, name the three functions at the
/// lines of their calls.
#[test]
fn reads_code_objects_of_live_interpreters() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("live.py");
    let source = LIVE;
    std::fs::write(&script, source).unwrap();
    let line_of = |marker: &str| {
        source
            .lines()
            .position(|l| l.ends_with(&format!("# LINE {marker}")))
            .unwrap() as u32
            + 1
    };
    let want_lines = [line_of("blocked"), line_of("caller"), line_of("module")];
    for py in pythons() {
        let what = py.exe.display().to_string();
        let mut child = Running(
            Command::new(&py.exe)
                .arg(&script)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let said: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {e}: {line:?}"));

        let file = File::open(&py.object).unwrap();
        let name = py.object.file_name().unwrap().to_str().unwrap();
        let interp = inspect(&file, name).unwrap().unwrap();
        let l = interp.layout.unwrap();
        let bias = bias_in(pid, &py.object);
        if py.exe == py.object {
            assert_eq!(bias, 0, "{what}: a non-PIE executable");
        }
        let code_type = interp.code_type + bias;
        let mem = ProcMem::open(pid).unwrap();

        for want in said["codes"].as_array().unwrap() {
            let addr = want["addr"].as_u64().unwrap();
            let code = read_code(&mem, addr, code_type, l)
                .unwrap_or_else(|e| panic!("{what}: {want}: {e}"));
            assert_eq!(code.name, want["name"].as_str().unwrap(), "{what}");
            assert_eq!(code.qualname, want["qualname"].as_str().unwrap(), "{what}");
            assert_eq!(code.filename, want["filename"].as_str().unwrap(), "{what}");
            assert_eq!(
                i64::from(code.firstlineno),
                want["firstlineno"].as_i64().unwrap()
            );
            let table = unhex(want["linetable"].as_str().unwrap());
            let first = code.firstlineno;
            let lines = match l.co_code_start {
                None => LineTable::pep626(table, first),
                Some(s) => LineTable::locations(table, first, u32::from(s)),
            };
            assert_eq!(code.lines, lines, "{what}");
            // The tag: of the words Python gives, and of the bytes
            // read again.
            let ids: Vec<u64> = want["words"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_u64().unwrap())
                .collect();
            let mut words = [0u8; 24];
            for (i, id) in ids.iter().enumerate() {
                words[8 * i..8 * i + 8].copy_from_slice(&id.to_le_bytes());
            }
            assert_eq!(code.tag, tag(&words), "{what}: {}", code.qualname);
            let mut again = [0u8; 24];
            mem.read(addr + u64::from(l.tag_at), &mut again).unwrap();
            assert_eq!(again, words);
        }
        let names: Vec<&str> = said["codes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["filename"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"f\u{ef}l\u{e9}_\u{3a9}_\u{20000}.py"));
        // Not a code object: the type object itself; a str.
        let not = read_code(&mem, code_type, code_type, l).unwrap_err();
        assert!(matches!(not, Unreadable::NotCode), "{not}");
        let s = said["codes"][0]["words"][0].as_u64().unwrap();
        assert!(matches!(
            read_code(&mem, s, code_type, l),
            Err(Unreadable::NotCode)
        ));
        assert!(matches!(
            read_code(&mem, 8, code_type, l),
            Err(Unreadable::Memory(_))
        ));

        // The thread state and its frames, once the thread sleeps.
        let runtime = interp.runtime + bias;
        let mut key = [0u8; 8];
        mem.read(runtime + u64::from(l.tss_key), &mut key).unwrap();
        assert_eq!(
            u32::from_le_bytes(key[..4].try_into().unwrap()),
            1,
            "{what}: _is_initialized"
        );
        let stack = said["stack"].as_array().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let frames = loop {
            let (ts, frames) = walk(&mem, runtime, l);
            if let Some(at) = l.ts_native_thread_id {
                assert_eq!(read_u64(&mem, ts + u64::from(at)), u64::from(pid), "{what}");
            }
            let py_frames: Vec<&Frame> = frames
                .iter()
                .filter(|f| !(l.frame_kind == FrameKind::Interp312 && f.entry == l.owner_cstack))
                .collect();
            let top = py_frames.first().map(|f| {
                read_code(&mem, f.code, code_type, l)
                    .ok()
                    .and_then(|c| c.line(f.instr))
            });
            if top == Some(Some(want_lines[0])) {
                break frames;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {frames:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut py_frames = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            match l.frame_kind {
                FrameKind::Interp312 if f.entry == l.owner_cstack => {
                    // A shim: after the module's frame, the last.
                    assert_eq!(i, 3, "{what}: {frames:?}");
                    continue;
                }
                FrameKind::Interp312 => assert_eq!(f.entry, 0, "{what}: owned by the thread"),
                FrameKind::Interp311 => {
                    assert_eq!(f.entry, u8::from(i == 2), "{what}: is_entry of {i}")
                }
                FrameKind::Object310 => {}
            }
            py_frames.push(f);
        }
        assert_eq!(py_frames.len(), 3, "{what}: {frames:?}");
        let shims = frames.len() - py_frames.len();
        assert_eq!(
            shims,
            usize::from(l.frame_kind == FrameKind::Interp312),
            "{what}"
        );
        for (i, f) in py_frames.iter().enumerate() {
            let want = &stack[i];
            assert_eq!(f.code, want["addr"].as_u64().unwrap(), "{what}: frame {i}");
            let code = read_code(&mem, f.code, code_type, l).unwrap();
            assert_eq!(code.name, want["name"].as_str().unwrap());
            assert_eq!(code.line(f.instr), Some(want_lines[i]), "{what}: frame {i}");
            // Which instruction the frame is at: the call, or one of
            // its inline caches.
            let unit = match l.co_code_start {
                None => u64::from(f.instr) * 2,
                Some(s) => u64::from(f.instr - u32::from(s)),
            };
            let (at, op) = want["instructions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| (i[0].as_u64().unwrap(), i[1].as_str().unwrap()))
                .take_while(|(at, _)| *at <= unit)
                .last()
                .unwrap();
            assert!(op.starts_with("CALL"), "{what}: frame {i} at {unit}: {op}");
            eprintln!(
                "{what}: frame {i} ({}) at byte {unit}: {op} at {at}, +{} code units",
                code.name,
                (unit - at) / 2
            );
            match l.frame_kind {
                // At the call itself.
                FrameKind::Object310 => assert_eq!(unit, at),
                _ if l.version == (3, 13) => assert_eq!(unit, at),
                // In a C call (the newest frame) at the call; having
                // called a Python function, at its last cache entry.
                _ if i == 0 => assert_eq!(unit, at, "{what}"),
                _ => assert!(unit > at, "{what}: frame {i}"),
            }
        }
    }
}
