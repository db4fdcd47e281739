//! Where CPython keeps what the profiler reads, per minor version: the
//! offsets of the runtime's, a thread's, a frame's and a code object's
//! fields, and how `str` and `bytes` objects hold their data. x86-64 only,
//! default builds: not debug builds (`Py_DEBUG` changes object headers),
//! not free-threaded ones (3.13t: other object headers again).
//!
//! The numbers are not written by hand: `scripts/python-layouts` compiles a
//! C program against each version's headers (the internal ones included)
//! and prints the `offsetof` and `sizeof` values as the rows between the
//! GENERATED markers; `scripts/python-layouts --check` checks them again.
//! CPython keeps these structures from one micro release of a minor
//! version to the next (out-of-process debuggers rely on it; the tests
//! read Debian's 3.11.2 with the row made from 3.11.7's headers), so one
//! row serves a minor version. From 3.13 the runtime carries its own table
//! of offsets, which [`check_debug_offsets`] compares with the row before
//! it is trusted.

/// How a thread's Python frames are chained, and how the frames of one
/// C-level evaluation (one `_PyEval_EvalFrameDefault` activation) are told
/// apart from those of the next, so that they can be placed among the
/// native frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// 3.10: a chain of `PyFrameObject`s through `f_back`, each evaluated
    /// by its own C-level call of `_PyEval_EvalFrameDefault`; `f_lasti`
    /// (an `int`) is the index, in 2-byte code units, of the instruction
    /// last started, -1 before the first.
    Object310,
    /// 3.11: `_PyInterpreterFrame`s through `previous`; calls between
    /// Python functions stay in one activation, whose first (oldest) frame
    /// has `is_entry` (the byte at `f_entry`) set. `prev_instr` (at
    /// `f_instr`) points into the code object's bytecode.
    Interp311,
    /// 3.12 and 3.13: `_PyInterpreterFrame`s through `previous`, each
    /// activation's frames ended by a shim frame on the C stack whose
    /// `owner` (the byte at `f_entry`) is `owner_cstack`. The instruction
    /// pointer at `f_instr` is `prev_instr` in 3.12, `instr_ptr` in 3.13.
    Interp312,
}

