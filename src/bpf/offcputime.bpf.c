// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * offcputime: time threads spend switched out, by user and kernel stack.
 *
 * At switch-out the blocking thread's start time and, for the sched_switch
 * hooks, its stacks are kept per task: the user stack can only be read in
 * the thread's own context, and the kernel stack must be walked there too,
 * since bpf_get_task_stack() on a sleeping task leaves out every function in
 * .sched.text (schedule_timeout, do_nanosleep, __mutex_lock, ...).  The
 * profiler's own frames on top of it are dropped in userspace.  At
 * switch-in the blocked time is known, and the block is added to `counts`
 * if it passes the -m/-M filters.  On finish_task_switch, which runs in the
 * context of the task switched in, both stacks are taken only then, and only
 * for blocks that pass.
 *
 * Stacks live in `stacks`, keyed by a 64-bit hash of their frames: no 32-bit
 * bucket index that two different stacks can share, so a stack is never
 * dropped or merged by a hash collision, only when the map is full.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "offcputime.h"

#define PF_KTHREAD 0x00200000
#define TASK_INTERRUPTIBLE 0x00000001
#define TASK_UNINTERRUPTIBLE 0x00000002
#define TASK_STOPPED_OR_TRACED 0x0000000c
#define TASK_PARKED 0x00000040
#define TASK_DEAD 0x00000080
#define TASK_WAKING 0x00000200
#define TASK_NEW 0x00000800
#define RWSEM_WRITER_LOCKED 1
#define RWSEM_FLAG_WAITERS 2
#define SCHED_NORMAL 0
#define SCHED_BATCH 3
#define SCHED_IDLE 5
#define EFAULT 14
#define E2BIG 7
#define ENOMEM 12
#define EEXIST 17
#define BPF_F_MMAPABLE 1024

/* Configuration, fixed at load time (see src/tracer.rs). */
const volatile bool filter_by_tgid = false;
const volatile bool filter_by_tid = false;
/* --cgroup: only the tasks in the cgroups of map `cgroups` or below them. */
const volatile bool filter_by_cgroup = false;
const volatile bool user_threads_only = false;
const volatile bool kernel_threads_only = false;
const volatile bool filter_by_state = false;
const volatile __u32 state_mask = 0;
const volatile __u64 min_block_ns = 1;
const volatile __u64 max_block_ns = ~0ULL;
/* --sample: blocks shorter than this are sampled (0: none; at most 1 s). */
const volatile __u64 sample_ns = 0;
const volatile bool want_user_stack = true;
const volatile bool want_kernel_stack = true;
const volatile bool notify_new_tasks = true;
/* sched_switch passes the state the thread blocked in (prev_state, 5.18). */
const volatile bool switch_has_prev_state = false;
/* The hook takes stacks at the switch-in (the finish_task_switch kprobe). */
const volatile bool stacks_at_switch_in = false;
const volatile __u32 stack_bytes = MAX_STACK_DEPTH * sizeof(__u64);
/* --unwind dwarf: walk user stacks with the tables in unwind_*. */
const volatile bool unwind_dwarf = false;
/* ... and keep each thread's last walk, with its proof (struct ucache). */
const volatile bool ucache_on = false;
/* ... and walk processes without tables of their own through the tables of
 * the files they map (struct unwind_file), where the kernel keeps
 * mappings in a maple tree (6.1 on). */
const volatile bool unwind_by_file = false;
/* --states: blocks split by thread state, at their wake-up. */
const volatile bool want_states = false;
/* --wakers: the stacks of the task that woke each block. */
const volatile bool want_wakers = false;
/* ... and where interrupts and softirqs enter, to tell them from tasks. */
const volatile __u64 irq_entry_start = 0;
const volatile __u64 irq_entry_end = 0;
const volatile __u64 softirq_start = 0;
const volatile __u64 softirq_end = 0;
/* Frames searched for those (an interrupt's entry is a few frames below
 * the wake-up). */
#define MAX_INTERRUPT_SCAN 48

/* How long to trace (0: until userspace stops it). */
const volatile __u64 trace_duration_ns = 0;
/* -i: the length of an interval (0: one profile for the whole window).
 * Interval i is [trace_start_ns + i * interval_ns, ... + interval_ns). */
const volatile __u64 interval_ns = 0;

/*
 * The window.  Its start is set by the start iterator (start_blocked), once
 * it has claimed every block already under way; until then the hooks only
 * note switches, and count nothing.  Its end is set at the same moment when
 * a duration is given (so that no wake-up of userspace, however late, can
 * stretch the window), or by userspace when tracing is stopped early.
 * Blocks are counted only inside the window, and the end iterator adds the
 * blocks still in progress at its end.
 */
volatile __u64 trace_start_ns = 0;
volatile __u64 trace_end_ns = 0;
/* -i: the end of the interval the cut iterator closes (written by
 * userspace through the map, between runs of the iterator). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cut_at SEC(".maps");

/*
 * task_data.start_ns: the switch-out time of a block under way, or one of
 * these (a ktime in ns is never this small).  0: no block.  START_SEEN: the
 * task was switched in or out since the hook was attached (so it cannot
 * have been blocked since before).  START_AT_WINDOW: blocked since before
 * the hook was attached, claimed by the start iterator: counted from the
 * window's start, with the stacks it took (start_*_stack_id).
 */
#define START_SEEN 1
#define START_AT_WINDOW 2
/*
 * -i: a block under way at an interval's end is counted up to it by the cut
 * iterator, which sets start_ns to that end with START_CUT (a ktime in ns
 * never has these bits), and START_CUT_AT_WINDOW if the block was under way
 * at the window's start (its stacks and state are the start iterator's).
 */
#define START_CUT (1ULL << 63)
#define START_CUT_AT_WINDOW (1ULL << 62)
#define START_CUT_FLAGS (START_CUT | START_CUT_AT_WINDOW)

/* Per-thread state while it is switched out. */
struct task_data {
	__u64 start_ns;
	/* When the open block began (its switch-out), for -m/-M once the cut
	 * iterator has moved start_ns on. */
	__u64 block_ns;
	__u64 user_stack_id;
	__u64 kernel_stack_id;
	/* The stacks of a block under way at the start, kept apart so that
	 * the iterator never overwrites those of a switch-out that raced it. */
	__u64 start_user_stack_id;
	__u64 start_kernel_stack_id;
	/* The address space its last new-task event was sent for, and the
	 * size of its executable mappings then. */
	__u64 notified_mm;
	__u64 notified_exec_vm;
	/* --states: when the open block was woken (0: not yet), and the
	 * state it blocked in (enum offcpu_state); start_state for a block
	 * under way at the start, kept apart as its stacks are. */
	__u64 wake_ns;
	__u32 state;
	__u32 start_state;
	/* --wakers: who woke the open block (a waker id; 0: nobody yet). */
	__u64 waker_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_data);
} task_data_storage SEC(".maps");

/* The same state keyed by thread id, for hooks whose task pointers the
 * verifier does not trust (raw_tp, kprobe). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct task_data);
} task_data_by_tid SEC(".maps");

/*
 * --on-cpu: when each thread traced began its current run on a CPU, kept
 * apart from task_data (whose size the switch hooks' frames are near 6.1's
 * limit with).  `since` is a switch-in time (or an interval's end, from
 * where the cut iterator counted it), or one of these (a ktime in ns is
 * never this small).  RUN_UNSEEN: a record made at a switch-out, no switch-in
 * seen since the hooks were attached: the thread ran since before.
 * RUN_OFF: off the CPU, or its run counted up to the end.  RUN_AT_WINDOW: on
 * a CPU when the start iterator passed, counted from the window's start.
 */
const volatile bool on_cpu_on = false;

#define RUN_UNSEEN 0
#define RUN_OFF 1
#define RUN_AT_WINDOW 2

struct run_data {
	__u64 since;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct run_data);
} run_storage SEC(".maps");

/* The same keyed by thread id, for the hooks whose task pointers the
 * verifier does not trust (see task_data_by_tid). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct run_data);
} run_by_tid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} tids SEC(".maps");

/* The cgroup v2 ids (kernfs node ids, the directories' inode numbers) of
 * --cgroup. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u8);
} cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64[MAX_STACK_DEPTH]);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_val);
} counts SEC(".maps");

/* --wakers: each distinct waker (task and stacks) under a 64-bit hash. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct waker_info);
} wakers SEC(".maps");

/* One more slot than a stack needs, so that a frame index masked with
 * MAX_STACK_DEPTH (2^7 - 1) is in bounds. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[MAX_STACK_DEPTH + 1]);
} scratch SEC(".maps");

/* The start iterator's frames: it may sleep (reading another task's stack
 * memory can fault), and a switch hook on its CPU would reuse `scratch`
 * meanwhile. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[MAX_STACK_DEPTH + 1]);
} start_scratch SEC(".maps");

/* The start iterator's copy of the stack of the thread it walks, from its
 * stack pointer: one read of another task's memory (which takes its mmap
 * lock and pins its pages) instead of one or two a frame, which made the
 * iterator take a second under thousands of deep stacks.  Reads beyond it
 * are made one by one. */
#define STACK_COPY_BYTES 8192
struct stack_copy {
	__u64 base;
	__u64 len;
	/* 16 bytes more: a read of up to 16 bytes from any offset below
	 * STACK_COPY_BYTES stays inside. */
	__u8 bytes[STACK_COPY_BYTES + 16];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_copy);
} start_stack SEC(".maps");

/*
 * The user stack cache.  A walk is a function of the registers it starts
 * from, its process's unwind tables and the stack memory it reads: walked
 * again from the same registers, with the same tables, over the same
 * memory, it gives the same frames.  So each thread keeps what its last
 * walk started from and every 8-byte slot it read (where, and what was
 * there).  At its next block, if the registers are the same, the tables
 * are (their generation, see struct unwind_proc), and every one of those
 * slots still holds what it held, the stack is the one stored then: it is
 * not walked again, and no frame is guessed.  Where the proof cannot be
 * kept (a read that failed, more than UCACHE_SLOTS slots, a stack that
 * could not be stored) the thread keeps nothing and is walked each time.
 * The initial frame pointer is part of the proof only where the walk used
 * it before restoring it from the stack (code without frame pointers
 * keeps anything in that register).
 */
#define UCACHE_SLOTS 64
struct ucache {
	/* The stack's id in `stacks`; 0: nothing kept. */
	__u64 stack_id;
	__u64 mm;
	__u64 gen;
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 n;
	__u32 fp_frames;
	__u8 bp_used;
	__u8 truncated;
	__u16 gap_frames;
	__u8 _pad[4];
	/* Slot k: at sp + off[k], the walk read val[k]. */
	__u32 off[UCACHE_SLOTS];
	__u64 val[UCACHE_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ucache);
} ucache_storage SEC(".maps");

/* The slots of the walk under way on this CPU, kept once it succeeds. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ucache);
} ucache_scratch SEC(".maps");

/* Checking the slots: the stack is read a window at a time (frames are
 * small, so one read usually covers several), not 8 bytes at a time. */
#define UCACHE_WINDOW 1024
struct ucache_window {
	/* The stack memory read last: from base, len bytes. */
	__u64 base;
	__u64 len;
	__u8 bytes[UCACHE_WINDOW + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ucache_window);
} ucache_window SEC(".maps");

/* DWARF unwind tables (see offcputime.h); sized by userspace at load, and
 * written by it through mmap. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_mapping);
} unwind_maps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* Sized by userspace at load. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1);
	__type(key, struct unwind_file_key);
	__type(value, struct unwind_file);
} unwind_files SEC(".maps");

/* Changed by userspace whenever an entry of unwind_files is removed or
 * rewritten: a walk through files kept in the stack cache (struct ucache)
 * holds only for the entries it was made with. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} unwind_files_gen SEC(".maps");

/*
 * A walk through files (see file_rule()): a node of the maple tree as read,
 * and the last mappings found, each for one address space and one walk.
 */
#define MAPLE_NODE_WORDS 32
#define FILE_MEMOS 4
struct file_memo {
	__u64 mm;
	__u64 walk;
	__u64 start;
	__u64 end;
	__u64 bias;
	__u32 row_start;
	__u32 row_count;
};


struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

#define EVENTS_BYTES (1024 * 1024)
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_BYTES);
} events SEC(".maps");

/* What userspace was last told of each process (struct notified): one
 * notice a process, not one a thread, so that a start with thousands of
 * threads does not overflow the ring buffer. */
struct notified {
	__u64 start;
	__u64 mm;
	__u64 exec_vm;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct notified);
} notified_procs SEC(".maps");

/* Make the shared types visible in the skeleton's `types` module. */
struct task_event _task_event = {};
enum task_event_kind _task_event_kind = TASK_EVENT_NEW;
enum offcpu_state _offcpu_state = OFFCPU_STATE_ANY;
enum waker_id_special _waker_id_special = WAKER_ID_NONE;
struct waker_info _waker_info = {};
enum stack_id_special _stack_id_special = STACK_ID_NONE;
enum offcpu_counter _offcpu_counter = CNT_MAX;
enum unwind_kind _unwind_kind = UNWIND_NONE;
enum unwind_frame_special _unwind_frame_special = UNWIND_SIGNAL_FRAME_HI;
enum unwind_limits _unwind_limits = UNWIND_MAX_OBJECT_ROWS;
struct unwind_row _unwind_row = {};
struct unwind_mapping _unwind_mapping = {};
struct unwind_proc _unwind_proc = {};
struct unwind_file_key _unwind_file_key = {};
struct unwind_file _unwind_file = {};
struct mapped_event _mapped_event = {};
struct snapshot_task _snapshot_task = {};
struct py_proc _py_proc = {};
struct py_code_event _py_code_event = {};
enum py_frames_kind _py_frames_kind = PY_FRAMES_OBJECT;
enum py_frame_special _py_frame_special = PY_FRAME_MARK_HI;

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += 1;
}

static __always_inline __u32 clamp_stack_bytes(void)
{
	__u32 size = stack_bytes;

	if (size > MAX_STACK_DEPTH * sizeof(__u64))
		size = MAX_STACK_DEPTH * sizeof(__u64);
	return size;
}

/* A stack's frames as the scratch maps hold them. */
struct frames {
	__u64 ip[MAX_STACK_DEPTH + 1];
};

/*
 * Store the first `len` bytes of frames `f` in `stacks` (unless already
 * there) and return their id, or one of the STACK_ID_* codes.
 */
static __always_inline __u64 store_frames(struct frames *f, long len, int user)
{
	__u64 h = 0xcbf29ce484222325ULL;
	long nr;
	int i, err;

	if (!f)
		return STACK_ID_MISSED_ERROR;
	if (len == 0 || len == -EFAULT)
		return STACK_ID_NONE;
	if (len < 0) {
		count(user ? CNT_USTACK_ERROR : CNT_KSTACK_ERROR);
		return STACK_ID_MISSED_ERROR;
	}
	nr = len / sizeof(__u64);
	for (i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= nr)
			break;
		h ^= f->ip[i];
		h *= 0x100000001b3ULL;
		h ^= h >> 32;
	}
	h |= STACK_ID_HASH_BIT;

	if (bpf_map_lookup_elem(&stacks, &h))
		return h;
	err = bpf_map_update_elem(&stacks, &h, f, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count(user ? CNT_USTACK_FULL : CNT_KSTACK_FULL);
		return STACK_ID_MISSED_FULL;
	}
	return h;
}

/*
 * store_frames() of the frames in `scratch`, and of those in `start_scratch`
 * (the start iterator's).  Global functions: the verifier checks each once,
 * not at every call in every state of their callers.  They look the frames
 * up themselves: 6.1 takes no map update value from memory passed as an
 * argument.
 */
__noinline __u64 store_stack(long len, int user)
{
	__u32 zero = 0;

	return store_frames(bpf_map_lookup_elem(&scratch, &zero), len, user);
}

__noinline __u64 store_task_stack(long len, int user)
{
	__u32 zero = 0;

	return store_frames(bpf_map_lookup_elem(&start_scratch, &zero), len, user);
}

static __always_inline void count_n(__u32 which, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += n;
}

/* What a walk of a user stack with tables, `w` (struct unwind_state, or
 * the struct ucache of a kept one proved again), counts besides
 * CNT_UNWIND_DWARF.  A macro that reads the fields where they are after
 * each count: values passed on would be kept on the stack across the
 * calls (see unwind_state). */
