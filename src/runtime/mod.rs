//! Language runtimes whose frames take their place among a stack's native
//! frames: one interface ([`Runtime`]), one entry each in [`RUNTIMES`],
//! and each runtime a folder of its own ([`python`], [`java`], [`node`]).
//!
//! A runtime is told of every mapped object (is it one of its own?) and of
//! every process that maps one (the BPF program's entry for it, see
//! [`ProcEntry`]); it reads what its frames name from the process's
//! memory ([`Memory`]) while the process runs, puts its frames among the
//! native ones of each stack it finds them in ([`Runtime::place`]), names
//! them ([`Runtime::name`]) and says what it could not do
//! ([`Runtime::report`]). The rest of the profiler sees a runtime's frames
//! as [`Frame`]s tagged with their [`Kind`]: the profile, the merge and the
//! outputs treat every runtime alike, its name and colours from
//! [`Spec`].

pub mod java;
pub mod node;
pub mod python;

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::raw::{LossCounters, Proc};

/// Which runtime a frame is of: the tag the profile, the merge and the
/// outputs carry (an index into [`RUNTIMES`]).
pub use crate::raw::RuntimeKind as Kind;

/// What the rest of the profiler needs to know of a runtime: its names,
/// the words of its frames that could not be named, its flame-graph
/// colours, and how to make its state.
pub struct Spec {
    pub kind: Kind,
    /// Lower case, as in flags and file names: `python`.
    pub name: &'static str,
    /// As users know it: `Python`.
    pub label: &'static str,
    /// The BPF program's map of its processes' entries (see
    /// [`ProcEntry`]), by process; None for a runtime whose frames the
    /// BPF program does not walk.
    pub procs_map: Option<&'static str>,
    /// Its processes, as users know them: `CPython`.
    pub processes: &'static str,
    /// What runs its frames, as native frames show it: `interpreter`.
    pub native: &'static str,
    /// A frame that could not be read, or whose code was gone (or other
    /// code in its place) when it was to be named.
    pub unreadable: &'static str,
    /// Frames beyond the walk's room.
    pub cut_short: &'static str,
    /// The flame graph's colour family of its frames: red, green and blue
    /// each a base plus up to a range, by the name's shade (Python's
    /// violet, apart from the native frames' blue and orange).
    pub colour: [(u8, f32); 3],
    /// The runtime's state for one trace.
    pub new: fn() -> Box<dyn Runtime>,
    /// The names of the objects whose processes generate code that keeps
    /// no frame pointers (a JVM's compiled Java code uses rbp as it
    /// likes): a walk without the runtime's help stops at such code rather
    /// than guess through it.
    pub jit_without_frame_pointers: &'static [&'static str],
    /// Whether a copy of a stack of its processes is walked in userspace
    /// with its frames ([`Runtime::step_copy`]).
    pub copies_carry_frames: bool,
    /// What the name of a file its processes map holds, most likely (see
    /// [`maybe_running`]): `libpython3.12.so.1.0`, `python3.12`.
    pub mapped_name_hints: &'static [&'static str],
    /// Its frames' `profile.frame.type` in OpenTelemetry's semantic
    /// conventions (the OTLP output's location attribute).
    pub otel_frame_type: &'static str,
}

