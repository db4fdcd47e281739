//! Java frames in stacks copied before their process's unwind tables were
//! written (a JVM's first blocks), walked in userspace: the BPF walk's
//! `java_step()` over the copy, its words the same (but for a thread
//! stopped in interpreted code: the copy has no r13, and the walk is cut
//! there).
//!
//! The frame's slots come from the copy; the code cache's blobs from the
//! JVM's memory, read now, after the block. A blob found now is the one
//! the frame ran only if it was there when the stack was copied: its
//! compile id must not be above the JVM's compile count read when the copy
//! reached userspace ([`super::Jvms`]'s `copy_mark`), or the walk stops
//! there (its frame size may be another method's). Where that count is
//! not known, compiled frames are not walked. (A compile id is given when
//! the compilation is asked for, its code put in the code cache later: a
//! method compiled in the milliseconds between the copy and its reading
//! passes the check; it could be taken for the frame's only where its
//! code took the place of code freed in that time, at the frame's pc.)

use super::code::{self, u32_at};
use super::frames::{compiled_word, cut_word, interpreted_word};
use super::walk::{self, FrameAt};
use super::Walked;
use crate::bpf::types;
use crate::runtime::{CopyAt, CopyStep};

/// Where the walk stopped in Java code (`JAVA_CUT_*`).
fn cut(why: types::java_cut) -> CopyStep {
    CopyStep::End {
        word: cut_word(why.0),
        cut: true,
    }
}

/// The frame at `at` of a copied stack of JVM `w` (`mark`: its compile
/// count when the copy came), if it is Java code's.
pub(super) fn step(
    w: &Walked,
    mark: Option<u64>,
    at: CopyAt,
    read: &dyn Fn(u64) -> Option<u64>,
) -> CopyStep {
    use types::java_cut as Why;
    let e = &w.entry;
    let l = &w.layout;
    let mem = w.mem.as_ref();
    if at.pc >= e.interp_lo && at.pc < e.interp_hi {
        // The interpreter's own code: its frame may not be set up.
        if at.exact {
            return cut(Why::JAVA_CUT_RUNNING);
        }
        let slot = |words: i64| read(at.bp.wrapping_add_signed(8 * words));
        let (Some(method), Some(bcp), Some(sender), Some(fp), Some(ra)) = (
            slot(-(walk::INTERP_METHOD as i64)),
            slot(-(walk::INTERP_BCP as i64)),
            slot(l.interp_sender_sp),
            slot(0),
            slot(1),
        ) else {
            return cut(Why::JAVA_CUT_UNREADABLE);
        };
        if method & 7 != 0
            || method >= 1 << 47
            || method == 0
            || sender < at.bp.wrapping_add(16)
            || sender - at.bp > 1 << 20
        {
            return cut(Why::JAVA_CUT_UNREADABLE);
        }
        return CopyStep::Next {
            word: interpreted_word(method, bcp),
            pc: ra,
            sp: sender,
            bp: fp,
        };
    }
    if !w.heaps.iter().any(|h| at.pc >= h.low && at.pc < h.high) {
        return CopyStep::NotMine;
    }
    let Ok(Some(blob)) = code::blob_at(mem, &l.code, &w.heaps, at.pc) else {
        return cut(Why::JAVA_CUT_UNREADABLE);
    };
    let int = |off: u64| u32_at(mem, blob.wrapping_add(off)).ok();
    let (Some(size), Some(id)) = (int(l.blob_frame_size), int(l.code.nmethod_compile_id)) else {
        return cut(Why::JAVA_CUT_UNREADABLE);
    };
    let size = size as i32;
    let Ok(b) = code::blob(mem, &l.code, blob) else {
        return cut(Why::JAVA_CUT_UNREADABLE);
    };
    let nmethod = b.name.ends_with("nmethod");
    // Compiled since the copy came (or not known): another method's code,
    // perhaps, where the frame's ran.
    if nmethod && mark.is_none_or(|m| u64::from(id) > m) {
        return cut(Why::JAVA_CUT_UNREADABLE);
    }
    let mut pc = at.pc;
    if nmethod && !at.exact {
        // A frame to be deoptimized: the pc it was at is in the frame.
        if let (Ok(Some((handler, _))), Some(d)) = (walk::deopt_handlers(mem, l, blob), l.deopt) {
            if handler == pc {
                let (Some(off), Some(len)) = (int(d.orig_pc_offset), int(d.blob_size)) else {
                    return cut(Why::JAVA_CUT_UNREADABLE);
                };
                match read(at.sp.wrapping_add(u64::from(off))) {
                    Some(orig) if orig > blob && orig - blob < u64::from(len) => pc = orig,
                    _ => return cut(Why::JAVA_CUT_UNREADABLE),
                }
            }
        }
    }
    let word = compiled_word(pc, id);
    if size <= 0 {
        // The call stub keeps its frame pointer (but where the thread
        // stopped in its own code); other blobs without a frame size do
        // not.
        let call_stub = e.call_stub_return;
        if at.exact {
            return cut(Why::JAVA_CUT_RUNNING);
        }
        if call_stub != 0 && pc != call_stub {
            return cut(Why::JAVA_CUT_UNREADABLE);
        }
        return CopyStep::ByFramePointer { word };
    }
    if size > 1 << 16 {
        return cut(Why::JAVA_CUT_UNREADABLE);
    }
    let mut frame = FrameAt::Whole;
    if at.exact {
        frame = frame_where_stopped(w, blob, b.code_begin, pc);
    }
    let (ra, sp, bp) = match frame {
        FrameAt::Whole => {
            let sender = at.sp.wrapping_add(8 * size as u64);
            (
                read(sender.wrapping_sub(8)),
                sender,
                read(sender.wrapping_sub(16)),
            )
        }
        FrameAt::Return => (read(at.sp), at.sp.wrapping_add(8), Some(at.bp)),
        FrameAt::Popping => (
            read(at.sp.wrapping_add(8)),
            at.sp.wrapping_add(16),
            read(at.sp),
        ),
        FrameAt::Unknown => return cut(Why::JAVA_CUT_RUNNING),
    };
    match (ra, bp) {
        (Some(pc), Some(bp)) => CopyStep::Next { word, pc, sp, bp },
        _ => cut(Why::JAVA_CUT_UNREADABLE),
    }
}

