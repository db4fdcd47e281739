//! `--chains`: why each block waited, down the chain. From the records of
//! every thread's blocks ([`crate::records`]), each block the filters keep
//! is followed into the thread that woke it: the part of its wait (from
//! its start to the wake-up) in which that thread was itself blocked is
//! that thread's block's, and so on to who woke it, up to `--chain-depth`
//! hops; where the waker was running, the time is its `[running]`. A wait
//! ends in a source that is no thread (an interrupt: `[timer]`, `[disk]`,
//! `[network]`, `[interrupt]`), in `[unknown]` (the wake-up was not seen)
//! or `[not woken]` (under way at the end). After a wake-up, the time
//! until the thread ran is its own (waiting for a CPU), at its stack.
//!
//! Each block's time is shared out exactly: the parts of a chain cover its
//! block with no gap and no overlap, so that a thread's lines add up to
//! its off-CPU time. A thread met again down its own chain (a cycle) is
//! not followed again: the part ends in `[cycle]`, counted. The hops are
//! a [`Waker::Chain`] of the block's sample: frames beyond its own.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use crate::profile::{Frame, OffState, Part, Sample, StackMode, WaitGraph, Waker};

mod graph;
use crate::records::{Named, Record};
use crate::shape::{MISSED_KERNEL, MISSED_USER};

/// What a chain is followed with.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The most hops after the block's own.
    pub depth: u32,
    /// `-m`, `-M` (ns): the blocks followed (the hops' are all).
    pub min_ns: u64,
    pub max_ns: u64,
    /// `-U`, `-K`: the parts of each hop's stacks shown.
    pub mode: StackMode,
    /// `--graph`: the wait-for graph too, of a window this long (ns).
    pub graph_of: Option<u64>,
    /// The window followed (CLOCK_MONOTONIC ns, [start, end)): the whole
    /// trace's, or with `-i` an interval's; blocks are cut at its edges,
    /// and a wake-up after its end is none (not woken by then).
    pub window: (u64, u64),
}

/// The chains' profile, and what was cut.
#[derive(Debug, Default)]
pub struct Chains {
    /// The blocks the filters keep, one sample for each distinct chain.
    pub samples: Vec<Sample>,
    /// Blocks followed, and the time they hold.
    pub blocks: u64,
    pub ns: u64,
    /// Time whose chain met a thread twice (cut there).
    pub cycle_ns: u64,
    /// Time whose chain went deeper than `--chain-depth` (cut there).
    pub deep_ns: u64,
    /// Time ending in a wake-up not seen.
    pub unknown_ns: u64,
    /// `--graph`.
    pub graph: Option<WaitGraph>,
    /// Blocks beyond [`MOST_BLOCKS`], neither followed nor followed into.
    pub unindexed: u64,
    /// Blocks that ended before the window (with `-i`: read after their
    /// interval was written), left out.
    pub late: u64,
}

impl Chains {
    /// Adds what `o` followed and cut to these counts (`-i`: the whole
    /// trace's, said at its end).
    pub fn add_counts(&mut self, o: &Chains) {
        self.blocks += o.blocks;
        self.ns += o.ns;
        self.cycle_ns += o.cycle_ns;
        self.deep_ns += o.deep_ns;
        self.unknown_ns += o.unknown_ns;
        self.unindexed += o.unindexed;
        self.late += o.late;
    }
}

/// The most blocks the chains hold in memory (32 bytes each: 256 MiB);
/// beyond them, blocks are counted and said, not followed (a day of a
/// busy box's trace, not a minute: 60 s of `perf bench sched pipe` on two
/// CPUs are about two million).
pub const MOST_BLOCKS: u64 = 8 << 20;

/// One block of a thread, as the chains walk it: its part in the window.
#[derive(Clone, Copy, Debug)]
struct Block {
    from: u64,
    to: u64,
    /// The wake-up, 0 where none came inside the window.
    waking: u64,
    key: u32,
    /// Not woken inside the window (under way at its end, or woken
    /// after it): its waker not followed.
    not_woken: bool,
    /// Followed: kept by the filters, and by `-m`/`-M`.
    root: bool,
    /// Sent at an interval's end, under way: the block's record sent when
    /// it ends stands for it where both came.
    cut: bool,
}