/// The runtimes, in [`Kind`]'s order.
pub const RUNTIMES: &[Spec] = &[
    Spec {
        kind: Kind::Python,
        name: "python",
        label: "Python",
        procs_map: Some("py_procs"),
        processes: "CPython",
        native: "interpreter",
        unreadable: "[python frame unreadable]",
        cut_short: "[python frames cut short]",
        colour: [(150, 50.0), (110, 45.0), (205, 45.0)],
        new: || Box::<python::Pythons>::default(),
        jit_without_frame_pointers: &[],
        copies_carry_frames: false,
        mapped_name_hints: &["python"],
        otel_frame_type: "cpython",
    },
    Spec {
        kind: Kind::Java,
        name: "java",
        label: "Java",
        unreadable: "[java frame unreadable]",
        cut_short: "[java frames cut short]",
        // Green, as flamegraph.pl's java palette has Java methods.
        colour: [(50, 60.0), (170, 60.0), (50, 60.0)],
        procs_map: Some("java_procs"),
        processes: "JVM",
        native: "JVM",
        new: || Box::<java::Jvms>::default(),
        jit_without_frame_pointers: &["libjvm.so"],
        copies_carry_frames: true,
        mapped_name_hints: &["libjvm.so"],
        otel_frame_type: "jvm",
    },
    Spec {
        kind: Kind::Node,
        name: "node",
        label: "JavaScript",
        unreadable: "[js frame unreadable]",
        cut_short: "[js frames cut short]",
        // Teal: apart from Java's green, Python's violet and the native
        // frames' blue and orange.
        colour: [(20, 40.0), (150, 50.0), (150, 50.0)],
        procs_map: Some("node_procs"),
        processes: "Node.js",
        native: "V8 engine",
        new: || Box::<node::Nodes>::default(),
        // V8's generated code keeps frame pointers.
        jit_without_frame_pointers: &[],
        copies_carry_frames: true,
        mapped_name_hints: &["node"],
        otel_frame_type: "v8js",
    },
];

/// The runtimes that `on` says are read whose processes may be running now
/// (of `tgids` only, if any): a file its name hints at
/// ([`Spec::mapped_name_hints`]) mapped by a process. A quick look, not the
/// registry's: it decides only which runtimes' walkers the hooks load with
/// at once, the others' loading when a runtime's process is noted while
/// tracing (a process missed here, or started between this look and the
/// window's start, has its runtime's frames from then on, its blocks under
/// way at the start without them unless it is a CPython process, which
/// the refresh walks again; a name that misleads costs the load of a
/// walker). Every file read belongs to another process, and may be gone:
/// what cannot be read is skipped.
pub fn maybe_running(tgids: &[u32], on: &dyn Fn(Kind) -> bool) -> Vec<Kind> {
    let mut left: Vec<&Spec> = RUNTIMES.iter().filter(|s| on(s.kind)).collect();
    let mut found = Vec::new();
    if left.is_empty() {
        return found;
    }
    let own = std::process::id();
    let pids: Vec<u32> = if tgids.is_empty() {
        match std::fs::read_dir("/proc") {
            Ok(dir) => dir
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&pid| pid != own)
                .collect(),
            // Not known: as if every one ran.
            Err(_) => return left.iter().map(|s| s.kind).collect(),
        }
    } else {
        tgids.to_vec()
    };
    for pid in pids {
        let Ok(maps) = File::open(format!("/proc/{pid}/maps")) else {
            continue;
        };
        hinted_kinds(std::io::BufReader::new(maps), &mut left, &mut found);
        if left.is_empty() {
            break;
        }
    }
    found
}

/// The runtimes of `left` that the files of `maps` (a process's
/// `/proc/PID/maps`) hint at, moved to `found`. Every line: maps are in
/// address order, and a library mapped early lies high, below thousands
/// of later mappings in a process that has run a while. A process runs
/// one runtime, but may map a library whose name hints at another (a
/// JVM's embedded node or Python): every hint is taken.
fn hinted_kinds(mut maps: impl std::io::BufRead, left: &mut Vec<&Spec>, found: &mut Vec<Kind>) {
    let mut line = String::new();
    while !left.is_empty() {
        line.clear();
        match maps.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // The path, after five fields; its last component.
        let path = line.splitn(6, ' ').nth(5).unwrap_or("").trim();
        let name = path.rsplit('/').next().unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        if let Some(i) = left
            .iter()
            .position(|s| s.mapped_name_hints.iter().any(|h| name.contains(h)))
        {
            found.push(left.remove(i).kind);
        }
    }
}

impl Kind {
    pub fn spec(self) -> &'static Spec {
        &RUNTIMES[self as usize]
    }
}

