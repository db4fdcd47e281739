/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Task iterators: blocks under way at the window's start claimed, at its
 * end flushed, at each -i cut counted.
 */
#ifndef __OFFCPUTIME_ITER_H__
#define __OFFCPUTIME_ITER_H__

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
	struct task_walk t = { .task = task };
	struct file_scratch *s = file_scratch_of(true);
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	struct unwind_state *u;
	__u64 *ips;
	__u32 zero = 0, idx;

	if (!unwind_by_file || !bpf_core_field_exists(((struct mm_struct *)0)->mm_mt) || !s || !mm)
		return -2;
	u = remote_state();
	if (!u || read_user_regs(task, u))
		return -1;
	u->max = clamp_stack_bytes() / sizeof(__u64);
	u->tgid = tgid;
	u->java = java_walkable(tgid, task);
	u->v8 = !u->java && v8_walkable(tgid, task);
	s->mm = mm;
	s->needs_tables = 0;
	s->used = 0;
	s->walk++;
	copy_stack(u, task);
	bpf_loop(MAX_STACK_DEPTH, unwind_step_task_files, &t, 0);
	s = file_scratch_of(true);
	ips = bpf_map_lookup_elem(&start_scratch, &zero);
	if (!s || !ips || s->needs_tables)
		return -2;
	idx = s->st.nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		ips[idx & MAX_STACK_DEPTH] = 0;
	}
	count(CNT_UNWIND_DWARF);
	count(CNT_UNWIND_BY_FILE);
	COUNT_WALK(&s->st);
	send_mapped(mm, exec_vm, (__u64)tgid << 32 | BPF_CORE_READ(task, pid),
		    BPF_CORE_READ(task, group_leader, start_boottime), true);
	return s->st.nr * sizeof(__u64);
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
	struct unwind_state *u;
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&start_scratch, &zero);
	long len = -1;

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	if (!BPF_CORE_READ(task, mm))
		return STACK_ID_NONE;
	if (task_regs_stale(task)) {
		count(CNT_USTACK_IN_EXEC);
		return STACK_ID_MISSED_ERROR;
	}
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
		u = remote_state();
		if (!u || read_user_regs(task, u))
			return STACK_ID_MISSED_ERROR;
		len = walk_user(u, task) * sizeof(__u64);
	}
	if (len < 0)
		return STACK_ID_MISSED_ERROR;
	if (len > 0)
		len = runtime_frames_of_task(task, tgid, len / sizeof(__u64)) * sizeof(__u64);
	return store_task_stack(len, true);
}

/*
 * The runtime's frames of a new process's first blocks (a CPython
 * process's Python frames): its stacks are walked at its threads'
 * switch-outs before userspace has heard of it, let alone read where its
 * runtime is.  Once it has, it lists the process in rt_refresh and runs
 * this over every task: a thread of it still in a block whose user stack
 * was walked without its runtime's frames has not run since, so its stack
 * is as it was; it is walked again, now with them, and the block takes
 * that stack.  Only with the process's
 * tables or its files' (no frame-pointer guess replaces a stack); where
 * they are not ready yet, the next run tries again.
 */
