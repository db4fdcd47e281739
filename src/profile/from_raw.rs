//! [`build`]: what the kernel recorded, symbolized, turned into the
//! profile's samples; user stacks' addresses numbered and looked up once.

use std::sync::Arc;

use crate::process::{ObjectInfo, Proc};
use crate::raw::{LossCounters, RawProfile, StackRef, WakerRef};
use crate::runtime::Frame as RuntimeFrame;
use crate::symbolize::{AddrKind, Named, UserFrame};

use super::merge::{frame_word, Merger};
use super::sources::{FrameSource, MappedFrames, NameSource, Names, UserStack};
use super::{profiler_frames, Frame, FrameInfo, Origin, Part, Profile, Waker, NOT_SAMPLED};

/// The user stacks of a profile as numbers of their distinct frames, all
/// in one buffer.
struct UserStacks {
    /// Each stack of each process, and where the numbers of its frames
    /// are: start and length.
    list: Vec<(Proc, u64, usize, usize)>,
    numbers: Vec<u32>,
    /// The user stack of each holder, by the holder's index (each entry,
    /// then each waker in the order of `RawProfile::wakers`; see
    /// [`user_stack_order`]), as its place in `list`;
    /// [`UserStacks::NONE`] for none stored.
    stack_of_holder: Vec<u32>,
    /// By place in `list`: the stack's process had mappings read and no
    /// perf map, yet none of its addresses is in a file it maps (all its
    /// frames `[unknown]`, see [`LossCounters::user_unmapped_stacks`]).
    unmapped: Vec<bool>,
}

impl UserStacks {
    const NONE: u32 = u32::MAX;
}

/// The numbers of the addresses of one process's stacks (see [`build`]):
/// the last found in each of a few hundred slots, before a hash map. The
/// slots are made only for a process with many return addresses: a trace
/// of many small processes does not pay 8 KiB each.
struct AddressNumbers {
    recent: Box<[(u64, u32)]>,
    ips: ahash::AHashMap<u64, u32>,
    returns: ahash::AHashMap<u64, u32>,
}

impl AddressNumbers {
    const SLOTS: usize = 512;
    /// Return addresses a process has before it gets the slots.
    const SLOTS_FROM: usize = 256;
    /// A slot that holds nothing: no frame has this number.
    const EMPTY: u32 = u32::MAX;

    fn new() -> AddressNumbers {
        AddressNumbers {
            recent: Box::default(),
            ips: ahash::AHashMap::new(),
            returns: ahash::AHashMap::new(),
        }
    }

    /// The number of address `addr` of kind `kind`: `find`'s, the first
    /// time.
    fn number(&mut self, addr: u64, kind: AddrKind, find: impl FnOnce() -> u32) -> u32 {
        if kind == AddrKind::Ip {
            return *self.ips.entry(addr).or_insert_with(find);
        }
        if self.recent.is_empty() {
            if self.returns.len() < Self::SLOTS_FROM {
                return *self.returns.entry(addr).or_insert_with(find);
            }
            self.recent = vec![(0, Self::EMPTY); Self::SLOTS].into_boxed_slice();
        }
        let slot = &mut self.recent[((addr ^ (addr >> 9)) as usize) % Self::SLOTS];
        if slot.1 != Self::EMPTY && slot.0 == addr {
            return slot.1;
        }
        let n = *self.returns.entry(addr).or_insert_with(find);
        *slot = (addr, n);
        n
    }
}

/// The addresses of stack `r`, where it is stored.
fn part_addrs(r: StackRef, stacks: &crate::raw::Stacks) -> Option<&[u64]> {
    match r {
        StackRef::Id(id) => stacks.get(&id),
        _ => None,
    }
}

/// Each address of a kernel stack with its kind: the first an
/// instruction pointer where `first_is_ip`, the others return addresses.
fn kinds(frames: &[u64], first_is_ip: bool) -> impl Iterator<Item = (u64, AddrKind)> + '_ {
    frames.iter().enumerate().map(move |(i, &a)| {
        (
            a,
            if i == 0 && first_is_ip {
                AddrKind::Ip
            } else {
                AddrKind::Return
            },
        )
    })
}

/// What each frame of a user stack is, frame after frame: the instruction
/// pointer, then return addresses, except that after a signal frame the
/// interrupted code's pc is an instruction pointer again (see
/// [`UserFrame::Signal`]).
struct UserKinds {
    ip: bool,
}

