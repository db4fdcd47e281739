//! DWARF unwind tables for the BPF program (`--unwind dwarf`).
//!
//! Each object (file) a process maps is turned into a table once
//! ([`unwind_table::build`]) and written into the shared rows; each process
//! gets its executable mappings, sorted, each pointing at its object's rows
//! with the bias that turns an address into the object's own virtual
//! address. The BPF program unwinds a process only once it has its entry;
//! blocks before that are walked with frame pointers, and counted.
//!
//! Memory is fixed at load ([`crate::tracer::UnwindCapacity`]) and reused:
//! a process that exits ([`Unwinder::forget`]) gives back its entry and its
//! slice of mappings, and an object no live process maps any more keeps
//! its rows only until the space is needed for another. So the tables hold
//! what the processes alive now map, however many came and went. Space
//! given back is reused only after [`GRACE`], when no walk that started
//! before can still be reading it. When the live processes' objects do not
//! fit, new objects get no table (frame pointers are followed through
//! them) and processes that do not fit get none at all, and
//! [`Unwinder::not_covered`] says which.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bpf::types;
use crate::elf::Segment;
use crate::process::registry::{ExecMapping, FileIdentity, Registry};
use crate::raw::{AddressSpace, Image};
use crate::unwind_table;

mod builder;
mod ranges;
mod room;
mod tables;

use builder::{Builder, Requested};
use ranges::RangeAlloc;

/// How long space given back stays unused: far longer than any walk of
/// the BPF program (microseconds, never sleeping) that may have started
/// before it was given back.
pub const GRACE: Duration = Duration::from_millis(200);

/// A process none of whose blocks was walked with its tables for this
/// long gives its tables up when a process that blocks now needs the room
/// (they are built again at its next block that needs them).
pub const COLD: Duration = Duration::from_secs(2);

/// How often processes left without some of their tables for want of room
/// are looked at again, to take the room of processes gone cold.
const RETRY: Duration = Duration::from_secs(1);

/// At most this many objects and processes without tables are named; the
/// rest are only counted.
const NOT_COVERED_KEPT: usize = 64;

/// How many earlier sizes of executable mappings of a process's address
/// space are kept (see [`Unwinder::note_address_space`]).
const EARLIER_SPACES: usize = 16;

/// Where the tables go: the BPF program's maps ([`crate::tracer::UnwindStore`]),
/// or a fake in tests.
pub trait TableStore {
    fn row_capacity(&self) -> usize;
    fn mapping_capacity(&self) -> usize;
    /// Bytes of kernel memory the rows and mappings take now (they grow
    /// as they are written).
    fn allocated_bytes(&self) -> usize {
        0
    }
    fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()>;
    /// Makes room for the rows up to `end` at once, before they are
    /// written (each growth of the kernel's table waits for a grace
    /// period: one for a batch of tables rather than one each).
    fn reserve_rows(&mut self, _end: usize) -> Result<()> {
        Ok(())
    }
    fn write_mappings(&mut self, start: usize, mappings: &[types::unwind_mapping]) -> Result<()>;
    /// Points process `tgid` at `count` mappings from `start`, written
    /// before: the BPF program uses them from its next unwind on, in
    /// address space `space` (unknown, all zero: the first to walk claims
    /// them, if it is of `image` where that is not all zero).
    fn set_process(
        &mut self,
        tgid: u32,
        start: u32,
        count: u32,
        space: AddressSpace,
        image: Image,
    ) -> Result<()>;
    fn remove_process(&mut self, tgid: u32);
    /// Calls `f` with the rows and the mappings as written.
    fn read(&self, f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping]))
        -> Result<()>;
    /// Lets the BPF program find a file's tables by its inode (see
    /// `struct unwind_file`), or no longer.
    fn set_file(&mut self, key: &types::unwind_file_key, file: &types::unwind_file) -> Result<()>;
    fn remove_file(&mut self, key: &types::unwind_file_key);
    /// When a block of process `tgid` was last walked with its tables, or
    /// its tables written (CLOCK_MONOTONIC ns); None: it has no entry.
    fn last_used(&self, tgid: u32) -> Option<u64>;
}

