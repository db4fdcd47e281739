//! `-i`: the window cut into intervals, each read and written on its own,
//! as bcc's `stackcount -i` prints them.
//!
//! The BPF program keys every part of a block by the interval it falls in
//! (interval `i` is `[start + i * len, start + (i + 1) * len)` on the
//! program's clock), so each interval holds exactly its own time: a block
//! that spans an interval's end is split there, and one that covers whole
//! intervals is stored once as a span of them. At each end the cut iterator
//! counts the blocks under way up to it ([`crate::tracer::Tracer::cut`]);
//! then the interval's entries are taken out of the table and written,
//! once the user stacks copied for them are walked ([`Held`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::raw::{RawEntry, RawProfile, StackRef};

/// When the intervals end, on CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// The window's start.
    pub start_ns: u64,
    pub len_ns: u64,
}

impl Schedule {
    /// The end of interval `i`.
    pub fn end_of(&self, i: u32) -> u64 {
        self.start_ns
            .saturating_add((i as u64 + 1).saturating_mul(self.len_ns))
    }

    /// The interval that ends at `end`, or holds it.
    pub fn last_before(&self, end: u64) -> u32 {
        let into = end.saturating_sub(self.start_ns).saturating_sub(1);
        u32::try_from(into / self.len_ns.max(1)).unwrap_or(u32::MAX)
    }

    /// The start of interval `i`.
    pub fn start_of(&self, i: u32) -> u64 {
        self.start_ns
            .saturating_add((i as u64).saturating_mul(self.len_ns))
    }
}

/// Time taken from the table after its interval was written: a part of a
/// block that the program could only count late (a switch-in the
/// tracepoint did not report, closed at the thread's next switch-out).
#[derive(Clone, Copy, Debug, Default)]
pub struct Late {
    pub ns: u64,
    pub intervals: u64,
}

/// Turns entries taken from the table into those of one interval, keeping
/// the later parts of spans for the intervals they cover.
#[derive(Debug, Default)]
pub struct Splitter {
    carried: Vec<RawEntry>,
    pub late: Late,
}

impl Splitter {
    /// The entries of interval `i`, from `taken` (entries of intervals up
    /// to `i`) and the spans carried from earlier takes. What belongs to
    /// an interval before `i` is late ([`Splitter::late`]).
    pub fn interval(&mut self, taken: Vec<RawEntry>, i: u32) -> Vec<RawEntry> {
        let mut out = Vec::new();
        let mut carried = Vec::new();
        let mut late_before = false;
        for e in std::mem::take(&mut self.carried).into_iter().chain(taken) {
            let span = e.span.max(1) as u64;
            let first = e.interval as u64;
            let last = first + span - 1;
            let per = e.total_ns / span;
            let i = i as u64;
            if first > i {
                carried.push(e);
                continue;
            }
            if first < i {
                let late = last.min(i - 1) - first + 1;
                self.late.ns += per * late;
                late_before = true;
            }
            if last < i {
                continue;
            }
            out.push(RawEntry {
                interval: i as u32,
                span: 1,
                total_ns: per,
                ..e.clone()
            });
            if last > i {
                carried.push(RawEntry {
                    interval: i as u32 + 1,
                    span: (last - i) as u32,
                    total_ns: per * (last - i),
                    ..e
                });
            }
        }
        if late_before {
            self.late.intervals += 1;
        }
        self.carried = carried;
        merge(out)
    }
}

/// Entries of one interval that differ only in how they were stored (a
/// part, a span) become one.
fn merge(entries: Vec<RawEntry>) -> Vec<RawEntry> {
    let mut by_key: std::collections::HashMap<_, RawEntry> = Default::default();
    for e in entries {
        let key = (
            e.tgid,
            e.start,
            e.pid,
            e.comm.clone(),
            e.user_stack,
            e.kernel_stack,
            e.state,
            e.waker,
        );
        by_key
            .entry(key)
            .and_modify(|m| {
                m.total_ns += e.total_ns;
                m.count += e.count;
            })
            .or_insert(e);
    }
    let mut out: Vec<RawEntry> = by_key.into_values().collect();
    out.sort_by_key(|e| (e.tgid, e.pid));
    out
}

/// Intervals taken from the table while user stacks copied for them (see
/// [`crate::deferred`]) still wait for their walk: the blocks of a new
/// process counted just before a cut, whose tables come a few
/// milliseconds later (or seconds, for a large program). Each is written
/// once every copy it counts is walked or given up, in order, and at the
/// latest [`Held::WAIT`] after it was taken; the tracing loop goes on
/// meanwhile, and walks them.
pub struct Held<T = ()> {
    queue: VecDeque<HeldInterval<T>>,
    /// Frames of copies walked since, that a held interval counts.
    walked: HashMap<u64, Vec<u64>>,
    stats: HeldStats,
}