#define COUNT_WALK(w)                                                       \
	do {                                                                \
		if ((w)->truncated)                                         \
			count(CNT_UNWIND_TRUNCATED);                        \
		if ((w)->fp_frames)                                         \
			count_n(CNT_UNWIND_FP_FRAMES, (w)->fp_frames);      \
		if ((w)->gap_frames)                                        \
			count_n(CNT_UNWIND_GAP_FRAMES, (w)->gap_frames);    \
	} while (0)

/* State of a DWARF unwind of the current task's user stack. */
struct unwind_state {
	/* Registers of the frame being unwound. */
	__u64 pc;
	__u64 sp;
	__u64 bp;
	/* The process's slice of unwind_maps. */
	__u32 map_start;
	__u32 map_count;
	/* Frames written to `scratch`, and the most to write. */
	__u32 nr;
	__u32 max;
	/* 16 bits, and rax's test below kept as a bool: on 6.1 the stack of
	 * a chain of calls (the switch hook, user_stack_of_current, the
	 * bpf_loop callback, unwind_rule) is bounded to 512 bytes. */
	__u16 fp_frames;
	/* ... of which in an object's code that its tables do not cover
	 * (CNT_UNWIND_GAP_FRAMES). */
	__u16 gap_frames;
	/* The frame whose pc is not a return address, and so is looked up
	 * as it is: 0, or the one after a signal frame (the interrupted
	 * pc). */
	__u32 exact_at;
	bool truncated;
	/* For the cache (struct ucache): a read failed (the walk cannot be
	 * proved again); the starting frame pointer was used; bp no longer
	 * holds it. */
	bool unprovable;
	bool bp_used;
	bool bp_restored;
	/* rax of the first frame is 0 (UNWIND_CLONE: clone's child); past a
	 * signal frame, rax is not known. */
	bool ax_zero;
	bool ax_unknown;
	/* The frame being walked through frame pointers is in a gap of its
	 * object's tables (RULE_GAP). */
	bool in_gap;
	/* The task whose stack it is, when it is not the current one. */
	struct task_struct *task;
};

struct file_scratch {
	__u64 node[MAPLE_NODE_WORDS];
	struct file_memo memo[FILE_MEMOS];
	/* The walk under way on this CPU, and the memo written next. */
	__u64 walk;
	struct unwind_file_key key;
	__u32 next;
	/* The mappings of files this walk went through (the first
	 * MAPPED_VMAS). */
	__u32 used;
	struct mapped_vma vma[MAPPED_VMAS];
	/* The walk itself, kept here, not on the stack: the verifier of 6.1
	 * bounds the stack of a chain of calls (the switch hook, this walk,
	 * its bpf_loop callback, file_rule()) to 512 bytes.  The address
	 * space walked; whether a file without tables yet was met (the walk
	 * is then given up). */
	struct unwind_state st;
	__u64 mm;
	__u32 needs_tables;
	__u32 _pad2;
};

/* Mapping notices sent per process (struct mapped_event): two, for its
 * first walks through files (userspace reads its mappings meanwhile): more
 * would crowd out the news of other new processes on the ring buffer under
 * a burst of them. */
#define MAPPED_NOTICES 2
struct mapped_sent {
	__u64 mm;
	__u64 exec_vm;
	__u32 sent;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct mapped_sent);
} mapped_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct file_scratch);
} file_scratch SEC(".maps");

/* The same for the start iterator, which may sleep: a switch hook on its
 * CPU would reuse the per-CPU one meanwhile. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct file_scratch);
} start_file_scratch SEC(".maps");

static __always_inline struct file_scratch *file_scratch_of(bool start)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(start ? (void *)&start_file_scratch : (void *)&file_scratch,
				   &zero);
}

/* The walk read `val` at `addr`: slot k of its proof in `pr`. */
static __always_inline void note_slot(struct ucache *pr, struct unwind_state *u,
				      __u64 addr, __u64 val)
{
	__u32 k;

	if (!pr)
		return;
	k = pr->n;
	if (k >= UCACHE_SLOTS || addr < pr->sp || addr - pr->sp > 0xfffffff0ULL) {
		u->unprovable = true;
		return;
	}
	pr->n = k + 1;
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(k));
	k &= UCACHE_SLOTS - 1;
	pr->off[k] = addr - pr->sp;
	pr->val[k] = val;
}

/* Reads the user memory of the current task, or of `task` from the copy
 * of its stack `c` where it has the bytes, else from the task (which may
 * sleep, so only from the sleepable start iterator). */
static __always_inline long read_user(void *dst, __u32 size, const void *src,
				      struct task_struct *task, struct stack_copy *c)
{
	__u64 off;

	if (!c)
		return bpf_probe_read_user(dst, size, src);
	off = (__u64)src - c->base;
	if ((__u64)src >= c->base && off < STACK_COPY_BYTES && off + size <= c->len)
		return bpf_probe_read_kernel(dst, size, &c->bytes[off & (STACK_COPY_BYTES - 1)]);
	return bpf_copy_from_user_task(dst, size, src, task, 0);
}

/* A binary search over `count` entries of an array map from `start`, one
 * halving per bpf_loop step: the verifier then checks a step once, not
 * every path through an unrolled search (which made loading slow). */
struct search {
	__u32 start;
	__u32 lo;
	__u32 hi;
	__u64 addr;
	/* find_mapping: s->lo is the mapping that holds addr. */
	__u32 found;
};

/*
 * Binary searches take SEARCH_STEPS steps per bpf_loop call: each call of
 * a callback is a call and a return, which the kernel's mitigations of
 * speculative execution make expensive (tens of ns each on some CPUs),
 * and a search takes up to 25 steps; the verifier checks the steps of
 * one call, not of the whole search.
 */
#define SEARCH_STEPS 5

static long mapping_step(__u32 i, void *arg)
{
	struct search *s = arg;
	struct unwind_mapping *m;
	__u32 mid, idx;
	int k;

	for (k = 0; k < SEARCH_STEPS; k++) {
		if (s->lo >= s->hi)
			return 1;
		mid = s->lo + (s->hi - s->lo) / 2;
		idx = s->start + mid;
		m = bpf_map_lookup_elem(&unwind_maps, &idx);
		if (!m)
			return 1;
		if (s->addr < m->start) {
			s->hi = mid;
		} else if (s->addr >= m->end) {
			s->lo = mid + 1;
		} else {
			s->lo = mid;
			s->hi = 0;
			s->found = 1;
			return 1;
		}
	}
	return 0;
}

/* The mapping that holds `addr` among the `count` from `start` (a
 * process's, sorted by start address): a binary search. */
static __always_inline struct unwind_mapping *find_mapping(__u32 start, __u32 count, __u64 addr)
{
	struct search s = { .start = start, .hi = count, .addr = addr };
	__u32 idx;

	/* 2^10 = UNWIND_MAX_PROC_MAPPINGS */
	bpf_loop((11 + SEARCH_STEPS - 1) / SEARCH_STEPS, mapping_step, &s, 0);
	if (!s.found)
		return NULL;
	idx = s.start + s.lo;
	return bpf_map_lookup_elem(&unwind_maps, &idx);
}

static long row_step(__u32 i, void *arg)
{
	struct search *s = arg;
	struct unwind_row *r;
	__u32 mid, idx;
	int k;

	for (k = 0; k < SEARCH_STEPS; k++) {
		if (s->lo >= s->hi)
			return 1;
		mid = s->lo + (s->hi - s->lo) / 2;
		idx = s->start + mid;
		r = bpf_map_lookup_elem(&unwind_rows, &idx);
		if (!r)
			return 1;
		if (r->pc <= s->addr)
			s->lo = mid + 1;
		else
			s->hi = mid;
	}
	return 0;
}

/* The last of the `count` rows from `start` whose pc is at most `pc`. */
static __always_inline struct unwind_row *find_row(__u32 start, __u32 count, __u32 pc)
{
	struct search s = { .start = start, .hi = count, .addr = pc };
	__u32 idx;

	/* 2^24 = UNWIND_MAX_OBJECT_ROWS */
	bpf_loop((25 + SEARCH_STEPS - 1) / SEARCH_STEPS, row_step, &s, 0);
	if (s.lo == 0 || s.lo > count || s.lo < s.hi)
		return NULL;
	idx = start + s.lo - 1;
	return bpf_map_lookup_elem(&unwind_rows, &idx);
}

/* unwind_rule()'s answer: kind | cfa_off << 8 | (__u8)rbp_off << 24,
 * and RULE_GAP where an object with tables maps the address but no row
 * covers it. */
#define RULE_GAP (1ULL << 32)
#define RULE_KIND(r) ((__u32)((r) & 0xff))
#define RULE_CFA_OFF(r) ((__u32)(((r) >> 8) & 0xffff))
#define RULE_RBP_OFF(r) ((__s64)(__s8)(((r) >> 24) & 0xff))

/*
 * The unwind rule of `addr` in the process whose mappings are the `count`
 * from `start` in unwind_maps: its mapping, then its object's row; kind
 * UNWIND_NONE where no call-frame information covers it (frame pointers
 * are followed there).  A global function, so that the verifier checks it
 * once for any address, on its own, instead of again at every call in
 * every state of its callers (most of the load time went there).  It
 * answers in its return value, not through memory: the verifier of 6.1
 * takes a caller's stack passed to a global function as unchanged by the
 * call (and drops the code that reads the answer as dead).  It only looks
 * up array maps, which sleepable and non-sleepable programs may both do.
 */
__noinline __u64 unwind_rule(__u64 addr, __u32 start, __u32 count)
{
	struct unwind_mapping *m;
	struct unwind_row *r = NULL;

	m = find_mapping(start, count, addr);
	if (!m || !m->row_count)
		return UNWIND_NONE;
	if (addr - m->bias <= 0xffffffffULL)
		r = find_row(m->row_start, m->row_count, addr - m->bias);
	if (!r || r->kind == UNWIND_NONE)
		return UNWIND_NONE | RULE_GAP;
	return (__u64)r->kind | (__u64)r->cfa_off << 8 | (__u64)(__u8)r->rbp_off << 24;
}

/* Maple tree nodes (lib/maple_tree.c): a node pointer is tagged with its
 * type in bits 3..6 (and the root with 2 in bits 0..1); nodes are
 * 256 bytes, aligned to 256.  A leaf or range node has 15 pivots (from
 * word 1) and 16 slots (from word 16), where a node with fewer than 16
 * entries keeps their count in the byte at 248 (its metadata); an
 * allocation-range node (the inner nodes of a tree of mappings) has 9
 * pivots, 10 slots (from word 10) and its count at byte 240.  Pivot k is
 * the last address of slot k. */
#define MAPLE_LEAF_64 1
#define MAPLE_RANGE_64 2
#define MAPLE_ARANGE_64 3
#define MAPLE_DEPTH 8
#define VM_EXEC 0x4

/*
 * The mapping of address space `mm` that holds `addr`: a lookup in its
 * maple tree as the kernel's own (mtree_lookup_walk()), with plain reads:
 * the tree may change meanwhile (another thread mapping or unmapping), so
 * what is found is checked to hold `addr` and to belong to `mm`.  0 where
 * nothing is found or the check fails, 1 where the tree has a gap at
 * `addr` (no mapping).
 */
static __always_inline __u64 vma_of(__u64 mm, __u64 addr, struct file_scratch *s)
{
	struct mm_struct *m = (struct mm_struct *)mm;
	struct vm_area_struct *vma;
	__u64 entry = (__u64)BPF_CORE_READ(m, mm_mt.ma_root);
	__u64 max = ~0ULL, piv, last;
	__u32 type, npiv, slots, end, off, k;
	int level;

	for (level = 0; level < MAPLE_DEPTH; level++) {
		/* The root is an internal entry (tagged 2); the nodes below
		 * are tagged 4 (MAPLE_ENODE_NULL). */
		if (entry < (1ULL << 63) || (level == 0 && (entry & 3) != 2))
			return 0;
		type = (entry >> 3) & 15;
		if (bpf_probe_read_kernel(s->node, sizeof(s->node), (void *)(entry & ~255ULL)))
			return 0;
		if (type == MAPLE_ARANGE_64) {
			npiv = 9;
			slots = 10;
			end = ((__u8 *)s->node)[240];
		} else if (type == MAPLE_LEAF_64 || type == MAPLE_RANGE_64) {
			npiv = 15;
			slots = 16;
			last = s->node[15];
			if (!last)
				end = ((__u8 *)s->node)[248];
			else if (last == max)
				end = 14;
			else
				end = 15;
		} else {
			return 0;
		}
		if (end > npiv)
			end = npiv;
		/* The first pivot at or above addr, else the last slot: from
		 * the end down, so that the loop unrolls into plain compares
		 * (the verifier of 6.1 loses the bounds of a pointer walked
		 * through a loop that breaks early). */
		off = end;
#pragma clang loop unroll(full)
		for (k = 15; k > 0; k--) {
			piv = s->node[k & (MAPLE_NODE_WORDS - 1)];
			if (k - 1 < end && piv >= addr)
				off = k - 1;
		}
		if (off < end)
			max = s->node[(1 + off) & (MAPLE_NODE_WORDS - 1)];
		entry = s->node[(slots + off) & (MAPLE_NODE_WORDS - 1)];
		if (type == MAPLE_LEAF_64)
			break;
	}
	if (level == MAPLE_DEPTH)
		return 0;
	if (!entry)
		return 1;
	vma = (struct vm_area_struct *)entry;
	if (BPF_CORE_READ(vma, vm_mm) != m || BPF_CORE_READ(vma, vm_start) > addr ||
	    BPF_CORE_READ(vma, vm_end) <= addr)
		return 0;
	return entry;
}

/* The answers of file_memo() that are not a memo. */
#define FILE_MEMO_NONE 0x100
#define FILE_MEMO_UNKNOWN 0x101

/*
 * The mapping of address space `mm` that holds `addr`, with the tables of
 * the file it maps (struct unwind_file): the index of the memo in
 * file_scratch that says where they are; FILE_MEMO_NONE where the mapping
 * has no tables, or no mapping holds `addr`, or it is not executable
 * (frame pointers are followed there, as through a process's own tables);
 * FILE_MEMO_UNKNOWN where the file has no entry yet, or the tree could not
 * be read.  The last mappings found in this walk (`walk`) are kept, so
 * that a stack through a few files looks each up once.  Split from the
 * row lookup (row_rule()) to keep each call's stack small (see struct
 * file_scratch).
 */