/// What the unwinder needs to know of processes and the files they map:
/// the [`Registry`], or a fake in tests.
pub trait Processes {
    /// The executable mappings of `tgid`, sorted by start address.
    fn mappings(&self, tgid: u32) -> Vec<ExecMapping>;
    /// The file an object maps, open.
    fn object_file(&self, object: u32) -> Option<&File>;
    /// The object's file name, for messages.
    fn object_name(&self, object: u32) -> &str;
    /// How the kernel knows the object's file.
    fn object_identity(&self, object: u32) -> Option<FileIdentity>;
    /// The image `tgid` ran when its mappings were read before the trace
    /// started (see [`Registry::image`]).
    fn image(&self, _tgid: u32) -> Option<Image> {
        None
    }
}

impl Processes for Registry {
    fn mappings(&self, tgid: u32) -> Vec<ExecMapping> {
        Registry::mappings(self, tgid)
    }
    fn object_file(&self, object: u32) -> Option<&File> {
        Registry::object_file(self, object)
    }
    fn object_name(&self, object: u32) -> &str {
        Registry::object_name(self, object)
    }
    fn object_identity(&self, object: u32) -> Option<FileIdentity> {
        Registry::object_identity(self, object)
    }
    fn image(&self, tgid: u32) -> Option<Image> {
        Registry::image(self, tgid)
    }
}

/// An object's table in the shared rows.
#[derive(Clone, Debug)]
struct ObjectTable {
    row_start: u32,
    row_count: u32,
    segments: Vec<Segment>,
}

#[derive(Debug)]
struct ObjectEntry {
    /// None: no table (no CFI, unreadable, or no room).
    table: Option<ObjectTable>,
    /// No room for its rows when it was built: how many it needs, to try
    /// again once there may be room.
    wants_rows: Option<usize>,
    /// Processes dealt with that map it.
    refs: u32,
    /// Since when no process maps it (its rows can be reused).
    idle_since: Option<Instant>,
    /// Whether the BPF program can find it by its file (see
    /// [`Unwinder::register`]): its rows are reused only [`GRACE`] after
    /// it no longer can.
    file: FileEntry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileEntry {
    /// No entry: never written (no identity, too many segments).
    Never,
    Written(FileIdentity),
    Removed(Instant),
}

/// Rows built that wait for room that idle objects are about to give
/// (see [`Unwinder::alloc_rows`]).
struct Unplaced {
    since: Instant,
    object: u32,
    req: Requested,
    rows: Vec<unwind_table::Row>,
    segments: Vec<Segment>,
}

#[derive(Debug)]
struct ProcessEntry {
    /// The mappings it was dealt with for.
    mappings: Vec<ExecMapping>,
    /// Its slice of the mappings table, if it has tables.
    slice: Option<(usize, usize)>,
    /// The distinct objects it maps.
    objects: Vec<u32>,
    /// The address space its mappings were read for, where an event said
    /// (zero: unknown): copied stacks are walked only with tables of
    /// theirs.
    space: AddressSpace,
    /// The sizes of executable mappings (`exec_vm`) that events said of
    /// `space`'s address space before `space`'s own (see
    /// [`Unwinder::note_address_space`]): its mappings were read after
    /// them, so its tables cover the stacks copied under them too.
    earlier: Vec<u64>,
    /// Objects it maps that had no room for their rows when it was
    /// installed: it is installed again once they have.
    lacking: Vec<u32>,
}

/// Why an object or a process has no tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotCovered {
    pub tgid: u32,
    pub what: String,
    pub why: String,
    /// The object refused for want of room, which may get it later.
    object: Option<u32>,
    /// ... and did: frame pointers were used there only until then.
    pub later: bool,
}

/// Table statistics, for `-v`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UnwindStats {
    /// Objects with a table now.
    pub objects: usize,
    /// Objects met without call-frame information.
    pub objects_without_cfi: usize,
    pub rows: usize,
    pub row_capacity: usize,
    pub mappings: usize,
    pub mapping_capacity: usize,
    /// Bytes of kernel memory the rows and mappings take now.
    pub allocated_bytes: usize,
    /// Processes with tables now.
    pub processes: usize,
    /// Processes given tables since the start.
    pub processes_covered: usize,
    /// Processes whose tables were given back when they exited.
    pub processes_forgotten: usize,
    /// New processes that shared their parent's tables from the fork.
    pub processes_forked: usize,
    /// Files the BPF program can find tables of by their inode now.
    pub files: usize,
    /// Tables of objects no process mapped any more, dropped for room.
    pub objects_evicted: usize,
    /// Processes whose tables were let go for a process that blocked
    /// while they had not for [`COLD`].
    pub processes_let_go: usize,
    /// ... and how many of them were given tables again at a later block.
    pub processes_taken_back: usize,
    /// Processes left without some tables for want of room that got them
    /// later.
    pub processes_given_room: usize,
    /// Tables moved to put the free rows together.
    pub tables_moved: usize,
    /// Time spent building tables.
    pub build_ms: f64,
}

