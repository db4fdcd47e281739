//! Addresses to frame names: kernel frames from kallsyms ([`crate::ksyms`]),
//! user frames from each file's symbol tables through blazesym.
//!
//! A process's executable mappings are snapshotted the first time it is
//! seen blocking, and again when they change (see
//! [`Symbolizer::note_process`]), so that its frames are still named if it
//! exits before tracing ends. The snapshot is small: each mapping refers to
//! a file by index, and each distinct file (by device and inode) is opened
//! once, through the process's `/proc/PID/map_files` (so files in other
//! mount namespaces, or deleted since, still resolve), and shared by every
//! process that maps it.
//!
//! User addresses are named by file offset from symbol tables: the file's
//! own, or its separate debug file's where one is installed. DWARF is never
//! parsed; it would double the profiler's memory for the same names.
//!
//! Kernel addresses are named from kallsyms, through the compact table of
//! [`crate::ksyms`] rather than blazesym's (a third of the memory).

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::elf::{load_segments, Segment};
use crate::ksyms::KernelSymbols;
use crate::process::Proc;
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized};

/// One executable mapping of a process.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into `Symbolizer::objects`.
    object: u32,
}

/// What a mapping maps: a file, or something without one (`[vdso]`, an
/// anonymous JIT region).
struct Object {
    /// File name for unnamed frames: `[libfoo.so+0x1234]`.
    name: String,
    /// The path as the maps give it (`[vdso]`, `anon` for mappings
    /// without a file): what the profile says the frames are in.
    maps_path: String,
    /// Where blazesym reads the symbols: the file's separate debug file
    /// if one is installed (found by build id), else the file itself,
    /// through `/proc/self/fd/N` of the handle below, or the path in the
    /// maps if it could not be opened.
    path: Option<PathBuf>,
    /// With a debug file: the loadable segments of the file itself, to
    /// turn file offsets into the addresses both files share.
    segments: Option<Vec<Segment>>,
    /// The file as mapped, kept open while a process maps it (see
    /// [`Symbolizer::release`]).
    handle: Option<File>,
    /// The path as mapped and the file's device and inode: where to find
    /// the file again once its descriptor was let go.
    mapped: Option<(PathBuf, u64, u64)>,
    /// `path` is the descriptor's `/proc/self/fd/N`; once the descriptor
    /// is let go, it is `mapped`'s path, checked to be the same file
    /// before it is read.
    path_is_handle: bool,
    /// Snapshots (of live processes, or kept for one whose pid was reused)
    /// that map it.
    users: u32,
}

/// An executable mapping of a process, as [`Symbolizer::mappings`] gives
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The object mapped: see [`Symbolizer::object_file`].
    pub object: u32,
}

/// A frame of a user stack, independent of where its object was mapped:
/// the object and the file offset, or, outside every mapping known, the
/// address itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserFrame {
    File { object: u32, offset: u64 },
    Unmapped(u64),
}

/// Where distributions install separate debug files, by build id.
const DEBUG_BUILD_ID_DIR: &str = "/usr/lib/debug/.build-id";

/// The separate debug file of the ELF file at `path`, if installed:
/// `/usr/lib/debug/.build-id/ab/cdef….debug`. Its symbol table names what
/// the stripped file's dynamic symbols leave unnamed (`start_thread`).
pub(crate) fn debug_file(path: &Path) -> Option<PathBuf> {
    debug_file_in(Path::new(DEBUG_BUILD_ID_DIR), path)
}

fn debug_file_in(dir: &Path, path: &Path) -> Option<PathBuf> {
    // The parser may panic on a malformed file: then there is no id.
    let id = std::panic::catch_unwind(|| blazesym::helper::read_elf_build_id(&path))
        .ok()?
        .ok()??;
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let p = dir.join(&hex[..2]).join(format!("{}.debug", &hex[2..]));
    p.is_file().then_some(p)
}

/// The id a retired stack is kept under: the stack id mixed with its
/// process's start time, so that the stacks of two processes that had the
/// same pid are kept apart (a 64-bit hash either way).
fn retired_id(id: u64, start: u64) -> u64 {
    id ^ start.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// (stack id, tgid) -> index of its frames, for processes that exited.
#[derive(Default)]
struct RetiredList {
    entries: Vec<(u64, u32, u32)>,
    sorted: bool,
}

impl RetiredList {
    fn push(&mut self, tgid: u32, id: u64, index: u32) {
        self.entries.push((id, tgid, index));
        self.sorted = false;
    }

    fn get(&mut self, tgid: u32, id: u64) -> Option<u32> {
        if !self.sorted {
            self.entries.sort_unstable();
            self.sorted = true;
        }
        let at = self
            .entries
            .binary_search_by(|&(i, t, _)| (i, t).cmp(&(id, tgid)))
            .ok()?;
        Some(self.entries[at].2)
    }
}

/// A frame's name, and how the text outputs show it where that differs
/// (`-s`: `read+0x15/0x90 [libc.so.6]`): see [`crate::profile::Frame`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub shown: Option<String>,
}

