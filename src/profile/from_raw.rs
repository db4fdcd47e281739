//! [`build`]: what the kernel recorded, symbolized, turned into the
//! profile's samples; user stacks' addresses numbered and looked up once.

use std::sync::Arc;

use crate::process::registry::StackFrames;
use crate::process::Proc;
use crate::process::Registry;
use crate::raw::{RawProfile, StackRef, WakerRef};
use crate::symbolize::{AddrKind, Named, Symbolizer, UserFrame};

use super::merge::{frame_word, Merger};
use super::{profiler_frames, Frame, FrameInfo, Origin, Part, Profile, Waker, NOT_SAMPLED};

/// The user stacks of a profile as numbers of their distinct frames, all
/// in one buffer.
struct UserStacks {
    /// Each stack of each process, and where the numbers of its frames
    /// are: start and length.
    list: Vec<(Proc, u64, usize, usize)>,
    numbers: Vec<u32>,
    /// The user stack of each entry, then of each waker (in the order of
    /// `RawProfile::wakers`), by its place in `list`; [`UserStacks::NONE`]
    /// for none stored.
    of: Vec<u32>,
}

impl UserStacks {
    const NONE: u32 = u32::MAX;
}

/// The numbers of the addresses of one process's stacks (see [`build`]):
/// the last found in each of a few hundred slots, before a hash map. The
/// slots are made only for a process with many return addresses: a trace
/// of many small processes does not pay 8 KiB each.
struct Known {
    recent: Box<[(u64, u32)]>,
    ips: ahash::AHashMap<u64, u32>,
    returns: ahash::AHashMap<u64, u32>,
}

impl Known {
    const SLOTS: usize = 512;
    /// Return addresses a process has before it gets the slots.
    const SLOTS_FROM: usize = 256;
    /// A slot that holds nothing: no frame has this number.
    const EMPTY: u32 = u32::MAX;

