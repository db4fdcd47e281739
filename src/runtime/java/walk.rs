//! A blocked Java thread's Java frames, walked from the JVM's memory: the
//! thread's frame anchor (where its Java code last called out: the stack
//! pointer, and the pc and frame pointer where the JVM keeps them), then
//! frame by frame through the code cache: an interpreted frame's method and
//! bytecode index from its slots below the frame pointer, a compiled
//! frame's size from its code blob (no frame pointer needed), its inlined
//! methods from its debug information at the return address; and each
//! method's line at its bytecode index from its line table.
//!
//! The reference for the frames a walk must find, and the decoding every
//! walk shares: debug information and line tables (compressed with
//! HotSpot's UNSIGNED5 coding), names. Every read is of another process's
//! memory, every loop bounded.

use super::code::{self, member, u16_at, u32_at, u64_at, Heap, Layout};
use super::vmstructs::VmStructs;
use crate::runtime::Memory;

/// Frames walked, at most.
pub const MAX_FRAMES: usize = 256;
/// Methods inlined at one pc, at most.
const MAX_INLINED: usize = 64;
/// A compiled method's scopes read, at most.
const MAX_STREAM: usize = 1 << 20;
/// PcDescs of one compiled method, at most.
const MAX_PCS: u64 = 1 << 16;

/// The interpreter's frame slots below the frame pointer (x86-64, words):
/// the method and the bytecode pointer (not in the JVM's tables; the same
/// from JDK 9 on), and the sender's stack pointer (in the tables as
/// `frame::interpreter_frame_sender_sp_offset`).
pub const INTERP_METHOD: u64 = 3;
pub const INTERP_BCP: u64 = 8;

/// What a walk reads beyond the code cache's fields.
#[derive(Clone, Debug)]
pub struct WalkLayout {
    pub code: Layout,
    /// HotSpot's UNSIGNED5 coding leaves byte 0 out from JDK 20 on.
    excluded_byte: u8,
    thread_list: ThreadList,
    thread_osthread: u64,
    osthread_tid: u64,
    thread_anchor: u64,
    anchor_sp: u64,
    anchor_pc: u64,
    anchor_fp: u64,
    pub(super) blob_frame_size: u64,
    pcs: DebugInfo,
    pc_desc_size: u64,
    pc_offset: u64,
    pc_scope: u64,
    pub(super) const_method_size: u64,
    const_flags: (u64, bool),
    pub(super) const_code_size: u64,
    has_line_table: u32,
    pub(super) interp_sender_sp: i64,
    /// A compiled method's deoptimization handler: where the blob keeps
    /// it, and whether as an int from the blob (JDK 23 on) rather than a
    /// pointer; where the nmethod keeps the offset of a frame's original
    /// pc; the blob's size (None where the tables lack one of them).
    pub(super) deopt: Option<Deopt>,
    /// What tells a frame's state where a thread stopped in compiled
    /// code, not at a call (None where the tables lack it).
    pub(super) running: Option<Running>,
}

/// Where a compiled method's blob says how far its prologue goes and
/// where its stubs begin, and how it is told from other blobs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Running {
    /// CodeBlob's `_frame_complete_offset` (from the code's start), and
    /// whether it is 16 bits wide (JDK 25) rather than an int.
    pub frame_complete: u64,
    pub frame_complete_short: bool,
    /// nmethod's `_stub_offset` (an int from the blob).
    pub stub_offset: u64,
    /// nmethod's `_comp_level` (its low byte: 0 for a native method's
    /// wrapper, whose epilogues are not C1's or C2's).
    pub comp_level: u64,
    pub kind: NmethodKind,
}

/// How an nmethod's blob is told from other blobs.
#[derive(Clone, Copy, Debug)]
pub(super) enum NmethodKind {
    /// Its vtable pointer (up to JDK 22: libjvm's `_ZTV7nmethod`, from
    /// its full symbol table).
    Vtable,
    /// CodeBlob's `_kind` byte equal to `CodeBlobKind::Nmethod` (JDK 23
    /// on): the byte's offset and the value.
    Byte(u64, u8),
}

/// See [`WalkLayout::deopt`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Deopt {
    pub handler: u64,
    /// The handler for method handles' call sites (not followed: its
    /// frames are said unreadable).
    pub mh_handler: Option<u64>,
    pub relative: bool,
    pub orig_pc_offset: u64,
    pub blob_size: u64,
}

