//! User stacks walked in userspace: the first blocks of a process whose
//! unwind tables are not written yet.
//!
//! A process is new to the profiler until userspace has read its mappings
//! and written its tables (a few milliseconds after its first block). The
//! BPF program does not guess its stacks with frame pointers meanwhile: it
//! copies the stack from the stack pointer (up to `DEFERRED_STACK_BYTES`)
//! with the registers a walk starts from, and counts the block under an id
//! of its own (`STACK_ID_DEFERRED_BIT`). Once the process's tables are
//! written, [`walk`] follows the same tables by the same rules as the BPF
//! walk, over the copy, and the frames found take that id. A walk that
//! needs stack memory beyond the copy is cut there, and counted. Walked
//! stacks are stored with those the BPF program stored (see
//! [`crate::tracer::Tracer::store_stack`]), so that nothing of them stays
//! in userspace; the
//! stacks of a process that exits before its mappings could be read are
//! reported missed, and counted: never guessed.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Bytes of stack copied at most (`DEFERRED_STACK_BYTES`), from the start
/// of the stack pointer's page.
pub const COPY_BYTES: usize = std::mem::size_of::<types::deferred_stack>()
    - std::mem::offset_of!(types::deferred_stack, bytes);

/// ... so at least this many above the stack pointer, where the stack has
/// them.
pub const COPY_BYTES_ABOVE_SP: usize = COPY_BYTES - 4096;

use crate::bpf::types;
use crate::process::Proc;
use crate::raw::{AddressSpace, RawProfile, RawUserStack, StackRef};
use crate::runtime::{CopyAt, CopyStep};
use crate::unwind_table;

/// How a walk over a copy ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Return addresses, innermost first (the first is the pc).
    pub frames: Vec<u64>,
    /// Cut short: stack memory beyond the copy, a rule the unwinder
    /// cannot follow, or the depth limit.
    pub cut: bool,
    /// Frames found through frame pointers (code without tables).
    pub fp_frames: usize,
    /// ... of which in an object with tables that do not cover the code
    /// (see `CNT_UNWIND_GAP_FRAMES`).
    pub gap_frames: usize,
    /// Cut at code without tables in a process whose generated code keeps
    /// no frame pointers (a JVM's compiled Java code): not guessed.
    pub at_jit: bool,
    /// Frames a language runtime stepped over (a JVM's Java frames).
    pub runtime_frames: usize,
    /// Cut by the runtime: the walk could not go on in its code (see
    /// [`CopyStep::End`]).
    pub runtime_cut: bool,
    /// Why it was cut, where not at generated code or by the runtime.
    pub why: Option<Cut>,
}

/// Why a walk over a copy was cut (see [`Walk::why`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// A word the copy does not hold was needed: this address.
    Read(u64),
    /// A rule the walk cannot follow (its kind).
    Rule(u8),
    /// The depth limit.
    Depth,
}

impl Walk {
    fn cut(mut self, why: Cut) -> Walk {
        self.cut = true;
        self.why = Some(why);
        self
    }

    /// Whether it was cut for want of stack beyond the end of copy `s`,
    /// copied whole ([`COPY_BYTES`]): a stack deeper than the copy. (Cut
    /// at any other address, the walk needed a word outside the stack.)
    fn deeper_than(&self, s: &RawUserStack) -> bool {
        let end = s.base.saturating_add(s.bytes.len() as u64);
        matches!(self.why, Some(Cut::Read(addr)) if s.bytes.len() >= COPY_BYTES && addr >= end)
    }
}

/// A language runtime's step over the copy (see
/// [`crate::runtime::Runtime::step_copy`]): the frame at a place, given a
/// reader of the copy's words.
pub type RuntimeStep<'a> = &'a dyn Fn(CopyAt, &dyn Fn(u64) -> Option<u64>) -> CopyStep;

/// The registers a walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// rax (or only whether it is 0), for the first frame's
    /// [`unwind_table::KIND_CLONE`] rule.
    pub ax: u64,
}

/// Where a signal trampoline's ucontext holds the interrupted rbp, rsp and
/// rip, from its rsp (`UCONTEXT_*` in the BPF program).
const UCONTEXT_RBP: u64 = 0x78;
const UCONTEXT_RSP: u64 = 0xa0;
const UCONTEXT_RIP: u64 = 0xa8;

