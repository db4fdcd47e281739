//! What the kernel side reports, as plain data: the records read back
//! from the BPF program (count entries, stack references, wakers, loss
//! counters, task events, copied user stacks) and the identities they
//! carry (processes, address spaces). It depends on nothing in the crate
//! but the types generated from `offcputime.h`, so that every stage can
//! use it: the tracer fills it, the unwinder, the registry and the profile
//! builder read it.

use std::collections::HashMap;

use crate::bpf::types;

/// A process: its pid and its start time, in clock ticks since boot (as
/// `/proc/PID/stat` gives it, field 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Proc {
    pub tgid: u32,
    pub start: u64,
}

/// A stack reference as stored in a count entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackRef {
    /// Not collected, or empty (a kernel thread's user stack).
    None,
    /// Lost: the stacks map was full.
    MissedFull,
    /// Lost: the kernel could not walk the stack.
    MissedError,
    /// Lost: a user stack copied for userspace to walk that was not
    /// walked (its process's tables never came, or it was given up).
    NotWalked,
    /// Lost: a kernel stack to be taken at the block's switch-in, which
    /// the kernel did not report.
    NoSwitchIn,
    /// The user stack of a thread blocked since before tracing started,
    /// which this kernel cannot read from BPF.
    NotReadable,
    /// `--on-cpu`: not a stack, a thread's exact running time, which
    /// [`crate::oncpu::divide`] shares out between its sampled stacks.
    RunTotal,
    /// `--on-cpu`: running time of a thread that no sample caught.
    NotSampled,
    /// Frames in `RawProfile::stacks`.
    Id(u64),
}

impl StackRef {
    pub(crate) fn from_raw(id: u64) -> StackRef {
        use types::stack_id_special as S;
        // A stored stack (its hash), or one copied for userspace to walk
        // (see crate::deferred).
        if id >= 1 << 62 {
            StackRef::Id(id)
        } else if id == S::STACK_ID_NONE.0 as u64 {
            StackRef::None
        } else if id == S::STACK_ID_MISSED_FULL.0 as u64 {
            StackRef::MissedFull
        } else if id == S::STACK_ID_NOT_READABLE.0 as u64 {
            StackRef::NotReadable
        } else if id == S::STACK_ID_RUN_TOTAL.0 as u64 {
            StackRef::RunTotal
        } else if id == S::STACK_ID_SWITCH_IN_UNSEEN.0 as u64 {
            StackRef::NoSwitchIn
        } else {
            StackRef::MissedError
        }
    }
}

/// One aggregated entry of the `counts` map.
#[derive(Clone, Debug)]
pub struct RawEntry {
    pub tgid: u32,
    /// When the process started (see [`Proc`]).
    pub start: u64,
    pub pid: u32,
    pub comm: String,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    /// Why the thread was off the CPU (`--states`), None without it.
    pub state: Option<OffState>,
    /// Who ended the block (`--wakers`), None without it.
    pub waker: Option<WakerRef>,
    /// `-i`: the interval of this time, the first of `span` whole
    /// intervals when `span` > 1 (the time is then `span` intervals' length
    /// per block); 0 and 1 without `-i`.
    pub interval: u32,
    pub span: u32,
    pub total_ns: u64,
    pub count: u64,
}

/// Who ended a block (`--wakers`), as stored in a count entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WakerRef {
    /// No wake-up: the thread was preempted.
    Preempted,
    /// Not woken: still blocked when tracing ended.
    NotWoken,
    /// The wake-up was not seen (it came before tracing started).
    Unseen,
    /// Lost: the wakers table was full.
    MissedFull,
    /// A task: [`RawProfile::wakers`] under this id.
    Id(u64),
}

impl WakerRef {
    pub(crate) fn from_raw(id: u64) -> Option<WakerRef> {
        use types::waker_id_special as W;
        Some(match id {
            id if id >= 1 << 63 => WakerRef::Id(id),
            id if id == W::WAKER_ID_PREEMPTED.0 as u64 => WakerRef::Preempted,
            id if id == W::WAKER_ID_NOT_WOKEN.0 as u64 => WakerRef::NotWoken,
            id if id == W::WAKER_ID_UNSEEN.0 as u64 => WakerRef::Unseen,
            id if id == W::WAKER_ID_MISSED_FULL.0 as u64 => WakerRef::MissedFull,
            _ => return None,
        })
    }
}