#[derive(Clone, Copy, Debug)]
enum ThreadList {
    /// `ThreadsSMRSupport::_java_thread_list` (JDK 17 on): the list's
    /// address, its length's and its array's offsets.
    Smr(u64, u64, u64),
    /// `Threads::_thread_list` and `JavaThread::_next` (JDK 11).
    Linked(u64, u64),
}

/// Where a compiled method keeps its PcDescs, scopes and metadata.
#[derive(Clone, Copy, Debug)]
enum DebugInfo {
    /// Up to JDK 22: PcDescs from the blob's `_scopes_pcs_offset` to
    /// `_dependencies_offset`, scopes at `_scopes_data_begin`, metadata at
    /// the blob's `_metadata_offset`.
    InBlob {
        pcs: u64,
        pcs_end: u64,
        scopes_begin: u64,
        metadata: u64,
    },
    /// JDK 23 on: PcDescs and scopes in the immutable data; metadata in
    /// the mutable data, after the relocations (25).
    Immutable {
        data: u64,
        pcs: u64,
        scopes: u64,
        mutable: u64,
        relocation_size: u64,
    },
}

impl WalkLayout {
    /// The layout of the JVM of tables `s` and major version `major`.
    pub fn of(s: &VmStructs, major: u32) -> Result<WalkLayout, String> {
        let thread_list = match s.address("ThreadsSMRSupport", "_java_thread_list") {
            Some(list) => ThreadList::Smr(
                list,
                member(s, &[("ThreadsList", "_length")])?,
                member(s, &[("ThreadsList", "_threads")])?,
            ),
            None => ThreadList::Linked(
                s.address("Threads", "_thread_list")
                    .ok_or("no thread list in its tables")?,
                member(s, &[("JavaThread", "_next")])?,
            ),
        };
        let pcs = if s.offset("nmethod", "_immutable_data").is_some() {
            DebugInfo::Immutable {
                data: member(s, &[("nmethod", "_immutable_data")])?,
                pcs: member(s, &[("nmethod", "_scopes_pcs_offset")])?,
                scopes: member(s, &[("nmethod", "_scopes_data_offset")])?,
                mutable: member(s, &[("CodeBlob", "_mutable_data")])?,
                relocation_size: member(s, &[("CodeBlob", "_relocation_size")])?,
            }
        } else {
            DebugInfo::InBlob {
                pcs: member(s, &[("nmethod", "_scopes_pcs_offset")])?,
                pcs_end: member(s, &[("nmethod", "_dependencies_offset")])?,
                scopes_begin: member(s, &[("CompiledMethod", "_scopes_data_begin")])?,
                metadata: member(s, &[("nmethod", "_metadata_offset")])?,
            }
        };
        let const_flags = match s.offset("ConstMethod", "_flags._flags") {
            Some(o) => (o, true),
            None => (member(s, &[("ConstMethod", "_flags")])?, false),
        };
        let has_line_table = s
            .int("ConstMethodFlags::_misc_has_linenumber_table")
            .or_else(|| s.int("ConstMethod::_has_linenumber_table"))
            .ok_or("no line-table flag in its tables")? as u32;
        Ok(WalkLayout {
            code: Layout::of(s)?,
            excluded_byte: u8::from(major >= 20),
            thread_list,
            thread_osthread: member(s, &[("JavaThread", "_osthread"), ("Thread", "_osthread")])?,
            osthread_tid: member(s, &[("OSThread", "_thread_id")])?,
            thread_anchor: member(s, &[("JavaThread", "_anchor")])?,
            anchor_sp: member(s, &[("JavaFrameAnchor", "_last_Java_sp")])?,
            anchor_pc: member(s, &[("JavaFrameAnchor", "_last_Java_pc")])?,
            anchor_fp: member(s, &[("JavaFrameAnchor", "_last_Java_fp")])?,
            blob_frame_size: member(s, &[("CodeBlob", "_frame_size")])?,
            pcs,
            pc_desc_size: s.size("PcDesc").ok_or("no size of PcDesc")?,
            pc_offset: member(s, &[("PcDesc", "_pc_offset")])?,
            pc_scope: member(s, &[("PcDesc", "_scope_decode_offset")])?,
            const_method_size: s.size("ConstMethod").ok_or("no size of ConstMethod")?,
            const_flags,
            const_code_size: member(s, &[("ConstMethod", "_code_size")])?,
            has_line_table,
            interp_sender_sp: i64::from(
                s.int("frame::interpreter_frame_sender_sp_offset")
                    .unwrap_or(-1),
            ),
            deopt: deopt(s),
            running: running(s),
        })
    }
}