SEC("iter.s/task")
int runtime_refresh(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct task_local *l;
	struct task_data *d;
	__u64 start, block, id;
	__u32 tgid, nr, more;
	bool at_start;
	long len;

	if (!task || !runtimes_on)
		return 0;
	tgid = task->tgid;
	if (!bpf_map_lookup_elem(&rt_refresh, &tgid))
		return 0;
	l = bpf_task_storage_get(&task_data_storage, task, 0, 0);
	d = l ? &l->d : NULL;
	if (!d || task->on_cpu)
		return 0;
	start = d->start_ns;
	block = d->block_ns;
	/* A block under way: of its own switch-out, or claimed at the start
	 * by the start iterator (a process whose runtime's walker was not
	 * loaded yet, see runtimes_later), whose stacks are kept apart. */
	if (start < START_AT_WINDOW)
		return 0;
	at_start = began_before_window(start);
	if (at_start && !refresh_at_start)
		return 0;
	/* Its stack has its runtime's frames already. */
	id = at_start ? d->start_user_stack_id : d->user_stack_id;
	if ((id & STACK_ID_HASH_BIT) && has_runtime_frames(id))
		return 0;
	if (!BPF_CORE_READ(task, mm) ||
	    (BPF_CORE_READ(task, mm, mmap_lock.count.counter) &
	     (RWSEM_WRITER_LOCKED | RWSEM_FLAG_WAITERS)))
		return 0;
	if (!unwind_dwarf) {
		struct unwind_state *u = remote_state();

		if (!u || read_user_regs(task, u))
			return 0;
		len = walk_user(u, task) * sizeof(__u64);
	} else if (tables_ready(task, tgid)) {
		len = unwind_task(task, tgid);
	} else {
		len = unwind_task_by_files(task, tgid);
	}
	if (len <= 0)
		return 0;
	nr = len / sizeof(__u64);
	more = runtime_frames_of_task(task, tgid, nr);
	/* No runtime frames found (yet): tried again at the next run. */
	if (more == nr)
		return 0;
	id = store_task_stack(more * sizeof(__u64), true);
	if (!(id & STACK_ID_HASH_BIT))
		return 0;
	/* Still the same block: the thread has not run meanwhile. */
	if (d->start_ns != start || d->block_ns != block || task->on_cpu)
		return 0;
	if (at_start)
		d->start_user_stack_id = id;
	else
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
/* --chains: wanted(), in a frame of its own: inline, the cgroup walk's
 * values would grow the iterators' frames. */
static __noinline bool wanted_apart(struct task_struct *t, __u32 tgid, __u32 tid, bool kthread,
				    __u32 state)
{
	if (!t)
		return false;
	return wanted(t, tgid, tid, kthread, state);
}

static __always_inline void start_task(struct task_struct *task, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool user_stacks = variant & VARIANT_USER_STACKS;
	bool legacy = variant & VARIANT_LEGACY;
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
	/* (--chains: every thread's, the filters' choice noted below: not a
	 * value of its own across the calls between, which would grow the
	 * frame.) */
	if (!wanted(task, tgid, tid, kthread, state) && !chains_on)
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
		kstack = kernel_stack_of_task(task, true);
	d->start_user_stack_id = ustack;
	d->start_kernel_stack_id = kstack;
	if (chains_on)
		d->flags = (d->flags & ~TD_PROFILED_START) |
			   (wanted_apart(task, tgid, tid, kthread, state) ? TD_PROFILED_START : 0);
	if (keep_state())
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
		notify_new_mappings(task, d, tgid, tid, false);
}

SEC("iter/task")
int start_blocked(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, VARIANT_TRUSTED);
	return 0;
}

SEC("iter/task")
int start_blocked_by_tid(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, VARIANT_BY_TID);
	return 0;
}

SEC("iter.s/task")
int start_blocked_user(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, VARIANT_TRUSTED | VARIANT_USER_STACKS);
	return 0;
}

SEC("iter.s/task")
int start_blocked_user_by_tid(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, VARIANT_BY_TID | VARIANT_USER_STACKS);
	return 0;
}

/*
 * Run once after tracing ends (trace_end_ns set, switch hooks detached):
 * count every block still in progress up to trace_end_ns.
 */
static __always_inline void flush_task(struct task_struct *task, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool legacy = variant & VARIANT_LEGACY;
	bool user_stacks = variant & VARIANT_USER_STACKS;
	struct offcpu_key key = {};
	struct weight wt;
	struct task_data *d;
	__u64 start, from, to, now;
	__u32 tid, state;

	if (!task || !trace_end_ns)
		return;
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return;
	now = bpf_ktime_get_ns();
	if (on_cpu_on)
		run_at_end(task, tid, now, trusted, legacy);
	d = get_data(task, tid, trusted, false);
	if (!d)
		return;
	/* Running now, with a block still open: either switched in after the
	 * hook was detached (the block ended then), or switched in without the
	 * tracepoint; either way the block ended when its current run began. */
	if (BPF_CORE_READ(task, on_cpu) && close_unseen_block(task, d, tid, now, false, legacy))
		return;
	start = swap_start(d, 0, legacy);
	if (!block_part(d, start, trace_end_ns, false, &from, &to, &wt))
		return;
	TIMELINE_SEEN(d, start, trace_end_ns, true);

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
		if (want_kernel_stack && !user_stacks)
			key.kernel_stack_id = kernel_stack_of_task(task, true);
		else if (want_kernel_stack && d->end_kstack_id &&
			 d->end_kstack_switches == switches_of(task) &&
			 !BPF_CORE_READ(task, on_cpu))
			key.kernel_stack_id = d->end_kstack_id;
		else if (want_kernel_stack)
			key.kernel_stack_id = kernel_stack_of_task(task, false);
	}
	/* Not switched in yet: the walk that was due then (only the hook on
	 * BTF leaves one, see kstack_at_switch_in). */
	if ((variant & VARIANT_TRUSTED) && key.kernel_stack_id == STACK_ID_AT_SWITCH_IN)
		key.kernel_stack_id = kernel_stack_of_task(task, true);
	count(CNT_BLOCKS_AT_END);
	add_block_parts(&key, d, state, from, to, false, &wt);
	TIMELINE_BLOCK(&key, d, state);
}