pub struct Unwinder {
    /// None until the BPF program's maps exist (see
    /// [`Unwinder::without_store`]).
    store: Option<Box<dyn TableStore>>,
    builder: Builder,
    /// Objects whose tables the builder is working on.
    building: HashMap<u32, Requested>,
    /// Processes waiting for tables of files they map.
    waiting: HashSet<u32>,
    /// How the kernel knows each object's file, as last noted.
    identities: HashMap<u32, FileIdentity>,
    /// Built tables waiting for room (see [`Unplaced`]).
    unplaced: Vec<Unplaced>,
    rows: RangeAlloc,
    mappings: RangeAlloc,
    /// By symbolizer object id.
    objects: HashMap<u32, ObjectEntry>,
    /// Processes dealt with.
    processes: HashMap<u32, ProcessEntry>,
    /// The address space each process had when its mappings were last
    /// noted (see [`Unwinder::note_address_space`]).
    address_spaces: HashMap<u32, AddressSpace>,
    /// For each, the sizes of executable mappings events said of the same
    /// address space before (the last [`EARLIER_SPACES`]).
    earlier_spaces: HashMap<u32, Vec<u64>>,
    /// The image of each process whose mappings were read before the trace
    /// started (see [`Processes::image`]).
    images: HashMap<u32, Image>,
    /// Processes that use each slice of mappings (by its start): a forked
    /// process shares its parent's until it has its own.
    slice_users: HashMap<usize, u32>,
    /// Slices of mappings given back, reusable once GRACE has passed.
    /// (Rows are reused only from objects idle for that long.)
    quarantine: VecDeque<(Instant, usize, usize)>,
    /// Rows that moved tables were in (see [`Unwinder::compact`]),
    /// reusable once GRACE has passed.
    moved_from: VecDeque<(Instant, usize, usize)>,
    not_covered: Vec<NotCovered>,
    not_covered_more: usize,
    /// The objects of the processes waiting for tables: their rows are
    /// not given to another.
    pending: HashMap<u32, Vec<u32>>,
    /// Processes whose tables were let go for room (see [`COLD`]), to be
    /// given them again when a block needs them.
    let_go: HashSet<u32>,
    /// When processes lacking tables were last looked at (see [`RETRY`]).
    retried: Instant,
    /// When each process lacking tables may be tried again, and how many
    /// times it was.
    retry_at: HashMap<u32, (Instant, u32)>,
    stats: UnwindStats,
}

impl Unwinder {
    pub fn new(store: impl TableStore + 'static) -> Unwinder {
        let mut u = Unwinder::without_store(store.row_capacity(), store.mapping_capacity());
        u.store = Some(Box::new(store));
        u
    }

    /// An unwinder that builds tables before there is anywhere to write
    /// them (while the BPF program loads, which takes as long): processes
    /// noted wait, and their tables are written once
    /// [`Unwinder::set_store`] gives it a store of these capacities.
    pub fn without_store(row_capacity: usize, mapping_capacity: usize) -> Unwinder {
        Unwinder {
            store: None,
            builder: Builder::start(),
            building: HashMap::new(),
            waiting: HashSet::new(),
            identities: HashMap::new(),
            unplaced: Vec::new(),
            rows: RangeAlloc::new(row_capacity),
            mappings: RangeAlloc::new(mapping_capacity),
            objects: HashMap::new(),
            processes: HashMap::new(),
            slice_users: HashMap::new(),
            address_spaces: HashMap::new(),
            earlier_spaces: HashMap::new(),
            images: HashMap::new(),
            quarantine: VecDeque::new(),
            moved_from: VecDeque::new(),
            not_covered: Vec::new(),
            not_covered_more: 0,
            pending: HashMap::new(),
            let_go: HashSet::new(),
            retried: Instant::now(),
            retry_at: HashMap::new(),
            stats: UnwindStats {
                row_capacity,
                mapping_capacity,
                ..UnwindStats::default()
            },
        }
    }