/// See [`WalkLayout::running`].
fn running(s: &VmStructs) -> Option<Running> {
    let fc = s
        .field("CodeBlob", "_frame_complete_offset")
        .filter(|f| !f.is_static)?;
    let kind = match (
        s.offset("CodeBlob", "_kind"),
        s.int("CodeBlobKind::Nmethod"),
    ) {
        (Some(at), Some(v)) => NmethodKind::Byte(at, u8::try_from(v).ok()?),
        _ => NmethodKind::Vtable,
    };
    Some(Running {
        frame_complete: fc.offset,
        frame_complete_short: fc.type_string.as_deref().is_some_and(|t| t.contains("16")),
        stub_offset: s.offset("nmethod", "_stub_offset")?,
        comp_level: s.offset("nmethod", "_comp_level")?,
        kind,
    })
}

/// Where a compiled frame to be deoptimized keeps its original pc.
fn deopt(s: &VmStructs) -> Option<Deopt> {
    let (handler, mh_handler, relative) = match s.offset("CompiledMethod", "_deopt_handler_begin") {
        Some(o) => (
            o,
            s.offset("CompiledMethod", "_deopt_mh_handler_begin"),
            false,
        ),
        None => (
            s.offset("nmethod", "_deopt_handler_offset")?,
            s.offset("nmethod", "_deopt_mh_handler_offset"),
            true,
        ),
    };
    Some(Deopt {
        handler,
        mh_handler,
        relative,
        orig_pc_offset: s.offset("nmethod", "_orig_pc_offset")?,
        blob_size: s.offset("CodeBlob", "_size")?,
    })
}

/// The deoptimization handlers of compiled method `blob` (the plain one,
/// and the one for method handles' call sites where it has one): where
/// the return address of its frames to be deoptimized points. None where
/// the tables do not say.
pub(super) fn deopt_handlers(
    mem: &dyn Memory,
    l: &WalkLayout,
    blob: u64,
) -> std::io::Result<Option<(u64, u64)>> {
    let Some(d) = l.deopt else {
        return Ok(None);
    };
    let at = |field: u64| -> std::io::Result<u64> {
        if d.relative {
            let off = u32_at(mem, blob.wrapping_add(field))? as i32;
            Ok(if off <= 0 {
                0
            } else {
                blob.wrapping_add(off as u64)
            })
        } else {
            u64_at(mem, blob.wrapping_add(field))
        }
    };
    let mh = match d.mh_handler {
        Some(f) => at(f)?,
        None => 0,
    };
    Ok(Some((at(d.handler)?, mh)))
}

/// The JVM's threads: each `JavaThread*` and its thread's id (the
/// kernel's tid).
pub fn threads(mem: &dyn Memory, l: &WalkLayout) -> std::io::Result<Vec<(u64, u32)>> {
    let mut out = Vec::new();
    let mut add = |t: u64| -> std::io::Result<()> {
        let os = u64_at(mem, t.wrapping_add(l.thread_osthread))?;
        if os != 0 {
            out.push((t, u32_at(mem, os.wrapping_add(l.osthread_tid))?));
        }
        Ok(())
    };
    match l.thread_list {
        ThreadList::Smr(list, len, threads) => {
            let list = u64_at(mem, list)?;
            let n = u32_at(mem, list.wrapping_add(len))?.min(1 << 16);
            let array = u64_at(mem, list.wrapping_add(threads))?;
            for i in 0..u64::from(n) {
                add(u64_at(mem, array.wrapping_add(8 * i))?)?;
            }
        }
        ThreadList::Linked(head, next) => {
            let mut t = u64_at(mem, head)?;
            for _ in 0..1 << 16 {
                if t == 0 {
                    break;
                }
                add(t)?;
                t = u64_at(mem, t.wrapping_add(next))?;
            }
        }
    }
    Ok(out)
}

/// A Java frame: its method, the bytecode index it was at (-1 where none:
/// a native method), and whether it was inlined into the next (outer)
/// frame's compiled code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JavaFrame {
    pub method: u64,
    pub bci: i32,
    pub inlined: bool,
}

/// A reader of HotSpot's UNSIGNED5 coding (`excluded` 0 or 1).
struct Unsigned5<'a> {
    bytes: &'a [u8],
    at: usize,
    excluded: u8,
}