/// A step of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Hop {
    /// A thread blocked, under the stacks of this key.
    Blocked(u32),
    /// A thread running (by its tid), not sampled there.
    Running(u32),
    /// A thread running, sampled (`--on-cpu`) under the stacks of this
    /// key.
    Sampled(u32),
    /// Where the chain ends, outside any thread.
    End(End),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum End {
    Timer,
    /// A block I/O completion, of this disk where known (the kernel's
    /// `MKDEV(major, minor)`; 0 where not).
    Disk(u32),
    Network,
    Interrupt,
    Unknown,
    NotWoken,
    Cycle,
    Deeper,
}

impl End {
    fn frame(self) -> std::borrow::Cow<'static, str> {
        let name = match self {
            End::Disk(dev) if dev != 0 => return format!("[disk {}]", disk_name(dev)).into(),
            End::Timer => "[timer]",
            End::Disk(_) => "[disk]",
            End::Network => "[network]",
            End::Interrupt => "[interrupt]",
            End::Unknown => "[unknown]",
            End::NotWoken => "[not woken]",
            End::Cycle => "[cycle]",
            End::Deeper => "[deeper]",
        };
        name.into()
    }

    /// The source of a wake-up from an interrupt or a softirq, by its
    /// kernel frames (a block I/O completion's of disk `dev`, where the
    /// BPF program saw one just before on the same CPU).
    fn of_interrupt(kernel: &Part, dev: u32) -> End {
        let Part::Frames(frames) = kernel else {
            return End::Interrupt;
        };
        let any = |names: &[&str]| {
            frames
                .iter()
                .any(|f| names.iter().any(|n| f.name.starts_with(n)))
        };
        if any(&[
            "hrtimer_wakeup",
            "process_timeout",
            "call_timer_fn",
            "wake_up_process_timer",
        ]) {
            End::Timer
        } else if any(&[
            "blk_mq_end_request",
            "blk_update_request",
            "blk_mq_complete_request",
            "bio_endio",
            "end_buffer_",
            "nvme_",
            "virtblk_",
            "scsi_",
            "ata_",
        ]) {
            End::Disk(dev)
        } else if any(&[
            "net_rx_action",
            "napi_",
            "__netif_receive_skb",
            "ip_rcv",
            "ip6_rcv",
        ]) {
            End::Network
        } else {
            End::Interrupt
        }
    }
}

/// What ended the blocks of a key.
#[derive(Clone, Copy, Debug)]
enum Next {
    /// A wake-up by this thread.
    Thread(u32),
    /// No wake-up: preempted, waiting for a CPU all along.
    RunQueue,
    End(End),
}