impl UserKinds {
    fn new() -> UserKinds {
        UserKinds { ip: true }
    }

    /// The kind of the next frame, given whether it is a signal frame.
    fn next(&mut self, signal: bool) -> AddrKind {
        let kind = if self.ip {
            AddrKind::Ip
        } else {
            AddrKind::Return
        };
        self.ip = signal;
        kind
    }
}

/// Symbolizes and merges what the kernel recorded: user frames from
/// `source`, names from `names`.
pub fn build<F: FrameSource, N: NameSource<F>>(
    raw: &RawProfile,
    source: &mut F,
    names: &N,
    kernel_first_is_ip: bool,
) -> Profile {
    build_with(
        raw,
        source,
        names,
        kernel_first_is_ip,
        Merger::with_capacity(raw.entries.len()),
    )
}

/// The same, without merging: one sample for each entry of `raw`, in its
/// order (the counters and objects as [`build`] has them).
pub fn build_each<F: FrameSource, N: NameSource<F>>(
    raw: &RawProfile,
    source: &mut F,
    names: &N,
    kernel_first_is_ip: bool,
) -> Profile {
    build_with(
        raw,
        source,
        names,
        kernel_first_is_ip,
        Merger::each(raw.entries.len()),
    )
}

fn build_with<'a, F: FrameSource, N: NameSource<F>>(
    raw: &'a RawProfile,
    source: &mut F,
    names: &N,
    kernel_first_is_ip: bool,
    mut merger: Merger<'a>,
) -> Profile {
    let each = merger.keeps_each();
    source.read_thread_names();
    let knames = names.kernel_names(&kernel_addrs(raw, kernel_first_is_ip));
    let (stacks, distinct) = number_user_stacks(raw, source);
    let mut counters = raw.counters.clone();
    count_unmapped(raw, &stacks, &mut counters);
    count_missed(raw, &stacks, &mut counters);
    let unames = names.user_names(source, &distinct);
    let (objects, object_index) = object_table(source, &distinct);
    let users = UserFrames::new(distinct, unames, object_index, names.addresses(), source);

    let user_parts = UserParts::new(source, names, &users).make(raw, &stacks, &mut merger);
    let mut parts = SampleParts {
        raw,
        stack_of_holder: stacks.stack_of_holder,
        user_parts,
        knames,
        addresses: users.addresses,
        kernel_parts: ahash::AHashMap::new(),
        waker_at: waker_places(raw),
        wakers: ahash::AHashMap::new(),
    };
    add_entries(raw, source, &mut parts, &mut merger, kernel_first_is_ip);
    let samples = if each {
        merger.samples_each()
    } else {
        merger.samples()
    };
    Profile {
        samples,
        counters,
        objects,
        window: None,
        graph: None,
    }
}

/// Counts the entries of `raw` with a part lost for a reason the kernel's
/// counters do not give (see [`LossCounters::missed_not_walked`]).
fn count_missed(raw: &RawProfile, stacks: &UserStacks, counters: &mut LossCounters) {
    for (e, &n) in raw.entries.iter().zip(&stacks.stack_of_holder) {
        match e.user_stack {
            StackRef::NotWalked => counters.missed_not_walked += 1,
            StackRef::Id(_) if n == UserStacks::NONE => counters.missed_not_stored += 1,
            _ => {}
        }
        match e.kernel_stack {
            StackRef::NoSwitchIn => counters.missed_no_switch_in += 1,
            StackRef::Id(id) if !raw.stacks.contains_key(&id) => counters.missed_not_stored += 1,
            _ => {}
        }
    }
}

/// Counts the user stacks of `raw`'s entries none of whose addresses is in
/// a mapping of their process that was read, and the entries' time.
fn count_unmapped(raw: &RawProfile, stacks: &UserStacks, counters: &mut LossCounters) {
    let mut seen = ahash::AHashSet::new();
    for (e, &n) in raw.entries.iter().zip(&stacks.stack_of_holder) {
        if n != UserStacks::NONE && stacks.unmapped[n as usize] {
            counters.user_unmapped_ns += e.total_ns;
            if seen.insert(n) {
                counters.user_unmapped_stacks += 1;
            }
        }
    }
}