impl Unsigned5<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn unsigned(&mut self) -> Option<u32> {
        let mut v: u32 = 0;
        let mut shift = 0;
        for i in 0..5 {
            let b = self.byte()?;
            let digit = u32::from(b.checked_sub(self.excluded)?);
            v = v.wrapping_add(digit << shift);
            if b < 192 || i == 4 {
                return Some(v);
            }
            shift += 6;
        }
        Some(v)
    }

    fn signed(&mut self) -> Option<i32> {
        let v = self.unsigned()?;
        Some(((v >> 1) as i32) ^ -((v & 1) as i32))
    }
}

/// The methods (innermost first) and bytecode indexes at return address
/// `pc` of the compiled method `blob` (its code from `code_begin`): its
/// inlined methods where its debug information has that pc, else the
/// method itself at no index.
pub(super) fn compiled_frames(
    mem: &dyn Memory,
    l: &WalkLayout,
    blob: u64,
    code_begin: u64,
    pc: u64,
) -> std::io::Result<Vec<JavaFrame>> {
    let (method, _) = code::nmethod(mem, &l.code, blob)?;
    let int =
        |off: u64| -> std::io::Result<u64> { Ok(u64::from(u32_at(mem, blob.wrapping_add(off))?)) };
    let (pcs, pcs_end, scopes, metadata) = match l.pcs {
        DebugInfo::InBlob {
            pcs,
            pcs_end,
            scopes_begin,
            metadata,
        } => (
            blob.wrapping_add(int(pcs)?),
            blob.wrapping_add(int(pcs_end)?),
            u64_at(mem, blob.wrapping_add(scopes_begin))?,
            blob.wrapping_add(int(metadata)?),
        ),
        DebugInfo::Immutable {
            data,
            pcs,
            scopes,
            mutable,
            relocation_size,
        } => {
            let data = u64_at(mem, blob.wrapping_add(data))?;
            let mutable = u64_at(mem, blob.wrapping_add(mutable))?;
            (
                data.wrapping_add(int(pcs)?),
                data.wrapping_add(int(scopes)?),
                data.wrapping_add(int(scopes)?),
                mutable.wrapping_add(int(relocation_size)?),
            )
        }
    };
    let alone = vec![JavaFrame {
        method,
        bci: -1,
        inlined: false,
    }];
    let n = pcs_end.wrapping_sub(pcs) / l.pc_desc_size.max(1);
    if pcs_end < pcs || n > MAX_PCS || method == 0 {
        return Ok(alone);
    }
    let mut table = vec![0u8; (n * l.pc_desc_size) as usize];
    mem.read(pcs, &mut table)?;
    let want = pc.wrapping_sub(code_begin);
    let scope = table.chunks_exact(l.pc_desc_size as usize).find_map(|d| {
        let at = |o: u64| -> Option<u32> {
            Some(u32::from_le_bytes(
                d.get(o as usize..o as usize + 4)?.try_into().ok()?,
            ))
        };
        (u64::from(at(l.pc_offset)?) == want).then(|| at(l.pc_scope))?
    });
    let Some(mut scope) = scope.filter(|&s| s != 0) else {
        return Ok(alone);
    };
    // The scopes from their start to past this one's: a scope's sender
    // is written before it, at a smaller offset.
    if scope as usize >= MAX_STREAM {
        return Ok(alone);
    }
    let mut stream = vec![0u8; scope as usize + 64];
    let len = read_some(mem, scopes, &mut stream)?;
    let mut frames = Vec::new();
    for _ in 0..MAX_INLINED {
        let mut r = Unsigned5 {
            bytes: &stream[..len],
            at: scope as usize,
            excluded: l.excluded_byte,
        };
        let (Some(sender), Some(index), Some(bci)) = (r.unsigned(), r.unsigned(), r.unsigned())
        else {
            break;
        };
        let m = if index == 0 {
            method
        } else {
            u64_at(mem, metadata.wrapping_add(8 * u64::from(index - 1)))?
        };
        frames.push(JavaFrame {
            method: m,
            bci: bci as i32 - 1,
            inlined: sender != 0,
        });
        if sender == 0 || sender >= scope {
            break;
        }
        scope = sender;
    }
    Ok(if frames.is_empty() { alone } else { frames })
}

