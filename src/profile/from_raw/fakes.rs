//! Unit tests of [`build`] on made-up processes and names: frames in
//! order and named, addresses numbered per process, the object table,
//! `--addresses`, JIT names, lost stacks, the merge and the wakers.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use super::*;
use crate::raw::{RawEntry, RawWaker};
use crate::runtime::{Frame as RuntimeFrame, Kind};
use crate::symbolize::SIGNAL_FRAME_NAME;

const PYTHON_UNREADABLE: &str = "[python frame unreadable]";
use crate::unwind_table::SIGNAL_FRAME;

/// The start time of every made-up process.
const START: u64 = 7;

/// Processes made up: mappings, stacks kept of exited ones, perf maps,
/// Python code; counting the addresses looked up.
#[derive(Default)]
struct FakeFrames {
    /// Each process's mappings: start, end, object.
    maps: HashMap<u32, Vec<(u64, u64, u32)>>,
    /// The frames of stacks of exited processes, by process and id.
    kept: HashMap<(Proc, u64), Vec<UserFrame>>,
    /// The frames of stacks with Python frames, by id.
    python: HashMap<u64, Vec<UserFrame>>,
    /// Python code objects: line and file.
    codes: HashMap<u32, (u64, String)>,
    /// The path of each object.
    objects: Vec<&'static str>,
    /// The processes with a perf map.
    perf_maps: HashSet<Proc>,
    /// Addresses looked up through mappings, by process.
    lookups: RefCell<Vec<(u32, u64)>>,
    /// Objects whose information was asked for.
    infos: RefCell<Vec<u32>>,
}

/// One process's mappings, as the builder looks addresses up in them.
struct FakeMappings<'a> {
    /// Its process.
    tgid: u32,
    /// All the processes' mappings, and the count of lookups.
    frames: &'a FakeFrames,
}

/// Frames of the mapped objects at their offsets, counted.
impl MappedFrames for FakeMappings<'_> {
    fn frame(&self, addr: u64) -> UserFrame {
        self.frames.lookups.borrow_mut().push((self.tgid, addr));
        let maps = self
            .frames
            .maps
            .get(&self.tgid)
            .map_or(&[][..], Vec::as_slice);
        match maps.iter().find(|m| addr >= m.0 && addr < m.1) {
            Some(&(start, _, object)) => UserFrame::File {
                object,
                offset: addr - start,
            },
            None if addr == SIGNAL_FRAME => UserFrame::Signal,
            None => UserFrame::Unmapped(addr),
        }
    }

    fn any_read(&self) -> bool {
        self.frames.maps.contains_key(&self.tgid)
    }
}

/// The made-up processes' frames, kept stacks first.
impl FrameSource for FakeFrames {
    type Mappings<'a> = FakeMappings<'a>;

    fn runtime_places(&self, _: Proc, addrs: &[u64]) -> bool {
        addrs
            .iter()
            .any(|&a| crate::runtime::python::is_python_word(a))
    }

    fn runtime_frames(&mut self, _: Proc, id: u64, _: &[u64]) -> Vec<UserFrame> {
        self.python[&id].clone()
    }

    fn user_stack(&mut self, p: Proc, id: u64) -> UserStack<'_, FakeMappings<'_>> {
        match self.kept.get(&(p, id)) {
            Some(frames) => UserStack::Kept(frames),
            None => UserStack::Mapped(FakeMappings {
                tgid: p.tgid,
                frames: self,
            }),
        }
    }

    fn object_info(&self, object: u32) -> ObjectInfo {
        self.infos.borrow_mut().push(object);
        ObjectInfo {
            path: self.objects[object as usize].to_string(),
            build_id: vec![object as u8],
        }
    }

    fn runtime_place(&self, _: Kind, code: u32, _: u32) -> Option<(u64, &str)> {
        let (line, file) = self.codes.get(&code)?;
        Some((*line, file))
    }

    fn has_perf_maps(&self) -> bool {
        !self.perf_maps.is_empty()
    }

    fn has_perf_map(&self, p: Proc) -> bool {
        self.perf_maps.contains(&p)
    }

    fn container(&mut self, _: Proc) -> Option<Arc<super::super::Container>> {
        None
    }
}