__noinline __u32 file_memo(__u64 addr, __u64 mm, __u64 walk, bool start_iter)
{
	struct unwind_file *f;
	struct file_scratch *s;
	struct vm_area_struct *vma;
	struct inode *inode;
	struct file *file;
	__u64 entry, start, off, size = 0;
	__u32 i, chosen = UNWIND_FILE_SEGMENTS, n;

	/* Here too, not only in the callers: a global function is checked on
	 * its own, and before 6.1 the tree's reads cannot be relocated. */
	if (!bpf_core_field_exists(((struct mm_struct *)0)->mm_mt))
		return FILE_MEMO_UNKNOWN;
	s = file_scratch_of(start_iter);
	if (!s)
		return FILE_MEMO_UNKNOWN;
	for (i = 0; i < FILE_MEMOS; i++) {
		if (s->memo[i].mm == mm && s->memo[i].walk == walk && s->memo[i].start <= addr &&
		    addr < s->memo[i].end)
			return i;
	}
	entry = vma_of(mm, addr, s);
	if (!entry)
		return FILE_MEMO_UNKNOWN;
	if (entry == 1)
		return FILE_MEMO_NONE;
	vma = (struct vm_area_struct *)entry;
	if (!(BPF_CORE_READ(vma, vm_flags) & VM_EXEC))
		return FILE_MEMO_NONE;
	start = BPF_CORE_READ(vma, vm_start);
	file = BPF_CORE_READ(vma, vm_file);
	s->key.dev = 0;
	s->key.ino = 0;
	if (file) {
		inode = BPF_CORE_READ(file, f_inode);
		s->key.ino = BPF_CORE_READ(inode, i_ino);
		s->key.dev = BPF_CORE_READ(inode, i_sb, s_dev);
		size = BPF_CORE_READ(inode, i_size);
	} else if (start != (__u64)BPF_CORE_READ((struct mm_struct *)mm, context.vdso)) {
		/* Anonymous code (JIT): no tables, as in a process's. */
		return FILE_MEMO_NONE;
	}
	f = bpf_map_lookup_elem(&unwind_files, &s->key);
	if (!f || (file && f->size != size))
		return FILE_MEMO_UNKNOWN;
	off = BPF_CORE_READ(vma, vm_pgoff) << 12;
	n = f->segments;
	/* The last segment the mapping's first page reaches (as userspace's
	 * bias()). */
	for (i = 0; i < UNWIND_FILE_SEGMENTS; i++) {
		if (i < n && off >= f->segment[i].start && off < f->segment[i].end)
			chosen = i;
	}
	i = s->used;
	if (i < MAPPED_VMAS) {
		s->vma[i].start = start;
		s->vma[i].end = BPF_CORE_READ(vma, vm_end);
		s->vma[i].offset = off;
		s->vma[i].dev = s->key.dev;
		s->vma[i].ino = s->key.ino;
		s->used = i + 1;
	}
	i = s->next++ & (FILE_MEMOS - 1);
	s->memo[i].mm = mm;
	s->memo[i].walk = walk;
	s->memo[i].start = start;
	s->memo[i].end = BPF_CORE_READ(vma, vm_end);
	s->memo[i].bias = 0;
	s->memo[i].row_start = 0;
	s->memo[i].row_count = 0;
	if (chosen < UNWIND_FILE_SEGMENTS) {
		s->memo[i].bias =
			start - off - f->segment[chosen & (UNWIND_FILE_SEGMENTS - 1)].delta;
		s->memo[i].row_start = f->row_start;
		s->memo[i].row_count = f->row_count;
	}
	return i;
}

/* The rule of the row of `count` from `start` that covers the object's
 * address `pc` (as unwind_rule()'s answer). */
__noinline __u64 row_rule(__u64 pc, __u32 start, __u32 count)
{
	struct unwind_row *r = NULL;

	if (!count)
		return UNWIND_NONE;
	if (pc <= 0xffffffffULL)
		r = find_row(start, count, pc);
	if (!r || r->kind == UNWIND_NONE)
		return UNWIND_NONE | RULE_GAP;
	return (__u64)r->kind | (__u64)r->cfa_off << 8 | (__u64)(__u8)r->rbp_off << 24;
}

/* The unwind rule of `addr` from the tables of the file mapped there (see
 * file_memo()), UNWIND_UNKNOWN where it has none yet. */
static __always_inline __u64 file_rule(__u64 addr, struct file_scratch *files, bool start_iter)
{
	__u32 m = file_memo(addr, files->mm, files->walk, start_iter);

	if (m == FILE_MEMO_UNKNOWN)
		return UNWIND_UNKNOWN;
	if (m >= FILE_MEMOS)
		return UNWIND_NONE;
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(m));
	m &= FILE_MEMOS - 1;
	return row_rule(addr - files->memo[m].bias, files->memo[m].row_start,
			files->memo[m].row_count);
}

/* A signal trampoline's frame (UNWIND_SIGNAL): where the interrupted
 * registers are in the struct ucontext at rsp (x86-64: uc_mcontext at 40,
 * then r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip). */
#define UCONTEXT_RBP 0x78
#define UCONTEXT_RSP 0xa0
#define UCONTEXT_RIP 0xa8

/*
 * One frame: record its pc, then find the caller's pc, sp and bp, with the
 * object's table where it has one and through the frame pointer where it
 * has not (JIT code, objects without call-frame information).  Returns 1
 * to stop (bpf_loop callback).
 */
static __always_inline long unwind_step(__u32 i, struct unwind_state *u, __u64 *ips,
				       struct stack_copy *c, struct ucache *pr,
				       struct file_scratch *files)
{
	__u64 cfa, ra, frame[2], rule, ra_at, bp_at = 0, bp_val = 0;
	__u32 idx;
	__s64 rbp_off;

	/* `i`, not a count kept in the state, indexes the frames: the
	 * verifier then checks this callback once for any i, instead of once
	 * per depth. */
	if (i >= u->max || i >= MAX_STACK_DEPTH) {
		u->truncated = true;
		return 1;
	}
	/* The compiler forgets the check above, so that the verifier sees a
	 * mask. */
	idx = i;
	asm volatile("" : "+r"(idx));
	ips[idx & MAX_STACK_DEPTH] = u->pc;
	u->nr = i + 1;

	/* A return address is looked up at the call before it. */
	if (files)
		rule = file_rule(i == u->exact_at ? u->pc : u->pc - 1, files, c != NULL);
	else
		rule = unwind_rule(i == u->exact_at ? u->pc : u->pc - 1, u->map_start,
				   u->map_count);
	if (RULE_KIND(rule) != UNWIND_NONE) {
		switch (RULE_KIND(rule)) {
		case UNWIND_UNKNOWN:
			if (files)
				files->needs_tables = 1;
			u->truncated = true;
			u->unprovable = true;
			return 1;
		case UNWIND_END:
			return 1;
		case UNWIND_SIGNAL:
			/* The handler returned here: rsp points at the struct
			 * ucontext, whose registers are the interrupted code's.
			 * It is a frame of its own, and the next one is the
			 * interrupted pc (looked up as it is).  With SA_ONSTACK
			 * the interrupted code's frames are on another stack:
			 * their reads leave the copy of the stack (read_user),
			 * and note_slot() marks the walk unprovable where they
			 * are below the starting sp or far above it. */
			bp_at = u->sp + UCONTEXT_RBP;
			ra_at = u->sp + UCONTEXT_RIP;
			if (read_user(&bp_val, sizeof(bp_val), (void *)bp_at, u->task, c) ||
			    read_user(frame, sizeof(frame), (void *)(u->sp + UCONTEXT_RSP), u->task, c)) {
				u->truncated = true;
				u->unprovable = true;
				return 1;
			}
			note_slot(pr, u, u->sp + UCONTEXT_RSP, frame[0]);
			ips[idx & MAX_STACK_DEPTH] = UNWIND_SIGNAL_FRAME;
			/* The interrupted frame's rax is not read: it could
			 * only matter in clone's few instructions. */
			u->ax_unknown = true;
			/* i + 1, read back: kept in a register it would be
			 * spilled (see unwind_state). */
			u->exact_at = u->nr;
			u->bp = bp_val;
			u->bp_restored = true;
			u->sp = frame[0];
			ra = frame[1];
			goto noted;
		case UNWIND_CLONE:
			/* A return address is never there, and rax is known
			 * only at the first frame.  The cache does not check
			 * rax: the walk is not kept. */
			u->unprovable = true;
			if (i != 0 || u->ax_unknown) {
				u->truncated = true;
				return 1;
			}
			if (u->ax_zero)
				return 1;
			cfa = u->sp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_CFA_RSP:
			cfa = u->sp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_CFA_RBP:
			if (!u->bp_restored)
				u->bp_used = true;
			cfa = u->bp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_PLT:
			cfa = u->sp + 8 + ((u->pc & 15) >= 11 ? 8 : 0);
			break;
		default:
			u->truncated = true;
			return 1;
		}
		rbp_off = RULE_RBP_OFF(rule);
		if (read_user(&ra, sizeof(ra), (void *)(cfa - 8), u->task, c)) {
			u->truncated = true;
			u->unprovable = true;
			return 1;
		}
		ra_at = cfa - 8;
		if (rbp_off) {
			bp_at = cfa + rbp_off * 8;
			if (read_user(&u->bp, sizeof(u->bp), (void *)bp_at, u->task, c)) {
				u->truncated = true;
				u->unprovable = true;
				return 1;
			}
			bp_val = u->bp;
			u->bp_restored = true;
		}
		u->sp = cfa;
	} else {
		/* No call-frame information for this address: the saved frame
		 * pointer and return address at bp.  A chain that ends (bp is
		 * 0 in _start and thread entry points) or cannot be read is
		 * the end of the stack. */
		if (!u->bp_restored)
			u->bp_used = true;
		if (!u->bp)
			return 1;
		/* In the state, not a register: it would be kept on the
		 * stack across the read (see unwind_state). */
		u->in_gap = !!(rule & RULE_GAP);
		if (read_user(frame, sizeof(frame), (void *)u->bp, u->task, c)) {
			u->unprovable = true;
			return 1;
		}
		bp_at = u->bp;
		bp_val = frame[0];
		ra_at = u->bp + 8;
		u->bp_restored = true;
		ra = frame[1];
		u->sp = u->bp + 16;
		u->bp = frame[0];
		u->fp_frames++;
		if (u->in_gap)
			u->gap_frames++;
	}
	/* What the walk read, for the cache: one place, so that the
	 * verifier checks the recording once, not in each path. */
noted:
	note_slot(pr, u, ra_at, ra);
	if (bp_at)
		note_slot(pr, u, bp_at, bp_val);
	if (!ra)
		return 1;
	u->pc = ra;
	return 0;
}

static long unwind_step_current(__u32 i, void *arg)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&scratch, &zero);
	struct ucache *pr = ucache_on ? bpf_map_lookup_elem(&ucache_scratch, &zero) : NULL;

	return ips ? unwind_step(i, arg, ips, NULL, pr, NULL) : 1;
}

/* The callback of a walk through files: its state is in file_scratch. */
static long unwind_step_files(__u32 i, void *arg)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&scratch, &zero);
	struct file_scratch *s = bpf_map_lookup_elem(&file_scratch, &zero);

	struct ucache *pr = ucache_on ? bpf_map_lookup_elem(&ucache_scratch, &zero) : NULL;

	return ips && s ? unwind_step(i, &s->st, ips, NULL, pr, s) : 1;
}

static long unwind_step_task(__u32 i, void *arg)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&start_scratch, &zero);
	struct stack_copy *c = bpf_map_lookup_elem(&start_stack, &zero);

	return ips && c ? unwind_step(i, arg, ips, c, NULL, NULL) : 1;
}

static long unwind_step_task_files(__u32 i, void *arg)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&start_scratch, &zero);
	struct stack_copy *c = bpf_map_lookup_elem(&start_stack, &zero);
	struct file_scratch *s = file_scratch_of(true);

	return ips && c && s ? unwind_step(i, arg, ips, c, NULL, s) : 1;
}

/* Copies the stack of the task being walked from its stack pointer: as
 * much of STACK_COPY_BYTES as can be read (at least the rest of its page,
 * which holds the stack pointer). */
static __always_inline void copy_stack(struct unwind_state *u)
{
	__u32 zero = 0, n;
	struct stack_copy *c = bpf_map_lookup_elem(&start_stack, &zero);

	if (!c)
		return;
	c->base = u->sp;
	c->len = 0;
	if (!bpf_copy_from_user_task(c->bytes, STACK_COPY_BYTES, (void *)u->sp, u->task, 0)) {
		c->len = STACK_COPY_BYTES;
		return;
	}
	n = 4096 - (u->sp & 4095);
	if (n > STACK_COPY_BYTES)
		return;
	if (!bpf_copy_from_user_task(c->bytes, n, (void *)u->sp, u->task, 0))
		c->len = n;
}

/*
 * Walks the stack from u's registers into `scratch` (`start_scratch` for
 * another task), through the tables of u's mappings if it has any, else
 * through frame pointers.  Returns the number of frames.
 */
static __always_inline __u32 walk_user(struct unwind_state *u, bool remote)
{
	__u64 *ips;
	__u32 zero = 0, idx;

	u->max = clamp_stack_bytes() / sizeof(__u64);
	if (remote) {
		copy_stack(u);
		bpf_loop(MAX_STACK_DEPTH, unwind_step_task, u, 0);
	} else
		bpf_loop(MAX_STACK_DEPTH, unwind_step_current, u, 0);
	/* Frames end at a zero, as bpf_get_stack() leaves them: the buffer
	 * still holds deeper stacks walked before. */
	if (u->nr < MAX_STACK_DEPTH) {
		ips = bpf_map_lookup_elem(remote ? (void *)&start_scratch : (void *)&scratch, &zero);
		idx = u->nr;
		asm volatile("" : "+r"(idx));
		if (ips)
			ips[idx & MAX_STACK_DEPTH] = 0;
	}
	return u->nr;
}

/*
 * A field of task `t`: loaded directly where `t` is a pointer the verifier
 * lets a program dereference (`trusted`: the arguments of tp_btf, the
 * current task, an iterator's task), else read with bpf_probe_read_kernel
 * (raw_tp and kprobe arguments are plain numbers).  The load is one
 * instruction the JIT guards; the helper is a call and several returns,
 * each expensive where returns are made safe against speculation (AMD's
 * spec_rstack_overflow).  `trusted` is a constant at every call, so the
 * other branch is not compiled.  Only for fields of the task itself: the
 * verifier checks every direct load against the type's members, and loads
 * through a pointer walked from the task (group_leader, mm) tripled the
 * switch hook's verification time, for little.
 */
#define TASK_READ(trusted, t, field) ((trusted) ? (t)->field : BPF_CORE_READ(t, field))

/* Where `task` entered the kernel from user space: its pc, sp and bp
 * (read at the fixed offsets of struct pt_regs, see vmlinux.h). */
static __always_inline int read_user_regs(struct task_struct *task, struct unwind_state *u)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);

	if (!regs)
		return -1;
	/* Loaded directly: bpf_task_pt_regs() gives a pointer the verifier
	 * lets a program dereference (see TASK_READ). */
	u->pc = regs->ip;
	u->sp = regs->sp;
	u->bp = regs->bp;
	u->ax_zero = !regs->ax;
	/* A load that faults reads 0, where the helper failed: no user code
	 * runs at 0, and the walk is then not made (counted as a missed
	 * stack, as before). */
	return u->pc && u->sp ? 0 : -1;
}

/* The address space of `task` and the size of its executable mappings
 * (0, 0 for a task without one). */
static __always_inline __u64 address_space(struct task_struct *task, __u64 *exec_vm)
{
	struct mm_struct *mm = BPF_CORE_READ(task, mm);

	*exec_vm = mm ? BPF_CORE_READ(mm, exec_vm) : 0;
	return (__u64)mm;
}

/* The unwind tables of process `tgid` if they are ready for its address
 * space `mm` with executable mappings of `exec_vm` pages, else NULL.  The
 * tables describe the mappings they were built for: the first unwind
 * claims them where userspace could not say whose they are, and an exec(),
 * a library mapped or unmapped, or a reused pid since makes them stale
 * until userspace has built new ones. */
static __always_inline struct unwind_proc *tables_of(__u32 tgid, __u64 mm, __u64 exec_vm)
{
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);

	if (p && mm && !p->mm) {
		p->exec_vm = exec_vm;
		p->mm = mm;
	}
	if (p && mm && p->mm == mm && p->exec_vm == exec_vm)
		return p;
	return NULL;
}

/* Walks from u's registers with the tables `p`, and counts the walk. */
static __always_inline void walk_with_tables(struct unwind_state *u, struct unwind_proc *p,
					     bool remote)
{
	u->map_start = p->map_start;
	u->map_count = p->map_count;
	if (u->map_count > UNWIND_MAX_PROC_MAPPINGS)
		u->map_count = UNWIND_MAX_PROC_MAPPINGS;
	walk_user(u, remote);
	count(CNT_UNWIND_DWARF);
	COUNT_WALK(u);
}

/*
 * Walks the user stack of another task, `task`, from the user registers
 * saved at its kernel entry, with the DWARF tables of its process, or with
 * frame pointers where it has none (yet): the caller could not walk it
 * (the verifier checks each walk called).  Returns its length in bytes, or
 * -1 where the registers cannot be read.
 */
static __always_inline long unwind_task(struct task_struct *task, __u32 tgid)
{
	struct unwind_state u = {};
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	struct unwind_proc *p = tables_of(tgid, mm, exec_vm);

	if (read_user_regs(task, &u))
		return -1;
	u.task = task;
	if (p) {
		walk_with_tables(&u, p, true);
	} else {
		count(CNT_UNWIND_NOT_READY);
		walk_user(&u, true);
	}
	return u.nr * sizeof(__u64);
}

/* Checking a kept walk's slots (struct ucache), one per bpf_loop call:
 * more per call (unrolled) multiply the paths the verifier follows. */