/// Reads as much of `buf` from `addr` as is mapped (halving the length
/// until a read succeeds); returns the length read.
pub(super) fn read_some(mem: &dyn Memory, addr: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = buf.len();
    loop {
        match mem.read(addr, &mut buf[..n]) {
            Ok(()) => return Ok(n),
            Err(e) if n <= 16 => return Err(e),
            Err(_) => n /= 2,
        }
    }
}

/// Where the thread at `thread` (a `JavaThread*`) last left Java code, from
/// its frame anchor: the stack pointer, pc and frame pointer of its
/// innermost Java frame (sp 0: none).
pub fn anchor(mem: &dyn Memory, l: &WalkLayout, thread: u64) -> std::io::Result<(u64, u64, u64)> {
    let anchor = thread.wrapping_add(l.thread_anchor);
    let sp = u64_at(mem, anchor.wrapping_add(l.anchor_sp))?;
    let mut pc = u64_at(mem, anchor.wrapping_add(l.anchor_pc))?;
    let fp = u64_at(mem, anchor.wrapping_add(l.anchor_fp))?;
    if sp != 0 && pc == 0 {
        pc = u64_at(mem, sp.wrapping_sub(8))?;
    }
    Ok((sp, pc, fp))
}

/// The Java frames of the thread at `thread` (a `JavaThread*`), innermost
/// first, from its frame anchor: empty where it has none (running Java
/// code, or not in Java at all).
pub fn walk(
    mem: &dyn Memory,
    l: &WalkLayout,
    heaps: &[Heap],
    thread: u64,
) -> std::io::Result<Vec<JavaFrame>> {
    let (mut sp, mut pc, mut fp) = anchor(mem, l, thread)?;
    let mut frames = Vec::new();
    if sp == 0 {
        return Ok(frames);
    }
    while frames.len() < MAX_FRAMES {
        let Some(b) = code::blob_at(mem, &l.code, heaps, pc)? else {
            break;
        };
        let blob = code::blob(mem, &l.code, b)?;
        if blob.name == "Interpreter" {
            let method = u64_at(mem, fp.wrapping_sub(8 * INTERP_METHOD))?;
            let bcp = u64_at(mem, fp.wrapping_sub(8 * INTERP_BCP))?;
            let cm = u64_at(mem, method.wrapping_add(l.code.method_const))?;
            let first = cm.wrapping_add(l.const_method_size);
            let bci = if bcp >= first && bcp - first < 1 << 16 {
                (bcp - first) as i32
            } else {
                -1
            };
            frames.push(JavaFrame {
                method,
                bci,
                inlined: false,
            });
            pc = u64_at(mem, fp.wrapping_add(8))?;
            sp = u64_at(mem, fp.wrapping_add_signed(8 * l.interp_sender_sp))?;
            fp = u64_at(mem, fp)?;
            continue;
        }
        let size = u64::from(u32_at(mem, b.wrapping_add(l.blob_frame_size))?);
        if blob.name.ends_with("nmethod") {
            // A frame to be deoptimized: the pc it was at is in the
            // frame.
            let at = match deopt_handlers(mem, l, b)? {
                Some((handler, _)) if handler == pc => {
                    let d = l.deopt.expect("handlers read");
                    u64_at(
                        mem,
                        sp.wrapping_add(u64::from(u32_at(mem, b + d.orig_pc_offset)?)),
                    )?
                }
                _ => pc,
            };
            frames.extend(compiled_frames(mem, l, b, blob.code_begin, at)?);
        } else if size == 0 {
            // The call stub, where the thread entered Java: the end.
            break;
        }
        if size == 0 || size > 1 << 16 {
            break;
        }
        let sender = sp.wrapping_add(8 * size);
        pc = u64_at(mem, sender.wrapping_sub(8))?;
        fp = u64_at(mem, sender.wrapping_sub(16))?;
        sp = sender;
    }
    Ok(frames)
}

/// The line of bytecode index `bci` of the method at `method`, from its
/// line table (None where it has none).
pub fn line(
    mem: &dyn Memory,
    l: &WalkLayout,
    method: u64,
    bci: i32,
) -> std::io::Result<Option<u32>> {
    if bci < 0 {
        return Ok(None);
    }
    Ok(line_at(&line_table(mem, l, method)?, bci))
}