/// Names made up: kernel functions by address, user functions by object
/// and offset (several for functions inlined there), `@ip` after the
/// name of an address looked up as an instruction pointer; JIT code
/// `jit_ADDR`.
#[derive(Default)]
struct FakeNames {
    /// Kernel functions by address.
    kernel: HashMap<u64, &'static str>,
    /// User functions by object and offset, innermost first.
    user: HashMap<(u32, u64), Vec<&'static str>>,
    /// `--addresses`.
    addresses: bool,
    /// The user frames asked for, in order.
    asked: RefCell<Vec<(UserFrame, AddrKind)>>,
    /// How many times kernel names were asked for.
    kernel_calls: Cell<usize>,
}

/// A name, `@ip` after it for an instruction pointer.
fn named(name: &str, kind: AddrKind) -> Named {
    let ip = if kind == AddrKind::Ip { "@ip" } else { "" };
    Named {
        name: format!("{name}{ip}").into(),
        shown: None,
    }
}

/// The made-up names (see [`FakeNames`]).
impl NameSource<FakeFrames> for FakeNames {
    fn kernel_names(&self, addrs: &[(u64, AddrKind)]) -> Names<(u64, AddrKind)> {
        self.kernel_calls.set(self.kernel_calls.get() + 1);
        addrs
            .iter()
            .filter_map(|&(a, k)| Some(((a, k), vec![named(self.kernel.get(&a)?, k)])))
            .collect()
    }

    fn user_names(
        &self,
        _: &FakeFrames,
        frames: &[(UserFrame, AddrKind)],
    ) -> Names<(UserFrame, AddrKind)> {
        self.asked.borrow_mut().extend_from_slice(frames);
        let name = |f: UserFrame, k: AddrKind| match f {
            UserFrame::File { object, offset } => Some(
                self.user
                    .get(&(object, offset))?
                    .iter()
                    .map(|n| named(n, k))
                    .collect(),
            ),
            UserFrame::Signal => Some(vec![named(SIGNAL_FRAME_NAME, AddrKind::Return)]),
            UserFrame::Runtime(_, RuntimeFrame::Code { code, .. }) => {
                Some(vec![named(&format!("py{code}"), k)])
            }
            UserFrame::Runtime(kind, RuntimeFrame::Unreadable) => {
                Some(vec![named(kind.spec().unreadable, AddrKind::Return)])
            }
            _ => None,
        };
        frames
            .iter()
            .filter_map(|&(f, k)| Some(((f, k), name(f, k)?)))
            .collect()
    }

    fn jit_name(
        &self,
        from: &FakeFrames,
        p: Proc,
        frame: UserFrame,
        addr: u64,
        _: AddrKind,
    ) -> Option<Named> {
        let jitted = from.perf_maps.contains(&p) && matches!(frame, UserFrame::Unmapped(_));
        jitted.then(|| named(&format!("jit_{addr:x}"), AddrKind::Return))
    }

    fn addresses(&self) -> bool {
        self.addresses
    }
}

/// Made-up process `tgid`.
fn proc(tgid: u32) -> Proc {
    Proc { tgid, start: START }
}

/// An entry of thread `pid` of process `tgid`: `ns` blocked in one block.
fn entry(tgid: u32, pid: u32, user: StackRef, kernel: StackRef, ns: u64) -> RawEntry {
    RawEntry {
        tgid,
        start: START,
        pid,
        comm: format!("app{tgid}"),
        user_stack: user,
        kernel_stack: kernel,
        state: None,
        waker: None,
        interval: 0,
        span: 1,
        total_ns: ns,
        count: 1,
    }
}

/// A raw profile of `entries` and stored `stacks`.
fn raw(entries: Vec<RawEntry>, stacks: &[(u64, &[u64])]) -> RawProfile {
    let mut raw = RawProfile {
        entries,
        ..Default::default()
    };
    for &(id, frames) in stacks {
        raw.stacks.insert(id, frames);
    }
    raw
}

/// The frames of a part as the text outputs show them.
fn texts(part: &Part) -> Vec<String> {
    match part {
        Part::Frames(frames) => frames.iter().map(|f| f.text().to_string()).collect(),
        other => vec![format!("{other:?}")],
    }
}

/// The frames of a part.
fn frames(part: &Part) -> &[Frame] {
    match part {
        Part::Frames(frames) => frames,
        other => panic!("no frames: {other:?}"),
    }
}