/// Reads 8 bytes of the copy `bytes` of the stack from `base`.
fn read_u64(bytes: &[u8], base: u64, addr: u64) -> Option<u64> {
    let off = usize::try_from(addr.checked_sub(base)?).ok()?;
    let b = bytes.get(off..off.checked_add(8)?)?;
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

/// The rule at an address, as `unwind_rule` in the BPF program answers.
enum Rule {
    Row(types::unwind_row),
    /// No object with tables maps it.
    Untabled,
    /// An object with tables maps it, but none of its rows covers it.
    Gap,
}

/// The row that applies at `addr` in a process with `mappings` (sorted by
/// start) into `rows`: as `unwind_rule` in the BPF program.
fn rule(mappings: &[types::unwind_mapping], rows: &[types::unwind_row], addr: u64) -> Rule {
    let Some(i) = mappings.partition_point(|m| m.start <= addr).checked_sub(1) else {
        return Rule::Untabled;
    };
    let m = &mappings[i];
    if addr >= m.end || m.row_count == 0 {
        return Rule::Untabled;
    }
    let start = m.row_start as usize;
    let row = u32::try_from(addr.wrapping_sub(m.bias))
        .ok()
        .zip(rows.get(start..start.saturating_add(m.row_count as usize)))
        .and_then(|(pc, table)| {
            let at = table.partition_point(|r| r.pc <= pc).checked_sub(1)?;
            Some(table[at]).filter(|r| r.kind != types::unwind_kind::UNWIND_NONE.0 as u8)
        });
    row.map_or(Rule::Gap, Rule::Row)
}

/// Walks the copied stack `bytes` (of the addresses from `base` on)
/// through the tables of a process, `mappings` into `rows`, by the rules
/// of the BPF program's `unwind_step`: at most `max` frames.
pub fn walk(
    regs: Regs,
    base: u64,
    bytes: &[u8],
    (mappings, rows): (&[types::unwind_mapping], &[types::unwind_row]),
    max: usize,
    guess_jit: bool,
    runtime: Option<RuntimeStep<'_>>,
) -> Walk {
    use types::unwind_kind as K;
    let Regs {
        mut pc,
        mut sp,
        mut bp,
        ax,
    } = regs;
    let mut w = Walk::default();
    let read = |addr: u64| read_u64(bytes, base, addr);
    // The frame whose pc is looked up as it is: the first, and the one a
    // signal interrupted.
    let mut exact_at = 0;
    for i in 0..max {
        w.frames.push(pc);
        // A return address is looked up at the call before it.
        let at = if i == exact_at {
            pc
        } else {
            pc.wrapping_sub(1)
        };
        let rule = rule(mappings, rows, at);
        // Code without tables: a runtime's (a JVM's Java code, V8's code
        // and its builtins, in a gap of node's tables) where the runtime
        // steps over it.
        if let (Rule::Untabled | Rule::Gap, Some(step)) = (&rule, runtime) {
            let here = CopyAt {
                pc,
                sp,
                bp,
                exact: i == exact_at,
            };
            let mut own = |word: u64| {
                *w.frames.last_mut().expect("pushed above") = word;
                w.runtime_frames += 1;
            };
            match step(here, &read) {
                CopyStep::NotMine => {}
                CopyStep::Next {
                    word,
                    pc: caller_pc,
                    sp: caller_sp,
                    bp: caller_bp,
                } => {
                    own(word);
                    if caller_pc == 0 {
                        return w;
                    }
                    (pc, sp, bp) = (caller_pc, caller_sp, caller_bp);
                    continue;
                }
                CopyStep::ByFramePointer { word } => {
                    own(word);
                    if bp == 0 {
                        return w;
                    }
                    let (saved, ra) = match fp_step(&read, bp) {
                        Ok(pair) => pair,
                        Err(why) => return w.cut(why),
                    };
                    sp = bp.wrapping_add(16);
                    bp = saved;
                    w.fp_frames += 1;
                    if ra == 0 {
                        return w;
                    }
                    pc = ra;
                    continue;
                }
                CopyStep::End { word, cut } => {
                    own(word);
                    w.cut |= cut;
                    w.runtime_cut = cut;
                    return w;
                }
            }
        }
        let ra = match rule {
            Rule::Row(r) if r.kind == unwind_table::KIND_SIGNAL => {
                // A signal trampoline: the interrupted registers are in
                // the ucontext at sp (see unwind_step).
                let (Some(rbp), Some(rsp), Some(rip)) = (
                    read(sp.wrapping_add(UCONTEXT_RBP)),
                    read(sp.wrapping_add(UCONTEXT_RSP)),
                    read(sp.wrapping_add(UCONTEXT_RIP)),
                ) else {
                    return w.cut(Cut::Read(sp.wrapping_add(UCONTEXT_RIP)));
                };
                *w.frames.last_mut().expect("pushed above") = unwind_table::SIGNAL_FRAME;
                exact_at = i + 1;
                bp = rbp;
                sp = rsp;
                rip
            }
            Rule::Row(r) => {
                let cfa = match K(r.kind as u32) {
                    K::UNWIND_END => return w,
                    // clone's child (rax 0) starts a stack; its parent
                    // goes on as before the syscall. Only at the first
                    // frame, whose rax is known (see unwind_step).
                    K::UNWIND_CLONE if i == 0 && ax == 0 => return w,
                    K::UNWIND_CLONE if i == 0 => sp.wrapping_add(r.cfa_off as u64),
                    K::UNWIND_CFA_RSP => sp.wrapping_add(r.cfa_off as u64),
                    K::UNWIND_CFA_RBP => bp.wrapping_add(r.cfa_off as u64),
                    K::UNWIND_PLT => sp.wrapping_add(8 + if pc & 15 >= 11 { 8 } else { 0 }),
                    _ => return w.cut(Cut::Rule(r.kind)),
                };
                let Some(ra) = read(cfa.wrapping_sub(8)) else {
                    return w.cut(Cut::Read(cfa.wrapping_sub(8)));
                };
                if r.rbp_off != 0 {
                    let at = cfa.wrapping_add((r.rbp_off as i64 * 8) as u64);
                    let Some(v) = read(at) else {
                        return w.cut(Cut::Read(at));
                    };
                    bp = v;
                }
                sp = cfa;
                ra
            }
            Rule::Untabled if !guess_jit => {
                w.cut = true;
                w.at_jit = true;
                return w;
            }
            none @ (Rule::Untabled | Rule::Gap) => {
                // No call-frame information: the frame pointer chain; its
                // end (bp 0) is the end of the stack. A frame beyond the
                // copy could be read by the BPF walk: cut.
                if bp == 0 {
                    return w;
                }
                let (saved, ra) = match fp_step(&read, bp) {
                    Ok(pair) => pair,
                    Err(why) => return w.cut(why),
                };
                sp = bp.wrapping_add(16);
                bp = saved;
                w.fp_frames += 1;
                if matches!(none, Rule::Gap) {
                    w.gap_frames += 1;
                }
                ra
            }
        };
        if ra == 0 {
            return w;
        }
        pc = ra;
    }
    w.cut(Cut::Depth)
}

/// The frame pointer and return address saved at frame pointer `bp`
/// (not 0), or the word the copy lacks.
fn fp_step(read: &dyn Fn(u64) -> Option<u64>, bp: u64) -> Result<(u64, u64), Cut> {
    let word = |at: u64| read(at).ok_or(Cut::Read(at));
    Ok((word(bp)?, word(bp.wrapping_add(8))?))
}

/// What became of the copied stacks, for `-v` and the notes at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredStats {
    /// Copies received.
    pub received: usize,
    /// Walked with their process's tables.
    pub walked: usize,
    /// ... of which cut short.
    pub cut: usize,
    /// ... of those, for want of stack beyond a whole copy's end (a stack
    /// deeper than the copy).
    pub cut_deeper: usize,
    /// ... at a word a copy short of its whole size does not hold (the
    /// stack's top, or a page that could not be read), or below it: a
    /// frame pointer guessed through code that keeps none, or registers
    /// or tables not of the copy's moment.
    pub cut_outside: usize,
    /// ... at a rule the walk cannot follow.
    pub cut_rule: usize,
    /// ... at the depth limit (`--perf-max-stack-depth`).
    pub cut_depth: usize,
    /// Frames found through frame pointers in those walks.
    pub fp_frames: usize,
    /// ... of which in an object with tables that do not cover the code.
    pub gap_frames: usize,
    /// Cut at generated code that keeps no frame pointers (see
    /// [`Walk::at_jit`]).
    pub at_jit: usize,
    /// Frames a language runtime stepped over (see
    /// [`Walk::runtime_frames`]), and the copies with any.
    pub runtime_frames: usize,
    pub runtime_stacks: usize,
    /// ... of which cut by the runtime (see [`Walk::runtime_cut`]).
    pub runtime_cut: usize,
    /// Never walked: their process had no tables (it exited before its
    /// mappings could be read, or they could not be made).
    pub unwalked: usize,
    /// Walked, but the table of stacks was full.
    pub unstored: usize,
    /// Let go unwalked: copies waiting took [`MAX_WAITING_BYTES`].
    pub dropped: usize,
    /// Of an address space an exec replaced before its mappings were
    /// read, in a process still there at the end (see
    /// [`Deferred::give_up`]).
    pub replaced: usize,
    /// Still waiting for their process's tables when the trace ended.
    pub unfinished: usize,
}