impl Named {
    fn plain(name: String) -> Named {
        Named { name, shown: None }
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

/// Names of user frames, by frame.
type UserNames = HashMap<(UserFrame, AddrKind), Vec<Named>>;

pub struct Symbolizer {
    /// Executable mappings by process, as last seen, while it lives.
    processes: HashMap<u32, Vec<Mapping>>,
    /// When each process in `processes` started, where known: its pid may
    /// be reused by another process.
    starts: HashMap<u32, u64>,
    /// Snapshots of processes whose pid another process took before they
    /// were let go.
    superseded: HashMap<Proc, Vec<Mapping>>,
    /// The user stacks counted for processes that have exited (see
    /// [`Symbolizer::retire`]), by (tgid, stack id): an index into
    /// `retired_stacks`, where stacks alike in every process of a program
    /// are kept once. A list (16 bytes an entry, sorted when first looked
    /// up), not a hash map: it is what grows with every process that
    /// exits.
    retired: RetiredList,
    retired_stacks: Vec<std::rc::Rc<[UserFrame]>>,
    retired_ids: HashMap<std::rc::Rc<[UserFrame]>, u32>,
    /// Live processes whose snapshot was taken again for the report.
    refreshed: HashSet<u32>,
    objects: Vec<Object>,
    /// `objects` indices by (device, inode), or by name for mappings
    /// without a file.
    object_ids: HashMap<ObjectKey, u32>,
    /// The kernel's symbols, read on first use; `None` if they could not
    /// be.
    kernel: OnceCell<Option<KernelSymbols>>,
    opts: SymbolizeOptions,
    /// What could not be read for want of privilege, for the one line
    /// that says so at the end.
    denied: Denied,
    /// Files whose symbols could not be parsed (the parser panicked).
    hostile: std::cell::Cell<usize>,
    /// Descriptors let go (see [`Symbolizer::release`]).
    released: usize,
    /// JIT runtimes' perf maps (`/tmp/perf-PID.map`), as last read while
    /// their process lived.
    perf_maps: HashMap<Proc, crate::jit::PerfMap>,
    /// Perf maps refused (a link, another user's file), once each.
    perf_maps_refused: Vec<String>,
    /// `-i`: the names of user frames found so far, kept for the next
    /// intervals (which would parse every object again otherwise); `None`
    /// for one report.
    user_names_kept: Option<std::cell::RefCell<UserNames>>,
}

/// Processes and files the profiler was not allowed to read.
#[derive(Default)]
pub struct Denied {
    /// Processes whose `/proc/PID/maps` could not be read: their frames
    /// are `[unknown]`.
    pub processes: HashSet<u32>,
    /// Files mapped by traced processes that could not be opened, by
    /// name, with the reason: their frames are `[unknown]`, their stacks
    /// walked with frame pointers.
    pub files: Vec<(String, String)>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum ObjectKey {
    File { dev: String, inode: u64 },
    Pseudo(String),
}

/// Where an address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrKind {
    /// The exact instruction pointer (the innermost frame of a stack).
    Ip,
    /// A return address: the call is the instruction before it.
    Return,
}

/// One executable line of `/proc/PID/maps`.
pub(crate) struct MapsLine<'a> {
    start: u64,
    end: u64,
    file_offset: u64,
    key: ObjectKey,
    range: &'a str,
    path: &'a str,
}

/// Opens the file a process maps at `line`: through its
/// `/proc/PID/map_files` entry where the profiler may (CAP_SYS_ADMIN, or
/// since Linux 5.9 CAP_CHECKPOINT_RESTORE with CAP_DAC_READ_SEARCH: the
/// file even if deleted or in another mount namespace); else by its path as the process sees it
/// (`/proc/PID/root`, which needs the right to trace the process:
/// CAP_SYS_PTRACE for another user's), else by its path here. Either path
/// must lead to the file mapped (device and inode).
fn open_mapped(tgid: u32, line: &MapsLine<'_>) -> std::io::Result<File> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::MetadataExt;
    let denied = match File::open(format!("/proc/{tgid}/map_files/{}", line.range)) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    if denied.kind() != ErrorKind::PermissionDenied {
        return Err(denied);
    }
    let ObjectKey::File { dev, inode } = &line.key else {
        return Err(denied);
    };
    if !line.path.starts_with('/') || line.path.ends_with(" (deleted)") {
        return Err(Error::new(
            ErrorKind::NotFound,
            "deleted since it was mapped; opening it needs CAP_SYS_ADMIN, or \
             CAP_CHECKPOINT_RESTORE with CAP_DAC_READ_SEARCH",
        ));
    }
    let want = dev.split_once(':').and_then(|(a, b)| {
        Some((
            u32::from_str_radix(a, 16).ok()?,
            u32::from_str_radix(b, 16).ok()?,
        ))
    });
    let mapped = |f: &File| {
        f.metadata().is_ok_and(|m| {
            m.ino() == *inode && want == Some((libc::major(m.dev()), libc::minor(m.dev())))
        })
    };
    let mut refused = false;
    for path in [
        format!("/proc/{tgid}/root{}", line.path),
        line.path.to_string(),
    ] {
        match File::open(&path) {
            Ok(f) if mapped(&f) => return Ok(f),
            Ok(_) => {}
            Err(e) => refused |= e.kind() == ErrorKind::PermissionDenied,
        }
    }
    Err(if refused {
        Error::new(
            ErrorKind::PermissionDenied,
            "permission denied; CAP_SYS_PTRACE opens another user's process's files, \
             CAP_DAC_READ_SEARCH files this user may not read",
        )
    } else {
        Error::new(
            ErrorKind::NotFound,
            "its path leads to another file now (replaced, or in another mount namespace); \
             CAP_SYS_PTRACE or CAP_SYS_ADMIN opens the one mapped",
        )
    })
}

pub(crate) fn parse_maps(text: &str) -> Vec<MapsLine<'_>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        // The path is the rest of the line; it may contain spaces.
        let path = it.next().map_or("", |first| {
            let at = line.find(first).unwrap_or(line.len());
            line[at..].trim_end()
        });
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset), Ok(inode)) = (
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(offset, 16),
            inode.parse::<u64>(),
        ) else {
            continue;
        };
        let key = if inode != 0 {
            ObjectKey::File {
                dev: dev.to_string(),
                inode,
            }
        } else {
            ObjectKey::Pseudo(if path.is_empty() { "anon" } else { path }.to_string())
        };
        out.push(MapsLine {
            start,
            end,
            file_offset,
            key,
            range,
            path,
        });
    }
    out
}