struct ucache_check {
	struct ucache *e;
	/* Every slot checked, and each held what it held. */
	bool holds;
};

static long ucache_check_step(__u32 i, void *arg)
{
	struct ucache_check *v = arg;
	struct ucache *e = v->e;
	__u32 zero = 0, k = i;
	__u64 addr, off, val;
	struct ucache_window *w = bpf_map_lookup_elem(&ucache_window, &zero);

	if (!w || !e)
		return 1;
	/* `i`, not a count kept in `v`: the verifier would follow a count
	 * from its known start through every value. */
	if (k >= e->n || k >= UCACHE_SLOTS) {
		v->holds = k >= e->n;
		return 1;
	}
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(k));
	k &= UCACHE_SLOTS - 1;
	addr = e->sp + e->off[k];
	off = addr - w->base;
	if (i == 0 || addr < w->base || off + 8 > w->len) {
		/* The stack from this slot up, in one read (frames are small:
		 * it usually holds the next ones too); where that would cross
		 * into memory that cannot be read, the slot alone. */
		w->base = addr;
		w->len = 0;
		off = 0;
		if (!bpf_probe_read_user(w->bytes, UCACHE_WINDOW, (void *)addr))
			w->len = UCACHE_WINDOW;
		else if (!bpf_probe_read_user(w->bytes, 8, (void *)addr))
			w->len = 8;
		else
			return 1;
	}
	val = *(__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1)));
	return val == e->val[k] ? 0 : 1;
}

/* Whether the current thread's kept walk `e` holds for the registers in
 * `u`, the address space `mm` and the tables of generation `gen`: the
 * proof of struct ucache. */
static __always_inline bool ucache_holds(struct ucache *e, struct unwind_state *u,
					 __u64 mm, __u64 gen)
{
	struct ucache_check v = { .e = e };

	if (!e->stack_id || e->mm != mm || e->gen != gen || e->pc != u->pc ||
	    e->sp != u->sp || (e->bp_used && e->bp != u->bp))
		return false;
	bpf_loop(UCACHE_SLOTS + 1, ucache_check_step, &v, 0);
	return v.holds;
}

/* Keeps the walk in `u` (its slots in `pr`), whose frames were stored as
 * `id`, in the thread's `e`, or nothing where it cannot be proved again. */
static __always_inline void ucache_keep(struct ucache *e, struct ucache *pr,
					struct unwind_state *u, __u64 mm, __u64 gen, __u64 id)
{
	e->stack_id = 0;
	if (!pr || u->unprovable || !(id & STACK_ID_HASH_BIT))
		return;
	/* All of them: straight-line code, which the verifier checks once
	 * (a loop up to n would be checked once per slot). */
	__builtin_memcpy(e->off, pr->off, sizeof(e->off));
	__builtin_memcpy(e->val, pr->val, sizeof(e->val));
	e->n = pr->n;
	e->mm = mm;
	e->gen = gen;
	e->pc = pr->pc;
	e->sp = pr->sp;
	e->bp = pr->bp;
	e->bp_used = u->bp_used;
	e->truncated = u->truncated;
	e->fp_frames = u->fp_frames;
	e->gap_frames = u->gap_frames;
	e->stack_id = id;
}

/* Not a stack id (see enum stack_id_special): the current task's process
 * has no unwind tables yet, or its registers could not be read; its user
 * stack is to be walked with frame pointers. */
#define USTACK_NO_TABLES 4
/* ... or its user registers could not be read (walked as bpf_get_stack()
 * can, not counted). */
#define USTACK_NO_REGS 5

/* The copies of user stacks for userspace (struct deferred_stack), made
 * in this CPU's scratch. */
struct deferred_scratch {
	struct deferred_stack s;
	/* Copies made on this CPU: the ids' low bits. */
	__u64 seq;
	/* What this CPU may still copy (see DEFERRED_COPY_NS), and when
	 * that was last worked out. */
	__u64 credit_ns;
	__u64 credit_at;
};

/*
 * Copies cost the switch they are made in a few microseconds each: a CPU
 * makes one per DEFERRED_COPY_NS at most, in bursts of up to
 * DEFERRED_COPY_BURST, so that thousands of threads of new processes
 * blocking at once (before userspace has their tables, a few milliseconds)
 * cost a bounded share of it.  The blocks beyond are counted as lost for
 * want of room, as where the ring buffer is full.
 */
#define DEFERRED_COPY_NS 250000ULL
#define DEFERRED_COPY_BURST 512ULL

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct deferred_scratch);
} deferred_scratch SEC(".maps");

/* Sized by userspace at load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} deferred_stacks SEC(".maps");

#define DEFERRED_HEADER_BYTES ((__u32)__builtin_offsetof(struct deferred_stack, bytes))

#include "python.h"

/*
 * The current task's user stack, copied for userspace to walk (see struct
 * deferred_stack): its id, STACK_ID_MISSED_ERROR where the ring buffer has
 * no room (counted), or USTACK_NO_REGS where its registers cannot be
 * read.  The stack is read a page at a time from the page of the stack
 * pointer, up to DEFERRED_STACK_PAGES or the first page that cannot be
 * read (the top of the stack).  A global function, checked once on its
 * own.
 */
__noinline __u64 defer_user_stack(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct unwind_state u = {};
	struct deferred_scratch *d;
	__u32 zero = 0;
	__u64 base, len = 0, now;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	int i;

	d = bpf_map_lookup_elem(&deferred_scratch, &zero);
	if (!d)
		return USTACK_NO_TABLES;
	/* No address space (an exiting task): no user memory to copy. */
	if (read_user_regs(task, &u) || !BPF_CORE_READ(task, mm))
		return USTACK_NO_REGS;
	now = bpf_ktime_get_ns();
	d->credit_ns += now - d->credit_at;
	d->credit_at = now;
	if (d->credit_ns > DEFERRED_COPY_NS * DEFERRED_COPY_BURST)
		d->credit_ns = DEFERRED_COPY_NS * DEFERRED_COPY_BURST;
	if (d->credit_ns < DEFERRED_COPY_NS) {
		count(CNT_UNWIND_DEFER_LOST);
		return STACK_ID_MISSED_ERROR;
	}
	d->credit_ns -= DEFERRED_COPY_NS;
	d->seq++;
	d->s.id = STACK_ID_DEFERRED_BIT | (__u64)bpf_get_smp_processor_id() << 40 |
		  (d->seq & ((1ULL << 40) - 1));
	d->s.tgid = pid_tgid >> 32;
	d->s.pid = (__u32)pid_tgid;
	d->s.process_start = BPF_CORE_READ(task, group_leader, start_boottime);
	d->s.mm = address_space(task, &d->s.exec_vm);
	d->s.pc = u.pc;
	d->s.sp = u.sp;
	d->s.bp = u.bp;
	d->s.ax = !u.ax_zero;
	d->s._pad = 0;
	/* Whole pages from the one that holds the stack pointer, up to the
	 * first that cannot be read (the top of the stack): reads of a
	 * constant size at constant offsets, which every verifier follows. */
	base = u.sp & ~4095ULL;
	for (i = 0; i < DEFERRED_STACK_PAGES; i++) {
		if (bpf_probe_read_user(&d->s.bytes[i * 4096], 4096, (void *)(base + i * 4096)))
			break;
		len += 4096;
	}
	d->s.len = len;
	if (bpf_ringbuf_output(&deferred_stacks, &d->s, DEFERRED_HEADER_BYTES + len, 0)) {
		count(CNT_UNWIND_DEFER_LOST);
		return STACK_ID_MISSED_ERROR;
	}
	count(CNT_UNWIND_DEFERRED);
	return d->s.id;
}

/*
 * Tells userspace which mappings the current task's walk through files
 * went through (struct mapped_event), for the first MAPPED_NOTICES walks
 * of its process in this address space.
 */
__noinline int send_mapped(__u64 mm, __u64 exec_vm, __u64 pid_tgid, __u64 start,
			   bool start_iter)
{
	__u32 tgid = pid_tgid >> 32, i, n;
	struct mapped_sent *m, fresh = { .mm = mm, .exec_vm = exec_vm };
	struct file_scratch *s = file_scratch_of(start_iter);
	struct mapped_event *ev;

	if (!s || !s->used)
		return 0;
	m = bpf_map_lookup_elem(&mapped_procs, &tgid);
	if (!m || m->mm != mm || m->exec_vm != exec_vm) {
		bpf_map_update_elem(&mapped_procs, &tgid, &fresh, BPF_ANY);
		m = bpf_map_lookup_elem(&mapped_procs, &tgid);
		if (!m)
			return 0;
	}
	if (m->sent >= MAPPED_NOTICES)
		return 0;
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		count(CNT_EVENTS_DROPPED);
		return 0;
	}
	m->sent++;
	ev->e.tgid = tgid;
	ev->e.pid = (__u32)pid_tgid;
	ev->e.kind = TASK_EVENT_MAPPED;
	ev->e.parent = 0;
	ev->e.map_start = 0;
	ev->e.map_count = 0;
	ev->e.process_start = start;
	ev->e.mm = mm;
	ev->e.exec_vm = exec_vm;
	n = s->used;
	ev->count = n;
	ev->_pad = 0;
	for (i = 0; i < MAPPED_VMAS; i++)
		ev->vma[i] = s->vma[i];
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

/*
 * The current task's user stack, walked through the tables of the files its
 * process maps (see file_rule()) where it has no tables of its own, and
 * stored: its stack id, or USTACK_NO_TABLES where a file without tables
 * was met (or the kernel keeps no maple tree: before 6.1).  A global
 * function, called from the hook itself with little of its own on the
 * stack (see struct file_scratch).
 */
__noinline __u64 user_stack_by_files(bool cache)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct ucache *e = NULL, *pr = NULL;
	struct file_scratch *s;
	__u32 zero = 0, idx;
	__u64 *ips, *files_gen, exec_vm, mm, gen, id;

	if (!unwind_by_file || !bpf_core_field_exists(((struct mm_struct *)0)->mm_mt))
		return USTACK_NO_TABLES;
	s = bpf_map_lookup_elem(&file_scratch, &zero);
	files_gen = bpf_map_lookup_elem(&unwind_files_gen, &zero);
	if (!s || !files_gen)
		return USTACK_NO_TABLES;
	mm = address_space(task, &exec_vm);
	if (!mm)
		return USTACK_NO_TABLES;
	__builtin_memset(&s->st, 0, sizeof(s->st));
	if (read_user_regs(task, &s->st))
		return USTACK_NO_TABLES;
	/* Apart from the generations of processes' own tables (counted up
	 * from 1 by userspace): the files' entries, and the executable
	 * mappings of the address space. */
	gen = 1ULL << 63 | (*files_gen & 0x7fffffff) << 32 | (exec_vm & 0xffffffff);
	if (ucache_on && cache) {
		e = bpf_task_storage_get(&ucache_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (e && ucache_holds(e, &s->st, mm, gen)) {
			count(CNT_UNWIND_DWARF);
			count(CNT_UNWIND_BY_FILE);
			count(CNT_UNWIND_CACHED);
			COUNT_WALK(e);
			return e->stack_id;
		}
		pr = bpf_map_lookup_elem(&ucache_scratch, &zero);
		if (pr) {
			pr->n = 0;
			pr->pc = s->st.pc;
			pr->sp = s->st.sp;
			pr->bp = s->st.bp;
		}
	}
	s->st.max = clamp_stack_bytes() / sizeof(__u64);
	s->mm = mm;
	s->needs_tables = 0;
	s->used = 0;
	s->walk++;
	bpf_loop(MAX_STACK_DEPTH, unwind_step_files, NULL, 0);
	ips = bpf_map_lookup_elem(&scratch, &zero);
	if (!ips || s->needs_tables)
		return USTACK_NO_TABLES;
	idx = s->st.nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		ips[idx & MAX_STACK_DEPTH] = 0;
	}
	count(CNT_UNWIND_DWARF);
	count(CNT_UNWIND_BY_FILE);
	COUNT_WALK(&s->st);
	send_mapped(mm, exec_vm, bpf_get_current_pid_tgid(),
		    BPF_CORE_READ(task, group_leader, start_boottime), false);
	id = store_stack(s->st.nr * sizeof(__u64), true);
	if (e)
		ucache_keep(e, pr, &s->st, mm, gen, id);
	return id;
}

/*
 * The current task's user stack, walked with its process's tables (or
 * proved the same as at its last walk, see struct ucache) and stored: its
 * stack id, or USTACK_NO_TABLES.  A global function, checked once on its
 * own (see unwind_rule).
 */
/* `now` of user_stack_of_current(): read the clock for the last-use mark
 * (a constant: the kprobe hook's frame, which holds its own time, is at
 * 6.1's limit of the stack of a call chain); 0: no mark (wakers). */
#define USED_READ_CLOCK 1

__noinline __u64 user_stack_of_current(bool cache, __u64 now)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	struct unwind_proc *p = tables_of(bpf_get_current_pid_tgid() >> 32, mm, exec_vm);
	struct unwind_state u = {};
	struct ucache *e = NULL, *pr = NULL;
	__u32 zero = 0;
	__u64 id, gen;

	if (!p)
		return USTACK_NO_TABLES;
	/* A block: the process uses its tables (see struct unwind_proc). */
	if (now == USED_READ_CLOCK)
		now = bpf_ktime_get_ns();
	if (now && now - p->used > USED_GRAIN_NS)
		p->used = now;
	if (read_user_regs(task, &u))
		return USTACK_NO_REGS;
	gen = p->gen;
	if (ucache_on && cache) {
		e = bpf_task_storage_get(&ucache_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (e && ucache_holds(e, &u, mm, gen)) {
			count(CNT_UNWIND_DWARF);
			count(CNT_UNWIND_CACHED);
			COUNT_WALK(e);
			return e->stack_id;
		}
		pr = bpf_map_lookup_elem(&ucache_scratch, &zero);
		if (pr) {
			pr->n = 0;
			pr->pc = u.pc;
			pr->sp = u.sp;
			pr->bp = u.bp;
		}
	}
	walk_with_tables(&u, p, false);
	id = store_stack(u.nr * sizeof(__u64), true);
	if (e)
		ucache_keep(e, pr, &u, mm, gen, id);
	return id;
}

/* The user or kernel stack of the current task.  `legacy`: a program for
 * kernels without bpf_loop, which walks with frame pointers only. */
static __always_inline __u64 stack_of_current(void *ctx, bool user, bool legacy, bool cache,
					      __u64 now)
{
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&scratch, &zero);
	__u64 id;
	long len;

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	if (user && unwind_dwarf && !legacy) {
		id = user_stack_of_current(cache, now);
		if (id == USTACK_NO_TABLES) {
			id = user_stack_by_files(cache);
			if (id == USTACK_NO_TABLES)
				id = defer_user_stack();
		}
		if (id != USTACK_NO_TABLES && id != USTACK_NO_REGS)
			return id;
		if (id == USTACK_NO_TABLES)
			count(CNT_UNWIND_NOT_READY);
	}
	len = bpf_get_stack(ctx, buf, clamp_stack_bytes(), user ? BPF_F_USER_STACK : 0);
	return store_stack(len, user);
}

static __always_inline __u32 task_state(struct task_struct *t, bool trusted)
{
	__u32 state = 0;

	if (bpf_core_field_exists(t->__state))
		return TASK_READ(trusted, t, __state);
	/* Before 5.14: `long state`, right after thread_info (before the part
	 * of task_struct a randomized layout may move); its low half on this
	 * little-endian machine holds every state bit. */
	bpf_probe_read_kernel(&state, sizeof(state),
			      (void *)t + bpf_core_field_offset(t->thread_info) +
				      bpf_core_field_size(t->thread_info));
	return state;
}

static __always_inline bool is_kthread(struct task_struct *t, bool trusted)
{
	return TASK_READ(trusted, t, flags) & PF_KTHREAD;
}

/* Why `t` is off the CPU (enum offcpu_state), given its scheduler state
 * (`state`, 0 when it was preempted). */
