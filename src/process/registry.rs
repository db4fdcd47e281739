//! What the profiler knows of each process: its executable mappings, the
//! files they map (opened once each, shared by every process that maps
//! them, found by device and inode), their build ids and debug files, its
//! JIT perf map, and the user stacks kept for it once it has exited.
//! The unwinder builds its tables from it and the symbolizer names frames
//! through it.
//!
//! A process's mappings are snapshotted the first time it is seen
//! blocking, and again when they change (see [`Registry::note_process`]),
//! so that its frames are still named if it exits before tracing ends. The
//! snapshot is small: each mapping refers to a file by index, and each
//! distinct file is opened once, through the process's
//! `/proc/PID/map_files` where allowed (files in other mount namespaces,
//! or deleted since, still resolve), else as the process sees it.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::maps::{
    debug_file, open_mapped, parse_maps, process_alive, vdso_copy, MapsLine, ObjectKey,
};
use super::Proc;
use crate::elf::{load_segments, Segment};

/// One executable mapping of a process.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into `Registry::objects`.
    object: u32,
}

/// What a mapping maps: a file, or something without one (`[vdso]`, an
/// anonymous JIT region).
pub(crate) struct Object {
    /// File name for unnamed frames: `[libfoo.so+0x1234]`.
    pub(crate) name: String,
    /// The path as the maps give it (`[vdso]`, `anon` for mappings
    /// without a file): what the profile says the frames are in.
    pub(crate) maps_path: String,
    /// Where blazesym reads the symbols: the file's separate debug file
    /// if one is installed (found by build id), else the file itself,
    /// through `/proc/self/fd/N` of the handle below, or the path in the
    /// maps if it could not be opened.
    pub(crate) path: Option<PathBuf>,
    /// With a debug file: the loadable segments of the file itself, to
    /// turn file offsets into the addresses both files share.
    pub(crate) segments: Option<Vec<Segment>>,
    /// The file as mapped, kept open while a process maps it (see
    /// [`Registry::release`]).
    pub(crate) handle: Option<File>,
    /// The path as mapped and the file's device and inode: where to find
    /// the file again once its descriptor was let go.
    pub(crate) mapped: Option<(PathBuf, u64, u64)>,
    /// `path` is the descriptor's `/proc/self/fd/N`; once the descriptor
    /// is let go, it is `mapped`'s path, checked to be the same file
    /// before it is read.
    path_is_handle: bool,
    /// Snapshots (of live processes, or kept for one whose pid was reused)
    /// that map it.
    users: u32,
    /// How the kernel knows the file mapped (see [`FileIdentity`]), where
    /// it could be opened.
    identity: Option<FileIdentity>,
}

/// A mapped file as the kernel knows it: its filesystem's device in the
/// kernel's encoding (major << 20 | minor, as `/proc/PID/maps` shows it
/// split), its inode number, and its size when it was opened. The vDSO is
/// device 0, inode 0 (see `struct unwind_file_key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// The kernel's encoding of a device given as `/proc/PID/maps` shows it
/// (hexadecimal major:minor).
fn kernel_dev(maps_dev: &str) -> Option<u64> {
    let (major, minor) = maps_dev.split_once(':')?;
    let major = u64::from_str_radix(major, 16).ok()?;
    let minor = u64::from_str_radix(minor, 16).ok()?;
    (major < 1 << 12 && minor < 1 << 20).then_some(major << 20 | minor)
}

/// An executable mapping of a process, as [`Registry::mappings`] gives
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The object mapped: see [`Registry::object_file`].
    pub object: u32,
}