/// The offsets of one minor version. All are byte offsets from the start
/// of the structure named; an `Option` is None where the version has no
/// such field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (major, minor).
    pub version: (u8, u8),

    // _PyRuntimeState (the global `_PyRuntime`)
    /// `autoTSSkey`, a `Py_tss_t { int _is_initialized; pthread_key_t
    /// _key; }`: the pthread key whose per-thread value is the thread's
    /// `PyThreadState` (the key itself at `tss_key + 4`).
    /// `gilstate.autoTSSkey` up to 3.11, `autoTSSkey` from 3.12.
    pub tss_key: u16,
    /// `interpreters.head`: the newest interpreter (`PyInterpreterState *`).
    pub interpreters_head: u16,

    // PyInterpreterState
    /// The interpreter's newest thread state: `tstate_head` in 3.10,
    /// `threads.head` from 3.11.
    pub interp_threads_head: u16,

    // PyThreadState
    /// `next`: the next (older) thread state of the interpreter.
    pub ts_next: u16,
    /// `thread_id`: the thread's `pthread_t`.
    pub ts_thread_id: u16,
    /// `native_thread_id`: the thread's kernel id (from 3.11; 3.10 has no
    /// such field, its thread states are found through `tss_key` or
    /// `ts_thread_id`).
    pub ts_native_thread_id: Option<u16>,
    /// The thread's current frame: `frame` (a `PyFrameObject *`) in 3.10;
    /// `cframe` (a `_PyCFrame *`, whose frame is at `cframe_current_frame`)
    /// in 3.11 and 3.12; `current_frame` (a `_PyInterpreterFrame *`) in
    /// 3.13.
    pub ts_frame: u16,
    /// `current_frame` in `_PyCFrame` (3.11 and 3.12).
    pub cframe_current_frame: Option<u16>,

    // PyFrameObject (3.10) or _PyInterpreterFrame
    /// How frames are chained and their activations told apart.
    pub frame_kind: FrameKind,
    /// The frame's code object: `f_code`; `f_executable` in 3.13, which may
    /// also hold another object (None in a shim frame), so that what it
    /// points to must be checked to be a code object.
    pub f_code: u16,
    /// The previous (calling) frame: `f_back` in 3.10, `previous` after.
    pub f_previous: u16,
    /// Where the frame is in its code: `f_lasti` (an `int`, an index in
    /// code units) in 3.10; a pointer into the code object's bytecode
    /// after: `prev_instr` in 3.11 and 3.12, `instr_ptr` in 3.13.
    pub f_instr: u16,
    /// The byte that ends an activation's frames: `is_entry` in 3.11,
    /// `owner` from 3.12; 0 and unused in 3.10.
    pub f_entry: u16,
    /// `FRAME_OWNED_BY_CSTACK`: the `owner` of a shim frame (3.12 on); 255
    /// (no frame's owner) before.
    pub owner_cstack: u8,

    // PyObject
    /// `ob_type`.
    pub ob_type: u16,

    // PyCodeObject
    /// `co_filename` (a `str`).
    pub co_filename: u16,
    /// `co_name` (a `str`).
    pub co_name: u16,
    /// `co_qualname` (a `str`, from 3.11).
    pub co_qualname: Option<u16>,
    /// `co_linetable` (a `bytes`): PEP 626's line table in 3.10, the
    /// location table after.
    pub co_linetable: u16,
    /// `co_firstlineno` (an `int`).
    pub co_firstlineno: u16,
    /// `co_code` (a `bytes` holding the bytecode), 3.10 only.
    pub co_code: Option<u16>,
    /// `co_code_adaptive`: where the bytecode begins inside the code
    /// object itself (from 3.11), so that an instruction pointer less the
    /// code object's address, less this, is a byte offset in the bytecode.
    pub co_code_start: Option<u16>,
    /// Where the 24 bytes the BPF program hashes into a code object's tag
    /// (see [`super::tag`]) begin: `co_filename`, then `co_name`, then
    /// `co_linetable` (3.10) or `co_qualname` (3.11 on), three adjacent
    /// pointers in every version of the table (the C program asserts it).
    pub tag_at: u16,

    // PyASCIIObject and PyCompactUnicodeObject (str)
    /// `length`: the number of code points.
    pub str_length: u16,
    /// `state`: a 32-bit word of bit fields.
    pub str_state: u16,
    /// The lowest bit of `state.kind` (3 bits: 1, 2 or 4 bytes a code
    /// point).
    pub str_kind_shift: u8,
    /// The bit of `state.compact`: the data follows the header.
    pub str_compact_bit: u8,
    /// The bit of `state.ascii`: every code point below 128.
    pub str_ascii_bit: u8,
    /// The bit of `state.ready` (up to 3.11: a string made by the legacy
    /// API may not have its canonical data yet).
    pub str_ready_bit: Option<u8>,
    /// Where a compact ASCII string's data begins
    /// (`sizeof(PyASCIIObject)`).
    pub str_ascii_data: u16,
    /// Where any other compact string's data begins
    /// (`sizeof(PyCompactUnicodeObject)`).
    pub str_compact_data: u16,

    // PyBytesObject
    /// `ob_size`: the number of bytes.
    pub bytes_size: u16,
    /// `ob_sval`: the bytes.
    pub bytes_data: u16,

    /// Where the runtime's own table of offsets gives the offsets above
    /// (3.13 on), for [`check_debug_offsets`].
    pub debug_offsets: Option<&'static DebugPositions>,
}