/// Copies kept waiting for their tables at most, in bytes: under a flood
/// of new processes' first blocks, the rest are let go (and counted), so
/// that the profiler's memory stays bounded.
pub const MAX_WAITING_BYTES: usize = 64 << 20;

/// Where a process's tables are read from (the unwinder), for
/// [`Deferred::walk_ready`].
pub trait ProcessTables {
    /// Where the mappings of process `tgid`'s tables are (start and
    /// length), if it has tables for address space `space`.
    fn slice(&self, tgid: u32, space: AddressSpace) -> Option<(usize, usize)>;
    /// Calls `f` with every row and every mapping, as written; false if
    /// they cannot be read. (Mapping the tables costs a page-table entry
    /// a page: once for all the copies walked together.)
    fn read_all(&self, f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping])) -> bool;
}

/// Whether stack id `id` is that of a copy (`STACK_ID_DEFERRED_BIT`), not
/// of a stack the BPF program stored.
pub fn is_copy(id: u64) -> bool {
    id & (1 << 63) == 0 && id & (1 << 62) != 0
}

/// The copied stacks waiting for their process's tables, and the frames of
/// those walked.
pub struct Deferred {
    max_frames: usize,
    waiting: HashMap<u32, Vec<RawUserStack>>,
    /// Bytes of stack the waiting copies hold.
    waiting_bytes: usize,
    stats: DeferredStats,
    /// For tests: each copy is walked no sooner than this after it came
    /// (as if its tables took that long), and when each came.
    stall: Option<(Duration, HashMap<u64, Instant>)>,
    /// Processes gone before the mappings of an address space of theirs
    /// could be read: no tables will be made for it (see
    /// [`Deferred::unwalkable`]).
    hopeless: HashSet<(Proc, AddressSpace)>,
    /// What the runtimes said of the moment each copy came (see
    /// [`crate::runtime::Runtime::copy_mark`]), and when it came, by its
    /// id.
    marks: HashMap<u64, (Option<u64>, Instant)>,
    /// The first copies still waiting at the end (see
    /// [`Deferred::unfinished`]).
    unfinished: Vec<(Proc, AddressSpace)>,
    /// The first walks cut at a word their stack does not hold (see
    /// [`Deferred::outside`]).
    outside: Vec<OutsideCut>,
}

/// A walk over a copy cut at a word the stack does not hold (see
/// [`DeferredStats::cut_outside`]): what it started from and where it
/// went, for `-v`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideCut {
    pub proc: Proc,
    pub space: AddressSpace,
    pub regs: Regs,
    /// Bytes copied from `base` (the stack pointer's page).
    pub base: u64,
    pub len: usize,
    /// The address of the word needed.
    pub addr: u64,
    /// The frames found before.
    pub frames: Vec<u64>,
}