/// The chains of the blocks in `named` that the filters keep.
pub fn follow(named: &Named, opts: Options) -> io::Result<Chains> {
    let samples = &named.profile.samples;
    let nexts: Vec<Next> = (named.keys.iter().zip(samples).zip(&named.waker_devs))
        .map(|((k, s), &dev)| next_of(k.state, s.waker.as_ref(), dev))
        .collect();
    // Each thread's blocks in time order, and the blocks followed.
    let mut threads: HashMap<u32, Vec<Block>> = HashMap::new();
    // --on-cpu: each thread's samples (when, key).
    let mut sampled: HashMap<u32, Vec<(u64, u32)>> = HashMap::new();
    let (w0, w1) = opts.window;
    let (mut held, mut unindexed, mut late) = (0u64, 0u64, 0u64);
    for r in named.read()? {
        let r: Record = r?;
        let tid = named.keys[r.key as usize].pid;
        if r.sample {
            if r.from < w0 || r.from >= w1 {
                continue;
            }
        } else if r.to <= w0 {
            late += u64::from(r.to > r.from);
            continue;
        } else if r.to <= r.from || r.from >= w1 {
            continue;
        }
        if held >= MOST_BLOCKS {
            unindexed += 1;
            continue;
        }
        held += 1;
        if r.sample {
            sampled.entry(tid).or_default().push((r.from, r.key));
            continue;
        }
        let woken_inside = r.waking != 0 && r.waking < w1;
        threads.entry(tid).or_default().push(Block {
            from: r.from.max(w0),
            to: r.to.min(w1),
            waking: if woken_inside { r.waking } else { 0 },
            key: r.key,
            not_woken: !woken_inside && (r.at_end || r.cut || r.to > w1),
            root: r.profiled && passes(&r, opts),
            cut: r.cut,
        });
    }
    // A block's record and its records at the cuts start alike: one is
    // kept, the whole one where it came.
    for blocks in threads.values_mut() {
        in_order(blocks);
    }
    let mut roots: Vec<(u32, Block)> = Vec::new();
    for (&tid, blocks) in &threads {
        roots.extend(blocks.iter().filter(|b| b.root).map(|&b| (tid, b)));
    }
    roots.sort_unstable_by_key(|&(tid, b)| (b.from, tid));
    for samples in sampled.values_mut() {
        samples.sort_unstable();
    }
    // The names of the threads met running.
    let mut comms: HashMap<u32, Arc<str>> = HashMap::new();
    for s in samples {
        if let Some(Waker::Task { comm, pid, .. }) = &s.waker {
            comms.entry(*pid).or_insert_with(|| comm.as_str().into());
        }
    }
    for (k, s) in named.keys.iter().zip(samples) {
        comms.entry(k.pid).or_insert_with(|| s.thread_name().into());
    }
    let mut walk = Walk {
        threads: &threads,
        sampled: &sampled,
        nexts: &nexts,
        depth: opts.depth,
        path: Vec::new(),
        on_path: Vec::new(),
        sums: HashMap::new(),
        out: Chains::default(),
    };
    for (tid, b) in &roots {
        walk.out.blocks += 1;
        walk.out.ns += b.to - b.from;
        walk.path.push(Hop::Blocked(b.key));
        walk.on_path.push(*tid);
        walk.block(b, b.from, b.to);
        walk.path.clear();
        walk.on_path.clear();
    }
    let sums = std::mem::take(&mut walk.sums);
    let mut out = walk.out;
    out.unindexed = unindexed;
    out.late = late;
    if let Some(window_ns) = opts.graph_of {
        out.graph = Some(graph::of(&sums, named, window_ns));
    }
    let mut frames = HopFrames {
        samples,
        comms: &comms,
        mode: opts.mode,
        named: HashMap::new(),
    };
    out.samples = sums
        .into_iter()
        .map(|(path, (ns, count))| {
            let Hop::Blocked(root) = path[0] else {
                unreachable!("a chain starts at its block")
            };
            let mut chain: Vec<Frame> = Vec::new();
            for hop in &path[1..] {
                frames.add(&mut chain, *hop);
            }
            chain.reverse();
            let s = &samples[root as usize];
            Sample {
                state: None,
                waker: Some(Waker::Chain {
                    frames: Part::Frames(chain.into()),
                }),
                total_ns: ns,
                count,
                ..s.clone()
            }
        })
        .collect();
    Ok(out)
}

/// A thread's blocks in time order, each once: a block's record sent at a
/// cut (under way) and the one sent when it ended start alike, and the
/// whole one is kept where both came.
fn in_order(blocks: &mut Vec<Block>) {
    blocks.sort_unstable_by_key(|b| (b.from, b.cut));
    blocks.dedup_by(|later, earlier| later.from == earlier.from);
}

/// Whether a block passes `-m`/`-M` as the BPF program measures them
/// (see `block_part`): one under way at the start or at the end is only
/// known to be at least as long as what was seen of it.
fn passes(r: &Record, opts: Options) -> bool {
    let seen = r.ns();
    if seen < opts.min_ns {
        return false;
    }
    if r.at_start || r.at_end {
        opts.max_ns == u64::MAX
    } else {
        seen <= opts.max_ns
    }
}

fn next_of(state: Option<OffState>, waker: Option<&Waker>, dev: u32) -> Next {
    if state == Some(OffState::RunQueue) {
        return Next::RunQueue;
    }
    match waker {
        Some(Waker::Task { pid, .. }) => Next::Thread(*pid),
        Some(Waker::Interrupt { kernel } | Waker::Softirq { kernel }) => {
            Next::End(End::of_interrupt(kernel, dev))
        }
        Some(Waker::Preempted) => Next::RunQueue,
        Some(Waker::NotWoken) => Next::End(End::NotWoken),
        _ => Next::End(End::Unknown),
    }
}

