//! `--on-cpu`: each thread's running time, exact, shared out between the
//! stacks it was sampled in.
//!
//! The BPF program counts two kinds of entries in the state
//! [`OffState::Running`]: per thread (and interval), its running time in
//! the window, summed from its switches ([`StackRef::RunTotal`]); and per
//! thread and pair of stacks, how many of the CPU's samples caught it there
//! (their `count`, no time). Here each thread's time is divided between its
//! stacks in proportion to their samples, to the nanosecond (the remainders
//! given to the largest fractions), so that its running and off-CPU time
//! still add up to its part of the window. A thread that ran but was never
//! sampled keeps its time under [`StackRef::NotSampled`].

use std::collections::HashMap;

use crate::raw::{OffState, RawEntry, RawProfile, StackRef};

/// A thread's running time in one interval: what it is shared out by.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Thread {
    tgid: u32,
    start: u64,
    pid: u32,
    interval: u32,
    span: u32,
}

impl Thread {
    fn of(e: &RawEntry) -> Thread {
        Thread {
            tgid: e.tgid,
            start: e.start,
            pid: e.pid,
            interval: e.interval,
            span: e.span.max(1),
        }
    }
}

fn is_total(e: &RawEntry) -> bool {
    e.state == Some(OffState::Running) && e.user_stack == StackRef::RunTotal
}

/// Replaces the running-time entries of `raw` by the time of each sampled
/// stack, and counts in its counters what could not be shared out.
/// `user_part`: the marker of an unsampled run goes in the user part (else
/// the kernel's, where `-K` keeps only that).
pub fn divide(raw: &mut RawProfile, user_part: bool) {
    if !raw
        .entries
        .iter()
        .any(|e| e.state == Some(OffState::Running))
    {
        return;
    }
    // Each thread's time (and the command it ran under for most of it).
    let mut totals: HashMap<Thread, (u64, u64, String)> = HashMap::new();
    let mut sampled: HashMap<Thread, Vec<RawEntry>> = HashMap::new();
    let mut out = Vec::with_capacity(raw.entries.len());
    for e in std::mem::take(&mut raw.entries) {
        if is_total(&e) {
            let t = totals
                .entry(Thread::of(&e))
                .or_insert((0, 0, String::new()));
            if e.total_ns > t.1 {
                t.1 = e.total_ns;
                t.2 = e.comm.clone();
            }
            t.0 += e.total_ns;
        } else if e.state == Some(OffState::Running) {
            sampled.entry(Thread::of(&e)).or_default().push(e);
        } else {
            out.push(e);
        }
    }
    let c = &mut raw.counters;
    // In a fixed order: equal runs give equal output.
    let mut threads: Vec<_> = totals.into_iter().collect();
    threads.sort_unstable_by_key(|(t, _)| (t.interval, t.tgid, t.pid, t.start, t.span));
    for (thread, (ns, _, comm)) in threads {
        match sampled.remove(&thread) {
            Some(stacks) => out.extend(share(ns, stacks)),
            None => {
                c.oncpu_unsampled_threads += 1;
                c.oncpu_unsampled_ns += ns;
                let (user_stack, kernel_stack) = if user_part {
                    (StackRef::NotSampled, StackRef::None)
                } else {
                    (StackRef::None, StackRef::NotSampled)
                };
                out.push(RawEntry {
                    tgid: thread.tgid,
                    start: thread.start,
                    pid: thread.pid,
                    comm,
                    user_stack,
                    kernel_stack,
                    state: Some(OffState::Running),
                    waker: None,
                    interval: thread.interval,
                    span: thread.span,
                    total_ns: ns,
                    count: 0,
                });
            }
        }
    }
    c.oncpu_orphan_samples += sampled.values().flatten().map(|e| e.count).sum::<u64>();
    raw.entries = out;
}

