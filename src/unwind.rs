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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bpf::types;
use crate::elf::{load_segments, Segment};
use crate::process::registry::{ExecMapping, FileIdentity, Registry};
use crate::raw::AddressSpace;
use crate::unwind_table;

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

/// Where the tables go: the BPF program's maps ([`crate::tracer::UnwindStore`]),
/// or a fake in tests.
pub trait TableStore {
    fn row_capacity(&self) -> usize;
    fn mapping_capacity(&self) -> usize;
    fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()>;
    fn write_mappings(&mut self, start: usize, mappings: &[types::unwind_mapping]) -> Result<()>;
    /// Points process `tgid` at `count` mappings from `start`, written
    /// before: the BPF program uses them from its next unwind on, in
    /// address space `space` (unknown, all zero: the first to walk claims
    /// them).
    fn set_process(&mut self, tgid: u32, start: u32, count: u32, space: AddressSpace)
        -> Result<()>;
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
}

/// Free ranges of a table, first fit, merged with their neighbours when
/// given back.
#[derive(Debug)]
struct RangeAlloc {
    /// start -> length
    free: BTreeMap<usize, usize>,
    capacity: usize,
    used: usize,
}

impl RangeAlloc {
    fn new(capacity: usize) -> RangeAlloc {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        RangeAlloc {
            free,
            capacity,
            used: 0,
        }
    }

    fn alloc(&mut self, len: usize) -> Option<usize> {
        if len == 0 {
            return Some(0);
        }
        let (&start, &have) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        self.used += len;
        Some(start)
    }

    fn free(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        debug_assert!(start + len <= self.capacity);
        self.used -= len;
        let (mut start, mut len) = (start, len);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += l;
        }
        self.free.insert(start, len);
    }

    /// The longest free run there would be with `more` ranges given back
    /// too (start, length; not free now, not overlapping).
    fn longest_with(&self, more: &[(usize, usize)]) -> usize {
        let mut all: Vec<(usize, usize)> = self.free.iter().map(|(&s, &l)| (s, l)).collect();
        all.extend(more.iter().copied().filter(|&(_, l)| l > 0));
        all.sort_unstable();
        let mut best = 0;
        let mut run: Option<(usize, usize)> = None;
        for (s, l) in all {
            let (a, e) = match run {
                Some((a, e)) if s <= e => (a, e.max(s + l)),
                _ => (s, s + l),
            };
            run = Some((a, e));
            best = best.max(e - a);
        }
        best
    }
}

/// A table asked of the builder: for whom, to report a failure once.
#[derive(Clone, Debug)]
struct Requested {
    tgid: u32,
    object: u32,
    name: String,
    /// The object's first build (not a retry for want of room).
    first: bool,
}

/// The rows and the file's loadable segments; None: no call-frame
/// information; Err: why it could not be read.
type BuiltTable = std::result::Result<Option<(Vec<unwind_table::Row>, Vec<Segment>)>, String>;

/// A table built by the builder thread.
struct Built {
    object: u32,
    table: BuiltTable,
    took: Duration,
}

/// How many threads build tables: two, where there are two CPUs, so that
/// one large library (seconds to build) does not hold up the others at
/// start-up, when every process alive waits for its tables.
const BUILDERS: usize = 2;

