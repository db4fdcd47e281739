//! Samples of the same stacks merged as they are built: each distinct part
//! (user or kernel stack) and waker numbered once, their times summed.

use std::sync::Arc;

use super::{Container, Frame, FrameInfo, OffState, Origin, Part, Sample, Waker};

/// `samples` with frames reduced to their names, merged where they then
/// look alike (see [`Profile::by_name`]).
pub(super) fn samples_by_name<'a>(samples: impl Iterator<Item = &'a Sample>) -> Vec<Sample> {
    let samples: Vec<&Sample> = samples.collect();
    let mut merger = Merger::with_capacity(samples.len());
    // Each distinct part and frame reduced once: samples share their
    // parts, parts their frames (the samples, borrowed all along, keep
    // the addresses apart).
    let mut frames: ahash::AHashMap<usize, Frame> = ahash::AHashMap::new();
    let mut reduce = |f: &[Frame]| -> Part {
        Part::Frames(
            f.iter()
                .map(|f| {
                    frames
                        .entry(f.identity())
                        .or_insert_with(|| {
                            Frame::new(FrameInfo {
                                shown: f.shown.clone(),
                                ..FrameInfo::named(f.name.clone())
                            })
                        })
                        .clone()
                })
                .collect(),
        )
    };
    let mut named: ahash::AHashMap<usize, u32> = ahash::AHashMap::new();
    let mut number =
        |merger: &mut Merger, p: &Part, reduce: &mut dyn FnMut(&[Frame]) -> Part| match p {
            Part::Frames(f) => *named
                .entry(Arc::as_ptr(f) as *const Frame as usize)
                .or_insert_with(|| merger.part(reduce(f))),
            other => merger.part(other.clone()),
        };
    for s in samples {
        let user = number(&mut merger, &s.user, &mut reduce);
        let kernel = number(&mut merger, &s.kernel, &mut reduce);
        let waker = s.waker.as_ref().map(|w| {
            let reduced = w.map_parts(|p| match p {
                Part::Frames(f) => reduce(f),
                other => other.clone(),
            });
            merger.waker(reduced)
        });
        let container = merger.container(s.container.as_ref());
        if let Some(name) = &s.thread {
            merger.thread(s.tgid, s.pid, name.clone());
        }
        merger.add(
            (
                s.tgid, s.pid, &s.comm, user, kernel, s.state, waker, container,
            ),
            s.total_ns,
            s.count,
        );
    }
    merger.samples()
}

/// Blocked time (ns, blocks) summed by what makes a sample: process,
/// thread, command, stacks, state and waker. Parts and wakers are
/// numbered as they are made ([`Merger::part`], [`Merger::waker`]) and
/// compared by number: each distinct part is hashed once, not once per
/// sample.
pub(super) struct Merger<'a> {
    parts: NumberedParts,
    wakers: ahash::AHashMap<WakerKey, u32>,
    waker_list: Vec<Waker>,
    /// By address: equal containers are one `Arc` (the registry's).
    containers: ahash::AHashMap<usize, u32>,
    container_list: Vec<Arc<Container>>,
    /// Threads' names in their runtimes, by process and thread.
    threads: ahash::AHashMap<(u32, u32), Arc<str>>,
    sums: ahash::AHashMap<SumKey<'a>, (u64, u64)>,
    /// Each sample added, in order, where they are kept apart (see
    /// [`Merger::each`]).
    each: Option<Vec<(SumKey<'a>, (u64, u64))>>,
}

/// A sample's identity, its parts, waker and container by number.
type SumKey<'a> = (
    u32,
    u32,
    &'a str,
    u32,
    u32,
    Option<OffState>,
    Option<u32>,
    Option<u32>,
);

/// A waker by content: its kind, command and pid, its parts by number.
type WakerKey = (u8, String, u32, u32, u32);