/// A runtime's frame in a stack, as the registry keeps it (independent of
/// where anything was mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A function: its code (by the index the runtime gave it, see
    /// [`Runtime::name`]) and where in it the frame was.
    Code { code: u32, at: u32 },
    /// A frame that could not be read, or whose code was gone (or other
    /// code in its place) when it was to be named.
    Unreadable,
    /// The runtime's frames went on beyond the walk's room.
    CutShort,
}

/// One frame of a stack as a runtime places them (see [`Runtime::place`]):
/// the native frame of the stack's word at that index, or a frame of the
/// runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Native(usize),
    Runtime(Frame),
}

/// A runtime's function as the outputs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameName<'a> {
    /// As the runtime itself prints it (`Worker.handle`).
    pub name: &'a str,
    /// Its source file, as the runtime knows it.
    pub file: &'a str,
    /// The line the frame was at, where known.
    pub line: Option<u32>,
    /// And its column, where the runtime says one (JavaScript).
    pub column: Option<u32>,
}

/// What the BPF program is told of a process of a runtime: where the
/// runtime keeps its threads' frames. `value` is the entry of the
/// runtime's map of processes ([`Spec::procs_map`]), as the BPF program
/// reads it; every runtime's entry begins with the address space it is for
/// (a `__u64`, `mm`), which the tracer fills in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    pub kind: Kind,
    pub value: Vec<u8>,
}

impl ProcEntry {
    /// The entry with the address space it is for: `mm` (0: claimed by
    /// the first walk).
    pub fn for_space(&self, mm: u64) -> Vec<u8> {
        let mut value = self.value.clone();
        if let Some(head) = value.get_mut(..8) {
            head.copy_from_slice(&mm.to_ne_bytes());
        }
        value
    }
}

/// A native frame of a stack, as a runtime sees it: the object (by the
/// registry's id) and the file offset, where its address is in a mapping.
pub type NativeAt = Option<(u32, u64)>;

/// Where a walk of a copied stack is (see [`Runtime::step_copy`]): the
/// frame's registers, and whether its pc is where the thread stopped
/// rather than a return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyAt {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    pub exact: bool,
}

/// A runtime's step over a copied stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyStep {
    /// Not the runtime's code.
    NotMine,
    /// The frame's word (in place of its pc), and its caller's registers.
    Next {
        word: u64,
        pc: u64,
        sp: u64,
        bp: u64,
    },
    /// The frame's word; its caller through its frame pointer.
    ByFramePointer { word: u64 },
    /// The frame's word, and the walk's end: `cut` where it could not go
    /// on (the word then says why).
    End { word: u64, cut: bool },
}

/// What every runtime does for the registry.
pub trait Runtime {
    fn kind(&self) -> Kind;

    /// Whether object `id` of the registry (its file `file`, named
    /// `name`, the last component of its path) holds this runtime. Each
    /// object is asked once; the answer is kept.
    fn object(&mut self, id: u32, name: &str, file: Option<&File>) -> bool;

    /// Process `p` maps object `object` (one of this runtime's) at `start`
    /// from file offset `file_offset`, its lowest mapping: the BPF
    /// program's entry for it, if the runtime's frames can be read there.
    fn note_process(
        &mut self,
        p: Proc,
        object: u32,
        start: u64,
        file_offset: u64,
    ) -> Option<ProcEntry>;

    /// Process `child` was forked by `parent`: the same runtime at the
    /// same addresses.
    fn forked(&mut self, parent: u32, child: Proc);

    /// Process `p` is gone, or runs another program: its memory can no
    /// longer be read (what was named stays).
    fn exited(&mut self, p: Proc);

    /// Whether process `p` runs this runtime and its frames are read.
    fn has_process(&self, p: Proc) -> bool;

    /// The processes found to run this runtime whose entry for the BPF
    /// program could not be made yet (a runtime starting): asked for again
    /// a while later.
    fn pending(&self) -> Vec<Proc> {
        Vec::new()
    }

    /// Keep the runtime's call machinery between two of its frames
    /// (`--python-glue`), which it hides otherwise.
    fn keep_call_glue(&mut self, _keep: bool) {}