    /// The mappings of `tgid` about to be noted are those of address space
    /// `space` (as the BPF program's event said), read after the event.
    /// Where an earlier event said the same address space with other
    /// executable mappings (the dynamic loader's work in a new image, a
    /// `dlopen`), the tables made from this reading cover the stacks
    /// copied under those too: the code mapped then is still mapped where
    /// it was (a process's stacks copied while it mapped fewer pages are
    /// walked with them, rather than waiting for tables of mappings that
    /// were never read as they were).
    pub fn note_address_space(&mut self, tgid: u32, space: AddressSpace) {
        let earlier = self.earlier_spaces.entry(tgid).or_default();
        match self.address_spaces.insert(tgid, space) {
            Some(old) if old.mm == space.mm && old.exec_vm != space.exec_vm => {
                earlier.retain(|&e| e != old.exec_vm && e != space.exec_vm);
                if earlier.len() == EARLIER_SPACES {
                    earlier.remove(0);
                }
                earlier.push(old.exec_vm);
            }
            Some(old) if old.mm == space.mm => {}
            _ => earlier.clear(),
        }
    }

    /// The address space the last event said of `tgid` (see
    /// [`Unwinder::note_address_space`]).
    pub fn noted_space(&self, tgid: u32) -> Option<AddressSpace> {
        self.address_spaces.get(&tgid).copied()
    }

    /// The sizes of executable mappings said of `tgid`'s address space
    /// before its last (see [`Unwinder::note_address_space`]).
    fn earlier_spaces(&self, tgid: u32) -> Vec<u64> {
        self.earlier_spaces.get(&tgid).cloned().unwrap_or_default()
    }

    /// Gives the BPF program the tables of `tgid`'s mappings as `procs`
    /// last snapshotted them (call [`Registry::note_process`] first),
    /// unless it has them already for these same mappings. Returns false
    /// if tables of files it maps are being built first (on the builder
    /// thread): [`Unwinder::poll`] finishes the process once they are.
    pub fn note_process(&mut self, procs: &dyn Processes, tgid: u32) -> bool {
        if tgid == 0 {
            return true;
        }
        let mappings = procs.mappings(tgid);
        let space = self.address_spaces.get(&tgid).copied().unwrap_or_default();
        match procs.image(tgid) {
            Some(image) => self.images.insert(tgid, image),
            None => self.images.remove(&tgid),
        };
        if mappings.is_empty() {
            self.waiting.remove(&tgid);
            return true;
        }
        // Installed without some tables for want of room: installed again
        // once they have it.
        // (Or being built again for it: it waits for them.)
        let room_since = self.processes.get(&tgid).is_some_and(|p| {
            p.lacking.iter().any(|o| {
                self.building.contains_key(o)
                    || self.objects.get(o).is_some_and(|e| e.table.is_some())
            })
        });
        let earlier = self.earlier_spaces(tgid);
        if let Some(p) = self.processes.get_mut(&tgid).filter(|_| !room_since) {
            if p.mappings == mappings {
                // The same mappings (a fork's, or those of the same image
                // again): the tables hold for this address space too.
                if p.space != space {
                    p.space = space;
                    p.earlier = earlier;
                    if let (Some((start, len)), Some(store)) = (p.slice, self.store.as_deref_mut())
                    {
                        // Not a failure if it cannot be said: the BPF
                        // program then copies the stacks for userspace.
                        let image = image_for(&self.images, tgid, space);
                        let _ = store.set_process(tgid, start as u32, len as u32, space, image);
                    }
                }
                self.waiting.remove(&tgid);
                return true;
            }
        }
        let mut objects: Vec<u32> = mappings.iter().map(|m| m.object).collect();
        objects.sort_unstable();
        objects.dedup();
        for &o in &objects {
            if let Some(identity) = procs.object_identity(o) {
                self.identities.insert(o, identity);
            }
        }
        let mut pending = false;
        for &o in &objects {
            if self.building.contains_key(&o) {
                pending = true;
            } else if self.needs_build(o, &objects) {
                self.request(procs, tgid, o);
                pending = true;
            }
        }
        if pending || self.store.is_none() {
            self.waiting.insert(tgid);
            self.pending.insert(tgid, objects);
            return false;
        }
        self.waiting.remove(&tgid);
        self.pending.remove(&tgid);
        self.install(procs, tgid, mappings, objects);
        true
    }