/// A frame of a user stack, independent of where its object was mapped:
/// the object and the file offset, or, outside every mapping known, the
/// address itself; or where a signal handler was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserFrame {
    File {
        object: u32,
        offset: u64,
    },
    Unmapped(u64),
    /// [`crate::unwind_table::SIGNAL_FRAME`]: the signal trampoline, as
    /// the DWARF unwinder leaves it in a stack. The frame after it is the
    /// interrupted code's pc, not a return address.
    Signal,
    /// A Python function: its code object (by its index in the
    /// registry, see [`Registry::python_code`]) and the instruction it
    /// was at (see [`crate::python::Code::line`]).
    Python {
        code: u32,
        instr: u32,
    },
    /// A Python frame that could not be read, or whose code object was
    /// gone (or another in its place) when it was to be named.
    PythonUnreadable,
    /// The Python frames went on beyond the walk's room.
    PythonCutShort,
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

/// Every process seen, and the files they map.
pub struct Registry {
    /// Executable mappings by process, as last seen, while it lives.
    processes: HashMap<u32, Vec<Mapping>>,
    /// When each process in `processes` started, where known: its pid may
    /// be reused by another process.
    starts: HashMap<u32, u64>,
    /// Snapshots of processes whose pid another process took before they
    /// were let go.
    superseded: HashMap<Proc, Vec<Mapping>>,
    /// The user stacks counted for processes that have exited (see
    /// [`Registry::retire`]), by (tgid, stack id): an index into
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
    /// What could not be read for want of privilege, for the one line
    /// that says so at the end.
    denied: Denied,
    /// Descriptors let go (see [`Registry::release`]).
    released: usize,
    /// JIT runtimes' perf maps (`/tmp/perf-PID.map`), as last read while
    /// their process lived.
    perf_maps: HashMap<Proc, crate::jit::PerfMap>,
    /// Perf maps refused (a link, another user's file), once each.
    perf_maps_refused: Vec<String>,
    /// Mappings found replaced by another file at an overlapping address.
    replaced: Replaced,
    /// Forked processes whose snapshot is still their parent's (see
    /// [`Registry::forked`]): read again at their first notice.
    inherited: HashSet<u32>,
    /// CPython interpreters, processes and code objects.
    py: super::python::Pythons,
    /// The cgroup and container of each process, read when it is first
    /// noted (at its first block) and again when its mappings change (an
    /// exec: a process moved into a cgroup before it execs, as
    /// `systemd-run` and runtimes do).
    containers: HashMap<Proc, std::sync::Arc<crate::container::Container>>,
    /// Each distinct container once: processes share it.
    container_set: HashSet<std::sync::Arc<crate::container::Container>>,
    /// Pids of processes in their own pid namespace, where they differ.
    namespace_pids: HashMap<Proc, u32>,
}