/// The threads that turn files' call-frame information into rows, so that
/// a large library holds up neither the reading of events nor the tables
/// of files already built.
struct Builder {
    jobs: Option<std::sync::mpsc::Sender<(u32, File)>>,
    done: std::sync::mpsc::Receiver<Built>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Builder {
    fn start() -> Builder {
        let (jobs, todo) = std::sync::mpsc::channel::<(u32, File)>();
        let todo = std::sync::Arc::new(std::sync::Mutex::new(todo));
        let (tell, done) = std::sync::mpsc::channel();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads: Vec<_> = (0..BUILDERS.min(cpus))
            .filter_map(|_| {
                let todo = todo.clone();
                let tell = tell.clone();
                std::thread::Builder::new()
                    .name("unwind-tables".into())
                    .spawn(move || {
                        crate::priority::below_loader();
                        loop {
                            // The lock is held only while waiting for a job.
                            let job = match todo.lock() {
                                Ok(rx) => rx.recv(),
                                Err(_) => break,
                            };
                            let Ok((object, file)) = job else {
                                break;
                            };
                            crate::priority::settle();
                            let began = Instant::now();
                            // A file that makes the parser panic is one
                            // without a table, not the end of the run.
                            let table = std::panic::catch_unwind(|| build_table(&file))
                                .unwrap_or_else(|_| {
                                    Err("its call-frame information could not be parsed".into())
                                });
                            drop(file);
                            let built = Built {
                                object,
                                table,
                                took: began.elapsed(),
                            };
                            if tell.send(built).is_err() {
                                break;
                            }
                            crate::give_back_freed_memory();
                        }
                    })
                    .ok()
            })
            .collect();
        Builder {
            jobs: (!threads.is_empty()).then_some(jobs),
            done,
            threads,
        }
    }

    fn send(&self, object: u32, file: File) -> std::result::Result<(), ()> {
        match &self.jobs {
            Some(j) => j.send((object, file)).map_err(|_| ()),
            None => Err(()),
        }
    }

    fn try_recv(&self) -> Option<Built> {
        self.done.try_recv().ok()
    }

    fn recv_timeout(&self, d: Duration) -> Option<Built> {
        self.done.recv_timeout(d).ok()
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        // No more jobs: each thread ends after the one it is on.
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The rows of a file, and its segments.
fn build_table(file: &File) -> BuiltTable {
    let Some(segments) = load_segments(file) else {
        return Ok(None);
    };
    match unwind_table::build(file) {
        Ok(Some((rows, _))) => Ok(Some((rows, segments))),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("{e:#}")),
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
    /// `space` (as the BPF program's event said).
    pub fn note_address_space(&mut self, tgid: u32, space: AddressSpace) {
        self.address_spaces.insert(tgid, space);
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
        if let Some(p) = self.processes.get_mut(&tgid).filter(|_| !room_since) {
            if p.mappings == mappings {
                // The same mappings (a fork's, or those of the same image
                // again): the tables hold for this address space too.
                if p.space != space {
                    p.space = space;
                    if let (Some((start, len)), Some(store)) = (p.slice, self.store.as_deref_mut())
                    {
                        // Not a failure if it cannot be said: the BPF
                        // program then copies the stacks for userspace.
                        let _ = store.set_process(tgid, start as u32, len as u32, space);
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

    /// Processes installed without some of their tables for want of room
    /// and blocking now: their tables are built again where the room of
    /// processes gone cold can be had.
    fn retry_lacking(&mut self, procs: &dyn Processes) {
        if self.retried.elapsed() < RETRY {
            return;
        }
        self.retried = Instant::now();
        let now = crate::raw::monotonic_ns();
        let lacking: Vec<u32> = self
            .processes
            .iter()
            .filter(|(tgid, p)| {
                !p.lacking.is_empty()
                    && p.slice.is_some()
                    && !self.waiting.contains(tgid)
                    && !p.lacking.iter().any(|o| self.building.contains_key(o))
            })
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in lacking {
            let Some(store) = self.store.as_deref() else {
                return;
            };
            let hot = store
                .last_used(tgid)
                .is_some_and(|t| now.saturating_sub(t) < COLD.as_nanos() as u64);
            if !hot {
                continue;
            }
            let Some(p) = self.processes.get(&tgid) else {
                continue;
            };
            // The largest: each object's rows are one run.
            let need: usize = p
                .lacking
                .iter()
                .filter_map(|o| self.objects.get(o).and_then(|e| e.wants_rows))
                .max()
                .unwrap_or(0);
            if need == 0 {
                continue;
            }
            let keep = p.objects.clone();
            // Tried before and still lacking: less and less often.
            let (at, tries) = self
                .retry_at
                .get(&tgid)
                .copied()
                .unwrap_or((Instant::now(), 0));
            if Instant::now() < at || !self.cold_room(need, &keep, tgid).1 {
                continue;
            }
            let wait = RETRY * (1u32 << tries.min(6));
            self.retry_at
                .insert(tgid, (Instant::now() + wait, tries + 1));
            let lacking = p.lacking.clone();
            for o in lacking {
                if self.objects.get(&o).is_some_and(|e| e.wants_rows.is_some()) {
                    self.request(procs, tgid, o);
                }
            }
            self.waiting.insert(tgid);
            self.pending.insert(tgid, keep);
        }
    }

    /// The processes that could give their tables for `tgid`, the
    /// longest unused first, and when each was last used (CLOCK_MONOTONIC
    /// ns): those with tables of their own, but not `tgid` nor those
    /// waiting for tables.
    fn by_last_use(&self, tgid: u32) -> Vec<(u64, u32)> {
        let Some(store) = self.store.as_deref() else {
            return Vec::new();
        };
        let mut v: Vec<(u64, u32)> = self
            .processes
            .iter()
            .filter(|(&pid, p)| pid != tgid && p.slice.is_some() && !self.waiting.contains(&pid))
            .map(|(&pid, _)| (store.last_used(pid).unwrap_or(0), pid))
            .collect();
        v.sort_unstable();
        v
    }

    /// The rows that letting go of the processes unused for [`COLD`]
    /// would free for `tgid` (mapping `keep`), with those of objects no
    /// process maps now: the processes to let go, and whether that is
    /// `len` rows with the free ones and those coming.
    fn cold_room(&self, len: usize, keep: &[u32], tgid: u32) -> (Vec<u32>, bool) {
        let now = crate::raw::monotonic_ns();
        let held: HashSet<u32> = keep
            .iter()
            .chain(self.pending.values().flatten())
            .copied()
            .collect();
        let range_of = |o: &u32| -> Option<(usize, usize)> {
            if held.contains(o) {
                return None;
            }
            let t = self.objects.get(o)?.table.as_ref()?;
            Some((t.row_start as usize, t.row_count as usize))
        };
        // Objects no process maps: theirs in any case.
        let mut coming: Vec<(usize, usize)> = self
            .objects
            .iter()
            .filter(|(_, e)| e.refs == 0)
            .filter_map(|(o, _)| range_of(o))
            .collect();
        coming.extend(self.moved_from.iter().map(|&(_, start, len)| (start, len)));
        let free = self.rows.capacity - self.rows.used;
        // In one run, or in pieces that moving tables puts together.
        let enough = |coming: &[(usize, usize)]| {
            self.rows.longest_with(coming) >= len
                || free + coming.iter().map(|&(_, l)| l).sum::<usize>() >= len
        };
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut victims = Vec::new();
        for (used, pid) in self.by_last_use(tgid) {
            if enough(&coming) || now.saturating_sub(used) < COLD.as_nanos() as u64 {
                break;
            }
            victims.push(pid);
            for o in &self.processes[&pid].objects {
                let r = refs
                    .entry(*o)
                    .or_insert_with(|| self.objects.get(o).map_or(0, |e| e.refs));
                *r = r.saturating_sub(1);
                if *r == 0 {
                    coming.extend(range_of(o));
                }
            }
        }
        let enough = enough(&coming);
        (victims, enough)
    }

    /// Lets go the tables of the processes that have not blocked for
    /// longest, none used for [`COLD`], until `len` rows can be had
    /// [`GRACE`] from now for `tgid`: whether they can. Nothing is let go
    /// if they cannot. Those processes' tables are made again at a block
    /// that needs them (see [`Unwinder::wanted`]).
    fn let_go_cold(&mut self, len: usize, tgid: u32) -> bool {
        let keep = self
            .processes
            .get(&tgid)
            .map(|p| p.objects.clone())
            .or_else(|| self.pending.get(&tgid).cloned())
            .unwrap_or_default();
        let (victims, enough) = self.cold_room(len, &keep, tgid);
        if !enough {
            return false;
        }
        for pid in victims {
            if let Some(p) = self.processes.remove(&pid) {
                self.store().remove_process(pid);
                self.release(p);
                self.let_go.insert(pid);
                self.stats.processes_let_go += 1;
            }
        }
        // Every object no process maps now gives its rows GRACE from now,
        // when no walk can still be reading them.
        let held: HashSet<u32> = keep
            .iter()
            .chain(self.pending.values().flatten())
            .copied()
            .collect();
        let free: Vec<u32> = self
            .objects
            .iter()
            .filter(|(o, e)| e.refs == 0 && e.table.is_some() && !held.contains(o))
            .map(|(&o, _)| o)
            .collect();
        let now = Instant::now();
        for o in free {
            self.unregister(o);
            if let Some(e) = self.objects.get_mut(&o) {
                if e.file == FileEntry::Never {
                    e.file = FileEntry::Removed(now);
                }
                e.idle_since = Some(e.idle_since.map_or(now, |t| t.min(now)));
            }
        }
        self.update_stats();
        true
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

    /// Whether `object` has no table yet, or had no room for it and may
    /// have now.
    fn needs_build(&self, object: u32, keep: &[u32]) -> bool {
        match self.objects.get(&object) {
            None => true,
            Some(e) => e.wants_rows.is_some_and(|n| self.room(keep) >= n),
        }
    }

    /// Asks the builder thread for the table of `object`; an object with
    /// no file to read is settled at once (no table).
    fn request(&mut self, procs: &dyn Processes, tgid: u32, object: u32) {
        let file = procs.object_file(object).and_then(|f| f.try_clone().ok());
        let Some(file) = file else {
            self.settle(object, None, None, true);
            return;
        };
        let first = !self.objects.contains_key(&object);
        self.building.insert(
            object,
            Requested {
                tgid,
                object,
                name: procs.object_name(object).to_string(),
                first,
            },
        );
        if self.builder.send(object, file).is_err() {
            // The builder is gone: no more tables.
            self.building.remove(&object);
            self.settle(object, None, None, first);
        }
    }

    /// Takes in the tables built since the last call, and gives their
    /// tables to the processes that waited for them. Returns whether
    /// tables are still being built.
    pub fn poll(&mut self, procs: &dyn Processes) -> bool {
        if self.store.is_none() {
            return true;
        }
        self.reclaim();
        self.retry_lacking(procs);
        let mut built = Vec::new();
        while let Some(b) = self.builder.try_recv() {
            built.push(b);
        }
        let placed = self.place_unplaced();
        if placed && built.is_empty() {
            let ready: Vec<u32> = self.waiting.iter().copied().collect();
            for tgid in ready {
                self.note_process(procs, tgid);
            }
        }
        self.take_in(procs, built);
        !self.building.is_empty()
    }

    /// Takes in built tables and gives them to the processes that waited.
    fn take_in(&mut self, procs: &dyn Processes, built: Vec<Built>) {
        if built.is_empty() {
            return;
        }
        for b in built {
            self.take_built(b);
        }
        crate::give_back_freed_memory();
        let ready: Vec<u32> = self.waiting.iter().copied().collect();
        for tgid in ready {
            self.note_process(procs, tgid);
        }
    }

    /// Waits until every table asked for is built and given to its
    /// processes (before tracing starts), or `limit` has passed.
    pub fn finish(&mut self, procs: &dyn Processes, limit: Duration) {
        if self.store.is_none() {
            return;
        }
        let until = Instant::now() + limit;
        while self.poll(procs) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let built = self
                .builder
                .recv_timeout(left.min(Duration::from_millis(50)));
            self.take_in(procs, built.into_iter().collect());
        }
    }

    fn take_built(&mut self, built: Built) {
        self.stats.build_ms += built.took.as_secs_f64() * 1e3;
        let Some(req) = self.building.remove(&built.object) else {
            return;
        };
        match built.table {
            Ok(None) => self.settle(built.object, None, None, req.first),
            Err(why) => {
                if req.first {
                    self.refuse(req.tgid, &req.name, why);
                }
                self.settle(built.object, None, None, false);
            }
            Ok(Some((rows, segments))) => match self.place(&req, rows, segments) {
                Ok((table, wants)) => self.settle(built.object, table, wants, false),
                Err((rows, segments)) => self.wait_for_room(built.object, req, rows, segments),
            },
        }
    }

    /// Keeps built rows until the idle objects whose file entries were
    /// just removed can give their room ([`GRACE`] from now).
    fn wait_for_room(
        &mut self,
        object: u32,
        req: Requested,
        rows: Vec<unwind_table::Row>,
        segments: Vec<Segment>,
    ) {
        self.building.insert(object, req.clone());
        self.unplaced.push(Unplaced {
            since: Instant::now(),
            object,
            req,
            rows,
            segments,
        });
    }

    /// Places the rows that waited for room long enough: whether any was
    /// settled.
    fn place_unplaced(&mut self) -> bool {
        let now = Instant::now();
        let (due, wait): (Vec<Unplaced>, Vec<Unplaced>) = std::mem::take(&mut self.unplaced)
            .into_iter()
            .partition(|u| now.duration_since(u.since) >= GRACE);
        self.unplaced = wait;
        let placed = !due.is_empty();
        for u in due {
            self.building.remove(&u.object);
            match self.place(&u.req, u.rows, u.segments) {
                Ok((table, wants)) => self.settle(u.object, table, wants, false),
                Err((rows, segments)) => self.wait_for_room(u.object, u.req, rows, segments),
            }
        }
        placed
    }

    /// Records what became of an object's table, keeping its references.
    fn settle(
        &mut self,
        object: u32,
        table: Option<ObjectTable>,
        wants_rows: Option<usize>,
        no_cfi: bool,
    ) {
        if no_cfi {
            self.stats.objects_without_cfi += 1;
        }
        let (refs, idle_since, file) = self
            .objects
            .get(&object)
            .map_or((0, Some(Instant::now()), FileEntry::Never), |e| {
                (e.refs, e.idle_since, e.file)
            });
        self.objects.insert(
            object,
            ObjectEntry {
                table,
                wants_rows,
                refs,
                idle_since,
                file,
            },
        );
        if self.objects.get(&object).is_some_and(|e| e.table.is_some()) {
            for n in &mut self.not_covered {
                if n.object == Some(object) {
                    n.later = true;
                }
            }
        }
        self.register(object);
        self.update_stats();
    }

    /// Lets the BPF program find `object`'s table by its file, for the
    /// processes that map it before their own tables are written: the
    /// rows and the segments that turn a mapping's file offset into the
    /// object's addresses (see `bias`). An object without a table gets an
    /// entry too: frame pointers are followed through it, as through a
    /// process's mapping of it.
    fn register(&mut self, object: u32) {
        let Some(&identity) = self.identities.get(&object) else {
            return;
        };
        let Some(e) = self.objects.get(&object) else {
            return;
        };
        let mut f = types::unwind_file {
            size: identity.size,
            ..Default::default()
        };
        if let Some(t) = &e.table {
            if t.segments.len() > f.segment.len() {
                return;
            }
            f.row_start = t.row_start;
            f.row_count = t.row_count;
            f.segments = t.segments.len() as u32;
            for (slot, seg) in f.segment.iter_mut().zip(&t.segments) {
                *slot = types::unwind_file_segment {
                    start: seg.offset & !0xfff,
                    end: seg.offset.saturating_add(seg.filesz),
                    delta: seg.vaddr.wrapping_sub(seg.offset),
                };
            }
        }
        let key = types::unwind_file_key {
            dev: identity.dev,
            ino: identity.ino,
        };
        let Some(store) = self.store.as_deref_mut() else {
            return;
        };
        if store.set_file(&key, &f).is_ok() {
            if let Some(e) = self.objects.get_mut(&object) {
                e.file = FileEntry::Written(identity);
            }
        }
    }

    /// The BPF program no longer finds `object` by its file: its rows can
    /// be reused [`GRACE`] from now.
    fn unregister(&mut self, object: u32) {
        let Some(e) = self.objects.get_mut(&object) else {
            return;
        };
        let FileEntry::Written(identity) = e.file else {
            return;
        };
        e.file = FileEntry::Removed(Instant::now());
        let key = types::unwind_file_key {
            dev: identity.dev,
            ino: identity.ino,
        };
        if let Some(store) = self.store.as_deref_mut() {
            store.remove_file(&key);
        }
    }

    /// Writes built rows into the shared table, making room from idle
    /// objects if needed: the table, or None and the rows it needs.
    /// Err: the rows fit once idle objects give their room, [`GRACE`]
    /// from now.
    #[allow(clippy::type_complexity)]
    fn place(
        &mut self,
        req: &Requested,
        rows: Vec<unwind_table::Row>,
        segments: Vec<Segment>,
    ) -> std::result::Result<
        (Option<ObjectTable>, Option<usize>),
        (Vec<unwind_table::Row>, Vec<Segment>),
    > {
        let max = types::unwind_limits::UNWIND_MAX_OBJECT_ROWS.0 as usize;
        let start = if rows.len() > max {
            None
        } else {
            self.alloc_rows(rows.len(), &[])
        };
        if start.is_none()
            && rows.len() <= max
            && (self.rows.longest_with(&self.coming()) >= rows.len()
                || self.compact(rows.len())
                || self.let_go_cold(rows.len(), req.tgid))
        {
            return Err((rows, segments));
        }
        let Some(start) = start else {
            if req.first {
                self.refuse(
                    req.tgid,
                    &req.name,
                    format!(
                        "its {} unwind rows do not fit (--unwind-memory)",
                        rows.len()
                    ),
                );
                if let Some(n) = self.not_covered.last_mut() {
                    n.object = Some(req.object);
                }
            }
            return Ok((None, (rows.len() <= max).then_some(rows.len())));
        };
        // Written a piece at a time, so that no second copy of a large
        // table is made.
        let written = rows.chunks(1 << 16).enumerate().try_for_each(|(i, chunk)| {
            let converted: Vec<types::unwind_row> = chunk.iter().map(|&r| r.into()).collect();
            self.store().write_rows(start + (i << 16), &converted)
        });
        if let Err(e) = written {
            self.rows.free(start, rows.len());
            if req.first {
                self.refuse(req.tgid, &req.name, format!("{e:#}"));
            }
            return Ok((None, None));
        }
        Ok((
            Some(ObjectTable {
                row_start: start as u32,
                row_count: rows.len() as u32,
                segments,
            }),
            None,
        ))
    }

    /// The BPF program's entries for `mappings`: each points at its
    /// object's rows, where it has a table.
    fn entries_of(&self, mappings: &[ExecMapping]) -> Vec<types::unwind_mapping> {
        let mut entries = Vec::with_capacity(mappings.len());
        for m in mappings {
            let mut e = types::unwind_mapping {
                start: m.start,
                end: m.end,
                ..Default::default()
            };
            let table = self.objects.get(&m.object).and_then(|o| o.table.as_ref());
            if let Some(t) = table {
                if let Some(bias) = bias(&t.segments, m) {
                    e.bias = bias;
                    e.row_start = t.row_start;
                    e.row_count = t.row_count;
                }
            }
            entries.push(e);
        }
        entries
    }

    /// Rows that come free within [`GRACE`]: those of objects whose file
    /// entries were removed and that no process maps, and those that tables
    /// moved from (see [`Unwinder::compact`]).
    fn coming(&self) -> Vec<(usize, usize)> {
        let mut v = self.freeing();
        v.extend(self.moved_from.iter().map(|&(_, start, len)| (start, len)));
        v
    }

    /// Makes a run of `len` rows come free where the free rows are enough
    /// but in pieces: tables in use are moved down into the holes below
    /// them, the highest first, until there would be such a run. A table is
    /// copied to its new place, the processes that map it and its file
    /// entry are pointed there, and its old rows are given back [`GRACE`]
    /// later, when no walk can still be reading them. Whether any moved.
    fn compact(&mut self, len: usize) -> bool {
        let free: usize = self.rows.capacity - self.rows.used;
        let coming: usize = self.coming().iter().map(|&(_, l)| l).sum();
        if free + coming < len {
            return false;
        }
        let mut order: Vec<(usize, u32, usize)> = self
            .objects
            .iter()
            .filter(|(_, e)| !(e.refs == 0 && matches!(e.file, FileEntry::Removed(_))))
            .filter_map(|(&o, e)| {
                let t = e.table.as_ref()?;
                Some((t.row_start as usize, o, t.row_count as usize))
            })
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let mut moved = false;
        for (from, object, count) in order {
            if self.rows.longest_with(&self.coming()) >= len {
                break;
            }
            let Some(to) = self.rows.alloc(count) else {
                continue;
            };
            if to >= from || self.move_rows(object, from, to, count).is_err() {
                self.rows.free(to, count);
                continue;
            }
            self.moved_from.push_back((Instant::now(), from, count));
            self.stats.tables_moved += 1;
            moved = true;
        }
        moved
    }

    /// Copies `object`'s `count` rows from `from` to `to` and points its
    /// processes and its file entry at them.
    fn move_rows(&mut self, object: u32, from: usize, to: usize, count: usize) -> Result<()> {
        let mut copy: Vec<types::unwind_row> = Vec::new();
        let store = self
            .store
            .as_deref_mut()
            .ok_or_else(|| anyhow::anyhow!("no store"))?;
        store.read(&mut |rows, _| {
            if let Some(r) = rows.get(from..from + count) {
                copy = r.to_vec();
            }
        })?;
        if copy.len() != count {
            anyhow::bail!("the rows to move are not there");
        }
        for (i, chunk) in copy.chunks(1 << 16).enumerate() {
            store.write_rows(to + (i << 16), chunk)?;
        }
        drop(copy);
        if let Some(t) = self.objects.get_mut(&object).and_then(|e| e.table.as_mut()) {
            t.row_start = to as u32;
        }
        let users: Vec<(usize, Vec<ExecMapping>)> = self
            .processes
            .values()
            .filter(|p| p.objects.contains(&object))
            .filter_map(|p| Some((p.slice?.0, p.mappings.clone())))
            .collect();
        let mut done = HashSet::new();
        for (start, mappings) in users {
            // A slice shared with a forked child is written once.
            if done.insert(start) {
                let entries = self.entries_of(&mappings);
                self.store().write_mappings(start, &entries)?;
            }
        }
        if matches!(
            self.objects.get(&object).map(|e| e.file),
            Some(FileEntry::Written(_))
        ) {
            self.register(object);
        }
        Ok(())
    }

    /// Writes the mappings of a process whose objects are all settled and
    /// points it at them.
    fn install(
        &mut self,
        procs: &dyn Processes,
        tgid: u32,
        mappings: Vec<ExecMapping>,
        objects: Vec<u32>,
    ) {
        let _ = procs;

        let entries = self.entries_of(&mappings);

        for &o in &objects {
            if let Some(e) = self.objects.get_mut(&o) {
                e.refs += 1;
                e.idle_since = None;
                if matches!(e.file, FileEntry::Removed(_)) {
                    self.register(o);
                }
            }
        }
        let lacking: Vec<u32> = objects
            .iter()
            .copied()
            .filter(|o| {
                self.objects
                    .get(o)
                    .is_some_and(|e| e.table.is_none() && e.wants_rows.is_some())
            })
            .collect();
        self.let_go.remove(&tgid);
        self.pending.remove(&tgid);
        if lacking.is_empty() {
            self.retry_at.remove(&tgid);
        }
        let old = self.processes.remove(&tgid);
        if old
            .as_ref()
            .is_some_and(|o| o.lacking.len() > lacking.len() && o.mappings == mappings)
        {
            self.stats.processes_given_room += 1;
        }
        // Whatever happens, these mappings are dealt with: a process that
        // cannot be covered is not tried (and reported) again until they
        // change.
        let slice = match self.store_process(tgid, &entries) {
            Ok(slice) => {
                if old.as_ref().is_none_or(|o| o.slice.is_none()) {
                    self.stats.processes_covered += 1;
                }
                Some(slice)
            }
            Err(why) => {
                // Tables built for other mappings would be wrong now.
                self.store().remove_process(tgid);
                self.refuse(tgid, "the process", why);
                None
            }
        };
        if let Some(old) = old {
            self.release(old);
        }
        let space = self.address_spaces.get(&tgid).copied().unwrap_or_default();
        self.processes.insert(
            tgid,
            ProcessEntry {
                mappings,
                slice,
                objects,
                space,
                lacking,
            },
        );
        self.update_stats();
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

    /// Writes a process's mappings and points it at them.
    fn store_process(
        &mut self,
        tgid: u32,
        entries: &[types::unwind_mapping],
    ) -> Result<(usize, usize), String> {
        let count = entries.len();
        if count > types::unwind_limits::UNWIND_MAX_PROC_MAPPINGS.0 as usize {
            return Err(format!("{count} executable mappings"));
        }
        let start = self
            .mappings
            .alloc(count)
            .ok_or("the unwind tables are full (--unwind-memory)")?;
        let written = self.store().write_mappings(start, entries).and_then(|()| {
            let space = self.address_spaces.get(&tgid).copied().unwrap_or_default();
            self.store()
                .set_process(tgid, start as u32, count as u32, space)
        });
        if let Err(e) = written {
            self.mappings.free(start, count);
            return Err(format!("{e:#}"));
        }
        self.slice_users.insert(start, 1);
        Ok((start, count))
    }

    /// The longest run of rows that is free or could be freed for an
    /// object now (each object's rows are one run).
    fn room(&self, keep: &[u32]) -> usize {
        let now = Instant::now();
        let idle: Vec<(usize, usize)> = self
            .objects
            .iter()
            .filter(|(id, e)| Self::idle(id, e, keep, now))
            .filter_map(|(_, e)| e.table.as_ref())
            .map(|t| (t.row_start as usize, t.row_count as usize))
            .collect();
        self.rows.longest_with(&idle)
    }

    /// An object with rows that no process noted maps, for [`GRACE`].
    fn idle(id: &u32, e: &ObjectEntry, keep: &[u32], now: Instant) -> bool {
        e.table.is_some()
            && e.refs == 0
            && !keep.contains(id)
            && e.idle_since.is_some_and(|t| now.duration_since(t) >= GRACE)
    }

    /// ... whose rows no walk can be reading: the BPF program has not
    /// found it by its file for [`GRACE`] either.
    fn evictable(id: &u32, e: &ObjectEntry, keep: &[u32], now: Instant) -> bool {
        Self::idle(id, e, keep, now)
            && match e.file {
                FileEntry::Never => true,
                FileEntry::Written(_) => false,
                FileEntry::Removed(t) => now.duration_since(t) >= GRACE,
            }
    }

    /// Rows that objects whose file entries were removed give within
    /// [`GRACE`].
    fn freeing(&self) -> Vec<(usize, usize)> {
        self.objects
            .values()
            .filter(|e| e.refs == 0 && matches!(e.file, FileEntry::Removed(_)))
            .filter_map(|e| e.table.as_ref())
            .map(|t| (t.row_start as usize, t.row_count as usize))
            .collect()
    }

    /// Room for `len` rows: free space, else the space of objects idle for
    /// longer than [`GRACE`], the longest idle first.
    fn alloc_rows(&mut self, len: usize, keep: &[u32]) -> Option<usize> {
        loop {
            if let Some(start) = self.rows.alloc(len) {
                return Some(start);
            }
            let now = Instant::now();
            let victim = self
                .objects
                .iter()
                .filter(|(id, e)| Self::evictable(id, e, keep, now))
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(&id, _)| id);
            let Some(victim) = victim else {
                // Idle objects the BPF program may still find by their
                // files: no longer, the longest idle first, until their
                // rows would do (they can be reused GRACE from now).
                let mut idle: Vec<(Instant, u32, usize)> = self
                    .objects
                    .iter()
                    .filter(|(id, e)| {
                        Self::idle(id, e, keep, now) && matches!(e.file, FileEntry::Written(_))
                    })
                    .filter_map(|(&id, e)| {
                        Some((e.idle_since?, id, e.table.as_ref()?.row_count as usize))
                    })
                    .collect();
                idle.sort_unstable();
                let mut coming = self.coming();
                for (_, id, _) in idle {
                    if self.rows.longest_with(&coming) >= len {
                        break;
                    }
                    self.unregister(id);
                    if let Some(t) = self.objects.get(&id).and_then(|e| e.table.as_ref()) {
                        coming.push((t.row_start as usize, t.row_count as usize));
                    }
                }
                return None;
            };
            if let Some(ObjectEntry { table: Some(t), .. }) = self.objects.remove(&victim) {
                self.rows.free(t.row_start as usize, t.row_count as usize);
                self.stats.objects_evicted += 1;
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
}

impl crate::deferred::ProcessTables for Unwinder {
    fn slice(&self, tgid: u32, space: AddressSpace) -> Option<(usize, usize)> {
        self.processes
            .get(&tgid)
            .filter(|p| p.space == space && space.mm != 0)
            .and_then(|p| p.slice)
    }

    fn read_all(&self, f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping])) -> bool {
        self.store
            .as_deref()
            .is_some_and(|store| store.read(f).is_ok())
    }
}

/// What to subtract from an address in mapping `m` to get the object's
/// virtual address: the mapping's file offset located in a loadable
/// segment. A segment's file offset need not be page-aligned while the
/// mapping's is, so the page a segment starts in may also hold the end of
/// the one before (linkers such as lld pack them): the last segment that
/// the mapping's first page reaches is the one mapped.
fn bias(segments: &[Segment], m: &ExecMapping) -> Option<u64> {
    let s = segments.iter().rfind(|s| {
        m.file_offset >= s.offset & !0xfff
            && s.offset
                .checked_add(s.filesz)
                .is_some_and(|end| m.file_offset < end)
    })?;
    Some(
        m.start
            .wrapping_sub(m.file_offset)
            .wrapping_sub(s.vaddr.wrapping_sub(s.offset)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_of_a_shared_library_text_mapping() {
        // libc: text at file offset 0x28000, vaddr 0x28000, mapped at
        // 0x7f00_0002_8000.
        let segments = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x28000,
            },
            Segment {
                offset: 0x28000,
                vaddr: 0x28000,
                filesz: 0x15_0000,
            },
        ];
        let m = ExecMapping {
            start: 0x7f00_0002_8000,
            end: 0x7f00_0017_8000,
            file_offset: 0x28000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0x7f00_0000_0000));
    }

    #[test]
    fn bias_where_vaddr_and_offset_differ() {
        // A non-PIE executable: text at file offset 0x1000, vaddr 0x401000.
        let segments = [Segment {
            offset: 0x1000,
            vaddr: 0x401000,
            filesz: 0x2000,
        }];
        let m = ExecMapping {
            start: 0x401000,
            end: 0x403000,
            file_offset: 0x1000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0));
        let outside = ExecMapping {
            file_offset: 0x9000,
            ..m
        };
        assert_eq!(bias(&segments, &outside), None);
    }

    #[test]
    fn bias_of_a_text_segment_sharing_a_page_with_the_one_before() {
        // lld's layout: read-only data up to 0x4a5b0, text from file
        // offset 0x4a5c0 at vaddr 0x4b5c0; the text mapping starts at the
        // page holding both.
        let segments = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x4a5b0,
            },
            Segment {
                offset: 0x4a5c0,
                vaddr: 0x4b5c0,
                filesz: 0x9_0000,
            },
        ];
        let m = ExecMapping {
            start: 0x5555_5559_f000,
            end: 0x5555_5563_0000,
            file_offset: 0x4a000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0x5555_5559_f000 - 0x4b000));
    }

    #[test]
    fn ranges_are_reused_and_merged() {
        let mut a = RangeAlloc::new(100);
        let x = a.alloc(30).unwrap();
        let y = a.alloc(30).unwrap();
        let z = a.alloc(30).unwrap();
        assert_eq!((x, y, z), (0, 30, 60));
        assert_eq!(a.alloc(20), None, "only 10 left");
        a.free(y, 30);
        assert_eq!(a.alloc(40), None, "30 + 10 apart");
        a.free(z, 30);
        // y, z and the last 10 merge into one range of 70.
        assert_eq!(a.alloc(70), Some(30));
        a.free(30, 70);
        a.free(x, 30);
        assert_eq!(a.used, 0);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.alloc(100), Some(0));
    }

    /// Tables in vectors, as the BPF maps would hold them.
    struct FakeStore {
        rows: usize,
        mappings: usize,
        procs: std::rc::Rc<std::cell::RefCell<HashMap<u32, (u32, u32)>>>,
        files: std::rc::Rc<std::cell::RefCell<HashMap<u64, u32>>>,
        /// Last use of processes (see TableStore::last_used).
        used: std::rc::Rc<std::cell::RefCell<HashMap<u32, u64>>>,
        /// The rows and mappings written.
        data: std::rc::Rc<std::cell::RefCell<(Vec<types::unwind_row>, Vec<types::unwind_mapping>)>>,
    }

    impl TableStore for FakeStore {
        fn row_capacity(&self) -> usize {
            self.rows
        }
        fn mapping_capacity(&self) -> usize {
            self.mappings
        }
        fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()> {
            assert!(start + rows.len() <= self.rows);
            let mut d = self.data.borrow_mut();
            d.0.resize(self.rows, types::unwind_row::default());
            d.0[start..start + rows.len()].copy_from_slice(rows);
            Ok(())
        }
        fn write_mappings(&mut self, start: usize, m: &[types::unwind_mapping]) -> Result<()> {
            assert!(start + m.len() <= self.mappings);
            let mut d = self.data.borrow_mut();
            d.1.resize(self.mappings, types::unwind_mapping::default());
            d.1[start..start + m.len()].copy_from_slice(m);
            Ok(())
        }
        fn set_process(
            &mut self,
            tgid: u32,
            start: u32,
            count: u32,
            _space: AddressSpace,
        ) -> Result<()> {
            self.procs.borrow_mut().insert(tgid, (start, count));
            Ok(())
        }
        fn remove_process(&mut self, tgid: u32) {
            self.procs.borrow_mut().remove(&tgid);
        }
        fn read(
            &self,
            f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping]),
        ) -> Result<()> {
            let d = self.data.borrow();
            f(&d.0, &d.1);
            Ok(())
        }
        fn set_file(
            &mut self,
            key: &types::unwind_file_key,
            file: &types::unwind_file,
        ) -> Result<()> {
            self.files.borrow_mut().insert(key.ino, file.row_count);
            Ok(())
        }
        fn remove_file(&mut self, key: &types::unwind_file_key) {
            self.files.borrow_mut().remove(&key.ino);
        }
        fn last_used(&self, tgid: u32) -> Option<u64> {
            // Used just now, unless a test said otherwise.
            self.procs.borrow().get(&tgid)?;
            Some(
                self.used
                    .borrow()
                    .get(&tgid)
                    .copied()
                    .unwrap_or_else(crate::raw::monotonic_ns),
            )
        }
    }

    /// Processes that each map the test binary (object 0) at their own
    /// address, plus, for some, libc (object 1).
    struct FakeProcesses {
        files: Vec<File>,
        with_libc: Vec<u32>,
        moved: Vec<u32>,
    }

    fn libc_path() -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so"))
            .expect("libc mapped")
            .to_string()
    }

