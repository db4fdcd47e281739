//! CPython frames: which mapped objects are CPython interpreters and how to
//! read them ([`inspect`]: the runtime's globals and the structure layout
//! of the version, [`layout`]), and the names and lines of the code objects
//! whose frames the BPF program records ([`read_code`], [`Code::line`]).
//!
//! For each Python frame of a blocked thread the BPF program records the
//! code object's address, the [`tag`] of three of its pointer fields (so
//! that a code object freed and another allocated at the same address is
//! told apart, without reading strings in BPF) and where the frame is in
//! its code. Userspace reads the code object from the process's memory
//! ([`ProcMem`]) once per address and tag. Everything read from the object
//! file or the process is untrusted: lengths are bounded, offsets checked,
//! and a structure that does not look like what CPython writes is
//! refused ([`Unreadable`]), never a panic.

pub mod layout;
pub mod linetable;
mod procs;

use std::fs::File;

use anyhow::{bail, Context, Result};

pub use layout::{check_debug_offsets, layout, FrameKind, Layout};
pub use linetable::LineTable;
pub use procs::{is_python_word, Pythons};

pub use crate::runtime::{Memory, ProcMem};

use crate::elf::{read_at_vaddr, Elf, SymbolTable};

/// A CPython interpreter found in an object file (a `libpython3.X.so` or a
/// `python3.X` executable that has the interpreter linked in). Addresses
/// are those of the file (add the object's load bias for a process's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// (major, minor, micro): from `Py_Version` (3.11 on), else major and
    /// minor from the file's name with micro 0 (3.10 has no `Py_Version`);
    /// (0, 0, 0) if neither tells (and `layout` is None).
    pub version: (u8, u8, u8),
    /// `_PyRuntime`, the runtime's global state.
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault`, [start, end): the native frames that
    /// evaluate Python frames.
    pub eval: (u64, u64),
    /// `_PyEval_EvalFrameDefault.cold`, the part of the function the
    /// compiler moved away (where the full symbol table has it).
    pub eval_cold: Option<(u64, u64)>,
    /// The functions of the interpreter's call machinery ([`GLUE`]) the
    /// file's symbols have, [start, end).
    pub glue: Vec<(u64, u64)>,
    /// `PyCode_Type`: the type of code objects.
    pub code_type: u64,
    /// The structure layout to read the interpreter with: None if the
    /// version is unknown or not supported, or the build is not one the
    /// table describes (`unsupported` says why).
    pub layout: Option<&'static Layout>,
    /// A free-threaded build (3.13t): other object headers, not read.
    pub free_threaded: bool,
    /// Why `layout` is None.
    pub unsupported: Option<String>,
}

/// The symbols [`inspect`] reads, in this order.
const SYMBOLS: [&str; 5] = [
    "_PyRuntime",
    "_PyEval_EvalFrameDefault",
    "PyCode_Type",
    "Py_Version",
    "_PyEval_EvalFrameDefault.cold",
];

/// The interpreter's call machinery: the functions that pass a call from
/// Python code to Python code (on 3.10 every such call goes through them,
/// from 3.11 only calls through C), and do no work of their own. Between
/// two Python frames they are hidden unless `--python-glue` asks for them
/// (see `procs::hide_glue`). Some are static: only a file with its full
/// symbol table has them.
pub const GLUE: &[&str] = &[
    "_PyEval_Vector",
    "_PyFunction_Vectorcall",
    "_PyObject_VectorcallTstate",
    "PyObject_Vectorcall",
    "_PyObject_FastCallDictTstate",
    "_PyObject_MakeTpCall",
    "_PyObject_Call",
    "PyObject_Call",
    "_PyObject_Call_Prepend",
    "PyVectorcall_Call",
    "_PyVectorcall_Call",
    "method_vectorcall",
    "slot_tp_call",
    // Inlined in the builds tested; functions of their own elsewhere.
    "call_function",
    "do_call_core",
];

/// Fills the symbols of `names` not `found` yet from `table`, if it can
/// be read (a table that cannot adds none).
fn fill_missing(
    found: &mut [Option<crate::elf::Symbol>],
    elf: &Elf,
    file: &File,
    table: SymbolTable,
    names: &[&str],
) {
    if let Ok(more) = elf.symbols(file, table, names) {
        for (f, s) in found.iter_mut().zip(more) {
            if f.is_none() {
                *f = s;
            }
        }
    }
}

/// The [`GLUE`] functions of an interpreter's file, from its dynamic
/// and full symbol tables (a table that cannot be read adds none).
fn glue_functions(elf: &Elf, file: &File) -> Vec<(u64, u64)> {
    let mut found = vec![None; GLUE.len()];
    for table in [SymbolTable::Dynamic, SymbolTable::Full] {
        fill_missing(&mut found, elf, file, table, GLUE);
    }
    found
        .into_iter()
        .flatten()
        .filter(|s| s.size > 0)
        .map(|s| (s.value, s.value.saturating_add(s.size)))
        .collect()
}

/// Whether the object file `file`, mapped under the name `name` (the last
/// component of its path, as in `/proc/PID/maps`), is a CPython
/// interpreter, and if so where its globals are and how to read it.
///
/// An interpreter is an object that defines `_PyRuntime`: in `.dynsym`
/// (CPython exports it, in a shared libpython and in an executable that
/// has the interpreter linked in, so a stripped file has it too), or, for
/// a file whose name says `python`, in `.symtab`. Other objects cost one
/// read of their `.dynsym`. The version is read from `Py_Version` in the
/// file's data; for 3.13 on the runtime's debug offsets, also in the
/// file's data, must agree with the table ([`check_debug_offsets`]).
pub fn inspect(file: &File, name: &str) -> Result<Option<Interpreter>> {
    let elf = Elf::read(file)?;
    let mut found = elf
        .symbols(file, SymbolTable::Dynamic, &SYMBOLS)
        .context("reading .dynsym")?;
    if found[0].is_none() && !name.contains("python") {
        return Ok(None);
    }
    // The full table: the cold part (a local symbol), and whatever a file
    // that does not export them has there. A malformed one is no loss.
    fill_missing(&mut found, &elf, file, SymbolTable::Full, &SYMBOLS);
    let [runtime, eval, code_type, py_version, cold] = [0, 1, 2, 3, 4].map(|i| found[i]);
    let Some(runtime) = runtime else {
        return Ok(None);
    };
    let Some(eval) = eval.filter(|s| s.size > 0) else {
        bail!("a CPython runtime (_PyRuntime) without _PyEval_EvalFrameDefault");
    };
    let Some(code_type) = code_type else {
        bail!("a CPython runtime (_PyRuntime) without PyCode_Type");
    };
    let range = |s: crate::elf::Symbol| (s.value, s.value.saturating_add(s.size));
    let segments = elf.load_segments(file)?;
    let glue = glue_functions(&elf, file);

    let from_file = py_version
        .and_then(|s| read_at_vaddr(file, &segments, s.value, 8))
        .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
        .filter(|&hex| hex >> 24 == 3)
        .map(|hex| ((hex >> 24) as u8, (hex >> 16) as u8, (hex >> 8) as u8));
    let named = version_in_name(name);
    let from_name = named.version;
    let version = from_file.or(from_name.map(|(major, minor)| (major, minor, 0)));
    let known = version.is_some();
    let version = version.unwrap_or((0, 0, 0));

    let mut interp = Interpreter {
        version,
        runtime: runtime.value,
        eval: range(eval),
        eval_cold: cold.filter(|s| s.size > 0).map(range),
        glue,
        code_type: code_type.value,
        layout: None,
        free_threaded: named.free_threaded,
        unsupported: None,
    };
    if named.debug {
        interp.unsupported = Some("a debug build (its objects are laid out otherwise)".into());
        return Ok(Some(interp));
    }
    let (major, minor, micro) = version;
    if !known {
        interp.unsupported = Some("the CPython version is not known".into());
        return Ok(Some(interp));
    }
    let Some(table) = layout(major, minor) else {
        interp.unsupported = Some(format!("CPython {major}.{minor}.{micro} is not supported"));
        return Ok(Some(interp));
    };
    if let Some(pos) = table.debug_offsets {
        let Some(bytes) = read_at_vaddr(file, &segments, runtime.value, usize::from(pos.size))
        else {
            interp.unsupported = Some("_PyRuntime's debug offsets are not in the file".into());
            return Ok(Some(interp));
        };
        if let Ok(header) = layout::debug_header(&bytes, table) {
            interp.free_threaded |= header.free_threaded;
        }
        if let Err(why) = check_debug_offsets(&bytes, table) {
            interp.unsupported = Some(why);
            return Ok(Some(interp));
        }
    }
    if interp.free_threaded {
        interp.unsupported = Some("a free-threaded build".into());
        return Ok(Some(interp));
    }
    interp.layout = Some(table);
    Ok(Some(interp))
}

/// What an interpreter's file name says of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Named {
    /// (major, minor): `libpython3.10.so.1.0`, `python3.10`.
    version: Option<(u8, u8)>,
    /// The ABI flag `t`: `libpython3.13t.so`, `python3.13t`.
    free_threaded: bool,
    /// The ABI flag `d`: `libpython3.12d.so`.
    debug: bool,
}

fn version_in_name(name: &str) -> Named {
    let none = Named::default();
    let Some(at) = name.rfind("python") else {
        return none;
    };
    let rest = &name[at + "python".len()..];
    let number = |s: &str| -> Option<(u8, usize)> {
        let len = s.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 || len > 3 {
            return None;
        }
        Some((s[..len].parse().ok()?, len))
    };
    let Some((major, len)) = number(rest) else {
        return none;
    };
    let Some(rest) = rest[len..].strip_prefix('.') else {
        return none;
    };
    let Some((minor, len)) = number(rest) else {
        return none;
    };
    let rest = &rest[len..];
    let flags = &rest[..rest
        .find(|c: char| !c.is_ascii_lowercase())
        .unwrap_or(rest.len())];
    let tail = &rest[flags.len()..];
    if !flags.bytes().all(|b| b"tdm".contains(&b)) || !(tail.is_empty() || tail.starts_with('.')) {
        return none;
    }
    Named {
        version: Some((major, minor)),
        free_threaded: flags.contains('t'),
        debug: flags.contains('d'),
    }
}

/// The hash of the 24 bytes at `code + Layout::tag_at` (three pointers:
/// the code object's filename, name, and qualname or line table) that the
/// BPF program records with each code object address: FNV-1a over the
/// three little-endian words, each step folded (`h ^= h >> 32`) so that the
/// high bits of the pointers reach the 32 kept. The BPF program computes
/// the same; a code object whose tag differs from the recorded one is not
/// the one that ran (freed, and its memory reused).
pub fn tag(b: &[u8; 24]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in b.chunks_exact(8) {
        h ^= u64::from_le_bytes(w.try_into().unwrap());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 32;
    }
    h as u32
}

/// The most characters read of a name or a file name: longer ones are
/// cut, ending in `…`.
pub const MAX_NAME_CHARS: usize = 1024;

/// The most bytes read of a line table: larger ones are cut (later
/// instructions then have no line).
pub const MAX_LINE_TABLE: usize = 1 << 20;

/// A code object, as read from a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    /// `co_name`: the function's name.
    pub name: String,
    /// `co_qualname` (3.11 on; `co_name` in 3.10): with its classes and
    /// enclosing functions, `Class.method.<locals>.inner`.
    pub qualname: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub firstlineno: i32,
    /// `co_linetable`, for [`Code::line`].
    pub lines: LineTable,
    /// The [`tag`] of the 24 bytes the code object was read with.
    pub tag: u32,
}

impl Code {
    /// The line of the instruction the BPF program recorded for a frame of
    /// this code (see [`LineTable::line`] for what it is in each version).
    pub fn line(&self, instr: u32) -> Option<u32> {
        self.lines.line(instr)
    }
}

/// Why a code object could not be read.
#[derive(Debug)]
pub enum Unreadable {
    /// The process's memory could not be read there (unmapped, or the
    /// process gone).
    Memory(std::io::Error),
    /// The object's type is not `PyCode_Type`: not (or no longer) a code
    /// object.
    NotCode,
    /// A field holds what CPython does not write.
    Malformed(&'static str),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Memory(e) => write!(f, "reading the process's memory: {e}"),
            Unreadable::NotCode => f.write_str("not a code object"),
            Unreadable::Malformed(what) => write!(f, "a malformed code object: {what}"),
        }
    }
}

impl std::error::Error for Unreadable {}

impl From<std::io::Error> for Unreadable {
    fn from(e: std::io::Error) -> Unreadable {
        Unreadable::Memory(e)
    }
}

/// The largest offset + size of a code object's header fields read.
const CODE_HEAD: usize = 256;

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads the code object at `addr` of the process behind `mem`, whose
/// `PyCode_Type` is at `code_type` (the address in that process), with the
/// interpreter's `layout`: its names, first line and line table, and the
/// [`tag`] of the bytes it was read with, to compare with the BPF
/// program's.
pub fn read_code(
    mem: &dyn Memory,
    addr: u64,
    code_type: u64,
    layout: &Layout,
) -> Result<Code, Unreadable> {
    let o = |v: u16| usize::from(v);
    let len = [
        o(layout.ob_type) + 8,
        o(layout.tag_at) + 24,
        o(layout.co_filename) + 8,
        o(layout.co_name) + 8,
        layout.co_qualname.map_or(0, |q| o(q) + 8),
        o(layout.co_linetable) + 8,
        o(layout.co_firstlineno) + 4,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if len > CODE_HEAD {
        return Err(Unreadable::Malformed(
            "a layout beyond the code object's header",
        ));
    }
    let mut head = [0u8; CODE_HEAD];
    let head = &mut head[..len];
    mem.read(addr, head)?;
    let head = &*head;
    let field = |at: u16| u64_at(head, o(at)).unwrap_or(0);
    if field(layout.ob_type) != code_type {
        return Err(Unreadable::NotCode);
    }
    let mut words = [0u8; 24];
    words.copy_from_slice(&head[o(layout.tag_at)..o(layout.tag_at) + 24]);

    let filename = read_str(mem, field(layout.co_filename), layout, "co_filename")?;
    let name = read_str(mem, field(layout.co_name), layout, "co_name")?;
    let qualname = match layout.co_qualname {
        Some(q) => read_str(mem, field(q), layout, "co_qualname")?,
        None => name.clone(),
    };
    let firstlineno = u32_at(head, o(layout.co_firstlineno)).unwrap_or(0) as i32;
    let table = read_bytes(mem, field(layout.co_linetable), layout, MAX_LINE_TABLE)?;
    let lines = match (layout.frame_kind, layout.co_code_start) {
        (FrameKind::Object310, _) => LineTable::pep626(table, firstlineno),
        (_, Some(start)) => LineTable::locations(table, firstlineno, u32::from(start)),
        (_, None) => return Err(Unreadable::Malformed("a layout without co_code_adaptive")),
    };
    Ok(Code {
        name,
        qualname,
        filename,
        firstlineno,
        lines,
        tag: tag(&words),
    })
}

/// Reads the `str` object at `addr`: a compact one (its data after its
/// header, as every string a code object refers to is: they are made by
/// the compiler or unmarshalled, never by the legacy API), of any kind
/// (ASCII, latin-1, UCS-2, UCS-4), up to [`MAX_NAME_CHARS`] characters.
/// Lone surrogates (a `str` may hold them) become U+FFFD.
fn read_str(
    mem: &dyn Memory,
    addr: u64,
    layout: &Layout,
    what: &'static str,
) -> Result<String, Unreadable> {
    if addr == 0 {
        return Err(Unreadable::Malformed(what));
    }
    let mut head = [0u8; 64];
    let (at, state_at) = (
        usize::from(layout.str_length),
        usize::from(layout.str_state),
    );
    let Some(head) = head.get_mut(..at.max(state_at) + 8) else {
        return Err(Unreadable::Malformed("a layout beyond a str's header"));
    };
    mem.read(addr, head)?;
    let length = u64_at(head, at).unwrap_or(0) as i64;
    let state = u32_at(head, state_at).unwrap_or(0);
    let bit = |b: u8| state >> b & 1 != 0;
    let kind = (state >> layout.str_kind_shift) & 7;
    if length < 0 {
        return Err(Unreadable::Malformed("a str of negative length"));
    }
    if !bit(layout.str_compact_bit) || layout.str_ready_bit.is_some_and(|b| !bit(b)) {
        return Err(Unreadable::Malformed("a str not compact"));
    }
    let ascii = bit(layout.str_ascii_bit);
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err(Unreadable::Malformed("a str of no known kind"));
    }
    let data = if ascii {
        layout.str_ascii_data
    } else {
        layout.str_compact_data
    };
    let chars = (length as u64).min(MAX_NAME_CHARS as u64) as usize;
    let mut bytes = vec![0u8; chars * kind as usize];
    mem.read(
        addr.checked_add(u64::from(data))
            .ok_or(Unreadable::Malformed(what))?,
        &mut bytes,
    )?;
    let mut s: String = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    };
    if ascii && !s.is_ascii() {
        return Err(Unreadable::Malformed("an ASCII str that is not"));
    }
    if (length as u64) > chars as u64 {
        s.push('…');
    }
    Ok(s)
}

/// Reads the `bytes` object at `addr`, up to `max` bytes.
fn read_bytes(
    mem: &dyn Memory,
    addr: u64,
    layout: &Layout,
    max: usize,
) -> Result<Vec<u8>, Unreadable> {
    if addr == 0 {
        return Err(Unreadable::Malformed("co_linetable"));
    }
    let mut size = [0u8; 8];
    let at = addr
        .checked_add(u64::from(layout.bytes_size))
        .ok_or(Unreadable::Malformed("co_linetable"))?;
    mem.read(at, &mut size)?;
    let size = i64::from_le_bytes(size);
    if size < 0 {
        return Err(Unreadable::Malformed("a bytes of negative size"));
    }
    let len = (size as u64).min(max as u64) as usize;
    let mut data = vec![0u8; len];
    mem.read(
        addr.checked_add(u64::from(layout.bytes_data))
            .ok_or(Unreadable::Malformed("co_linetable"))?,
        &mut data,
    )?;
    Ok(data)
}

#[cfg(test)]
mod tests;