/// `ns` shared out between `stacks` by their samples (`count`), exactly:
/// each gets the whole nanoseconds of its share, and the nanoseconds left
/// go one each to the largest fractions.
fn share(ns: u64, mut stacks: Vec<RawEntry>) -> Vec<RawEntry> {
    let samples: u128 = stacks.iter().map(|e| e.count as u128).sum();
    if samples == 0 {
        return Vec::new();
    }
    let mut given = 0u64;
    let mut fractions: Vec<(u128, usize)> = Vec::with_capacity(stacks.len());
    for (i, e) in stacks.iter_mut().enumerate() {
        let exact = ns as u128 * e.count as u128;
        e.total_ns = (exact / samples) as u64;
        given += e.total_ns;
        fractions.push((exact % samples, i));
    }
    // Largest fraction first; among equal ones, the first entry.
    fractions.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in fractions.iter().take((ns - given) as usize) {
        stacks[i].total_ns += 1;
    }
    stacks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, user: StackRef, state: Option<OffState>, ns: u64, count: u64) -> RawEntry {
        RawEntry {
            tgid: 10,
            start: 5,
            pid,
            comm: format!("t{pid}"),
            user_stack: user,
            kernel_stack: if user == StackRef::RunTotal {
                StackRef::RunTotal
            } else {
                StackRef::None
            },
            state,
            waker: None,
            interval: 0,
            span: 1,
            total_ns: ns,
            count,
        }
    }

    fn raw(entries: Vec<RawEntry>) -> RawProfile {
        RawProfile {
            entries,
            ..RawProfile::default()
        }
    }

    const RUN: Option<OffState> = Some(OffState::Running);

    #[test]
    fn time_is_shared_by_samples_to_the_nanosecond() {
        let mut r = raw(vec![
            entry(1, StackRef::RunTotal, RUN, 1000, 7),
            entry(1, StackRef::Id(1 << 63 | 1), RUN, 0, 1),
            entry(1, StackRef::Id(1 << 63 | 2), RUN, 0, 2),
            entry(1, StackRef::Id(1 << 63 | 3), RUN, 0, 3),
            entry(1, StackRef::Id(1 << 63 | 4), None, 500, 2),
        ]);
        divide(&mut r, true);
        let of = |id: u64| {
            r.entries
                .iter()
                .find(|e| e.user_stack == StackRef::Id(1 << 63 | id))
                .map(|e| (e.total_ns, e.count))
                .unwrap()
        };
        // 1000 * 1/6, 2/6, 3/6: 166.67, 333.33, 500: the one left over to
        // the largest fraction.
        assert_eq!(of(1), (167, 1));
        assert_eq!(of(2), (333, 2));
        assert_eq!(of(3), (500, 3));
        // Off-CPU time untouched.
        assert_eq!(of(4), (500, 2));
        let running: u64 = r
            .entries
            .iter()
            .filter(|e| e.state == RUN)
            .map(|e| e.total_ns)
            .sum();
        assert_eq!(running, 1000);
        assert_eq!(r.entries.len(), 4);
    }

    #[test]
    fn an_unsampled_thread_keeps_its_time() {
        let mut r = raw(vec![
            entry(1, StackRef::RunTotal, RUN, 250, 3),
            entry(2, StackRef::RunTotal, RUN, 100, 1),
            entry(2, StackRef::Id(1 << 63 | 1), RUN, 0, 4),
        ]);
        divide(&mut r, true);
        let one: Vec<_> = r.entries.iter().filter(|e| e.pid == 1).collect();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].user_stack, StackRef::NotSampled);
        assert_eq!(one[0].kernel_stack, StackRef::None);
        assert_eq!(one[0].total_ns, 250);
        assert_eq!(one[0].comm, "t1");
        assert_eq!(r.counters.oncpu_unsampled_threads, 1);
        assert_eq!(r.counters.oncpu_unsampled_ns, 250);
        let mut k = raw(vec![entry(1, StackRef::RunTotal, RUN, 250, 3)]);
        divide(&mut k, false);
        assert_eq!(k.entries[0].kernel_stack, StackRef::NotSampled);
        assert_eq!(k.entries[0].user_stack, StackRef::None);
    }

    #[test]
    fn samples_without_time_are_counted_and_left_out() {
        let mut r = raw(vec![
            entry(1, StackRef::Id(1 << 63 | 1), RUN, 0, 4),
            entry(2, StackRef::RunTotal, RUN, 100, 1),
            entry(2, StackRef::Id(1 << 63 | 1), RUN, 0, 1),
        ]);
        divide(&mut r, true);
        assert_eq!(r.counters.oncpu_orphan_samples, 4);
        assert_eq!(r.entries.len(), 1);
        assert_eq!((r.entries[0].pid, r.entries[0].total_ns), (2, 100));
    }

    #[test]
    fn intervals_and_renamed_threads_are_shared_apart() {
        let mut a = entry(1, StackRef::RunTotal, RUN, 300, 1);
        a.comm = "old".into();
        let b = entry(1, StackRef::RunTotal, RUN, 700, 1);
        let mut c = entry(1, StackRef::RunTotal, RUN, 50, 1);
        c.interval = 1;
        let s = entry(1, StackRef::Id(1 << 63 | 1), RUN, 0, 2);
        let mut s1 = entry(1, StackRef::Id(1 << 63 | 2), RUN, 0, 2);
        s1.interval = 1;
        let mut r = raw(vec![a, b, c, s, s1]);
        divide(&mut r, true);
        let at = |i: u32| {
            r.entries
                .iter()
                .filter(|e| e.interval == i)
                .map(|e| e.total_ns)
                .sum::<u64>()
        };
        assert_eq!((at(0), at(1)), (1000, 50));
        // The unsampled marker would carry the command it ran under most.
        let mut lone = raw(vec![
            {
                let mut e = entry(1, StackRef::RunTotal, RUN, 300, 1);
                e.comm = "old".into();
                e
            },
            entry(1, StackRef::RunTotal, RUN, 700, 1),
        ]);
        divide(&mut lone, true);
        assert_eq!(lone.entries[0].comm, "t1");
        assert_eq!(lone.entries[0].total_ns, 1000);
    }

    #[test]
    fn nothing_changes_without_running_entries() {
        let mut r = raw(vec![entry(1, StackRef::Id(1 << 63 | 4), None, 500, 2)]);
        divide(&mut r, true);
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.counters, Default::default());
    }
}
