//! CPython processes: which mapped objects are interpreters, where each
//! process's interpreter is, the code objects its Python frames name, and
//! how those frames take the place of the interpreter's evaluation calls
//! in its native stack.
//!
//! The BPF program appends a thread's Python frames, innermost first, to
//! its native frames, two words each (see `PY_FRAME_MARK` in
//! `offcputime.h`): the code object's address, then its tag, the
//! instruction and flags, among them the one that ends an evaluation
//! call's run of frames. Each run takes the place of the native frame of
//! its call of `_PyEval_EvalFrameDefault`, the innermost run that of the
//! innermost call, as py-spy's `--native` shows them.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use super::{Code, FrameKind, Interpreter, Layout, ProcMem};
use crate::bpf::types;
use crate::elf::Segment;
use crate::raw::{LossCounters, Proc};
use crate::runtime::{Frame, FrameName, Kind, NativeAt, Placed, ProcEntry, Runtime};
use crate::text::{count, noun};

/// Bits 63..48 of a Python frame's first word (`PY_FRAME_MARK`).
const FRAME_MARK: u64 = 0x5059;
const WORD_MARK: u64 = 1 << 63;
const FLAG_ENTRY: u8 = 1;
const FLAG_EMPTY: u8 = 2;
const FLAG_UNREADABLE: u8 = 4;
const FLAG_TRUNCATED: u8 = 8;
const FLAG_NO_TAG: u8 = 16;

/// Whether a stored stack's word is the first of a Python frame.
pub fn is_python_word(word: u64) -> bool {
    word >> 48 == FRAME_MARK
}

/// A Python frame as the walk wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PyWord {
    code: u64,
    tag: u32,
    instr: u32,
    flags: u8,
}

/// A stored stack's native frames, and its Python frames.
fn split(words: &[u64]) -> (&[u64], Vec<PyWord>) {
    let native = words
        .iter()
        .position(|&w| is_python_word(w))
        .unwrap_or(words.len());
    let py = words[native..]
        .chunks_exact(2)
        .take_while(|w| is_python_word(w[0]) && w[1] & WORD_MARK != 0)
        .map(|w| PyWord {
            code: w[0] & 0xffff_ffff_ffff,
            tag: (w[1] >> 24) as u32,
            instr: (w[1] & 0xff_ffff) as u32,
            flags: ((w[1] >> 56) & 0x7f) as u8,
        })
        .collect();
    (&words[..native], py)
}

/// One frame of a run, before it is numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunFrame {
    Code(PyWord),
    /// The frame could not be read.
    Unreadable,
    /// Frames beyond were not walked, for room.
    CutShort,
}