    /// Whether process `p` was found to run this runtime, its frames read
    /// or not.
    fn seen(&self, p: Proc) -> bool {
        self.has_process(p)
    }

    /// Whether stack word `word` is one of this runtime's frames.
    fn owns(&self, word: u64) -> bool;

    /// The BPF program's walk met code `code` (with `tag`, and `at`: what
    /// else the frame says) in process `p`: read what it names now, while
    /// the process runs.
    fn note_code(&mut self, p: Proc, code: u64, tag: u32, at: u64);

    /// Reads what the runtime frames of stack `addrs` of process `p` name
    /// that was not read yet (its notice was lost), while the process
    /// lives.
    fn resolve(&mut self, p: Proc, addrs: &[u64]);

    /// The frames of stack `addrs` of process `p`, innermost first: its
    /// native frames (`native`, one per word of `addrs`, None for a word
    /// in no mapping or not an address) and the runtime's, each in its
    /// place.
    fn place(&self, p: Proc, addrs: &[u64], native: &[NativeAt]) -> Vec<Placed>;

    /// The name of code `code` (see [`Frame::Code`]) at `at`.
    fn name(&self, code: u32, at: u32) -> Option<FrameName<'_>>;

    /// Last work before the end (what could not be done while tracing:
    /// a runtime that was starting then).
    fn settle(&mut self) {}

    /// Reads the names its processes' threads have in the runtime (a
    /// JVM's Java thread names: the kernel keeps 15 characters), of the
    /// threads not named yet: once a second while tracing, so that threads
    /// that end before the trace keep theirs, and before a profile is made.
    fn read_threads(&mut self) {}

    /// Thread `tid` of process `p`'s name in the runtime, where it has one.
    fn thread_name(&self, _p: Proc, _tid: u32) -> Option<std::sync::Arc<str>> {
        None
    }

    /// What to say on stderr at the end: what could not be shown (always),
    /// with `verbose` what was done. `counters` are the BPF program's.
    fn report(&self, counters: &LossCounters, verbose: bool) -> Vec<String>;

    /// A stack of process `p` was copied lately, to be walked in userspace
    /// once its tables are written: what the runtime must know of this
    /// moment to step over its frames then (a JVM's compile count: code
    /// compiled since is not the code the copy's frames ran). None: not
    /// known.
    fn copy_mark(&self, _p: Proc) -> Option<u64> {
        None
    }

    /// Whether the runtime can step over the frames of process `p`'s
    /// copied stacks now, or is about to (a JVM whose code cache is being
    /// set up: its copies wait for it a while).
    fn copy_ready(&self, _p: Proc) -> bool {
        true
    }

    /// The frame at `at` of a copied stack of process `p` (`mark` as
    /// [`Runtime::copy_mark`] said when it came; `read` reads a word of
    /// the copy, None beyond it), if it is the runtime's code.
    fn step_copy(
        &self,
        _p: Proc,
        _mark: Option<u64>,
        _at: CopyAt,
        _read: &dyn Fn(u64) -> Option<u64>,
    ) -> CopyStep {
        CopyStep::NotMine
    }
}

/// The state of every runtime for one trace, in [`RUNTIMES`]' order.
pub struct Runtimes(Vec<Box<dyn Runtime>>);

impl Default for Runtimes {
    fn default() -> Runtimes {
        Runtimes(RUNTIMES.iter().map(|s| (s.new)()).collect())
    }
}

impl Runtimes {
    pub fn get(&self, kind: Kind) -> &dyn Runtime {
        self.0[kind as usize].as_ref()
    }