/// Adds each entry of `raw` to the merger, with its parts and waker, and
/// its process's container.
fn add_entries<'a, F: FrameSource>(
    raw: &'a RawProfile,
    source: &mut F,
    parts: &mut SampleParts,
    merger: &mut Merger<'a>,
    kernel_first_is_ip: bool,
) {
    for (i, e) in raw.entries.iter().enumerate() {
        let user = parts.user(merger, i, e.user_stack);
        let kernel = parts.kernel(merger, e.kernel_stack, kernel_first_is_ip);
        let waker = e.waker.map(|w| parts.waker(merger, w));
        let p = Proc {
            tgid: e.tgid,
            start: e.start,
        };
        let container = merger.container(source.container(p).as_ref());
        if !merger.has_thread(e.tgid, e.pid) {
            if let Some(name) = source.thread_name(p, e.pid) {
                merger.thread(e.tgid, e.pid, name);
            }
        }
        merger.add(
            (
                e.tgid, e.pid, &e.comm, user, kernel, e.state, waker, container,
            ),
            e.total_ns,
            e.count,
        );
    }
}

/// The kernel addresses of a profile to name, all at once: each entry's
/// kernel stack once, then the wakers'.
pub fn kernel_addrs(raw: &RawProfile, kernel_first_is_ip: bool) -> Vec<(u64, AddrKind)> {
    let mut kaddrs = Vec::new();
    let mut kernel_ids = ahash::AHashSet::new();
    for e in &raw.entries {
        if !kernel_ids.insert(e.kernel_stack) {
            continue;
        }
        if let Some(f) = part_addrs(e.kernel_stack, &raw.stacks) {
            kaddrs.extend(kinds(f, kernel_first_is_ip));
        }
    }
    // The wakers' kernel stacks are taken in a tracepoint: return
    // addresses only.
    for w in raw.wakers.values() {
        if let Some(f) = part_addrs(w.kernel_stack, &raw.stacks) {
            kaddrs.extend(kinds(f, false));
        }
    }
    kaddrs
}

/// The distinct user frames of a profile, each numbered once, in the
/// order first met.
#[derive(Default)]
struct Distinct {
    /// The frames, by number.
    list: Vec<(UserFrame, AddrKind)>,
    numbers: ahash::AHashMap<(UserFrame, AddrKind), u32>,
}

impl Distinct {
    /// The number of frame `fk`: the next, the first time.
    fn number(&mut self, fk: (UserFrame, AddrKind)) -> u32 {
        *self.numbers.entry(fk).or_insert_with(|| {
            self.list.push(fk);
            (self.list.len() - 1) as u32
        })
    }
}

/// Each user stack an entry or a waker (its holder) has, with the
/// holder's index (entry `i` at `i`, the `j`th waker after the entries),
/// in the order the stacks are stored: where its frames are, its process
/// and its id.
fn user_stack_order(raw: &RawProfile) -> Vec<((usize, usize), Proc, u64, usize)> {
    let mut order: Vec<((usize, usize), Proc, u64, usize)> = raw
        .entries
        .iter()
        .map(|e| (e.tgid, e.start, e.user_stack))
        .chain(raw.wakers.values().map(|w| (w.tgid, w.start, w.user_stack)))
        .enumerate()
        .filter_map(|(at, (tgid, start, r))| match r {
            StackRef::Id(id) => Some((raw.stacks.span(&id)?, Proc { tgid, start }, id, at)),
            _ => None,
        })
        .collect();
    order.sort_unstable();
    order
}

