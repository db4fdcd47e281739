//! The Java frames of stored stacks, named: each Java word the BPF walk
//! wrote (see `JAVA_INTERP_MARK` in `offcputime.h`) read back from the
//! JVM's memory into the methods it stands for, inlined ones expanded, and
//! each method's names and line table kept, once per method.
//!
//! An interpreted frame's word holds its `Method*` and the low bits of its
//! bytecode pointer (the index found from the method's bytecodes). A
//! compiled frame's holds its pc and the low bits of the compile id its
//! blob had then: the blob found at that pc now must have the same, or
//! the code was replaced since and the frame is not named after its
//! successor (`[java: code replaced]`).

use std::collections::HashMap;

use super::code::{self, Heap};
use super::vmstructs::VmStructs;
use super::walk::{self, WalkLayout};
use crate::runtime::{Frame, FrameName, Memory};

/// Bits 63..60 of a Java word (`JAVA_*_MARK`).
pub const INTERP_MARK: u64 = 0xa;
pub const CODE_MARK: u64 = 0xb;
pub const CUT_MARK: u64 = 0xc;
/// The compile id's bits a compiled frame's word keeps.
const CHECK_BITS: u32 = 13;
/// The pc's bits.
const PC_BITS: u32 = 47;

/// A frame's bytecode index in [`Frame::Code`]'s `at` where it has none.
pub const NO_AT: u32 = u32::MAX;

/// Whether stack word `word` is a Java frame's.
pub fn is_java_word(word: u64) -> bool {
    matches!(word >> 60, INTERP_MARK | CODE_MARK | CUT_MARK)
}

/// The word of an interpreted frame: its `Method*` and bytecode pointer
/// (as the BPF walk writes it).
pub fn interpreted_word(method: u64, bcp: u64) -> u64 {
    INTERP_MARK << 60 | (method >> 3) << 16 | (bcp & 0xffff)
}

/// The word of a compiled frame (or a stub's): its pc and its blob's
/// compile id (as the BPF walk writes it).
pub fn compiled_word(pc: u64, compile_id: u32) -> u64 {
    CODE_MARK << 60
        | u64::from(compile_id & ((1 << CHECK_BITS) - 1)) << PC_BITS
        | (pc & ((1 << PC_BITS) - 1))
}

/// The word of a walk cut in Java code (`JAVA_CUT_*`, why).
pub fn cut_word(why: u32) -> u64 {
    CUT_MARK << 60 | u64::from(why)
}

/// A Java word, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    Interpreted { method: u64, bcp_low: u16 },
    Compiled { pc: u64, check: u32 },
    Cut,
}

pub fn decode(word: u64) -> Option<Word> {
    match word >> 60 {
        INTERP_MARK => Some(Word::Interpreted {
            method: ((word >> 16) & ((1 << 44) - 1)) << 3,
            bcp_low: word as u16,
        }),
        CODE_MARK => Some(Word::Compiled {
            pc: word & ((1 << PC_BITS) - 1),
            check: ((word >> PC_BITS) & ((1 << CHECK_BITS) - 1)) as u32,
        }),
        CUT_MARK => Some(Word::Cut),
        _ => None,
    }
}

/// A method (or a stub, or code replaced) as the outputs name it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Code {
    /// `java.util.concurrent.LinkedBlockingQueue.take`, `[jvm: …]`.
    name: String,
    /// `LinkedBlockingQueue.java`; empty for the JVM's own code.
    file: String,
    /// (bytecode index, line).
    lines: Vec<(i32, i32)>,
}

/// What was read of one JVM process to name its frames.
pub struct Reader<'a> {
    pub mem: &'a dyn Memory,
    pub layout: &'a WalkLayout,
    pub structs: &'a VmStructs,
    pub heaps: &'a [Heap],
}

/// What the frames named: the codes, and how many could not be.
#[derive(Default)]
pub struct Names {
    codes: Vec<Code>,
    /// By the process's key and `Method*`: its code, and where its
    /// bytecodes are (see [`walk::bytecodes`]).
    methods: HashMap<(u64, u64), (u32, Option<(u64, u16)>)>,
    /// Codes named by name alone (stubs, code replaced).
    plain: HashMap<String, u32>,
    pub methods_read: u64,
    pub unreadable: u64,
    pub replaced: u64,
    /// Compiled frames to be deoptimized whose own pc was not found.
    pub deoptimized: u64,
}

/// The name of code that replaced the code a frame was in.
pub const REPLACED: &str = "[java: code replaced]";

impl Names {
    fn plain(&mut self, name: String) -> u32 {
        if let Some(&i) = self.plain.get(&name) {
            return i;
        }
        let i = self.codes.len() as u32;
        self.codes.push(Code {
            name: name.clone(),
            file: String::new(),
            lines: Vec::new(),
        });
        self.plain.insert(name, i);
        i
    }

    /// The code of method `method` of the process keyed `key` (its
    /// names read once).
    fn method(&mut self, r: &Reader<'_>, key: u64, method: u64) -> Option<u32> {
        Some(self.method_read(r, key, method)?.0)
    }