/// Where `_Py_DebugOffsets`, the table of offsets at the start of
/// `_PyRuntime` from 3.13, keeps each offset the [`Layout`] also has: byte
/// positions in that structure of 64-bit values, named by the `Layout`
/// field they must equal.
#[derive(Debug, PartialEq, Eq)]
pub struct DebugPositions {
    /// `sizeof(_Py_DebugOffsets)`.
    pub size: u16,
    /// The first 8 bytes: `_Py_Debug_Cookie`.
    pub cookie: &'static [u8; 8],
    /// `version`: `PY_VERSION_HEX`.
    pub version: u16,
    /// `free_threaded`: non-zero in a free-threaded build.
    pub free_threaded: u16,
    pub interpreters_head: u16,
    pub interp_threads_head: u16,
    pub ts_next: u16,
    pub ts_thread_id: u16,
    pub ts_native_thread_id: u16,
    pub ts_frame: u16,
    pub f_code: u16,
    pub f_previous: u16,
    pub f_instr: u16,
    pub f_entry: u16,
    pub ob_type: u16,
    pub co_filename: u16,
    pub co_name: u16,
    pub co_qualname: u16,
    pub co_linetable: u16,
    pub co_firstlineno: u16,
    pub co_code_start: u16,
    pub str_length: u16,
    pub str_state: u16,
    pub str_ascii_data: u16,
    pub bytes_size: u16,
    pub bytes_data: u16,
}

/// The layout of CPython `major.minor`, if it is one the profiler reads.
pub fn layout(major: u8, minor: u8) -> Option<&'static Layout> {
    match (major, minor) {
        (3, 10) => Some(&V3_10),
        (3, 11) => Some(&V3_11),
        (3, 12) => Some(&V3_12),
        (3, 13) => Some(&V3_13),
        _ => None,
    }
}

/// What the start of a runtime's `_Py_DebugOffsets` says of its build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugHeader {
    /// `PY_VERSION_HEX`: 0x030d00f0 is 3.13.0 final.
    pub version: u64,
    /// A free-threaded build (`Py_GIL_DISABLED`).
    pub free_threaded: bool,
}

/// Reads the cookie, version and free-threading flag of the
/// `_Py_DebugOffsets` at the start of `bytes` (the start of `_PyRuntime`),
/// laid out as `layout`'s version lays it out.
pub fn debug_header(bytes: &[u8], layout: &Layout) -> Result<DebugHeader, String> {
    let Some(pos) = layout.debug_offsets else {
        return Err(format!(
            "CPython {}.{} has no debug offsets",
            layout.version.0, layout.version.1
        ));
    };
    if bytes.len() < usize::from(pos.size) {
        return Err(format!(
            "{} bytes of _PyRuntime, fewer than its {}-byte debug offsets",
            bytes.len(),
            pos.size
        ));
    }
    if bytes[..8] != pos.cookie[..] {
        return Err(format!(
            "_PyRuntime does not begin with the debug offsets' cookie {:?} (but {:?})",
            String::from_utf8_lossy(pos.cookie),
            String::from_utf8_lossy(&bytes[..8])
        ));
    }
    Ok(DebugHeader {
        version: word(bytes, pos.version),
        free_threaded: word(bytes, pos.free_threaded) != 0,
    })
}