/// Process 10: the program (object 0) at 0x1000, libc (object 1) at
/// 0x5000; their functions; a few kernel functions.
fn program() -> (FakeFrames, FakeNames) {
    let mut source = FakeFrames {
        objects: vec!["/bin/app", "/lib/libc.so.6"],
        ..Default::default()
    };
    source
        .maps
        .insert(10, vec![(0x1000, 0x2000, 0), (0x5000, 0x6000, 1)]);
    let mut names = FakeNames::default();
    for (object, offset, name) in [
        (0, 0x10, "main"),
        (0, 0x20, "run"),
        (0, 0x30, "wait"),
        (1, 0x10, "read"),
    ] {
        names.user.insert((object, offset), vec![name]);
    }
    for (addr, name) in [
        (0xffff_0010, "schedule"),
        (0xffff_0020, "do_sys_read"),
        (0xffff_0030, "entry_SYSCALL_64"),
    ] {
        names.kernel.insert(addr, name);
    }
    (source, names)
}

/// The id of a stored user stack (others follow it).
const USER: u64 = 1 << 62;
/// The id of a stored kernel stack (others follow it).
const KERNEL: u64 = (1 << 62) + 1000;

/// Kernel and user frames innermost first, each named; the first an
/// instruction pointer where the stack says so; user frames at their
/// offsets in the objects, numbered as first met.
#[test]
fn kernel_and_user_frames_in_order_and_named() {
    let (mut source, names) = program();
    let raw = raw(
        vec![entry(10, 11, StackRef::Id(USER), StackRef::Id(KERNEL), 100)],
        &[
            (USER, &[0x5010, 0x1030, 0x1020, 0x1010]),
            (KERNEL, &[0xffff_0010, 0xffff_0020, 0xffff_0030]),
        ],
    );
    for (first_is_ip, schedule) in [(true, "schedule@ip"), (false, "schedule")] {
        let profile = build(&raw, &mut source, &names, first_is_ip);
        assert_eq!(profile.samples.len(), 1);
        let s = &profile.samples[0];
        assert_eq!((s.tgid, s.pid, s.comm.as_str()), (10, 11, "app10"));
        assert_eq!((s.total_ns, s.count), (100, 1));
        assert_eq!(texts(&s.user), ["read@ip", "wait", "run", "main"]);
        assert_eq!(
            texts(&s.kernel),
            [schedule, "do_sys_read", "entry_SYSCALL_64"]
        );
        let user: Vec<(u64, Origin)> = frames(&s.user).iter().map(|f| (f.addr, f.origin)).collect();
        use Origin::Object;
        assert_eq!(
            user,
            [
                (0x10, Object(0)),
                (0x30, Object(1)),
                (0x20, Object(1)),
                (0x10, Object(1))
            ]
        );
        assert!(frames(&s.kernel)
            .iter()
            .all(|f| f.origin == Origin::Kernel && !f.inlined));
        assert_eq!(frames(&s.kernel)[1].addr, 0xffff_0020);
        // Libc first: its frame was met first.
        let paths: Vec<&str> = profile.objects.iter().map(|o| o.path.as_str()).collect();
        assert_eq!(paths, ["/lib/libc.so.6", "/bin/app"]);
        assert_eq!(profile.objects[1].build_id, [0]);
    }
    // Each object's information asked for once a profile.
    assert_eq!(*source.infos.borrow(), [1, 0, 1, 0]);
}

/// Functions inlined at an address are frames of their own, innermost
/// first, at the same address, all but the last marked inlined; an
/// address without a name is `[unknown]`, at its address.
#[test]
fn inlined_functions_and_unknown_addresses() {
    let (mut source, mut names) = program();
    names
        .user
        .insert((0, 0x30), vec!["inner", "middle", "wait"]);
    let raw = raw(
        vec![entry(10, 10, StackRef::Id(USER), StackRef::None, 1)],
        &[(USER, &[0x1030, 0x1040, 0x9000])],
    );
    let profile = build(&raw, &mut source, &names, true);
    let s = &profile.samples[0];
    assert_eq!(
        texts(&s.user),
        ["inner@ip", "middle@ip", "wait@ip", "[unknown]", "[unknown]"]
    );
    let got: Vec<(u64, bool)> = frames(&s.user)
        .iter()
        .map(|f| (f.addr, f.inlined))
        .collect();
    assert_eq!(
        got,
        [
            (0x30, true),
            (0x30, true),
            (0x30, false),
            (0x40, false),
            (0x9000, false)
        ]
    );
    assert_eq!(frames(&s.user)[4].origin, Origin::Unknown);
    assert_eq!(s.kernel, Part::Absent);
}