    fn new() -> Known {
        Known {
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

fn part_addrs(r: StackRef, stacks: &crate::raw::Stacks) -> Option<&[u64]> {
    match r {
        StackRef::Id(id) => stacks.get(&id),
        _ => None,
    }
}

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

/// Symbolizes and merges what the kernel recorded.
pub fn build(
    raw: &RawProfile,
    reg: &mut Registry,
    sym: &Symbolizer,
    kernel_first_is_ip: bool,
) -> Profile {
    // Kernel frames, all at once.
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
    let knames = sym.kernel(&kaddrs);

    // User frames: each stack as frames of objects (through the snapshot
    // of its process, or as kept when the process exited), then all named
    // object by object. A stack holds its frames by number: each distinct
    // (frame, kind) is looked up once here, and named and placed once.
    let mut user_stacks = UserStacks {
        list: Vec::new(),
        numbers: Vec::new(),
        of: vec![UserStacks::NONE; raw.entries.len() + raw.wakers.len()],
    };
    let mut distinct: Vec<(UserFrame, AddrKind)> = Vec::new();
    {
        let mut numbers: ahash::AHashMap<(UserFrame, AddrKind), u32> = ahash::AHashMap::new();
        let mut number = |fk: (UserFrame, AddrKind)| {
            *numbers.entry(fk).or_insert_with(|| {
                distinct.push(fk);
                (distinct.len() - 1) as u32
            })
        };
        // The number of each address of a process, found once: a
        // process's stacks have a few thousand addresses between them,
        // and 100,000 stacks of 45 frames millions.
        let mut by_address: ahash::AHashMap<Proc, Known> = ahash::AHashMap::new();
        // Each stack of each process once, in the order the stacks are
        // stored: tens of megabytes of frames read front to back rather
        // than in the order of the counts.
        // Each user stack an entry or a waker has, with where it is had:
        // entry `i` at `i`, the `j`th waker after the entries.
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
        let mut last = None;
        for (span, proc, id, had) in order {
            if last == Some((proc, id)) {
                user_stacks.of[had] = (user_stacks.list.len() - 1) as u32;
                continue;
            }
            last = Some((proc, id));
            user_stacks.of[had] = user_stacks.list.len() as u32;
            let addrs = raw.stacks.at(span);
            let at = user_stacks.numbers.len();
            if addrs.iter().any(|&a| crate::process::is_python_word(a)) {
                // Python frames in place of the interpreter's: frames
                // made stack by stack.
                let frames = reg.user_frames(proc, id, addrs);
                let mut kinds = UserKinds::new();
                user_stacks.numbers.extend(
                    frames
                        .iter()
                        .map(|&f| number((f, kinds.next(f == UserFrame::Signal)))),
                );
            } else {
                match reg.user_stack(proc, id) {
                    StackFrames::Kept(frames) => {
                        let mut kinds = UserKinds::new();
                        user_stacks.numbers.extend(
                            frames
                                .iter()
                                .map(|&f| number((f, kinds.next(f == UserFrame::Signal)))),
                        )
                    }
                    StackFrames::Mapped(mappings) => {
                        let known = by_address.entry(proc).or_insert_with(Known::new);
                        let mut kinds = UserKinds::new();
                        user_stacks.numbers.extend(addrs.iter().map(|&a| {
                            let k = kinds.next(a == crate::unwind_table::SIGNAL_FRAME);
                            known.number(a, k, || number((mappings.frame(a), k)))
                        }));
                    }
                }
            }
            let len = user_stacks.numbers.len() - at;
            user_stacks.list.push((proc, id, at, len));
        }
    }
    let unames = sym.user_names(reg, &distinct);

    // The files user frames are in, each once, numbered as the profile
    // lists them.
    let mut objects = Vec::new();
    let mut object_index: ahash::AHashMap<u32, u32> = ahash::AHashMap::new();
    for &(f, _) in &distinct {
        if let UserFrame::File { object, .. } = f {
            object_index.entry(object).or_insert_with(|| {
                objects.push(reg.object_info(object));
                (objects.len() - 1) as u32
            });
        }
    }
    // Where a user frame is: the offset in its file, or its address; a
    // signal frame is nowhere (a frame known by its name only).
    let place = |f: UserFrame| match f {
        UserFrame::File { object, offset } => (offset, Origin::Object(object_index[&object]), None),
        UserFrame::Unmapped(a) => (a, Origin::Unknown, None),
        UserFrame::Python { code, instr } => match reg.python_code(code) {
            Some(c) => (
                c.line(instr).map_or(0, u64::from),
                Origin::Python,
                Some(Arc::<str>::from(c.filename.as_str())),
            ),
            None => (0, Origin::Unknown, None),
        },
        UserFrame::Signal | UserFrame::PythonUnreadable | UserFrame::PythonCutShort => {
            (0, Origin::Unknown, None)
        }
    };
    // The frames of one address: functions inlined there, innermost
    // first, then the function itself.
    // `at`: the address as `--addresses` shows it (a user frame's in its
    // process, where `addr` is the offset in its file); None for a frame
    // that has none (a signal frame).
    let addresses = sym.options().addresses;
    let frames_at =
        |names: Vec<Named>, addr: u64, at: Option<u64>, origin: Origin, file: Option<Arc<str>>| {
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
        };
    let unknown = || {
        vec![Named {
            name: "[unknown]".into(),
            shown: None,
        }]
    };

    let mut merger = Merger::with_capacity(raw.entries.len());
    // Each distinct part is made and numbered once, and shared (an `Arc`)
    // by every sample that has it: 100,000 samples of 30 frames each were
    // most of the report's time and memory when each had frames of its
    // own.
    let user_names =
        |f: UserFrame, k: AddrKind| unames.get(&(f, k)).cloned().unwrap_or_else(unknown);
    // The frames of each distinct user address, made once: the same in
    // every stack and process that has it, except where `--addresses`
    // shows the address in the process, or a perf map names JIT code.
    // All in one vector: the frames of distinct user address `n` are
    // `placed[spans[n]]`, and `words` their [`frame_word`]s.
    let mut placed: Vec<Frame> = Vec::new();
    let mut placed_words: Vec<u64> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    if !addresses {
        spans.reserve(distinct.len());
        for &(f, k) in &distinct {
            let (addr, origin, file) = place(f);
            let at = placed.len();
            placed.extend(frames_at(user_names(f, k), addr, None, origin, file));
            spans.push((at, placed.len() - at));
        }
        placed_words.extend(placed.iter().map(|f| frame_word(f)));
    }
    // Each user part made and numbered (see [`Merger::part`]; the part
    // itself is the merger's), in the order its frames were numbered.
    let mut user_parts: Vec<u32> = Vec::with_capacity(user_stacks.list.len());
    // The frames of the part being made, moved into it.
    let mut scratch: Vec<Frame> = Vec::new();
    let mut scratch_words: Vec<u64> = Vec::new();
    let jit_anywhere = reg.has_perf_maps();
    for &(proc, id, at, len) in &user_stacks.list {
        let numbers = &user_stacks.numbers[at..at + len];
        let jit = jit_anywhere && reg.perf_map(proc).is_some();
        let n = if !jit && !addresses {
            // Frames made before, and what each adds to the part's hash.
            for &n in numbers {
                let (at, len) = spans[n as usize];
                scratch.extend_from_slice(&placed[at..at + len]);
                scratch_words.extend_from_slice(&placed_words[at..at + len]);
            }
            let part = Part::Frames(scratch.drain(..).collect());
            let n = merger.part_words(part, &scratch_words);
            scratch_words.clear();
            n
        } else {
            let addrs = raw.stacks.get(&id).unwrap_or(&[]);
            for (i, &n) in numbers.iter().enumerate() {
                let (f, k) = distinct[n as usize];
                let at = addrs.get(i).copied().unwrap_or(0);
                let shown_at = (f != UserFrame::Signal).then_some(at);
                // JIT code: named by its runtime's perf map.
                let jitted = jit.then(|| sym.jit_name(reg, proc, f, at, k)).flatten();
                match jitted {
                    None if !addresses => {
                        let (at, len) = spans[n as usize];
                        scratch.extend_from_slice(&placed[at..at + len]);
                    }
                    _ => {
                        let (addr, origin, file) = place(f);
                        let names = jitted.map_or_else(|| user_names(f, k), |n| vec![n]);
                        scratch.extend(frames_at(names, addr, shown_at, origin, file));
                    }
                }
            }
            merger.part(Part::Frames(scratch.drain(..).collect()))
        };
        user_parts.push(n);
    }
    let UserStacks { of, .. } = user_stacks;
    // The user part of what is had at `had` (see [`UserStacks::of`]).
    let user_part = |merger: &mut Merger, had: usize, r: StackRef| match r {
        StackRef::Id(_) => match of.get(had).copied().unwrap_or(UserStacks::NONE) {
            // A stack the counts name but that was not stored.
            UserStacks::NONE => merger.part(Part::Missed),
            n => user_parts[n as usize],
        },
        _ => frameless(merger, r),
    };
    // Where each waker's user stack is had.
    let waker_at: ahash::AHashMap<u64, usize> = raw
        .wakers
        .keys()
        .enumerate()
        .map(|(j, &id)| (id, raw.entries.len() + j))
        .collect();
    let mut kernel_parts: ahash::AHashMap<(u64, bool), u32> = ahash::AHashMap::new();
    let mut kernel_part = |merger: &mut Merger, r: StackRef, first_is_ip: bool| match r {
        StackRef::Id(id) => *kernel_parts.entry((id, first_is_ip)).or_insert_with(|| {
            let part = match raw.stacks.get(&id) {
                None => Part::Missed,
                Some(frames) => {
                    // An address can be several frames: functions
                    // inlined there, innermost first.
                    let mut named: Vec<Frame> = kinds(frames, first_is_ip)
                        .flat_map(|k| {
                            let names = knames.get(&k).cloned().unwrap_or_else(unknown);
                            frames_at(names, k.0, Some(k.0), Origin::Kernel, None)
                        })
                        .collect();
                    let ours = profiler_frames(named.iter().map(|f| f.text()));
                    named.drain(..ours);
                    Part::Frames(named.into())
                }
            };
            merger.part(part)
        }),
        _ => frameless(merger, r),
    };

    let mut wakers: ahash::AHashMap<u64, u32> = ahash::AHashMap::new();
    for (i, e) in raw.entries.iter().enumerate() {
        let user = user_part(&mut merger, i, e.user_stack);
        let kernel = kernel_part(&mut merger, e.kernel_stack, kernel_first_is_ip);
        let waker = e.waker.map(|w| match w {
            WakerRef::Preempted => merger.waker(Waker::Preempted),
            WakerRef::NotWoken => merger.waker(Waker::NotWoken),
            WakerRef::Unseen => merger.waker(Waker::Unseen),
            WakerRef::MissedFull => merger.waker(Waker::Missed),
            WakerRef::Id(id) => match raw.wakers.get(&id) {
                None => merger.waker(Waker::Missed),
                Some(w) => match wakers.get(&id) {
                    Some(&n) => n,
                    None => {
                        let at = waker_at.get(&id).copied().unwrap_or(usize::MAX);
                        let user = user_part(&mut merger, at, w.user_stack);
                        let kernel = kernel_part(&mut merger, w.kernel_stack, false);
                        let (user, kernel) = (merger.part_of(user), merger.part_of(kernel));
                        let n = merger.waker(Waker::classify(w.comm.clone(), w.pid, user, kernel));
                        wakers.insert(id, n);
                        n
                    }
                },
            },
        });
        let container = merger.container(
            reg.container(Proc {
                tgid: e.tgid,
                start: e.start,
            })
            .as_ref(),
        );
        merger.add(
            (
                e.tgid, e.pid, &e.comm, user, kernel, e.state, waker, container,
            ),
            e.total_ns,
            e.count,
        );
    }
    let samples = merger.samples();
    Profile {
        samples,
        counters: raw.counters.clone(),
        objects,
        window: None,
    }
}

/// The number of the part a reference without frames stands for: none by
/// nature or request, or lost.
fn frameless(merger: &mut Merger, r: StackRef) -> u32 {
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
