/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Per-thread records (blocks, runs) and the maps every part shares:
 * filters, stacks, counts, counters, events, the DWARF walk's tables and
 * the stack cache's storage.
 */
#ifndef __OFFCPUTIME_MAPS_H__
#define __OFFCPUTIME_MAPS_H__

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
	/* --wakers, --timeline: who woke the open block (a waker id; 0:
	 * nobody yet), and when the wake-up began. */
	__u64 waker_id;
	__u64 waking_ns;
	/* --timeline: until when the block being closed was seen, with
	 * TIMELINE_AT_START and TIMELINE_AT_END (see timeline_block). */
	__u64 timeline_end;
	/* Until when (2^20 ns) its Python frames are not looked for: see
	 * python_stack_at_switch_out. */
	__u32 py_rest_until;
	/* --chains: whether the filters keep the open block (TD_PROFILED),
	 * and the block under way at the start (TD_PROFILED_START). */
	__u32 flags;
	/* The kprobe's end: the kernel stack of the open block, walked by
	 * end_kernel_stacks_by_tid (0: none), and the thread's count of
	 * switches then (see that iterator). */
	__u64 end_kstack_id;
	__u64 end_kstack_switches;
};

#define TD_PROFILED 1
#define TD_PROFILED_START 2

/*
 * The kernel walk's proofs a thread keeps (see kstack.h): a proof as kept
 * (struct korc_proof there) is its shape, the places of the words it read
 * (struct korc_shape), and a hash of the words it needs held, in order
 * (ucache_mix(), as the stack cache's).  A shape is the same for every
 * thread that blocks under the same kernel code path, so it is kept once,
 * in korc_shapes, under a hash of it (korc_shape_key()), and a thread
 * keeps only that key.  A power of two, at most 32 (the bits of `need`).
 */
#define KORC_PROOF 32
struct korc_shape {
	__u32 n, m;
	__u32 need;
	__u32 user;
	__u32 at[KORC_PROOF];
	__u32 sp[KORC_PROOF];
};

/* The shapes of the proofs kept (a 64-bit hash of each, see
 * korc_shape_key(), its key): never changed once added; sized by
 * userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct korc_shape);
} korc_shapes SEC(".maps");

struct korc_kept_proof {
	/* Its shape's key in korc_shapes. */
	__u64 shape;
	__u64 hash;
};

struct korc_way {
	/* 0: none kept. */
	__u64 stack_id;
	struct korc_kept_proof proof;
};

/* Which way was proved or kept last: the top bit of korc_kept's
 * `second_for`. */
#define KORC_LAST_BIT (1ULL << 63)

/* A thread's first way, and what tells its ways apart; its second way is
 * in korc_second, which only a thread that blocks in a second place
 * again is given (a place met once, a preemption anywhere, is not kept
 * there). */
struct korc_kept {
	/* The stack of the last walk that would have taken the second way
	 * where the thread had none (its 63 low bits): met again, the second
	 * way is made.  KORC_LAST_BIT: the way proved or kept last. */
	__u64 second_for;
	struct korc_way way;
};

/* A thread's record in task storage: its block's state and its first kept
 * kernel walk, together one of the kernel allocator's 256-byte elements
 * with task storage's header (src/tracer/element_sizes.rs; apart, they
 * would take two).  The hooks that keep their records by thread id keep a
 * task_data alone (they walk no kernel stack). */
struct task_local {
	struct task_data d;
	struct korc_kept korc;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_local);
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
 * --on-cpu (on_cpu_on): when each thread traced began its current run on a
 * CPU, kept apart from task_data (whose size the switch hooks' frames are
 * near 6.1's limit with).  `since` is a switch-in time (or an interval's
 * end, from where the cut iterator counted it), or one of these (a ktime in
 * ns is never this small).  RUN_UNSEEN: a record made at a switch-out, no
 * switch-in seen since the hooks were attached: the thread ran since
 * before.  RUN_OFF: off the CPU, or its run counted up to the end.
 * RUN_AT_WINDOW: on a CPU when the start iterator passed, counted from the
 * window's start.
 */

#define RUN_UNSEEN 0
#define RUN_OFF 1
#define RUN_AT_WINDOW 2

struct run_data {
	__u64 since;
	/* Its last switch-out seen (see unseen_run_began). */
	__u64 ended;
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
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64[MAX_STACK_DEPTH]);
} stacks SEC(".maps");

