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
use std::path::PathBuf;

use super::maps::{parse_maps, ObjectKey};
use super::Proc;
use crate::elf::Segment;
use crate::text::{count, noun};

// The submodules reach `process::ObjectInfo` as `super::ObjectInfo`, as
// this file does.
use super::ObjectInfo;
pub use crate::runtime::Kind;

mod frames;
mod objects;
mod runtimes;

use frames::RetiredList;
pub use frames::{before_exec, Mappings, StackFrames};

/// One executable mapping of a process.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into the catalogue of files (`Files::objects`).
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
    /// A frame of a language runtime (see [`crate::runtime`]), named by
    /// [`Registry::runtime_name`].
    Runtime(Kind, crate::runtime::Frame),
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

/// Every process seen, and the files they map: five things kept apart.
pub struct Registry {
    /// Each live process's executable mappings, as last read.
    snapshots: Snapshots,
    /// The files mapped, each opened once.
    files: Files,
    /// The user stacks of processes that have exited.
    retired: Retired,
    /// JIT runtimes' perf maps.
    jit: JitMaps,
    /// What could not be read or was found changed, for stderr.
    notes: Notes,
    /// Language runtimes: their objects, processes and code.
    runtimes: crate::runtime::Runtimes,
    /// Where each process runs: its container and pid namespace.
    places: Places,
    /// The runtimes whose frames are walked (the BPF program's walk, and
    /// so the walk of copied stacks): none until said.
    walked_runtimes: Vec<crate::runtime::Kind>,
    /// The runtimes' processes noted before the window opened (see
    /// [`Registry::note_runtime_at_start`]).
    runtimes_at_start: std::collections::HashSet<Proc>,
}

/// Mapping snapshots of the processes seen.
#[derive(Default)]
struct Snapshots {
    /// Executable mappings by process, as last seen, while it lives.
    processes: HashMap<u32, Vec<Mapping>>,
    /// When each process in `processes` started, where known: its pid may
    /// be reused by another process.
    starts: HashMap<u32, u64>,
    /// Snapshots of processes whose pid another process took before they
    /// were let go.
    superseded: HashMap<Proc, Vec<Mapping>>,
    /// Live processes whose snapshot was taken again for the report.
    refreshed: HashSet<u32>,
    /// Forked processes whose snapshot is still their parent's (see
    /// [`Registry::forked`]): read again at their first notice.
    inherited: HashSet<u32>,
    /// Processes whose snapshot was taken before the trace started (while
    /// the BPF program loaded; see [`Registry::read_before_the_start`]):
    /// read again at their first notice, which comes after it.
    before_start: HashSet<u32>,
    /// Whether the trace has started (the snapshots before it are
    /// [`Snapshots::before_start`]'s).
    started: bool,
    /// The image each process ran when its mappings were read before the
    /// start (see [`Registry::image`]).
    images: HashMap<u32, crate::raw::Image>,
    /// Each process's parent, as the fork said or, failing that, as /proc
    /// said when the process was first noted: a stack taken between a
    /// vfork (posix_spawn) and the exec that followed is in the parent's
    /// address space (see [`Registry::user_stack`]).
    parents: HashMap<Proc, Proc>,
}

/// The catalogue of the files mapped.
#[derive(Default)]
struct Files {
    objects: Vec<Object>,
    /// `objects` indices by (device, inode), or by name for mappings
    /// without a file.
    object_ids: HashMap<ObjectKey, u32>,
    /// Descriptors let go (see [`Registry::release`]).
    released: usize,
}

/// The user stacks counted for processes that have exited (see
/// [`Registry::retire`]).
#[derive(Default)]
struct Retired {
    /// By (tgid, stack id): an index into `stacks`, where stacks alike in
    /// every process of a program are kept once. A list (16 bytes an
    /// entry, sorted when first looked up), not a hash map: it is what
    /// grows with every process that exits.
    list: RetiredList,
    stacks: Vec<std::rc::Rc<[UserFrame]>>,
    ids: HashMap<std::rc::Rc<[UserFrame]>, u32>,
}

/// JIT runtimes' perf maps (`/tmp/perf-PID.map`), as last read while
/// their process lived, and once more after it exited.
#[derive(Default)]
struct JitMaps {
    maps: HashMap<Proc, crate::jit::PerfMap>,
    /// Perf maps refused (a link, another user's file), once each.
    refused: Vec<String>,
    /// Perf maps not read again after their process exited (rewritten,
    /// or its pid taken by another process): kept as last read while it
    /// lived.
    rewritten: usize,
}