/// The walks cut at a word their stack does not hold that are kept to be
/// said (`-v`).
const OUTSIDE_KEPT: usize = 3;

/// How long a copy waits at most for its runtime to be ready to step over
/// its frames (see [`crate::runtime::Runtime::copy_ready`]) once its
/// tables are: a JVM setting up its code cache.
const RUNTIME_WAIT: Duration = Duration::from_secs(2);

/// The runtimes' step over a copy of process `p`, with the mark they gave
/// it (see [`crate::runtime::Runtime::step_copy`]).
pub type RuntimeSteps<'a> =
    &'a dyn Fn(Proc, Option<u64>, CopyAt, &dyn Fn(u64) -> Option<u64>) -> CopyStep;

impl Deferred {
    /// `max_frames`: the deepest stack recorded (`--perf-max-stack-depth`).
    pub fn new(max_frames: usize) -> Deferred {
        Deferred {
            max_frames,
            waiting: HashMap::new(),
            waiting_bytes: 0,
            stats: DeferredStats::default(),
            stall: None,
            hopeless: HashSet::new(),
            marks: HashMap::new(),
            unfinished: Vec::new(),
            outside: Vec::new(),
        }
    }

    /// For tests: every copy waits at least `d` for its walk, as if its
    /// tables took that long (until [`Deferred::end_stall`]).
    pub fn stall_walks(&mut self, d: Duration) {
        self.stall = Some((d, HashMap::new()));
    }

    /// From now on, copies are walked as soon as their tables are there.
    pub fn end_stall(&mut self) {
        self.stall = None;
    }

    /// Copies came; `mark` says what the runtimes must know of this
    /// moment to step over their frames later (see
    /// [`crate::runtime::Runtime::copy_mark`]).
    pub fn add(&mut self, stacks: Vec<RawUserStack>, mark: &dyn Fn(Proc) -> Option<u64>) {
        self.stats.received += stacks.len();
        let now = Instant::now();
        for s in stacks {
            if self.hopeless.contains(&(s.proc, s.space)) {
                self.stats.unwalked += 1;
                continue;
            }
            if self.waiting_bytes + s.bytes.len() > MAX_WAITING_BYTES {
                self.stats.dropped += 1;
                continue;
            }
            if let Some((_, came)) = &mut self.stall {
                came.insert(s.id, now);
            }
            self.marks.insert(s.id, (mark(s.proc), now));
            self.waiting_bytes += s.bytes.len();
            self.waiting.entry(s.proc.tgid).or_default().push(s);
        }
    }

    /// Whether copies wait for a walk.
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The stack ids of the copies waiting for a walk.
    /// The processes with copies waiting for tables.
    pub fn waiting_tgids(&self) -> Vec<u32> {
        self.waiting.keys().copied().collect()
    }

    pub fn waiting_ids(&self) -> HashSet<u64> {
        self.waiting.values().flatten().map(|s| s.id).collect()
    }

