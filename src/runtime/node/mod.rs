//! Node.js: which mapped objects are a node binary carrying V8's
//! post-mortem metadata (the `v8dbg_*` symbols, [`v8dbg`]), each Node.js
//! process's entry for the BPF program's walk (where the interpreter's
//! entry builtins are, the frame slots and the one field the walk reads),
//! and the names of the JavaScript frames the walk found ([`names`]).
//!
//! The BPF program's walk (`v8.h`) writes a JavaScript frame as the word
//! of its function's `SharedFunctionInfo` (with an interpreted frame's
//! bytecode offset): that object outlives the frame's function object
//! and is what V8 names a frame by. Userspace reads its name and script
//! from the process the first time a CPU meets the word (a notice), while
//! the process runs. A node binary without the metadata is said, its
//! processes' stacks native only.

pub mod names;
pub mod v8dbg;

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::sync::Arc;

use crate::bpf::types;
use crate::elf::{Elf, Segment};
use crate::raw::{LossCounters, Proc};
use crate::runtime::{
    open_process, CopyAt, CopyStep, Frame, FrameName, Kind, Memory, NativeAt, Opener, Placed,
    ProcEntry, Runtime,
};

/// Bits 63..60 of a JavaScript frame's word (`V8_FRAME_MARK`).
pub const FRAME_MARK: u64 = 0xd;
/// The word's bits 15..0: an interpreted frame's bytecode offset, flagged.
const AT_BYTECODE: u64 = 0x8000;
const AT_MAX: u64 = 0x7fff;
/// The `SharedFunctionInfo`'s bits (its address >> 3).
const SHARED_BITS: u32 = 44;

/// Whether stack word `word` is a JavaScript frame's.
pub fn is_js_word(word: u64) -> bool {
    word >> 60 == FRAME_MARK
}

/// The word of a JavaScript frame (as the BPF walk writes it): its
/// function's `SharedFunctionInfo` (a tagged pointer) and, for an
/// interpreted frame, its bytecode offset as the frame keeps it.
pub fn js_word(shared: u64, bytecode_offset: Option<u64>) -> u64 {
    FRAME_MARK << 60
        | ((shared >> 3) & ((1 << SHARED_BITS) - 1)) << 16
        | bytecode_offset.map_or(0, |o| AT_BYTECODE | o.min(AT_MAX))
}

/// The `SharedFunctionInfo` (tagged) of word `word`, and where in its
/// function the frame was: its bytecode offset (as the frame keeps it)
/// where the frame was interpreted and the offset fits.
pub fn split_word(word: u64) -> (u64, Option<u32>) {
    let shared = ((word >> 16) & ((1 << SHARED_BITS) - 1)) << 3 | 1;
    let at = word & 0xffff;
    let offset = (at & AT_BYTECODE != 0 && at & AT_MAX != AT_MAX).then_some((at & AT_MAX) as u32);
    (shared, offset)
}

/// A node binary with V8's metadata: what the BPF program's entry and the
/// names need.
pub struct Binary {
    layout: Arc<v8dbg::Layout>,
    segments: Vec<Segment>,
    /// The node release, as its binary says (`v20.20.2`), if found.
    release: String,
}

/// One Node.js process whose frames are walked.
struct NodeProcess {
    binary: Arc<Binary>,
    /// Where its binary is loaded: the file's addresses plus this.
    bias: u64,
    mem: Option<Box<dyn Memory>>,
}

/// A function named: its name as V8 prints it, its script.
struct Named {
    name: Box<str>,
    file: Box<str>,
}

/// What the profiler knows of Node.js processes.
pub struct Nodes {
    open: Opener,
    /// The objects asked about that are node binaries: with their
    /// metadata, or None for one without.
    objects: HashMap<u32, Option<Arc<Binary>>>,
    procs: HashMap<Proc, NodeProcess>,
    /// Every process seen running a node binary, walked or not.
    seen: BTreeSet<Proc>,
    /// The functions named, by index ([`Frame::Code`]'s code), and by
    /// process and `SharedFunctionInfo`.
    functions: Vec<Named>,
    by_shared: HashMap<(Proc, u64), Frame>,
    /// Node binaries without the metadata (their paths' names).
    no_metadata: BTreeSet<String>,
    /// Why a binary's metadata could not be used.
    unusable: BTreeSet<String>,
    /// Frames whose function could not be named.
    unreadable: u64,
    /// The releases walked (for -v).
    releases: BTreeSet<String>,
}