/// A walk down the chains, summing each distinct chain's time.
struct Walk<'a> {
    threads: &'a HashMap<u32, Vec<Block>>,
    sampled: &'a HashMap<u32, Vec<(u64, u32)>>,
    nexts: &'a [Next],
    depth: u32,
    /// The chain so far, and the threads on it.
    path: Vec<Hop>,
    on_path: Vec<u32>,
    sums: HashMap<Vec<Hop>, (u64, u64)>,
    out: Chains,
}

impl Walk<'_> {
    /// `ns` of the chain so far, ended by `last` where given.
    fn add(&mut self, last: Option<Hop>, ns: u64) {
        if ns == 0 {
            return;
        }
        let mut path = self.path.clone();
        path.extend(last);
        match last {
            Some(Hop::End(End::Cycle)) => self.out.cycle_ns += ns,
            Some(Hop::End(End::Deeper)) => self.out.deep_ns += ns,
            Some(Hop::End(End::Unknown)) => self.out.unknown_ns += ns,
            _ => {}
        }
        let slot = self.sums.entry(path).or_default();
        slot.0 += ns;
        slot.1 += 1;
    }

    /// The part [a, b) of block `b` (the last hop of the path): its wait
    /// until the wake-up followed into the waker, the rest its own.
    fn block(&mut self, blk: &Block, a: u64, b: u64) {
        let next = match self.nexts[blk.key as usize] {
            _ if blk.not_woken => Next::End(End::NotWoken),
            next => next,
        };
        // Waiting until the wake-up (all of it where none was seen).
        let woken = match next {
            Next::RunQueue => a,
            _ if blk.waking != 0 => blk.waking.clamp(a, b),
            _ => b,
        };
        match next {
            Next::Thread(tid) => self.waiting_for(tid, a, woken),
            Next::End(end) => self.add(Some(Hop::End(end)), woken - a),
            Next::RunQueue => {}
        }
        // Woken (or preempted): waiting for a CPU, at its own stack.
        self.add(None, b - woken);
    }

    /// [a, b) waited for thread `tid`: its blocks there, followed, and its
    /// runs between them.
    fn waiting_for(&mut self, tid: u32, a: u64, b: u64) {
        if a >= b {
            return;
        }
        if self.on_path.contains(&tid) {
            self.add(Some(Hop::End(End::Cycle)), b - a);
            return;
        }
        if self.path.len() > self.depth as usize {
            self.add(Some(Hop::End(End::Deeper)), b - a);
            return;
        }
        let threads = self.threads;
        let blocks: &[Block] = threads.get(&tid).map_or(&[], |v| v.as_slice());
        // The first block that ends after a.
        let first = blocks.partition_point(|x| x.to <= a);
        let mut at = a;
        self.on_path.push(tid);
        for blk in &blocks[first..] {
            if blk.from >= b {
                break;
            }
            let (ya, yb) = (blk.from.max(a), blk.to.min(b));
            if ya > at {
                self.running(tid, at, ya);
            }
            if yb > ya {
                self.path.push(Hop::Blocked(blk.key));
                self.block(blk, ya, yb);
                self.path.pop();
            }
            at = at.max(yb);
        }
        self.on_path.pop();
        if at < b {
            self.running(tid, at, b);
        }
    }

    /// [a, b) waited for thread `tid` running: shared evenly among its
    /// samples there (`--on-cpu`), each under its stacks; `[running]`
    /// where it has none.
    fn running(&mut self, tid: u32, a: u64, b: u64) {
        let sampled = self.sampled;
        let samples: &[(u64, u32)] = sampled.get(&tid).map_or(&[], |v| v.as_slice());
        let (lo, hi) = (
            samples.partition_point(|s| s.0 < a),
            samples.partition_point(|s| s.0 < b),
        );
        let n = (hi - lo) as u64;
        if n == 0 {
            self.add(Some(Hop::Running(tid)), b - a);
            return;
        }
        let ns = b - a;
        for (i, &(_, key)) in samples[lo..hi].iter().enumerate() {
            let share = ns / n + u64::from((i as u64) < ns % n);
            self.add(Some(Hop::Sampled(key)), share);
        }
    }
}