/// Blocks of one thread in equal stacks are one sample, their time and
/// blocks summed, even under different stack ids; another thread or
/// other stacks are samples of their own.
#[test]
fn equal_stacks_merge_summing_time() {
    let (mut source, names) = program();
    let other_kernel = KERNEL + 1;
    let mut entries = vec![
        entry(10, 11, StackRef::Id(USER), StackRef::Id(KERNEL), 100),
        entry(10, 11, StackRef::Id(USER + 1), StackRef::Id(KERNEL), 250),
        entry(10, 11, StackRef::Id(USER), StackRef::Id(other_kernel), 1000),
        entry(10, 12, StackRef::Id(USER), StackRef::Id(KERNEL), 2000),
    ];
    entries[1].count = 2;
    let raw = raw(
        entries,
        &[
            (USER, &[0x1030, 0x1010]),
            (USER + 1, &[0x1030, 0x1010]),
            (KERNEL, &[0xffff_0010, 0xffff_0020]),
            (other_kernel, &[0xffff_0010, 0xffff_0030]),
        ],
    );
    let profile = build(&raw, &mut source, &names, false);
    let got: Vec<(u32, u64, u64, Vec<String>)> = profile
        .samples
        .iter()
        .map(|s| (s.pid, s.total_ns, s.count, texts(&s.kernel)))
        .collect();
    let k = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        [
            (11, 350, 3, k(&["schedule", "do_sys_read"])),
            (11, 1000, 1, k(&["schedule", "entry_SYSCALL_64"])),
            (12, 2000, 1, k(&["schedule", "do_sys_read"])),
        ]
    );
    assert!(profile
        .samples
        .iter()
        .all(|s| texts(&s.user) == ["wait@ip", "main"]));
}

/// An address is a frame of its own process: the same address in two
/// processes is looked up in each, once however many stacks have it, and
/// each distinct frame is named once. A process with hundreds of return
/// addresses has each still named right.
#[test]
fn addresses_numbered_per_process() {
    let (mut source, mut names) = program();
    // Process 20 maps libc where process 10 has its program.
    source.maps.insert(20, vec![(0x1000, 0x2000, 1)]);
    names.user.insert((1, 0x20), vec!["write"]);
    let mut stacks: Vec<(u64, Vec<u64>)> = vec![(USER, vec![0x1020, 0x1010])];
    let mut entries = vec![
        entry(10, 10, StackRef::Id(USER), StackRef::None, 1),
        entry(20, 20, StackRef::Id(USER), StackRef::None, 2),
    ];
    // Process 30: 600 stacks, each through a return address of its own
    // and one they share.
    source.maps.insert(30, vec![(0x10_0000, 0x20_0000, 0)]);
    for i in 0..600u64 {
        let id = USER + 10 + i;
        names.user.insert(
            (0, 0x100 + i),
            vec![Box::leak(format!("f{i}").into_boxed_str())],
        );
        stacks.push((id, vec![0x10_0010, 0x10_0100 + i, 0x10_0020]));
        entries.push(entry(30, 30, StackRef::Id(id), StackRef::None, 1000 + i));
    }
    let stacks: Vec<(u64, &[u64])> = stacks.iter().map(|(id, f)| (*id, &f[..])).collect();
    let raw = raw(entries, &stacks);
    let profile = build(&raw, &mut source, &names, false);
    let of = |tgid: u32| {
        let s = profile.samples.iter().filter(|s| s.tgid == tgid);
        s.map(|s| (s.total_ns, texts(&s.user))).collect::<Vec<_>>()
    };
    assert_eq!(
        of(10),
        [(1, vec!["run@ip".to_string(), "main".to_string()])]
    );
    assert_eq!(
        of(20),
        [(2, vec!["write@ip".to_string(), "read".to_string()])]
    );
    let got = of(30);
    assert_eq!(got.len(), 600);
    for (i, (ns, user)) in got.into_iter().enumerate() {
        assert_eq!(ns, 1000 + i as u64);
        assert_eq!(
            user,
            ["main@ip".to_string(), format!("f{i}"), "run".to_string()]
        );
    }
    let lookups = source.lookups.borrow();
    let distinct: HashSet<&(u32, u64)> = lookups.iter().collect();
    assert_eq!(lookups.len(), distinct.len());
    assert_eq!(lookups.len(), 2 + 2 + 602);
    let asked = names.asked.borrow();
    assert_eq!(asked.len(), asked.iter().collect::<HashSet<_>>().len());
}