    /// Walks the copies of every process that has tables now, and gives
    /// their frames to `store` (false: no room). `start_of` says when the
    /// process now at a pid started (a copy of an earlier process at that
    /// pid is not walked with the later one's tables).
    /// `guess_jit` says whether code without tables in process `tgid` is
    /// walked through frame pointers (false for a JVM's: cut there).
    /// `steps` are the runtimes' steps over their code; a copy of a
    /// process whose runtime is not `runtime_ready` to step over it waits
    /// (up to [`RUNTIME_WAIT`] after it came).
    pub fn walk_ready(
        &mut self,
        tables: &mut dyn ProcessTables,
        (start_of, guess_jit): (&dyn Fn(u32) -> Option<u64>, &dyn Fn(u32) -> bool),
        (steps, runtime_ready): (RuntimeSteps<'_>, &dyn Fn(Proc) -> bool),
        store: &mut dyn FnMut(u64, &[u64]) -> bool,
    ) {
        // The copies that can be walked now: of the process now at their
        // pid, with tables for their address space.
        let mut ready: Vec<(u32, AddressSpace, (usize, usize))> = Vec::new();
        let mut earlier = 0;
        for (&tgid, stacks) in &self.waiting {
            let now = start_of(tgid);
            let mut spaces: Vec<AddressSpace> = stacks
                .iter()
                .filter(|s| now.is_none_or(|t| s.proc.start == t))
                .map(|s| s.space)
                .collect();
            earlier += stacks.len() - spaces.len();
            spaces.sort_unstable_by_key(|s| (s.mm, s.exec_vm));
            spaces.dedup();
            for space in spaces {
                if let Some(slice) = tables.slice(tgid, space) {
                    ready.push((tgid, space, slice));
                }
            }
        }
        // Copies of an earlier process at a pid cannot be walked any more.
        if earlier > 0 {
            for (&tgid, stacks) in self.waiting.iter_mut() {
                if let Some(now) = start_of(tgid) {
                    let bytes: usize = stacks
                        .iter()
                        .filter(|s| s.proc.start != now)
                        .map(|s| s.bytes.len())
                        .sum();
                    stacks.retain(|s| s.proc.start == now);
                    self.waiting_bytes -= bytes;
                }
            }
            self.waiting.retain(|_, v| !v.is_empty());
            self.stats.unwalked += earlier;
            self.trim_marks();
        }
        if ready.is_empty() {
            return;
        }
        let max = self.max_frames;
        let waiting = &self.waiting;
        let marks = &self.marks;
        let now = Instant::now();
        let stalled = |id: u64| {
            self.stall.as_ref().is_some_and(|(d, came)| {
                came.get(&id)
                    .is_some_and(|&t| now.saturating_duration_since(t) < *d)
            })
        };
        let mut done: Vec<(u32, u64, Walk, bool)> = Vec::new();
        let mut outside = std::mem::take(&mut self.outside);
        tables.read_all(&mut |rows, mappings| {
            for &(tgid, space, (start, len)) in &ready {
                let Some(mappings) = mappings.get(start..start + len) else {
                    continue;
                };
                let ready = waiting[&tgid]
                    .iter()
                    .filter(|s| s.space == space && !stalled(s.id))
                    .filter(|s| {
                        runtime_ready(s.proc)
                            || marks.get(&s.id).is_none_or(|(_, came)| {
                                now.saturating_duration_since(*came) >= RUNTIME_WAIT
                            })
                    });
                let guess = guess_jit(tgid);
                for s in ready {
                    let regs = Regs {
                        pc: s.pc,
                        sp: s.sp,
                        bp: s.bp,
                        ax: s.ax,
                    };
                    let mark = marks.get(&s.id).and_then(|m| m.0);
                    let step = |at: CopyAt, read: &dyn Fn(u64) -> Option<u64>| {
                        steps(s.proc, mark, at, read)
                    };
                    let w = walk(
                        regs,
                        s.base,
                        &s.bytes,
                        (mappings, rows),
                        max,
                        guess,
                        Some(&step),
                    );
                    let deeper = w.deeper_than(s);
                    if let (Some(Cut::Read(addr)), false) = (w.why, deeper) {
                        if outside.len() < OUTSIDE_KEPT {
                            outside.push(OutsideCut {
                                proc: s.proc,
                                space: s.space,
                                regs,
                                base: s.base,
                                len: s.bytes.len(),
                                addr,
                                frames: w.frames.clone(),
                            });
                        }
                    }
                    done.push((tgid, s.id, w, deeper));
                }
            }
        });
        let mut walked = std::collections::HashSet::new();
        self.outside = outside;
        for (tgid, id, w, deeper) in done {
            self.stats.walked += 1;
            self.stats.cut += usize::from(w.cut);
            match w.why {
                Some(Cut::Read(_)) if deeper => self.stats.cut_deeper += 1,
                Some(Cut::Read(_)) => self.stats.cut_outside += 1,
                Some(Cut::Rule(_)) => self.stats.cut_rule += 1,
                Some(Cut::Depth) => self.stats.cut_depth += 1,
                None => {}
            }
            self.stats.fp_frames += w.fp_frames;
            self.stats.gap_frames += w.gap_frames;
            self.stats.at_jit += usize::from(w.at_jit);
            self.stats.runtime_frames += w.runtime_frames;
            self.stats.runtime_stacks += usize::from(w.runtime_frames > 0);
            self.stats.runtime_cut += usize::from(w.runtime_cut);
            self.marks.remove(&id);
            if !store(id, &w.frames) {
                self.stats.unstored += 1;
            }
            walked.insert((tgid, id));
        }
        for (&tgid, stacks) in self.waiting.iter_mut() {
            let bytes: usize = stacks
                .iter()
                .filter(|s| walked.contains(&(tgid, s.id)))
                .map(|s| s.bytes.len())
                .sum();
            stacks.retain(|s| !walked.contains(&(tgid, s.id)));
            self.waiting_bytes -= bytes;
        }
        self.waiting.retain(|_, v| !v.is_empty());
        self.trim_marks();
        if self.stall.is_some() {
            let left = self.waiting_ids();
            if let Some((_, came)) = &mut self.stall {
                came.retain(|id, _| left.contains(id));
            }
        }
    }

    /// Process `p` was gone before its mappings of address space `space`
    /// could be read, and no tables were made for them: its copies of that
    /// space (those waiting, and those still to come) are given up now
    /// rather than when it is let go, seconds later (an interval waits for
    /// them, see [`crate::intervals::Held`]).
    pub fn unwalkable(&mut self, p: Proc, space: AddressSpace) {
        self.hopeless.insert((p, space));
        if let Some(v) = self.waiting.get_mut(&p.tgid) {
            let mine = |s: &RawUserStack| s.proc == p && s.space == space;
            let bytes: usize = v.iter().filter(|s| mine(s)).map(|s| s.bytes.len()).sum();
            let before = v.len();
            v.retain(|s| !mine(s));
            self.waiting_bytes -= bytes;
            self.stats.unwalked += before - v.len();
            if v.is_empty() {
                self.waiting.remove(&p.tgid);
            }
        }
        self.trim_marks();
    }

    /// Process `p` is gone, and so are its tables: its copies that were
    /// not walked never will be.
    pub fn forget(&mut self, p: Proc) {
        self.hopeless.retain(|(q, _)| *q != p);
        if let Some(v) = self.waiting.get_mut(&p.tgid) {
            let before = v.len();
            let bytes: usize = v
                .iter()
                .filter(|s| s.proc == p)
                .map(|s| s.bytes.len())
                .sum();
            v.retain(|s| s.proc != p);
            self.waiting_bytes -= bytes;
            self.stats.unwalked += before - v.len();
            if v.is_empty() {
                self.waiting.remove(&p.tgid);
            }
        }
        self.trim_marks();
    }

    /// The copied stacks `raw` counts that were not walked (and stored)
    /// are missed: counted when given up, and shown as such.
    pub fn complete(raw: &mut RawProfile) {
        let fix = |r: &mut StackRef, stacks: &crate::raw::Stacks| {
            if let StackRef::Id(id) = *r {
                if is_copy(id) && !stacks.contains_key(&id) {
                    *r = StackRef::NotWalked;
                }
            }
        };
        for e in &mut raw.entries {
            fix(&mut e.user_stack, &raw.stacks);
        }
        for w in raw.wakers.values_mut() {
            fix(&mut w.user_stack, &raw.stacks);
        }
    }

    /// Gives up on every copy still waiting (the end of the trace): those
    /// of processes `gone` (exited, or exiting, before their mappings could
    /// be read: their exits not handled yet) are counted as such, those of
    /// an address space an exec `replaced` in a process still there (its
    /// mappings never read: the process's last event said another) as
    /// such, the others as still waiting for their tables.
    pub fn give_up(
        &mut self,
        gone: &dyn Fn(Proc) -> bool,
        replaced: &dyn Fn(Proc, AddressSpace) -> bool,
    ) {
        for s in self.waiting.values().flatten() {
            if gone(s.proc) {
                self.stats.unwalked += 1;
            } else if replaced(s.proc, s.space) {
                self.stats.replaced += 1;
            } else {
                self.stats.unfinished += 1;
                if self.unfinished.len() < UNFINISHED_KEPT {
                    self.unfinished.push((s.proc, s.space));
                }
            }
        }
        self.waiting.clear();
        self.waiting_bytes = 0;
        self.hopeless.clear();
        self.marks.clear();
    }

    /// Lets go of the marks of copies no longer waiting (walked, given up
    /// or dropped).
    fn trim_marks(&mut self) {
        if self.marks.len() > self.waiting.values().map(Vec::len).sum() {
            let left = self.waiting_ids();
            self.marks.retain(|id, _| left.contains(id));
        }
    }

    pub fn stats(&self) -> DeferredStats {
        self.stats
    }

    /// The process and address space of the first copies still waiting
    /// for their tables when the trace ended ([`UNFINISHED_KEPT`]).
    pub fn unfinished(&self) -> &[(Proc, AddressSpace)] {
        &self.unfinished
    }

    /// The first walks cut at a word their stack does not hold
    /// ([`OUTSIDE_KEPT`]).
    pub fn outside(&self) -> &[OutsideCut] {
        &self.outside
    }
}

/// The copies still waiting at the end whose process and address space
/// are kept to be said (`-v`).
const UNFINISHED_KEPT: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use types::unwind_kind as K;

