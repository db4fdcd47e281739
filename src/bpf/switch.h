/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The context-switch hooks: switch-out and switch-in, on the BTF and raw
 * tracepoints and the finish_task_switch kprobe, and their programs for
 * kernels without bpf_loop.
 */
#ifndef __OFFCPUTIME_SWITCH_H__
#define __OFFCPUTIME_SWITCH_H__

/*
 * `prev` is switched out.  Its stacks are taken now where it is still the
 * current task (not after the switch: see VARIANT_AFTER_SWITCH).
 */
static __always_inline void on_switch_out(void *ctx, struct task_struct *prev, bool preempt,
					  __u64 now, long prev_state, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool stacks_now = !(variant & VARIANT_AFTER_SWITCH);
	bool legacy = variant & VARIANT_LEGACY;
	__u32 tid = TASK_READ(trusted, prev, pid);
	__u32 tgid = TASK_READ(trusted, prev, tgid);
	__u32 state = preempt ? 0 : task_state(prev, trusted);
	bool kthread = is_kthread(prev, trusted);
	__u64 mm = 0, exec_vm = 0;
	struct task_data *d;

	bool state_guessed = false;
	bool profiled;

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
	/* (--chains: every thread's blocks, marked where the filters keep
	 * them; not the idle tasks', which are never switched in.) */
	profiled = wanted(prev, tgid, tid, kthread, state);
	if (!profiled && (!chains_on || tid == 0))
		return;
	if (trace_end_ns && now >= trace_end_ns)
		return;
	if (state_guessed && (want_states || filter_by_state))
		count(CNT_STATE_GUESSED);

	if (!d)
		d = get_data(prev, tid, trusted, true);
	if (!d) {
		count(CNT_NO_TASK_STORAGE);
		return;
	}
	if (keep_state()) {
		d->wake_ns = 0;
		d->state = offcpu_state(prev, state);
	}
	if (chains_on)
		d->flags = (d->flags & ~TD_PROFILED) | (profiled ? TD_PROFILED : 0);
	d->block_ns = now;
	d->start_ns = now;
	d->user_stack_id = STACK_ID_NONE;
	d->kernel_stack_id = STACK_ID_NONE;
	/* Read once for the walk and the notice below. */
	if (!kthread && (want_user_stack || notify_new_tasks))
		mm = task_address_space(prev, &exec_vm, trusted);
	/* Without stacks_now the stacks are taken at switch-in; a block still
	 * in progress when tracing ends has none. */
	if (want_user_stack && !kthread)
		d->user_stack_id = stacks_now ? stack_of_current_in(ctx, true, legacy, trusted, now,
								    mm, exec_vm)
					      : STACK_ID_MISSED_ERROR;
	/* With its runtime's frames, where its process has a runtime known
	 * (else see runtime_refresh). */
	if (!legacy && want_user_stack && stacks_now && runtimes_present())
		d->user_stack_id = runtime_stack_at_switch_out(d, d->user_stack_id, tgid, now, mm);
	/* Taken at the switch-in where it can be (kstack.h), from the frame
	 * the thread is about to save. */
	if (want_kernel_stack)
		d->kernel_stack_id = kstack_at_switch_in(variant) ? STACK_ID_AT_SWITCH_IN
				     : stacks_now ? stack_of_current(ctx, false, legacy, false, 0)
						  : STACK_ID_MISSED_ERROR;

	if (notify_new_tasks && !kthread)
		notify_new_space(prev, d, tgid, tid, trusted, mm, exec_vm);
}


/*
 * `next` is switched in.  After the switch (VARIANT_AFTER_SWITCH) we run in
 * next's own context, so its stacks are taken now; otherwise they were
 * taken at switch-out (or by the start iterator).
 */