/// The walk's frames cut into evaluation calls' runs, innermost first
/// (an empty run: a call that runs no frame).
fn runs(words: &[PyWord]) -> Vec<Vec<RunFrame>> {
    let mut runs = Vec::new();
    let mut run = Vec::new();
    for w in words {
        if w.flags & FLAG_EMPTY != 0 {
            runs.push(std::mem::take(&mut run));
            continue;
        }
        if w.flags & FLAG_UNREADABLE != 0 {
            run.push(RunFrame::Unreadable);
            runs.push(std::mem::take(&mut run));
            break;
        }
        run.push(if w.flags & FLAG_NO_TAG != 0 {
            RunFrame::Unreadable
        } else {
            RunFrame::Code(*w)
        });
        if w.flags & FLAG_TRUNCATED != 0 {
            run.push(RunFrame::CutShort);
            runs.push(std::mem::take(&mut run));
            break;
        }
        if w.flags & FLAG_ENTRY != 0 {
            runs.push(std::mem::take(&mut run));
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// Puts each run in place of its evaluation call's native frame: the
/// innermost run in place of the innermost call, and so on out. A call
/// whose run is empty keeps its native frame. Runs left over (the native
/// walk was cut short) go outermost. Returns whether runs and calls
/// matched one for one.
fn merge<T>(native: Vec<T>, is_eval: impl Fn(&T) -> bool, runs: Vec<Vec<T>>) -> (Vec<T>, bool) {
    let mut runs = runs.into_iter();
    let mut out = Vec::with_capacity(native.len() + 8);
    let mut calls = 0;
    let mut placed = 0;
    for f in native {
        if !is_eval(&f) {
            out.push(f);
            continue;
        }
        calls += 1;
        match runs.next() {
            Some(run) if !run.is_empty() => {
                placed += 1;
                out.extend(run);
            }
            Some(_) => {
                placed += 1;
                out.push(f);
            }
            None => out.push(f),
        }
    }
    let mut left = 0;
    for run in runs {
        left += 1;
        out.extend(run);
    }
    (out, left == 0 && placed == calls)
}

/// Drops the frames between two runtime frames that are all glue
/// (`is_glue`: the interpreter's call machinery, see
/// [`super::GLUE`]); where any of them is not (a builtin that called back
/// into Python, `sorted` calling its key function) all are kept.
fn hide_glue<T>(
    frames: Vec<T>,
    is_runtime: impl Fn(&T) -> bool,
    is_glue: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(frames.len());
    // Where the native frames since the last runtime frame begin in
    // `out`, and whether all are glue so far.
    let mut since: Option<(usize, bool)> = None;
    for f in frames {
        if is_runtime(&f) {
            if let Some((at, true)) = since {
                out.truncate(at);
            }
            out.push(f);
            since = Some((out.len(), true));
            continue;
        }
        if let Some((_, all)) = since.as_mut() {
            *all &= is_glue(&f);
        }
        out.push(f);
    }
    out
}

/// An object that is a CPython interpreter (the executable, or
/// `libpython3.X.so`).
struct PyObject {
    interp: Interpreter,
    segments: Vec<Segment>,
    /// `_PyEval_EvalFrameDefault` (and its cold part) as file offsets.
    eval: Vec<(u64, u64)>,
    /// The call machinery's functions ([`super::GLUE`]) as file offsets.
    glue: Vec<(u64, u64)>,
}

impl PyObject {
    /// Whether file offset `offset` (a return address or a pc) is in an
    /// evaluation call.
    fn is_eval(&self, offset: u64) -> bool {
        self.eval
            .iter()
            .any(|&(start, end)| offset >= start && offset <= end)
    }

    /// Whether file offset `offset`, a return address, is in the call
    /// machinery's code: past a function's first byte (a return address
    /// there is of a call that ended the function before), up to its end
    /// (a call that ends the function).
    fn is_glue(&self, offset: u64) -> bool {
        self.glue
            .iter()
            .any(|&(start, end)| offset > start && offset <= end)
    }
}

/// The interpreter of a CPython process, where its process has it.
struct PyProcess {
    version: (u8, u8, u8),
    layout: &'static Layout,
    /// Addresses in the process.
    runtime: u64,
    code_type: u64,
    mem: Option<ProcMem>,
}

/// The name of an object's file as a CPython interpreter's would be:
/// other objects are not read.
fn may_be_python(name: &str) -> bool {
    name.starts_with("libpython") || name.starts_with("python")
}

/// What the profiler knows of CPython.
#[derive(Default)]
pub struct Pythons {
    /// Objects read, by the registry's object id: None for those that are
    /// not interpreters (or could not be read).
    objects: HashMap<u32, Option<Arc<PyObject>>>,
    procs: HashMap<Proc, PyProcess>,
    /// The code objects Python frames name, by [`Frame::Code`]'s index:
    /// None where the object could not be read (gone, or another in its
    /// place).
    codes: Vec<Option<Arc<Code>>>,
    code_ids: HashMap<(Proc, u64, u32), u32>,
    /// Interpreters whose frames are not read, once each: why.
    unsupported: Vec<String>,
    stats: PyStats,
    /// Stacks whose runs and evaluation calls did not match one for one.
    unmatched: std::cell::Cell<usize>,
    /// The processes of `procs` that exited: their stacks are placed at
    /// the report too.
    exited: std::collections::HashSet<Proc>,
    /// `--python-glue`: the call machinery between two Python frames kept.
    keep_glue: bool,
    /// Processes of `procs` whose interpreter has not started (a program
    /// that links libpython and starts it late, or never: perf, gdb): no
    /// entry for the BPF program yet, which would look for their threads'
    /// states at every switch, nor a reason to load the runtimes' walkers.
    /// Asked for again a while later ([`Runtime::pending`]).
    not_started: std::collections::HashSet<Proc>,
    /// The processes found without an interpreter at their last look,
    /// those gone too (for `-v`).
    without_interpreter: std::collections::HashSet<Proc>,
    /// Processes alive whose interpreter could not be read at their last
    /// look (not for want of permission), with why: taken as not started,
    /// their stacks show the interpreter's frames only (said).
    unreadable: HashMap<Proc, String>,
}

/// What a look at a CPython process's interpreter found (see
/// [`Pythons::interpreter_started`]).
#[derive(Debug, PartialEq, Eq)]
enum Started {
    Yes,
    No,
    /// Its memory could not be read (why), the process alive.
    Unreadable(String),
}

/// Whether a process of pid `tgid` is there and has not exited (a look
/// at its state in `/proc`: an exiting process, a zombie, whose memory is
/// gone, is not; one that took the pid since is taken for it).
fn tgid_alive(tgid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{tgid}/stat"))
        .ok()
        .is_some_and(|stat| alive_in_stat(&stat))
}

/// Whether the state in a `/proc/PID/stat` line (after the name, which
/// may hold anything, parentheses too) is that of a process not exited:
/// not a zombie (`Z`) or dead (`X`, `x`).
fn alive_in_stat(stat: &str) -> bool {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
}

impl Started {
    /// From the read of `interpreters.head` (or the opening of the
    /// process's memory before it): where it may not be read (another
    /// user's, without CAP_SYS_PTRACE) the BPF program reads it all the
    /// same, and its frames are looked for; where it failed otherwise,
    /// `alive` tells a process gone (which reads nothing) from one whose
    /// interpreter cannot be read.
    fn of_read(read: std::io::Result<u64>, alive: impl FnOnce() -> bool) -> Started {
        match read {
            Ok(head) if head != 0 => Started::Yes,
            Ok(_) => Started::No,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Started::Yes,
            Err(e) if alive() => Started::Unreadable(e.to_string()),
            Err(_) => Started::No,
        }
    }
}

/// What naming Python frames came to, for `-v`.
#[derive(Clone, Copy, Debug, Default)]
struct PyStats {
    pub processes: usize,
    pub codes_read: usize,
    pub codes_unreadable: usize,
}

impl Pythons {
    /// Object `id` (its file `file`, named `name`): an interpreter?
    fn read_object(&mut self, id: u32, name: &str, file: Option<&File>) -> Option<Arc<PyObject>> {
        if let Some(o) = self.objects.get(&id) {
            return o.clone();
        }
        let found = file
            .filter(|_| may_be_python(name))
            .and_then(|f| Some((f, super::inspect(f, name).ok()??)))
            .and_then(|(f, interp)| {
                if let Some(why) = interp.unsupported.clone() {
                    let note = format!(
                        "{name} (CPython {}.{}): {why}",
                        interp.version.0, interp.version.1
                    );
                    if !self.unsupported.contains(&note) {
                        self.unsupported.push(note);
                    }
                    return None;
                }
                interp.layout?;
                let segments = crate::elf::load_segments(f)?;
                let to_offset = |v: u64| {
                    segments
                        .iter()
                        .find(|s| v >= s.vaddr && v - s.vaddr < s.filesz)
                        .map(|s| v - s.vaddr + s.offset)
                };
                let offsets = |ranges: &mut dyn Iterator<Item = (u64, u64)>| {
                    ranges
                        .filter_map(|(start, end)| {
                            Some((to_offset(start)?, to_offset(end - 1)? + 1))
                        })
                        .collect::<Vec<_>>()
                };
                let eval = offsets(
                    &mut std::iter::once(Some(interp.eval))
                        .chain(std::iter::once(interp.eval_cold))
                        .flatten(),
                );
                let glue = offsets(&mut interp.glue.iter().copied());
                Some(Arc::new(PyObject {
                    interp,
                    segments,
                    eval,
                    glue,
                }))
            });
        self.objects.insert(id, found.clone());
        found
    }

    /// Notes the interpreter of process `p`, mapped by object `obj` at
    /// `start` from file offset `file_offset`: the entry for the BPF
    /// program's `py_procs` (its address space left to the caller).
    fn note_interpreter(
        &mut self,
        p: Proc,
        obj: &PyObject,
        start: u64,
        file_offset: u64,
    ) -> Option<types::py_proc> {
        let layout = obj.interp.layout?;
        let bias = crate::elf::load_bias(&obj.segments, start, file_offset)?;
        let runtime = obj.interp.runtime.wrapping_add(bias);
        let code_type = obj.interp.code_type.wrapping_add(bias);
        let entry = bpf_entry(layout, runtime)?;
        if self
            .procs
            .insert(
                p,
                PyProcess {
                    version: obj.interp.version,
                    layout,
                    runtime,
                    code_type,
                    mem: None,
                },
            )
            .is_none()
        {
            self.stats.processes += 1;
        }
        Some(entry)
    }

    fn copy_to_child(&mut self, parent: u32, child: Proc) {
        let Some((&pp_proc, pp)) = self.procs.iter().find(|(p, _)| p.tgid == parent) else {
            return;
        };
        if self.not_started.contains(&pp_proc) {
            self.not_started.insert(child);
        }
        let copy = PyProcess {
            version: pp.version,
            layout: pp.layout,
            runtime: pp.runtime,
            code_type: pp.code_type,
            mem: None,
        };
        self.procs.insert(child, copy);
    }

    /// Whether process `p` (in `procs`) has started its interpreter: its
    /// runtime lists one (`interpreters.head`, made as the interpreter
    /// starts). Not where its memory is gone (an exited process reads
    /// nothing); but where it may not be read (another user's, without
    /// CAP_SYS_PTRACE: the BPF program reads it all the same), its frames
    /// are looked for as before.
    fn interpreter_started(&mut self, p: Proc) -> Started {
        use crate::runtime::Memory;
        let Some(proc) = self.procs.get_mut(&p) else {
            return Started::No;
        };
        if proc.mem.is_none() {
            match ProcMem::open(p.tgid) {
                Ok(mem) => proc.mem = Some(mem),
                Err(e) => return Started::of_read(Err(e), || tgid_alive(p.tgid)),
            }
        }
        let Some(mem) = proc.mem.as_ref() else {
            return Started::No;
        };
        let mut head = [0u8; 8];
        let read = mem
            .read(
                proc.runtime + u64::from(proc.layout.interpreters_head),
                &mut head,
            )
            .map(|()| u64::from_ne_bytes(head));
        Started::of_read(read, || tgid_alive(p.tgid))
    }

    /// The index of code object `code` (with `tag`) of process `p`, read
    /// from the process the first time (None: never met, and the process
    /// is gone).
    fn code(&mut self, p: Proc, code: u64, tag: u32) -> Option<u32> {
        if let Some(&i) = self.code_ids.get(&(p, code, tag)) {
            return Some(i);
        }
        let proc = self.procs.get_mut(&p)?;
        if proc.mem.is_none() {
            proc.mem = ProcMem::open(p.tgid).ok();
        }
        let read = proc.mem.as_ref().and_then(|mem| {
            super::read_code(mem, code, proc.code_type, proc.layout)
                .ok()
                .filter(|c| c.tag == tag)
        });
        match read {
            Some(_) => self.stats.codes_read += 1,
            None => self.stats.codes_unreadable += 1,
        }
        let i = self.codes.len() as u32;
        self.codes.push(read.map(Arc::new));
        self.code_ids.insert((p, code, tag), i);
        Some(i)
    }

    /// The code object of index `i` (see [`Pythons::code`]).
    fn code_at(&self, i: u32) -> Option<&Code> {
        self.codes.get(i as usize)?.as_deref()
    }

    /// The index of a code object met before (see [`Pythons::code`]).
    fn known_code(&self, p: Proc, code: u64, tag: u32) -> Option<u32> {
        self.code_ids.get(&(p, code, tag)).copied()
    }

    /// The object of id `id`, if it is an interpreter read before.
    fn object_read(&self, id: u32) -> Option<&PyObject> {
        self.objects.get(&id)?.as_deref()
    }
}

impl Runtime for Pythons {
    fn kind(&self) -> Kind {
        Kind::Python
    }

    fn object(&mut self, id: u32, name: &str, file: Option<&File>) -> bool {
        self.read_object(id, name, file).is_some()
    }

    fn note_process(
        &mut self,
        p: Proc,
        object: u32,
        start: u64,
        file_offset: u64,
    ) -> Option<ProcEntry> {
        let obj = self.objects.get(&object)?.clone()?;
        let entry = self.note_interpreter(p, &obj, start, file_offset)?;
        match self.interpreter_started(p) {
            Started::Yes => {}
            started => {
                if let Started::Unreadable(why) = started {
                    self.unreadable.insert(p, why);
                }
                self.not_started.insert(p);
                self.without_interpreter.insert(p);
                return None;
            }
        }
        self.not_started.remove(&p);
        self.without_interpreter.remove(&p);
        self.unreadable.remove(&p);
        Some(ProcEntry {
            kind: Kind::Python,
            // SAFETY: py_proc is plain old data.
            value: unsafe { plain::as_bytes(&entry) }.to_vec(),
        })
    }

    fn forked(&mut self, parent: u32, child: Proc) {
        self.copy_to_child(parent, child);
    }

    fn exited(&mut self, p: Proc) {
        self.not_started.remove(&p);
        if self.procs.remove(&p).is_some() {
            self.exited.insert(p);
        }
    }

    fn has_process(&self, p: Proc) -> bool {
        self.procs.contains_key(&p) && !self.not_started.contains(&p)
    }

    fn pending(&self) -> Vec<Proc> {
        self.not_started.iter().copied().collect()
    }

    fn seen(&self, p: Proc) -> bool {
        self.has_process(p) || self.exited.contains(&p)
    }

    fn owns(&self, word: u64) -> bool {
        is_python_word(word)
    }

    fn note_code(&mut self, p: Proc, code: u64, tag: u32, _at: u64) {
        self.code(p, code, tag);
    }

    fn resolve(&mut self, p: Proc, addrs: &[u64]) {
        let (_, words) = split(addrs);
        for w in words {
            if w.code != 0 {
                self.code(p, w.code, w.tag);
            }
        }
    }

    /// The stack's native frames, with the runs of its Python frames in
    /// place of their evaluation calls (the code objects they name read
    /// before, see [`Runtime::resolve`]).
    fn place(&self, p: Proc, addrs: &[u64], native: &[NativeAt]) -> Vec<Placed> {
        let (native_words, words) = split(addrs);
        let frames: Vec<Placed> = (0..native_words.len().min(native.len()))
            .map(Placed::Native)
            .collect();
        let is_eval = |f: &Placed| match *f {
            Placed::Native(i) => native[i].is_some_and(|(object, offset)| {
                self.object_read(object).is_some_and(|o| o.is_eval(offset))
            }),
            Placed::Runtime(_) => false,
        };
        if words.is_empty() {
            // A CPython process's stack with the interpreter's frames and
            // none of its Python frames (walked before the interpreter was
            // known, or a thread whose own state was not found).
            if self.seen(p) && frames.iter().any(is_eval) {
                self.unmatched.set(self.unmatched.get() + 1);
            }
            return frames;
        }
        let runs: Vec<Vec<Placed>> = runs(&words)
            .into_iter()
            .map(|run| {
                run.into_iter()
                    .map(|f| {
                        Placed::Runtime(match f {
                            RunFrame::Code(w) => match self.known_code(p, w.code, w.tag) {
                                Some(code) if self.code_at(code).is_some() => {
                                    Frame::Code { code, at: w.instr }
                                }
                                _ => Frame::Unreadable,
                            },
                            RunFrame::Unreadable => Frame::Unreadable,
                            RunFrame::CutShort => Frame::CutShort,
                        })
                    })
                    .collect()
            })
            .collect();
        let (frames, matched) = merge(frames, is_eval, runs);
        if !matched {
            self.unmatched.set(self.unmatched.get() + 1);
        }
        // (Where runs were left over, the native walk was cut short: the
        // frames between them and the last placed run were never walked,
        // and hiding the glue there would show them as caller and callee.)
        if self.keep_glue || !matched {
            return frames;
        }
        let is_glue = |f: &Placed| match *f {
            Placed::Native(i) => native[i].is_some_and(|(object, offset)| {
                self.object_read(object).is_some_and(|o| o.is_glue(offset))
            }),
            Placed::Runtime(_) => false,
        };
        hide_glue(frames, |f| matches!(f, Placed::Runtime(_)), is_glue)
    }

    fn keep_call_glue(&mut self, keep: bool) {
        self.keep_glue = keep;
    }

    fn name(&self, code: u32, at: u32) -> Option<FrameName<'_>> {
        let c = self.code_at(code)?;
        Some(FrameName {
            name: &c.qualname,
            file: &c.filename,
            line: c.line(at),
            column: None,
        })
    }

    fn report(&self, c: &LossCounters, verbose: bool) -> Vec<String> {
        let spec = Kind::Python.spec();
        let s = &self.stats;
        let mut lines: Vec<String> = self
            .unsupported
            .iter()
            .map(|note| {
                format!(
                    "the Python frames of {note}: its processes' stacks show the \
                     interpreter's frames only"
                )
            })
            .collect();
        if let Some(why) = self.unreadable.values().next() {
            let n = self.unreadable.len() as u64;
            lines.push(format!(
                // wording: not a count
                "the interpreter of {} could not be read ({why}): {} stacks show the \
                 interpreter's frames only",
                count(n, "CPython process", "CPython processes"),
                noun(n, "its", "their"),
            ));
        }
        let unmatched = self.unmatched.get();
        if unmatched > 0 {
            let n = unmatched as u64;
            lines.push(format!(
                // wording: not a count
                "{} of CPython processes {} the interpreter's _PyEval_EvalFrameDefault frames in \
                 place of some or all of {} Python frames (blocks that ended before the \
                 interpreter was known, threads whose own state was not found, or walks cut \
                 short)",
                count(n, "user stack", "user stacks"),
                noun(n, "shows", "show"),
                noun(n, "its", "their"),
            ));
        }
        if c.py_unreadable + c.py_truncated > 0 {
            lines.push(format!(
                "{} could not be read, and {} of Python frames {} cut short for room \
                 (--perf-max-stack-depth): shown as {} and {}",
                count(c.py_unreadable, "Python frame", "Python frames"),
                count(c.py_truncated, "walk", "walks"),
                noun(c.py_truncated, "was", "were"),
                spec.unreadable,
                spec.cut_short
            ));
        }
        if verbose && (s.processes > 0 || c.py_stacks > 0) {
            lines.push(format!(
                // wording: not a count
                "python: {}{}; {} walked with {} Python frames ({}; {} proved the same as the \
                 thread's last walk, {} walked again once {} interpreter was known), {} of \
                 threads without a state of their own; {} named ({} could not be read, {} lost)",
                count(s.processes as u64, "CPython process", "CPython processes"),
                match self.without_interpreter.len() {
                    0 => String::new(),
                    n => format!(" ({n} with no interpreter started, not walked)"),
                },
                count(c.py_stacks, "user stack", "user stacks"),
                noun(c.py_stacks, "its", "their"),
                count(c.py_frames, "frame", "frames"),
                c.py_proved,
                c.py_refreshed,
                noun(c.py_refreshed, "its", "their"),
                c.py_no_thread_state,
                count(s.codes_read as u64, "code object", "code objects"),
                s.codes_unreadable,
                count(c.py_events_lost, "notice", "notices"),
            ));
        }
        lines
    }
}

/// The BPF program's entry for an interpreter of `layout` whose
/// `_PyRuntime` is at `runtime`.
fn bpf_entry(l: &Layout, runtime: u64) -> Option<types::py_proc> {
    let (kind, cframe) = match l.frame_kind {
        FrameKind::Object310 => (types::py_frames_kind::PY_FRAMES_OBJECT, 0xffff),
        FrameKind::Interp311 => (
            types::py_frames_kind::PY_FRAMES_ENTRY_FLAG,
            l.cframe_current_frame?,
        ),
        FrameKind::Interp312 => (
            types::py_frames_kind::PY_FRAMES_SHIM,
            l.cframe_current_frame.unwrap_or(0xffff),
        ),
    };
    let fields = [l.f_code, l.f_previous, l.f_instr, l.f_entry];
    let frame_read = fields.iter().max().copied()? + 8;
    // The walk reads fields within its buffer's first 128 bytes.
    if frame_read > 128 {
        return None;
    }
    Some(types::py_proc {
        mm: 0,
        tss: runtime + l.tss_key as u64,
        kind: kind.0,
        tls_specific: GLIBC_SPECIFIC,
        ts_thread_id: l.ts_thread_id,
        ts_frame: l.ts_frame,
        cframe_frame: cframe,
        f_code: l.f_code,
        f_previous: l.f_previous,
        f_instr: l.f_instr,
        f_entry: l.f_entry,
        frame_read,
        co_tag: l.tag_at,
        owner_cstack: l.owner_cstack,
        instr_is_index: matches!(l.frame_kind, FrameKind::Object310) as u8,
        resting_until: 0,
    })
}

/// glibc (x86-64): where `struct pthread` keeps the first block of
/// thread-specific values (`specific_1stblock`), from the thread pointer.
/// The same from 2.26 to 2.40; a thread state found through another
/// layout would not name its thread, and is not used.
const GLIBC_SPECIFIC: u16 = 0x310;

#[cfg(test)]
mod tests {
    use super::*;

    /// A look at an interpreter: its head read (started or not), its
    /// memory not to be read for want of permission (looked for all the
    /// same), gone, or not to be read otherwise while the process is
    /// there, which the report says without -v.
    #[test]
    fn an_interpreter_that_cannot_be_read_is_said() {
        use std::io::{Error, ErrorKind};
        let alive = || true;
        assert_eq!(Started::of_read(Ok(0x1000), alive), Started::Yes);
        assert_eq!(Started::of_read(Ok(0), alive), Started::No);
        let denied = Error::from(ErrorKind::PermissionDenied);
        assert_eq!(Started::of_read(Err(denied), alive), Started::Yes);
        let fault = || Error::from_raw_os_error(libc::EIO);
        assert_eq!(Started::of_read(Err(fault()), || false), Started::No);
        let Started::Unreadable(why) = Started::of_read(Err(fault()), alive) else {
            panic!("an alive process's failed read is unreadable");
        };

        let mut py = Pythons::default();
        let none = LossCounters::default();
        assert!(py.report(&none, false).is_empty());
        py.unreadable
            .insert(Proc { tgid: 7, start: 1 }, why.clone());
        let lines = py.report(&none, false);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "the interpreter of 1 CPython process could not be read ({why}): its stacks"
            )),
            "{}",
            lines[0]
        );
    }

    /// An exited process whose parent has not reaped it (a zombie: its
    /// `/proc` entry there, its memory gone) is not taken for one alive,
    /// whatever its name holds.
    #[test]
    fn an_exited_process_is_not_alive() {
        assert!(alive_in_stat("12 (python3) S 1 12 12 0"));
        assert!(alive_in_stat("12 (a) Z (b) R 1 12"));
        assert!(!alive_in_stat("12 (a) R (b) Z 1 12"));
        assert!(!alive_in_stat("12 (x) X 1"));
        assert!(!alive_in_stat("garbage"));
        assert!(tgid_alive(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("true starts");
        let pid = child.id();
        // Not reaped: a zombie once it has exited.
        let zombie = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            !tgid_alive(pid)
        });
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "a child not reaped keeps its /proc entry"
        );
        child.wait().expect("the child reaped");
        assert!(zombie, "an exited child not reaped taken for one alive");
    }

    fn word(code: u64, tag: u32, instr: u32, flags: u8) -> [u64; 2] {
        [
            FRAME_MARK << 48 | code,
            WORD_MARK | (flags as u64) << 56 | (tag as u64) << 24 | instr as u64,
        ]
    }

    /// The words as the BPF program writes them (offcputime.h).
    #[test]
    fn marks_and_flags_are_the_bpf_programs() {
        use types::py_frame_special as S;
        assert_eq!(FRAME_MARK << 48, (S::PY_FRAME_MARK_HI.0 as u64) << 32);
        assert_eq!(FLAG_ENTRY as u32, S::PY_FLAG_ENTRY.0);
        assert_eq!(FLAG_EMPTY as u32, S::PY_FLAG_EMPTY.0);
        assert_eq!(FLAG_UNREADABLE as u32, S::PY_FLAG_UNREADABLE.0);
        assert_eq!(FLAG_TRUNCATED as u32, S::PY_FLAG_TRUNCATED.0);
        assert_eq!(FLAG_NO_TAG as u32, S::PY_FLAG_NO_TAG.0);
        // Never a user address, nor the signal frame's mark.
        assert!(!is_python_word(crate::unwind_table::SIGNAL_FRAME));
        assert!(!is_python_word(0x7fff_ffff_f000));
    }

    #[test]
    fn words_split_into_native_frames_and_runs() {
        let mut words = vec![0x1000, 0x2000, 0x3000];
        words.extend(word(0xa0, 1, 10, 0));
        words.extend(word(0xb0, 2, 20, FLAG_ENTRY));
        words.extend(word(0, 0, 0, FLAG_EMPTY | FLAG_ENTRY));
        words.extend(word(0xc0, 3, 30, FLAG_ENTRY));
        let (native, py) = split(&words);
        assert_eq!(native, &[0x1000, 0x2000, 0x3000]);
        assert_eq!(py.len(), 4);
        assert_eq!(
            py[1],
            PyWord {
                code: 0xb0,
                tag: 2,
                instr: 20,
                flags: FLAG_ENTRY
            }
        );
        let r = runs(&py);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].len(), 2);
        assert!(r[1].is_empty());
        assert_eq!(r[2], vec![RunFrame::Code(py[3])]);
    }

    /// Between two Python frames the call machinery goes, unless a frame
    /// of other code is among it; before the first and after the last it
    /// stays.
    #[test]
    fn glue_between_python_frames_is_hidden() {
        // 'P' a Python frame, 'g' glue, 'n' other native code.
        let hide = |s: &str| -> String {
            hide_glue(s.chars().collect(), |&c| c == 'P', |&c| c == 'g')
                .into_iter()
                .collect()
        };
        assert_eq!(hide("ngPggPgPn"), "ngPPPn");
        assert_eq!(hide("nPgngPg"), "nPgngPg");
        assert_eq!(hide("PP"), "PP");
        assert_eq!(hide("gg"), "gg");
        assert_eq!(hide("PgnPggP"), "PgnPP");
        assert_eq!(hide(""), "");
    }

    #[test]
    fn runs_take_the_place_of_their_evaluation_calls() {
        // Native, innermost first: E marks an evaluation call.
        let native = vec!["sleep", "time_sleep", "E", "call", "E", "main"];
        let runs = vec![vec!["inner", "middle"], vec!["outer"]];
        let (merged, matched) = merge(native.clone(), |f| *f == "E", runs);
        assert_eq!(
            merged,
            vec![
                "sleep",
                "time_sleep",
                "inner",
                "middle",
                "call",
                "outer",
                "main"
            ]
        );
        assert!(matched);
        // A call with an empty run keeps its frame; a call without a run
        // too, and the stack says it did not match.
        let (merged, matched) = merge(native.clone(), |f| *f == "E", vec![vec![], vec!["outer"]]);
        assert_eq!(
            merged,
            vec!["sleep", "time_sleep", "E", "call", "outer", "main"]
        );
        assert!(matched);
        let (merged, matched) = merge(native, |f| *f == "E", vec![vec!["inner"]]);
        assert_eq!(
            merged,
            vec!["sleep", "time_sleep", "inner", "call", "E", "main"]
        );
        assert!(!matched);
    }

    #[test]
    fn a_walk_cut_short_or_unreadable_ends_its_run() {
        let mut words = vec![];
        words.extend(word(0xa0, 1, 10, FLAG_TRUNCATED));
        let (_, py) = split(&words);
        assert_eq!(
            runs(&py),
            vec![vec![RunFrame::Code(py[0]), RunFrame::CutShort]]
        );
        let mut words = vec![];
        words.extend(word(0xa0, 1, 10, 0));
        words.extend(word(0, 0, 0, FLAG_UNREADABLE));
        let (_, py) = split(&words);
        assert_eq!(
            runs(&py),
            vec![vec![RunFrame::Code(py[0]), RunFrame::Unreadable]]
        );
    }
}