/// Mappings of a process replaced by another file's at an overlapping
/// address (an exec, a library closed and another opened in its place):
/// how many, and the first (pid, object before, object after).
#[derive(Default)]
struct Replaced {
    count: usize,
    example: Option<(u32, u32, u32)>,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            processes: HashMap::new(),
            starts: HashMap::new(),
            superseded: HashMap::new(),
            retired: RetiredList::default(),
            retired_stacks: Vec::new(),
            retired_ids: HashMap::new(),
            refreshed: HashSet::new(),
            objects: Vec::new(),
            object_ids: HashMap::new(),
            denied: Denied::default(),
            released: 0,
            perf_maps: HashMap::new(),
            perf_maps_refused: Vec::new(),
            replaced: Replaced::default(),
            inherited: HashSet::new(),
            py: Default::default(),
            containers: HashMap::new(),
            container_set: HashSet::new(),
            namespace_pids: HashMap::new(),
        }
    }

    /// The cgroup and container of process `p`: as read at its first
    /// block, or (a process never noted, as with `-K`, where no process's
    /// mappings are read) now, if it is still the process at that pid.
    pub fn container(&mut self, p: Proc) -> Option<std::sync::Arc<crate::container::Container>> {
        if let Some(c) = self.containers.get(&p) {
            return Some(c.clone());
        }
        if crate::process::start_ticks(p.tgid) != Some(p.start) {
            return None;
        }
        self.note_place(p, false);
        self.containers.get(&p).cloned()
    }

    /// The processes whose pid in their own pid namespace differs from
    /// their pid: (pid, pid in the namespace), in pid order.
    pub fn namespace_pids(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .namespace_pids
            .iter()
            .map(|(p, &n)| (p.tgid, n))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Reads where a process just noted is: its cgroup (it may move later;
    /// it is counted where it was first seen) and its namespace pid.
    fn note_place(&mut self, p: Proc, again: bool) {
        if !again && self.containers.contains_key(&p) {
            return;
        }
        if let Some(c) = crate::container::of_process(p.tgid) {
            let c = match self.container_set.get(&c) {
                Some(known) => known.clone(),
                None => {
                    let c = std::sync::Arc::new(c);
                    self.container_set.insert(c.clone());
                    c
                }
            };
            self.containers.insert(p, c);
        }
        if let Some(n) = crate::container::namespace_pid(p.tgid) {
            self.namespace_pids.insert(p, n);
        }
    }

    /// Snapshots what is needed to symbolize `tgid` later, even after it
    /// exits.  Cheap to call again for a known process, unless `changed`
    /// says that its mappings have.
    /// `start`: when the process started, where known (the BPF program's
    /// events say it); otherwise `/proc` is asked. Returns whether the
    /// snapshot held is of the process as it is now (false where it was
    /// gone, or is another process now, and what was had is kept).
    pub fn note_process(&mut self, tgid: u32, start: Option<u64>, changed: bool) -> bool {
        if tgid == 0 {
            return false;
        }
        let inherited = self.inherited.remove(&tgid);
        let changed = inherited || changed;
        let now = crate::process::start_ticks(tgid);
        let start = start.or(now);
        let Some(start) = start else {
            // Gone: keep what we had.
            self.processes.entry(tgid).or_default();
            return false;
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
            Some(_) if !changed => return true,
            None if !changed && self.processes.contains_key(&tgid) => return true,
            _ => {}
        }
        // The event may be older than the process now at this pid.
        if now != Some(start) {
            return false;
        }
        self.starts.insert(tgid, start);
        self.note_place(Proc { tgid, start }, changed);
        self.refresh_process(tgid, inherited)
    }

    /// `inherited`: the snapshot held is the parent's (see
    /// [`Registry::forked`]), which an exec since replaces without a
    /// stack of this process having been taken through it, as a rule.
    /// Returns whether the mappings could be read.
    fn refresh_process(&mut self, tgid: u32, inherited: bool) -> bool {
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
                return false;
            }
        };
        let mut mappings = Vec::new();
        for line in parse_maps(&text) {
            let object = self.object_of(tgid, &line);
            mappings.push(Mapping {
                start: line.start,
                end: line.end,
                file_offset: line.file_offset,
                object,
            });
        }
        // A zombie's maps are empty: what is kept is not of it as it is.
        let read = !mappings.is_empty();
        // What was seen before stays where nothing new overlaps it: a
        // library unloaded since, the image before an exec(), everything
        // of a zombie (whose maps are empty) still names earlier stacks.
        if let Some(old) = self.processes.get(&tgid) {
            // Another file where one was mapped: the stacks taken before
            // are named through the later one where they overlap.
            for n in mappings.iter().filter(|_| !inherited) {
                if let Some(o) = old
                    .iter()
                    .find(|o| n.start < o.end && o.start < n.end && o.object != n.object)
                {
                    self.replaced.count += 1;
                    self.replaced
                        .example
                        .get_or_insert((tgid, o.object, n.object));
                }
            }
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
        read
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
    fn object_of(&mut self, tgid: u32, line: &MapsLine<'_>) -> u32 {
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
        let identity = match &line.key {
            ObjectKey::File { dev, inode } => {
                let size = handle
                    .as_ref()
                    .and_then(|f| f.metadata().ok())
                    .map(|m| m.len());
                kernel_dev(dev).zip(size).map(|(dev, size)| FileIdentity {
                    dev,
                    ino: *inode,
                    size,
                })
            }
            ObjectKey::Pseudo(n) if n == "[vdso]" && handle.is_some() => Some(FileIdentity {
                dev: 0,
                ino: 0,
                size: 0,
            }),
            ObjectKey::Pseudo(_) => None,
        };
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
            identity,
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

    /// What could not be read for want of privilege.
    pub fn denied(&self) -> &Denied {
        &self.denied
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
    pub fn object_info(&self, object: u32) -> super::ObjectInfo {
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
        super::ObjectInfo {
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
    /// How the kernel knows the file `object` maps, where it could be
    /// opened.
    pub fn object_identity(&self, object: u32) -> Option<FileIdentity> {
        self.objects.get(object as usize).and_then(|o| o.identity)
    }

    pub fn object_name(&self, object: u32) -> &str {
        self.objects
            .get(object as usize)
            .map_or("?", |o| o.name.as_str())
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
            self.inherited.remove(&tgid);
            self.processes.remove(&tgid)
        } else {
            self.superseded.remove(&p)
        };
        let Some(mappings) = mappings else {
            return;
        };
        self.drop_users(&distinct_objects(&mappings));
        for (id, addrs) in stacks {
            self.resolve_python(p, addrs);
            // An address outside every mapping is `[unknown]` whatever
            // it is: kept as one, so that such stacks of different
            // processes are kept once too.
            let frames: std::rc::Rc<[UserFrame]> = stack_frames(&mappings, &self.py, p, addrs)
                .into_iter()
                .map(|f| match f {
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
        self.py.exited(p);
    }

    /// Process `child` was forked by `parent`: it maps what its parent
    /// maps, so its parent's snapshot stands for its own until that is
    /// read, at its first notice. A child that exits before it is noted
    /// (a short-lived worker) still has its frames named.
    pub fn forked(&mut self, parent: u32, child: Proc) {
        // The child is where its parent is until it moves (read again at
        // its first notice).
        let parent_proc = self.starts.get(&parent).map(|&start| Proc {
            tgid: parent,
            start,
        });
        if let Some(c) = parent_proc.and_then(|p| self.containers.get(&p).cloned()) {
            self.containers.entry(child).or_insert(c);
        }
        let Some(mappings) = self.processes.get(&parent).filter(|m| !m.is_empty()) else {
            return;
        };
        let mappings = mappings.clone();
        let tgid = child.tgid;
        // What is kept for an earlier process at this pid stays apart, for
        // the stacks counted for it.
        if let Some(old) = self.starts.remove(&tgid) {
            if let Some(m) = self.processes.remove(&tgid) {
                if old != child.start {
                    self.superseded.insert(Proc { tgid, start: old }, m);
                } else {
                    self.drop_users(&distinct_objects(&m));
                }
            }
        } else if let Some(m) = self.processes.remove(&tgid) {
            self.drop_users(&distinct_objects(&m));
        }
        for &o in &distinct_objects(&mappings) {
            self.objects[o as usize].users += 1;
        }
        self.starts.insert(tgid, child.start);
        self.processes.insert(tgid, mappings);
        self.inherited.insert(tgid);
        self.py.forked(parent, child);
    }

    /// A stack of process `p` was walked through the files it maps before
    /// its own mappings were read (see `struct mapped_event`): the
    /// mappings the walk went through, where they are not in its snapshot
    /// yet, name its frames even if it is gone before its mappings can be
    /// read. The snapshot is read again at the process's next notice, as a
    /// forked child's is.
    pub fn note_mapped(&mut self, p: Proc, vmas: &[crate::raw::MappedVma]) {
        if self.starts.get(&p.tgid).is_some_and(|&s| s != p.start) {
            return;
        }
        let had = self
            .processes
            .get(&p.tgid)
            .map(|m| distinct_objects(m))
            .unwrap_or_default();
        let mut add: Vec<Mapping> = Vec::new();
        for v in vmas {
            let key = if v.dev == 0 && v.ino == 0 {
                ObjectKey::Pseudo("[vdso]".into())
            } else {
                ObjectKey::File {
                    dev: format!("{:02x}:{:02x}", v.dev >> 20, v.dev & 0xfffff),
                    inode: v.ino,
                }
            };
            let Some(&object) = self.object_ids.get(&key) else {
                continue;
            };
            let overlaps = |m: &Mapping| v.start < m.end && m.start < v.end;
            let known = self
                .processes
                .get(&p.tgid)
                .is_some_and(|m| m.iter().any(overlaps));
            if known || add.iter().any(overlaps) || v.start >= v.end {
                continue;
            }
            add.push(Mapping {
                start: v.start,
                end: v.end,
                file_offset: v.offset,
                object,
            });
        }
        if add.is_empty() {
            return;
        }
        for o in distinct_objects(&add) {
            if had.binary_search(&o).is_err() {
                self.objects[o as usize].users += 1;
            }
        }
        self.starts.entry(p.tgid).or_insert(p.start);
        self.processes.entry(p.tgid).or_default().extend(add);
        self.inherited.insert(p.tgid);
    }

    /// The processes with a snapshot (not retired), with their start
    /// time where known.
    pub fn processes(&self) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
        self.processes
            .keys()
            .map(|&t| (t, self.starts.get(&t).copied()))
            .chain(self.superseded.keys().map(|p| (p.tgid, Some(p.start))))
    }

    /// When the process at pid `tgid` that has a snapshot started, where
    /// known.
    pub fn start_of(&self, tgid: u32) -> Option<u64> {
        self.starts.get(&tgid).copied()
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
        let python = addrs.iter().any(|&a| super::python::is_python_word(a));
        if python {
            self.resolve_python(p, addrs);
        }
        let mappings = match self.user_stack(p, id) {
            StackFrames::Kept(frames) => return frames.to_vec(),
            StackFrames::Mapped(m) if !python => {
                return addrs.iter().map(|&a| m.frame(a)).collect()
            }
            StackFrames::Mapped(m) => m.0.to_vec(),
        };
        stack_frames(&mappings, &self.py, p, addrs)
    }

    /// Reads the code objects the Python frames of `addrs` (a stack of
    /// process `p`) name that were not read yet (their notice was lost),
    /// while the process lives.
    fn resolve_python(&mut self, p: Proc, addrs: &[u64]) {
        let (_, words) = super::python::split(addrs);
        for w in words {
            if w.code != 0 {
                self.py.code(p, w.code, w.tag);
            }
        }
    }

    /// A walk of process `p`'s Python frames met code object `code` with
    /// `tag`: its names are read now, while the process runs.
    pub fn note_python_code(&mut self, p: Proc, code: u64, tag: u32) {
        self.py.code(p, code, tag);
    }

    /// The code object of a [`UserFrame::Python`].
    pub fn python_code(&self, code: u32) -> Option<&crate::python::Code> {
        self.py.code_at(code)
    }

    /// Whether process `p` runs a CPython interpreter whose frames are
    /// read.
    pub fn is_python(&self, p: Proc) -> bool {
        self.py.has_process(p)
    }

    /// Interpreters whose frames are not read, and why: one line each.
    pub fn python_notes(&self) -> &[String] {
        &self.py.unsupported
    }

    pub fn python_stats(&self) -> super::python::PyStats {
        super::python::PyStats {
            unmatched: self.py.unmatched.get(),
            ..self.py.stats
        }
    }

    /// Looks for a CPython interpreter among the objects process `p`
    /// maps (noted first): the BPF program's entry for it (its address
    /// space left to the caller), if it has one whose layout is known.
    pub fn note_python(&mut self, p: Proc) -> Option<crate::bpf::types::py_proc> {
        let mappings = self.processes.get(&p.tgid)?;
        let candidates: Vec<(u32, u64, u64)> = mappings
            .iter()
            .map(|m| (m.object, m.start, m.file_offset))
            .collect();
        for (object, start, file_offset) in candidates {
            let o = &self.objects[object as usize];
            let Some(py) = self.py.object(object, &o.name, o.handle.as_ref()) else {
                continue;
            };
            // The lowest mapping of the object: the first found, as the
            // maps list them by address.
            return self.py.note_process(p, &py, start, file_offset);
        }
        // None (any more: an exec into another program).
        self.py.exited(p);
        None
    }

    /// How the frames of user stack `id` of process `p` are found (see
    /// [`Registry::user_frames`]): kept, or an address at a time through
    /// the process's mappings, which are the same for every stack of the
    /// process.
    pub fn user_stack(&mut self, p: Proc, id: u64) -> StackFrames<'_> {
        let tgid = p.tgid;
        if let Some(i) = self.retired.get(tgid, retired_id(id, p.start)) {
            return StackFrames::Kept(&self.retired_stacks[i as usize]);
        }
        let mappings = if self.starts.get(&tgid).is_none_or(|&s| s == p.start) {
            if self.refreshed.insert(tgid) && crate::process::start_ticks(tgid) == Some(p.start) {
                self.refresh_process(tgid, false);
            }
            self.processes.get(&tgid)
        } else {
            // A process whose pid was taken by another.
            self.superseded.get(&p)
        };
        StackFrames::Mapped(Mappings(mappings.map_or(&[][..], Vec::as_slice)))
    }

    /// Where a process was found to map another file over one it had
    /// mapped before: frames of stacks taken before are named through
    /// the later file there. One line for stderr, if it happened.
    pub fn replaced_note(&self) -> Option<String> {
        let (tgid, before, after) = self.replaced.example?;
        Some(format!(
            "{} executable mappings were replaced by another file at the same addresses while \
             tracing (an exec, or a library closed and another loaded in its place; first: \
             {} by {} in process {tgid}): user frames of stacks taken before a replacement \
             are named, and with DWARF may have been walked, through the later file, and can \
             be wrong there",
            self.replaced.count,
            self.object_name(before),
            self.object_name(after),
        ))
    }

    /// An object, for the symbolizer.
    pub(crate) fn object(&self, object: u32) -> &Object {
        &self.objects[object as usize]
    }

    /// Whether any process has a perf map.
    pub(crate) fn has_perf_maps(&self) -> bool {
        !self.perf_maps.is_empty()
    }

    /// The perf map of process `p`, as last read while it lived.
    pub(crate) fn perf_map(&self, p: Proc) -> Option<&crate::jit::PerfMap> {
        self.perf_maps.get(&p)
    }

    /// The frames of addresses `addrs` of process `tgid` through its
    /// snapshot, taken again first if the process is still running (for
    /// libraries loaded since).
    pub fn frames_now(&mut self, tgid: u32, addrs: &[u64]) -> Vec<UserFrame> {
        if process_alive(tgid) {
            self.refresh_process(tgid, false);
        }
        let mappings = self.processes.get(&tgid).map_or(&[][..], Vec::as_slice);
        addrs.iter().map(|&a| user_frame(mappings, a)).collect()
    }
}

/// The frames of a user stack (see [`Registry::user_stack`]).
pub enum StackFrames<'a> {
    /// Kept when its process exited.
    Kept(&'a [UserFrame]),
    /// Through its process's mappings.
    Mapped(Mappings<'a>),
}

/// The executable mappings of a process.
#[derive(Clone, Copy)]
pub struct Mappings<'a>(&'a [Mapping]);

impl Mappings<'_> {
    /// The frame of address `addr`.
    pub fn frame(&self, addr: u64) -> UserFrame {
        user_frame(self.0, addr)
    }
}

/// The objects `mappings` map, each once.
fn distinct_objects(mappings: &[Mapping]) -> Vec<u32> {
    let mut v: Vec<u32> = mappings.iter().map(|m| m.object).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The frames of stack `addrs` of process `p` through its mappings: its
/// native frames, with the runs of its Python frames in place of their
/// evaluation calls (the code objects they name read before, see
/// [`Registry::resolve_python`]).
fn stack_frames(
    mappings: &[Mapping],
    py: &super::python::Pythons,
    p: Proc,
    addrs: &[u64],
) -> Vec<UserFrame> {
    use super::python::{merge, runs, split, RunFrame};
    let (native, words) = split(addrs);
    let native: Vec<UserFrame> = native.iter().map(|&a| user_frame(mappings, a)).collect();
    let is_eval = |f: &UserFrame| match *f {
        UserFrame::File { object, offset } => {
            py.object_read(object).is_some_and(|o| o.is_eval(offset))
        }
        _ => false,
    };
    if words.is_empty() {
        // A CPython process's stack with the interpreter's frames and
        // none of its Python frames (walked before the interpreter was
        // known, or a thread whose own state was not found).
        if py.has_process(p) && native.iter().any(is_eval) {
            py.unmatched.set(py.unmatched.get() + 1);
        }
        return native;
    }
    let runs: Vec<Vec<UserFrame>> = runs(&words)
        .into_iter()
        .map(|run| {
            run.into_iter()
                .map(|f| match f {
                    RunFrame::Code(w) => match py.known_code(p, w.code, w.tag) {
                        Some(code) if py.code_at(code).is_some() => UserFrame::Python {
                            code,
                            instr: w.instr,
                        },
                        _ => UserFrame::PythonUnreadable,
                    },
                    RunFrame::Unreadable => UserFrame::PythonUnreadable,
                    RunFrame::CutShort => UserFrame::PythonCutShort,
                })
                .collect()
        })
        .collect();
    let (frames, matched) = merge(native, is_eval, runs);
    if !matched {
        py.unmatched.set(py.unmatched.get() + 1);
    }
    frames
}

/// `addr` as a frame of the mapping that holds it.
fn user_frame(mappings: &[Mapping], addr: u64) -> UserFrame {
    match mappings.iter().find(|m| addr >= m.start && addr < m.end) {
        Some(m) => UserFrame::File {
            object: m.object,
            offset: (addr - m.start).wrapping_add(m.file_offset),
        },
        None if addr == crate::unwind_table::SIGNAL_FRAME => UserFrame::Signal,
        None => UserFrame::Unmapped(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Maps `file` executable at `at` (anywhere if null), returning where.
    fn map_exec(file: &File, at: *mut libc::c_void) -> *mut libc::c_void {
        let flags = libc::MAP_PRIVATE | if at.is_null() { 0 } else { libc::MAP_FIXED };
        // SAFETY: a private mapping of a file of ours, at an address we
        // mapped before (MAP_FIXED) or one the kernel picks.
        let p = unsafe {
            libc::mmap(
                at,
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        p
    }

    #[test]
    fn a_file_mapped_over_another_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("liba.so"), dir.path().join("libb.so"));
        std::fs::write(&a, vec![0xc3u8; 4096]).unwrap();
        std::fs::write(&b, vec![0x90u8; 4096]).unwrap();
        let (fa, fb) = (File::open(&a).unwrap(), File::open(&b).unwrap());
        let me = std::process::id();
        let mut reg = Registry::new();
        let at = map_exec(&fa, std::ptr::null_mut());
        reg.note_process(me, None, false);
        assert!(reg.replaced_note().is_none(), "nothing replaced yet");
        // The same size at the same place: what no size or count of the
        // address space tells apart.
        map_exec(&fb, at);
        reg.note_process(me, None, true);
        let note = reg.replaced_note().expect("the replacement is said");
        // SAFETY: the page mapped above, unused since.
        unsafe { libc::munmap(at, 4096) };
        assert!(
            note.starts_with("1 executable mappings") && note.contains("liba.so by libb.so"),
            "{note}"
        );
    }
}