/// The task that woke a block, and its stacks at the wake-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawWaker {
    pub tgid: u32,
    /// When its process started (see [`Proc`]).
    pub start: u64,
    pub pid: u32,
    pub comm: String,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    /// A wake-up from an interrupt, with `--chains`: the disk whose request
    /// completed just before on its CPU (the kernel's `MKDEV`), or 0.
    pub dev: u32,
}

/// `--timeline`: one block as the BPF program sent it when it ended (`struct
/// block_record`), its part inside the window; or with `--on-cpu`, one
/// sample of a thread on a CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawBlock {
    pub tgid: u32,
    /// When its process started (see [`Proc`]).
    pub start: u64,
    pub pid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC ns: [from, to).
    pub from_ns: u64,
    pub to_ns: u64,
    /// When the wake-up that ended it began, where one was seen.
    pub waking_ns: Option<u64>,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    /// The state it blocked in.
    pub state: Option<OffState>,
    /// Who ended it (None for a sample).
    pub waker: Option<WakerRef>,
    /// Under way when the window started (`from_ns` is its start), and
    /// still under way when it ended (`to_ns` is its end).
    pub at_start: bool,
    pub at_end: bool,
    /// `--on-cpu`: not a block, a sample of the thread running at
    /// `from_ns` (state [`OffState::Running`]).
    pub sample: bool,
    /// Kept by the filters: `--chains` records every thread's blocks, to
    /// follow waits into them; the profile is made of the kept ones.
    pub profiled: bool,
    /// `--chains` with `-i`: a block under way at an interval's end
    /// (`to_ns`), sent again whole when it ends.
    pub cut: bool,
}

/// Why a thread was off the CPU (`--states`): the kernel's `enum
/// offcpu_state`; or that it was on one (`--on-cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OffState {
    /// Interruptible sleep, until the wake-up.
    Sleep,
    /// Uninterruptible sleep waiting for I/O, until the wake-up.
    Io,
    /// Other uninterruptible sleep, until the wake-up.
    Blocked,
    /// Runnable without a CPU: preempted, or woken and not yet running.
    RunQueue,
    /// Stopped by a signal or a tracer.
    Stopped,
    /// Not off the CPU: running (`--on-cpu`).
    Running,
}

impl OffState {
    pub(crate) fn from_raw(state: u32) -> Option<OffState> {
        use types::offcpu_state as S;
        Some(match state {
            s if s == S::OFFCPU_STATE_SLEEP.0 => OffState::Sleep,
            s if s == S::OFFCPU_STATE_IO.0 => OffState::Io,
            s if s == S::OFFCPU_STATE_BLOCKED.0 => OffState::Blocked,
            s if s == S::OFFCPU_STATE_RUNQUEUE.0 => OffState::RunQueue,
            s if s == S::OFFCPU_STATE_STOPPED.0 => OffState::Stopped,
            s if s == S::OFFCPU_STATE_RUNNING.0 => OffState::Running,
            _ => return None,
        })
    }

    /// The name shown as a frame: `[sleep]`, `[io]`, ...
    pub fn frame(self) -> &'static str {
        match self {
            OffState::Sleep => "[sleep]",
            OffState::Io => "[io]",
            OffState::Blocked => "[blocked]",
            OffState::RunQueue => "[runqueue]",
            OffState::Stopped => "[stopped]",
            OffState::Running => "[running]",
        }
    }

    /// The state named by a frame of [`OffState::frame`].
    pub fn from_frame(frame: &str) -> Option<OffState> {
        [
            OffState::Sleep,
            OffState::Io,
            OffState::Blocked,
            OffState::RunQueue,
            OffState::Stopped,
            OffState::Running,
        ]
        .into_iter()
        .find(|s| s.frame() == frame)
    }
}