/*
 * The kprobe's end iterator that reads user stacks cannot walk kernel
 * stacks too (their chains of calls together would pass 6.1's 512 bytes of
 * stack): this one, run just before it (the hooks detached), walks the
 * kernel stack of every block under way that has none yet, and keeps it
 * with the thread's count of switches, by which that iterator knows
 * whether the thread has run since (then it takes the kernel's walk alone,
 * counted).
 */
SEC("iter/task")
int end_kernel_stacks_by_tid(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct task_data *d;
	__u64 start;
	__u32 tid;

	if (!task || !trace_end_ns || !want_kernel_stack || !stacks_at_switch_in)
		return 0;
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return 0;
	d = get_data(task, tid, false, false);
	if (!d)
		return 0;
	d->end_kstack_id = 0;
	start = d->start_ns;
	if (start <= START_SEEN || began_before_window(start) || BPF_CORE_READ(task, on_cpu))
		return 0;
	d->end_kstack_switches = switches_of(task);
	d->end_kstack_id = kernel_stack_of_task(task, true);
	return 0;
}

SEC("iter/task")
int flush_in_progress(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, VARIANT_TRUSTED);
	return 0;
}

SEC("iter/task")
int flush_in_progress_by_tid(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, VARIANT_BY_TID);
	return 0;
}

/* The kprobe's end iterator where the kernel reads another task's user
 * memory (5.18): the user stacks of blocks it has none for. */
SEC("iter.s/task")
int flush_in_progress_user_by_tid(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, VARIANT_BY_TID | VARIANT_USER_STACKS);
	return 0;
}

/*
 * -i: run at each interval's end (cut_at), once the clock has passed it:
 * every block under way is counted up to that end, and from then on is
 * counted from it.  A thread on a CPU with a block open is either being
 * switched out (the block is new: left alone) or got there without the
 * tracepoint reporting it: that block is closed here, where CFS dates the
 * switch-in (close_unseen_block), not at its next switch-out, which may
 * come after this interval is written.  The block's stacks and state
 * are read before it is claimed: once claimed, the thread may run and block
 * again.
 */
static __always_inline void cut_task(struct task_struct *task, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	struct offcpu_key key = {};
	struct weight wt;
	struct task_data *d, seen;
	__u64 start, cut, next, from, to, now, *at;
	__u32 tid, state, zero = 0;

	at = bpf_map_lookup_elem(&cut_at, &zero);
	if (!task || !at || !*at)
		return;
	cut = *at;
	tid = BPF_CORE_READ(task, pid);
	if (tid == 0)
		return;
	now = bpf_ktime_get_ns();
	if (on_cpu_on)
		run_cut(task, tid, cut, now, trusted);
	d = get_data(task, tid, trusted, false);
	if (!d)
		return;
	if (BPF_CORE_READ(task, on_cpu)) {
		close_unseen_block(task, d, tid, now, false, false);
		return;
	}
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
	/* The walk due at the switch-in, which is still to come (each part
	 * of the block is walked apart; the thread may run meanwhile, see
	 * kernel_stack_of_task). */
	if (trusted && key.kernel_stack_id == STACK_ID_AT_SWITCH_IN)
		key.kernel_stack_id = kernel_stack_of_task(task, true);
	/* --chains: the block as far as it went, read where it is kept (its
	 * waits are followed interval by interval, and this one is not over).
	 * Should the thread have run since it was claimed, its block's record
	 * comes soon after, and stands for this one; one begun since lies
	 * after the cut and is not sent. */
	if (chains_on) {
		key.state = state;
		timeline_block(&key, d, cut | TIMELINE_AT_END | TIMELINE_AT_CUT |
					(began_before_window(start) ? TIMELINE_AT_START : 0));
	}
	add_block_parts(&key, &seen, state, from, to, false, &wt);
}

SEC("iter/task")
int cut_interval(struct bpf_iter__task *ctx)
{
	cut_task(ctx->task, VARIANT_TRUSTED);
	return 0;
}

SEC("iter/task")
int cut_interval_by_tid(struct bpf_iter__task *ctx)
{
	cut_task(ctx->task, VARIANT_BY_TID);
	return 0;
}


SEC("iter/task")
int start_blocked_legacy(struct bpf_iter__task *ctx)
{
	start_task(ctx->task, VARIANT_BY_TID | VARIANT_LEGACY);
	return 0;
}

SEC("iter/task")
int flush_in_progress_legacy(struct bpf_iter__task *ctx)
{
	flush_task(ctx->task, VARIANT_BY_TID | VARIANT_LEGACY);
	return 0;
}

#endif /* __OFFCPUTIME_ITER_H__ */