/// With `--addresses`, each frame shows its address first: a user
/// frame's in its process (its own address is still the offset in its
/// file), a kernel frame's; a signal frame, which has none, shows its
/// name only.
#[test]
fn addresses_mode_shows_each_frames_address() {
    let (mut source, mut names) = program();
    names.addresses = true;
    let raw = raw(
        vec![entry(10, 10, StackRef::Id(USER), StackRef::Id(KERNEL), 5)],
        &[
            (USER, &[0x5010, SIGNAL_FRAME, 0x1020, 0x1010]),
            (KERNEL, &[0xffff_0010, 0xffff_0020]),
        ],
    );
    let profile = build(&raw, &mut source, &names, true);
    let s = &profile.samples[0];
    assert_eq!(
        texts(&s.user),
        [
            "0x5010:read@ip",
            SIGNAL_FRAME_NAME,
            "0x1020:run@ip",
            "0x1010:main"
        ]
    );
    let names_only: Vec<&str> = frames(&s.user).iter().map(|f| &*f.name).collect();
    assert_eq!(names_only, ["read@ip", SIGNAL_FRAME_NAME, "run@ip", "main"]);
    assert_eq!(frames(&s.user)[0].addr, 0x10);
    assert_eq!(
        texts(&s.kernel),
        ["0xffff0010:schedule@ip", "0xffff0020:do_sys_read"]
    );
}

/// The frame after a signal frame is where the interrupted code was: an
/// instruction pointer, looked up as one; as in a stack kept when its
/// process exited.
#[test]
fn signal_frame_makes_the_next_an_instruction_pointer() {
    let (mut source, names) = program();
    let kept = [
        UserFrame::File {
            object: 1,
            offset: 0x10,
        },
        UserFrame::Signal,
        UserFrame::File {
            object: 0,
            offset: 0x20,
        },
        UserFrame::File {
            object: 0,
            offset: 0x10,
        },
    ];
    source.kept.insert((proc(40), USER + 1), kept.to_vec());
    let raw = raw(
        vec![
            entry(10, 10, StackRef::Id(USER), StackRef::None, 1),
            entry(40, 40, StackRef::Id(USER + 1), StackRef::None, 2),
        ],
        &[
            (USER, &[0x5010, SIGNAL_FRAME, 0x1020, 0x1010]),
            (USER + 1, &[0xdead, 0xbeef, 0xf00d, 0xcafe]),
        ],
    );
    let profile = build(&raw, &mut source, &names, false);
    for s in &profile.samples {
        assert_eq!(
            texts(&s.user),
            ["read@ip", SIGNAL_FRAME_NAME, "run@ip", "main"]
        );
    }
    assert_eq!(profile.samples.len(), 2);
    // The exited process's stack was not looked up through mappings.
    assert!(source.lookups.borrow().iter().all(|&(tgid, _)| tgid == 10));
}

/// Code outside every file in a process with a perf map is named by it;
/// the same address elsewhere is `[unknown]`, and the frames in files are
/// named as ever.
#[test]
fn jit_code_named_by_its_process_perf_map() {
    let (mut source, names) = program();
    source.maps.insert(20, source.maps[&10].clone());
    source.perf_maps.insert(proc(10));
    let raw = raw(
        vec![
            entry(10, 10, StackRef::Id(USER), StackRef::None, 1),
            entry(20, 20, StackRef::Id(USER), StackRef::None, 2),
        ],
        &[(USER, &[0x9000, 0x9100, 0x1010])],
    );
    let profile = build(&raw, &mut source, &names, false);
    let user = |tgid: u32| {
        let s = profile.samples.iter().find(|s| s.tgid == tgid).unwrap();
        texts(&s.user)
    };
    assert_eq!(user(10), ["jit_9000", "jit_9100", "main"]);
    assert_eq!(user(20), ["[unknown]", "[unknown]", "main"]);
}