struct HeldInterval<T> {
    raw: RawProfile,
    /// What else is written with it (`--chains`: its blocks' records).
    extra: Option<T>,
    /// The copies it counts that are not walked yet.
    missing: HashSet<u64>,
    taken: Instant,
}

/// What intervals waited for, for `-v`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldStats {
    /// Intervals that waited for copies.
    pub intervals: u64,
    /// Copies waited for, counted once per interval.
    pub stacks: u64,
    /// ... walked in time for their interval.
    pub walked: u64,
    /// ... given up (their process exited before its tables were made, or
    /// there was no room for them).
    pub given_up: u64,
    /// ... still waiting when their interval had waited [`Held::WAIT`].
    pub late: u64,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            queue: VecDeque::new(),
            walked: HashMap::new(),
            stats: HeldStats::default(),
        }
    }
}

impl<T> Held<T> {
    /// How long an interval waits at most, as the end of a trace waits for
    /// tables.
    pub const WAIT: Duration = Duration::from_secs(5);

    /// Interval `raw`, taken at `now`, with what else is written with it
    /// (`extra`, which names the stacks `extra_stacks`): it waits for the
    /// copies it counts that are not among its stacks, and behind the
    /// intervals waiting already.
    pub fn push(
        &mut self,
        raw: RawProfile,
        extra: Option<T>,
        extra_stacks: Vec<u64>,
        now: Instant,
    ) {
        let ids = raw
            .entries
            .iter()
            .map(|e| e.user_stack)
            .chain(raw.wakers.values().map(|w| w.user_stack))
            .chain(extra_stacks.into_iter().map(StackRef::Id));
        let missing: HashSet<u64> = ids
            .filter_map(|r| match r {
                StackRef::Id(id)
                    if crate::deferred::is_copy(id) && !raw.stacks.contains_key(&id) =>
                {
                    Some(id)
                }
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            self.stats.intervals += 1;
            self.stats.stacks += missing.len() as u64;
        }
        self.queue.push_back(HeldInterval {
            raw,
            extra,
            missing,
            taken: now,
        });
    }

    /// Whether an interval waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Copy `id` was walked into `frames` (innermost first), and stored.
    pub fn walked(&mut self, id: u64, frames: &[u64]) {
        if self.queue.iter().any(|h| h.missing.contains(&id)) {
            // As the stored stack reads back: up to its first zero.
            let len = frames.iter().position(|&f| f == 0).unwrap_or(frames.len());
            self.walked.insert(id, frames[..len].to_vec());
        }
    }

    /// The intervals to write now, in order: those whose copies are all
    /// walked or no longer `waiting` (given up), or that waited
    /// [`Held::WAIT`] by `now`. The copies walked are among their stacks;
    /// those given up or late are not.
    pub fn ready(
        &mut self,
        waiting: &dyn Fn(u64) -> bool,
        now: Instant,
    ) -> Vec<(RawProfile, Option<T>)> {
        let mut out = Vec::new();
        while let Some(h) = self.queue.front_mut() {
            let walked = &self.walked;
            let stats = &mut self.stats;
            let raw = &mut h.raw;
            h.missing.retain(|&id| {
                if let Some(frames) = walked.get(&id) {
                    raw.stacks.insert(id, frames);
                    stats.walked += 1;
                    false
                } else if !waiting(id) {
                    stats.given_up += 1;
                    false
                } else {
                    true
                }
            });
            if !h.missing.is_empty() && now.saturating_duration_since(h.taken) < Self::WAIT {
                break;
            }
            self.stats.late += h.missing.len() as u64;
            if let Some(h) = self.queue.pop_front() {
                out.push((h.raw, h.extra));
            }
        }
        let queue = &self.queue;
        self.walked
            .retain(|id, _| queue.iter().any(|h| h.missing.contains(id)));
        out
    }

    pub fn stats(&self) -> HeldStats {
        self.stats
    }
}

/// An output file's name for each interval: `{n}` is the interval's number
/// (from 1), `{time}` the local time at its end (`HHMMSS`). A name with
/// neither gets every interval, one after the other (the report and folded
/// stacks only).
#[derive(Clone, Debug, PartialEq)]
pub struct NamePattern(PathBuf);

impl NamePattern {
    /// `Some` when `path` has a placeholder.
    pub fn new(path: &Path) -> Option<NamePattern> {
        let s = path.to_string_lossy();
        (s.contains("{n}") || s.contains("{time}")).then(|| NamePattern(path.to_path_buf()))
    }

