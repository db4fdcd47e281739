//! Addresses to frame names: kernel frames from kallsyms ([`crate::ksyms`]),
//! user frames from each file's symbol tables through blazesym, found
//! through what the [`Registry`] knows of the process and the files it
//! maps.
//!
//! User addresses are named by file offset from symbol tables: the file's
//! own, or its separate debug file's where one is installed; DWARF only
//! for inlined functions and source lines, where asked for.
//!
//! Kernel addresses are named from kallsyms, through the compact table of
//! [`crate::ksyms`] rather than blazesym's (a third of the memory).

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::elf::Segment;

mod compressed;
use crate::ksyms::{KernelSymbols, PrintedSym};
pub use crate::process::registry::{ExecMapping, Registry, UserFrame};
use crate::process::Proc;
use crate::runtime::{Frame as RuntimeFrame, Kind};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized};

/// A frame's name, and how the text outputs show it where that differs
/// (`-s`: `read+0x15/0x90 [libc.so.6]`): see [`crate::profile::Frame`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// Shared by every frame named from this (see [`crate::profile::Frame`]).
    pub name: Arc<str>,
    pub shown: Option<String>,
}

impl Named {
    fn plain(name: String) -> Named {
        Named {
            name: name.into(),
            shown: None,
        }
    }

    /// The name as shown.
    pub fn text(&self) -> &str {
        self.shown.as_deref().unwrap_or(&self.name)
    }
}

/// How frames are written.
#[derive(Clone, Copy, Debug, Default)]
pub struct SymbolizeOptions {
    /// `func+0x1a/0x90 [module]` instead of `func`.
    pub offsets: bool,
    /// Functions inlined at an address as frames of their own (from DWARF,
    /// where the object or its debug file has it).
    pub inline: bool,
    /// `func (file.c:12)`, where DWARF has the line.
    pub lines: bool,
    /// Each frame's address first, `0x7f3a5c1147e2:func` (`--addresses`):
    /// added where the addresses are known, in [`crate::profile::build`].
    pub addresses: bool,
}

/// What an address resolved to: its function and the offset into it, and
/// the functions inlined there, innermost first, each with its source
/// location if asked for.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    name: String,
    offset: u64,
    /// The symbol's size, where known.
    size: Option<u64>,
    /// The module it is in, as `-s` shows it (`libc.so.6`, `kernel`,
    /// `ext4`), where known.
    module: Option<String>,
    /// ` (file.c:12)`, or empty.
    location: String,
    inlined: Vec<String>,
}

/// The name of the frame where a signal handler was called
/// ([`UserFrame::Signal`]), as gdb's `<signal handler called>`.
pub const SIGNAL_FRAME_NAME: &str = "[signal handler called]";

/// Names of user frames, by frame.
type UserNames = HashMap<(UserFrame, AddrKind), Vec<Named>>;

/// Where an address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrKind {
    /// The exact instruction pointer (the innermost frame of a stack).
    Ip,
    /// A return address: the call is the instruction before it.
    Return,
}

/// Names kernel addresses as the kernel prints them (`None` where no symbol
/// covers one); with none, says only whether it can. The BPF program that
/// does it is the tracer's: given by the binary (`app`).
pub type KernelNamer = fn(&[u64]) -> anyhow::Result<Vec<Option<PrintedSym>>>;

pub struct Symbolizer {
    /// Where kernel frames are named by the kernel itself, and what it
    /// named so far (`-i` names the same frames again and again); kallsyms
    /// is read only where it cannot.
    kernel_namer: Option<KernelNamer>,
    kernel_named: std::cell::RefCell<HashMap<u64, Option<Resolved>>>,
    kernel_namer_failed: std::cell::Cell<bool>,
    /// The kernel's symbols, read on first use; `None` if they could not
    /// be.
    kernel: OnceCell<Option<KernelSymbols>>,
    /// The kernel's symbols being read on a thread of their own (see
    /// [`Symbolizer::warm_up_kernel`]).
    kernel_coming:
        std::cell::RefCell<Option<std::thread::JoinHandle<anyhow::Result<KernelSymbols>>>>,
    opts: SymbolizeOptions,
    /// Files whose symbols could not be parsed (the parser panicked).
    hostile: std::cell::Cell<usize>,
    /// `-i`: the names of user frames found so far, kept for the next
    /// intervals (which would parse every object again otherwise); `None`
    /// for one report.
    user_names_kept: Option<std::cell::RefCell<UserNames>>,
}