/// A copy of this process's vDSO in an anonymous file. Every process on
/// the machine maps the same image, whole, so an address at offset X in
/// another process's `[vdso]` mapping is at file offset X in this copy
/// (`clock_gettime` and friends, where a thread can be preempted).
fn vdso_copy() -> Option<File> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = parse_maps(&maps)
        .into_iter()
        .find(|l| l.key == ObjectKey::Pseudo("[vdso]".into()))?;
    // SAFETY: the vDSO is mapped readable for the life of the process, at
    // the range /proc/self/maps gives.
    let image = unsafe {
        std::slice::from_raw_parts(line.start as *const u8, (line.end - line.start) as usize)
    };
    // SAFETY: memfd_create with a NUL-terminated name; the new descriptor
    // is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(c"vdso".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(image).ok()?;
    Some(file)
}

fn process_alive(tgid: u32) -> bool {
    Path::new(&format!("/proc/{tgid}/maps")).exists()
}

impl Symbolizer {
    pub fn new(opts: SymbolizeOptions) -> Symbolizer {
        Symbolizer {
            processes: HashMap::new(),
            starts: HashMap::new(),
            superseded: HashMap::new(),
            retired: RetiredList::default(),
            retired_stacks: Vec::new(),
            retired_ids: HashMap::new(),
            refreshed: HashSet::new(),
            objects: Vec::new(),
            object_ids: HashMap::new(),
            kernel: OnceCell::new(),
            opts,
            denied: Denied::default(),
            hostile: std::cell::Cell::new(0),
            released: 0,
            perf_maps: HashMap::new(),
            perf_maps_refused: Vec::new(),
            user_names_kept: None,
        }
    }

    /// Keeps the names of user frames once found, for the profiles that
    /// follow (`-i`): a frame's object never changes (objects are known by
    /// their file's device and inode, and never forgotten).
    pub fn keep_user_names(&mut self) {
        self.user_names_kept.get_or_insert_with(Default::default);
    }

    /// Snapshots what is needed to symbolize `tgid` later, even after it
    /// exits.  Cheap to call again for a known process, unless `changed`
    /// says that its mappings have.
    /// `start`: when the process started, where known (the BPF program's
    /// events say it); otherwise `/proc` is asked.
    pub fn note_process(&mut self, tgid: u32, start: Option<u64>, changed: bool) {
        if tgid == 0 {
            return;
        }
        let now = crate::process::start_ticks(tgid);
        let start = start.or(now);
        let Some(start) = start else {
            // Gone: keep what we had.
            self.processes.entry(tgid).or_default();
            return;
        };
        match self.starts.get(&tgid) {
            // Another process has this pid now: the snapshot is the old
            // one's, kept apart for the stacks counted for it.
            Some(&old) if old != start => {
                if let Some(m) = self.processes.remove(&tgid) {
                    self.superseded.insert(Proc { tgid, start: old }, m);
                }
                self.starts.remove(&tgid);
            }
            Some(_) if !changed => return,
            None if !changed && self.processes.contains_key(&tgid) => return,
            _ => {}
        }
        // The event may be older than the process now at this pid.
        if now != Some(start) {
            return;
        }
        self.starts.insert(tgid, start);
        self.refresh_process(tgid);
    }

