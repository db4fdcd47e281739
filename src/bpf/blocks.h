/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Blocks counted: claims of a block (swap_start), -m/-M and --sample, the
 * parts of a block inside the window and its intervals, keys and stacks.
 */
#ifndef __OFFCPUTIME_BLOCKS_H__
#define __OFFCPUTIME_BLOCKS_H__

/*
 * Programs for kernels before 5.17 (`legacy`, at the end of switch.h,
 * wakers.h and iter.h) use only what Linux 5.10 has: no bpf_loop (user
 * stacks through frame pointers), no task-local storage for tracing
 * programs (the per-thread hash map), no atomic exchange (5.12). They need
 * none: while the hooks are attached, a thread's start_ns is written only
 * by its own switches, which the scheduler orders, and by the start
 * iterator only when it creates the thread's record (BPF_NOEXIST: whoever
 * creates it first wins, see start_task); the end iterator runs once the
 * hooks are detached, and -i (the cut iterator) is refused there.
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

/* Whether the mode keys counts whole (see struct offcpu_key_plain). */
#define COUNTS_WHOLE (want_states || want_wakers || interval_ns || on_cpu_on)

static __always_inline struct offcpu_val *count_in(void *map, struct offcpu_key *key)
{
	struct offcpu_val *v, init = {};
	int err;

	v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	err = bpf_map_update_elem(map, key, &init, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count(CNT_COUNTS_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(map, key);
}

/*
 * The count of `key`, made where there is none yet (NULL: the table is
 * full, counted).  In `counts_plain` where the mode sets none of the
 * key's last fields, in `counts` otherwise; a key that has any of them
 * set all the same goes to `counts`, which that mode leaves a single
 * element: it is counted, not merged with another.
 */
static __always_inline struct offcpu_val *count_of(struct offcpu_key *key)
{
	if (!COUNTS_WHOLE && !key->state && !key->interval && key->span <= 1 &&
	    !key->waker_id)
		return count_in(&counts_plain, key);
	return count_in(&counts, key);
}

static __always_inline void add_block(struct offcpu_key *key, __u64 delta,
				      const struct weight *wt)
{
	struct offcpu_val *v;

	/* delta <= seen < sample_ns <= 1 s: no overflow. */
	if (wt->seen)
		delta = delta * sample_ns / wt->seen;
	v = count_of(key);
	if (!v)
		return;
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

	/* --chains: the profile's blocks are made of the records (its
	 * running time, with --on-cpu, is counted). */
	if (chains_on && key->state != OFFCPU_STATE_RUNNING)
		return;
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
	key->process_start = task_process_start(t, trusted);
	BPF_CORE_READ_STR_INTO(&key->comm, t, comm);
}


static __always_inline bool is_cfs(struct task_struct *t)
{
	__u32 policy = BPF_CORE_READ(t, policy);

	return policy == SCHED_NORMAL || policy == SCHED_BATCH || policy == SCHED_IDLE;
}

/* (Tests: see test_run_clock_step_ns.) */
__u64 test_run_clock_reads = 0;

/*
 * When a thread's current run on a CPU began, as CFS dates it: `now` less
 * its run time since it was last picked (the kernel's task clock, which
 * leaves out the time interrupts took and, read from another CPU, is behind
 * by up to a tick).  0 where CFS cannot tell: not a CFS thread, or a run
 * that began before `after`, which can only be an earlier run: the thread
 * is being switched out right now.
 */
static __always_inline __u64 run_began(struct task_struct *t, __u64 now, __u64 after)
{
	__u32 zero = 0, tid = BPF_CORE_READ(t, pid);
	struct ran_read *last;
	__u64 ran, step;

	if (!is_cfs(t))
		return 0;
	/* The same thread at the same moment: the same reading (ran_reads). */
	last = bpf_map_lookup_elem(&ran_reads, &zero);
	if (last && last->tid == tid && last->now == now) {
		ran = last->ran;
	} else {
		ran = BPF_CORE_READ(t, se.sum_exec_runtime) -
		      BPF_CORE_READ(t, se.prev_sum_exec_runtime);
		if (test_run_clock_step_ns) {
			step = test_run_clock_step_ns * (test_run_clock_reads++ % 3);
			ran = ran > step ? ran - step : 0;
		}
		if (last) {
			last->now = now;
			last->ran = ran;
			last->tid = tid;
		}
	}
	if (ran >= now || now - ran < after)
		return 0;
	return now - ran;
}

/*
 * A thread whose last block is still open is on a CPU: the kernel put it
 * there without the sched_switch tracepoint (seen on 6.18: the switches
 * away from some threads are never reported, and the kernel's own ftrace
 * event is missing too).  The block ended when its current run began,
 * which CFS dates (run_began).  `at_switch`: the thread is being switched
 * out now (its hook owns the block); otherwise an iterator found it running
 * and claims the block only if CFS's date shows a run that began after the
 * block did (else the thread is in the middle of being switched out, and
 * its block is a new one).  True if the block was closed here or needs no
 * closing; false if it is open and not this kind.
 */
static __always_inline bool close_unseen_block_here(struct task_struct *prev,
						    struct task_data *d, __u32 tid, __u64 now,
						    bool at_switch, bool legacy)
{
	struct offcpu_key key = {};
	struct weight wt;
	__u64 start, in, from, to;
	__u32 state;

	if (at_switch) {
		start = swap_start(d, 0, legacy);
		if (start <= START_SEEN) {
			if (keep_wakers())
				d->waker_id = 0;
			return true;
		}
		count(CNT_UNSEEN_SWITCH_IN);
		in = run_began(prev, now, start == START_AT_WINDOW ? 0 : counted_from(start));
		if (!in) {
			count(CNT_UNSEEN_UNTIMED);
			return true;
		}
	} else {
		start = d->start_ns;
		if (start <= START_SEEN)
			return true;
		in = run_began(prev, now, start == START_AT_WINDOW ? 0 : counted_from(start));
		if (!in)
			return false;
		if (legacy)
			d->start_ns = 0;
		else if (__sync_val_compare_and_swap(&d->start_ns, start, 0) != start)
			return true;
		count(CNT_UNSEEN_SWITCH_IN);
	}
	if (!block_part(d, start, in, true, &from, &to, &wt))
		return true;
	TIMELINE_SEEN(d, start, in, false);
	fill_key(&key, prev, tid, false);
	if (is_kthread(prev, false))
		count(CNT_KTHREAD_BLOCKS);
	if (start == START_AT_WINDOW)
		count(CNT_BLOCKS_AT_START);
	state = claimed_stacks(&key, d, start);
	/* Due at the switch-in not seen: the thread has run since. */
	if (key.kernel_stack_id == STACK_ID_AT_SWITCH_IN) {
		key.kernel_stack_id = STACK_ID_SWITCH_IN_UNSEEN;
		count(CNT_KSTACK_UNSEEN);
	}
	TIMELINE_BLOCK(&key, d, state);
	add_block_parts(&key, d, state, from, to, true, &wt);
	if (keep_wakers())
		d->waker_id = 0;
	return true;
}

/* The same in a frame of its own, for the programs with bpf_loop: the
 * block's key and weight then stay out of the switch hook's frame, at the
 * bottom of the chain of frames the DWARF walk stacks on (hook,
 * user_stack_of_current, the walk's bpf_loop callback, unwind_rule, the
 * binary search's callback), which the verifier bounds to 512 bytes in all
 * before private stacks (6.13): with -i the hook's frame put it over on
 * 6.1 and 6.12.  Not for the legacy programs: Linux 5.10 refuses an
 * atomic compare-and-exchange even in code it never reaches. */
static __noinline bool close_unseen_block_apart(struct task_struct *prev, struct task_data *d,
						__u32 tid, __u64 now, bool at_switch)
{
	return close_unseen_block_here(prev, d, tid, now, at_switch, false);
}

static __always_inline bool close_unseen_block(struct task_struct *prev, struct task_data *d,
					       __u32 tid, __u64 now, bool at_switch, bool legacy)
{
	if (legacy)
		return close_unseen_block_here(prev, d, tid, now, at_switch, true);
	return close_unseen_block_apart(prev, d, tid, now, at_switch);
}

#endif /* __OFFCPUTIME_BLOCKS_H__ */