impl Symbolizer {
    pub fn new(opts: SymbolizeOptions) -> Symbolizer {
        Symbolizer {
            kernel_namer: None,
            kernel_named: Default::default(),
            kernel_namer_failed: std::cell::Cell::new(false),
            kernel: OnceCell::new(),
            kernel_coming: std::cell::RefCell::new(None),
            opts,
            hostile: std::cell::Cell::new(0),
            user_names_kept: None,
        }
    }

    /// Names kernel frames with `namer` where it can: kallsyms is read
    /// only where it cannot.
    pub fn with_kernel_namer(mut self, namer: KernelNamer) -> Symbolizer {
        self.kernel_namer = Some(namer);
        self
    }

    /// Keeps the names of user frames once found, for the profiles that
    /// follow (`-i`): a frame's object never changes (objects are known by
    /// their file's device and inode, and never forgotten).
    pub fn keep_user_names(&mut self) {
        self.user_names_kept.get_or_insert_with(Default::default);
    }

    /// The name of a JIT-compiled function at `addr` in process `p`, from
    /// its perf map, for a frame outside every file (`frame`): the name
    /// the map gives, and with `-s` its offset and size, `[jit]` as the
    /// module.
    pub fn jit_name(
        &self,
        reg: &Registry,
        p: Proc,
        frame: UserFrame,
        addr: u64,
        kind: AddrKind,
    ) -> Option<Named> {
        let map = reg.perf_map(p)?;
        if frame == UserFrame::Signal {
            return None;
        }
        if let UserFrame::File { object, .. } = frame {
            let o = reg.object(object);
            if o.maps_path.starts_with('/') || o.maps_path == "[vdso]" {
                return None;
            }
        }
        let (name, start, size) = map.lookup(lookup_at(addr, kind))?;
        let shown = self
            .opts
            .offsets
            .then(|| format!("{name}+{:#x}/{size:#x} [jit]", addr - start));
        Some(Named {
            name: name.into(),
            shown,
        })
    }

    /// How frames are written.
    pub fn options(&self) -> SymbolizeOptions {
        self.opts
    }

    /// How many files' symbols could not be parsed at all.
    pub fn unparsable(&self) -> usize {
        self.hostile.get()
    }

    /// Starts reading the kernel's symbols on a thread of its own
    /// (reading kallsyms takes 50 to 100 ms, most of it the kernel's), so
    /// that the report at the end does not wait for it, nor the first
    /// events of the trace (new processes wanting tables) for them.
    pub fn warm_up_kernel(&self) {
        if self.kernel.get().is_some() || self.kernel_namer.is_some_and(|name| name(&[]).is_ok()) {
            return;
        }
        let read = std::thread::Builder::new()
            .name("kallsyms".into())
            .spawn(KernelSymbols::load);
        match read {
            Ok(h) => *self.kernel_coming.borrow_mut() = Some(h),
            Err(_) => {
                self.kernel_symbols();
            }
        }
    }