/// A disk's name by its number (the kernel's `MKDEV`): its block device's
/// in sysfs (`/sys/dev/block/MAJOR:MINOR` links to its directory), else
/// the numbers.
fn disk_name(dev: u32) -> String {
    let (major, minor) = (dev >> 20, dev & 0xf_ffff);
    std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|p| Some(p.file_name()?.to_str()?.to_string()))
        .filter(|n| !n.is_empty() && n.len() <= 64 && !n.contains(';'))
        .unwrap_or_else(|| format!("{major}:{minor}"))
}

/// The frames of hops, made once for each key.
struct HopFrames<'a> {
    samples: &'a [Sample],
    comms: &'a HashMap<u32, Arc<str>>,
    mode: StackMode,
    named: HashMap<Hop, Vec<Frame>>,
}

/// Between two hops (and between a block and its first).
pub const HOP_SEPARATOR: &str = "--";
/// A hop's thread running.
pub const RUNNING: &str = "[running]";

impl HopFrames<'_> {
    /// Appends `hop`'s frames, outermost first.
    fn add(&mut self, chain: &mut Vec<Frame>, hop: Hop) {
        if let Some(f) = self.named.get(&hop) {
            chain.extend(f.iter().cloned());
            return;
        }
        let mut f = Vec::new();
        match hop {
            Hop::Blocked(key) | Hop::Sampled(key) => {
                let s = &self.samples[key as usize];
                f.push(Frame::named(HOP_SEPARATOR));
                f.push(Frame::named(s.thread_name()));
                if let Hop::Sampled(_) = hop {
                    f.push(Frame::named(RUNNING));
                }
                let mut part = |p: &Part, missed: &str| match p {
                    Part::Absent => {}
                    Part::Missed => f.push(Frame::named(missed)),
                    Part::Frames(fr) => f.extend(fr.iter().rev().cloned()),
                };
                if self.mode.user() {
                    part(&s.user, MISSED_USER);
                }
                if self.mode.kernel() {
                    part(&s.kernel, MISSED_KERNEL);
                }
            }
            Hop::Running(tid) => {
                f.push(Frame::named(HOP_SEPARATOR));
                let comm = self.comms.get(&tid).map_or("?", |c| c);
                f.push(Frame::named(comm));
                f.push(Frame::named(RUNNING));
            }
            Hop::End(end) => f.push(Frame::named(end.frame().as_ref())),
        }
        chain.extend(f.iter().cloned());
        self.named.insert(hop, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(from: u64, to: u64, waking: u64, key: u32) -> Block {
        Block {
            from,
            to,
            waking,
            key,
            not_woken: false,
            root: false,
            cut: false,
        }
    }

    /// A walk from thread 1's block of key 0, five hops deep.
    fn walk_of<'a>(threads: &'a HashMap<u32, Vec<Block>>, nexts: &'a [Next]) -> Walk<'a> {
        static NONE: std::sync::OnceLock<HashMap<u32, Vec<(u64, u32)>>> =
            std::sync::OnceLock::new();
        Walk {
            threads,
            sampled: NONE.get_or_init(HashMap::new),
            nexts,
            depth: 5,
            path: vec![Hop::Blocked(0)],
            on_path: vec![1],
            sums: HashMap::new(),
            out: Chains::default(),
        }
    }

    /// A waits [0, 100) for B (woken at 90); B blocked [10, 60) woken by a
    /// timer at 50, ran [60, 90).
    #[test]
    fn a_wait_is_shared_out_down_the_chain() {
        let mut threads = HashMap::new();
        threads.insert(2, vec![blk(10, 60, 50, 1)]);
        let nexts = [Next::Thread(2), Next::End(End::Timer)];
        let mut walk = walk_of(&threads, &nexts);
        walk.block(&blk(0, 100, 90, 0), 0, 100);
        let get = |p: &[Hop]| walk.sums.get(p).map_or(0, |s| s.0);
        let (a, b) = (Hop::Blocked(0), Hop::Blocked(1));
        // B running before its block and after it, until it woke A.
        assert_eq!(get(&[a, Hop::Running(2)]), 10 + 30);
        // B's block: its sleep to the timer, then waiting for a CPU.
        assert_eq!(get(&[a, b, Hop::End(End::Timer)]), 40);
        assert_eq!(get(&[a, b]), 10);
        // A, woken, waiting for a CPU.
        assert_eq!(get(&[a]), 10);
        let total: u64 = walk.sums.values().map(|s| s.0).sum();
        assert_eq!(total, 100);
    }

    /// With --on-cpu, B's running time goes to its samples there, evenly;
    /// a run with none stays [running].
    #[test]
    fn running_time_goes_to_the_samples_in_it() {
        let mut threads = HashMap::new();
        threads.insert(2, vec![blk(10, 60, 50, 1)]);
        let nexts = [Next::Thread(2), Next::End(End::Timer)];
        let mut sampled = HashMap::new();
        // Two samples in B's run [60, 90), none in [0, 10).
        sampled.insert(2, vec![(65, 7), (80, 8)]);
        let mut walk = walk_of(&threads, &nexts);
        walk.sampled = &sampled;
        walk.block(&blk(0, 100, 90, 0), 0, 100);
        let get = |p: &[Hop]| walk.sums.get(p).map_or(0, |s| s.0);
        let a = Hop::Blocked(0);
        assert_eq!(get(&[a, Hop::Running(2)]), 10);
        assert_eq!(get(&[a, Hop::Sampled(7)]), 15);
        assert_eq!(get(&[a, Hop::Sampled(8)]), 15);
        let total: u64 = walk.sums.values().map(|s| s.0).sum();
        assert_eq!(total, 100);
    }

    /// A block under way at a cut, and the same block's whole record read
    /// before the interval was written: once, the whole one.
    #[test]
    fn a_block_sent_at_a_cut_and_whole_is_kept_once() {
        let cut = Block {
            cut: true,
            not_woken: true,
            ..blk(10, 100, 0, 3)
        };
        let whole = blk(10, 100, 95, 4);
        let mut blocks = vec![blk(100, 120, 0, 5), cut, blk(0, 5, 0, 1), whole];
        in_order(&mut blocks);
        let keys: Vec<u32> = blocks.iter().map(|b| b.key).collect();
        assert_eq!(keys, [1, 4, 5]);
    }

    #[test]
    fn cycles_and_depth_are_cut() {
        let mut threads = HashMap::new();
        // B waits for A (thread 1) over A's own wait: a cycle.
        threads.insert(2, vec![blk(0, 100, 100, 1)]);
        let nexts = [Next::Thread(2), Next::Thread(1)];
        let mut walk = walk_of(&threads, &nexts);
        walk.block(&blk(0, 100, 100, 0), 0, 100);
        assert_eq!(walk.out.cycle_ns, 100);
        let total: u64 = walk.sums.values().map(|s| s.0).sum();
        assert_eq!(total, 100);
        walk.depth = 0;
        walk.sums.clear();
        walk.block(&blk(0, 100, 100, 0), 0, 100);
        assert_eq!(walk.out.deep_ns, 100);
    }

    #[test]
    fn interrupts_are_named_by_their_frames() {
        let part = |names: &[&str]| Part::Frames(names.iter().map(|n| Frame::named(*n)).collect());
        assert_eq!(
            End::of_interrupt(
                &part(&["try_to_wake_up", "hrtimer_wakeup", "__hrtimer_run_queues"]),
                0
            ),
            End::Timer
        );
        assert_eq!(
            End::of_interrupt(
                &part(&["try_to_wake_up", "blk_mq_end_request", "virtblk_done"]),
                0
            ),
            End::Disk(0)
        );
        // A disk is named only where the frames are a completion's.
        let vda = 253 << 20;
        assert_eq!(
            End::of_interrupt(&part(&["try_to_wake_up", "bio_endio"]), vda),
            End::Disk(vda)
        );
        assert_eq!(
            End::of_interrupt(&part(&["try_to_wake_up", "hrtimer_wakeup"]), vda),
            End::Timer
        );
        assert_eq!(End::Disk(0).frame(), "[disk]");
        assert!(End::Disk(vda).frame().starts_with("[disk "));
        assert_eq!(
            End::of_interrupt(
                &part(&["try_to_wake_up", "sock_def_readable", "net_rx_action"]),
                0
            ),
            End::Network
        );
        assert_eq!(
            End::of_interrupt(&part(&["try_to_wake_up", "irq_work_run"]), 0),
            End::Interrupt
        );
    }
}
