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

pub mod code;
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
use crate::text::{count, noun};

/// Bits 63..60 of a JavaScript frame's word (`V8_FRAME_MARK`).
pub const FRAME_MARK: u64 = 0xd;
/// The word's bits 15..0: an interpreted frame's bytecode offset, flagged.
const AT_BYTECODE: u64 = 0x8000;
const AT_MAX: u64 = 0x7fff;
/// The `SharedFunctionInfo`'s bits (its address >> 3).
const SHARED_BITS: u32 = 44;
/// [`Frame::Code`]'s `at` of a frame whose place in its source is not
/// known.
const NO_POSITION: u32 = u32::MAX;

/// How the frames' places in their source, and the functions inlined in
/// optimized frames, were read (for the report).
#[derive(Default)]
struct Located {
    /// Frames of generated code whose code was read; functions shown
    /// inlined in them.
    code: u64,
    inlined: u64,
    /// Frames of generated code whose code could not be found or read
    /// (shown as their function alone).
    code_unread: u64,
    /// Of `code`, frames of baseline code.
    baseline: u64,
    /// Frames without a line: V8 had not recorded the function's
    /// positions, or a baseline frame's bytecode could not be found.
    unplaced: u64,
}

/// Whether stack word `word` is a JavaScript frame's.
pub fn is_js_word(word: u64) -> bool {
    word >> 60 == FRAME_MARK
}