/// Checks the `_Py_DebugOffsets` at the start of `bytes` (the start of
/// `_PyRuntime`, from the file's initialized data or from the process)
/// against `layout`: its cookie, its version (the layout's major and minor),
/// that the build is not free-threaded, and every offset the layout also
/// has. Before 3.13 there is nothing to check (Ok). The error says which
/// value differs: a build of the same minor version with other structures
/// (debug, or patched) must not be read with the table.
pub fn check_debug_offsets(bytes: &[u8], layout: &Layout) -> Result<(), String> {
    let Some(pos) = layout.debug_offsets else {
        return Ok(());
    };
    let header = debug_header(bytes, layout)?;
    let (major, minor) = ((header.version >> 24) & 0xff, (header.version >> 16) & 0xff);
    if (major, minor) != (u64::from(layout.version.0), u64::from(layout.version.1)) {
        return Err(format!(
            "the debug offsets are of CPython {major}.{minor} (version {:#x}), not {}.{}",
            header.version, layout.version.0, layout.version.1
        ));
    }
    if header.free_threaded {
        return Err("a free-threaded build (its objects are laid out otherwise)".into());
    }
    let checks: [(&str, u16, Option<u16>); 22] = [
        (
            "runtime interpreters.head",
            pos.interpreters_head,
            Some(layout.interpreters_head),
        ),
        (
            "interpreter threads.head",
            pos.interp_threads_head,
            Some(layout.interp_threads_head),
        ),
        ("thread state next", pos.ts_next, Some(layout.ts_next)),
        (
            "thread state thread_id",
            pos.ts_thread_id,
            Some(layout.ts_thread_id),
        ),
        (
            "thread state native_thread_id",
            pos.ts_native_thread_id,
            layout.ts_native_thread_id,
        ),
        (
            "thread state current_frame",
            pos.ts_frame,
            Some(layout.ts_frame),
        ),
        ("frame executable", pos.f_code, Some(layout.f_code)),
        ("frame previous", pos.f_previous, Some(layout.f_previous)),
        ("frame instr_ptr", pos.f_instr, Some(layout.f_instr)),
        ("frame owner", pos.f_entry, Some(layout.f_entry)),
        ("object ob_type", pos.ob_type, Some(layout.ob_type)),
        (
            "code co_filename",
            pos.co_filename,
            Some(layout.co_filename),
        ),
        ("code co_name", pos.co_name, Some(layout.co_name)),
        ("code co_qualname", pos.co_qualname, layout.co_qualname),
        (
            "code co_linetable",
            pos.co_linetable,
            Some(layout.co_linetable),
        ),
        (
            "code co_firstlineno",
            pos.co_firstlineno,
            Some(layout.co_firstlineno),
        ),
        (
            "code co_code_adaptive",
            pos.co_code_start,
            layout.co_code_start,
        ),
        ("str length", pos.str_length, Some(layout.str_length)),
        ("str state", pos.str_state, Some(layout.str_state)),
        (
            "sizeof(PyASCIIObject)",
            pos.str_ascii_data,
            Some(layout.str_ascii_data),
        ),
        ("bytes ob_size", pos.bytes_size, Some(layout.bytes_size)),
        ("bytes ob_sval", pos.bytes_data, Some(layout.bytes_data)),
    ];
    for (what, at, want) in checks {
        let got = word(bytes, at);
        match want {
            Some(want) if got == u64::from(want) => {}
            Some(want) => {
                return Err(format!(
                    "the runtime puts {what} at {got}, the table at {want}"
                ))
            }
            None => {
                return Err(format!(
                    "the table has no {what}, the runtime puts it at {got}"
                ))
            }
        }
    }
    Ok(())
}