/// User frames: each stack as frames of objects (through the snapshot of
/// its process, or as kept when the process exited). A stack holds its
/// frames by number: each distinct (frame, kind) is looked up once here,
/// and named and placed once.
fn number_user_stacks<F: FrameSource>(
    raw: &RawProfile,
    source: &mut F,
) -> (UserStacks, Vec<(UserFrame, AddrKind)>) {
    let mut user_stacks = UserStacks {
        list: Vec::new(),
        numbers: Vec::new(),
        stack_of_holder: vec![UserStacks::NONE; raw.entries.len() + raw.wakers.len()],
        unmapped: Vec::new(),
    };
    let mut distinct = Distinct::default();
    // The number of each address of a process, found once: a process's
    // stacks share most of their addresses, and many stacks have many
    // times more frames than distinct addresses (see BENCHMARKS.md, report
    // time).
    let mut by_process: ahash::AHashMap<(Proc, bool), AddressNumbers> = ahash::AHashMap::new();
    // Each stack of each process once, in the order the stacks are
    // stored: tens of megabytes of frames read front to back rather than
    // in the order of the counts.
    let mut last = None;
    for (span, proc, id, holder) in user_stack_order(raw) {
        if last == Some((proc, id)) {
            user_stacks.stack_of_holder[holder] = (user_stacks.list.len() - 1) as u32;
            continue;
        }
        last = Some((proc, id));
        user_stacks.stack_of_holder[holder] = user_stacks.list.len() as u32;
        let addrs = raw.stacks.at(span);
        let at = user_stacks.numbers.len();
        let numbers = &mut user_stacks.numbers;
        // (JIT code is named by its perf map, if any.)
        let mut read = !source.has_perf_map(proc);
        if source.runtime_places(proc, addrs) {
            // A runtime's frames in their places (Python's in place of the
            // interpreter's): frames made stack by stack.
            let frames = source.runtime_frames(proc, id, addrs);
            number_frames(&frames, &mut distinct, numbers);
        } else {
            match source.user_stack(proc, id) {
                UserStack::Kept(frames) => number_frames(frames, &mut distinct, numbers),
                UserStack::Mapped(mappings) => {
                    read &= mappings.any_read();
                    // A stack taken before an exec, in the parent's
                    // address space, is numbered apart.
                    let parents = mappings.before_exec(addrs);
                    let addr_numbers = by_process
                        .entry((proc, parents))
                        .or_insert_with(AddressNumbers::new);
                    let mut kinds = UserKinds::new();
                    numbers.extend(addrs.iter().map(|&a| {
                        let k = kinds.next(a == crate::unwind_table::SIGNAL_FRAME);
                        addr_numbers.number(a, k, || {
                            let f = match parents {
                                true => mappings.parent_frame(a).unwrap_or(UserFrame::Unmapped(a)),
                                false => mappings.frame(a),
                            };
                            distinct.number((f, k))
                        })
                    }));
                }
            }
        }
        let len = user_stacks.numbers.len() - at;
        user_stacks.list.push((proc, id, at, len));
        let numbers = &user_stacks.numbers[at..];
        user_stacks.unmapped.push(
            read && !numbers.is_empty()
                && numbers
                    .iter()
                    .all(|&n| matches!(distinct.list[n as usize].0, UserFrame::Unmapped(_))),
        );
    }
    (user_stacks, distinct.list)
}

/// Appends to `numbers` the numbers of the frames of one stack, `frames`.
fn number_frames(frames: &[UserFrame], distinct: &mut Distinct, numbers: &mut Vec<u32>) {
    let mut kinds = UserKinds::new();
    numbers.extend(
        frames
            .iter()
            .map(|&f| distinct.number((f, kinds.next(f == UserFrame::Signal)))),
    );
}

/// The files user frames are in, each once, numbered as the profile lists
/// them; and the number of each object in that list.
fn object_table<F: FrameSource>(
    source: &F,
    distinct: &[(UserFrame, AddrKind)],
) -> (Vec<ObjectInfo>, ahash::AHashMap<u32, u32>) {
    let mut objects = Vec::new();
    let mut object_index: ahash::AHashMap<u32, u32> = ahash::AHashMap::new();
    for &(f, _) in distinct {
        if let UserFrame::File { object, .. } = f {
            object_index.entry(object).or_insert_with(|| {
                objects.push(source.object_info(object));
                (objects.len() - 1) as u32
            });
        }
    }
    (objects, object_index)
}

/// The holder index of each waker (see [`UserStacks::stack_of_holder`]).
fn waker_places(raw: &RawProfile) -> ahash::AHashMap<u64, usize> {
    raw.wakers
        .keys()
        .enumerate()
        .map(|(j, &id)| (id, raw.entries.len() + j))
        .collect()
}