    /// The kernel's symbols, read the first time. Says once on stderr why
    /// kernel frames will be `[unknown]`, if they will.
    fn kernel_symbols(&self) -> Option<&KernelSymbols> {
        self.kernel
            .get_or_init(|| {
                let coming = self.kernel_coming.borrow_mut().take();
                let read = coming
                    .and_then(|h| h.join().ok())
                    .unwrap_or_else(KernelSymbols::load);
                match read {
                    Ok(table) => {
                        if table.addresses_hidden() {
                            eprintln!(
                                "offcputime: /proc/kallsyms hides kernel addresses from \
                             this user (kernel.kptr_restrict, kernel.perf_event_paranoid): \
                             kernel frames are [unknown]; CAP_SYSLOG shows them"
                            );
                        }
                        Some(table)
                    }
                    Err(e) => {
                        eprintln!("offcputime: {e:#}: kernel frames are [unknown]");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Names of kernel frames, from the kernel's symbols only (as the
    /// kernel names them, or from kallsyms): a vmlinux image's DWARF would
    /// cost more than it adds for function names.
    pub fn kernel(&self, addrs: &[(u64, AddrKind)]) -> HashMap<(u64, AddrKind), Vec<Named>> {
        if addrs.is_empty() {
            return HashMap::new();
        }
        self.resolve(addrs, |lookup| self.kernel_resolved(lookup), |_| None)
    }

    /// Where the kernel names some but not others (its ftrace and kprobe
    /// trampolines, which kallsyms lists apart), kallsyms names the rest.
    fn kernel_resolved(&self, lookup: &[u64]) -> Vec<Option<Resolved>> {
        let mut named = self
            .named_by_kernel(lookup)
            .unwrap_or_else(|| vec![None; lookup.len()]);
        if named.iter().all(Option::is_some) {
            return named;
        }
        let table = self.kernel_symbols();
        for (n, &addr) in named.iter_mut().zip(lookup) {
            if n.is_none() {
                *n = table.and_then(|t| kallsyms_resolved(t, addr));
            }
        }
        named
    }

    /// The symbols of `lookup` as the kernel names them, those not named
    /// before named now; `None` where it cannot (then and from then on:
    /// kallsyms is read instead, which names them the same).
    fn named_by_kernel(&self, lookup: &[u64]) -> Option<Vec<Option<Resolved>>> {
        let namer = self.kernel_namer?;
        if self.kernel_namer_failed.get() {
            return None;
        }
        let mut named = self.kernel_named.borrow_mut();
        let missing: Vec<u64> = {
            let mut seen = HashSet::new();
            lookup
                .iter()
                .copied()
                .filter(|a| !named.contains_key(a) && seen.insert(*a))
                .collect()
        };
        if !missing.is_empty() {
            match namer(&missing) {
                Ok(syms) if syms.len() == missing.len() => {
                    named.extend(missing.into_iter().zip(syms).map(|(addr, sym)| {
                        let resolved = sym.map(|s| {
                            kernel_resolved(s.name, s.offset, Some(s.size), s.module.as_deref())
                        });
                        (addr, resolved)
                    }))
                }
                _ => {
                    self.kernel_namer_failed.set(true);
                    return None;
                }
            }
        }
        Some(
            lookup
                .iter()
                .map(|a| named.get(a).cloned().flatten())
                .collect(),
        )
    }

    /// Names of user frames of process `tgid`, through its snapshot (taken
    /// again now if it is still running).
    pub fn user(
        &self,
        reg: &mut Registry,
        tgid: u32,
        addrs: &[(u64, AddrKind)],
    ) -> HashMap<(u64, AddrKind), Vec<Named>> {
        let plain: Vec<u64> = addrs.iter().map(|&(a, _)| a).collect();
        let frames: Vec<(UserFrame, AddrKind)> = reg
            .frames_now(tgid, &plain)
            .into_iter()
            .zip(addrs)
            .map(|(f, &(_, k))| (f, k))
            .collect();
        let names = self.user_names(reg, &frames);
        addrs
            .iter()
            .zip(&frames)
            .map(|(&a, f)| (a, names.get(f).cloned().unwrap_or_default()))
            .collect()
    }

    /// Names of user frames: by file offset, looked up object by object
    /// in the files' symbol tables (and DWARF, for inlined functions and
    /// lines, where asked for); `[file+0xoffset]` where no symbol covers
    /// the offset, `[unknown]` outside every mapping, [`SIGNAL_FRAME_NAME`]
    /// for a signal frame.
    pub fn user_names(
        &self,
        reg: &Registry,
        frames: &[(UserFrame, AddrKind)],
    ) -> HashMap<(UserFrame, AddrKind), Vec<Named>> {
        let Some(kept) = &self.user_names_kept else {
            return self.find_user_names(reg, frames);
        };
        let mut known = HashMap::new();
        let mut missing = Vec::new();
        {
            let kept = kept.borrow();
            for f in frames {
                match kept.get(f) {
                    Some(n) => {
                        known.insert(*f, n.clone());
                    }
                    None => missing.push(*f),
                }
            }
        }
        let found = self.find_user_names(reg, &missing);
        kept.borrow_mut()
            .extend(found.iter().map(|(k, v)| (*k, v.clone())));
        known.extend(found);
        known
    }

    fn find_user_names(
        &self,
        reg: &Registry,
        frames: &[(UserFrame, AddrKind)],
    ) -> HashMap<(UserFrame, AddrKind), Vec<Named>> {
        let unique: Vec<(UserFrame, AddrKind)> = {
            let mut seen = HashSet::new();
            frames.iter().copied().filter(|f| seen.insert(*f)).collect()
        };
        let mut by_object: HashMap<u32, (Vec<usize>, Vec<u64>)> = HashMap::new();
        for (i, &(f, kind)) in unique.iter().enumerate() {
            if let UserFrame::File { object, offset } = f {
                let e = by_object.entry(object).or_default();
                e.0.push(i);
                e.1.push(lookup_at(offset, kind));
            }
        }
        let mut found: Vec<Option<Resolved>> = vec![None; unique.len()];
        let jobs: Vec<NamingJob> = by_object
            .into_iter()
            .map(|(object, (idx, offsets))| {
                let file = file_to_read(reg, object);
                (idx, offsets, file)
            })
            .collect();
        let named = names_in_files(&jobs, self.opts);
        for ((idx, offsets, _), names) in jobs.iter().zip(named) {
            let names = names.unwrap_or_else(|| {
                self.hostile.set(self.hostile.get() + 1);
                vec![None; offsets.len()]
            });
            for (&i, r) in idx.iter().zip(names) {
                found[i] = r;
            }
        }
        unique
            .iter()
            .zip(found)
            .map(|(&(f, kind), r)| {
                let names = match (r, f) {
                    (Some(mut r), UserFrame::File { object, offset }) => {
                        r.module = Some(reg.object(object).name.clone());
                        self.frames_of(r, offset - lookup_at(offset, kind))
                    }
                    (None, UserFrame::File { object, offset }) => vec![Named::plain(format!(
                        "[{}+{offset:#x}]",
                        reg.object(object).name
                    ))],
                    (_, UserFrame::Signal) => vec![Named::plain(SIGNAL_FRAME_NAME.to_string())],
                    (_, UserFrame::Runtime(kind, RuntimeFrame::Code { code, at })) => {
                        vec![self.runtime_name(reg, kind, code, at)]
                    }
                    (_, UserFrame::Runtime(kind, RuntimeFrame::Unreadable)) => {
                        vec![Named::plain(kind.spec().unreadable.to_string())]
                    }
                    (_, UserFrame::Runtime(kind, RuntimeFrame::CutShort)) => {
                        vec![Named::plain(kind.spec().cut_short.to_string())]
                    }
                    _ => vec![Named::plain("[unknown]".to_string())],
                };
                ((f, kind), names)
            })
            .collect()
    }

    /// A runtime frame's name: the function's name as its runtime prints
    /// it, with `-s` its file (`Worker.handle [server.py]`), with
    /// `--lines` the file and the line it was at (`Worker.handle
    /// (app/server.py:42)`).
    fn runtime_name(&self, reg: &Registry, kind: Kind, code: u32, at: u32) -> Named {
        let Some(c) = reg.runtime_name(kind, code, at) else {
            return Named::plain(kind.spec().unreadable.to_string());
        };
        // The runtime's own code (a JVM's stubs) has no file.
        let location = if self.opts.lines && !c.file.is_empty() {
            match (c.line, c.column) {
                (Some(line), Some(column)) => format!(" ({}:{line}:{column})", c.file),
                (Some(line), None) => format!(" ({}:{line})", c.file),
                _ => format!(" ({})", c.file),
            }
        } else {
            String::new()
        };
        let shown = self.opts.offsets.then(|| {
            let file = c.file.rsplit('/').next().unwrap_or(c.file);
            if file.is_empty() {
                format!("{}{location}", c.name)
            } else {
                format!("{} [{file}]{location}", c.name)
            }
        });
        Named {
            name: format!("{}{location}", c.name).into(),
            shown,
        }
    }

    /// The frames of a resolved address, innermost first; `past` is how
    /// far the address is past the one looked up (1 for a return address).
    /// With `-s`, the outermost frame shows its offset into the function,
    /// the function's size and its module as systemtap prints them:
    /// `read+0x15/0x90 [libc.so.6]` (what `objdump -d --start-address
    /// --stop-address` of the module needs); the size or the module left
    /// out where unknown. Inlined frames share the address: no offset.
    fn frames_of(&self, r: Resolved, past: u64) -> Vec<Named> {
        let name = format!("{}{}", r.name, r.location);
        let shown = self.opts.offsets.then(|| {
            let size = r.size.map_or(String::new(), |s| format!("/{s:#x}"));
            let module = r
                .module
                .as_ref()
                .map_or(String::new(), |m| format!(" [{m}]"));
            format!(
                "{}+{:#x}{size}{module}{}",
                r.name,
                r.offset + past,
                r.location
            )
        });
        let mut frames: Vec<Named> = r.inlined.into_iter().map(Named::plain).collect();
        frames.push(Named {
            name: name.into(),
            shown,
        });
        frames
    }

    fn resolve(
        &self,
        addrs: &[(u64, AddrKind)],
        symbolize: impl FnOnce(&[u64]) -> Vec<Option<Resolved>>,
        fallback: impl Fn(u64) -> Option<String>,
    ) -> HashMap<(u64, AddrKind), Vec<Named>> {
        let unique: Vec<(u64, AddrKind)> = {
            let mut seen = HashSet::new();
            addrs.iter().copied().filter(|a| seen.insert(*a)).collect()
        };
        // A return address may be one past the end of the calling
        // function (a call as its last instruction): look up the call.
        let lookup: Vec<u64> = unique.iter().map(|&(a, k)| lookup_at(a, k)).collect();
        let results = symbolize(&lookup);
        let mut out = HashMap::with_capacity(unique.len());
        for (i, &(addr, kind)) in unique.iter().enumerate() {
            let frames = match results.get(i).cloned().flatten() {
                // Offsets from the start of the symbol to the address
                // itself (not the looked-up call).
                Some(r) => self.frames_of(r, addr - lookup[i]),
                None => vec![Named::plain(
                    fallback(addr).unwrap_or_else(|| "[unknown]".to_string()),
                )],
            };
            out.insert((addr, kind), frames);
        }
        out
    }
}

/// The symbol at `addr` in kallsyms, as a resolved frame.
fn kallsyms_resolved(table: &KernelSymbols, addr: u64) -> Option<Resolved> {
    let sym = table.resolve(addr)?;
    Some(kernel_resolved(
        sym.name.to_string(),
        sym.offset,
        sym.size,
        sym.module,
    ))
}

/// A kernel frame's symbol: its module, `kernel` for the kernel image's.
fn kernel_resolved(name: String, offset: u64, size: Option<u64>, module: Option<&str>) -> Resolved {
    Resolved {
        name,
        offset,
        size,
        module: Some(module.unwrap_or("kernel").to_string()),
        location: String::new(),
        inlined: Vec::new(),
    }
}

fn blazesym_symbolizer(opts: SymbolizeOptions) -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        // blazesym reports inlined functions only with source locations
        // on.
        .enable_code_info(opts.lines || opts.inline)
        .enable_inlined_fns(opts.inline)
        .enable_demangling(true)
        .build()
}

/// A file to name offsets of: its path, the device and inode the file
/// there must still have (where the object was found again by its path),
/// and the object's segments (its file offsets to its addresses).
struct FileToRead<'r> {
    path: &'r Path,
    same_as: Option<(u64, u64)>,
    segments: Option<&'r [Segment]>,
}

/// Where object `object`'s symbols are read from, or None where it has no
/// file.
fn file_to_read(reg: &Registry, object: u32) -> Option<FileToRead<'_>> {
    let object = reg.object(object);
    let path = object.path.as_ref()?;
    let same_as = match (&object.handle, &object.mapped) {
        (None, Some((p, dev, ino))) if path == p => Some((*dev, *ino)),
        _ => None,
    };
    Some(FileToRead {
        path,
        same_as,
        segments: object.segments.as_deref(),
    })
}

impl FileToRead<'_> {
    /// The names of `offsets` (all None where a file found again by its
    /// path is no longer the one mapped), or None where the file's
    /// symbols could not be parsed. Opened here, by the thread that reads
    /// it: one descriptor a thread at a time.
    fn names(&self, offsets: &[u64], opts: SymbolizeOptions) -> Option<Vec<Option<Resolved>>> {
        let Some((dev, ino)) = self.same_as else {
            return names_in_file(self.path, self.segments, offsets, opts);
        };
        use std::os::unix::fs::MetadataExt;
        match File::open(self.path) {
            Ok(f) if f.metadata().is_ok_and(|m| m.dev() == dev && m.ino() == ino) => {
                let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
                names_in_file(&path, self.segments, offsets, opts)
            }
            _ => Some(vec![None; offsets.len()]),
        }
    }
}

/// One object's frames to name: their places among the frames asked
/// about, their offsets, and the file to read.
type NamingJob<'r> = (Vec<usize>, Vec<u64>, Option<FileToRead<'r>>);