/// The little-endian 64-bit word at `at` of `bytes`, 0 beyond its end.
fn word(bytes: &[u8], at: u16) -> u64 {
    let at = usize::from(at);
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

// BEGIN GENERATED by scripts/python-layouts (x86-64, default builds)
// python3.10: 3.10.13
pub static V3_10: Layout = Layout {
    version: (3, 10),
    tss_key: 584,
    interpreters_head: 32,
    interp_threads_head: 8,
    ts_next: 8,
    ts_thread_id: 176,
    ts_native_thread_id: None,
    ts_frame: 24,
    cframe_current_frame: None,
    frame_kind: FrameKind::Object310,
    f_code: 32,
    f_previous: 24,
    f_instr: 96,
    f_entry: 0,
    owner_cstack: 255,
    ob_type: 8,
    co_filename: 104,
    co_name: 112,
    co_qualname: None,
    co_linetable: 120,
    co_firstlineno: 40,
    co_code: Some(48),
    co_code_start: None,
    tag_at: 104,
    str_length: 16,
    str_state: 32,
    str_kind_shift: 2,
    str_compact_bit: 5,
    str_ascii_bit: 6,
    str_ready_bit: Some(7),
    str_ascii_data: 48,
    str_compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
    debug_offsets: None,
};
// python3.11: 3.11.7
pub static V3_11: Layout = Layout {
    version: (3, 11),
    tss_key: 592,
    interpreters_head: 40,
    interp_threads_head: 16,
    ts_next: 8,
    ts_thread_id: 152,
    ts_native_thread_id: Some(160),
    ts_frame: 56,
    cframe_current_frame: Some(8),
    frame_kind: FrameKind::Interp311,
    f_code: 32,
    f_previous: 48,
    f_instr: 56,
    f_entry: 68,
    owner_cstack: 255,
    ob_type: 8,
    co_filename: 112,
    co_name: 120,
    co_qualname: Some(128),
    co_linetable: 136,
    co_firstlineno: 72,
    co_code: None,
    co_code_start: Some(184),
    tag_at: 112,
    str_length: 16,
    str_state: 32,
    str_kind_shift: 2,
    str_compact_bit: 5,
    str_ascii_bit: 6,
    str_ready_bit: Some(7),
    str_ascii_data: 48,
    str_compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
    debug_offsets: None,
};
// python3.12: 3.12.1
pub static V3_12: Layout = Layout {
    version: (3, 12),
    tss_key: 1544,
    interpreters_head: 40,
    interp_threads_head: 72,
    ts_next: 8,
    ts_thread_id: 136,
    ts_native_thread_id: Some(144),
    ts_frame: 56,
    cframe_current_frame: Some(0),
    frame_kind: FrameKind::Interp312,
    f_code: 0,
    f_previous: 8,
    f_instr: 56,
    f_entry: 70,
    owner_cstack: 3,
    ob_type: 8,
    co_filename: 112,
    co_name: 120,
    co_qualname: Some(128),
    co_linetable: 136,
    co_firstlineno: 68,
    co_code: None,
    co_code_start: Some(192),
    tag_at: 112,
    str_length: 16,
    str_state: 32,
    str_kind_shift: 2,
    str_compact_bit: 5,
    str_ascii_bit: 6,
    str_ready_bit: None,
    str_ascii_data: 40,
    str_compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
    debug_offsets: None,
};
// python3.13: 3.13.0
pub static DEBUG_V3_13: DebugPositions = DebugPositions {
    size: 584,
    cookie: b"xdebugpy",
    version: 8,
    free_threaded: 16,
    interpreters_head: 40,
    interp_threads_head: 72,
    ts_next: 168,
    ts_thread_id: 192,
    ts_native_thread_id: 200,
    ts_frame: 184,
    f_code: 240,
    f_previous: 232,
    f_instr: 248,
    f_entry: 264,
    ob_type: 360,
    co_filename: 280,
    co_name: 288,
    co_qualname: 296,
    co_linetable: 304,
    co_firstlineno: 312,
    co_code_start: 344,
    str_length: 552,
    str_state: 544,
    str_ascii_data: 560,
    bytes_size: 520,
    bytes_data: 528,
};
pub static V3_13: Layout = Layout {
    version: (3, 13),
    tss_key: 2160,
    interpreters_head: 632,
    interp_threads_head: 7344,
    ts_next: 8,
    ts_thread_id: 152,
    ts_native_thread_id: Some(160),
    ts_frame: 72,
    cframe_current_frame: None,
    frame_kind: FrameKind::Interp312,
    f_code: 0,
    f_previous: 8,
    f_instr: 56,
    f_entry: 70,
    owner_cstack: 3,
    ob_type: 8,
    co_filename: 112,
    co_name: 120,
    co_qualname: Some(128),
    co_linetable: 136,
    co_firstlineno: 68,
    co_code: None,
    co_code_start: Some(200),
    tag_at: 112,
    str_length: 16,
    str_state: 32,
    str_kind_shift: 2,
    str_compact_bit: 5,
    str_ascii_bit: 6,
    str_ready_bit: None,
    str_ascii_data: 40,
    str_compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
    debug_offsets: Some(&DEBUG_V3_13),
};
// END GENERATED