/* The shorter stacks (see STACK_SHORT_DEPTH). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64[STACK_SHORT_DEPTH]);
} stacks_short SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64[STACK_MID_DEPTH]);
} stacks_mid SEC(".maps");

/* Stacks `stacks` had no memory for at the moment (its allocator's cache
 * on this CPU empty until refilled: -ENOMEM, not -E2BIG for a full table),
 * under the same ids: allocated whole at load, so a burst of new stacks
 * where the allocator cannot refill (the kprobe, interrupts off) loses
 * none (256 entries, or 4 per CPU: set at load). Userspace reads both as
 * one. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, __u64[MAX_STACK_DEPTH]);
} stacks_spill SEC(".maps");

/* The counts: keyed whole where a mode sets the key's state, interval or
 * waker, else in `counts_plain` (see count_of() in blocks.h); the table a
 * mode does not use is left a single element (a count put there all the
 * same finds it full, and is counted lost). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_val);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key_plain);
	__type(value, struct offcpu_val);
} counts_plain SEC(".maps");

/* --wakers: each distinct waker (task and stacks) under a 64-bit hash. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct waker_info);
} wakers SEC(".maps");

/* run_began's last reading of a thread's run time on this CPU: an
 * iterator that finds a thread running after a switch-in the tracepoint
 * did not report dates both its run (run_cut, run_at_end) and the block
 * before it (close_unseen_block) by it; read twice, a tick on the thread's
 * CPU between the reads would move the second date back and leave the time
 * between the two in neither. */
struct ran_read {
	__u64 now;
	__u64 ran;
	__u32 tid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ran_read);
} ran_reads SEC(".maps");

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
 * walks started from, where each 8-byte slot they read is, and a hash of
 * what those slots held, in order (ucache_mix(): a change of one slot always
 * changes it, of several but for a chance of one in 2^64; the stacks
 * themselves are kept under hashes of that size).  At its next block, if the registers are those of a walk kept, the tables
 * are (their generation, see struct unwind_proc), and the slots still
 * hash to what they did, the stack is the one stored then: it is
 * not walked again, and no frame is guessed.  Where the proof cannot be
 * kept (a read that failed, more than UCACHE_SLOTS slots, a stack that
 * could not be stored) the thread keeps nothing and is walked each time.
 * The initial frame pointer is part of the proof only where the walk used
 * it before restoring it from the stack (code without frame pointers
 * keeps anything in that register).  A thread keeps UCACHE_WAYS walks:
 * one that blocks in up to that many places in turn (a read that waits, a
 * write preempted on its way back to user mode) is proved at each.
 */
#define UCACHE_SLOTS 128
/* A slot's place, in struct ucache_shape's off[]: its offset from sp in words,
 * up to UCACHE_WORD_MAX (256 KiB).  A slot with UCACHE_RANGE_BIT stands for
 * the UCACHE_RANGE bytes from there, hashed (ucache_range_hash()): the
 * slots of an interpreted Java frame, proved as one (see java.h); its
 * offset is up to UCACHE_RANGE_OFF_MAX words (16 KiB), and the bits from
 * UCACHE_RANGE_SKIP_SHIFT say how many of the range's first words it
 * leaves out (see note_range()).  A slot that does not fit makes the walk
 * unprovable.  The places of a walk's slots, its shape, are the same for
 * every thread that blocks under the same code path (the farm's 8,200
 * threads have 40): they are kept once, in ucache_shapes, under a hash of
 * them, and a thread's way keeps that key, so that a way is 88 bytes and
 * the first with what tells the ways apart fits the kernel allocator's
 * 256-byte elements (with the places in each way, 512). */
#define UCACHE_RANGE_BIT 0x8000
#define UCACHE_WORD_MAX 0x7fff
#define UCACHE_RANGE_OFF_MAX 0x7ff
#define UCACHE_RANGE_SKIP_SHIFT 11
#define UCACHE_RANGE_SKIP_MAX 15
#define UCACHE_RANGE_WORDS 10
#define UCACHE_RANGE (UCACHE_RANGE_WORDS * 8)
/* Where the hash of a walk's slots starts. */
#define UCACHE_HASH_SEED 0xcbf29ce484222325ULL
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
	/* Past the highest slot: sp + top is where the slots end. */
	__u32 top;
	/* Java or JavaScript frames (see java.h, v8.h), and which. */
	__u16 rt_frames;
	/* Walked by this build (runtime_build()): a walk kept by a build
	 * without a runtime's walker proves nothing to one with it (a JVM's
	 * frames). */
	__u16 runtimes;
	__u8 v8;
	__u8 _pad[3];
	/* What the slots held, in order (ucache_mix()). */
	__u64 hash;
	/* Where they are: its key in ucache_shapes (while walking, the hash
	 * of the places so far). */
	__u64 shape;
};

/* Slot k: where it is (UCACHE_RANGE_BIT). */
struct ucache_shape {
	__u16 off[UCACHE_SLOTS];
};

/* The shapes of the walks kept (see ucache_shape_key()): never changed
 * once added; sized by userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct ucache_shape);
} ucache_shapes SEC(".maps");

/* The walk under way: what its way will keep, and its slots' places. */
struct ucache_walk {
	struct ucache e;
	struct ucache_shape s;
};