    /// Copied stacks of process `tgid` wait for its tables: if they were
    /// let go for room (see [`COLD`]), they are made again.
    pub fn wanted(&mut self, procs: &dyn Processes, tgid: u32) {
        if self.let_go.remove(&tgid) {
            self.stats.processes_taken_back += 1;
            self.note_process(procs, tgid);
        }
    }

    /// Where the tables go from now on (see [`Unwinder::without_store`]):
    /// the processes noted so far get theirs as the tables they wait for
    /// are taken in ([`Unwinder::poll`], [`Unwinder::finish`]), at once
    /// if they wait for none.
    pub fn set_store(&mut self, procs: &dyn Processes, store: impl TableStore + 'static) {
        if store.row_capacity() != self.rows.capacity
            || store.mapping_capacity() != self.mappings.capacity
        {
            // Not the capacities planned for: start over with these.
            let waiting: Vec<u32> = self.waiting.iter().copied().collect();
            *self = Unwinder::new(store);
            for tgid in waiting {
                self.note_process(procs, tgid);
            }
            return;
        }
        self.store = Some(Box::new(store));
        let ready: Vec<u32> = self.waiting.iter().copied().collect();
        for tgid in ready {
            self.note_process(procs, tgid);
        }
    }

    fn store(&mut self) -> &mut dyn TableStore {
        // Tables are taken in and processes installed only once there is
        // a store (note_process, poll and finish wait for it).
        self.store
            .as_deref_mut()
            .expect("unwind tables written before their store was set")
    }

    /// Process `child` was forked by `parent`, and the BPF program pointed
    /// it at the slice of mappings `slice` (start, length) that it found
    /// for the parent: the child uses the parent's tables until its own
    /// mappings are noted, and the slice is kept while either uses it.
    /// Where that slice is not the parent's any more (its tables were
    /// rewritten meanwhile, or the parent is gone), the child's entry is
    /// removed, and its blocks wait for tables of its own; returns whether
    /// it shares.
    pub fn forked(
        &mut self,
        parent: u32,
        child: u32,
        space: AddressSpace,
        slice: (usize, usize),
    ) -> bool {
        // Whatever is still kept for `child` is an earlier process's,
        // whose pid was reused.
        self.waiting.remove(&child);
        self.pending.remove(&child);
        self.let_go.remove(&child);
        if let Some(old) = self.processes.remove(&child) {
            self.release(old);
        }
        let entry = match self.processes.get(&parent) {
            Some(p) if p.slice == Some(slice) => ProcessEntry {
                mappings: p.mappings.clone(),
                slice: p.slice,
                objects: p.objects.clone(),
                space,
                earlier: Vec::new(),
                lacking: p.lacking.clone(),
            },
            _ => {
                if let Some(store) = self.store.as_deref_mut() {
                    store.remove_process(child);
                }
                self.update_stats();
                return false;
            }
        };
        for o in &entry.objects {
            if let Some(e) = self.objects.get_mut(o) {
                e.refs += 1;
                e.idle_since = None;
            }
        }
        *self.slice_users.entry(slice.0).or_insert(1) += 1;
        self.address_spaces.insert(child, space);
        self.earlier_spaces.remove(&child);
        self.processes.insert(child, entry);
        self.stats.processes_forked += 1;
        self.update_stats();
        true
    }

    /// Process `tgid` has exited: its entry and mappings are given back,
    /// and the objects it mapped are kept only while some other process
    /// maps them or until their room is needed.
    pub fn forget(&mut self, tgid: u32) {
        self.waiting.remove(&tgid);
        self.pending.remove(&tgid);
        self.retry_at.remove(&tgid);
        self.let_go.remove(&tgid);
        self.address_spaces.remove(&tgid);
        self.earlier_spaces.remove(&tgid);
        self.images.remove(&tgid);
        if let Some(p) = self.processes.remove(&tgid) {
            if p.slice.is_some() {
                self.store().remove_process(tgid);
                self.stats.processes_forgotten += 1;
            }
            self.release(p);
            self.update_stats();
        }
    }

    /// Tables being built now.
    pub fn building(&self) -> usize {
        self.building.len()
    }