/// The frames of one address: functions inlined there (`names`),
/// innermost first, then the function itself. `at`: the address as
/// `--addresses` (`addresses`) shows it (a user frame's in its process,
/// where `addr` is the offset in its file); None for a frame that has
/// none (a signal frame).
fn frames_at(
    addresses: bool,
    names: Vec<Named>,
    addr: u64,
    at: Option<u64>,
    origin: Origin,
    file: Option<Arc<str>>,
) -> impl Iterator<Item = Frame> {
    let last = names.len().saturating_sub(1);
    names.into_iter().enumerate().map(move |(i, n)| {
        let shown = if let (true, Some(at)) = (addresses, at) {
            Some(format!("{at:#x}:{}", n.text()).into_boxed_str())
        } else {
            n.shown.map(String::into_boxed_str)
        };
        Frame::new(FrameInfo {
            name: n.name,
            addr,
            origin,
            inlined: i < last,
            shown,
            file: file.clone(),
        })
    })
}

/// The names of an address no name was found for.
fn unknown() -> Vec<Named> {
    vec![Named {
        name: "[unknown]".into(),
        shown: None,
    }]
}

/// Where a user frame is: the offset in its file, or its address, and
/// its origin; a Python frame's line and source file; a signal frame is
/// nowhere (a frame known by its name only).
type Place = (u64, Origin, Option<Arc<str>>);

/// The profile's distinct user frames, named, and where each is.
struct UserFrames {
    /// The frames, by number (see [`UserStacks::numbers`]).
    distinct: Vec<(UserFrame, AddrKind)>,
    /// The names of each, as the name source gave them.
    names: Names<(UserFrame, AddrKind)>,
    /// The place of each in [`Profile::objects`], by object.
    object_index: ahash::AHashMap<u32, u32>,
    /// Frames show their address first (`--addresses`).
    addresses: bool,
    /// The frames of each distinct user address, made once: the same in
    /// every stack and process that has it, except where `--addresses`
    /// shows the address in the process, or a perf map names JIT code
    /// (then none are made here). All in one vector: the frames of
    /// distinct user address `n` are `placed[spans[n]]`, and
    /// `placed_words` their [`frame_word`]s.
    placed: Vec<Frame>,
    placed_words: Vec<u64>,
    spans: Vec<(usize, usize)>,
}

impl UserFrames {
    /// The distinct frames `distinct` with their `names`, their frames
    /// made where they are the same in every stack.
    fn new<F: FrameSource>(
        distinct: Vec<(UserFrame, AddrKind)>,
        names: Names<(UserFrame, AddrKind)>,
        object_index: ahash::AHashMap<u32, u32>,
        addresses: bool,
        source: &F,
    ) -> UserFrames {
        let mut users = UserFrames {
            distinct,
            names,
            object_index,
            addresses,
            placed: Vec::new(),
            placed_words: Vec::new(),
            spans: Vec::new(),
        };
        if !addresses {
            users.spans.reserve(users.distinct.len());
            for &(f, k) in &users.distinct {
                let (addr, origin, file) = users.place(source, f);
                let at = users.placed.len();
                let named = frames_at(false, users.names_of(f, k), addr, None, origin, file);
                users.placed.extend(named);
                users.spans.push((at, users.placed.len() - at));
            }
            let words = users.placed.iter().map(|f| frame_word(f));
            users.placed_words.extend(words);
        }
        users
    }

    /// Where user frame `f` is (see [`Place`]).
    fn place<F: FrameSource>(&self, source: &F, f: UserFrame) -> Place {
        match f {
            UserFrame::File { object, offset } => {
                (offset, Origin::Object(self.object_index[&object]), None)
            }
            UserFrame::Unmapped(a) => (a, Origin::Unknown, None),
            UserFrame::Runtime(kind, RuntimeFrame::Code { code, at }) => {
                match source.runtime_place(kind, code, at) {
                    Some((line, file)) => {
                        (line, Origin::Runtime(kind), Some(Arc::<str>::from(file)))
                    }
                    None => (0, Origin::Unknown, None),
                }
            }
            UserFrame::Signal | UserFrame::Runtime(..) => (0, Origin::Unknown, None),
        }
    }

    /// The names of user frame `f` of kind `k`.
    fn names_of(&self, f: UserFrame, k: AddrKind) -> Vec<Named> {
        self.names.get(&(f, k)).cloned().unwrap_or_else(unknown)
    }

    /// The frames made before for distinct frame number `n`, and their
    /// words.
    fn placed(&self, n: u32) -> (&[Frame], &[u64]) {
        let (at, len) = self.spans[n as usize];
        (&self.placed[at..at + len], &self.placed_words[at..at + len])
    }
}