/// Stacks the counts name but that were not stored are missed; parts not
/// taken are absent; lost ones missed; `--on-cpu` time no sample caught
/// is one `[not sampled]` frame; profiler frames on top of a kernel stack
/// are cut off.
#[test]
fn lost_absent_and_profiler_frames() {
    let (mut source, mut names) = program();
    names.kernel.insert(0xffff_0001, "bpf_prog_1234_offcpu");
    names.kernel.insert(0xffff_0002, "bpf_trace_run4");
    let stored = KERNEL + 7;
    let cases = [
        (StackRef::Id(USER + 5), StackRef::Id(KERNEL + 5)),
        (StackRef::None, StackRef::MissedFull),
        (StackRef::MissedError, StackRef::NotSampled),
        (StackRef::NotReadable, StackRef::Id(stored)),
        (StackRef::NotWalked, StackRef::NoSwitchIn),
    ];
    let entries = cases
        .iter()
        .enumerate()
        .map(|(i, &(u, k))| entry(10, 10, u, k, 1 << i))
        .collect();
    let raw = raw(
        entries,
        &[(stored, &[0xffff_0001, 0xffff_0002, 0xffff_0010])],
    );
    let profile = build(&raw, &mut source, &names, true);
    let got: Vec<(Part, Vec<String>)> = profile
        .samples
        .iter()
        .map(|s| (s.user.clone(), texts(&s.kernel)))
        .collect();
    let v = |n: &str| vec![n.to_string()];
    assert_eq!(
        got,
        [
            (Part::Absent, v("Missed")),
            (Part::Missed, v(NOT_SAMPLED)),
            (Part::Missed, v("schedule")),
            // The first entry's and the last's (the most time: last).
            (Part::Missed, v("Missed")),
        ]
    );
    // Lost parts the kernel's counters do not count, counted by why: the
    // last entry's (merged with the first's sample: both parts missed).
    let c = &profile.counters;
    assert_eq!(
        (
            c.missed_not_walked,
            c.missed_no_switch_in,
            c.missed_not_stored
        ),
        (1, 1, 2)
    );
}

/// Who ended each block: the kinds without a task as they are; a task by
/// its stacks (a kernel stack taken in a tracepoint, return addresses
/// only), made once; an interrupt or a softirq by the kernel frames up to
/// where it entered; a waker the table lost is missed.
#[test]
fn wakers_classified() {
    let (mut source, mut names) = program();
    names.kernel.insert(0xffff_0040, "handle_softirqs");
    names
        .kernel
        .insert(0xffff_0050, "asm_sysvec_apic_timer_interrupt");
    names.kernel.insert(0xffff_0060, "try_to_wake_up");
    let (task, softirq, irq, gone) = (1 << 63, (1 << 63) + 1, (1 << 63) + 2, (1 << 63) + 3);
    let wakers = [
        WakerRef::Preempted,
        WakerRef::NotWoken,
        WakerRef::Unseen,
        WakerRef::MissedFull,
        WakerRef::Id(gone),
        WakerRef::Id(task),
        WakerRef::Id(task),
        WakerRef::Id(softirq),
        WakerRef::Id(irq),
    ];
    let entries = wakers
        .iter()
        .enumerate()
        .map(|(i, &w)| RawEntry {
            waker: Some(w),
            ..entry(10, 10 + i as u32, StackRef::None, StackRef::None, 1)
        })
        .collect();
    let mut raw = raw(
        entries,
        &[
            (USER, &[0x1020, 0x1010]),
            (KERNEL, &[0xffff_0060, 0xffff_0010]),
            (KERNEL + 1, &[0xffff_0060, 0xffff_0040, 0xffff_0030]),
            (KERNEL + 2, &[0xffff_0060, 0xffff_0050, 0xffff_0030]),
        ],
    );
    let waker = |pid: u32, user: StackRef, kernel: u64| RawWaker {
        tgid: 10,
        start: START,
        pid,
        comm: format!("waker{pid}"),
        user_stack: user,
        kernel_stack: StackRef::Id(kernel),
        dev: 0,
    };
    raw.wakers
        .insert(task, waker(99, StackRef::Id(USER), KERNEL));
    raw.wakers
        .insert(softirq, waker(98, StackRef::None, KERNEL + 1));
    raw.wakers
        .insert(irq, waker(97, StackRef::None, KERNEL + 2));
    let profile = build(&raw, &mut source, &names, true);
    let mut got: Vec<(u32, Waker)> = profile
        .samples
        .iter()
        .map(|s| (s.pid, s.waker.clone().unwrap()))
        .collect();
    got.sort_by_key(|&(pid, _)| pid);
    let frames_of = |names: &[&str]| {
        let frames: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        frames
    };
    let kinds: Vec<String> = got.iter().map(|(_, w)| w.name().to_string()).collect();
    assert_eq!(
        kinds,
        [
            "[preempted]",
            "[not woken]",
            "[unknown waker]",
            "[Missed Waker]",
            "[Missed Waker]",
            "waker99",
            "waker99",
            "[softirq]",
            "[interrupt]"
        ]
    );
    let Waker::Task {
        pid, user, kernel, ..
    } = &got[5].1
    else {
        panic!("not a task: {:?}", got[5].1);
    };
    assert_eq!(*pid, 99);
    assert_eq!(texts(user), frames_of(&["run@ip", "main"]));
    assert_eq!(texts(kernel), frames_of(&["try_to_wake_up", "schedule"]));
    assert_eq!(got[5].1, got[6].1);
    let (_, softirq) = got[7].1.parts();
    assert_eq!(
        texts(softirq),
        frames_of(&["try_to_wake_up", "handle_softirqs"])
    );
    let (_, irq) = got[8].1.parts();
    assert_eq!(
        texts(irq),
        frames_of(&["try_to_wake_up", "asm_sysvec_apic_timer_interrupt"])
    );
    assert_eq!(names.kernel_calls.get(), 1);
}