/// The line at bytecode index `bci` in line table `table` (see
/// [`line_table`]).
pub fn line_at(table: &[(i32, i32)], bci: i32) -> Option<u32> {
    let mut best: Option<(i32, i32)> = None;
    for &(b, n) in table {
        if b <= bci && best.is_none_or(|(bb, _)| b >= bb) {
            best = Some((b, n));
        }
    }
    best.and_then(|(_, n)| u32::try_from(n).ok())
}

/// The line table of the method at `method`: (bytecode index, line)
/// pairs as the method's compressed table lists them (empty where it has
/// none).
pub fn line_table(
    mem: &dyn Memory,
    l: &WalkLayout,
    method: u64,
) -> std::io::Result<Vec<(i32, i32)>> {
    let cm = u64_at(mem, method.wrapping_add(l.code.method_const))?;
    let (at, wide) = l.const_flags;
    let flags = if wide {
        u32_at(mem, cm.wrapping_add(at))?
    } else {
        u32::from(u16_at(mem, cm.wrapping_add(at))?)
    };
    if flags & l.has_line_table == 0 {
        return Ok(Vec::new());
    }
    let code_size = u64::from(u16_at(mem, cm.wrapping_add(l.const_code_size))?);
    let mut stream = vec![0u8; 4096];
    let len = read_some(
        mem,
        cm.wrapping_add(l.const_method_size).wrapping_add(code_size),
        &mut stream,
    )?;
    let mut r = Unsigned5 {
        bytes: &stream[..len],
        at: 0,
        excluded: l.excluded_byte,
    };
    let (mut b, mut n) = (0i32, 0i32);
    let mut table = Vec::new();
    while let Some(c) = r.byte() {
        match c {
            0 => break,
            0xff => {
                let (Some(db), Some(dn)) = (r.signed(), r.signed()) else {
                    break;
                };
                b = b.wrapping_add(db);
                n = n.wrapping_add(dn);
            }
            c => {
                b = b.wrapping_add(i32::from(c >> 3));
                n = n.wrapping_add(i32::from(c & 7));
            }
        }
        table.push((b, n));
    }
    Ok(table)
}

/// Where the bytecodes of the method at `method` begin, and their size.
pub fn bytecodes(mem: &dyn Memory, l: &WalkLayout, method: u64) -> std::io::Result<(u64, u16)> {
    let cm = u64_at(mem, method.wrapping_add(l.code.method_const))?;
    Ok((
        cm.wrapping_add(l.const_method_size),
        u16_at(mem, cm.wrapping_add(l.const_code_size))?,
    ))
}

/// The interpreter's code: the range of its stub queue's buffer.
pub fn interpreter(mem: &dyn Memory, s: &VmStructs) -> std::io::Result<(u64, u64)> {
    let field = |t: &str, f: &str| {
        s.offset(t, f)
            .ok_or_else(|| code::bad(format!("no {t}::{f} in its tables")))
    };
    let queue = s
        .address("AbstractInterpreter", "_code")
        .ok_or_else(|| code::bad("no AbstractInterpreter::_code in its tables".into()))?;
    let queue = u64_at(mem, queue)?;
    if queue == 0 {
        return Ok((0, 0));
    }
    let low = u64_at(mem, queue.wrapping_add(field("StubQueue", "_stub_buffer")?))?;
    let size = u32_at(
        mem,
        queue.wrapping_add(field("StubQueue", "_buffer_limit")?),
    )?;
    Ok((low, low.wrapping_add(u64::from(size))))
}

/// Where Java code returns into the call stub (`StubRoutines::
/// _call_stub_return_address`), 0 where the tables do not say or the JVM
/// has not made its stubs yet.
pub fn call_stub_return(mem: &dyn Memory, s: &VmStructs) -> std::io::Result<u64> {
    match s.address("StubRoutines", "_call_stub_return_address") {
        Some(at) => u64_at(mem, at),
        None => Ok(0),
    }
}

/// The name of method `method`'s source file, where its class says.
pub fn source_file(
    mem: &dyn Memory,
    l: &Layout,
    s: &VmStructs,
    method: u64,
) -> std::io::Result<Option<String>> {
    let cm = u64_at(mem, method.wrapping_add(l.method_const))?;
    let cp = u64_at(mem, cm.wrapping_add(l.const_constants))?;
    let index = match (
        s.offset("ConstantPool", "_source_file_name_index"),
        s.offset("InstanceKlass", "_source_file_name_index"),
    ) {
        (Some(o), _) => u16_at(mem, cp.wrapping_add(o))?,
        (None, Some(o)) => {
            let holder = u64_at(mem, cp.wrapping_add(l.pool_holder))?;
            u16_at(mem, holder.wrapping_add(o))?
        }
        (None, None) => return Ok(None),
    };
    if index == 0 {
        return Ok(None);
    }
    let slot = cp
        .wrapping_add(l.pool_size)
        .wrapping_add(8 * u64::from(index));
    Ok(Some(code::symbol(mem, l, u64_at(mem, slot)? & !1)?))
}