/// Makes and numbers each user part (see [`Merger::part`]; the part
/// itself is the merger's). Each distinct part is made and numbered once,
/// and shared (an `Arc`) by every sample that has it: when each sample
/// had frames of its own, they were most of the report's time and memory
/// with many samples (see BENCHMARKS.md, report time).
struct UserParts<'a, F, N> {
    /// Where user frames come from: which processes have perf maps.
    source: &'a F,
    /// Where names come from: JIT names.
    names: &'a N,
    /// The distinct user frames, named.
    users: &'a UserFrames,
    /// The frames of the part being made, moved into it, and what each
    /// adds to its hash.
    scratch: Vec<Frame>,
    scratch_words: Vec<u64>,
}

impl<'a, F: FrameSource, N: NameSource<F>> UserParts<'a, F, N> {
    /// Parts of `users`, frames from `source`, names from `names`.
    fn new(source: &'a F, names: &'a N, users: &'a UserFrames) -> Self {
        UserParts {
            source,
            names,
            users,
            scratch: Vec::new(),
            scratch_words: Vec::new(),
        }
    }

    /// The number of the part of each stack of `stacks`, in the order its
    /// frames were numbered.
    fn make(mut self, raw: &RawProfile, stacks: &UserStacks, merger: &mut Merger) -> Vec<u32> {
        let mut user_parts: Vec<u32> = Vec::with_capacity(stacks.list.len());
        let jit_anywhere = self.source.has_perf_maps();
        for &(proc, id, at, len) in &stacks.list {
            let numbers = &stacks.numbers[at..at + len];
            let jit = jit_anywhere && self.source.has_perf_map(proc);
            let n = if !jit && !self.users.addresses {
                self.of_placed(numbers, merger)
            } else {
                let addrs = raw.stacks.get(&id).unwrap_or(&[]);
                self.of_addresses(proc, numbers, addrs, jit, merger)
            };
            user_parts.push(n);
        }
        user_parts
    }

    /// The part of frames `numbers`, all made before.
    fn of_placed(&mut self, numbers: &[u32], merger: &mut Merger) -> u32 {
        for &n in numbers {
            let (frames, words) = self.users.placed(n);
            self.scratch.extend_from_slice(frames);
            self.scratch_words.extend_from_slice(words);
        }
        let part = Part::Frames(self.scratch.drain(..).collect());
        let n = merger.part_words(part, &self.scratch_words);
        self.scratch_words.clear();
        n
    }

    /// The part of frames `numbers` at addresses `addrs` of process
    /// `proc`, made here where they depend on the process: with
    /// `--addresses` their addresses in it, and with `jit` the names its
    /// perf map gives JIT code.
    fn of_addresses(
        &mut self,
        proc: Proc,
        numbers: &[u32],
        addrs: &[u64],
        jit: bool,
        merger: &mut Merger,
    ) -> u32 {
        let users = self.users;
        for (i, &n) in numbers.iter().enumerate() {
            let (f, k) = users.distinct[n as usize];
            let at = addrs.get(i).copied().unwrap_or(0);
            let shown_at = (f != UserFrame::Signal).then_some(at);
            // JIT code: named by its runtime's perf map.
            let jitted = jit
                .then(|| self.names.jit_name(self.source, proc, f, at, k))
                .flatten();
            match jitted {
                None if !users.addresses => {
                    let (frames, _) = users.placed(n);
                    self.scratch.extend_from_slice(frames);
                }
                _ => {
                    let (addr, origin, file) = users.place(self.source, f);
                    let names = jitted.map_or_else(|| users.names_of(f, k), |n| vec![n]);
                    let frames = frames_at(users.addresses, names, addr, shown_at, origin, file);
                    self.scratch.extend(frames);
                }
            }
        }
        merger.part(Part::Frames(self.scratch.drain(..).collect()))
    }
}

/// The parts of the profile's samples and wakers, each numbered once by
/// the merger.
struct SampleParts<'a> {
    /// What the kernel recorded: the kernel stacks and the wakers.
    raw: &'a RawProfile,
    /// The user stack of each entry and waker, by holder index (see
    /// [`UserStacks::stack_of_holder`]).
    stack_of_holder: Vec<u32>,
    /// The part of each user stack, by its place in [`UserStacks::list`].
    user_parts: Vec<u32>,
    /// The names of the kernel addresses.
    knames: Names<(u64, AddrKind)>,
    /// Frames show their address first (`--addresses`).
    addresses: bool,
    /// The part of each kernel stack, by id and whether its first frame
    /// is an instruction pointer.
    kernel_parts: ahash::AHashMap<(u64, bool), u32>,
    /// The holder index of each waker.
    waker_at: ahash::AHashMap<u64, usize>,
    /// The number of each waker task, by its id.
    wakers: ahash::AHashMap<u64, u32>,
}

