/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --on-cpu: each thread's runs timed at its switches, and the cpu-clock
 * sampler.
 */
#ifndef __OFFCPUTIME_ONCPU_H__
#define __OFFCPUTIME_ONCPU_H__

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

/* `t` is switched out: its run ends, if the ids keep it.  A run whose
 * switch-in the tracepoint did not report (see close_unseen_block) began
 * when CFS last picked the thread. */
static __always_inline void run_ends_as(struct task_struct *t, __u32 tid, __u64 now,
					bool trusted, bool legacy)
{
	struct run_data *r;
	__u64 since;

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
	/* No switch-in seen: since the start iterator (which dates a run under
	 * way at the window's start) or, before the window opened, since the
	 * last switch-out. */
	if (since == RUN_OFF || since == RUN_UNSEEN) {
		since = run_began(t, now, r->ended);
		if (since <= RUN_AT_WINDOW) {
			count(CNT_ONCPU_UNTIMED);
			r->ended = now;
			return;
		}
	}
	r->ended = now;
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
	/* (NULL: a switch-in the tests drop, see test_drop_switch_in.) */
	if (!curr)
		return;
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
	/* Set field by field: an initializer made the compiler keep a
	 * constant in .rodata.cst16, a map of its own, which the plain build
	 * (build.rs) would not have. */
	struct run_data *r, at = {};

	if (!wanted_ids(BPF_CORE_READ(t, tgid), tid, is_kthread(t, false)))
		return;
	at.since = RUN_AT_WINDOW;
	if (legacy) {
		bpf_map_update_elem(&run_by_tid, &tid, &at, BPF_NOEXIST);
		return;
	}
	r = get_run(t, tid, trusted, true);
	if (r)
		__sync_val_compare_and_swap(&r->since, RUN_UNSEEN, RUN_AT_WINDOW);
}

/* An iterator finds a thread on a CPU that its record says is off (or
 * that has no record): the tracepoint did not report its switch-in (see
 * close_unseen_block).  Its record, made if need be, and when its run
 * began as CFS dates it; 0 if it is no such run: not on a CPU, or being
 * switched out right now (the run CFS knows ended before the last
 * switch-out seen, which counted it). */
static __always_inline struct run_data *run_of_iterated(struct task_struct *t, __u32 tid,
							__u64 now, bool trusted, __u64 *unseen)
{
	struct run_data *r = get_run(t, tid, trusted, false);

	*unseen = 0;
	if (!BPF_CORE_READ(t, on_cpu))
		return r;
	if (!r) {
		if (!wanted_ids(BPF_CORE_READ(t, tgid), tid, is_kthread(t, false)))
			return 0;
		r = get_run(t, tid, trusted, true);
		if (!r)
			return 0;
	}
	if (r->since <= RUN_OFF)
		*unseen = run_began(t, now, r->ended);
	return r;
}

/* The end iterator (at `now`): a run under way when the hooks were
 * detached is counted up to the window's end. */
static __always_inline void run_at_end(struct task_struct *t, __u32 tid, __u64 now, bool trusted,
				       bool legacy)
{
	__u64 since, began, old;
	struct run_data *r = run_of_iterated(t, tid, now, trusted, &began);

	if (!r)
		return;
	if (began > RUN_AT_WINDOW) {
		old = r->since;
		if (legacy)
			r->since = began;
		else
			__sync_val_compare_and_swap(&r->since, old, began);
	}
	since = swap_u64(&r->since, RUN_OFF, legacy);
	if (since > RUN_OFF)
		add_run(t, tid, since, trace_end_ns);
}

/* -i (at `now`): a run under way at an interval's end `cut` is counted up
 * to it, and from it on from then. */
static __always_inline void run_cut(struct task_struct *t, __u32 tid, __u64 cut, __u64 now,
				    bool trusted)
{
	__u64 since, from, old;
	struct run_data *r = run_of_iterated(t, tid, now, trusted, &since);

	if (!r)
		return;
	if (since > RUN_AT_WINDOW) {
		/* Dated from then on, whether or not it crossed the cut. */
		old = r->since;
		if (old > RUN_OFF || __sync_val_compare_and_swap(&r->since, old, since) != old)
			return;
	} else {
		since = r->since;
	}
	if (since <= RUN_OFF)
		return;
	from = since == RUN_AT_WINDOW ? trace_start_ns : since;
	if (from >= cut || __sync_val_compare_and_swap(&r->since, since, cut) != since)
		return;
	add_run(t, tid, since, cut);
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
static __always_inline void on_cpu_sample(void *ctx, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool legacy = variant & VARIANT_LEGACY;
	struct task_struct *t = trusted ? bpf_get_current_task_btf()
					: (struct task_struct *)bpf_get_current_task();
	__u64 now = bpf_ktime_get_ns(), w = trace_start_ns, end = trace_end_ns;
	struct offcpu_key key = {};
	struct offcpu_val *v;
	__u32 tid, tgid;
	bool kthread, profiled;

	tid = TASK_READ(trusted, t, pid);
	if (tid == 0)
		return;
	tgid = TASK_READ(trusted, t, tgid);
	kthread = is_kthread(t, trusted);
	/* --chains samples every thread: where a wait is followed into a
	 * thread running, its samples there are its stacks. */
	profiled = wanted_thread(t, tgid, tid, kthread);
	if (!profiled && !chains_on)
		return;
	if (!w || now < w || (end && now >= end)) {
		count(CNT_ONCPU_OUTSIDE);
		return;
	}
	fill_key(&key, t, tid, trusted);
	key.state = OFFCPU_STATE_RUNNING;
	key.span = 1;
	if (interval_ns)
		key.interval = (now - w) / interval_ns;
	if (want_user_stack && !kthread) {
		key.user_stack_id = stack_of_current(ctx, true, legacy, false, now);
		if (!legacy && runtimes_present())
			key.user_stack_id = runtime_stack_of_current(key.user_stack_id, tgid);
	}
	if (want_kernel_stack)
		key.kernel_stack_id = stack_of_current(ctx, false, legacy, false, 0);
	if (timeline_min_ns)
		record_sample(&key, now, profiled);
	if (!profiled)
		return;
	count(CNT_ONCPU_SAMPLES);
	v = count_of(&key);
	if (!v)
		return;
	__sync_fetch_and_add(&v->count, 1);
}

SEC("perf_event")
int on_cpu(void *ctx)
{
	RUNTIME_BUILD(rt_build_on_cpu);
	on_cpu_sample(ctx, VARIANT_TRUSTED);
	return 0;
}

/* Before 5.17 (see the legacy programs at the end): frame pointers. */
SEC("perf_event")
int on_cpu_legacy(void *ctx)
{
	on_cpu_sample(ctx, VARIANT_BY_TID | VARIANT_LEGACY);
	return 0;
}

#endif /* __OFFCPUTIME_ONCPU_H__ */