    /// A copy the counts name and that was never walked is lost as one
    /// not walked; a stored stack, and a copy walked, stay.
    #[test]
    fn copies_not_walked_are_said_as_such() {
        let copy = 1u64 << 62 | 7;
        let walked = 1u64 << 62 | 8;
        let entry = |user| crate::raw::RawEntry {
            tgid: 1,
            start: 1,
            pid: 1,
            comm: "t".into(),
            user_stack: user,
            kernel_stack: StackRef::None,
            state: None,
            waker: None,
            interval: 0,
            span: 1,
            total_ns: 1,
            count: 1,
        };
        let mut raw = RawProfile {
            entries: vec![
                entry(StackRef::Id(copy)),
                entry(StackRef::Id(walked)),
                entry(StackRef::Id(1 << 63 | 9)),
            ],
            ..Default::default()
        };
        raw.stacks.insert(walked, &[0x1000]);
        Deferred::complete(&mut raw);
        let refs: Vec<StackRef> = raw.entries.iter().map(|e| e.user_stack).collect();
        assert_eq!(
            refs,
            [
                StackRef::NotWalked,
                StackRef::Id(walked),
                StackRef::Id(1 << 63 | 9)
            ]
        );
    }

    fn row(pc: u32, kind: K, cfa_off: u16, rbp_off: i8) -> types::unwind_row {
        types::unwind_row {
            pc,
            cfa_off,
            kind: kind.0 as u8,
            rbp_off,
        }
    }

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    /// An object mapped at 0x40_0000 (bias 0x40_0000): `leaf` at 0x1000
    /// (CFA = rsp + 16, rbp not saved), `mid` at 0x2000 (CFA = rbp + 16,
    /// rbp saved at CFA - 16), `outer` at 0x3000 (return address
    /// undefined).
    fn tables() -> (Vec<types::unwind_mapping>, Vec<types::unwind_row>) {
        let rows = vec![
            row(0x1000, K::UNWIND_CFA_RSP, 16, 0),
            row(0x1100, K::UNWIND_NONE, 0, 0),
            row(0x2000, K::UNWIND_CFA_RBP, 16, -2),
            row(0x2100, K::UNWIND_NONE, 0, 0),
            row(0x3000, K::UNWIND_END, 0, 0),
            row(0x3100, K::UNWIND_NONE, 0, 0),
        ];
        let maps = vec![types::unwind_mapping {
            start: 0x40_1000,
            end: 0x40_4000,
            bias: 0x40_0000,
            row_start: 0,
            row_count: rows.len() as u32,
        }];
        (maps, rows)
    }

    /// A walk of `words` of stack from sp 0x7fff_0000, in `leaf` (bp at sp
    /// + 24).
    fn walk_from_leaf(words: &[u64]) -> Walk {
        let (maps, rows) = tables();
        let sp = 0x7fff_0000u64;
        let regs = Regs {
            pc: 0x40_1010,
            sp,
            bp: sp + 24,
            ax: 0,
        };
        walk(regs, sp, &stack(words), (&maps, &rows), 127, true, None)
    }