static __always_inline __u32 offcpu_state(struct task_struct *t, __u32 state)
{
	if (state == 0)
		return OFFCPU_STATE_RUNQUEUE;
	if (state & (TASK_INTERRUPTIBLE | TASK_PARKED))
		return OFFCPU_STATE_SLEEP;
	if (state & TASK_UNINTERRUPTIBLE)
		return BPF_CORE_READ_BITFIELD_PROBED(t, in_iowait) ? OFFCPU_STATE_IO
								   : OFFCPU_STATE_BLOCKED;
	if (state & TASK_STOPPED_OR_TRACED)
		return OFFCPU_STATE_STOPPED;
	return OFFCPU_STATE_BLOCKED;
}

/*
 * Whether `t` is in one of the cgroups of --cgroup or below one: its cgroup
 * of the v2 hierarchy and then each ancestor, looked up by id.  A process
 * moved is seen where it is now, at its next block.  Deeper hierarchies than
 * CGROUP_MAX_DEPTH are looked at in their innermost levels only.
 */
static __noinline bool in_cgroups(struct task_struct *t)
{
	struct cgroup *cg = BPF_CORE_READ(t, cgroups, dfl_cgrp);

	for (int i = 0; i < CGROUP_MAX_DEPTH && cg; i++) {
		__u64 id = BPF_CORE_READ(cg, kn, id);

		if (bpf_map_lookup_elem(&cgroups, &id))
			return true;
		/* `self` is the first member: its parent is the parent cgroup. */
		cg = (struct cgroup *)BPF_CORE_READ(cg, self.parent);
	}
	return false;
}

/* The in-kernel filters on the thread that cost a load or a lookup (-p -t
 * -u -k). */
static __always_inline bool wanted_ids(__u32 tgid, __u32 tid, bool kthread)
{
	if (tid == 0) /* the idle tasks */
		return false;
	if (user_threads_only && kthread)
		return false;
	if (kernel_threads_only && !kthread)
		return false;
	if (filter_by_tgid && !bpf_map_lookup_elem(&tgids, &tgid))
		return false;
	if (filter_by_tid && !bpf_map_lookup_elem(&tids, &tid))
		return false;
	return true;
}

/* ... and all of them (--cgroup: a walk up the task's cgroups, last). */
static __always_inline bool wanted_thread(struct task_struct *t, __u32 tgid, __u32 tid,
					  bool kthread)
{
	if (!wanted_ids(tgid, tid, kthread))
		return false;
	if (filter_by_cgroup && !in_cgroups(t))
		return false;
	return true;
}

/* ... and on the block (--state), the cgroups looked at last. */
static __always_inline bool wanted(struct task_struct *t, __u32 tgid, __u32 tid, bool kthread,
				   __u32 state)
{
	if (!wanted_ids(tgid, tid, kthread))
		return false;
	if (filter_by_state) {
		/* As bcc: 0 means exactly TASK_RUNNING (preempted), any
		 * other value is a mask of state bits. */
		if (state_mask == 0 ? state != 0 : !(state & state_mask))
			return false;
	}
	if (filter_by_cgroup && !in_cgroups(t))
		return false;
	return true;
}

/* A new thread's record (read-only data, not the stack: the hooks of
 * raw_tp and the kprobe would pass the BPF stack limit of 6.1). */
const struct task_data new_task_data = {};

static __always_inline struct task_data *get_data(struct task_struct *t, __u32 tid,
						  bool trusted, bool create)
{

	if (trusted)
		return bpf_task_storage_get(&task_data_storage, t, 0,
					    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (create) {
		struct task_data *d = bpf_map_lookup_elem(&task_data_by_tid, &tid);

		if (d)
			return d;
		bpf_map_update_elem(&task_data_by_tid, &tid, &new_task_data, BPF_NOEXIST);
	}
	return bpf_map_lookup_elem(&task_data_by_tid, &tid);
}

/* When `t`'s process started: with its pid, who it is. */
static __always_inline __u64 process_start(struct task_struct *t)
{
	return BPF_CORE_READ(t, group_leader, start_boottime);
}

static __always_inline bool send_event(struct task_struct *t, __u32 tgid, __u32 tid, __u32 kind)
{
	struct task_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count(CNT_EVENTS_DROPPED);
		return false;
	}
	e->tgid = tgid;
	e->pid = tid;
	e->kind = kind;
	e->parent = 0;
	e->map_start = 0;
	e->map_count = 0;
	e->process_start = process_start(t);
	e->mm = address_space(t, &e->exec_vm);
	bpf_ringbuf_submit(e, 0);
	return true;
}

/*
 * Tells userspace to snapshot the mappings of `t`'s process, the first time
 * the thread blocks and again once its address space or the size of its
 * executable mappings has changed (exec, the dynamic loader, dlopen).
 */
static __always_inline void notify_new_mappings(struct task_struct *t, struct task_data *d,
						__u32 tgid, __u32 tid)
{
	struct mm_struct *mm = BPF_CORE_READ(t, mm);
	__u64 exec_vm;

	/* No address space: the task is exiting (exit_mm() has run), and
	 * there is nothing new to snapshot. */
	if (!mm)
		return;
	exec_vm = BPF_CORE_READ(mm, exec_vm);
	if (d->notified_mm == (__u64)mm && d->notified_exec_vm == exec_vm)
		return;
	/* Only past the check above: every switch-out gets there. */
	struct notified *p, now = { .start = process_start(t), .mm = (__u64)mm, .exec_vm = exec_vm };
	__u32 kind = TASK_EVENT_NEW;

	/* Another thread of the process may have told it already. */
	p = bpf_map_lookup_elem(&notified_procs, &tgid);
	if (p && p->start == now.start) {
		if (p->mm == now.mm && p->exec_vm == now.exec_vm) {
			d->notified_mm = now.mm;
			d->notified_exec_vm = now.exec_vm;
			return;
		}
		kind = TASK_EVENT_CHANGED;
	}
	/* A notice the ring buffer had no room for is sent again at the
	 * thread's next block. */
	if (!send_event(t, tgid, tid, kind))
		return;
	bpf_map_update_elem(&notified_procs, &tgid, &now, BPF_ANY);
	d->notified_mm = now.mm;
	d->notified_exec_vm = now.exec_vm;
}

/*
 * `t` is switched out for the last time.  If no thread of its process is
 * left alive (signal->live, decremented by each exiting thread, is 0), the
 * process is gone: userspace can give back its unwind tables and snapshot.
 */
static __always_inline void notify_exit(struct task_struct *t, __u32 tgid, __u32 tid)
{
	/* Processes not traced are told of only if a thread of theirs woke
	 * a traced one (--wakers). */
	if (filter_by_tgid && !bpf_map_lookup_elem(&tgids, &tgid) &&
	    !bpf_map_lookup_elem(&notified_procs, &tgid))
		return;
	if (filter_by_cgroup && !bpf_map_lookup_elem(&notified_procs, &tgid) && !in_cgroups(t))
		return;
	if (BPF_CORE_READ(t, signal, live.counter) == 0) {
		bpf_map_delete_elem(&notified_procs, &tgid);
		send_event(t, tgid, tid, TASK_EVENT_EXITED);
	}
}

/*
 * A new process (not a thread) was forked: it has a copy of its parent's
 * address space, with the same mappings at the same addresses until it
 * execs or maps something, so its parent's unwind tables hold for it from
 * its first instruction.  It gets an entry that points at its parent's
 * slice of unwind_maps, for its own address space (the mm check of
 * tables_of() makes the entry stale at an exec), and userspace is told, so
 * that the slice is kept while either process uses it.  Without that
 * notice (ring buffer full) the child gets no entry: its first blocks are
 * then handled as any new process's.  The fork hook runs before the child
 * is first woken, so the notice comes before anything the child does.
 */