/// The names of a file's offsets, None where its symbols could not be
/// parsed.
type FileNames = Option<Vec<Option<Resolved>>>;

/// Threads that name the objects' offsets: at most two objects parsed at
/// once (each file's symbol tables and DWARF are parsed by a symbolizer of
/// its own, dropped after it), so that a file that takes long (a
/// distribution's compressed debug file, inflated up to the last unit
/// asked about) does not hold the others up, and what is resident at once
/// stays two objects' at most.
const NAMING_THREADS: usize = 2;

/// The names of each job's offsets (`vec![None; n]` for a job without a
/// file), in the jobs' order; None for a file whose symbols could not be
/// parsed. The largest files are taken first.
fn names_in_files(jobs: &[NamingJob], opts: SymbolizeOptions) -> Vec<FileNames> {
    let run = |j: usize| -> FileNames {
        let (_, offsets, file) = &jobs[j];
        let names = match file {
            Some(f) => f.names(offsets, opts),
            None => Some(vec![None; offsets.len()]),
        };
        crate::give_back_freed_memory();
        names
    };
    // In the real-time class (the report on a busy machine) a CPU is left
    // to the machine's own threads: one thread on two CPUs.
    let class = crate::priority::this_class();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if class.realtime() { cpus - 1 } else { cpus }
        .min(NAMING_THREADS)
        .min(jobs.len());
    if threads <= 1 {
        return (0..jobs.len()).map(run).collect();
    }
    let size = |j: &usize| {
        jobs[*j]
            .2
            .as_ref()
            .and_then(|f| std::fs::metadata(f.path).ok())
            .map_or(0, |m| m.len())
    };
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|j| std::cmp::Reverse(size(j)));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut named: Vec<FileNames> = vec![None; jobs.len()];
    let done: Vec<Vec<(usize, FileNames)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    // In the report's class (the real-time one on a busy
                    // machine): a thread starts in the normal class.
                    class.join();
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&j) = order.get(k) else { break };
                        mine.push((j, run(j)));
                    }
                    mine
                })
            })
            .collect();
        // names_in_file catches a parser's panic itself: a worker that
        // panics all the same has its objects named None.
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    for (j, n) in done.into_iter().flatten() {
        named[j] = n;
    }
    named
}