impl Default for Nodes {
    fn default() -> Nodes {
        Nodes::with_memory(open_process)
    }
}

impl Nodes {
    fn with_memory(open: Opener) -> Nodes {
        Nodes {
            open,
            objects: HashMap::new(),
            procs: HashMap::new(),
            seen: BTreeSet::new(),
            functions: Vec::new(),
            by_shared: HashMap::new(),
            no_metadata: BTreeSet::new(),
            unusable: BTreeSet::new(),
            unreadable: 0,
            releases: BTreeSet::new(),
        }
    }

    /// Whether `name` is what a node binary is called: `node`, `nodejs`,
    /// `libnode.so.N`.
    fn node_name(name: &str) -> bool {
        name == "node" || name == "nodejs" || name.starts_with("libnode.so")
    }

    fn read_object(&mut self, id: u32, name: &str, file: Option<&File>) -> bool {
        if let Some(o) = self.objects.get(&id) {
            return o.is_some() || Self::node_name(name);
        }
        if !Self::node_name(name) {
            return false;
        }
        let Some(file) = file else {
            return false;
        };
        // The layout reads the file by its path: the descriptor's own.
        let path = std::path::PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(file)
        ));
        let read = (|| -> anyhow::Result<Option<Binary>> {
            let layout = match v8dbg::Layout::read(&path) {
                Ok(l) => l,
                Err(why) if format!("{why:#}").contains(v8dbg::NO_METADATA) => return Ok(None),
                Err(why) => return Err(why),
            };
            let elf = Elf::read(file)?;
            Ok(Some(Binary {
                release: layout.version.map_or_else(
                    || "V8 of unknown version".to_string(),
                    |v| format!("V8 {v}"),
                ),
                layout: Arc::new(layout),
                segments: elf.load_segments(file)?,
            }))
        })();
        let binary = match read {
            Ok(Some(b)) => Some(Arc::new(b)),
            Ok(None) => {
                self.no_metadata.insert(name.to_string());
                None
            }
            Err(why) => {
                self.unusable.insert(format!("{name}: {why:#}"));
                None
            }
        };
        self.objects.insert(id, binary);
        true
    }

    /// The name of the function of `shared` in process `p`, read now.
    fn read_function(&self, p: Proc, shared: u64) -> Result<Named, String> {
        let np = self.procs.get(&p).ok_or("not walked")?;
        let mem = np.mem.as_deref().ok_or("memory not open")?;
        let f = names::Reader::new(&np.binary.layout, mem)
            .function(shared)
            .map_err(|e| format!("{e:?}"))?;
        Ok(Named {
            name: if f.name.is_empty() {
                "<anonymous>".into()
            } else {
                f.name.into()
            },
            file: f.script_name.unwrap_or_default().into(),
        })
    }
}

/// The BPF program's entry for a process of `binary` loaded with bias
/// `bias` (its address space left to the caller).
fn bpf_entry(binary: &Binary, bias: u64) -> Result<types::node_proc, String> {
    let l = &binary.layout;
    let low = i64::from(types::node_limits::NODE_FRAME_LOW.0 as i32);
    let slot = |off: i64, what: &str| -> Result<i16, String> {
        if off < low || off > 8 || off % 8 != 0 {
            return Err(format!("{what} at {off} from the frame pointer"));
        }
        Ok(off as i16)
    };
    let mut e = types::node_proc {
        fp_context: slot(l.off_fp_context, "the context's slot")?,
        fp_function: slot(l.off_fp_function, "the function's slot")?,
        fp_bytecode_offset: slot(l.off_fp_bytecode_offset, "the bytecode offset's slot")?,
        function_shared: u16::try_from(l.js_function_shared)
            .map_err(|_| format!("JSFunction's shared at {}", l.js_function_shared))?,
        smi_shift: l.smi_shift as u8,
        ..Default::default()
    };
    if e.interp_lo.len() < l.interpreter_builtins.len() {
        return Err(format!(
            "{} interpreter entries",
            l.interpreter_builtins.len()
        ));
    }
    for (i, (_, r)) in l.interpreter_builtins.iter().enumerate() {
        e.interp_lo[i] = r.start.wrapping_add(bias);
        e.interp_hi[i] = r.start.wrapping_add(r.size).wrapping_add(bias);
    }
    Ok(e)
}