    #[test]
    fn walks_a_copy_as_the_bpf_program_does() {
        // leaf's frame: 8 bytes of locals, then the return into mid.
        // mid's frame (bp = sp + 24): saved rbp, return into outer.
        let w = walk_from_leaf(&[0, 0x40_2050, 0, 0x7fff_1000, 0x40_3010]);
        assert_eq!(w.frames, vec![0x40_1010, 0x40_2050, 0x40_3010]);
        assert!(!w.cut);
        assert_eq!(w.fp_frames, 0);
    }

    #[test]
    fn a_walk_past_the_copy_is_cut() {
        // The copy ends before mid's return address.
        let w = walk_from_leaf(&[0, 0x40_2050, 0]);
        assert_eq!(w.frames, vec![0x40_1010, 0x40_2050]);
        assert!(w.cut);
        // The word needed: mid's return address, beyond the copy's 24
        // bytes. A copy that short reached the stack's top: the walk
        // needed a word outside the stack, not a deeper copy.
        assert!(
            matches!(w.why, Some(Cut::Read(a)) if a >= 0x7fff_0000 + 24),
            "{w:?}"
        );
        let short = RawUserStack {
            base: 0x7fff_0000,
            bytes: vec![0; 24],
            ..copy(1, 1, 1, 1)
        };
        assert!(!w.deeper_than(&short));
        // A whole copy: the stack went on beyond it.
        let whole = RawUserStack {
            bytes: vec![0; COPY_BYTES],
            ..short.clone()
        };
        assert!(!w.deeper_than(&whole));
        let beyond = Walk {
            why: Some(Cut::Read(0x7fff_0000 + COPY_BYTES as u64)),
            ..w.clone()
        };
        assert!(beyond.deeper_than(&whole) && !beyond.deeper_than(&short));
    }

    #[test]
    fn frame_pointers_where_there_are_no_tables_and_the_depth_limit() {
        let (maps, rows) = tables();
        let sp = 0x7fff_0000u64;
        // Code outside every mapping: bp chain sp -> sp+16 -> 0.
        let copy = stack(&[sp + 16, 0x50_0000, 0, 0x50_0100]);
        let regs = Regs {
            pc: 0x60_0000,
            sp,
            bp: sp,
            ax: 0,
        };
        let w = walk(regs, sp, &copy, (&maps, &rows), 127, true, None);
        assert_eq!(w.frames, vec![0x60_0000, 0x50_0000, 0x50_0100]);
        assert_eq!((w.fp_frames, w.gap_frames), (2, 0));
        assert!(!w.cut);
        // Code of the mapped object that its rows do not cover (0x1100 to
        // 0x2000): the same chain, counted as a guess in a gap.
        let in_gap = Regs {
            pc: 0x40_1200,
            ..regs
        };
        let w = walk(in_gap, sp, &copy, (&maps, &rows), 127, true, None);
        assert_eq!(w.frames, vec![0x40_1200, 0x50_0000, 0x50_0100]);
        assert_eq!((w.fp_frames, w.gap_frames), (2, 1));
        let w = walk(regs, sp, &copy, (&maps, &rows), 2, true, None);
        assert_eq!(w.frames, vec![0x60_0000, 0x50_0000]);
        assert!(w.cut);
        assert_eq!(w.why, Some(Cut::Depth));
        // In a process whose generated code keeps no frame pointers (a
        // JVM's): cut at the code without tables, not guessed; a gap in a
        // mapped object's rows is still walked by its frame pointers.
        let w = walk(regs, sp, &copy, (&maps, &rows), 127, false, None);
        assert_eq!(w.frames, vec![0x60_0000]);
        assert!(w.cut && w.at_jit);
        let w = walk(in_gap, sp, &copy, (&maps, &rows), 127, false, None);
        assert_eq!(w.frames, vec![0x40_1200, 0x50_0000]);
        assert!(w.cut && w.at_jit);
    }

    #[test]
    fn through_a_signal_frame() {
        let (mut maps, mut rows) = tables();
        // A trampoline at 0x4000 and code at 0x5000 (CFA = rsp + 8).
        let base = rows.len() as u32;
        rows.extend([
            row(0x4000, K::UNWIND_NONE, 0, 0),
            row(0x5000, K::UNWIND_CFA_RSP, 8, 0),
            row(0x5100, K::UNWIND_NONE, 0, 0),
        ]);
        rows[base as usize].kind = unwind_table::KIND_SIGNAL;
        maps.push(types::unwind_mapping {
            start: 0x40_4000,
            end: 0x40_6000,
            bias: 0x40_0000,
            row_start: base,
            row_count: 3,
        });
        let sp = 0x7fff_0000u64;
        let mut words = vec![0u64; 0x100 / 8];
        // The ucontext at sp: rbp, rsp, rip of the interrupted code, whose
        // frame (at sp + 0xc0) returns into outer.
        words[0x78 / 8] = 0x1234;
        words[0xa0 / 8] = sp + 0xc0;
        words[0xa8 / 8] = 0x40_5000; // at a function's first byte
        words[0xc0 / 8] = 0x40_3010;
        let w = walk(
            Regs {
                pc: 0x40_4000,
                sp,
                bp: 0,
                ax: 0,
            },
            sp,
            &stack(&words),
            (&maps, &rows),
            127,
            true,
            None,
        );
        // 0x40_5000 is looked up as it is (at pc - 1 it would be in no
        // row: frame pointers, bp 0x1234 outside the copy, cut).
        assert_eq!(
            w.frames,
            vec![unwind_table::SIGNAL_FRAME, 0x40_5000, 0x40_3010]
        );
        assert!(!w.cut);
    }