    /// The name of interval `n` (from 1), ending at `end_unix_ns`.
    pub fn name(&self, n: u64, end_unix_ns: u64) -> PathBuf {
        let s = self.0.to_string_lossy();
        let (h, m, sec) = local_hms(end_unix_ns);
        PathBuf::from(
            s.replace("{n}", &n.to_string())
                .replace("{time}", &format!("{h:02}{m:02}{sec:02}")),
        )
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Writes one interval to an output that gets them all one after the
/// other: `-T`'s time line, the interval, and after a report a blank line.
pub fn write_part(
    out: &mut dyn Write,
    timestamp: Option<&str>,
    report: bool,
    render: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    if let Some(t) = timestamp {
        writeln!(out, "{t}")?;
    }
    render(out)?;
    if report {
        writeln!(out)?;
    }
    Ok(())
}

/// `-T`: the line before each interval, the local time at its end.
pub fn timestamp_line(end_unix_ns: u64) -> String {
    let (h, m, s) = local_hms(end_unix_ns);
    format!("{h:02}:{m:02}:{s:02}")
}

/// Hours, minutes and seconds of the local time at `unix_ns`.
fn local_hms(unix_ns: u64) -> (i32, i32, i32) {
    let secs = (unix_ns / 1_000_000_000) as libc::time_t;
    // SAFETY: tm is plain data; localtime_r writes it and reads secs.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !ok {
        let day = unix_ns / 1_000_000_000 % 86_400;
        return (
            (day / 3600) as i32,
            (day / 60 % 60) as i32,
            (day % 60) as i32,
        );
    }
    (tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// Checks the outputs for `-i`: a format written whole (a flame graph,
/// pprof, speedscope) needs a file per interval, so a name with `{n}` or
/// `{time}`; the report, folded stacks and OTLP requests may go one after
/// the other to stdout or one file.
pub fn check_outputs(outputs: &[(Option<PathBuf>, bool)]) -> Result<()> {
    for (path, whole) in outputs {
        let patterned = path.as_deref().and_then(NamePattern::new).is_some();
        if *whole && !patterned {
            match path {
                None => bail!(
                    "with -i, a flame graph, pprof or speedscope profile is written to a file \
                     per interval: give -o with {{n}} or {{time}} in its name (e.g. -o \
                     offcpu-{{n}}.svg)"
                ),
                Some(p) => bail!(
                    "with -i, -o {} needs {{n}} or {{time}} in its name: a file per interval \
                     (e.g. offcpu-{{n}}.svg)",
                    p.display()
                ),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::StackRef;

    fn entry(pid: u32, interval: u32, span: u32, total_ns: u64) -> RawEntry {
        RawEntry {
            tgid: pid,
            start: 1,
            pid,
            comm: "t".into(),
            user_stack: StackRef::None,
            kernel_stack: StackRef::None,
            state: None,
            waker: None,
            interval,
            span,
            total_ns,
            count: 1,
        }
    }

    #[test]
    fn spans_are_spread_over_the_intervals_they_cover() {
        let mut s = Splitter::default();
        // Interval 0: a part, and a span of intervals 1..=3 (taken early,
        // as when the program split a block at its switch-in).
        let got = s.interval(vec![entry(1, 0, 1, 400), entry(2, 1, 3, 3000)], 0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].total_ns, 400);
        let got = s.interval(vec![entry(2, 1, 1, 7)], 1);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].total_ns, got[0].count), (1007, 2));
        assert_eq!(s.interval(vec![], 2)[0].total_ns, 1000);
        assert_eq!(s.interval(vec![], 3)[0].total_ns, 1000);
        assert!(s.interval(vec![], 4).is_empty());
        assert_eq!(s.late.ns, 0);
    }

    #[test]
    fn parts_of_written_intervals_are_late() {
        let mut s = Splitter::default();
        assert!(s.interval(vec![], 0).is_empty());
        assert!(s.interval(vec![], 1).is_empty());
        let got = s.interval(vec![entry(1, 0, 1, 5), entry(1, 1, 2, 20)], 2);
        assert_eq!(got[0].total_ns, 10);
        assert_eq!(s.late.ns, 15);
        assert_eq!(s.late.intervals, 1);
    }

    /// A profile of one entry per user stack, of `stacks` stored.
    fn raw_of(users: &[u64], stacks: &[u64]) -> RawProfile {
        let mut raw = RawProfile::default();
        for (i, &id) in users.iter().enumerate() {
            raw.entries.push(RawEntry {
                user_stack: StackRef::Id(id),
                ..entry(i as u32 + 1, 0, 1, 10)
            });
        }
        for &id in stacks {
            raw.stacks.insert(id, &[0x1000, 0x2000]);
        }
        raw
    }

    #[test]
    fn intervals_wait_for_their_copies_in_order() {
        const COPY: u64 = 1 << 62;
        let t0 = Instant::now();
        let mut held: Held = Held::default();
        // Interval 0 counts a stored stack and two copies, one walked at
        // once; interval 1 counts nothing copied, but comes after it.
        held.push(
            raw_of(&[5 << 32, COPY | 1, COPY | 2], &[5 << 32]),
            None,
            vec![],
            t0,
        );
        held.push(raw_of(&[6 << 32], &[6 << 32]), None, vec![], t0);
        held.walked(COPY | 1, &[0x40_1000, 0x40_2000, 0, 0]);
        // A copy no interval counts is not kept.
        held.walked(COPY | 9, &[0x40_1000]);
        let waiting = |id: u64| id == COPY | 2;
        assert!(held.ready(&waiting, t0).is_empty());
        assert!(!held.is_empty());
        // The second copy walked: both written, in order, with the frames
        // walked as stored (up to the first zero).
        held.walked(COPY | 2, &[0x40_3000]);
        let out = held.ready(&waiting, t0);
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].0.stacks.get(&(COPY | 1)),
            Some(&[0x40_1000, 0x40_2000][..])
        );
        assert_eq!(out[0].0.stacks.get(&(COPY | 2)), Some(&[0x40_3000][..]));
        assert!(out[1].0.entries[0].user_stack == StackRef::Id(6 << 32));
        assert!(held.is_empty() && held.walked.is_empty());
        let s = held.stats();
        assert_eq!(
            (s.intervals, s.stacks, s.walked, s.given_up, s.late),
            (1, 2, 2, 0, 0)
        );
    }