    /// Makes space given back more than [`GRACE`] ago reusable.
    pub fn reclaim(&mut self) {
        let now = Instant::now();
        while let Some(&(at, start, len)) = self.quarantine.front() {
            if now.duration_since(at) < GRACE {
                break;
            }
            self.quarantine.pop_front();
            self.mappings.free(start, len);
        }
        while let Some(&(at, start, len)) = self.moved_from.front() {
            if now.duration_since(at) < GRACE {
                break;
            }
            self.moved_from.pop_front();
            self.rows.free(start, len);
        }
        self.update_stats();
    }

    fn release(&mut self, p: ProcessEntry) {
        if let Some((start, len)) = p.slice {
            let users = self.slice_users.entry(start).or_insert(1);
            *users -= 1;
            if *users == 0 {
                self.slice_users.remove(&start);
                self.quarantine.push_back((Instant::now(), start, len));
            }
        }
        for o in p.objects {
            if let Some(e) = self.objects.get_mut(&o) {
                e.refs = e.refs.saturating_sub(1);
                if e.refs == 0 {
                    e.idle_since = Some(Instant::now());
                }
            }
        }
    }

    fn refuse(&mut self, tgid: u32, what: &str, why: String) {
        if self.not_covered.len() >= NOT_COVERED_KEPT {
            self.not_covered_more += 1;
            return;
        }
        self.not_covered.push(NotCovered {
            tgid,
            what: what.to_string(),
            why,
            object: None,
            later: false,
        });
    }

    fn update_stats(&mut self) {
        self.stats.rows = self.rows.used;
        self.stats.mappings = self.mappings.used;
        self.stats.allocated_bytes = self.store.as_deref().map_or(0, |s| s.allocated_bytes());
        self.stats.objects = self.objects.values().filter(|e| e.table.is_some()).count();
        self.stats.files = self
            .objects
            .values()
            .filter(|e| matches!(e.file, FileEntry::Written(_)))
            .count();
        self.stats.processes = self
            .processes
            .values()
            .filter(|p| p.slice.is_some())
            .count();
    }

    /// Objects and processes left without tables, in the order met (the
    /// first [`NOT_COVERED_KEPT`]), and how many more there were.
    pub fn not_covered(&self) -> (&[NotCovered], usize) {
        (&self.not_covered, self.not_covered_more)
    }

    pub fn stats(&self) -> UnwindStats {
        self.stats
    }

    /// What the tables of `tgid` are for, in words (`-v`, of a stack
    /// copied in an address space they did not serve).
    pub fn describe_process(&self, tgid: u32) -> String {
        let waited = if self.waiting.contains(&tgid) {
            ", its mappings waited for"
        } else {
            ""
        };
        let Some(p) = self.processes.get(&tgid) else {
            return format!("never installed{waited}");
        };
        let building = p
            .objects
            .iter()
            .filter(|o| self.building.contains_key(o))
            .count();
        format!(
            "{} for address space {:#x} with {} bytes of executable mappings (and {:?} \
             before it), {} building of {}, {} lacking room{waited}",
            if p.slice.is_some() {
                "installed"
            } else {
                "none"
            },
            p.space.mm,
            p.space.exec_vm,
            p.earlier,
            building,
            crate::text::count(p.objects.len() as u64, "object", "objects"),
            p.lacking.len(),
        )
    }
}

impl crate::deferred::ProcessTables for Unwinder {
    fn slice(&self, tgid: u32, space: AddressSpace) -> Option<(usize, usize)> {
        self.processes
            .get(&tgid)
            .filter(|p| {
                space.mm != 0
                    && (p.space == space
                        || (p.space.mm == space.mm && p.earlier.contains(&space.exec_vm)))
            })
            .and_then(|p| p.slice)
    }

    fn read_all(&self, f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping])) -> bool {
        self.store
            .as_deref()
            .is_some_and(|store| store.read(f).is_ok())
    }
}

/// The image the tables of `tgid` in address space `space` are for: that
/// of its mappings read before the start where no event said the space.
fn image_for(images: &HashMap<u32, Image>, tgid: u32, space: AddressSpace) -> Image {
    match space.mm {
        0 => images.get(&tgid).copied().unwrap_or_default(),
        _ => Image::default(),
    }
}

#[cfg(test)]
mod tests;