/// How the frame of a thread stopped in a compiled method's code (past
/// its prologue, not at a call) stands, from the instructions there: the
/// BPF program's `java_code_at()`, for the walks of copied stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameAt {
    /// Whole: the blob's frame size from the stack pointer.
    Whole,
    /// Torn down to the return address, at the stack pointer.
    Return,
    /// Torn down to the caller's frame pointer (popped next) and the
    /// return address above it.
    Popping,
    /// A pop before instructions not known.
    Unknown,
}

/// A conditional jump (ja, to a stub out of line) then a ret, at `b[k]`.
fn jcc_ret(b: &[u8; 24], k: usize) -> bool {
    b[k] == 0x0f && b[k + 1] == 0x87 && b[k + 6] == 0xc3
}

/// Whether the instructions at `b[k]` lead to a ret without touching the
/// stack pointer: a ret; a return's safepoint poll (JDK 11: `mov r10,
/// [r15+disp32]; test eax,[r10]`; from 17: `cmp rsp,[r15+disp]; ja`).
fn ret_tail(b: &[u8; 24], k: usize) -> bool {
    match b[k..k + 4] {
        [0xc3, ..] => true,
        [0x0f, ..] => jcc_ret(b, k),
        [0x49, 0x3b, 0xa7, _] => jcc_ret(b, k + 7),
        [0x49, 0x3b, 0x67, _] => jcc_ret(b, k + 4),
        [0x4d, 0x8b, 0x97, _] => b[k + 7..k + 11] == [0x41, 0x85, 0x02, 0xc3],
        [0x41, 0x85, 0x02, 0xc3] => true,
        _ => false,
    }
}

/// The state of the frame of a thread stopped at a pc past its compiled
/// method's prologue, from `code`: the 8 bytes before the pc, then the 16
/// at it (see [`FrameAt`]). C1's and C2's code changes the stack pointer
/// only in its prologue and its epilogues: `add rsp,N; pop rbp`, then the
/// return's poll and `ret`, or a jump out (to an exception's unwinding, a
/// method handle's target). After the pop, told by the add and pop just
/// before the pc, or the return's known instructions from the pc on (and
/// a reserved stack area's check, `cmp rsp` then `jb`, right after the
/// pop), or the return poll's stub.
pub fn frame_at(code: &[u8; 24]) -> FrameAt {
    let add_pop_before =
        code[7] == 0x5d && (code[3..6] == [0x48, 0x83, 0xc4] || code[0..3] == [0x48, 0x81, 0xc4]);
    let reserved_check = code[0..4] == [0x5d, 0x49, 0x3b, 0xa7] && code[8..10] == [0x0f, 0x82];
    // A return's safepoint poll taken: its stub (in the code, before the
    // stubs' section from JDK 17), reached with the frame torn down: `lea
    // r10,[rip+d]` (or `mov r10,imm64`, below); `mov [r15+d],r10; jmp`.
    // At its `mov` or its `jmp`, the stub is told by the instruction
    // before the mov: where it is not in view (at the jmp), by that
    // instruction's last byte, the top byte of the lea's displacement (the
    // poll's pc, before the stub: 0xff) or of the mov's address (0x00).
    // A `mov [r15+d],r10; jmp` after `xor r10,r10` stores no pc: no poll
    // stub's, and not known.
    let mov_jmp_at_mov = code[8..11] == [0x4d, 0x89, 0x97] && code[15] == 0xe9;
    let mov_jmp_at_jmp = code[1..4] == [0x4d, 0x89, 0x97] && code[8] == 0xe9;
    let r10_zeroed = matches!(code[5..8], [0x4d, 0x33, 0xd2] | [0x4d, 0x31, 0xd2]);
    let poll_stub = (code[8..11] == [0x4c, 0x8d, 0x15]
        && code[15..18] == [0x4d, 0x89, 0x97]
        && code[22] == 0xe9)
        || (mov_jmp_at_mov && !r10_zeroed)
        || (mov_jmp_at_jmp && matches!(code[0], 0x00 | 0xff));
    if add_pop_before || reserved_check || poll_stub || ret_tail(code, 8) {
        FrameAt::Return
    } else if mov_jmp_at_mov || mov_jmp_at_jmp {
        FrameAt::Unknown
    } else if code[8] == 0x5d {
        if ret_tail(code, 9) || code[4..7] == [0x48, 0x83, 0xc4] || code[1..4] == [0x48, 0x81, 0xc4]
        {
            FrameAt::Popping
        } else {
            FrameAt::Unknown
        }
    } else if code[7] == 0x5d {
        // Just after a pop not read above (no add before it: a frame of
        // two words), or a byte 0x5d ending another instruction.
        FrameAt::Unknown
    } else if code[8..10] == [0x49, 0xba] && code[18..21] == [0x4d, 0x89, 0x97] {
        // `mov r10,imm64; mov [r15+d],r10`: a poll stub's, or a call's
        // setting of the last Java pc, not told apart here.
        FrameAt::Unknown
    } else {
        FrameAt::Whole
    }
}