/* A thread's kept walks: one per starting pc and sp; a new one replaces
 * the one proved or kept least recently.  The first is kept here, with
 * what tells each of the UCACHE_WAYS apart; the second in ucache_second,
 * the others in ucache_more, each given only to a thread that blocks
 * again in as many places in turn (two worker threads passing the turn
 * back and forth: a wait, and a wake-up preempted in two places), not
 * for a place met once (a preemption anywhere).  Each storage is one of
 * the kernel allocator's sizes (src/tracer/element_sizes.rs): this one
 * and ucache_pair 256 bytes, ucache_second 192. */
#define UCACHE_WAYS 4
struct ucache_ways {
	struct ucache way0;
	/* Of each way: the registers its walk started from (where its bit is
	 * in `kept`; ucache_regs_tag(), the way itself holds them whole), and
	 * when it was proved or kept last (a count of the thread's walks,
	 * `tick`). */
	__u64 regs[UCACHE_WAYS];
	/* The registers of the last walks that would have been kept in a
	 * storage the thread did not have: met again, the storage is made. */
	__u64 wanted[UCACHE_WAYS];
	__u32 used[UCACHE_WAYS];
	__u32 tick;
	__u32 kept;
};

struct ucache_pair {
	struct ucache way[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ucache_ways);
} ucache_storage SEC(".maps");

/* Way 1 of the threads that have used it. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ucache);
} ucache_second SEC(".maps");

/* Ways 2 and 3 of the threads that have used them. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ucache_pair);
} ucache_more SEC(".maps");

/* The slots of the walk under way on this CPU, kept once it succeeds. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ucache_walk);
} ucache_scratch SEC(".maps");

/* Checking the slots: the stack is read a window at a time, from a slot up
 * to the end of the highest (so one read usually covers them all), not 8
 * bytes at a time. */
#define UCACHE_WINDOW 4096
struct ucache_window {
	/* The stack memory read last (ucache_proved()). */
	__u8 bytes[UCACHE_WINDOW + UCACHE_RANGE];
	/* The check under way (ucache_slots_step()): `have` bytes from
	 * `base` in `bytes`, the next slot, and whether every slot held
	 * (1), one did not (0) or neither is known yet (-1).  Kept here, not
	 * on the stack, so that the verifier does not know them: it checks
	 * a step once, not once for each value of the slot counter. */
	__u64 base;
	__u64 have;
	__u32 k;
	__s32 holds;
	/* Where the slot checked is in `bytes`. */
	__u64 off;
	/* What the slots checked so far held (ucache_mix()). */
	__u64 hash;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ucache_window);
} ucache_window SEC(".maps");

/* DWARF unwind tables (see offcputime.h): chunks created, mmapped and
 * written by userspace as the tables grow; the arrays of chunks sized by it
 * at load. */
struct unwind_rows_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNWIND_ROWS_PER_CHUNK);
	__type(key, __u32);
	__type(value, struct unwind_row);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct unwind_rows_chunk);
} unwind_rows SEC(".maps");

struct unwind_maps_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNWIND_MAPS_PER_CHUNK);
	__type(key, __u32);
	__type(value, struct unwind_mapping);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct unwind_maps_chunk);
} unwind_maps SEC(".maps");

/* Row `i` of the rows, and mapping `i` of the mappings: NULL past the
 * chunks created. */
static __always_inline struct unwind_row *unwind_row_at(__u32 i)
{
	__u32 chunk = i >> UNWIND_ROWS_CHUNK_SHIFT, at = i & (UNWIND_ROWS_PER_CHUNK - 1);
	void *rows = bpf_map_lookup_elem(&unwind_rows, &chunk);

	return rows ? bpf_map_lookup_elem(rows, &at) : NULL;
}

static __always_inline struct unwind_mapping *unwind_mapping_at(__u32 i)
{
	__u32 chunk = i >> UNWIND_MAPS_CHUNK_SHIFT, at = i & (UNWIND_MAPS_PER_CHUNK - 1);
	void *maps = bpf_map_lookup_elem(&unwind_maps, &chunk);

	return maps ? bpf_map_lookup_elem(maps, &at) : NULL;
}

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

/* Elements allocated as processes are told of, and deleted as they exit
 * (notify_exit()), where hash maps grow (userspace; an LRU map would be
 * allocated whole, 1.5 MiB).  Full (more processes than this traced at
 * once), a process is not kept: each of its threads tells of it once, and
 * userspace takes the first notice. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
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
enum unwind_chunks _unwind_chunks = UNWIND_ROWS_PER_CHUNK;
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
struct java_proc _java_proc = {};
enum java_frame_special _java_frame_special = JAVA_INTERP_MARK;
enum java_cut _java_cut = JAVA_CUT_RUNNING;
enum java_limits _java_limits = JAVA_FRAME_WORDS;
struct node_proc _node_proc = {};
enum node_limits _node_limits = NODE_FRAME_WORDS;
enum v8_frame_special _v8_frame_special = V8_FRAME_MARK;

#endif /* __OFFCPUTIME_MAPS_H__ */
