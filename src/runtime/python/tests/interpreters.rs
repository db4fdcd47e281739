//! Interpreters found in their files (also mutated ones), versions told
//! by names, the layouts' table checked against 3.13's debug offsets and
//! the interpreters' own code, and the tag.

use super::*;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

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