impl<'a> Merger<'a> {
    /// Room for about `samples` samples.
    pub(super) fn with_capacity(samples: usize) -> Merger<'a> {
        Merger {
            parts: NumberedParts::with_capacity(samples),
            wakers: ahash::AHashMap::new(),
            waker_list: Vec::new(),
            containers: ahash::AHashMap::new(),
            container_list: Vec::new(),
            threads: ahash::AHashMap::new(),
            sums: ahash::AHashMap::with_capacity(samples),
            each: None,
        }
    }

    /// A merger that keeps the samples apart: [`Merger::samples_each`]
    /// gives one for each added, in order (their parts still numbered,
    /// and shared, once).
    pub(super) fn each(samples: usize) -> Merger<'a> {
        Merger {
            each: Some(Vec::with_capacity(samples)),
            ..Merger::with_capacity(samples)
        }
    }

    /// Whether the samples are kept apart (see [`Merger::each`]).
    pub(super) fn keeps_each(&self) -> bool {
        self.each.is_some()
    }

    /// The number of `container`: equal containers get one number.
    pub(super) fn container(&mut self, container: Option<&Arc<Container>>) -> Option<u32> {
        let c = container?;
        Some(
            *self
                .containers
                .entry(Arc::as_ptr(c) as usize)
                .or_insert_with(|| {
                    self.container_list.push(c.clone());
                    (self.container_list.len() - 1) as u32
                }),
        )
    }

    /// Thread `pid` of process `tgid` is named `name` in its runtime.
    pub(super) fn thread(&mut self, tgid: u32, pid: u32, name: Arc<str>) {
        self.threads.insert((tgid, pid), name);
    }

    /// Whether thread `pid` of process `tgid` has its runtime's name.
    pub(super) fn has_thread(&self, tgid: u32, pid: u32) -> bool {
        self.threads.contains_key(&(tgid, pid))
    }

    /// The number of `part`: equal parts get one number.
    pub(super) fn part(&mut self, part: Part) -> u32 {
        self.parts.number(part)
    }

    /// The number of a part of frames whose [`frame_word`]s are `words`.
    pub(super) fn part_words(&mut self, part: Part, words: &[u64]) -> u32 {
        self.parts.number_words(part, words)
    }

    /// The part numbered `n`.
    pub(super) fn part_of(&self, n: u32) -> Part {
        self.parts.list[n as usize].clone()
    }

    /// The number of `waker`: equal wakers get one number.
    pub(super) fn waker(&mut self, w: Waker) -> u32 {
        let (wu, wk) = w.parts();
        let (wu, wk) = (self.parts.number(wu.clone()), self.parts.number(wk.clone()));
        let key = match &w {
            Waker::Task { comm, pid, .. } => (0, comm.clone(), *pid, wu, wk),
            Waker::Interrupt { .. } => (1, String::new(), 0, wu, wk),
            Waker::Softirq { .. } => (2, String::new(), 0, wu, wk),
            Waker::Preempted => (3, String::new(), 0, wu, wk),
            Waker::NotWoken => (4, String::new(), 0, wu, wk),
            Waker::Unseen => (5, String::new(), 0, wu, wk),
            Waker::Missed => (6, String::new(), 0, wu, wk),
            Waker::Chain { frames } => (7, String::new(), 0, self.parts.number(frames.clone()), wk),
        };
        *self.wakers.entry(key).or_insert_with(|| {
            self.waker_list.push(w);
            (self.waker_list.len() - 1) as u32
        })
    }

    pub(super) fn add(&mut self, key: SumKey<'a>, ns: u64, count: u64) {
        if let Some(each) = &mut self.each {
            each.push((key, (ns, count)));
            return;
        }
        let slot = self.sums.entry(key).or_default();
        slot.0 += ns;
        slot.1 += count;
    }

    /// The samples of a merger made by [`Merger::each`], in the order they
    /// were added.
    pub(super) fn samples_each(self) -> Vec<Sample> {
        let Merger {
            parts,
            waker_list,
            container_list,
            threads,
            each,
            ..
        } = self;
        let lists = (&threads, &waker_list[..], &container_list[..]);
        each.unwrap_or_default()
            .into_iter()
            .map(|(key, totals)| sample(key, totals, |n| parts.list[n as usize].clone(), lists))
            .collect()
    }

    /// The merged samples, in the order of [`sort_samples`].
    pub(super) fn samples(self) -> Vec<Sample> {
        let Merger {
            parts,
            waker_list,
            container_list,
            threads,
            sums,
            ..
        } = self;
        // Sorted as [`sort_samples`] sorts, by number where numbers are
        // equal: sorting the samples themselves moved every one of them, a
        // few hundred bytes at a time, many times over (see BENCHMARKS.md,
        // report time).
        let part = |a: u32, b: u32| {
            if a == b {
                std::cmp::Ordering::Equal
            } else {
                parts.list[a as usize].cmp(&parts.list[b as usize])
            }
        };
        let waker = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(a), Some(b)) if a != b => waker_list[a as usize].cmp(&waker_list[b as usize]),
            _ => a.cmp(&b),
        };
        let mut sums: Vec<(SumKey, (u64, u64))> = sums.into_iter().collect();
        sums.sort_unstable_by(|(a, (a_ns, a_n)), (b, (b_ns, b_n))| {
            a_ns.cmp(b_ns)
                .then_with(|| a.2.cmp(b.2))
                .then_with(|| a.1.cmp(&b.1))
                .then_with(|| part(a.3, b.3))
                .then_with(|| part(a.4, b.4))
                .then_with(|| a.5.cmp(&b.5))
                .then_with(|| waker(a.6, b.6))
                .then_with(|| (a.0, a_n).cmp(&(b.0, b_n)))
                .then_with(|| {
                    let c = |n: Option<u32>| n.map(|n| &container_list[n as usize]);
                    c(a.7).cmp(&c(b.7))
                })
        });
        // The last sample to have a part takes the merger's copy of it
        // rather than a clone: most parts are in one sample, and a clone
        // and the copy's drop each read the part's count, a read from all
        // over memory for every sample (see BENCHMARKS.md, report time).
        let mut uses = vec![0u32; parts.list.len()];
        for ((_, _, _, u, k, _, _, _), _) in &sums {
            uses[*u as usize] += 1;
            uses[*k as usize] += 1;
        }
        let mut list = parts.list;
        let mut take = |n: u32| {
            let n = n as usize;
            uses[n] -= 1;
            if uses[n] == 0 {
                std::mem::replace(&mut list[n], Part::Absent)
            } else {
                list[n].clone()
            }
        };
        let lists = (&threads, &waker_list[..], &container_list[..]);
        sums.into_iter()
            .map(|(key, totals)| sample(key, totals, &mut take, lists))
            .collect()
    }
}