/// Symbols of file offsets of the ELF file at `path` (with `segments`,
/// those of the file the offsets are of, when `path` is its separate debug
/// file). The file's symbol tables and DWARF are parsed by a symbolizer of
/// its own, dropped after: what is resident at once is one file's. `None`
/// if the parser gave up on the file by panicking (a file made to break
/// it: any user can map one into a traced process).
pub(crate) fn names_in_file(
    path: &Path,
    segments: Option<&[Segment]>,
    offsets: &[u64],
    opts: SymbolizeOptions,
) -> Option<Vec<Option<Resolved>>> {
    names_in_file_by(path, segments, offsets, opts, Dwarf::AnyReader)
}

/// Which DWARF reader [`names_in_file_by`] may use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dwarf {
    /// Compressed DWARF a unit at a time where it can be, else blazesym's.
    AnyReader,
    /// blazesym's alone (the unit-at-a-time reader's tests compare the two).
    #[cfg(test)]
    General,
}

fn names_in_file_by(
    path: &Path,
    segments: Option<&[Segment]>,
    offsets: &[u64],
    opts: SymbolizeOptions,
    reader: Dwarf,
) -> Option<Vec<Option<Resolved>>> {
    std::panic::catch_unwind(|| {
        let inner = blazesym_symbolizer(opts);
        // The file's addresses of the offsets, by `segments` or by the
        // file's own (u64::MAX where none holds an offset).
        let addrs = |segments: &[Segment]| -> Vec<u64> {
            offsets
                .iter()
                .map(|&o| {
                    segments
                        .iter()
                        .find(|s| o >= s.offset && o - s.offset < s.filesz)
                        .map_or(u64::MAX, |s| (o - s.offset).wrapping_add(s.vaddr))
                })
                .collect()
        };
        let symbolize = |debug_syms: bool| {
            let mut elf = Elf::new(path);
            elf.debug_syms = debug_syms;
            let src = Source::Elf(elf);
            match segments {
                None => inner.symbolize(&src, Input::FileOffset(offsets)),
                Some(segments) => inner.symbolize(&src, Input::VirtOffset(&addrs(segments))),
            }
        };
        // Function names from the symbol tables: fully qualified, where
        // DWARF can have a bare name (Rust at debuginfo=line-tables-only).
        let mut found = resolved(symbolize(false), offsets.len(), false);
        // DWARF only for what the symbol tables lack: inlined functions
        // and source lines. Compressed DWARF (a distribution's debug file)
        // is read a unit at a time where every frame has its function
        // from the symbol tables (the general reader names the others).
        if opts.inline || opts.lines {
            let compressed = (reader == Dwarf::AnyReader && found.iter().all(Option::is_some))
                .then(|| {
                    let file = File::open(path).ok()?;
                    let elf = crate::elf::Elf::read(&file).ok()?;
                    let own;
                    let segments = match segments {
                        Some(s) => s,
                        None => {
                            own = elf.load_segments(&file).ok()?;
                            &own
                        }
                    };
                    compressed::find(&file, &elf, &addrs(segments), opts.inline)
                })
                .flatten();
            let dwarf = match compressed {
                Some(found) => found
                    .into_iter()
                    .map(|d| {
                        let at = |l: Option<&compressed::Loc>| match l {
                            Some(l) => location_text(&l.file, l.line, opts.lines),
                            None => String::new(),
                        };
                        Some(Resolved {
                            name: String::new(),
                            offset: 0,
                            size: None,
                            module: None,
                            location: at(d.location.as_ref()),
                            inlined: d
                                .inlined
                                .iter()
                                .rev()
                                .map(|(name, l)| format!("{name}{}", at(l.as_ref())))
                                .collect(),
                        })
                    })
                    .collect(),
                None => resolved(symbolize(true), offsets.len(), opts.lines),
            };
            for (f, d) in found.iter_mut().zip(dwarf) {
                match (f.as_mut(), d) {
                    (Some(f), Some(d)) => {
                        f.location = d.location;
                        f.inlined = d.inlined;
                    }
                    (None, d) => *f = d,
                    (Some(_), None) => {}
                }
            }
        }
        found
    })
    .ok()
}