static __always_inline void on_switch_in(void *ctx, struct task_struct *next, __u64 now,
					 const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool next_is_current = variant & VARIANT_AFTER_SWITCH;
	bool legacy = variant & VARIANT_LEGACY;
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
		starting = chains_on || wanted_thread(next, TASK_READ(trusted, next, tgid), tid,
					  is_kthread(next, trusted));
	d = get_data(next, tid, trusted, starting);
	if (!d)
		return;
	/* Claimed here or by the end or cut iterator, never both. */
	start = swap_start(d, starting ? START_SEEN : 0, legacy);
	if (!block_part(d, start, now, true, &from, &to, &wt)) {
		if (keep_wakers())
			d->waker_id = 0;
		return;
	}
	TIMELINE_SEEN(d, start, now, false);

	fill_key(&key, next, tid, trusted);
	kthread = is_kthread(next, trusted);
	if (kthread)
		count(CNT_KTHREAD_BLOCKS);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, d, start);
	if (kstack_at_switch_in(variant) && key.kernel_stack_id == STACK_ID_AT_SWITCH_IN)
		key.kernel_stack_id = kernel_stack_at_switch_in(next);
	if (next_is_current) {
		if (want_user_stack)
			key.user_stack_id =
				kthread ? STACK_ID_NONE
					: stack_of_current(ctx, true, legacy, trusted,
							   USED_READ_CLOCK);
		/* (A kernel thread's STACK_ID_NONE is left as it is.) */
		if (!legacy && want_user_stack && runtimes_present())
			key.user_stack_id = runtime_stack_of_current(key.user_stack_id, key.tgid);
		if (want_kernel_stack)
			key.kernel_stack_id = stack_of_current(ctx, false, legacy, false, 0);
	}
	add_block_parts(&key, d, state, from, to, true, &wt);
	TIMELINE_BLOCK(&key, d, state);
	if (keep_wakers())
		d->waker_id = 0;
}

/* Tests (test_drop_switch_in): whether this switch-in of `next` is left
 * unhandled, as the kernel sometimes leaves one unreported. */
static __noinline bool test_drops_switch_in(struct task_struct *next)
{
	if (bpf_get_prandom_u32() % test_drop_switch_in)
		return false;
	return wanted_ids(BPF_CORE_READ(next, tgid), BPF_CORE_READ(next, pid),
			  is_kthread(next, false));
}

static __always_inline bool switch_in_dropped(struct task_struct *next)
{
	return test_drop_switch_in && test_drops_switch_in(next);
}

/* Tests (test_refuse_tp_btf): a read through a number, which the verifier
 * refuses. */
#define TEST_REFUSE_TP_BTF(now)                                                \
	do {                                                                   \
		if (test_refuse_tp_btf)                                        \
			return *(volatile int *)(long)(now);                   \
	} while (0)

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now;

	RUNTIME_BUILD(rt_build_switch);
	now = bpf_ktime_get_ns();
	on_switch_out(ctx, prev, preempt, now, switch_has_prev_state ? (long)(__u32)ctx[3] : -1,
		      HOOK_TP_BTF);
	if (!switch_in_dropped(next))
		on_switch_in(ctx, next, now, HOOK_TP_BTF);
	TEST_REFUSE_TP_BTF(now);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, switch_has_prev_state ? (long)(__u32)ctx[3] : -1,
		      HOOK_RAW_TP);
	if (!switch_in_dropped(next))
		on_switch_in(ctx, next, now, HOOK_RAW_TP);
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
	on_switch_out(ctx, prev, false, now, -1, HOOK_KPROBE);
	if (switch_in_dropped(curr))
		curr = NULL;
	else
		on_switch_in(ctx, curr, now, HOOK_KPROBE);
	if (on_cpu_on)
		run_switch(prev, curr, now);
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

	on_switch_out(ctx, prev, preempt, now, -1, HOOK_TP_BTF_LEGACY);
	if (!switch_in_dropped(next))
		on_switch_in(ctx, next, now, HOOK_TP_BTF_LEGACY);
	TEST_REFUSE_TP_BTF(now);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw_legacy, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	on_switch_out(ctx, prev, preempt, now, -1, HOOK_RAW_TP | VARIANT_LEGACY);
	if (!switch_in_dropped(next))
		on_switch_in(ctx, next, now, HOOK_RAW_TP | VARIANT_LEGACY);
	return 0;
}

SEC("kprobe/finish_task_switch")
int BPF_KPROBE(finish_task_switch_legacy, struct task_struct *prev)
{
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *curr = (struct task_struct *)bpf_get_current_task();

	on_switch_out(ctx, prev, false, now, -1, HOOK_KPROBE | VARIANT_LEGACY);
	if (switch_in_dropped(curr))
		curr = NULL;
	else
		on_switch_in(ctx, curr, now, HOOK_KPROBE | VARIANT_LEGACY);
	if (on_cpu_on)
		run_switch_legacy(prev, curr, now);
	return 0;
}

#endif /* __OFFCPUTIME_SWITCH_H__ */