    impl FakeProcesses {
        fn new() -> FakeProcesses {
            FakeProcesses {
                files: vec![
                    File::open("/proc/self/exe").unwrap(),
                    File::open(libc_path()).unwrap(),
                ],
                with_libc: Vec::new(),
                moved: Vec::new(),
            }
        }
    }

    impl Processes for FakeProcesses {
        fn mappings(&self, tgid: u32) -> Vec<ExecMapping> {
            let base = 0x5500_0000_0000 + u64::from(tgid) * 0x1_0000_0000;
            let base = base
                + if self.moved.contains(&tgid) {
                    0x1000_0000
                } else {
                    0
                };
            let mut out = vec![ExecMapping {
                start: base,
                end: base + 0x10_0000,
                file_offset: 0,
                object: 0,
            }];
            if self.with_libc.contains(&tgid) {
                out.push(ExecMapping {
                    start: 0x7f00_0000_0000,
                    end: 0x7f00_0010_0000,
                    file_offset: 0,
                    object: 1,
                });
            }
            out
        }
        fn object_file(&self, object: u32) -> Option<&File> {
            self.files.get(object as usize)
        }
        fn object_name(&self, object: u32) -> &str {
            ["exe", "libc"][object as usize]
        }
        fn object_identity(&self, object: u32) -> Option<FileIdentity> {
            Some(FileIdentity {
                dev: 1,
                ino: u64::from(object),
                size: self.files.get(object as usize)?.metadata().ok()?.len(),
            })
        }
    }

