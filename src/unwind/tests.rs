//! Unit tests of the unwinder: biases, free ranges, and the tables of
//! processes that come, fork and go, with fake stores and processes.

use super::tables::bias;
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

#[test]
fn room_for_a_batch_ends_where_first_fit_puts_it() {
    let mut a = RangeAlloc::new(1000);
    let held: Vec<usize> = [100, 50, 200, 30, 70]
        .iter()
        .map(|&n| a.alloc(n).unwrap())
        .collect();
    // Holes of 50 at 100 and of 30 at 350; 550 free from 450.
    a.free(held[1], 50);
    a.free(held[3], 30);
    let lens = [40, 0, 30, 500, 10, 900];
    let end = a.end_after(&lens);
    let mut last = 0;
    for &n in &lens {
        if let Some(at) = a.alloc(n) {
            if n > 0 {
                last = last.max(at + n);
            }
        }
    }
    // 40 and then 10 in the first hole, 30 in the second, 500 from 450;
    // the 900 fits nowhere.
    assert_eq!((end, last), (950, 950));
    assert_eq!(RangeAlloc::new(0).end_after(&[10]), 0, "no room: none");
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
        _image: Image,
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
    fn set_file(&mut self, key: &types::unwind_file_key, file: &types::unwind_file) -> Result<()> {
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

#[test]
fn tables_cover_the_copies_of_the_spaces_said_before_their_reading() {
    use crate::deferred::ProcessTables;
    let mut procs = FakeProcesses::new();
    let mut u = Unwinder::new(FakeStore {
        rows: 1 << 20,
        mappings: 8,
        procs: Default::default(),
        files: Default::default(),
        used: Default::default(),
        data: Default::default(),
    });
    let space = |mm, exec_vm| AddressSpace { mm, exec_vm };
    // A new image said twice as the loader maps more (the events read
    // together), then its mappings read once: the tables cover both.
    u.note_address_space(7, space(0x1000, 41));
    u.note_address_space(7, space(0x1000, 383));
    cover(&mut u, &procs, 7);
    assert!(u.slice(7, space(0x1000, 383)).is_some());
    assert!(u.slice(7, space(0x1000, 41)).is_some());
    // Not another address space, nor sizes never said.
    assert!(u.slice(7, space(0x2000, 41)).is_none());
    assert!(u.slice(7, space(0x1000, 500)).is_none());
    // A size said after the reading is not covered by it: until its own
    // mappings are read, the tables are still those of 383 and before.
    u.note_address_space(7, space(0x1000, 500));
    assert!(u.slice(7, space(0x1000, 500)).is_none());
    procs.with_libc = vec![7];
    cover(&mut u, &procs, 7);
    for exec_vm in [41, 383, 500] {
        assert!(u.slice(7, space(0x1000, exec_vm)).is_some(), "{exec_vm}");
    }
    // An exec: a new address space, none of the old one's sizes.
    u.note_address_space(7, space(0x3000, 41));
    procs.with_libc = vec![];
    cover(&mut u, &procs, 7);
    assert!(u.slice(7, space(0x3000, 41)).is_some());
    assert!(u.slice(7, space(0x1000, 41)).is_none());
    assert!(u.slice(7, space(0x1000, 383)).is_none());
}