impl Runtime for Nodes {
    fn kind(&self) -> Kind {
        Kind::Node
    }

    fn object(&mut self, id: u32, name: &str, file: Option<&File>) -> bool {
        self.read_object(id, name, file)
    }

    fn note_process(
        &mut self,
        p: Proc,
        object: u32,
        start: u64,
        file_offset: u64,
    ) -> Option<ProcEntry> {
        self.seen.insert(p);
        let binary = self.objects.get(&object)?.clone()?;
        let bias = crate::elf::load_bias(&binary.segments, start, file_offset)?;
        let entry = match bpf_entry(&binary, bias) {
            Ok(e) => e,
            Err(why) => {
                self.unusable
                    .insert(format!("node {}: {why}", binary.release));
                return None;
            }
        };
        let mem = (self.open)(p.tgid).ok();
        self.releases.insert(binary.release.clone());
        self.procs.insert(p, NodeProcess { binary, bias, mem });
        Some(ProcEntry {
            kind: Kind::Node,
            // SAFETY: a plain C struct of the BPF program's types.
            value: unsafe { plain::as_bytes(&entry) }.to_vec(),
        })
    }

    fn forked(&mut self, _parent: u32, _child: Proc) {}

    fn exited(&mut self, p: Proc) {
        self.procs.remove(&p);
    }

    fn has_process(&self, p: Proc) -> bool {
        self.procs.contains_key(&p)
    }

    fn seen(&self, p: Proc) -> bool {
        self.seen.contains(&p)
    }

    fn owns(&self, word: u64) -> bool {
        is_js_word(word)
    }

    fn note_code(&mut self, p: Proc, code: u64, _tag: u32) {
        self.resolve(p, &[code]);
    }

    fn resolve(&mut self, p: Proc, addrs: &[u64]) {
        for &word in addrs {
            if !is_js_word(word) {
                continue;
            }
            let (shared, _) = split_word(word);
            if self.by_shared.contains_key(&(p, shared)) || !self.procs.contains_key(&p) {
                continue;
            }
            let frame = match self.read_function(p, shared) {
                Ok(named) => {
                    self.functions.push(named);
                    Frame::Code {
                        code: (self.functions.len() - 1) as u32,
                        at: 0,
                    }
                }
                Err(_) => {
                    self.unreadable += 1;
                    Frame::Unreadable
                }
            };
            self.by_shared.insert((p, shared), frame);
        }
    }

    fn place(&self, p: Proc, addrs: &[u64], native: &[NativeAt]) -> Vec<Placed> {
        addrs
            .iter()
            .enumerate()
            .take(native.len())
            .map(|(i, &word)| {
                if !is_js_word(word) {
                    return Placed::Native(i);
                }
                let (shared, at) = split_word(word);
                match self.by_shared.get(&(p, shared)) {
                    Some(&Frame::Code { code, .. }) => Placed::Runtime(Frame::Code {
                        code,
                        at: at.unwrap_or(u32::MAX),
                    }),
                    Some(&f) => Placed::Runtime(f),
                    None => Placed::Runtime(Frame::Unreadable),
                }
            })
            .collect()
    }