/// Why data was lost or is incomplete, and what was done instead: the
/// BPF program's counters (`enum offcpu_counter` in `offcputime.h`), each
/// named here once, beside its field, and userspace's own.
macro_rules! loss_counters {
    (
        kernel { $( $(#[$kdoc:meta])* $kfield:ident = $counter:ident, )* }
        user { $( $(#[$udoc:meta])* $ufield:ident, )* }
    ) => {
        /// Why data was lost or is incomplete, as counted in the kernel
        /// (and, for `--on-cpu`'s division, in userspace).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct LossCounters {
            $( $(#[$kdoc])* pub $kfield: u64, )*
            $( $(#[$udoc])* pub $ufield: u64, )*
        }

        impl LossCounters {
            /// The BPF program's counters, by the names of `enum
            /// offcpu_counter`, in the order of the fields.
            pub const KERNEL: &'static [(&'static str, u32)] =
                &[ $( (stringify!($counter), crate::bpf::types::offcpu_counter::$counter.0 as u32), )* ];

            /// The counters from the program's sums, indexed by `enum
            /// offcpu_counter` (a counter past the end of `sums` is 0).
            pub fn from_kernel(sums: &[u64]) -> LossCounters {
                let at = |c: crate::bpf::types::offcpu_counter| sums.get(c.0 as usize).copied().unwrap_or(0);
                LossCounters {
                    $( $kfield: at(crate::bpf::types::offcpu_counter::$counter), )*
                    ..LossCounters::default()
                }
            }
        }
    };
}

loss_counters! {
    kernel {
        user_stack_full = CNT_USTACK_FULL,
        kernel_stack_full = CNT_KSTACK_FULL,
        user_stack_error = CNT_USTACK_ERROR,
        kernel_stack_error = CNT_KSTACK_ERROR,
        kernel_thread_blocks = CNT_KTHREAD_BLOCKS,
        counts_full = CNT_COUNTS_FULL,
        no_task_storage = CNT_NO_TASK_STORAGE,
        events_dropped = CNT_EVENTS_DROPPED,
        blocks_at_end = CNT_BLOCKS_AT_END,
        /// Blocks under way when tracing started, counted from the start.
        blocks_at_start = CNT_BLOCKS_AT_START,
        /// Switches to a thread that the sched_switch tracepoint did not
        /// report, found at its next switch-out.
        unseen_switch_in = CNT_UNSEEN_SWITCH_IN,
        /// ... of which the block could not be timed (not a CFS thread).
        unseen_untimed = CNT_UNSEEN_UNTIMED,
        /// `--unwind dwarf`: user stacks walked with frame pointers because
        /// their process had no tables yet.
        unwind_not_ready = CNT_UNWIND_NOT_READY,
        /// User stacks walked with the tables.
        unwind_dwarf = CNT_UNWIND_DWARF,
        /// ... of which cut short.
        unwind_truncated = CNT_UNWIND_TRUNCATED,
        /// Frames found through frame pointers in stacks walked with tables.
        unwind_fp_frames = CNT_UNWIND_FP_FRAMES,
        /// ... of which at an address of an object with call-frame
        /// information that none covers: a guess where that code keeps no
        /// frame pointers.
        unwind_gap_frames = CNT_UNWIND_GAP_FRAMES,
        /// ... of which proved the same as one of the thread's last walks,
        /// not walked again.
        unwind_cached = CNT_UNWIND_CACHED,
        /// `--states`: wake-ups that split a block.
        wakeups = CNT_WAKEUPS,
        /// `--wakers`: wakers recorded, and lost for a full table.
        wakers = CNT_WAKERS,
        wakers_full = CNT_WAKERS_FULL,
        /// `--states`: blocks that ended with no wake-up seen.
        unwoken = CNT_UNWOKEN,
        /// `--states`, `--state`: blocks whose state was taken as a sleep
        /// (a wake-up was under way as they began, and the hook does not pass
        /// the state).
        state_guessed = CNT_STATE_GUESSED,
        /// `--sample`: blocks shorter than the threshold taken (weighted),
        /// and left out.
        sampled_short = CNT_SAMPLED_SHORT,
        sampled_out = CNT_SAMPLED_OUT,
        /// `--unwind dwarf`: new processes given their parent's tables at the
        /// fork.
        unwind_forked = CNT_UNWIND_FORKED,
        /// User stacks of processes without tables of their own walked
        /// through the tables of the files they map.
        unwind_by_file = CNT_UNWIND_BY_FILE,
        /// User stacks of processes without tables yet copied for userspace to
        /// walk, and lost for want of room in the ring buffer (or in
        /// userspace's queue).
        unwind_deferred = CNT_UNWIND_DEFERRED,
        unwind_defer_lost = CNT_UNWIND_DEFER_LOST,
        /// User stacks of CPython processes given their Python frames, and
        /// the frames.
        py_stacks = CNT_PY_STACKS,
        py_frames = CNT_PY_FRAMES,
        /// ... of threads whose own thread state was not found (native
        /// frames only).
        py_no_thread_state = CNT_PY_NO_THREAD_STATE,
        /// Python frames that could not be read; walks cut for room.
        py_unreadable = CNT_PY_UNREADABLE,
        py_truncated = CNT_PY_TRUNCATED,
        /// Notices of code objects lost for a full ring buffer (named later
        /// from the process, if it still runs).
        py_events_lost = CNT_PY_EVENTS_LOST,
        /// Blocks of new CPython processes walked again with their Python
        /// frames once the interpreter was known.
        py_refreshed = CNT_PY_REFRESHED,
        /// User stacks of JVM processes that went through Java code, and
        /// their Java frames.
        java_stacks = CNT_JAVA_STACKS,
        java_frames = CNT_JAVA_FRAMES,
        /// ... walks stopped in Java code: the thread stopped in a Java
        /// frame's code, not at a call; a code cache or frame unreadable.
        java_cut_running = CNT_JAVA_CUT_RUNNING,
        java_cut_unreadable = CNT_JAVA_CUT_UNREADABLE,
        /// Notices of Java frames lost for a full ring buffer (named later
        /// from the process, if it still runs).
        java_events_lost = CNT_JAVA_EVENTS_LOST,
        /// User stacks of Node.js processes with JavaScript frames, and
        /// those frames.
        v8_stacks = CNT_V8_STACKS,
        v8_frames = CNT_V8_FRAMES,
        /// Frames of V8's generated code whose function could not be read
        /// (left as the native walk has them).
        v8_unreadable = CNT_V8_UNREADABLE,
        /// Notices of JavaScript frames lost for a full ring buffer (named
        /// later from the process, if it still runs).
        v8_events_lost = CNT_V8_EVENTS_LOST,
        /// `--on-cpu`: samples of traced threads taken on a CPU, and those
        /// left out for falling outside the window.
        oncpu_samples = CNT_ONCPU_SAMPLES,
        oncpu_outside = CNT_ONCPU_OUTSIDE,
        /// ... runs left out: switched in unseen, by a scheduler that does not
        /// date it.
        oncpu_untimed = CNT_ONCPU_UNTIMED,
        /// Kernel stacks of threads not running (blocked at the start or
        /// the end, `--snapshot`) walked with the kernel's ORC tables, their
        /// scheduler frames kept; of which made whole with the kernel's own
        /// walk from a module's or BPF frame on.
        kstack_walked = CNT_KSTACK_WALKED,
        kstack_spliced = CNT_KSTACK_SPLICED,
        /// ... left to the kernel's walk alone, without their scheduler
        /// frames.
        kstack_no_sched = CNT_KSTACK_NO_SCHED,
        /// ... of threads that ran while they were walked, twice: the
        /// kernel's walk kept, without their scheduler frames.
        kstack_moved = CNT_KSTACK_MOVED,
        /// ... not walked (the kprobe's end iterator that reads user
        /// stacks): the kernel's walk, without scheduler frames.
        kstack_not_walked = CNT_KSTACK_NOT_WALKED,
        /// Kernel stacks taken at a switch-in proved the same as one of the
        /// thread's last walks (not walked again, or not stored again).
        kstack_proved = CNT_KSTACK_PROVED,
        /// ... due at a switch-in the kernel did not report: lost (the
        /// thread ran since), the block counted without them.
        kstack_unseen = CNT_KSTACK_UNSEEN,
        /// Stacks kept in the spill table, the stacks table having had no
        /// memory for them at the moment (none lost).
        stacks_spilled = CNT_STACKS_SPILLED,
        /// ... and lost, the spill table full too.
        stacks_no_memory = CNT_STACKS_NO_MEMORY,
        /// `--timeline`: blocks sent, and lost for a full ring buffer.
        timeline_sent = CNT_TIMELINE_SENT,
        timeline_lost = CNT_TIMELINE_LOST,
        /// Walks (user or kernel) not kept to be proved at the thread's
        /// next block, the table of the proofs' shapes full: walked
        /// again instead.
        shapes_full = CNT_SHAPES_FULL,
        /// User stacks not taken: their thread was inside an exec, its
        /// registers the replaced image's, its memory the new one's.
        user_stack_in_exec = CNT_USTACK_IN_EXEC,
        /// User stacks of CPython processes whose Python frames were proved
        /// the same as the thread's last walk of them (in `py_stacks` too).
        py_proved = CNT_PY_PROVED,
        /// User stacks not copied for userspace: their CPU had made its
        /// share of copies (a flood of new threads blocking at once).
        unwind_defer_paced = CNT_UNWIND_DEFER_PACED,
    }
    user {
        /// ... threads (in an interval, with `-i`) that ran but that no
        /// sample caught, and their running time (shown as not sampled).
        oncpu_unsampled_threads,
        oncpu_unsampled_ns,
        /// ... samples of a thread whose running time was not counted (left
        /// out: they would have no time to share).
        oncpu_orphan_samples,
        /// User stacks (distinct per process) none of whose addresses is in
        /// a file their process maps (as read; no perf map names them),
        /// all their frames `[unknown]`, and the off-CPU time of their
        /// blocks.
        user_unmapped_stacks,
        user_unmapped_ns,
        /// Counted entries whose user stack was copied for userspace to
        /// walk and never walked (see `crate::deferred`).
        missed_not_walked,
        /// ... whose kernel stack was due at a switch-in the kernel did not
        /// report.
        missed_no_switch_in,
        /// ... whose user or kernel stack is not among those stored.
        missed_not_stored,
    }
}

/// Which language runtime a frame is of (see `crate::runtime`, where
/// each has its entry): the tag its frames carry from the BPF program's
/// news to the outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuntimeKind {
    Python,
    Java,
    Node,
}

/// What the BPF program says of a process while tracing.
// Events are few and short-lived (a round's worth): kept Copy and flat.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// A thread of it was seen blocking for the first time.
    /// (With its address space then.)
    New(Proc, AddressSpace),
    /// A thread of it blocked after its executable mappings changed.
    Changed(Proc, AddressSpace),
    /// Its last thread is gone.
    Exited(Proc),
    /// A stack of it was walked through the files it maps, through these
    /// mappings (the first `.1` of them).
    Mapped(Proc, [MappedVma; MAPPED_VMAS], usize),
    /// It was forked by `parent` and shares its parent's unwind tables:
    /// the slice of mappings from `map_start`, `map_count` long.
    /// A walk of its frames of runtime `kind` met code `code` (with
    /// `tag`; Python's: a code object, see `struct py_code_event`), in
    /// its address space `space`.
    RuntimeCode {
        kind: RuntimeKind,
        proc: Proc,
        space: AddressSpace,
        code: u64,
        tag: u32,
        /// What else the frame says (see `py_code_event`'s `at`).
        at: u64,
    },
    Forked {
        child: Proc,
        /// The child's address space.
        space: AddressSpace,
        parent: u32,
        map_start: u32,
        map_count: u32,
    },
}

/// At most this many mappings come with a [`TaskEvent::Mapped`].
pub const MAPPED_VMAS: usize = 8;

/// A mapping of a file (or the vDSO: dev and ino 0) a stack was walked
/// through, as `struct mapped_vma` gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedVma {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// The kernel's encoding: major << 20 | minor.
    pub dev: u64,
    pub ino: u64,
}

/// What a process's mappings belong to: its address space (the kernel's
/// address of its mm, an opaque identity) and the size of its executable
/// mappings, as the BPF program saw them. Unwind tables hold for the
/// mappings of one; all zero where unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddressSpace {
    pub mm: u64,
    pub exec_vm: u64,
}

/// The program image a process ran when its mappings were read, as
/// `/proc/PID/stat` says (see [`crate::process::image_of`]): the tables of
/// mappings read before the trace started, when no event said whose they
/// are, are taken only by an address space of the same image (see
/// `struct unwind_proc`). [`Image::UNSURE`] where an exec may have come
/// between the reading and its image's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Image {
    pub start_code: u64,
    pub start_stack: u64,
}

impl Image {
    /// No address space's: the tables wait for an event to say whose they
    /// are.
    pub const UNSURE: Image = Image {
        start_code: u64::MAX,
        start_stack: u64::MAX,
    };
}

/// A user stack the BPF program copied for userspace to walk, with the
/// registers the walk starts from (see `struct deferred_stack` and
/// [`crate::deferred`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawUserStack {
    /// The stack id its block is counted under.
    pub id: u64,
    pub proc: Proc,
    pub tid: u32,
    /// Its address space: walked only with tables written for the
    /// mappings of that address space.
    pub space: AddressSpace,
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// 0 where rax was 0: tells clone's child from its parent
    /// (`KIND_CLONE`).
    pub ax: u64,
    /// Where `bytes` start: the page that holds `sp`.
    pub base: u64,
    /// The stack from `base` on.
    pub bytes: Vec<u8>,
}

impl RawUserStack {
    /// Decodes a record of the ring buffer, or None if it is malformed.
    pub fn parse(data: &[u8]) -> Option<RawUserStack> {
        use std::mem::offset_of;
        use types::deferred_stack as D;
        let u64_at = |o: usize| Some(u64::from_ne_bytes(data.get(o..o + 8)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_ne_bytes(data.get(o..o + 4)?.try_into().ok()?));
        let len = u32_at(offset_of!(D, len))? as usize;
        let bytes = data.get(offset_of!(D, bytes)..)?.get(..len)?.to_vec();
        let sp = u64_at(offset_of!(D, sp))?;
        Some(RawUserStack {
            id: u64_at(offset_of!(D, id))?,
            proc: Proc {
                tgid: u32_at(offset_of!(D, tgid))?,
                start: ticks_of_ns(u64_at(offset_of!(D, process_start))?),
            },
            tid: u32_at(offset_of!(D, pid))?,
            space: AddressSpace {
                mm: u64_at(offset_of!(D, mm))?,
                exec_vm: u64_at(offset_of!(D, exec_vm))?,
            },
            pc: u64_at(offset_of!(D, pc))?,
            sp,
            bp: u64_at(offset_of!(D, bp))?,
            ax: u64_at(offset_of!(D, ax))?,
            base: sp & !4095,
            bytes,
        })
    }
}

/// Frames of stored stacks by id, innermost first, all in one buffer: a
/// vector each was an allocation (and a free) per stack (see
/// BENCHMARKS.md, report time).
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    /// Where each stack's frames are in `frames`: start and length.
    spans: ahash::AHashMap<u64, (usize, usize)>,
    frames: Vec<u64>,
}

impl Stacks {
    /// The frames of stack `id`.
    pub fn get(&self, id: &u64) -> Option<&[u64]> {
        let &(start, len) = self.spans.get(id)?;
        self.frames.get(start..start + len)
    }

    /// Where the frames of stack `id` are among all the frames (start and
    /// length, for [`Stacks::at`]): stacks read in this order are read
    /// front to back.
    pub fn span(&self, id: &u64) -> Option<(usize, usize)> {
        self.spans.get(id).copied()
    }

    /// The frames at `span`, as [`Stacks::span`] gave it.
    pub fn at(&self, (start, len): (usize, usize)) -> &[u64] {
        self.frames.get(start..start + len).unwrap_or(&[])
    }

    pub fn contains_key(&self, id: &u64) -> bool {
        self.spans.contains_key(id)
    }

    /// Stack `id` is `frames` (in place of what it was, if anything).
    pub fn insert(&mut self, id: u64, frames: &[u64]) {
        self.spans.insert(id, (self.frames.len(), frames.len()));
        self.frames.extend_from_slice(frames);
    }

    /// Stack `id` is the stored value `bytes` (see [`stack_frames`]).
    pub(crate) fn insert_value(&mut self, id: u64, bytes: &[u8]) {
        let (words, len) = stored_words(bytes);
        let start = self.frames.len();
        self.frames.extend(words.take(len));
        self.spans.insert(id, (start, len));
    }

    /// Room for `more` stacks.
    pub fn reserve(&mut self, more: usize) {
        self.spans.reserve(more);
    }

    /// How many of the stacks `keep` takes, and their frames.
    pub fn count_where(&self, keep: impl Fn(u64) -> bool) -> (usize, usize) {
        self.spans
            .iter()
            .filter(|(id, _)| keep(**id))
            .fold((0, 0), |(n, frames), (_, &(_, len))| (n + 1, frames + len))
    }

    /// How many stacks there are.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Only the stacks whose id `keep` keeps; the frames of the others
    /// are let go.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        let before = self.spans.len();
        self.spans.retain(|&id, _| keep(id));
        if self.spans.len() == before {
            return;
        }
        let mut frames = Vec::with_capacity(self.spans.values().map(|&(_, len)| len).sum());
        for (start, len) in self.spans.values_mut() {
            let at = frames.len();
            frames.extend_from_slice(&self.frames[*start..*start + *len]);
            *start = at;
        }
        self.frames = frames;
    }
}