static __always_inline void on_fork(struct task_struct *parent, struct task_struct *child,
				    bool trusted)
{
	__u32 ptgid = TASK_READ(trusted, parent, tgid);
	__u32 ctgid = TASK_READ(trusted, child, tgid);
	struct unwind_proc *p, c = {};
	struct task_event *e;
	__u64 pmm, cmm, pexec_vm, cexec_vm;

	if (ptgid == ctgid || kernel_threads_only)
		return;
	if (filter_by_tgid && !bpf_map_lookup_elem(&tgids, &ctgid))
		return;
	if (filter_by_tid && !bpf_map_lookup_elem(&tids, &ctgid))
		return;
	if (filter_by_cgroup && !in_cgroups(child))
		return;
	pmm = address_space(parent, &pexec_vm);
	cmm = address_space(child, &cexec_vm);
	p = bpf_map_lookup_elem(&unwind_procs, &ptgid);
	if (!p)
		return;
	/* Tables of other mappings (an exec, a library mapped since they
	 * were written), or a child without an address space. */
	if (!cmm || !pmm || (p->mm && (p->mm != pmm || p->exec_vm != pexec_vm)))
		return;
	c.map_start = p->map_start;
	c.map_count = p->map_count;
	c.mm = cmm;
	c.exec_vm = cexec_vm;
	c.gen = p->gen;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CNT_EVENTS_DROPPED);
		return;
	}
	e->tgid = ctgid;
	e->pid = ctgid;
	e->kind = TASK_EVENT_FORKED;
	e->parent = ptgid;
	e->map_start = c.map_start;
	e->map_count = c.map_count;
	e->process_start = BPF_CORE_READ(child, start_boottime);
	e->mm = cmm;
	e->exec_vm = cexec_vm;
	if (bpf_map_update_elem(&unwind_procs, &ctgid, &c, BPF_ANY)) {
		bpf_ringbuf_discard(e, 0);
		return;
	}
	/* The child's memory is a copy of its parent's: its interpreter, if
	 * it has one, is where the parent's is.  Only with the event, which
	 * tells userspace whose code objects the child's frames name. */
	if (python_on) {
		struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &ptgid);

		__u32 word = ctgid >> 6;
		__u64 *bits = bpf_map_lookup_elem(&py_pids, &word);

		if (pp && (pp->mm == pmm || !pp->mm) && bits) {
			struct py_proc cp = *pp;

			cp.mm = cmm;
			if (!bpf_map_update_elem(&py_procs, &ctgid, &cp, BPF_ANY))
				__sync_fetch_and_or(bits, 1ULL << (ctgid & 63));
		}
	}
	bpf_ringbuf_submit(e, 0);
	count(CNT_UNWIND_FORKED);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(process_fork_btf, struct task_struct *parent, struct task_struct *child)
{
	on_fork(parent, child, true);
	return 0;
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(process_fork_raw, struct task_struct *parent, struct task_struct *child)
{
	on_fork(parent, child, false);
	return 0;
}

/*
 * Programs for kernels before 5.17 (`legacy`, see the end of this file) use
 * only what Linux 5.10 has: no bpf_loop (user stacks through frame
 * pointers), no task-local storage for tracing programs (the per-thread
 * hash map), no atomic exchange (5.12).  They need none: while the hooks
 * are attached, a thread's start_ns is written only by its own switches,
 * which the scheduler orders, and by the start iterator only when it
 * creates the thread's record (BPF_NOEXIST: whoever creates it first wins,
 * see start_task); the end iterator runs once the hooks are detached, and
 * -i (the cut iterator) is refused there.
 */
static __always_inline __u64 swap_u64(__u64 *p, __u64 v, bool legacy)
{
	__u64 old;

	if (!legacy)
		return __sync_lock_test_and_set(p, v);
	old = *p;
	*p = v;
	return old;
}

static __always_inline __u64 swap_start(struct task_data *d, __u64 v, bool legacy)
{
	return swap_u64(&d->start_ns, v, legacy);
}

static __always_inline void close_unseen_block(struct task_struct *prev, struct task_data *d,
					       __u32 tid, __u64 now, bool unseen, bool legacy);
static __noinline void run_ends(struct task_struct *t, __u32 tid, __u64 now, bool trusted);
static __noinline void run_ends_legacy(struct task_struct *t, __u32 tid, __u64 now);

/*
 * `prev` is switched out.  `trusted`: prev is a BTF pointer usable with task
 * storage; `stacks_now`: prev is current, so its stacks are taken now.
 */
static __always_inline void on_switch_out(void *ctx, struct task_struct *prev, bool preempt,
					  __u64 now, bool trusted, bool stacks_now, bool legacy,
					  long prev_state)
{
	__u32 tid = TASK_READ(trusted, prev, pid);
	__u32 tgid = TASK_READ(trusted, prev, tgid);
	__u32 state = preempt ? 0 : task_state(prev, trusted);
	bool kthread = is_kthread(prev, trusted);
	struct task_data *d;

	bool state_guessed = false;

	/* A wake-up from another CPU may already have begun (TASK_WAKING):
	 * the state it blocked in is then the one the scheduler read, which
	 * the tracepoint passes where it can.  (The thread's own state is
	 * read first: where a pending signal kept it runnable, the kernels
	 * before 6.13 pass the state it meant to sleep in.)  Elsewhere it
	 * is gone: an I/O wait still says so, anything else is taken as a
	 * sleep and counted. */
	if (state & TASK_WAKING) {
		if (prev_state >= 0) {
			state = prev_state;
		} else {
			state_guessed = !BPF_CORE_READ_BITFIELD_PROBED(prev, in_iowait);
			state = state_guessed ? TASK_INTERRUPTIBLE : TASK_UNINTERRUPTIBLE;
		}
	}

	d = get_data(prev, tid, trusted, false);
	if (d && d->start_ns > START_SEEN)
		close_unseen_block(prev, d, tid, now, true, legacy);
	/* (The kprobe's hook does it itself: see run_switch.) */
	if (on_cpu_on && tid && stacks_now) {
		if (legacy)
			run_ends_legacy(prev, tid, now);
		else
			run_ends(prev, tid, now, trusted);
	}
	if (state & TASK_DEAD) {
		if (!trusted)
			bpf_map_delete_elem(&task_data_by_tid, &tid);
		if (on_cpu_on && !trusted)
			bpf_map_delete_elem(&run_by_tid, &tid);
		if (notify_new_tasks && !kthread)
			notify_exit(prev, tgid, tid);
		return;
	}
	if (!wanted(prev, tgid, tid, kthread, state))
		return;
	if (trace_end_ns && now >= trace_end_ns)
		return;
	if (state_guessed && (want_states || filter_by_state))
		count(CNT_STATE_GUESSED);

	d = get_data(prev, tid, trusted, true);
	if (!d) {
		count(CNT_NO_TASK_STORAGE);
		return;
	}
	if (want_states || want_wakers) {
		d->wake_ns = 0;
		d->state = offcpu_state(prev, state);
	}
	d->block_ns = now;
	d->start_ns = now;
	d->user_stack_id = STACK_ID_NONE;
	d->kernel_stack_id = STACK_ID_NONE;
	/* Without stacks_now the stacks are taken at switch-in; a block still
	 * in progress when tracing ends has none. */
	if (want_user_stack && !kthread)
		d->user_stack_id = stacks_now ? stack_of_current(ctx, true, legacy, trusted, now)
					      : STACK_ID_MISSED_ERROR;
	/* With its Python frames, where its process has an interpreter
	 * known (else see python_refresh). */
	if (!legacy && want_user_stack && stacks_now && python_on && py_any)
		d->user_stack_id = python_stack_of_current(d->user_stack_id, tgid);
	if (want_kernel_stack)
		d->kernel_stack_id = stacks_now ? stack_of_current(ctx, false, legacy, false, 0)
						  : STACK_ID_MISSED_ERROR;

	if (notify_new_tasks && !kthread)
		notify_new_mappings(prev, d, tgid, tid);
}

/*
 * How a block counts.  With --sample, a block shorter than sample_ns is
 * taken with probability (its length / sample_ns), as Go's block profile
 * does; one taken counts as sample_ns long (each part of it scaled alike)
 * and as sample_ns / length blocks, rounded up or down at random so that
 * the expected count is 1: totals of time and of blocks stay unbiased.
 * Longer blocks are always taken, as they are.
 */
struct weight {
	/* The length the block was taken at, or 0: counted as it is. */
	__u64 seen;
	/* The blocks it counts for. */
	__u64 blocks;
};

static __always_inline void add_block(struct offcpu_key *key, __u64 delta,
				      const struct weight *wt)
{
	struct offcpu_val *v, init = {};
	int err;

	/* delta <= seen < sample_ns <= 1 s: no overflow. */
	if (wt->seen)
		delta = delta * sample_ns / wt->seen;
	v = bpf_map_lookup_elem(&counts, key);
	if (!v) {
		err = bpf_map_update_elem(&counts, key, &init, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			count(CNT_COUNTS_FULL);
			return;
		}
		v = bpf_map_lookup_elem(&counts, key);
		if (!v)
			return;
	}
	__sync_fetch_and_add(&v->total_ns, delta);
	__sync_fetch_and_add(&v->count, wt->blocks);
}

/* --sample: whether a block `seen` long is taken, and its weight. */
static __always_inline bool sample_block(__u64 seen, struct weight *wt)
{
	__u64 t = sample_ns, rest;

	wt->seen = 0;
	wt->blocks = 1;
	if (!t || seen >= t)
		return true;
	/* Taken with probability seen / t, to 2^-32 (seen < t <= 2^30). */
	if (!seen || bpf_get_prandom_u32() >= (__u32)((seen << 32) / t)) {
		count(CNT_SAMPLED_OUT);
		return false;
	}
	count(CNT_SAMPLED_SHORT);
	wt->seen = seen;
	wt->blocks = t / seen;
	rest = t % seen;
	if (rest && bpf_get_prandom_u32() < (__u32)((rest << 32) / seen))
		wt->blocks++;
	return true;
}

/* Whether the block `start` says began before the window (claimed by the
 * start iterator): its stacks and state are start_*. */
static __always_inline bool began_before_window(__u64 start)
{
	return start == START_AT_WINDOW || (start & START_CUT_AT_WINDOW);
}

/* Where the part of the block not counted yet begins. */
static __always_inline __u64 counted_from(__u64 start)
{
	if (start & START_CUT)
		return start & ~START_CUT_FLAGS;
	return start == START_AT_WINDOW ? trace_start_ns : start;
}

/*
 * The part of a block not counted yet, from `start` (a switch-out time,
 * START_AT_WINDOW, or an interval's end with START_CUT) to `now`, that lies
 * inside the window: [*from, *to).  False if there is none, or if the block
 * does not pass -m/-M.  `ended`: the block ends at `now`.  The filters see
 * the whole block where it is known, even beyond the window; a block under
 * way since before the hook was attached, or still under way at the end (of
 * the window or of an interval), is only known to be at least as long as
 * what was seen of it: it passes -m once that part does, and with -M it can
 * never be known to pass.  Then --sample decides on the same length, and
 * `wt` says how the part counts.
 */
static __always_inline bool block_part(struct task_data *d, __u64 start, __u64 now, bool ended,
				       __u64 *from, __u64 *to, struct weight *wt)
{
	__u64 w = trace_start_ns, end = trace_end_ns, began, seen, f;
	bool before = began_before_window(start);

	if (start <= START_SEEN || !w)
		return false;
	f = counted_from(start);
	*from = f > w ? f : w;
	*to = end && now > end ? end : now;
	if (*to <= *from)
		return false;
	began = before ? w : (start & START_CUT) ? d->block_ns : start;
	seen = now > began ? now - began : 0;
	if (seen < min_block_ns)
		return false;
	if (ended && !before ? seen > max_block_ns : max_block_ns != ~0ULL)
		return false;
	return sample_block(seen, wt);
}

/*
 * Adds [from, to) under `key`; with -i, split at the intervals' ends: the
 * part in the first interval, the whole intervals between as one entry of
 * `span` intervals, the part in the last.
 */
static __always_inline void add_span(struct offcpu_key *key, __u64 from, __u64 to,
				     const struct weight *wt)
{
	__u64 w = trace_start_ns, len = interval_ns, first, last, whole;

	if (!len) {
		add_block(key, to - from, wt);
		return;
	}
	first = (from - w) / len;
	last = (to - 1 - w) / len;
	key->span = 1;
	key->interval = first;
	if (first == last) {
		add_block(key, to - from, wt);
		return;
	}
	add_block(key, w + (first + 1) * len - from, wt);
	if (last > first + 1) {
		whole = last - first - 1;
		key->interval = first + 1;
		key->span = whole;
		add_block(key, whole * len, wt);
		key->span = 1;
	}
	key->interval = last;
	add_block(key, to - (w + last * len), wt);
}

/*
 * Adds [from, to) of a block under `key`.  With --states, under the state
 * the thread blocked in (`state`) until its wake-up, and under
 * OFFCPU_STATE_RUNQUEUE from then on.  `ended`: the block ends at `to`.
 */
static __always_inline void add_block_parts(struct offcpu_key *key, struct task_data *d,
					    __u32 state, __u64 from, __u64 to, bool ended,
					    const struct weight *wt)
{
	__u64 wake;

	if (want_wakers) {
		if (state == OFFCPU_STATE_RUNQUEUE)
			key->waker_id = WAKER_ID_PREEMPTED;
		else if (d->waker_id)
			key->waker_id = d->waker_id;
		else
			key->waker_id = ended ? WAKER_ID_UNSEEN : WAKER_ID_NOT_WOKEN;
	}

	if (!want_states) {
		add_span(key, from, to, wt);
		return;
	}
	wake = d->wake_ns;
	key->state = state;
	if (ended && state != OFFCPU_STATE_RUNQUEUE && !wake)
		count(CNT_UNWOKEN);
	if (state != OFFCPU_STATE_RUNQUEUE && wake) {
		if (wake <= from) {
			key->state = OFFCPU_STATE_RUNQUEUE;
		} else if (wake < to) {
			add_span(key, from, wake, wt);
			key->state = OFFCPU_STATE_RUNQUEUE;
			from = wake;
		}
	}
	add_span(key, from, to, wt);
}

/* The stacks and state a block under way was claimed with: the start
 * iterator's for one under way at the window's start, else its
 * switch-out's. */
static __always_inline __u32 claimed_stacks(struct offcpu_key *key, struct task_data *d,
					   __u64 start)
{
	if (began_before_window(start)) {
		key->user_stack_id = d->start_user_stack_id;
		key->kernel_stack_id = d->start_kernel_stack_id;
		return d->start_state;
	}
	key->user_stack_id = d->user_stack_id;
	key->kernel_stack_id = d->kernel_stack_id;
	return d->state;
}

static __always_inline void fill_key(struct offcpu_key *key, struct task_struct *t, __u32 tid,
				     bool trusted)
{
	key->tgid = TASK_READ(trusted, t, tgid);
	key->pid = tid;
	key->process_start = process_start(t);
	BPF_CORE_READ_STR_INTO(&key->comm, t, comm);
}

/*
 * --on-cpu.  A thread's running time is counted exactly, from the switches
 * (its switch-in to its switch-out, clipped to the window, split at the
 * intervals' ends), under one entry per thread: state OFFCPU_STATE_RUNNING,
 * stacks STACK_ID_RUN_TOTAL.  The samples taken on the CPU (on_cpu_sample)
 * are counted under the same state with their stacks, and userspace
 * divides the exact time between them.
 */
static __always_inline struct run_data *get_run(struct task_struct *t, __u32 tid, bool trusted,
						bool create)
{
	struct run_data *r;

	if (trusted)
		return bpf_task_storage_get(&run_storage, t, 0,
					    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	r = bpf_map_lookup_elem(&run_by_tid, &tid);
	if (r || !create)
		return r;
	/* Zeroed: RUN_UNSEEN. */
	bpf_map_update_elem(&run_by_tid, &tid, &new_task_data, BPF_NOEXIST);
	return bpf_map_lookup_elem(&run_by_tid, &tid);
}


/* The part in the window of a run that began at `since` (a time, or
 * RUN_UNSEEN / RUN_AT_WINDOW: at the window's start) and ends at `now`,
 * added to the thread's running time.  The cgroups are looked at here, where
 * there is time to add: not at every switch-in. */
static __noinline void add_run(struct task_struct *t, __u32 tid, __u64 since, __u64 now)
{
	struct offcpu_key key = {};
	struct weight wt = { .seen = 0, .blocks = 1 };
	__u64 w = trace_start_ns, end = trace_end_ns, from, to;

	if (since == RUN_OFF || !w)
		return;
	from = since == RUN_UNSEEN || since == RUN_AT_WINDOW || since < w ? w : since;
	to = end && now > end ? end : now;
	if (to <= from)
		return;
	if (filter_by_cgroup && !in_cgroups(t))
		return;
	fill_key(&key, t, tid, false);
	key.state = OFFCPU_STATE_RUNNING;
	key.user_stack_id = STACK_ID_RUN_TOTAL;
	key.kernel_stack_id = STACK_ID_RUN_TOTAL;
	add_span(&key, from, to, &wt);
}

/* `t` is switched in: its run begins.  Not inlined: the hooks' own frames
 * are near 6.1's limit of a call chain's stack. */
static __always_inline void run_begins_as(struct task_struct *t, __u32 tid, __u64 now,
					  bool trusted)
{
	struct run_data *r;

	if (!wanted_ids(TASK_READ(trusted, t, tgid), tid, is_kthread(t, trusted)))
		return;
	r = get_run(t, tid, trusted, true);
	if (!r) {
		count(CNT_NO_TASK_STORAGE);
		return;
	}
	r->since = now;
}

/* Apart by the map they use: the legacy programs have no task storage. */
static __noinline void run_begins(struct task_struct *t, __u32 tid, __u64 now)
{
	run_begins_as(t, tid, now, true);
}

static __noinline void run_begins_by_tid(struct task_struct *t, __u32 tid, __u64 now)
{
	run_begins_as(t, tid, now, false);
}

static __always_inline bool is_cfs(struct task_struct *t);

/* `t` is switched out: its run ends, if the ids keep it.  A run whose
 * switch-in the tracepoint did not report (see close_unseen_block) began
 * when CFS last picked the thread. */
static __always_inline void run_ends_as(struct task_struct *t, __u32 tid, __u64 now,
					bool trusted, bool legacy)
{
	struct run_data *r;
	__u64 since, ran;

	/* The ids looked at here, not in the hook: its frame is near 6.1's
	 * limit of a call chain's stack. */
	if (!wanted_ids(BPF_CORE_READ(t, tgid), tid, is_kthread(t, false)))
		return;
	r = get_run(t, tid, trusted, true);
	if (!r) {
		count(CNT_NO_TASK_STORAGE);
		return;
	}
	since = swap_u64(&r->since, RUN_OFF, legacy);
	if (since == RUN_OFF) {
		ran = BPF_CORE_READ(t, se.sum_exec_runtime) -
		      BPF_CORE_READ(t, se.prev_sum_exec_runtime);
		if (!is_cfs(t) || ran >= now - RUN_AT_WINDOW) {
			count(CNT_ONCPU_UNTIMED);
			return;
		}
		since = now - ran;
	}
	add_run(t, tid, since, now);
}

/* Apart for the legacy programs: 5.10 refuses a program that holds an
 * atomic exchange, even one it could never run. */
static __noinline void run_ends(struct task_struct *t, __u32 tid, __u64 now, bool trusted)
{
	run_ends_as(t, tid, now, trusted, false);
}

static __noinline void run_ends_legacy(struct task_struct *t, __u32 tid, __u64 now)
{
	run_ends_as(t, tid, now, false, true);
}

/* The kprobe's switch, `prev` out and the current task in, in one call:
 * two from its hook would make its frame pass 6.1's limit of a call
 * chain's stack. */
static __always_inline void run_switch_as(struct task_struct *prev, struct task_struct *curr,
					  __u64 now, bool legacy)
{
	__u32 tid = BPF_CORE_READ(prev, pid);

	if (tid) {
		if (legacy)
			run_ends_legacy(prev, tid, now);
		else
			run_ends(prev, tid, now, false);
	}
	tid = BPF_CORE_READ(curr, pid);
	if (tid)
		run_begins_by_tid(curr, tid, now);
}

static __noinline void run_switch(struct task_struct *prev, struct task_struct *curr, __u64 now)
{
	run_switch_as(prev, curr, now, false);
}

/* (5.10 refuses the atomic exchange of run_ends even unreached.) */
static __noinline void run_switch_legacy(struct task_struct *prev, struct task_struct *curr,
					 __u64 now)
{
	run_switch_as(prev, curr, now, true);
}

/* The start iterator found `t` on a CPU: unless a switch was seen since
 * the hooks were attached, it has run since before the window. */
static __always_inline void run_at_start(struct task_struct *t, __u32 tid, bool trusted,
					 bool legacy)
{
	struct run_data *r, at = { .since = RUN_AT_WINDOW };

	if (!wanted_ids(BPF_CORE_READ(t, tgid), tid, is_kthread(t, false)))
		return;
	if (legacy) {
		bpf_map_update_elem(&run_by_tid, &tid, &at, BPF_NOEXIST);
		return;
	}
	r = get_run(t, tid, trusted, true);
	if (r)
		__sync_val_compare_and_swap(&r->since, RUN_UNSEEN, RUN_AT_WINDOW);
}

/* The end iterator: a run under way when the hooks were detached is
 * counted up to the window's end. */
static __always_inline void run_at_end(struct task_struct *t, __u32 tid, bool trusted,
				       bool legacy)
{
	struct run_data *r = get_run(t, tid, trusted, false);
	__u64 since;

	if (!r)
		return;
	since = swap_u64(&r->since, RUN_OFF, legacy);
	if (since > RUN_OFF)
		add_run(t, tid, since, trace_end_ns);
}

/* -i: a run under way at an interval's end `cut` is counted up to it, and
 * from it on from then. */
static __always_inline void run_cut(struct task_struct *t, __u32 tid, __u64 cut, bool trusted)
{
	struct run_data *r = get_run(t, tid, trusted, false);
	__u64 since, from;

	if (!r)
		return;
	since = r->since;
	if (since <= RUN_OFF)
		return;
	from = since == RUN_AT_WINDOW ? trace_start_ns : since;
	if (from >= cut || __sync_val_compare_and_swap(&r->since, since, cut) != since)
		return;
	add_run(t, tid, since, cut);
}

/*
 * `next` is switched in.  `next_is_current`: we run in next's own context
 * (finish_task_switch), so its stacks are taken now; otherwise they were
 * taken at switch-out (or by the start iterator).
 */
static __always_inline void on_switch_in(void *ctx, struct task_struct *next, __u64 now,
					 bool trusted, bool next_is_current, bool legacy)
{
	__u32 tid = TASK_READ(trusted, next, pid);
	bool starting = !trace_start_ns;
	struct offcpu_key key = {};
	struct weight wt;
	struct task_data *d;
	__u64 start, from, to;
	__u32 state;
	bool kthread;

	if (tid == 0)
		return;
	if (on_cpu_on && !next_is_current) {
		if (trusted)
			run_begins(next, tid, now);
		else
			run_begins_by_tid(next, tid, now);
	}
	/* Until the window starts every switch-in of a thread traced is
	 * noted, so that the start iterator cannot take it for one blocked
	 * since before the hook was attached. */
	if (starting)
		starting = wanted_thread(next, TASK_READ(trusted, next, tgid), tid,
					  is_kthread(next, trusted));
	d = get_data(next, tid, trusted, starting);
	if (!d)
		return;
	/* Claimed here or by the end or cut iterator, never both. */
	start = swap_start(d, starting ? START_SEEN : 0, legacy);
	if (!block_part(d, start, now, true, &from, &to, &wt)) {
		if (want_wakers)
			d->waker_id = 0;
		return;
	}

	fill_key(&key, next, tid, trusted);
	kthread = is_kthread(next, trusted);
	if (kthread)
		count(CNT_KTHREAD_BLOCKS);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, d, start);
	if (next_is_current) {
		if (want_user_stack)
			key.user_stack_id =
				kthread ? STACK_ID_NONE
					: stack_of_current(ctx, true, legacy, trusted,
							   USED_READ_CLOCK);
		/* (A kernel thread's STACK_ID_NONE is left as it is.) */
		if (!legacy && want_user_stack && python_on && py_any)
			key.user_stack_id = python_stack_of_current(key.user_stack_id, key.tgid);
		if (want_kernel_stack)
			key.kernel_stack_id = stack_of_current(ctx, false, legacy, false, 0);
	}
	add_block_parts(&key, d, state, from, to, true, &wt);
	if (want_wakers)
		d->waker_id = 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, true, true, false,
		      switch_has_prev_state ? (long)(__u32)ctx[3] : -1);
	on_switch_in(ctx, next, now, true, false, false);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, false, true, false,
		      switch_has_prev_state ? (long)(__u32)ctx[3] : -1);
	on_switch_in(ctx, next, now, false, false, false);
	return 0;
}