/// Where the interpreter's bytecode templates are: a thread stopped in
/// one (not at a call) is in its method's frame, set up, with its bytecode
/// pointer in r13; but for the templates that return, whose frame is torn
/// down before the jump back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Templates {
    pub low: u64,
    pub high: u64,
    /// The returning templates (`ireturn` to `return`, and
    /// `return_register_finalizer`): at most two ranges.
    pub returns: [(u64, u64); 2],
}

/// The interpreter's codelets read, at most.
const MAX_CODELETS: usize = 1 << 12;

/// The interpreter's bytecode templates (see [`Templates`]), from its
/// codelets (each with its size, description and bytecode, -1 for those
/// not a bytecode's); None where the tables lack them or the codelets are
/// not laid out as expected (the templates one run, the returning ones at
/// most two runs among them).
pub fn templates(mem: &dyn Memory, s: &VmStructs) -> std::io::Result<Option<Templates>> {
    let field = |t: &str, f: &str| s.offset(t, f);
    let (
        Some(queue),
        Some(buffer),
        Some(begin),
        Some(end),
        Some(size),
        Some(description),
        Some(bytecode),
    ) = (
        s.address("AbstractInterpreter", "_code"),
        field("StubQueue", "_stub_buffer"),
        field("StubQueue", "_queue_begin"),
        field("StubQueue", "_queue_end"),
        field("InterpreterCodelet", "_size"),
        field("InterpreterCodelet", "_description"),
        field("InterpreterCodelet", "_bytecode"),
    )
    else {
        return Ok(None);
    };
    let queue = u64_at(mem, queue)?;
    if queue == 0 {
        return Ok(None);
    }
    let buffer = u64_at(mem, queue.wrapping_add(buffer))?;
    let begin = u64::from(u32_at(mem, queue.wrapping_add(begin))?);
    let end = u64::from(u32_at(mem, queue.wrapping_add(end))?);
    let mut t = Templates::default();
    let mut returns: Vec<(u64, u64)> = Vec::new();
    let mut at = begin;
    for _ in 0..MAX_CODELETS {
        if at >= end {
            break;
        }
        let codelet = buffer.wrapping_add(at);
        let len = u64::from(u32_at(mem, codelet.wrapping_add(size))?);
        if len == 0 || len > 1 << 20 {
            return Ok(None);
        }
        let code = u32_at(mem, codelet.wrapping_add(bytecode))? as i32;
        let (lo, hi) = (codelet, codelet + len);
        if code >= 0 {
            if t.low == 0 {
                t.low = lo;
            } else if t.high != lo {
                // Another codelet among the templates.
                return Ok(None);
            }
            t.high = hi;
            let name = code::c_string(mem, u64_at(mem, codelet.wrapping_add(description))?, 64)?;
            if name.ends_with("return") || name == "return_register_finalizer" {
                match returns.last_mut() {
                    Some(r) if r.1 == lo => r.1 = hi,
                    _ => returns.push((lo, hi)),
                }
            }
        }
        at += len;
    }
    if t.low == 0 || returns.is_empty() || returns.len() > t.returns.len() {
        return Ok(None);
    }
    for (slot, r) in t.returns.iter_mut().zip(&returns) {
        *slot = *r;
    }
    Ok(Some(t))
}