    fn refresh_process(&mut self, tgid: u32) {
        let text = match std::fs::read_to_string(format!("/proc/{tgid}/maps")) {
            Ok(t) => t,
            Err(e) => {
                // Another user's process, without CAP_SYS_PTRACE (with
                // it, a process in the middle of an exec can refuse too,
                // for a moment).
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && !crate::process::has_capability(crate::process::CAP_SYS_PTRACE)
                {
                    self.denied.processes.insert(tgid);
                }
                // Gone already: keep what we had.
                self.processes.entry(tgid).or_default();
                return;
            }
        };
        let mut mappings = Vec::new();
        for line in parse_maps(&text) {
            let object = self.object(tgid, &line);
            mappings.push(Mapping {
                start: line.start,
                end: line.end,
                file_offset: line.file_offset,
                object,
            });
        }
        // What was seen before stays where nothing new overlaps it: a
        // library unloaded since, the image before an exec(), everything
        // of a zombie (whose maps are empty) still names earlier stacks.
        if let Some(old) = self.processes.get(&tgid) {
            let kept: Vec<Mapping> = old
                .iter()
                .filter(|o| !mappings.iter().any(|n| n.start < o.end && o.start < n.end))
                .copied()
                .collect();
            mappings.extend(kept);
        }
        mappings.shrink_to_fit();
        self.read_perf_map(tgid);
        let old = self.processes.insert(tgid, mappings);
        let new = distinct_objects(&self.processes[&tgid]);
        for &o in &new {
            self.objects[o as usize].users += 1;
        }
        if let Some(old) = old {
            self.drop_users(&distinct_objects(&old));
        }
    }

    /// One snapshot fewer maps each of `objects`; those no snapshot maps
    /// any more let go of their descriptors.
    fn drop_users(&mut self, objects: &[u32]) {
        for &o in objects {
            let obj = &mut self.objects[o as usize];
            obj.users = obj.users.saturating_sub(1);
            if obj.users == 0 {
                self.release(o);
            }
        }
    }

    /// Lets go of an object's descriptor when no live process maps it
    /// (a machine that runs many programs would hold thousands), where the
    /// file can be found again: its path still leads to it (same device
    /// and inode). A file deleted or replaced since, or in another mount
    /// namespace, keeps its descriptor: it is the only way to its names.
    fn release(&mut self, id: u32) {
        use std::os::unix::fs::MetadataExt;
        let o = &mut self.objects[id as usize];
        let (Some(_), Some((path, dev, ino))) = (&o.handle, &o.mapped) else {
            return;
        };
        if !std::fs::metadata(path).is_ok_and(|m| m.dev() == *dev && m.ino() == *ino) {
            return;
        }
        if o.path_is_handle {
            o.path = Some(path.clone());
            o.path_is_handle = false;
        }
        o.handle = None;
        self.released += 1;
    }

    /// How many descriptors of files no live process maps were let go.
    pub fn released(&self) -> usize {
        self.released
    }

