/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Settings fixed at load time, and the window (its start and end, -i's
 * cuts).
 */
#ifndef __OFFCPUTIME_SETTINGS_H__
#define __OFFCPUTIME_SETTINGS_H__

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
/* The kernel's BTF id of struct task_struct, from userspace (which gives
 * libbpf a copy of the kernel's types for CO-RE, whose ids are not the
 * kernel's); 0 where it could not read it: no cast (see task_to_walk). */
const volatile __u32 task_struct_kernel_id = 0;
/* ... and of struct pt_regs: the switch hook loads the words of a blocked
 * thread's kernel stack through it (see korc_word_at); 0: they are copied. */
const volatile __u32 pt_regs_kernel_id = 0;
const volatile __u32 stack_bytes = MAX_STACK_DEPTH * sizeof(__u64);
/* Stacks kept in tables by their length (see STACK_SHORT_DEPTH): where
 * hash tables allocate their elements as they are added. */
const volatile bool stack_classes = false;
/* --unwind dwarf: walk user stacks with the tables in unwind_*. */
const volatile bool unwind_dwarf = false;
/* ... and keep each thread's last walks, with their proofs (struct ucache). */
const volatile bool ucache_on = false;
/* ... and walk processes without tables of their own through the tables of
 * the files they map (struct unwind_file), where the kernel keeps
 * mappings in a maple tree (6.1 on). */
const volatile bool unwind_by_file = false;
/* --chains: every thread's blocks are recorded (block_records), whatever
 * the filters, which mark the blocks they keep (BLOCK_PROFILED); the
 * profile is made of the records, the counts are not kept. */
const volatile bool chains_on = false;
/* The waker's user stack at a wake-up (--wakers, --timeline; --chains
 * alone follows the waker by its thread, not its stacks). */
const volatile bool waker_user_stacks = true;
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

/* Tests: about one switch-in in this many of a thread traced is left
 * unhandled, as if the tracepoint had not reported it (see
 * close_unseen_block); 0: none. */
const volatile __u32 test_drop_switch_in = 0;
/* Tests: each new reading of a thread's run time (run_began) falls 0, 1 or
 * 2 of these short of the kernel's, as a tick between two readings would
 * move it; 0: none. */
const volatile __u64 test_run_clock_step_ns = 0;
/* Tests: every stack stored as if the stacks table had no memory at the
 * moment (see stacks_spill). */
const volatile bool test_spill_stacks = false;
/* Tests: the tp_btf hook's programs do what the verifier refuses, as on
 * a kernel whose BTF they cannot use. */
const volatile bool test_refuse_tp_btf = false;

/* --on-cpu: the threads' runs on a CPU too (see struct run_data in maps.h). */
const volatile bool on_cpu_on = false;
/* --timeline: the shortest block recorded (0: --timeline not asked). */
const volatile __u64 timeline_min_ns = 0;
/* Userspace is woken once the ring of records holds this many bytes, not
 * at every record: it reads the ring at least every 100 ms anyway. */
const volatile __u64 timeline_wake_bytes = 0;
/* Tests: each whole kernel stack kept beside the helper's (kstack.h). */
const volatile bool test_kstack_check = false;

/* How long to trace (0: until userspace stops it). */
const volatile __u64 trace_duration_ns = 0;
/* -i: the length of an interval (0: one profile for the whole window).
 * Interval i is [trace_start_ns + i * interval_ns, ... + interval_ns). */
const volatile __u64 interval_ns = 0;

/*
 * The plain build (build.rs): the settings of a plain run are constants
 * from here on, and the compiler leaves out the code they turn off.  The
 * variables above stay, so that both builds have the same .rodata.
 */
#ifdef OFFCPUTIME_PLAIN
#include "plain_settings.h"
#endif

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

/* Whether the block `start` says began before the window (claimed by the
 * start iterator): its stacks and state are start_*. */
static __always_inline bool began_before_window(__u64 start)
{
	return start == START_AT_WINDOW || (start & START_CUT_AT_WINDOW);
}

#endif /* __OFFCPUTIME_SETTINGS_H__ */