/// What a sample's numbers refer to: the threads' names in their
/// runtimes, the wakers and the containers.
type Lists<'l> = (
    &'l ahash::AHashMap<(u32, u32), Arc<str>>,
    &'l [Waker],
    &'l [Arc<Container>],
);

/// The sample of `key` with its totals: its parts by `part`, its thread's
/// name, waker and container from the merger's lists.
fn sample(
    (tgid, pid, comm, u, k, state, w, c): SumKey<'_>,
    (total_ns, count): (u64, u64),
    mut part: impl FnMut(u32) -> Part,
    (threads, wakers, containers): Lists<'_>,
) -> Sample {
    Sample {
        comm: comm.to_string(),
        tgid,
        pid,
        thread: threads.get(&(tgid, pid)).cloned(),
        user: part(u),
        kernel: part(k),
        state,
        waker: w.map(|w| wakers[w as usize].clone()),
        container: c.map(|c| containers[c as usize].clone()),
        total_ns,
        count,
    }
}

/// Parts numbered by content: equal parts get one number. Each part is
/// hashed once, when it is numbered; the table holds hashes, so growing
/// it does not hash the parts again.
struct NumberedParts {
    hasher: ahash::RandomState,
    /// The last part numbered with each hash; `next` chains the others.
    heads: ahash::AHashMap<u64, u32>,
    next: Vec<u32>,
    list: Vec<Part>,
}

impl NumberedParts {
    const END: u32 = u32::MAX;

    fn with_capacity(n: usize) -> NumberedParts {
        NumberedParts {
            hasher: ahash::RandomState::new(),
            heads: ahash::AHashMap::with_capacity(n),
            next: Vec::with_capacity(n),
            list: Vec::with_capacity(n),
        }
    }

    /// A hash that equal parts share, cheaper than hashing every name:
    /// the frames' addresses, origins and the lengths of their names
    /// (parts that differ only in names are told apart by comparing).
    fn hash(&self, part: &Part) -> u64 {
        match part {
            Part::Absent => self.hasher.hash_one(0u8),
            Part::Missed => self.hasher.hash_one(1u8),
            Part::Frames(frames) => self.hash_words(frames.iter().map(|f| frame_word(f))),
        }
    }

    /// The hash of a part of frames, from their [`frame_word`]s.
    fn hash_words(&self, words: impl Iterator<Item = u64>) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.hasher.build_hasher();
        h.write_u8(2);
        let mut len = 0usize;
        for w in words {
            h.write_u64(w);
            len += 1;
        }
        h.write_usize(len);
        h.finish()
    }

    /// The number of a part of frames whose [`frame_word`]s are `words`.
    fn number_words(&mut self, part: Part, words: &[u64]) -> u32 {
        let hash = self.hash_words(words.iter().copied());
        self.number_hashed(part, hash)
    }

    fn number(&mut self, part: Part) -> u32 {
        let hash = self.hash(&part);
        self.number_hashed(part, hash)
    }

    fn number_hashed(&mut self, part: Part, hash: u64) -> u32 {
        let head = self.heads.get(&hash).copied().unwrap_or(Self::END);
        let mut n = head;
        while n != Self::END {
            if self.list[n as usize] == part {
                return n;
            }
            n = self.next[n as usize];
        }
        let n = self.list.len() as u32;
        self.list.push(part);
        self.next.push(head);
        self.heads.insert(hash, n);
        n
    }
}

/// What a frame adds to the hash of a part (see
/// [`NumberedParts::hash`]): its address, origin, the length of its name
/// and whether it is inlined.
pub(super) fn frame_word(f: &FrameInfo) -> u64 {
    let origin = match f.origin {
        Origin::Unknown => 0,
        Origin::Kernel => 1,
        Origin::Runtime(k) => 2 | (k as u64) << 40,
        Origin::Object(i) => 3 + u64::from(i),
    };
    f.addr.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (origin << 33)
        ^ ((f.name.len() as u64) << 1)
        ^ u64::from(f.inlined)
}