    /// The index of the object `line` maps, opening its file the first
    /// time it is seen.
    fn object(&mut self, tgid: u32, line: &MapsLine<'_>) -> u32 {
        if let Some(&id) = self.object_ids.get(&line.key) {
            // Mapped again after its descriptor was let go: the unwinder
            // may need the file.
            let o = &mut self.objects[id as usize];
            if o.handle.is_none() && o.mapped.is_some() {
                if let Ok(f) = open_mapped(tgid, line) {
                    if !o.path_is_handle && o.segments.is_none() {
                        o.path = Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())));
                        o.path_is_handle = true;
                    }
                    o.handle = Some(f);
                }
            }
            return id;
        }
        let name = Path::new(line.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|_| line.path.starts_with('/'))
            .unwrap_or_else(|| match &line.key {
                ObjectKey::Pseudo(n) => n.clone(),
                ObjectKey::File { .. } => line.path.to_string(),
            });
        let (path, segments, handle) = match line.key {
            ObjectKey::Pseudo(ref n) if n == "[vdso]" => match vdso_copy() {
                Some(f) => (
                    Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
                    None,
                    Some(f),
                ),
                None => (None, None, None),
            },
            ObjectKey::Pseudo(_) => (None, None, None),
            ObjectKey::File { .. } => {
                let (path, handle) = match open_mapped(tgid, line) {
                    Ok(f) => (
                        PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
                        Some(f),
                    ),
                    Err(e) => {
                        self.denied
                            .files
                            .push((line.path.to_string(), e.to_string()));
                        // The path as mapped, for the names at least.
                        (PathBuf::from(line.path), None)
                    }
                };
                // A debug file's own segments need not point at its
                // contents: addresses are worked out in the file itself.
                let debug = debug_file(&path).and_then(|d| {
                    let segments = match &handle {
                        Some(f) => load_segments(f),
                        None => load_segments(&File::open(&path).ok()?),
                    }?;
                    Some((d, segments))
                });
                match debug {
                    Some((d, segments)) => (Some(d), Some(segments), handle),
                    None => (Some(path), None, handle),
                }
            }
        };
        let mapped = handle.as_ref().and_then(|f| {
            use std::os::unix::fs::MetadataExt;
            let m = f.metadata().ok()?;
            (line.path.starts_with('/') && !line.path.ends_with(" (deleted)"))
                .then(|| (PathBuf::from(line.path), m.dev(), m.ino()))
        });
        let path_is_handle = segments.is_none() && handle.is_some();
        let id = self.objects.len() as u32;
        self.objects.push(Object {
            name,
            maps_path: line.path.to_string(),
            path,
            segments,
            handle,
            mapped,
            path_is_handle,
            users: 0,
        });
        self.object_ids.insert(line.key.clone(), id);
        id
    }

    /// Reads live process `tgid`'s perf map again, if it has one and it
    /// changed.
    fn read_perf_map(&mut self, tgid: u32) {
        let Some(&start) = self.starts.get(&tgid) else {
            return;
        };
        let p = Proc { tgid, start };
        match crate::jit::read(tgid, self.perf_maps.get(&p)) {
            Ok(Some(map)) => {
                self.perf_maps.insert(p, map);
            }
            Ok(None) | Err(crate::jit::Refused::Absent) => {}
            Err(crate::jit::Refused::Unsafe(why)) => {
                if !self.perf_maps_refused.contains(&why) {
                    self.perf_maps_refused.push(why);
                }
            }
        }
    }

    /// The name of a JIT-compiled function at `addr` in process `p`, from
    /// its perf map, for a frame outside every file (`frame`): the name
    /// the map gives, and with `-s` its offset and size, `[jit]` as the
    /// module.
    pub fn jit_name(&self, p: Proc, frame: UserFrame, addr: u64, kind: AddrKind) -> Option<Named> {
        let map = self.perf_maps.get(&p)?;
        if let UserFrame::File { object, .. } = frame {
            let o = &self.objects[object as usize];
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
            name: name.to_string(),
            shown,
        })
    }

    /// What the perf maps read cost: refused files, lines skipped, maps
    /// cut at their size limit; one line each, for stderr.
    pub fn jit_notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .perf_maps_refused
            .iter()
            .map(|why| format!("a JIT perf map was not read: {why}; its frames are unnamed"))
            .collect();
        let bad: usize = self.perf_maps.values().map(|m| m.bad_lines).sum();
        if bad > 0 {
            notes.push(format!(
                "{bad} lines of JIT perf maps did not parse and were skipped"
            ));
        }
        let cut = self.perf_maps.values().filter(|m| m.truncated).count();
        if cut > 0 {
            notes.push(format!(
                "{cut} JIT perf maps were larger than {} MiB: only their start was read",
                crate::jit::MAX_BYTES >> 20
            ));
        }
        notes
    }

    /// How frames are written.
    pub fn options(&self) -> SymbolizeOptions {
        self.opts
    }

    /// What could not be read for want of privilege.
    pub fn denied(&self) -> &Denied {
        &self.denied
    }

    /// How many files' symbols could not be parsed at all.
    pub fn unparsable(&self) -> usize {
        self.hostile.get()
    }

    /// The executable mappings of `tgid` as last snapshotted, sorted by
    /// start address.
    pub fn mappings(&self, tgid: u32) -> Vec<ExecMapping> {
        let mut out: Vec<ExecMapping> = self
            .processes
            .get(&tgid)
            .map(|ms| {
                ms.iter()
                    .map(|m| ExecMapping {
                        start: m.start,
                        end: m.end,
                        file_offset: m.file_offset,
                        object: m.object,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable_by_key(|m| m.start);
        out
    }

    /// The file an object maps (the file itself, not its debug file),
    /// open, if it could be opened.
    pub fn object_file(&self, object: u32) -> Option<&File> {
        self.objects.get(object as usize)?.handle.as_ref()
    }

    /// The object's path as mapped and its build id, for outputs that
    /// name the files frames are in.
    pub fn object_info(&self, object: u32) -> crate::profile::ObjectInfo {
        let Some(o) = self.objects.get(object as usize) else {
            return Default::default();
        };
        // The descriptor where it is held, else the path it was read
        // from (a separate debug file has the same build id).
        let from = match &o.handle {
            Some(f) => Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
            None => o.path.clone(),
        };
        let build_id = from
            .and_then(|p| {
                // The parser may panic on a malformed file: then there is
                // no id.
                std::panic::catch_unwind(|| blazesym::helper::read_elf_build_id(&p))
                    .ok()?
                    .ok()?
            })
            .map(|id| id.to_vec())
            .unwrap_or_default();
        crate::profile::ObjectInfo {
            // A mapping without a file (JIT code) by its kind, `anon`.
            path: if o.maps_path.is_empty() {
                o.name.clone()
            } else {
                o.maps_path.clone()
            },
            build_id,
        }
    }

    /// The object's file name, for messages.
    pub fn object_name(&self, object: u32) -> &str {
        self.objects
            .get(object as usize)
            .map_or("?", |o| o.name.as_str())
    }

    /// Reads the kernel's symbols now (reading kallsyms takes 50 to 100
    /// ms, most of it the kernel's), so that the report at the end does not
    /// wait for it.
    pub fn warm_up_kernel(&self) {
        self.kernel_symbols();
    }

    /// The kernel's symbols, read the first time. Says once on stderr why
    /// kernel frames will be `[unknown]`, if they will.
    fn kernel_symbols(&self) -> Option<&KernelSymbols> {
        self.kernel
            .get_or_init(|| match KernelSymbols::load() {
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
            })
            .as_ref()
    }

    /// Names of kernel frames, from kallsyms only: a vmlinux image's
    /// DWARF would cost more than it adds for function names.
    pub fn kernel(&self, addrs: &[(u64, AddrKind)]) -> HashMap<(u64, AddrKind), Vec<Named>> {
        if addrs.is_empty() {
            return HashMap::new();
        }
        let table = self.kernel_symbols();
        self.resolve(
            addrs,
            |lookup| {
                lookup
                    .iter()
                    .map(|&addr| {
                        let sym = table?.resolve(addr)?;
                        Some(Resolved {
                            name: sym.name.to_string(),
                            offset: sym.offset,
                            size: sym.size,
                            module: Some(sym.module.unwrap_or("kernel").to_string()),
                            location: String::new(),
                            inlined: Vec::new(),
                        })
                    })
                    .collect()
            },
            |_| None,
        )
    }

    /// Process `tgid` has exited: its counted user `stacks` (stack id and
    /// addresses, innermost first) are kept as frames of objects, and its
    /// snapshot is let go. What is kept grows with the distinct stacks
    /// counted, not with the processes seen: the same stack of another
    /// process of the same program is stored once.
    pub fn retire(&mut self, p: Proc, stacks: &[(u64, Vec<u64>)]) {
        let tgid = p.tgid;
        let mappings = if self.starts.get(&tgid).is_none_or(|&s| s == p.start) {
            self.starts.remove(&tgid);
            self.processes.remove(&tgid)
        } else {
            self.superseded.remove(&p)
        };
        let Some(mappings) = mappings else {
            return;
        };
        self.drop_users(&distinct_objects(&mappings));
        for (id, addrs) in stacks {
            // An address outside every mapping is `[unknown]` whatever
            // it is: kept as one, so that such stacks of different
            // processes are kept once too.
            let frames: std::rc::Rc<[UserFrame]> = addrs
                .iter()
                .map(|&a| match user_frame(&mappings, a) {
                    UserFrame::Unmapped(_) => UserFrame::Unmapped(0),
                    f => f,
                })
                .collect();
            let next = self.retired_stacks.len() as u32;
            let index = *self.retired_ids.entry(frames.clone()).or_insert(next);
            if index == next {
                self.retired_stacks.push(frames);
            }
            self.retired.push(tgid, retired_id(*id, p.start), index);
        }
    }

    /// The processes with a snapshot (not retired), with their start
    /// time where known.
    pub fn processes(&self) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
        self.processes
            .keys()
            .map(|&t| (t, self.starts.get(&t).copied()))
            .chain(self.superseded.keys().map(|p| (p.tgid, Some(p.start))))
    }

    /// Whether some process at pid `tgid` still has a snapshot.
    pub fn has_pid(&self, tgid: u32) -> bool {
        self.processes.contains_key(&tgid)
    }

    /// The frames of user stack `id` of process `tgid` (its addresses
    /// `addrs`, innermost first): as kept when the process exited, or
    /// through its snapshot, taken again now if it is still running, for
    /// libraries loaded since.
    pub fn user_frames(&mut self, p: Proc, id: u64, addrs: &[u64]) -> Vec<UserFrame> {
        let tgid = p.tgid;
        if let Some(i) = self.retired.get(tgid, retired_id(id, p.start)) {
            return self.retired_stacks[i as usize].to_vec();
        }
        let mappings = if self.starts.get(&tgid).is_none_or(|&s| s == p.start) {
            if self.refreshed.insert(tgid) && crate::process::start_ticks(tgid) == Some(p.start) {
                self.refresh_process(tgid);
            }
            self.processes.get(&tgid)
        } else {
            // A process whose pid was taken by another.
            self.superseded.get(&p)
        };
        let mappings = mappings.map_or(&[][..], Vec::as_slice);
        addrs.iter().map(|&a| user_frame(mappings, a)).collect()
    }

    /// Names of user frames of process `tgid`, through its snapshot (taken
    /// again now if it is still running).
    pub fn user(
        &mut self,
        tgid: u32,
        addrs: &[(u64, AddrKind)],
    ) -> HashMap<(u64, AddrKind), Vec<Named>> {
        if process_alive(tgid) {
            self.refresh_process(tgid);
        }
        let mappings = self.processes.get(&tgid).cloned().unwrap_or_default();
        let frames: Vec<(UserFrame, AddrKind)> = addrs
            .iter()
            .map(|&(a, k)| (user_frame(&mappings, a), k))
            .collect();
        let names = self.user_names(&frames);
        addrs
            .iter()
            .zip(&frames)
            .map(|(&a, f)| (a, names.get(f).cloned().unwrap_or_default()))
            .collect()
    }

    /// Names of user frames: by file offset, looked up object by object
    /// in the files' symbol tables (and DWARF, for inlined functions and
    /// lines, where asked for); `[file+0xoffset]` where no symbol covers
    /// the offset, `[unknown]` outside every mapping.
    pub fn user_names(
        &self,
        frames: &[(UserFrame, AddrKind)],
    ) -> HashMap<(UserFrame, AddrKind), Vec<Named>> {
        let Some(kept) = &self.user_names_kept else {
            return self.find_user_names(frames);
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
        let found = self.find_user_names(&missing);
        kept.borrow_mut()
            .extend(found.iter().map(|(k, v)| (*k, v.clone())));
        known.extend(found);
        known
    }

    fn find_user_names(
        &self,
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
        for (object, (idx, offsets)) in by_object {
            for (i, r) in idx.into_iter().zip(self.by_file_offset(object, &offsets)) {
                found[i] = r;
            }
            crate::give_back_freed_memory();
        }
        unique
            .iter()
            .zip(found)
            .map(|(&(f, kind), r)| {
                let names = match (r, f) {
                    (Some(mut r), UserFrame::File { object, offset }) => {
                        r.module = Some(self.objects[object as usize].name.clone());
                        self.frames_of(r, offset - lookup_at(offset, kind))
                    }
                    (None, UserFrame::File { object, offset }) => vec![Named::plain(format!(
                        "[{}+{offset:#x}]",
                        self.objects[object as usize].name
                    ))],
                    _ => vec![Named::plain("[unknown]".to_string())],
                };
                ((f, kind), names)
            })
            .collect()
    }

    /// Symbols of file offsets of one object. The file's symbol tables and
    /// DWARF are parsed by a symbolizer of its own, dropped after: what is
    /// resident at once is one object's, not every object's.
    fn by_file_offset(&self, object: u32, offsets: &[u64]) -> Vec<Option<Resolved>> {
        let object = &self.objects[object as usize];
        let Some(path) = &object.path else {
            return vec![None; offsets.len()];
        };
        // A file found again by its path must still be the one mapped.
        let reopened;
        let path = match (&object.handle, &object.mapped) {
            (None, Some((p, dev, ino))) if path == p => {
                use std::os::unix::fs::MetadataExt;
                match File::open(p) {
                    Ok(f)
                        if f.metadata()
                            .is_ok_and(|m| m.dev() == *dev && m.ino() == *ino) =>
                    {
                        reopened = f;
                        PathBuf::from(format!("/proc/self/fd/{}", reopened.as_raw_fd()))
                    }
                    _ => return vec![None; offsets.len()],
                }
            }
            _ => path.clone(),
        };
        names_in_file(&path, object.segments.as_deref(), offsets, self.opts).unwrap_or_else(|| {
            self.hostile.set(self.hostile.get() + 1);
            vec![None; offsets.len()]
        })
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
        frames.push(Named { name, shown });
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

fn blazesym_symbolizer(opts: SymbolizeOptions) -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        // blazesym reports inlined functions only with source locations
        // on.
        .enable_code_info(opts.lines || opts.inline)
        .enable_inlined_fns(opts.inline)
        .enable_demangling(true)
        .build()
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
    std::panic::catch_unwind(|| {
        let inner = blazesym_symbolizer(opts);
        let symbolize = |debug_syms: bool| {
            let mut elf = Elf::new(path);
            elf.debug_syms = debug_syms;
            let src = Source::Elf(elf);
            match segments {
                None => inner.symbolize(&src, Input::FileOffset(offsets)),
                Some(segments) => {
                    let addrs: Vec<u64> = offsets
                        .iter()
                        .map(|&o| {
                            segments
                                .iter()
                                .find(|s| o >= s.offset && o - s.offset < s.filesz)
                                .map_or(u64::MAX, |s| (o - s.offset).wrapping_add(s.vaddr))
                        })
                        .collect();
                    inner.symbolize(&src, Input::VirtOffset(&addrs))
                }
            }
        };
        // Function names from the symbol tables: fully qualified, where
        // DWARF can have a bare name (Rust at debuginfo=line-tables-only).
        let mut found = resolved(symbolize(false), offsets.len(), false);
        // DWARF only for what the symbol tables lack: inlined functions
        // and source lines.
        if opts.inline || opts.lines {
            let dwarf = resolved(symbolize(true), offsets.len(), opts.lines);
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

/// The objects `mappings` map, each once.
fn distinct_objects(mappings: &[Mapping]) -> Vec<u32> {
    let mut v: Vec<u32> = mappings.iter().map(|m| m.object).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `addr` as a frame of the mapping that holds it.
fn user_frame(mappings: &[Mapping], addr: u64) -> UserFrame {
    match mappings.iter().find(|m| addr >= m.start && addr < m.end) {
        Some(m) => UserFrame::File {
            object: m.object,
            offset: (addr - m.start).wrapping_add(m.file_offset),
        },
        None => UserFrame::Unmapped(addr),
    }
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

/// (name, offset of the address into the symbol) of each result, `len`
/// of them.
fn resolved(
    results: blazesym::Result<Vec<Symbolized<'_>>>,
    len: usize,
    lines: bool,
) -> Vec<Option<Resolved>> {
    let location = |c: Option<&CodeInfo<'_>>| match c {
        Some(c) if lines => {
            let file = Path::new(&c.file)
                .file_name()
                .unwrap_or(&c.file)
                .to_string_lossy();
            match c.line {
                Some(l) => format!(" ({file}:{l})"),
                None => format!(" ({file})"),
            }
        }
        _ => String::new(),
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

    #[test]
    fn maps_lines_keep_executable_mappings_and_whole_paths() {
        let text = "\
55d0c0a00000-55d0c0a20000 r--p 00000000 fe:01 1234 /usr/bin/prog
55d0c0a20000-55d0c0a80000 r-xp 00020000 fe:01 1234 /usr/bin/prog
7f0000000000-7f0000100000 r-xp 00028000 fe:01 99 /opt/my app/lib two.so (deleted)
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 [vdso]
7f0000300000-7f0000310000 rwxp 00000000 00:00 0
";
        let lines = parse_maps(text);
        assert_eq!(lines.len(), 4);
        assert_eq!(
            (lines[0].start, lines[0].end, lines[0].file_offset),
            (0x55d0c0a20000, 0x55d0c0a80000, 0x20000)
        );
        assert!(
            lines[0].key
                == ObjectKey::File {
                    dev: "fe:01".into(),
                    inode: 1234
                }
        );
        assert_eq!(lines[0].range, "55d0c0a20000-55d0c0a80000");
        assert_eq!(lines[1].path, "/opt/my app/lib two.so (deleted)");
        assert!(lines[2].key == ObjectKey::Pseudo("[vdso]".into()));
        assert!(lines[3].key == ObjectKey::Pseudo("anon".into()));
    }

    #[test]
    fn vdso_frames_are_named() {
        // Where __vdso_clock_gettime is in the copy, then in this process.
        let copy = vdso_copy().expect("a vDSO");
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
        let vdso = parse_maps(&maps)
            .into_iter()
            .find(|l| l.key == ObjectKey::Pseudo("[vdso]".into()))
            .unwrap();
        let addr = vdso.start + offset + 4;
        let me = std::process::id();
        let mut sym = Symbolizer::new(SymbolizeOptions::default());
        sym.note_process(me, None, false);
        let names = sym.user(me, &[(addr, AddrKind::Ip)]);
        let frames = &names[&(addr, AddrKind::Ip)];
        assert!(
            frames
                .last()
                .is_some_and(|f| f.name.contains("clock_gettime")),
            "{frames:?}"
        );
    }

    #[test]
    fn debug_files_are_found_by_build_id() {
        let exe = Path::new("/proc/self/exe");
        // The build id as binutils reads it, not through the library the
        // code uses.
        let me = std::env::current_exe().unwrap();
        let out = match std::process::Command::new("readelf")
            .arg("-n")
            .arg(&me)
            .output()
        {
            Ok(out) => out,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: readelf: {e}");
                return;
            }
            Err(e) => panic!("readelf: {e}"),
        };
        let notes = String::from_utf8_lossy(&out.stdout);
        let hex = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .expect("the test binary has a build id")
            .trim()
            .to_string();
        let dir = tempfile::tempdir().unwrap();
        assert!(debug_file_in(dir.path(), exe).is_none(), "not installed");
        let want = dir
            .path()
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        std::fs::create_dir_all(want.parent().unwrap()).unwrap();
        std::fs::write(&want, b"").unwrap();
        assert_eq!(debug_file_in(dir.path(), exe), Some(want));
        // No build id, no debug file.
        assert!(debug_file_in(dir.path(), Path::new("/proc/self/maps")).is_none());
    }
}