    fn name(&self, code: u32, _at: u32) -> Option<FrameName<'_>> {
        let f = self.functions.get(code as usize)?;
        Some(FrameName {
            name: &f.name,
            file: &f.file,
            line: None,
        })
    }

    fn step_copy(
        &self,
        p: Proc,
        _mark: Option<u64>,
        at: CopyAt,
        read: &dyn Fn(u64) -> Option<u64>,
    ) -> CopyStep {
        match self.procs.get(&p) {
            Some(np) => step_copy(np, at, read),
            None => CopyStep::NotMine,
        }
    }

    fn report(&self, c: &LossCounters, verbose: bool) -> Vec<String> {
        let spec = Kind::Node.spec();
        let mut lines = Vec::new();
        for name in &self.no_metadata {
            lines.push(format!(
                "{name} has no V8 post-mortem metadata (v8dbg_* symbols): its processes' stacks \
                 show V8's native frames, and the addresses of its code in place of JavaScript \
                 functions"
            ));
        }
        for why in &self.unusable {
            lines.push(format!(
                "a node binary's JavaScript frames cannot be read: {why}"
            ));
        }
        if c.v8_unreadable > 0 {
            lines.push(format!(
                "{} frames of V8's code could not be read as JavaScript frames (their function \
                 object made no sense): shown as the native walk has them",
                c.v8_unreadable
            ));
        }
        if self.unreadable > 0 {
            lines.push(format!(
                "{} JavaScript functions could not be named (gone, or not a function's by the \
                 time they were read): shown as {}",
                self.unreadable, spec.unreadable
            ));
        }
        if verbose && !self.releases.is_empty() {
            lines.push(format!(
                "node: {} processes walked ({}); {} user stacks with JavaScript frames, {} \
                 frames; {} functions named ({} notices of new frames lost)",
                self.seen.len(),
                self.releases.iter().cloned().collect::<Vec<_>>().join(", "),
                c.v8_stacks,
                c.v8_frames,
                self.functions.len(),
                c.v8_events_lost
            ));
        }
        lines
    }
}

/// The BPF walk's `v8_step()` over a stack copied before its process's
/// tables were written (a process's first blocks), walked in userspace a
/// while later: the frame at `at` of process `np`, whose slots come from
/// the copy (`read`). A JavaScript frame's function object is read from
/// the process now, and taken only where it still holds the frame's
/// context; otherwise the frame keeps its native word, as the BPF walk
/// leaves a frame it cannot read.
fn step_copy(np: &NodeProcess, at: CopyAt, read: &dyn Fn(u64) -> Option<u64>) -> CopyStep {
    // Where the thread stopped, the frame may not be set up.
    if at.exact || at.bp == 0 {
        return CopyStep::NotMine;
    }
    let l = &np.binary.layout;
    let slot = |off: i64| read(at.bp.wrapping_add_signed(off));
    let (Some(context), Some(function), Some(saved), Some(ra)) = (
        slot(l.off_fp_context),
        slot(l.off_fp_function),
        slot(0),
        slot(8),
    ) else {
        return CopyStep::NotMine;
    };
    let mut word = at.pc;
    if context & 1 == 0 {
        // V8's own frame: its type's marker.
        if context > 255 {
            return CopyStep::NotMine;
        }
    } else {
        if function & 3 != 1 || function >= 1 << 47 || context >= 1 << 47 {
            return CopyStep::NotMine;
        }
        let shared = np.mem.as_deref().and_then(|mem| {
            names::Reader::new(l, mem)
                .frame_shared(function, context)
                .ok()
        });
        if let Some(shared) = shared {
            let interpreted = l.interpreter_builtins.iter().any(|(_, r)| {
                let lo = r.start.wrapping_add(np.bias);
                at.pc >= lo && at.pc < lo.wrapping_add(r.size)
            });
            let offset = if interpreted {
                slot(l.off_fp_bytecode_offset).map(|v| v >> l.smi_shift)
            } else {
                None
            };
            word = js_word(
                shared,
                if interpreted {
                    Some(offset.unwrap_or(AT_MAX))
                } else {
                    None
                },
            );
        }
    }
    CopyStep::Next {
        word,
        pc: ra,
        sp: at.bp.wrapping_add(16),
        bp: saved,
    }
}