    pub fn get_mut(&mut self, kind: Kind) -> &mut dyn Runtime {
        self.0[kind as usize].as_mut()
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Runtime> {
        self.0.iter().map(|r| r.as_ref())
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut (dyn Runtime + 'static)> {
        self.0.iter_mut().map(|r| r.as_mut())
    }

    /// The runtime whose frames stack `addrs` has, if any.
    pub fn of_stack(&self, addrs: &[u64]) -> Option<Kind> {
        self.0
            .iter()
            .find(|r| addrs.iter().any(|&a| r.owns(a)))
            .map(|r| r.kind())
    }

    /// Thread `tid` of process `p`'s name in its runtime, where it has one.
    pub fn thread_name(&self, p: Proc, tid: u32) -> Option<std::sync::Arc<str>> {
        self.0.iter().find_map(|r| r.thread_name(p, tid))
    }

    /// The runtime process `p` runs, if its frames are read.
    pub fn of_process(&self, p: Proc) -> Option<Kind> {
        self.0.iter().find(|r| r.has_process(p)).map(|r| r.kind())
    }

    /// The runtime found to run in process `p`, its frames read or not,
    /// and whether it still runs or not ([`Runtime::seen`]).
    pub fn seen_in(&self, p: Proc) -> Option<Kind> {
        self.0.iter().find(|r| r.seen(p)).map(|r| r.kind())
    }
}

/// Memory of a process whose frames are named.
pub trait Memory {
    /// Fills `buf` from `addr`; a short read is an error.
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// How a runtime opens a process's memory (a made-up memory in tests).
pub type Opener = fn(u32) -> std::io::Result<Box<dyn Memory>>;

/// A process's memory through `/proc/PID/mem` (the runtimes' [`Opener`]).
pub fn open_process(pid: u32) -> std::io::Result<Box<dyn Memory>> {
    Ok(Box::new(ProcMem::open(pid)?))
}

/// A process's memory through `/proc/PID/mem`, opened once.
pub struct ProcMem {
    file: File,
}

impl ProcMem {
    pub fn open(pid: u32) -> std::io::Result<ProcMem> {
        Ok(ProcMem {
            file: File::open(format!("/proc/{pid}/mem"))?,
        })
    }
}

impl Memory for ProcMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let n = self.file.read_at(buf, addr)?;
        if n != buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{n} of {} bytes at {addr:#x}", buf.len()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// A JVM that maps a library whose name hints at node (Javet's) below
    /// its libjvm.so: both runtimes are taken, Java's too, and a file
    /// named for no runtime, or a mapping without a path, is none.
    #[test]
    fn every_hint_of_a_process_is_taken() {
        let maps = "\
7f1000000000-7f1000100000 r-xp 00000000 08:01 11 /opt/app/libjavet-node-linux-x86_64.so
7f2000000000-7f2000100000 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f3000000000-7f3000100000 rw-p 00000000 00:00 0 
7f4000000000-7f4000100000 r-xp 00000000 08:01 13 /usr/lib/jvm/java-17/lib/server/libjvm.so
";
        let mut left: Vec<&Spec> = RUNTIMES.iter().collect();
        let mut found = Vec::new();
        hinted_kinds(maps.as_bytes(), &mut left, &mut found);
        assert_eq!(found, vec![Kind::Node, Kind::Java]);
        assert_eq!(left.len(), 1);
        // Nothing left to look for: nothing read.
        let mut none: Vec<&Spec> = Vec::new();
        hinted_kinds(maps.as_bytes(), &mut none, &mut found);
        assert_eq!(found.len(), 2);
    }

    use super::*;

    /// Each runtime's entry is at its kind's index, and its state says
    /// it is of that kind.
    #[test]
    fn the_table_is_in_kind_order() {
        for (i, spec) in RUNTIMES.iter().enumerate() {
            assert_eq!(spec.kind as usize, i, "{}", spec.name);
            assert_eq!((spec.new)().kind(), spec.kind);
            assert_eq!(Runtimes::default().get(spec.kind).kind(), spec.kind);
        }
    }

    /// The address space goes in the entry's first word, as every
    /// runtime's entry begins (Python's `struct py_proc`).
    #[test]
    fn an_entry_begins_with_its_address_space() {
        assert_eq!(std::mem::offset_of!(crate::bpf::types::py_proc, mm), 0);
        let e = ProcEntry {
            kind: Kind::Python,
            value: vec![0xff; 24],
        };
        let v = e.for_space(0x1122_3344_5566_7788);
        assert_eq!(v[..8], 0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(v[8..], [0xff; 16]);
    }
}