/// Everything read back from the kernel at the end of tracing.
#[derive(Clone, Debug, Default)]
pub struct RawProfile {
    pub entries: Vec<RawEntry>,
    /// Frames of each stored stack, innermost first.
    pub stacks: Stacks,
    /// The wakers the entries refer to (`--wakers`).
    pub wakers: HashMap<u64, RawWaker>,
    pub counters: LossCounters,
}

/// CLOCK_MONOTONIC now, in ns: the clock of the BPF program
/// (bpf_ktime_get_ns()).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Clock `clock` now, in ns.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; the clocks are Linux's.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// A start time as the BPF program reads it (the leader's
/// `start_boottime`, ns) in the ticks of `/proc/PID/stat`, rounded down
/// as the kernel rounds it there.
pub fn ticks_of_ns(ns: u64) -> u64 {
    ns / (1_000_000_000 / ticks_per_second())
}

/// The words of a stored stack and how many are frames (up to the first
/// 0): counted first, so that they are copied at a known length, in one
/// go.
pub(crate) fn stored_words(bytes: &[u8]) -> (impl Iterator<Item = u64> + '_, usize) {
    let words = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")));
    let len = words
        .clone()
        .position(|ip| ip == 0)
        .unwrap_or(bytes.len() / 8);
    (words, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter of the BPF program has its field, once: a counter
    /// added to `enum offcpu_counter` without one fails here.
    #[test]
    fn every_kernel_counter_has_a_field() {
        let max = crate::bpf::types::offcpu_counter::CNT_MAX.0;
        let mut seen: Vec<u32> = LossCounters::KERNEL.iter().map(|(_, i)| *i).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..max).collect::<Vec<u32>>(),
            "{:?}",
            LossCounters::KERNEL
        );
        // And each lands in its own field.
        let sums: Vec<u64> = (0..u64::from(max)).map(|i| i + 1).collect();
        let c = LossCounters::from_kernel(&sums);
        assert_eq!(c.user_stack_full, 1);
        assert_eq!(c.unwind_defer_paced, u64::from(max));
        assert_eq!(c.oncpu_unsampled_ns, 0);
    }

    #[test]
    fn stacks_keep_their_frames_through_a_retain() {
        let mut stacks = Stacks::default();
        let value = |frames: &[u64]| {
            let mut v: Vec<u8> = frames.iter().flat_map(|f| f.to_ne_bytes()).collect();
            v.resize(8 * 8, 0);
            v
        };
        stacks.insert_value(1, &value(&[10, 11, 12]));
        stacks.insert_value(2, &value(&[20]));
        stacks.insert_value(3, &value(&[]));
        stacks.insert(4, &[40, 41]);
        // A full value: no 0 ends it.
        stacks.insert_value(5, &value(&[1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(stacks.get(&1), Some(&[10, 11, 12][..]));
        assert_eq!(stacks.get(&3), Some(&[][..]));
        assert_eq!(stacks.get(&5).map(<[u64]>::len), Some(8));
        stacks.retain(|id| id != 2 && id != 5);
        assert_eq!(stacks.len(), 3);
        assert_eq!(stacks.get(&2), None);
        assert_eq!(stacks.get(&1), Some(&[10, 11, 12][..]));
        assert_eq!(stacks.get(&3), Some(&[][..]));
        assert_eq!(stacks.get(&4), Some(&[40, 41][..]));
        assert_eq!(stacks.frames.len(), 5);
    }
}