/*
 * finish_task_switch(prev) runs in the context of the task switched in, so
 * its stacks are read directly (kernel stack starting at finish_task_switch,
 * no profiler frames) and only for blocks that pass -m/-M.
 */
SEC("kprobe/finish_task_switch")
int BPF_KPROBE(finish_task_switch_kprobe, struct task_struct *prev)
{
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *curr = (struct task_struct *)bpf_get_current_task();

	/* A kprobe does not see the preempt flag: a preempted task's state
	 * is TASK_RUNNING (0) anyway, as bcc relies on. */
	on_switch_out(ctx, prev, false, now, false, false, false, -1);
	on_switch_in(ctx, curr, now, false, true, false);
	if (on_cpu_on)
		run_switch(prev, curr, now);
	return 0;
}

/*
 * --on-cpu: a cpu-clock perf event on every CPU runs this at its rate
 * (-F).  The task it interrupted, if traced, is sampled: its kernel stack
 * from the interrupted registers, its user stack from those saved at its
 * entry to the kernel (or interrupted in user mode), walked as at a
 * switch-out but without the stack cache, whose kept walk is for the next
 * block.  A sample only counts (the `count` of its entry): the thread's
 * time comes from its switches (add_run).  The hooks and the wake-up hooks
 * run with interrupts disabled, so this never runs inside one on the same
 * CPU and their per-CPU scratch is its own; the iterators use theirs.
 */
static __always_inline void on_cpu_sample(void *ctx, bool legacy)
{
	struct task_struct *t = legacy ? (struct task_struct *)bpf_get_current_task()
				       : bpf_get_current_task_btf();
	__u64 now = bpf_ktime_get_ns(), w = trace_start_ns, end = trace_end_ns;
	struct offcpu_key key = {};
	struct offcpu_val *v, init = {};
	__u32 tid, tgid;
	bool kthread;
	int err;

	tid = TASK_READ(!legacy, t, pid);
	if (tid == 0)
		return;
	tgid = TASK_READ(!legacy, t, tgid);
	kthread = is_kthread(t, !legacy);
	if (!wanted_thread(t, tgid, tid, kthread))
		return;
	if (!w || now < w || (end && now >= end)) {
		count(CNT_ONCPU_OUTSIDE);
		return;
	}
	fill_key(&key, t, tid, !legacy);
	key.state = OFFCPU_STATE_RUNNING;
	key.span = 1;
	if (interval_ns)
		key.interval = (now - w) / interval_ns;
	if (want_user_stack && !kthread) {
		key.user_stack_id = stack_of_current(ctx, true, legacy, false, now);
		if (!legacy && python_on && py_any)
			key.user_stack_id = python_stack_of_current(key.user_stack_id, tgid);
	}
	if (want_kernel_stack)
		key.kernel_stack_id = stack_of_current(ctx, false, legacy, false, 0);
	count(CNT_ONCPU_SAMPLES);
	v = bpf_map_lookup_elem(&counts, &key);
	if (!v) {
		err = bpf_map_update_elem(&counts, &key, &init, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			count(CNT_COUNTS_FULL);
			return;
		}
		v = bpf_map_lookup_elem(&counts, &key);
		if (!v)
			return;
	}
	__sync_fetch_and_add(&v->count, 1);
}

SEC("perf_event")
int on_cpu(void *ctx)
{
	on_cpu_sample(ctx, false);
	return 0;
}

/* Before 5.17 (see the legacy programs at the end): frame pointers. */
SEC("perf_event")
int on_cpu_legacy(void *ctx)
{
	on_cpu_sample(ctx, true);
	return 0;
}

/*
 * --states: `p` is woken.  Its open block is split here: from now on it
 * waits for a CPU.  The tracepoint runs with p's run queue locked, after p
 * was switched out, so the block it sees is the one the wake-up ends.
 */
static __always_inline void on_wakeup(struct task_struct *p, bool trusted)
{
	__u32 tid = BPF_CORE_READ(p, pid);
	struct task_data *d;

	if (tid == 0)
		return;
	d = get_data(p, tid, trusted, false);
	if (!d || d->start_ns <= START_SEEN || d->wake_ns)
		return;
	d->wake_ns = bpf_ktime_get_ns();
	count(CNT_WAKEUPS);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup_btf, struct task_struct *p)
{
	on_wakeup(p, true);
	return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(sched_wakeup_raw, struct task_struct *p)
{
	on_wakeup(p, false);
	return 0;
}

/*
 * Whether a kernel stack (`nr` frames at `ips`, innermost first) is that of
 * an interrupt or a softirq rather than of the current task: one of its
 * frames is in a hardware interrupt's entry (x86-64's asm_common_interrupt
 * and asm_sysvec_* stubs, which lie together) or where softirqs are run.
 * Userspace gives both address ranges (0 where kallsyms hides them: then
 * it tells by the frames' names).
 */
static __always_inline bool interrupt_stack(__u64 *ips, long nr)
{
	int i;

	for (i = 0; i < MAX_INTERRUPT_SCAN; i++) {
		__u64 ip;

		if (i >= nr)
			break;
		ip = ips[i];
		if ((ip >= irq_entry_start && ip < irq_entry_end) ||
		    (ip >= softirq_start && ip < softirq_end))
			return true;
	}
	return false;
}

/*
 * Store `w` in `wakers` (unless already there) and return its id, or
 * WAKER_ID_MISSED_FULL.
 */
static __always_inline __u64 store_waker(struct waker_info *w)
{
	__u64 h = 0xcbf29ce484222325ULL, *words = (__u64 *)w;
	int i, err;

	for (i = 0; i < sizeof(*w) / sizeof(__u64); i++) {
		h ^= words[i];
		h *= 0x100000001b3ULL;
		h ^= h >> 32;
	}
	h |= STACK_ID_HASH_BIT;
	if (bpf_map_lookup_elem(&wakers, &h))
		return h;
	err = bpf_map_update_elem(&wakers, &h, w, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count(CNT_WAKERS_FULL);
		return WAKER_ID_MISSED_FULL;
	}
	return h;
}

/*
 * --wakers: `p` is being woken, in the context of the task that wakes it
 * (current).  Only a wake-up that ends a block is kept: p is off its run
 * queue (it blocked, or is blocking on another CPU right now, its
 * switch-out about to be seen).  The kernel serializes wakers of a task,
 * and only the first finds it asleep: one waker per block.  From an
 * interrupt, current is whatever task was interrupted; userspace tells
 * that from the kernel stack (an interrupt entry frame) and shows the
 * interrupt, not the task, as the waker.
 */
static __always_inline void on_waking(void *ctx, struct task_struct *p, bool trusted,
				      bool legacy)
{
	struct task_struct *waker = trusted ? bpf_get_current_task_btf()
					    : (struct task_struct *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = BPF_CORE_READ(p, pid);
	struct waker_info w = {};
	struct task_data *d, *wd;
	bool kthread, irq;
	__u32 zero = 0;
	__u64 *buf;
	long len;

	if (tid == 0 || BPF_CORE_READ(p, on_rq))
		return;
	d = get_data(p, tid, trusted, false);
	if (!d)
		return;
	/* The kernel stack always: it tells an interrupt from a task. */
	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return;
	len = bpf_get_stack(ctx, buf, clamp_stack_bytes(), 0);
	irq = len > 0 && interrupt_stack(buf, len / sizeof(__u64));
	w.kernel_stack_id = store_stack(len, false);
	if (irq) {
		/* Not the interrupted task's doing: no task, no user stack. */
		d->waker_id = store_waker(&w);
		count(CNT_WAKERS);
		return;
	}
	kthread = is_kthread(waker, false);
	w.tgid = id >> 32;
	w.pid = (__u32)id;
	w.process_start = process_start(waker);
	bpf_get_current_comm(&w.comm, sizeof(w.comm));
	if (want_user_stack && !kthread && w.pid)
		w.user_stack_id = stack_of_current(ctx, true, legacy, trusted, 0);
	if (!legacy && want_user_stack && python_on && py_any)
		w.user_stack_id = python_stack_of_current(w.user_stack_id, w.tgid);
	d->waker_id = store_waker(&w);
	count(CNT_WAKERS);
	/* The waker's process may be one that is not traced: its mappings
	 * are needed to name its user frames. */
	if (notify_new_tasks && !kthread && w.pid) {
		wd = get_data(waker, w.pid, trusted, true);
		if (wd)
			notify_new_mappings(waker, wd, w.tgid, w.pid);
	}
}

SEC("tp_btf/sched_waking")
int BPF_PROG(sched_waking_btf, struct task_struct *p)
{
	on_waking(ctx, p, true, false);
	return 0;
}

SEC("raw_tp/sched_waking")
int BPF_PROG(sched_waking_raw, struct task_struct *p)
{
	on_waking(ctx, p, false, false);
	return 0;
}

/*
 * `prev` is being switched out while its last block is still open: the
 * kernel put it on a CPU without the sched_switch tracepoint (seen on 6.18:
 * about one switch-in in a few hundred, for threads that sleep and wake
 * often; the kernel's own ftrace event is missing too).  The block ended
 * when its current run began, which CFS dates: its run time since it was
 * last picked.
 */
static __always_inline bool is_cfs(struct task_struct *t)
{
	__u32 policy = BPF_CORE_READ(t, policy);

	return policy == SCHED_NORMAL || policy == SCHED_BATCH || policy == SCHED_IDLE;
}

static __always_inline void close_unseen_block(struct task_struct *prev, struct task_data *d,
					       __u32 tid, __u64 now, bool unseen, bool legacy)
{
	struct offcpu_key key = {};
	struct weight wt;
	__u64 start, ran, in, from, to;
	__u32 state;

	start = swap_start(d, 0, legacy);
	if (start <= START_SEEN) {
		if (want_wakers)
			d->waker_id = 0;
		return;
	}
	if (unseen)
		count(CNT_UNSEEN_SWITCH_IN);
	ran = BPF_CORE_READ(prev, se.sum_exec_runtime) -
	      BPF_CORE_READ(prev, se.prev_sum_exec_runtime);
	in = now - ran;
	if (!is_cfs(prev) || ran > now || (start != START_AT_WINDOW && in < counted_from(start))) {
		count(CNT_UNSEEN_UNTIMED);
		return;
	}
	if (!block_part(d, start, in, true, &from, &to, &wt))
		return;
	fill_key(&key, prev, tid, false);
	if (is_kthread(prev, false))
		count(CNT_KTHREAD_BLOCKS);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, d, start);
	add_block_parts(&key, d, state, from, to, true, &wt);
	if (want_wakers)
		d->waker_id = 0;
}

/* The kernel stack of `task`, which is not running.  The kernel leaves out
 * the scheduler's own frames (those in .sched.text). */
static __always_inline __u64 kernel_stack_of_task(struct task_struct *task)
{
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&start_scratch, &zero);

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	return store_task_stack(bpf_get_task_stack(task, buf, clamp_stack_bytes(), 0), false);
}

/* The user stack of `task`, which is not running: with its process's
 * tables where it has them, else through frame pointers, as at a
 * switch-out.  Only from the sleepable start iterator. */
/*
 * Walks the user stack of `task` (blocked since before the start) through
 * the tables of the files its process maps, as user_stack_by_files() does
 * for the current task: its length in bytes, -1 where its registers
 * cannot be read, -2 where a file without tables was met.
 */
static __always_inline long unwind_task_by_files(struct task_struct *task, __u32 tgid)
{
	struct unwind_state u = {};
	struct file_scratch *s = file_scratch_of(true);
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	__u64 *ips;
	__u32 zero = 0, idx;

	if (!unwind_by_file || !bpf_core_field_exists(((struct mm_struct *)0)->mm_mt) || !s || !mm)
		return -2;
	if (read_user_regs(task, &u))
		return -1;
	u.task = task;
	u.max = clamp_stack_bytes() / sizeof(__u64);
	s->mm = mm;
	s->needs_tables = 0;
	s->used = 0;
	s->walk++;
	copy_stack(&u);
	bpf_loop(MAX_STACK_DEPTH, unwind_step_task_files, &u, 0);
	s = file_scratch_of(true);
	ips = bpf_map_lookup_elem(&start_scratch, &zero);
	if (!s || !ips || s->needs_tables)
		return -2;
	idx = u.nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		ips[idx & MAX_STACK_DEPTH] = 0;
	}
	count(CNT_UNWIND_DWARF);
	count(CNT_UNWIND_BY_FILE);
	COUNT_WALK(&u);
	send_mapped(mm, exec_vm, (__u64)tgid << 32 | BPF_CORE_READ(task, pid),
		    BPF_CORE_READ(task, group_leader, start_boottime), true);
	return u.nr * sizeof(__u64);
}

/* Whether the process of `task` has tables for its address space now. */
static __always_inline bool tables_ready(struct task_struct *task, __u32 tgid)
{
	__u64 exec_vm, mm = address_space(task, &exec_vm);

	return tables_of(tgid, mm, exec_vm) != NULL;
}

/*
 * The start iterator's copy of the user stack of a task blocked since
 * before the start whose process has no tables yet (it began as the
 * profiler attached): sent for userspace to walk, as defer_user_stack()
 * does for a switch-out, from a map of its own (the iterator may sleep,
 * and a switch hook on its CPU would reuse a per-CPU one).  Its id, or
 * STACK_ID_MISSED_ERROR (counted where the ring buffer had no room).
 * The process is told of, so that userspace knows the address space the
 * copy is of.
 */
#define START_DEFER_CPU 0x3fffffULL
__u64 start_deferred_seq = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct deferred_stack);
} start_deferred SEC(".maps");

static __always_inline __u64 defer_task_stack(struct task_struct *task, __u32 tgid)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	struct deferred_stack *d;
	__u32 zero = 0;
	__u64 base, len = 0;
	int i;

	d = bpf_map_lookup_elem(&start_deferred, &zero);
	if (!d || !regs)
		return STACK_ID_MISSED_ERROR;
	d->pc = regs->ip;
	d->sp = regs->sp;
	d->bp = regs->bp;
	d->ax = regs->ax;
	if (!d->pc || !d->sp)
		return STACK_ID_MISSED_ERROR;
	start_deferred_seq++;
	d->id = STACK_ID_DEFERRED_BIT | START_DEFER_CPU << 40 |
		(start_deferred_seq & ((1ULL << 40) - 1));
	d->tgid = tgid;
	d->pid = BPF_CORE_READ(task, pid);
	d->process_start = BPF_CORE_READ(task, group_leader, start_boottime);
	d->mm = address_space(task, &d->exec_vm);
	d->_pad = 0;
	base = d->sp & ~4095ULL;
	for (i = 0; i < DEFERRED_STACK_PAGES; i++) {
		if (bpf_copy_from_user_task(&d->bytes[i * 4096], 4096, (void *)(base + i * 4096),
					    task, 0))
			break;
		len += 4096;
	}
	d->len = len;
	if (bpf_ringbuf_output(&deferred_stacks, d, DEFERRED_HEADER_BYTES + len, 0)) {
		count(CNT_UNWIND_DEFER_LOST);
		return STACK_ID_MISSED_ERROR;
	}
	count(CNT_UNWIND_DEFERRED);
	send_event(task, tgid, d->pid, TASK_EVENT_NEW);
	return d->id;
}

static __always_inline __u64 user_stack_of_task(struct task_struct *task, __u32 tgid, bool defer)
{
	struct unwind_state u = {};
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&start_scratch, &zero);
	long len = -1;

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	if (!BPF_CORE_READ(task, mm))
		return STACK_ID_NONE;
	/* Reading another task's memory takes its mmap lock: if a writer
	 * holds it or waits for it (a thread stuck in a page fault on a hung
	 * file system, another in mmap), the iterator could wait as long, and
	 * the window never open.  Such a stack is not read. */
	if (BPF_CORE_READ(task, mm, mmap_lock.count.counter) & (RWSEM_WRITER_LOCKED | RWSEM_FLAG_WAITERS))
		return STACK_ID_NOT_READABLE;
	if (unwind_dwarf) {
		len = -2;
		if (!tables_ready(task, tgid))
			len = unwind_task_by_files(task, tgid);
		if (len == -2 && defer && !tables_ready(task, tgid))
			return defer_task_stack(task, tgid);
		if (len == -2)
			len = unwind_task(task, tgid);
	} else {
		if (read_user_regs(task, &u))
			return STACK_ID_MISSED_ERROR;
		u.task = task;
		len = walk_user(&u, true) * sizeof(__u64);
	}
	if (len < 0)
		return STACK_ID_MISSED_ERROR;
	if (len > 0)
		len = python_frames_of_task(task, tgid, len / sizeof(__u64)) * sizeof(__u64);
	return store_task_stack(len, true);
}