/// The word of a JavaScript frame (as the BPF walk writes it): its
/// function's `SharedFunctionInfo` (a tagged pointer) and, for an
/// interpreted frame, its bytecode offset as the frame keeps it, else a
/// hash of its return address `pc`.
pub fn js_word(shared: u64, bytecode_offset: Option<u64>, pc: u64) -> u64 {
    FRAME_MARK << 60
        | ((shared >> 3) & ((1 << SHARED_BITS) - 1)) << 16
        | bytecode_offset.map_or((pc ^ pc >> 15 ^ pc >> 30 ^ pc >> 45) & AT_MAX, |o| {
            AT_BYTECODE | o.min(AT_MAX)
        })
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

/// A function named: its name as V8 prints it, its script (its name, and
/// the object, for the lines of the function's frames).
struct Named {
    name: Box<str>,
    file: Box<str>,
    script: Option<u64>,
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
    /// The frames of a word whose notice said where the frame was (its
    /// BytecodeArray, or its return address): the functions inlined
    /// there (innermost first) and the frame's own, each at its place in
    /// the source ([`Frame::Code`]'s `at`: an index in `positions`).
    words: HashMap<(Proc, u64), Vec<Frame>>,
    /// Lines and columns (1-based) of frames.
    positions: Vec<(u32, u32)>,
    position_index: HashMap<(u32, u32), u32>,
    /// Each script's lines, by process and script (None: unreadable).
    lines: HashMap<(Proc, u64), Option<Arc<names::LineTable>>>,
    /// The map of each process's instruction streams, once found.
    istream_maps: HashMap<Proc, u64>,
    /// Frames of generated code (and how many functions inlined in them
    /// were shown); frames whose code, or whose place in the source,
    /// could not be read; words met without their notice.
    located: Located,
    unnoticed: std::collections::HashSet<(Proc, u64)>,
    /// What the frames of copied stacks said besides their word (as a
    /// notice would: see [`Runtime::note_code`]'s `at`), for their
    /// resolution.
    copied: std::sync::Mutex<HashMap<(Proc, u64), u64>>,
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
            words: HashMap::new(),
            positions: Vec::new(),
            position_index: HashMap::new(),
            lines: HashMap::new(),
            istream_maps: HashMap::new(),
            located: Located::default(),
            unnoticed: std::collections::HashSet::new(),
            copied: std::sync::Mutex::new(HashMap::new()),
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
            script: f.script,
        })
    }

    /// The index of the function of `shared` in process `p` (read now if
    /// not yet).
    fn function_of(&mut self, p: Proc, shared: u64) -> Option<u32> {
        if !self.by_shared.contains_key(&(p, shared)) {
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
        match self.by_shared.get(&(p, shared)) {
            Some(&Frame::Code { code, .. }) => Some(code),
            _ => None,
        }
    }

    /// Where the frames of word `word` of process `p` are: its functions
    /// (the inlined ones first), each with its position in its script,
    /// from `at` (the frame's BytecodeArray, or its return address); and
    /// whether the frame is of baseline code.
    fn locate(
        &mut self,
        p: Proc,
        word: u64,
        at: u64,
    ) -> Result<(Vec<code::Located>, bool), String> {
        let np = self.procs.get(&p).ok_or("not walked")?;
        let mem = np.mem.as_deref().ok_or("memory not open")?;
        let r = names::Reader::new(&np.binary.layout, mem);
        let (shared, offset) = split_word(word);
        let err = |e: names::Error| e.to_string();
        if word & AT_BYTECODE != 0 {
            let position = match offset {
                Some(o) => r
                    .bytecode_position(at, np.binary.layout.bytecode_index(i64::from(o)))
                    .map_err(err)?,
                None => None,
            };
            return Ok((vec![code::Located { shared, position }], false));
        }
        let mut map = self.istream_maps.get(&p).copied();
        let found = r.code_at(at, &mut map);
        if let Some(m) = map {
            self.istream_maps.insert(p, m);
        }
        let c = found.map_err(err)?;
        if r.is_baseline(&c) {
            // Not found: the frame without a line (counted).
            let position = r.baseline_position(&c, at).unwrap_or_else(|e| {
                if std::env::var_os("OFFCPUTIME_DEBUG_V8").is_some() {
                    eprintln!("v8 baseline frame at {at:#x}: {e}");
                }
                None
            });
            // The code found is the frame's function's where the position
            // is in the function's source (where the function says where
            // that is): else it is not the frame's code.
            let f = r.function(shared).map_err(err)?;
            if let (Some(p), Some(start), Some(end)) = (position, f.start_position, f.end_position)
            {
                if p < start || p > end {
                    return Err("the code at the frame's address is another function's".into());
                }
            }
            return Ok((vec![code::Located { shared, position }], true));
        }
        if !r.is_optimized(&c) {
            return Ok((
                vec![code::Located {
                    shared,
                    position: None,
                }],
                false,
            ));
        }
        let frames = r.optimized_frames(&c, at).map_err(err)?;
        // The code found is the frame's function's (optimized, or
        // entered on a loop): else it is not the frame's code.
        if frames.last().map(|f| f.shared) != Some(shared) {
            return Err("the code at the frame's address is another function's".into());
        }
        Ok((frames, false))
    }

    /// The line and column of `position` in the script of function
    /// `function` of process `p`, as an index in `positions`.
    fn position_of(&mut self, p: Proc, function: u32, position: Option<u32>) -> Option<u32> {
        let position = position?;
        let script = self.functions.get(function as usize)?.script?;
        if !self.lines.contains_key(&(p, script)) {
            let table = self.procs.get(&p).and_then(|np| {
                let mem = np.mem.as_deref()?;
                let r = names::Reader::new(&np.binary.layout, mem);
                names::LineTable::read(&r, script).ok().map(Arc::new)
            });
            self.lines.insert((p, script), table);
        }
        let at = self
            .lines
            .get(&(p, script))?
            .as_ref()?
            .line_column(position)?;
        let next = self.positions.len() as u32;
        let i = *self.position_index.entry(at).or_insert(next);
        if i == next {
            self.positions.push(at);
        }
        Some(i)
    }

    /// Word `word` of process `p`, told with `at`: its frames, read now.
    fn note_word(&mut self, p: Proc, word: u64, at: u64) {
        if self.words.contains_key(&(p, word)) || !self.procs.contains_key(&p) {
            return;
        }
        let compiled = word & AT_BYTECODE == 0;
        let located = match self.locate(p, word, at) {
            Ok((l, baseline)) => {
                self.located.baseline += u64::from(baseline);
                l
            }
            Err(why) => {
                if std::env::var_os("OFFCPUTIME_DEBUG_V8").is_some() {
                    eprintln!("v8 word {word:#x} at {at:#x}: {why}");
                }
                if compiled {
                    self.located.code_unread += 1;
                } else {
                    self.located.unplaced += 1;
                }
                return;
            }
        };
        let mut frames = Vec::with_capacity(located.len());
        for (i, l) in located.iter().enumerate() {
            let Some(code) = self.function_of(p, l.shared) else {
                frames.push(Frame::Unreadable);
                continue;
            };
            let at = self.position_of(p, code, l.position);
            if at.is_none() {
                self.located.unplaced += 1;
            }
            if i + 1 < located.len() {
                self.located.inlined += 1;
            }
            frames.push(Frame::Code {
                code,
                at: at.unwrap_or(NO_POSITION),
            });
        }
        if compiled {
            self.located.code += 1;
        }
        self.words.insert((p, word), frames);
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
        fp_bytecode_array: slot(l.off_fp_bytecode_array, "the bytecode array's slot")?,
        function_shared: u16::try_from(l.js_function_shared)
            .map_err(|_| format!("JSFunction's shared at {}", l.js_function_shared))?,
        smi_shift: l.smi_shift as u8,
        map_instance_type: u16::try_from(l.map_instance_type)
            .map_err(|_| format!("a map's instance type at {}", l.map_instance_type))?,
        type_bytecode_array: l.type_bytecode_array,
        ..Default::default()
    };
    if l.heap_object_map != 0 {
        return Err(format!("a heap object's map at {}", l.heap_object_map));
    }
    if e.interp_lo.len() < l.interpreter_builtins.len() {
        return Err(format!(
            // wording: a count never 1
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

    fn note_code(&mut self, p: Proc, code: u64, _tag: u32, at: u64) {
        self.resolve(p, &[code]);
        if is_js_word(code) {
            self.note_word(p, code, at);
        }
    }

    fn resolve(&mut self, p: Proc, addrs: &[u64]) {
        for &word in addrs {
            if !is_js_word(word) {
                continue;
            }
            if !self.procs.contains_key(&p) {
                continue;
            }
            let (shared, _) = split_word(word);
            self.function_of(p, shared);
            let copied = self
                .copied
                .lock()
                .map_or(None, |mut c| c.remove(&(p, word)));
            if let Some(at) = copied {
                self.note_word(p, word, at);
            }
            if !self.words.contains_key(&(p, word)) {
                self.unnoticed.insert((p, word));
            }
        }
    }

    fn place(&self, p: Proc, addrs: &[u64], native: &[NativeAt]) -> Vec<Placed> {
        addrs
            .iter()
            .enumerate()
            .take(native.len())
            .flat_map(|(i, &word)| {
                if !is_js_word(word) {
                    return vec![Placed::Native(i)];
                }
                if let Some(frames) = self.words.get(&(p, word)) {
                    return frames.iter().map(|&f| Placed::Runtime(f)).collect();
                }
                let (shared, _) = split_word(word);
                vec![match self.by_shared.get(&(p, shared)) {
                    Some(&Frame::Code { code, .. }) => Placed::Runtime(Frame::Code {
                        code,
                        at: NO_POSITION,
                    }),
                    Some(&f) => Placed::Runtime(f),
                    None => Placed::Runtime(Frame::Unreadable),
                }]
            })
            .collect()
    }

    fn name(&self, code: u32, at: u32) -> Option<FrameName<'_>> {
        let f = self.functions.get(code as usize)?;
        let at = self.positions.get(at as usize);
        Some(FrameName {
            name: &f.name,
            file: &f.file,
            line: at.map(|a| a.0),
            column: at.map(|a| a.1),
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
            Some(np) => {
                let (step, said) = step_copy(np, at, read);
                if let (CopyStep::Next { word, .. }, Some(said)) = (step, said) {
                    if let Ok(mut c) = self.copied.lock() {
                        c.insert((p, word), said);
                    }
                }
                step
            }
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
            let n = c.v8_unreadable;
            lines.push(format!(
                "{} of V8's code could not be read as JavaScript frames ({} function object made \
                 no sense): shown as the native walk has {}",
                count(n, "frame", "frames"),
                noun(n, "its", "their"),
                noun(n, "it", "them"),
            ));
        }
        let l = &self.located;
        if l.code_unread > 0 {
            let n = l.code_unread;
            lines.push(format!(
                "{} of V8's generated code could not have {} code read (freed, or never found): \
                 shown as {} function alone, without the functions inlined in {} or {} line",
                count(n, "frame", "frames"),
                noun(n, "its", "their"),
                noun(n, "its", "their"),
                noun(n, "it", "them"),
                noun(n, "its", "their"),
            ));
        }
        let unnoticed = self
            .unnoticed
            .iter()
            .filter(|k| !self.words.contains_key(k))
            .count();
        if unnoticed > 0 {
            let n = unnoticed as u64;
            lines.push(format!(
                "{} {} met only in stacks ({} notice lost, or a stack copied before its process \
                 was known): shown as {} function alone, without the functions inlined in {} or \
                 {} line",
                count(n, "JavaScript frame", "JavaScript frames"),
                noun(n, "was", "were"),
                noun(n, "its", "their"),
                noun(n, "its", "their"),
                noun(n, "it", "them"),
                noun(n, "its", "their"),
            ));
        }
        if self.unreadable > 0 {
            let n = self.unreadable;
            lines.push(format!(
                "{} could not be named (gone, or not a function's by the time {} read): shown \
                 as {}",
                count(n, "JavaScript function", "JavaScript functions"),
                noun(n, "it was", "they were"),
                spec.unreadable
            ));
        }
        if verbose && !self.releases.is_empty() {
            lines.push(format!(
                "node: {} walked ({}); {} with JavaScript frames, {}; {} named ({} of new \
                 frames lost); {} of optimized or baseline code read ({} baseline), {} inlined \
                 in them shown; {} without a line (positions not recorded by V8, or a baseline \
                 frame's bytecode not found)",
                count(self.seen.len() as u64, "process", "processes"),
                self.releases.iter().cloned().collect::<Vec<_>>().join(", "),
                count(c.v8_stacks, "user stack", "user stacks"),
                count(c.v8_frames, "frame", "frames"),
                count(self.functions.len() as u64, "function", "functions"),
                count(c.v8_events_lost, "notice", "notices"),
                count(l.code, "frame", "frames"),
                l.baseline,
                count(l.inlined, "function", "functions"),
                count(l.unplaced, "frame", "frames")
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
fn step_copy(
    np: &NodeProcess,
    at: CopyAt,
    read: &dyn Fn(u64) -> Option<u64>,
) -> (CopyStep, Option<u64>) {
    // Where the thread stopped, the frame may not be set up.
    if at.exact || at.bp == 0 {
        return (CopyStep::NotMine, None);
    }
    let l = &np.binary.layout;
    let slot = |off: i64| read(at.bp.wrapping_add_signed(off));
    let (Some(context), Some(function), Some(saved), Some(ra)) = (
        slot(l.off_fp_context),
        slot(l.off_fp_function),
        slot(0),
        slot(8),
    ) else {
        return (CopyStep::NotMine, None);
    };
    let mut word = at.pc;
    let mut said = None;
    if context & 1 == 0 {
        // V8's own frame: its type's marker.
        if context > 255 {
            return (CopyStep::NotMine, None);
        }
    } else {
        if function & 3 != 1 || function >= 1 << 47 || context >= 1 << 47 {
            return (CopyStep::NotMine, None);
        }
        let shared = np.mem.as_deref().and_then(|mem| {
            names::Reader::new(l, mem)
                .frame_shared(function, context)
                .ok()
        });
        if let Some(shared) = shared {
            // Interpreted as the BPF walk tells (see v8.h).
            let in_builtin = l.interpreter_builtins.iter().any(|(_, r)| {
                let lo = r.start.wrapping_add(np.bias);
                at.pc >= lo && at.pc < lo.wrapping_add(r.size)
            });
            let offset = slot(l.off_fp_bytecode_offset);
            let bytecode = slot(l.off_fp_bytecode_array);
            let by_slots = matches!((offset, bytecode), (Some(o), Some(b))
            if o & ((1 << l.smi_shift) - 1) == 0 && (o >> l.smi_shift) < 0x10_0000
                && np.mem.as_deref().is_some_and(|mem| {
                    names::Reader::new(l, mem).is_bytecode_array(b)
                }));
            let interpreted = in_builtin || by_slots;
            word = if interpreted {
                said = bytecode;
                js_word(
                    shared,
                    Some(offset.and_then(|o| l.smi(o)).map_or(AT_MAX, |v| v as u64)),
                    at.pc,
                )
            } else {
                said = Some(at.pc);
                js_word(shared, None, at.pc)
            };
        }
    }
    (
        CopyStep::Next {
            word,
            pc: ra,
            sp: at.bp.wrapping_add(16),
            bp: saved,
        },
        said,
    )
}