/// How much of the frame stands where a thread stopped at `pc` in blob
/// `blob` (its code from `code_begin`), as the BPF program tells it: in
/// the code of a method C1 or C2 compiled (the blob's vtable or kind that
/// of a compiled method, its compile level not 0), past its prologue and
/// before its stubs, from the instructions there; elsewhere not known.
fn frame_where_stopped(w: &Walked, blob: u64, code_begin: u64, pc: u64) -> FrameAt {
    let e = &w.entry;
    let mem = w.mem.as_ref();
    let at = |off: u16| blob.wrapping_add(u64::from(off));
    let byte = |off: u16| {
        let mut b = [0u8];
        mem.read(at(off), &mut b).ok().map(|_| b[0])
    };
    let kind = match e.nm_kind_bytes {
        8 => code::u64_at(mem, at(e.nm_kind_at)).ok() == Some(e.nm_kind),
        1 => byte(e.nm_kind_at) == Some(e.nm_kind as u8),
        _ => false,
    };
    if !kind || byte(e.comp_level).is_none_or(|l| l == 0) {
        return FrameAt::Unknown;
    }
    let complete = if e.frame_complete_short != 0 {
        code::u16_at(mem, at(e.frame_complete)).map(|v| i64::from(v as i16))
    } else {
        u32_at(mem, at(e.frame_complete)).map(|v| i64::from(v as i32))
    };
    let stubs = u32_at(mem, at(e.stub_offset)).map(|v| blob.wrapping_add(u64::from(v)));
    let (Ok(complete), Ok(stubs)) = (complete, stubs) else {
        return FrameAt::Unknown;
    };
    if complete < 0 || pc < code_begin.wrapping_add(complete as u64) || pc >= stubs {
        return FrameAt::Unknown;
    }
    let mut code = [0u8; 24];
    if mem.read(pc.wrapping_sub(8), &mut code).is_err() {
        return FrameAt::Unknown;
    }
    walk::frame_at(&code)
}