    #[test]
    fn after_a_clone_syscall_by_rax() {
        let (mut maps, mut rows) = tables();
        // clone at 0x7000: CFA = rsp + 8 up to its syscall's tail at
        // 0x7010, the child's code from 0x701a.
        let base = rows.len() as u32;
        rows.extend([
            row(0x7000, K::UNWIND_CFA_RSP, 8, 0),
            row(0x7010, K::UNWIND_CLONE, 8, 0),
            row(0x701a, K::UNWIND_END, 0, 0),
            row(0x7040, K::UNWIND_NONE, 0, 0),
        ]);
        maps.push(types::unwind_mapping {
            start: 0x40_7000,
            end: 0x40_8000,
            bias: 0x40_0000,
            row_start: base,
            row_count: 4,
        });
        let sp = 0x7fff_0000u64;
        // The parent's return into outer is at sp.
        let copy = stack(&[0x40_3010]);
        let at = |pc, ax| Regs { pc, sp, bp: 0, ax };
        // The parent (rax: the child's pid, or -ENOSYS while in the
        // syscall) goes on to its caller; the child's stack ends there.
        for ax in [1234, -38i64 as u64] {
            let w = walk(
                at(0x40_7012, ax),
                sp,
                &copy,
                (&maps, &rows),
                127,
                true,
                None,
            );
            assert_eq!(w.frames, vec![0x40_7012, 0x40_3010], "rax {ax}");
            assert!(!w.cut);
        }
        let w = walk(at(0x40_7012, 0), sp, &copy, (&maps, &rows), 127, true, None);
        assert_eq!(w.frames, vec![0x40_7012]);
        assert!(!w.cut);
        // Never a return address: a walk that meets it as one is cut.
        let copy = stack(&[0, 0x40_7013]);
        let w = walk(at(0x40_1010, 1), sp, &copy, (&maps, &rows), 127, true, None);
        assert_eq!(w.frames, vec![0x40_1010, 0x40_7013]);
        assert!(w.cut);
    }

    fn copy(id: u64, tgid: u32, start: u64, mm: u64) -> RawUserStack {
        RawUserStack {
            id,
            proc: Proc { tgid, start },
            tid: tgid,
            space: AddressSpace { mm, exec_vm: 1 },
            pc: 0,
            sp: 0,
            bp: 0,
            ax: 0,
            base: 0,
            bytes: vec![0; 64],
        }
    }

    #[test]
    fn copies_of_a_space_whose_tables_never_come_are_given_up() {
        let mut d = Deferred::new(127);
        let p = Proc { tgid: 7, start: 1 };
        let space = AddressSpace { mm: 1, exec_vm: 1 };
        d.add(
            vec![copy(1, 7, 1, 1), copy(2, 7, 1, 2), copy(3, 8, 1, 1)],
            &|_| None,
        );
        d.unwalkable(p, space);
        assert_eq!(d.waiting_ids(), HashSet::from([2, 3]));
        // One to come is given up as it comes.
        d.add(vec![copy(4, 7, 1, 1)], &|_| None);
        assert_eq!(d.waiting_ids(), HashSet::from([2, 3]));
        assert_eq!(d.stats().unwalked, 2);
        assert_eq!(d.waiting_bytes, 128);
        // Let go: nothing is remembered of it.
        d.forget(p);
        assert_eq!(d.waiting_ids(), HashSet::from([3]));
        assert!(d.hopeless.is_empty());
        // The end of the trace: what still waits is counted apart.
        d.add(vec![copy(5, 9, 1, 1)], &|_| None);
        d.add(vec![copy(6, 7, 1, 2)], &|_| None);
        // Process 7's last event said address space 3: its copy of 2 was
        // of an image an exec replaced.
        d.give_up(&|p| p.tgid == 9, &|p, s| p.tgid == 7 && s.mm != 3);
        assert_eq!((d.stats().unwalked, d.stats().unfinished), (4, 1));
        assert_eq!(d.stats().replaced, 1);
        assert!(d.waiting_ids().is_empty());
    }

    #[test]
    fn the_record_layout_is_the_bpf_programs() {
        let mut data = vec![0u8; std::mem::offset_of!(types::deferred_stack, bytes) + 16];
        let put = |d: &mut Vec<u8>, off: usize, v: &[u8]| d[off..off + v.len()].copy_from_slice(v);
        use std::mem::offset_of;
        use types::deferred_stack as D;
        put(&mut data, offset_of!(D, id), &(3u64 << 62).to_ne_bytes());
        put(&mut data, offset_of!(D, tgid), &42u32.to_ne_bytes());
        put(&mut data, offset_of!(D, pid), &43u32.to_ne_bytes());
        put(&mut data, offset_of!(D, pc), &0x1234u64.to_ne_bytes());
        put(&mut data, offset_of!(D, sp), &0x5678u64.to_ne_bytes());
        put(&mut data, offset_of!(D, bp), &0x9abcu64.to_ne_bytes());
        put(&mut data, offset_of!(D, ax), &0xdef0u64.to_ne_bytes());
        put(&mut data, offset_of!(D, len), &16u32.to_ne_bytes());
        let s = RawUserStack::parse(&data).expect("a whole record");
        assert_eq!((s.id, s.proc.tgid, s.tid), (3 << 62, 42, 43));
        assert_eq!(
            (s.pc, s.sp, s.bp, s.ax, s.bytes.len()),
            (0x1234, 0x5678, 0x9abc, 0xdef0, 16)
        );
        // A length past the record is refused.
        put(&mut data, offset_of!(D, len), &17u32.to_ne_bytes());
        assert!(RawUserStack::parse(&data).is_none());
    }
}