impl SampleParts<'_> {
    /// The user part of the entry or waker at holder index `holder` (see
    /// [`UserStacks::stack_of_holder`]), whose user stack is `r`.
    fn user(&self, merger: &mut Merger, holder: usize, r: StackRef) -> u32 {
        match r {
            StackRef::Id(_) => match self
                .stack_of_holder
                .get(holder)
                .copied()
                .unwrap_or(UserStacks::NONE)
            {
                // A stack the counts name but that was not stored.
                UserStacks::NONE => merger.part(Part::Missed),
                n => self.user_parts[n as usize],
            },
            _ => unstored_part(merger, r),
        }
    }

    /// The kernel part of stack `r`.
    fn kernel(&mut self, merger: &mut Merger, r: StackRef, first_is_ip: bool) -> u32 {
        let StackRef::Id(id) = r else {
            return unstored_part(merger, r);
        };
        if let Some(&n) = self.kernel_parts.get(&(id, first_is_ip)) {
            return n;
        }
        let part = match self.raw.stacks.get(&id) {
            None => Part::Missed,
            Some(frames) => {
                // An address can be several frames: functions inlined
                // there, innermost first.
                let mut named: Vec<Frame> = kinds(frames, first_is_ip)
                    .flat_map(|k| {
                        let names = self.knames.get(&k).cloned().unwrap_or_else(unknown);
                        frames_at(self.addresses, names, k.0, Some(k.0), Origin::Kernel, None)
                    })
                    .collect();
                let ours = profiler_frames(named.iter().map(|f| f.text()));
                named.drain(..ours);
                Part::Frames(named.into())
            }
        };
        let n = merger.part(part);
        self.kernel_parts.insert((id, first_is_ip), n);
        n
    }

    /// The number of waker `w`: a task's classified by its stacks, made
    /// once.
    fn waker(&mut self, merger: &mut Merger, w: WakerRef) -> u32 {
        let id = match w {
            WakerRef::Preempted => return merger.waker(Waker::Preempted),
            WakerRef::NotWoken => return merger.waker(Waker::NotWoken),
            WakerRef::Unseen => return merger.waker(Waker::Unseen),
            WakerRef::MissedFull => return merger.waker(Waker::Missed),
            WakerRef::Id(id) => id,
        };
        let Some(w) = self.raw.wakers.get(&id) else {
            return merger.waker(Waker::Missed);
        };
        if let Some(&n) = self.wakers.get(&id) {
            return n;
        }
        let at = self.waker_at.get(&id).copied().unwrap_or(usize::MAX);
        let user = self.user(merger, at, w.user_stack);
        let kernel = self.kernel(merger, w.kernel_stack, false);
        let (user, kernel) = (merger.part_of(user), merger.part_of(kernel));
        let n = merger.waker(Waker::classify(w.comm.clone(), w.pid, user, kernel));
        self.wakers.insert(id, n);
        n
    }
}

/// The number of the part a reference to no stored stack stands for: none
/// by nature or request, not sampled, or lost.
fn unstored_part(merger: &mut Merger, r: StackRef) -> u32 {
    merger.part(match r {
        StackRef::None => Part::Absent,
        StackRef::NotSampled => Part::Frames(Arc::new([Frame::named(NOT_SAMPLED)])),
        _ => Part::Missed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user stack's first frame and the one after a signal frame are
    /// where the code was (looked up as they are); the others return
    /// addresses (looked up at the call before them).
    #[test]
    fn user_kinds_after_a_signal_frame() {
        let mut kinds = UserKinds::new();
        let got: Vec<AddrKind> = [false, false, true, false, false]
            .into_iter()
            .map(|signal| kinds.next(signal))
            .collect();
        use AddrKind::{Ip, Return};
        assert_eq!(got, [Ip, Return, Return, Ip, Return]);
    }
}

#[cfg(test)]
mod fakes;