/// What could not be read, or was found changed: for the lines that say so
/// at the end.
#[derive(Default)]
struct Notes {
    /// What could not be read for want of privilege.
    denied: Denied,
    /// Mappings found replaced by another file at an overlapping address.
    replaced: Replaced,
}

/// Where each process runs.
#[derive(Default)]
struct Places {
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
            snapshots: Snapshots::default(),
            files: Files::default(),
            retired: Retired::default(),
            jit: JitMaps::default(),
            notes: Notes::default(),
            runtimes: Default::default(),
            places: Places::default(),
            walked_runtimes: Vec::new(),
            runtimes_at_start: Default::default(),
        }
    }

    /// The cgroup and container of process `p`: as read at its first
    /// block, or (a process never noted, as with `-K`, where no process's
    /// mappings are read) now, if it is still the process at that pid.
    pub fn container(&mut self, p: Proc) -> Option<std::sync::Arc<crate::container::Container>> {
        if let Some(c) = self.places.containers.get(&p) {
            return Some(c.clone());
        }
        if crate::process::start_ticks(p.tgid) != Some(p.start) {
            return None;
        }
        self.note_place(p, false);
        self.places.containers.get(&p).cloned()
    }

    /// The processes whose pid in their own pid namespace differs from
    /// their pid: (pid, pid in the namespace), in pid order.
    pub fn namespace_pids(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .places
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
        if !again && self.places.containers.contains_key(&p) {
            return;
        }
        if let Some(c) = crate::container::of_process(p.tgid) {
            let c = match self.places.container_set.get(&c) {
                Some(known) => known.clone(),
                None => {
                    let c = std::sync::Arc::new(c);
                    self.places.container_set.insert(c.clone());
                    c
                }
            };
            self.places.containers.insert(p, c);
        }
        if let Some(n) = crate::container::namespace_pid(p.tgid) {
            self.places.namespace_pids.insert(p, n);
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
        let inherited = self.snapshots.inherited.remove(&tgid);
        let before_start = self.snapshots.before_start.remove(&tgid);
        let changed = inherited || before_start || changed;
        let now = crate::process::start_ticks(tgid);
        let start = start.or(now);
        let Some(start) = start else {
            // Gone: keep what we had.
            self.snapshots.processes.entry(tgid).or_default();
            return false;
        };
        // A snapshot with nothing in it (the mappings could not be read)
        // is read again.
        let held = self
            .snapshots
            .processes
            .get(&tgid)
            .is_some_and(|m| !m.is_empty());
        match self.snapshots.starts.get(&tgid) {
            // Another process has this pid now: the snapshot is the old
            // one's, kept apart for the stacks counted for it.
            Some(&old) if old != start => {
                if let Some(m) = self.snapshots.processes.remove(&tgid) {
                    self.snapshots
                        .superseded
                        .insert(Proc { tgid, start: old }, m);
                }
                self.snapshots.starts.remove(&tgid);
            }
            Some(_) | None if !changed && held => return true,
            _ => {}
        }
        // The event may be older than the process now at this pid.
        if now != Some(start) {
            return false;
        }
        self.snapshots.starts.insert(tgid, start);
        self.note_parent(Proc { tgid, start });
        self.note_place(Proc { tgid, start }, changed);
        self.refresh_process(tgid, inherited)
    }

    /// The snapshots of processes `tgids` were taken before the trace
    /// started: an exec between then and the start has no event, and the
    /// event that notices such a process after it (its first block without
    /// tables) says the address space of the new image. Each is read again
    /// at its first notice, so that the mappings it gets tables of are read
    /// after the event, as those of every other process are.
    pub fn read_before_the_start(&mut self, tgids: &[u32]) {
        self.snapshots.before_start.extend(tgids.iter().copied());
        self.snapshots.started = true;
    }

    /// The image process `tgid` ran when its mappings were read before the
    /// trace started (its tables, which no event says the address space
    /// of, are taken only by that image's: see `struct unwind_proc`);
    /// `None` where they were read after it, or the image could not be
    /// read.
    pub fn image(&self, tgid: u32) -> Option<crate::raw::Image> {
        self.snapshots.images.get(&tgid).copied()
    }

    /// Notes the parent of `p` from /proc where the fork did not say it:
    /// a parent the registry knows, still at its pid.
    fn note_parent(&mut self, p: Proc) {
        if self.snapshots.parents.contains_key(&p) {
            return;
        }
        let Some(parent) = crate::process::parent_pid(p.tgid) else {
            return;
        };
        if let Some(&start) = self.snapshots.starts.get(&parent) {
            if start <= p.start {
                self.snapshots.parents.insert(
                    p,
                    Proc {
                        tgid: parent,
                        start,
                    },
                );
            }
        }
    }

    /// The mappings of process `p` as last seen: its snapshot, or the one
    /// kept apart when another process took its pid.
    fn mappings_of(&self, p: Proc) -> Option<&Vec<Mapping>> {
        if self.snapshots.starts.get(&p.tgid) == Some(&p.start) {
            self.snapshots.processes.get(&p.tgid)
        } else {
            self.snapshots.superseded.get(&p)
        }
    }

    /// `inherited`: the snapshot held is the parent's (see
    /// [`Registry::forked`]), which an exec since replaces without a
    /// stack of this process having been taken through it, as a rule.
    /// Returns whether the mappings could be read.
    fn refresh_process(&mut self, tgid: u32, inherited: bool) -> bool {
        // Before the start, the image the mappings are of: the same before
        // and after they are read, or no image's.
        let image_before = (!self.snapshots.started)
            .then(|| crate::process::image_of(tgid))
            .flatten();
        let text = match std::fs::read_to_string(format!("/proc/{tgid}/maps")) {
            Ok(t) => {
                if let Some(before) = image_before {
                    let image = match crate::process::image_of(tgid) {
                        Some(after) if after == before => before,
                        _ => crate::raw::Image::UNSURE,
                    };
                    self.snapshots.images.insert(tgid, image);
                } else {
                    self.snapshots.images.remove(&tgid);
                }
                t
            }
            Err(e) => {
                // Another user's process, without CAP_SYS_PTRACE (with
                // it, a process in the middle of an exec can refuse too,
                // for a moment).
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && !crate::process::has_capability(crate::process::CAP_SYS_PTRACE)
                {
                    self.notes.denied.processes.insert(tgid);
                }
                // Gone already: keep what we had.
                self.snapshots.processes.entry(tgid).or_default();
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
        if let Some(old) = self.snapshots.processes.get(&tgid) {
            // Another file where one was mapped: the stacks taken before
            // are named through the later one where they overlap.
            for n in mappings.iter().filter(|_| !inherited) {
                if let Some(o) = old
                    .iter()
                    .find(|o| n.start < o.end && o.start < n.end && o.object != n.object)
                {
                    self.notes.replaced.count += 1;
                    self.notes
                        .replaced
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
        let old = self.snapshots.processes.insert(tgid, mappings);
        let new = distinct_objects(&self.snapshots.processes[&tgid]);
        for &o in &new {
            self.files.objects[o as usize].users += 1;
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
            let obj = &mut self.files.objects[o as usize];
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
        let o = &mut self.files.objects[id as usize];
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
        self.files.released += 1;
    }

    /// How many descriptors of files no live process maps were let go.
    pub fn released(&self) -> usize {
        self.files.released
    }

    /// What could not be read for want of privilege.
    pub fn denied(&self) -> &Denied {
        &self.notes.denied
    }

    /// The executable mappings of `tgid` as last snapshotted, sorted by
    /// start address.
    pub fn mappings(&self, tgid: u32) -> Vec<ExecMapping> {
        let mut out: Vec<ExecMapping> = self
            .snapshots
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

    /// Process `child` was forked by `parent`: it maps what its parent
    /// maps, so its parent's snapshot stands for its own until that is
    /// read, at its first notice. A child that exits before it is noted
    /// (a short-lived worker) still has its frames named.
    pub fn forked(&mut self, parent: u32, child: Proc) {
        // The child is where its parent is until it moves (read again at
        // its first notice).
        let parent_proc = self.snapshots.starts.get(&parent).map(|&start| Proc {
            tgid: parent,
            start,
        });
        if let Some(pp) = parent_proc {
            self.snapshots.parents.insert(child, pp);
        }
        if let Some(c) = parent_proc.and_then(|p| self.places.containers.get(&p).cloned()) {
            self.places.containers.entry(child).or_insert(c);
        }
        let Some(mappings) = self
            .snapshots
            .processes
            .get(&parent)
            .filter(|m| !m.is_empty())
        else {
            return;
        };
        let mappings = mappings.clone();
        let tgid = child.tgid;
        // What is kept for an earlier process at this pid stays apart, for
        // the stacks counted for it.
        if let Some(old) = self.snapshots.starts.remove(&tgid) {
            if let Some(m) = self.snapshots.processes.remove(&tgid) {
                if old != child.start {
                    self.snapshots
                        .superseded
                        .insert(Proc { tgid, start: old }, m);
                } else {
                    self.drop_users(&distinct_objects(&m));
                }
            }
        } else if let Some(m) = self.snapshots.processes.remove(&tgid) {
            self.drop_users(&distinct_objects(&m));
        }
        for &o in &distinct_objects(&mappings) {
            self.files.objects[o as usize].users += 1;
        }
        self.snapshots.starts.insert(tgid, child.start);
        self.snapshots.processes.insert(tgid, mappings);
        self.snapshots.inherited.insert(tgid);
        for r in self.runtimes.iter_mut() {
            r.forked(parent, child);
        }
    }

    /// A stack of process `p` was walked through the files it maps before
    /// its own mappings were read (see `struct mapped_event`): the
    /// mappings the walk went through, where they are not in its snapshot
    /// yet, name its frames even if it is gone before its mappings can be
    /// read. The snapshot is read again at the process's next notice, as a
    /// forked child's is.
    pub fn note_mapped(&mut self, p: Proc, vmas: &[crate::raw::MappedVma]) {
        if self
            .snapshots
            .starts
            .get(&p.tgid)
            .is_some_and(|&s| s != p.start)
        {
            return;
        }
        let had = self
            .snapshots
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
            let Some(&object) = self.files.object_ids.get(&key) else {
                continue;
            };
            let overlaps = |m: &Mapping| v.start < m.end && m.start < v.end;
            let known = self
                .snapshots
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
                self.files.objects[o as usize].users += 1;
            }
        }
        self.snapshots.starts.entry(p.tgid).or_insert(p.start);
        self.snapshots
            .processes
            .entry(p.tgid)
            .or_default()
            .extend(add);
        self.snapshots.inherited.insert(p.tgid);
    }

    /// The processes with a snapshot (not retired), with their start
    /// time where known.
    pub fn processes(&self) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
        self.snapshots
            .processes
            .keys()
            .map(|&t| (t, self.snapshots.starts.get(&t).copied()))
            .chain(
                self.snapshots
                    .superseded
                    .keys()
                    .map(|p| (p.tgid, Some(p.start))),
            )
    }

    /// When the process at pid `tgid` that has a snapshot started, where
    /// known.
    pub fn start_of(&self, tgid: u32) -> Option<u64> {
        self.snapshots.starts.get(&tgid).copied()
    }

    /// Whether some process at pid `tgid` still has a snapshot.
    pub fn has_pid(&self, tgid: u32) -> bool {
        self.snapshots.processes.contains_key(&tgid)
    }

    /// Where a process was found to map another file over one it had
    /// mapped before: frames of stacks taken before are named through
    /// the later file there. One line for stderr, if it happened.
    pub fn replaced_note(&self) -> Option<String> {
        let (tgid, before, after) = self.notes.replaced.example?;
        let n = self.notes.replaced.count as u64;
        Some(format!(
            "{} {} replaced by another file at the same addresses while tracing (an exec, or a \
             library closed and another loaded in its place; first: {} by {} in process \
             {tgid}): user frames of stacks taken before a replacement are named, and with \
             DWARF may have been walked, through the later file, and can be wrong there",
            count(n, "executable mapping", "executable mappings"),
            noun(n, "was", "were"),
            self.object_name(before),
            self.object_name(after),
        ))
    }
}

/// The objects `mappings` map, each once.
fn distinct_objects(mappings: &[Mapping]) -> Vec<u32> {
    let mut v: Vec<u32> = mappings.iter().map(|m| m.object).collect();
    v.sort_unstable();
    v.dedup();
    v
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
            note.starts_with("1 executable mapping was replaced")
                && note.contains("liba.so by libb.so"),
            "{note}"
        );
    }

    #[test]
    fn mappings_not_read_are_never_said_to_be() {
        // A zombie: its maps read empty.
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = crate::process::start_ticks(pid).unwrap();
        while !std::fs::read(format!("/proc/{pid}/maps")).is_ok_and(|m| m.is_empty()) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(crate::process::address_space_gone(pid));
        let mut reg = Registry::new();
        // Asked twice (two threads' news): not read either time.
        assert!(!reg.note_process(pid, Some(start), false));
        assert!(!reg.note_process(pid, Some(start), false));
        let mut child = child;
        child.wait().unwrap();
        assert!(crate::process::address_space_gone(pid));
        // A process with mappings: read, and held.
        let me = std::process::id();
        assert!(!crate::process::address_space_gone(me));
        assert!(reg.note_process(me, None, false));
        assert!(reg.note_process(me, None, false));
    }
}