/// Where a frame's function is looked up: a return address may be one
/// past the end of the calling function (a call as its last
/// instruction), so the call before it.
fn lookup_at(offset: u64, kind: AddrKind) -> u64 {
    match kind {
        AddrKind::Ip => offset,
        AddrKind::Return => offset.saturating_sub(1),
    }
}

/// ` (file.c:12)` for a frame at line 12 of `dir/file.c` (` (file.c)`
/// where the line is not known), empty unless `lines`.
fn location_text(
    file: &(impl AsRef<std::ffi::OsStr> + ?Sized),
    line: Option<u32>,
    lines: bool,
) -> String {
    if !lines {
        return String::new();
    }
    let file = file.as_ref();
    let file = Path::new(file)
        .file_name()
        .unwrap_or(file)
        .to_string_lossy();
    match line {
        Some(l) => format!(" ({file}:{l})"),
        None => format!(" ({file})"),
    }
}

/// (name, offset of the address into the symbol) of each result, `len`
/// of them.
fn resolved(
    results: blazesym::Result<Vec<Symbolized<'_>>>,
    len: usize,
    lines: bool,
) -> Vec<Option<Resolved>> {
    let location = |c: Option<&CodeInfo<'_>>| match c {
        Some(c) => location_text(&c.file, c.line, lines),
        None => String::new(),
    };
    match results {
        Ok(r) => r
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => Some(Resolved {
                    name: sym.name.to_string(),
                    offset: sym.offset as u64,
                    size: sym.size.map(|s| s as u64),
                    module: None,
                    location: location(sym.code_info.as_deref()),
                    // Innermost first, as frames are.
                    inlined: sym
                        .inlined
                        .iter()
                        .rev()
                        .map(|f| format!("{}{}", f.name, location(f.code_info.as_ref())))
                        .collect(),
                }),
                _ => None,
            })
            .collect(),
        Err(_) => vec![None; len],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every function of libc, at its start and a few places inside it,
    /// named the same by the unit-at-a-time reader of compressed DWARF as
    /// by blazesym's: inlined frames and source lines (libc6-dbg, which
    /// Debian ships compressed; under CI a machine without it fails).
    #[test]
    fn compressed_dwarf_reads_as_blazesym_does() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = crate::process::maps::parse_maps(&maps)
            .into_iter()
            .find(|l| l.path.ends_with("/libc.so.6"))
            .map(|l| PathBuf::from(l.path))
            .expect("libc mapped");
        let Some(debug) = crate::process::maps::debug_file(&libc) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no debug file for {libc:?} (libc6-dbg)"
            );
            eprintln!("skipped: no debug file for {libc:?} (libc6-dbg)");
            return;
        };
        let file = File::open(&libc).unwrap();
        let elf = crate::elf::Elf::read(&file).unwrap();
        let segments = elf.load_segments(&file).unwrap();
        let dfile = File::open(&debug).unwrap();
        let delf = crate::elf::Elf::read(&dfile).unwrap();
        assert!(
            delf.section(".debug_info")
                .is_some_and(|s| s.flags & 0x800 != 0),
            "{debug:?}: .debug_info not compressed, so not what this compares"
        );
        // File offsets of places in every function of the symbol table.
        let mut offsets = Vec::new();
        for sym in delf.function_symbols(&dfile).unwrap() {
            for k in [0, 1, 5, 17, 40, 99, 250] {
                if k < sym.size.max(1) {
                    let vaddr = sym.value + k;
                    if let Some(s) = segments
                        .iter()
                        .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)
                    {
                        offsets.push(vaddr - s.vaddr + s.offset);
                    }
                }
            }
        }
        assert!(offsets.len() > 5000, "{} places", offsets.len());
        // The reader answers for them itself (it does not leave them to
        // blazesym's).
        let addrs: Vec<u64> = offsets
            .iter()
            .map(|&o| {
                let s = segments
                    .iter()
                    .find(|s| o >= s.offset && o - s.offset < s.filesz)
                    .unwrap();
                o - s.offset + s.vaddr
            })
            .collect();
        let direct = compressed::find(&dfile, &delf, &addrs, true).expect("read a unit at a time");
        assert!(direct.iter().filter(|f| !f.inlined.is_empty()).count() > 1000);
        for opts in [
            SymbolizeOptions {
                inline: true,
                lines: false,
                ..SymbolizeOptions::default()
            },
            SymbolizeOptions {
                inline: true,
                lines: true,
                ..SymbolizeOptions::default()
            },
            // Source lines without inlined frames: the row's own.
            SymbolizeOptions {
                inline: false,
                lines: true,
                ..SymbolizeOptions::default()
            },
        ] {
            let ours = names_in_file_by(&debug, Some(&segments), &offsets, opts, Dwarf::AnyReader)
                .unwrap();
            let theirs =
                names_in_file_by(&debug, Some(&segments), &offsets, opts, Dwarf::General).unwrap();
            let mut differ = Vec::new();
            let mut inlined = 0;
            for ((o, a), b) in offsets.iter().zip(&ours).zip(&theirs) {
                let a = a.as_ref().map(|r| (&r.name, &r.location, &r.inlined));
                let b = b.as_ref().map(|r| (&r.name, &r.location, &r.inlined));
                inlined += b.is_some_and(|b| !b.2.is_empty()) as usize;
                if a != b {
                    differ.push(format!("{o:#x}: {a:?} against {b:?}"));
                }
            }
            assert!(
                inlined > 1000 || !opts.inline,
                "{inlined} places with inlined frames"
            );
            assert!(
                differ.is_empty(),
                "{} of {} differ, first: {:#?}",
                differ.len(),
                offsets.len(),
                &differ[..differ.len().min(10)]
            );
        }
    }

    #[test]
    fn vdso_frames_are_named() {
        // Where __vdso_clock_gettime is in the copy, then in this process.
        let copy = crate::process::maps::vdso_copy().expect("a vDSO");
        let path = format!("/proc/self/fd/{}", copy.as_raw_fd());
        let inspector = blazesym::inspect::Inspector::new();
        let found = inspector
            .lookup(
                &blazesym::inspect::source::Source::Elf(blazesym::inspect::source::Elf::new(&path)),
                &["__vdso_clock_gettime"],
            )
            .unwrap();
        let offset = found[0][0].file_offset.expect("file offset");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let vdso = crate::process::maps::parse_maps(&maps)
            .into_iter()
            .find(|l| l.path == "[vdso]")
            .unwrap();
        let addr = vdso.start + offset + 4;
        let me = std::process::id();
        let sym = Symbolizer::new(SymbolizeOptions::default());
        let mut reg = Registry::new();
        reg.note_process(me, None, false);
        let names = sym.user(&mut reg, me, &[(addr, AddrKind::Ip)]);
        let frames = &names[&(addr, AddrKind::Ip)];
        assert!(
            frames
                .last()
                .is_some_and(|f| f.name.contains("clock_gettime")),
            "{frames:?}"
        );
    }
}