    #[test]
    fn copies_given_up_or_late_are_not_waited_for() {
        const COPY: u64 = 1 << 62;
        let t0 = Instant::now();
        let mut held: Held = Held::default();
        // A waker's copy counts as well as a blocked thread's.
        let mut raw = raw_of(&[COPY | 1], &[]);
        raw.wakers.insert(
            1 << 63,
            crate::raw::RawWaker {
                tgid: 1,
                start: 1,
                pid: 1,
                comm: "w".into(),
                user_stack: StackRef::Id(COPY | 2),
                kernel_stack: StackRef::None,
                dev: 0,
            },
        );
        held.push(raw, None, vec![], t0);
        // Copy 1 is given up; copy 2 still waits, until the bound.
        let waiting = |id: u64| id == COPY | 2;
        assert!(held.ready(&waiting, t0 + Duration::from_secs(1)).is_empty());
        let out = held.ready(&waiting, t0 + Held::<()>::WAIT);
        assert_eq!(out.len(), 1);
        assert!(out[0].0.stacks.is_empty());
        let s = held.stats();
        assert_eq!(
            (s.intervals, s.stacks, s.walked, s.given_up, s.late),
            (1, 2, 0, 1, 1)
        );
        // Stacks the BPF program stored are not copies: nothing to wait for.
        held.push(raw_of(&[7 << 32, 1 << 63 | 5], &[]), None, vec![], t0);
        assert_eq!(held.ready(&|_| true, t0).len(), 1);
        assert_eq!(held.stats().intervals, 1);
    }

    #[test]
    fn names_and_outputs() {
        let p = NamePattern::new(Path::new("out-{n}.svg")).unwrap();
        assert_eq!(p.name(3, 0), PathBuf::from("out-3.svg"));
        let s = Schedule {
            start_ns: 100,
            len_ns: 10,
        };
        assert_eq!(
            (s.last_before(110), s.last_before(111), s.last_before(100)),
            (0, 1, 0)
        );
        assert!(NamePattern::new(Path::new("out.svg")).is_none());
        assert!(check_outputs(&[(None, false)]).is_ok());
        assert!(check_outputs(&[(None, true)]).is_err());
        assert!(check_outputs(&[(Some("a.svg".into()), true)]).is_err());
        assert!(check_outputs(&[(Some("a-{time}.svg".into()), true)]).is_ok());
    }
}