    /// Tables for `tgid`, built and installed.
    fn cover(u: &mut Unwinder, procs: &dyn Processes, tgid: u32) {
        u.note_process(procs, tgid);
        u.finish(procs, Duration::from_secs(60));
        assert!(u.waiting.is_empty() && u.building.is_empty());
    }

    fn rows_of(f: &File) -> usize {
        unwind_table::build(f).unwrap().unwrap().0.len()
    }

    #[test]
    fn churn_never_fills_the_tables() {
        let procs = FakeProcesses::new();
        let exe_rows = rows_of(&procs.files[0]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        // Room for the binary's rows and ten processes' mappings.
        let mut u = Unwinder::new(FakeStore {
            rows: exe_rows + 10,
            mappings: 10,
            procs: live.clone(),
            files: Default::default(),
            used: Default::default(),
            data: Default::default(),
        });
        for round in 0..10u32 {
            for tgid in round * 5 + 1..=round * 5 + 5 {
                cover(&mut u, &procs, tgid);
            }
            for tgid in round * 5 + 1..=round * 5 + 5 {
                u.forget(tgid);
            }
            std::thread::sleep(GRACE);
        }
        u.reclaim();
        let s = u.stats();
        assert_eq!(u.not_covered().0, &[], "{s:?}");
        assert_eq!(s.processes_covered, 50);
        assert_eq!(s.processes_forgotten, 50);
        assert_eq!((s.processes, s.mappings), (0, 0));
        assert!(live.borrow().is_empty());
        // The binary's table was built once and stays while it fits.
        assert_eq!((s.objects, s.rows), (1, exe_rows));
    }

    #[test]
    fn a_forked_child_shares_its_parents_slice_while_either_lives() {
        let procs = FakeProcesses::new();
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let mut u = Unwinder::new(FakeStore {
            rows: rows_of(&procs.files[0]) + 10,
            mappings: 10,
            procs: live.clone(),
            files: Default::default(),
            used: Default::default(),
            data: Default::default(),
        });
        cover(&mut u, &procs, 1);
        let slice = u.processes[&1].slice.expect("the parent has tables");
        let space = AddressSpace { mm: 7, exec_vm: 9 };
        assert!(u.forked(1, 2, space, slice));
        // Not the parent's slice (rewritten meanwhile): no sharing, and
        // the entry the BPF program made is removed.
        live.borrow_mut().insert(3, (0, 0));
        assert!(!u.forked(1, 3, space, (slice.0 + 1, slice.1)));
        assert!(!live.borrow().contains_key(&3));
        // The parent exits: the slice stays the child's.
        u.forget(1);
        std::thread::sleep(GRACE);
        u.reclaim();
        assert_eq!(u.stats().mappings, slice.1);
        assert_eq!(u.processes[&2].slice, Some(slice));
        assert_eq!(u.processes[&2].space, space);
        // ... and is given back once the child exits too.
        u.forget(2);
        std::thread::sleep(GRACE);
        u.reclaim();
        assert_eq!(u.stats().mappings, 0);
        assert_eq!(u.stats().processes_forked, 1);
    }

    #[test]
    fn tables_built_before_the_store_are_written_once_it_is_set() {
        let mut procs = FakeProcesses::new();
        procs.with_libc = vec![2];
        let rows = rows_of(&procs.files[0]) + rows_of(&procs.files[1]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let mut u = Unwinder::without_store(rows, 4);
        for tgid in [1, 2] {
            assert!(!u.note_process(&procs, tgid));
        }
        // Nothing is taken in, nor written anywhere, without a store.
        assert!(u.poll(&procs));
        u.finish(&procs, Duration::from_secs(60));
        assert_eq!(u.stats().processes_covered, 0);
        // The builder has had time to finish: what it built waits.
        std::thread::sleep(Duration::from_millis(200));
        u.set_store(
            &procs,
            FakeStore {
                rows,
                mappings: 4,
                procs: live.clone(),
                files: Default::default(),
                used: Default::default(),
                data: Default::default(),
            },
        );
        u.finish(&procs, Duration::from_secs(60));
        assert!(u.waiting.is_empty() && u.building.is_empty());
        let s = u.stats();
        assert_eq!(u.not_covered().0, &[], "{s:?}");
        assert_eq!((s.processes_covered, s.objects, s.rows), (2, 2, rows));
        assert_eq!(live.borrow().len(), 2);
        assert_eq!(live.borrow()[&2].1, 2);
    }

    #[test]
    fn store_of_other_capacities_starts_over() {
        let procs = FakeProcesses::new();
        let rows = rows_of(&procs.files[0]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let mut u = Unwinder::without_store(1, 1);
        assert!(!u.note_process(&procs, 1));
        u.set_store(
            &procs,
            FakeStore {
                rows,
                mappings: 2,
                procs: live.clone(),
                files: Default::default(),
                used: Default::default(),
                data: Default::default(),
            },
        );
        u.finish(&procs, Duration::from_secs(60));
        let s = u.stats();
        assert_eq!((s.processes_covered, s.row_capacity), (1, rows), "{s:?}");
        assert!(live.borrow().contains_key(&1));
    }

    #[test]
    fn idle_objects_make_room_and_live_ones_stay() {
        let mut procs = FakeProcesses::new();
        let exe_rows = rows_of(&procs.files[0]);
        let libc_rows = rows_of(&procs.files[1]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let files = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        // Room for either object's rows, not both.
        let mut u = Unwinder::new(FakeStore {
            rows: exe_rows.max(libc_rows),
            mappings: 16,
            procs: live.clone(),
            files: files.clone(),
            used: Default::default(),
            data: Default::default(),
        });
        procs.with_libc = vec![2];
        cover(&mut u, &procs, 1);
        // The BPF program finds the binary's rows by its file.
        assert_eq!(files.borrow().get(&0), Some(&(exe_rows as u32)));
        // Process 2 maps both: libc does not fit while process 1 lives.
        cover(&mut u, &procs, 2);
        assert_eq!(u.not_covered().0.len(), 1);
        assert_eq!(u.stats().objects, 1);
        u.forget(1);
        u.forget(2);
        // Idle, but not for long enough: its rows may still be read.
        procs.with_libc = vec![3];
        procs.moved = vec![3];
        cover(&mut u, &procs, 3);
        assert_eq!(u.stats().objects_evicted, 0);
        u.forget(3);
        std::thread::sleep(GRACE);
        u.reclaim();
        // Now only libc, mapped alone: the binary's idle table makes room.
        procs.with_libc = vec![4];
        let only_libc = FakeProcesses {
            files: vec![
                File::open("/proc/self/exe").unwrap(),
                File::open(libc_path()).unwrap(),
            ],
            with_libc: vec![4],
            moved: vec![],
        };
        let libc_only = Filtered(only_libc, |_, object| object == 1);
        cover(&mut u, &libc_only, 4);
        let s = u.stats();
        assert_eq!(s.objects_evicted, 1, "{s:?}");
        assert_eq!((s.objects, s.rows), (1, libc_rows));
        assert_eq!(live.borrow().get(&4).map(|&(_, n)| n), Some(1));
        // The binary's file entry went before its rows were reused.
        assert_eq!(files.borrow().get(&0), None);
        assert_eq!(files.borrow().get(&1), Some(&(libc_rows as u32)));
        assert_eq!(s.files, 1);
    }

    /// Fake processes with only the mappings `keep(tgid, object)` says.
    struct Filtered<F: Fn(u32, u32) -> bool>(FakeProcesses, F);
    impl<F: Fn(u32, u32) -> bool> Processes for Filtered<F> {
        fn mappings(&self, tgid: u32) -> Vec<ExecMapping> {
            self.0
                .mappings(tgid)
                .into_iter()
                .filter(|m| (self.1)(tgid, m.object))
                .collect()
        }
        fn object_file(&self, object: u32) -> Option<&File> {
            self.0.object_file(object)
        }
        fn object_name(&self, object: u32) -> &str {
            self.0.object_name(object)
        }
        fn object_identity(&self, object: u32) -> Option<FileIdentity> {
            self.0.object_identity(object)
        }
    }

    #[test]
    fn the_room_goes_to_the_process_that_blocks_now() {
        let mut fake = FakeProcesses::new();
        fake.with_libc = vec![2];
        // Process 1 maps only the test binary (object 0), process 2 only
        // libc (object 1).
        let procs = Filtered(fake, |tgid, object| {
            object == u32::from(tgid.is_multiple_of(2))
        });
        let exe_rows = rows_of(&procs.0.files[0]);
        let libc_rows = rows_of(&procs.0.files[1]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let files = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let used = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        // Room for either object's rows, not both.
        let mut u = Unwinder::new(FakeStore {
            rows: exe_rows.max(libc_rows),
            mappings: 16,
            procs: live.clone(),
            files: files.clone(),
            used: used.clone(),
            data: Default::default(),
        });
        cover(&mut u, &procs, 1);
        assert!(live.borrow().contains_key(&1));
        // Process 1 blocked just now: process 2 gets no room.
        cover(&mut u, &procs, 2);
        assert_eq!(u.not_covered().0.len(), 1);
        assert!(live.borrow().contains_key(&1));
        assert_eq!(u.stats().processes_let_go, 0);
        // Process 1 has not blocked for longer than COLD: its tables go to
        // process 2, blocking now, and only once no walk can read them.
        let long_ago = crate::raw::monotonic_ns() - 2 * COLD.as_nanos() as u64;
        used.borrow_mut().insert(1, long_ago);
        u.retried = Instant::now() - RETRY;
        // Once libc's table is built again (on the builder thread).
        let until = Instant::now() + Duration::from_secs(60);
        while u.stats().processes_let_go == 0 && Instant::now() < until {
            u.poll(&procs);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(u.stats().processes_let_go, 1);
        assert!(!live.borrow().contains_key(&1));
        assert_eq!(
            files.borrow().get(&0),
            None,
            "the binary's file entry went first"
        );
        u.finish(&procs, Duration::from_secs(60));
        let s = u.stats();
        assert_eq!(s.processes_given_room, 1, "{s:?}");
        assert_eq!(u.processes[&2].lacking, Vec::<u32>::new());
        assert!(u.not_covered().0[0].later);
        // Process 1 blocks again (a copy of its stack waits): it gets its
        // tables back once process 2 has gone cold in turn.
        used.borrow_mut().insert(2, long_ago);
        u.wanted(&procs, 1);
        u.finish(&procs, Duration::from_secs(60));
        let s = u.stats();
        assert_eq!(
            (s.processes_let_go, s.processes_taken_back),
            (2, 1),
            "{s:?}"
        );
        assert!(live.borrow().contains_key(&1) && !live.borrow().contains_key(&2));
        assert_eq!(u.processes[&1].lacking, Vec::<u32>::new());
        // Asked again while it lacks nothing, it is not built again.
        u.wanted(&procs, 1);
        assert_eq!(u.stats().processes_taken_back, 1);
    }

    /// Free rows in two pieces, neither long enough: the table above the
    /// lower piece moves down into it, its processes and file entry point
    /// at its new place, and its old rows join the upper piece once no
    /// walk can be reading them.
    #[test]
    fn tables_move_to_put_free_rows_together() {
        let procs = FakeProcesses::new();
        let exe_rows = rows_of(&procs.files[0]);
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let files = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let data = std::rc::Rc::new(std::cell::RefCell::new((Vec::new(), Vec::new())));
        let mut u = Unwinder::new(FakeStore {
            rows: 2 * exe_rows + 11,
            mappings: 4,
            procs: live.clone(),
            files: files.clone(),
            used: Default::default(),
            data: data.clone(),
        });
        // A hole of exe_rows + 1 rows below the binary's table, 10 above.
        let hole = u.rows.alloc(exe_rows + 1).unwrap();
        cover(&mut u, &procs, 1);
        u.rows.free(hole, exe_rows + 1);
        let old = u.objects[&0].table.as_ref().unwrap().row_start as usize;
        assert_eq!(old, exe_rows + 1);
        let key = |r: &types::unwind_row| (r.pc, r.cfa_off, r.kind, r.rbp_off);
        let before: Vec<_> = data.borrow().0[old..old + exe_rows]
            .iter()
            .map(key)
            .collect();
        let want = exe_rows + 5;
        assert!(u.rows.longest_with(&u.coming()) < want);
        assert!(u.compact(want));
        assert_eq!(u.stats().tables_moved, 1);
        let t = u.objects[&0].table.as_ref().unwrap();
        assert_eq!(t.row_start, 0);
        let d = data.borrow();
        let after: Vec<_> = d.0[..exe_rows].iter().map(key).collect();
        assert_eq!(after, before, "the rows copied whole");
        let (start, _) = live.borrow()[&1];
        assert_eq!(
            d.1[start as usize].row_start, 0,
            "the process points at them"
        );
        drop(d);
        // Not reusable before GRACE; then one run long enough.
        assert!(u.rows.alloc(want).is_none());
        std::thread::sleep(GRACE);
        u.reclaim();
        assert!(u.rows.alloc(want).is_some());
        assert!(files.borrow().contains_key(&0));
    }

    #[test]
    fn new_mappings_replace_the_old_slice() {
        let mut procs = FakeProcesses::new();
        let live = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
        let mut u = Unwinder::new(FakeStore {
            rows: 1 << 20,
            mappings: 4,
            procs: live.clone(),
            files: Default::default(),
            used: Default::default(),
            data: Default::default(),
        });
        cover(&mut u, &procs, 7);
        let first = live.borrow()[&7];
        // The same mappings: nothing to do.
        assert!(u.note_process(&procs, 7));
        assert_eq!(live.borrow()[&7], first);
        // A library loaded: a new slice, the old one reusable after GRACE.
        procs.with_libc = vec![7];
        cover(&mut u, &procs, 7);
        let second = live.borrow()[&7];
        assert_ne!(second.0, first.0);
        assert_eq!(second.1, 2);
        assert_eq!(u.stats().processes_covered, 1);
        // The old slice is still in use until GRACE has passed.
        assert_eq!(u.stats().mappings, 3);
        std::thread::sleep(GRACE);
        u.reclaim();
        assert_eq!(u.stats().mappings, 2);
        assert_eq!(u.mappings.free.values().sum::<usize>(), 2);
    }
}