/*
 * The Python frames of a new CPython process's first blocks: its stacks
 * are walked at its threads' switch-outs before userspace has heard of it,
 * let alone read where its interpreter is.  Once it has, it lists the
 * process in py_refresh and runs this over every task: a thread of it
 * still in a block whose user stack was walked without its Python frames
 * has not run since, so its stack is as it was; it is walked again, now
 * with them, and the block takes that stack.  Only with the process's
 * tables or its files' (no frame-pointer guess replaces a stack); where
 * they are not ready yet, the next run tries again.
 */
SEC("iter.s/task")
int python_refresh(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct task_data *d;
	__u64 start, block, id;
	__u32 tgid, nr, more;
	long len;

	if (!task || !python_on)
		return 0;
	tgid = task->tgid;
	if (!bpf_map_lookup_elem(&py_refresh, &tgid))
		return 0;
	d = bpf_task_storage_get(&task_data_storage, task, 0, 0);
	if (!d || task->on_cpu)
		return 0;
	start = d->start_ns;
	block = d->block_ns;
	/* Its stack has Python frames already. */
	id = d->user_stack_id;
	if ((id & STACK_ID_HASH_BIT) && has_python_frames(id))
		return 0;
	/* A block of its own switch-out (not one claimed at the start). */
	if (start <= START_AT_WINDOW || (start & START_CUT_AT_WINDOW))
		return 0;
	if (!BPF_CORE_READ(task, mm) ||
	    (BPF_CORE_READ(task, mm, mmap_lock.count.counter) &
	     (RWSEM_WRITER_LOCKED | RWSEM_FLAG_WAITERS)))
		return 0;
	if (!unwind_dwarf) {
		struct unwind_state u = {};

		if (read_user_regs(task, &u))
			return 0;
		u.task = task;
		len = walk_user(&u, true) * sizeof(__u64);
	} else if (tables_ready(task, tgid)) {
		len = unwind_task(task, tgid);
	} else {
		len = unwind_task_by_files(task, tgid);
	}
	if (len <= 0)
		return 0;
	nr = len / sizeof(__u64);
	more = python_frames_of_task(task, tgid, nr);
	/* No Python frames found (yet): tried again at the next run. */
	if (more == nr)
		return 0;
	id = store_task_stack(more * sizeof(__u64), true);
	if (!(id & STACK_ID_HASH_BIT))
		return 0;
	/* Still the same block: the thread has not run meanwhile. */
	if (d->start_ns != start || d->block_ns != block || task->on_cpu)
		return 0;
	d->user_stack_id = id;
	count(CNT_PY_REFRESHED);
	return 0;
}

/*
 * The start iterator: every thread blocked (or waiting for a CPU) since
 * before the hook was attached, and not switched since, is claimed as
 * blocked from the window's start, with its stacks as the kernel keeps
 * them.  `user_stacks`: the kernel can read another task's user memory
 * (the sleepable iterator); else such blocks have no user stack.  Its last
 * call (no task) opens the window.
 */
static __always_inline void start_task(struct task_struct *task, bool trusted, bool user_stacks,
				       bool legacy)
{
	__u64 ustack = STACK_ID_NONE, kstack = STACK_ID_NONE, now;
	struct task_data *d, rec = {};
	__u32 tid, tgid, state;
	bool kthread;
	long err;

	if (!task) {
		now = bpf_ktime_get_ns();
		if (!trace_start_ns) {
			if (trace_duration_ns)
				trace_end_ns = now + trace_duration_ns < now ? ~0ULL
									    : now + trace_duration_ns;
			trace_start_ns = now;
		}
		return;
	}
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return;
	if (BPF_CORE_READ(task, on_cpu)) {
		if (on_cpu_on)
			run_at_start(task, tid, trusted, legacy);
		return;
	}
	state = task_state(task, false);
	/* Gone, or never run yet (TASK_NEW). */
	if ((state & (TASK_DEAD | TASK_NEW)) || BPF_CORE_READ(task, exit_state))
		return;
	tgid = BPF_CORE_READ(task, tgid);
	kthread = is_kthread(task, false);
	if (!wanted(task, tgid, tid, kthread, state))
		return;
	if (legacy) {
		/* Switched since the hook was attached: it has a record. */
		if (bpf_map_lookup_elem(&task_data_by_tid, &tid))
			return;
		d = &rec;
	} else {
		d = get_data(task, tid, trusted, true);
		if (!d) {
			count(CNT_NO_TASK_STORAGE);
			return;
		}
		if (d->start_ns)
			return;
	}
	if (want_user_stack && !kthread)
		ustack = user_stacks ? user_stack_of_task(task, tgid, true) : STACK_ID_NOT_READABLE;
	if (want_kernel_stack)
		kstack = kernel_stack_of_task(task);
	d->start_user_stack_id = ustack;
	d->start_kernel_stack_id = kstack;
	if (want_states || want_wakers)
		d->start_state = offcpu_state(task, state);
	if (want_states)
		d->wake_ns = 0;
	if (legacy) {
		/* The claim: the record is created here only if no switch of
		 * the thread has created it since the check above. */
		rec.start_ns = START_AT_WINDOW;
		err = bpf_map_update_elem(&task_data_by_tid, &tid, &rec, BPF_NOEXIST);
		if (err) {
			if (err != -EEXIST)
				count(CNT_NO_TASK_STORAGE);
			return;
		}
		d = bpf_map_lookup_elem(&task_data_by_tid, &tid);
		if (!d)
			return;
	} else if (__sync_val_compare_and_swap(&d->start_ns, 0, START_AT_WINDOW) != 0) {
		return;
	}
	if (notify_new_tasks && !kthread)
		notify_new_mappings(task, d, tgid, tid);
}

SEC("iter/task")
int start_blocked(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, true, false, false);
	return 0;
}

SEC("iter/task")
int start_blocked_by_tid(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, false, false, false);
	return 0;
}

SEC("iter.s/task")
int start_blocked_user(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, true, true, false);
	return 0;
}

SEC("iter.s/task")
int start_blocked_user_by_tid(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, false, true, false);
	return 0;
}

/*
 * Run once after tracing ends (trace_end_ns set, switch hooks detached):
 * count every block still in progress up to trace_end_ns.
 */
static __always_inline void flush_task(struct task_struct *task, bool trusted, bool legacy,
				       bool user_stacks)
{
	struct offcpu_key key = {};
	struct weight wt;
	struct task_data *d;
	__u64 start, from, to;
	__u32 tid, state;

	if (!task || !trace_end_ns)
		return;
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return;
	if (on_cpu_on)
		run_at_end(task, tid, trusted, legacy);
	d = get_data(task, tid, trusted, false);
	if (!d)
		return;
	/* Running now, with a block still open: either switched in after the
	 * hook was detached (the block ended then), or switched in without the
	 * tracepoint; either way the block ended when its current run began. */
	if (BPF_CORE_READ(task, on_cpu) && is_cfs(task)) {
		close_unseen_block(task, d, tid, bpf_ktime_get_ns(), false, legacy);
		return;
	}
	start = swap_start(d, 0, legacy);
	if (!block_part(d, start, trace_end_ns, false, &from, &to, &wt))
		return;

	fill_key(&key, task, tid, false);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, d, start);
	/* The kprobe takes a block's stacks at its switch-in, which this one
	 * has not reached: the thread has not run since its switch-out, so
	 * its stacks are still those it blocked with (the kernel's view of a
	 * task not running, as for a block under way at the start). */
	if (!began_before_window(start) && stacks_at_switch_in) {
		if (want_user_stack && !is_kthread(task, false))
			key.user_stack_id = user_stacks ? user_stack_of_task(task, key.tgid, false)
							: STACK_ID_NOT_READABLE;
		if (want_kernel_stack)
			key.kernel_stack_id = kernel_stack_of_task(task);
	}
	count(CNT_BLOCKS_AT_END);
	add_block_parts(&key, d, state, from, to, false, &wt);
}

SEC("iter/task")
int flush_in_progress(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, true, false, false);
	return 0;
}

SEC("iter/task")
int flush_in_progress_by_tid(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, false, false, false);
	return 0;
}

/* The kprobe's end iterator where the kernel reads another task's user
 * memory (5.18): the user stacks of blocks it has none for. */
SEC("iter.s/task")
int flush_in_progress_user_by_tid(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, false, false, true);
	return 0;
}

/*
 * -i: run at each interval's end (cut_at), once the clock has passed it:
 * every block under way is counted up to that end, and from then on is
 * counted from it.  A thread on a CPU is left alone: its switch-in (under
 * way now, or done without the hook seeing it) counts the block whole,
 * split at the intervals' ends it crossed.  The block's stacks and state
 * are read before it is claimed: once claimed, the thread may run and block
 * again.
 */
static __always_inline void cut_task(struct task_struct *task, bool trusted)
{
	struct offcpu_key key = {};
	struct weight wt;
	struct task_data *d, seen;
	__u64 start, cut, next, from, to, *at;
	__u32 tid, state, zero = 0;

	at = bpf_map_lookup_elem(&cut_at, &zero);
	if (!task || !at || !*at)
		return;
	cut = *at;
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return;
	if (on_cpu_on)
		run_cut(task, tid, cut, trusted);
	if (BPF_CORE_READ(task, on_cpu))
		return;
	d = get_data(task, tid, trusted, false);
	if (!d)
		return;
	seen = *d;
	start = seen.start_ns;
	if (start <= START_SEEN || counted_from(start) >= cut)
		return;
	next = cut | START_CUT | (began_before_window(start) ? START_CUT_AT_WINDOW : 0);
	if (__sync_val_compare_and_swap(&d->start_ns, start, next) != start)
		return;
	if (!block_part(&seen, start, cut, false, &from, &to, &wt))
		return;
	fill_key(&key, task, tid, false);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, &seen, start);
	add_block_parts(&key, &seen, state, from, to, false, &wt);
}

SEC("iter/task")
int cut_interval(struct bpf_iter__task *ctx)
{
	cut_task(ctx->task, true);
	return 0;
}

SEC("iter/task")
int cut_interval_by_tid(struct bpf_iter__task *ctx)
{
	cut_task(ctx->task, false);
	return 0;
}

/*
 * --snapshot: one pass over every task, no hook attached.  Each task the
 * thread filters (-p -t -u -k) keep, in a state asked for, is written to
 * the iterator's output as a struct snapshot_task, its stacks taken as the
 * start iterator takes them.
 */

/* Bit i: tasks whose state letter has index i in "RSDTtXZPI"; 0: all. */
const volatile __u32 snapshot_states = 0;

#define TASK_REPORT 0x7f
#define TASK_REPORT_IDLE 0x80
#define TASK_NOLOAD 0x400
#define TASK_RTLOCK_WAIT 0x1000
#define TASK_FROZEN 0x8000

/* The index of the letter /proc shows for `t`'s state, as the kernel's
 * __task_state_index() finds it: the highest reported state bit, idle
 * kernel threads (TASK_IDLE) apart, waits for an rtlock and frozen tasks
 * shown as D. */
static __always_inline __u32 state_index(struct task_struct *t)
{
	__u32 state = task_state(t, false);
	__u32 report = (state | (__u32)BPF_CORE_READ(t, exit_state)) & TASK_REPORT;
	int i;

	if ((state & (TASK_UNINTERRUPTIBLE | TASK_NOLOAD)) ==
	    (TASK_UNINTERRUPTIBLE | TASK_NOLOAD))
		report = TASK_REPORT_IDLE;
	if (state & (TASK_RTLOCK_WAIT | TASK_FROZEN))
		report = TASK_UNINTERRUPTIBLE;
	for (i = 8; i > 0; i--)
		if (report & (1u << (i - 1)))
			return i;
	return 0;
}

/* When `t`, not on a CPU, was last switched out, as far as the kernel
 * keeps it: its last switch-in (sched_info, on the rq clock: local_clock(),
 * not CLOCK_MONOTONIC) plus the CPU time it used since it was last picked
 * (CFS only).  0: not known. */
static __always_inline __u64 last_switch_out(struct task_struct *t)
{
	__u64 arrived, ran;

	if (!bpf_core_field_exists(t->sched_info) || !is_cfs(t))
		return 0;
	arrived = BPF_CORE_READ(t, sched_info.last_arrival);
	if (!arrived)
		return 0;
	ran = BPF_CORE_READ(t, se.sum_exec_runtime) -
	      BPF_CORE_READ(t, se.prev_sum_exec_runtime);
	return arrived + ran;
}

static __always_inline void snapshot_one(struct bpf_iter__task *ctx, bool user_stacks)
{
	struct task_struct *task = ctx->task;
	struct snapshot_task rec = {};
	bool kthread;
	__u32 index;

	if (!task)
		return;
	rec.pid = BPF_CORE_READ(task, pid);
	rec.tgid = BPF_CORE_READ(task, tgid);
	kthread = is_kthread(task, false);
	/* Not run yet: nothing to show. */
	if (!wanted_thread(task, rec.tgid, rec.pid, kthread) || (task_state(task, false) & TASK_NEW))
		return;
	index = state_index(task);
	if (snapshot_states && !(snapshot_states & (1u << index)))
		return;
	rec.state_index = index;
	rec.process_start = process_start(task);
	BPF_CORE_READ_STR_INTO(&rec.comm, task, comm);
	rec.on_cpu = BPF_CORE_READ(task, on_cpu) ? 1 : 0;
	if (!rec.on_cpu) {
		rec.off_since_ns = last_switch_out(task);
		/* An exited task has no stacks left. */
		if (!BPF_CORE_READ(task, exit_state)) {
			if (want_user_stack && !kthread)
				rec.user_stack_id = user_stacks
							    ? user_stack_of_task(task, rec.tgid, false)
							    : STACK_ID_NOT_READABLE;
			if (want_kernel_stack)
				rec.kernel_stack_id = kernel_stack_of_task(task);
		}
	}
	rec.seen_ns = bpf_ktime_get_ns();
	if (bpf_core_field_exists(task->sched_info))
		rec.self_arrival_ns =
			BPF_CORE_READ((struct task_struct *)bpf_get_current_task(),
				      sched_info.last_arrival);
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
}

SEC("iter.s/task")
int snapshot_tasks_user(struct bpf_iter__task *ctx)
{
	snapshot_one(ctx, true);
	return 0;
}

/* Where the kernel cannot read another task's user memory (before 5.18):
 * no user stacks. */
SEC("iter/task")
int snapshot_tasks(struct bpf_iter__task *ctx)
{
	snapshot_one(ctx, false);
	return 0;
}

/*
 * The programs for kernels without bpf_loop (before 5.17; Linux 5.10 is the
 * oldest tested): the same hooks and iterators, built from only what 5.10
 * has (see swap_start).  User stacks are walked with frame pointers; blocks
 * under way at the start have kernel stacks only (as before 5.18).  The
 * wake-up hook of --states (sched_wakeup_raw) needs no variant.
 */
SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch_btf_legacy, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, false, true, true, -1);
	on_switch_in(ctx, next, now, false, false, true);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw_legacy, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, false, true, true, -1);
	on_switch_in(ctx, next, now, false, false, true);
	return 0;
}

SEC("kprobe/finish_task_switch")
int BPF_KPROBE(finish_task_switch_legacy, struct task_struct *prev)
{
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *curr = (struct task_struct *)bpf_get_current_task();

	on_switch_out(ctx, prev, false, now, false, false, true, -1);
	on_switch_in(ctx, curr, now, false, true, true);
	if (on_cpu_on)
		run_switch_legacy(prev, curr, now);
	return 0;
}

SEC("raw_tp/sched_waking")
int BPF_PROG(sched_waking_legacy, struct task_struct *p)
{
	on_waking(ctx, p, false, true);
	return 0;
}

SEC("iter/task")
int start_blocked_legacy(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, false, false, true);
	return 0;
}

SEC("iter/task")
int flush_in_progress_legacy(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, false, true, false);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