    fn method_read(
        &mut self,
        r: &Reader<'_>,
        key: u64,
        method: u64,
    ) -> Option<(u32, Option<(u64, u16)>)> {
        if let Some(&m) = self.methods.get(&(key, method)) {
            return Some(m);
        }
        let names = code::method_name(r.mem, &r.layout.code, method).ok()?;
        let file = walk::source_file(r.mem, &r.layout.code, r.structs, method)
            .ok()
            .flatten()
            .unwrap_or_default();
        let lines = walk::line_table(r.mem, r.layout, method).unwrap_or_default();
        let i = self.codes.len() as u32;
        self.codes.push(Code {
            name: format!("{}.{}", names.class, names.name),
            file,
            lines,
        });
        let m = (i, walk::bytecodes(r.mem, r.layout, method).ok());
        self.methods.insert((key, method), m);
        self.methods_read += 1;
        Some(m)
    }

    /// The frames of Java word `word` of the process keyed `key`,
    /// innermost first.
    pub fn frames(&mut self, r: &Reader<'_>, key: u64, word: u64) -> Vec<Frame> {
        let frames = match decode(word) {
            None => return Vec::new(),
            Some(Word::Cut) => return vec![Frame::CutShort],
            Some(Word::Interpreted { method, bcp_low }) => {
                self.method_read(r, key, method).map(|(code, bytecodes)| {
                    // The one index below the code's size whose pointer
                    // has these low bits.
                    let at = match bytecodes {
                        Some((first, size)) => {
                            let bci = bcp_low.wrapping_sub(first as u16);
                            if bci < size {
                                u32::from(bci)
                            } else {
                                NO_AT
                            }
                        }
                        None => NO_AT,
                    };
                    vec![Frame::Code { code, at }]
                })
            }
            Some(Word::Compiled { pc, check }) => self.compiled(r, key, pc, check),
        };
        frames.unwrap_or_else(|| {
            self.unreadable += 1;
            vec![Frame::Unreadable]
        })
    }

    fn compiled(&mut self, r: &Reader<'_>, key: u64, pc: u64, check: u32) -> Option<Vec<Frame>> {
        let Some(b) = code::blob_at(r.mem, &r.layout.code, r.heaps, pc).ok()? else {
            self.replaced += 1;
            return Some(vec![Frame::Code {
                code: self.plain(REPLACED.to_string()),
                at: NO_AT,
            }]);
        };
        let blob = code::blob(r.mem, &r.layout.code, b).ok()?;
        let (_, id) = code::nmethod(r.mem, &r.layout.code, b).ok()?;
        if id & ((1 << CHECK_BITS) - 1) != check {
            self.replaced += 1;
            return Some(vec![Frame::Code {
                code: self.plain(REPLACED.to_string()),
                at: NO_AT,
            }]);
        }
        if !blob.name.ends_with("nmethod") {
            return Some(vec![Frame::Code {
                code: self.plain(format!("[jvm: {}]", blob.name)),
                at: NO_AT,
            }]);
        }
        // Still the deoptimization handler (the BPF program did not find
        // the frame's own pc): no debug information describes the frame
        // there, said rather than named after whatever is at that pc.
        if let Some((handler, mh)) = walk::deopt_handlers(r.mem, r.layout, b).ok()? {
            if pc == handler || pc == mh {
                self.deoptimized += 1;
                return Some(vec![Frame::Unreadable]);
            }
        }
        let inlined = walk::compiled_frames(r.mem, r.layout, b, blob.code_begin, pc).ok()?;
        inlined
            .iter()
            .map(|f| {
                Some(Frame::Code {
                    code: self.method(r, key, f.method)?,
                    at: u32::try_from(f.bci).unwrap_or(NO_AT),
                })
            })
            .collect()
    }

    /// The name of code `code` at bytecode index `at`.
    pub fn name(&self, code: u32, at: u32) -> Option<FrameName<'_>> {
        let c = self.codes.get(code as usize)?;
        Some(FrameName {
            name: &c.name,
            file: &c.file,
            line: if at == NO_AT {
                None
            } else {
                walk::line_at(&c.lines, at as i32)
            },
            column: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::types::java_frame_special as S;

    /// The marks are the BPF program's, and never a user address, a
    /// Python word or the signal frame's mark.
    #[test]
    fn words_are_the_programs() {
        assert_eq!(INTERP_MARK, S::JAVA_INTERP_MARK.0 as u64);
        assert_eq!(CODE_MARK, S::JAVA_CODE_MARK.0 as u64);
        assert_eq!(CUT_MARK, S::JAVA_CUT_MARK.0 as u64);
        assert_eq!(CHECK_BITS, S::JAVA_CHECK_BITS.0);
        for w in [
            crate::unwind_table::SIGNAL_FRAME,
            0x7fff_ffff_f000,
            0x5059_0000_0000_1000,
            1 << 63,
            (1 << 63) | (0x1f << 56),
        ] {
            assert!(!is_java_word(w), "{w:#x}");
        }
        assert_eq!(
            decode(0xa << 60 | (0x7f12_3456_7898 >> 3) << 16 | 0x1234),
            Some(Word::Interpreted {
                method: 0x7f12_3456_7898,
                bcp_low: 0x1234
            })
        );
        assert_eq!(
            decode(0xb << 60 | 0x1abc << 47 | 0x7f00_0000_1234),
            Some(Word::Compiled {
                pc: 0x7f00_0000_1234,
                check: 0x1abc
            })
        );
    }
}