/// A stack with Python frames is made whole by the source: a Python
/// frame at its line in its source file, one whose code is not known
/// nowhere.
#[test]
fn python_frames_at_their_lines() {
    let (mut source, names) = program();
    let word = 0x5059 << 48;
    assert!(crate::runtime::python::is_python_word(word));
    source.python.insert(
        USER,
        vec![
            UserFrame::File {
                object: 1,
                offset: 0x10,
            },
            UserFrame::Runtime(Kind::Python, RuntimeFrame::Code { code: 3, at: 8 }),
            UserFrame::Runtime(Kind::Python, RuntimeFrame::Code { code: 4, at: 0 }),
            UserFrame::Runtime(Kind::Python, RuntimeFrame::Unreadable),
        ],
    );
    source.codes.insert(3, (42, "app.py".to_string()));
    let raw = raw(
        vec![entry(10, 10, StackRef::Id(USER), StackRef::None, 1)],
        &[(USER, &[0x5010, word, 0, word, 0, word, 0])],
    );
    let profile = build(&raw, &mut source, &names, false);
    let s = &profile.samples[0];
    assert_eq!(texts(&s.user), ["read@ip", "py3", "py4", PYTHON_UNREADABLE]);
    let got: Vec<(u64, Origin, Option<&str>)> = frames(&s.user)
        .iter()
        .map(|f| (f.addr, f.origin, f.file.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (0x10, Origin::Object(0), None),
            (42, Origin::Runtime(Kind::Python), Some("app.py")),
            (0, Origin::Unknown, None),
            (0, Origin::Unknown, None),
        ]
    );
    assert!(source.lookups.borrow().is_empty());
}

/// A stack none of whose addresses is in a file its process maps is
/// counted, with its blocks' time, once per process; not where the
/// process's mappings were never read (said apart), and not where one
/// address is in a file.
#[test]
fn stacks_outside_every_file_are_counted() {
    let (mut source, names) = program();
    source.maps.insert(20, source.maps[&10].clone());
    let raw = raw(
        vec![
            entry(10, 10, StackRef::Id(USER), StackRef::None, 5),
            entry(10, 11, StackRef::Id(USER), StackRef::None, 7),
            entry(20, 20, StackRef::Id(USER), StackRef::None, 11),
            entry(20, 21, StackRef::Id(USER + 1), StackRef::None, 13),
            entry(30, 30, StackRef::Id(USER), StackRef::None, 17),
        ],
        &[(USER, &[0x9000, 0x9100]), (USER + 1, &[0x9000, 0x1010])],
    );
    let profile = build(&raw, &mut source, &names, false);
    assert_eq!(profile.counters.user_unmapped_stacks, 2);
    assert_eq!(profile.counters.user_unmapped_ns, 5 + 7 + 11);
}
