/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --states' wake-ups and --wakers' wakers.
 */
#ifndef __OFFCPUTIME_WAKERS_H__
#define __OFFCPUTIME_WAKERS_H__

/*
 * --states: `p` is woken.  Its open block is split here: from now on it
 * waits for a CPU.  The tracepoint runs with p's run queue locked, after p
 * was switched out, so the block it sees is the one the wake-up ends.
 */
static __always_inline void on_wakeup(struct task_struct *p, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
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
	on_wakeup(p, HOOK_TP_BTF);
	return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(sched_wakeup_raw, struct task_struct *p)
{
	on_wakeup(p, HOOK_RAW_TP);
	return 0;
}

/*
 * Whether a kernel stack (`nr` frames at `ips`, innermost first) is that of
 * an interrupt or a softirq rather than of the current task: one of its
 * frames is in a hardware interrupt's entry (x86-64's asm_common_interrupt
 * and asm_sysvec_* stubs, which lie together) or where softirqs are run.
 * Userspace gives both address ranges (0 where kallsyms hides them: then
 * it tells by the frames' names).  Returns the frames up to that one
 * (the interrupt's own; the frames of whatever it interrupted, below,
 * tell nothing of the wake-up and would make every wake-up of a timer a
 * waker of its own), or 0 for a task's stack.
 */
static __always_inline long interrupt_stack(__u64 *ips, long nr)
{
	int i;

	for (i = 0; i < MAX_INTERRUPT_SCAN; i++) {
		__u64 ip;

		if (i >= nr)
			break;
		ip = ips[i];
		if ((ip >= irq_entry_start && ip < irq_entry_end) ||
		    (ip >= softirq_start && ip < softirq_end))
			return i + 1;
	}
	return 0;
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
 * Linux 6.12's delayed dequeue: a task that blocks owing time to the fair
 * scheduler stays on its run queue (on_rq), marked se.sched_delayed, until
 * it is picked again or woken.  It is blocked all the same.
 */
struct sched_entity___delayed {
	unsigned char sched_delayed;
} __attribute__((preserve_access_index));

struct task_struct___delayed {
	struct sched_entity___delayed se;
} __attribute__((preserve_access_index));

/* Whether `p` is runnable (on its run queue, not blocked in a delayed
 * dequeue): a wake-up of it ends no block. */
static __always_inline bool runnable(struct task_struct *p)
{
	struct task_struct___delayed *q = (void *)p;

	if (!BPF_CORE_READ(p, on_rq))
		return false;
	if (bpf_core_field_exists(q->se.sched_delayed) && BPF_CORE_READ(q, se.sched_delayed))
		return false;
	return true;
}

/*
 * --wakers: `p` is being woken, in the context of the task that wakes it
 * (current).  Only a wake-up that ends a block is kept: p is off its run
 * queue (it blocked, or is blocking on another CPU right now, its
 * switch-out about to be seen), or on it in a delayed dequeue.  The kernel serializes wakers of a task,
 * and only the first finds it asleep: one waker per block.  From an
 * interrupt, current is whatever task was interrupted; userspace tells
 * that from the kernel stack (an interrupt entry frame) and shows the
 * interrupt, not the task, as the waker.
 */
static __always_inline void on_waking(void *ctx, struct task_struct *p, const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	bool legacy = variant & VARIANT_LEGACY;
	struct task_struct *waker = trusted ? bpf_get_current_task_btf()
					    : (struct task_struct *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = BPF_CORE_READ(p, pid);
	struct waker_info w = {};
	struct task_data *d, *wd;
	bool kthread;
	__u32 zero = 0;
	__u64 *buf, now;
	long len, irq = 0;

	if (tid == 0 || runnable(p))
		return;
	d = get_data(p, tid, trusted, false);
	if (!d)
		return;
	/* The kernel stack always: it tells an interrupt from a task. */
	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return;
	len = bpf_get_stack(ctx, buf, clamp_stack_bytes(), 0);
	if (len > 0)
		irq = interrupt_stack(buf, len / sizeof(__u64));
	/* An interrupt's frames end at its entry (the stored frames end at
	 * the first 0). */
	if (irq > 0 && irq <= MAX_INTERRUPT_SCAN)
		buf[irq] = 0;
	w.kernel_stack_id = store_stack(irq ? irq * (long)sizeof(__u64) : len, false);
	if (irq) {
		/* Not the interrupted task's doing: no task, no user stack. */
		now = bpf_ktime_get_ns();
		w.dev = disk_just_done(now);
		d->waker_id = store_waker(&w);
		d->waking_ns = now;
		count(CNT_WAKERS);
		return;
	}
	kthread = is_kthread(waker, false);
	w.tgid = id >> 32;
	w.pid = (__u32)id;
	w.process_start = process_start(waker);
	bpf_get_current_comm(&w.comm, sizeof(w.comm));
	if (want_user_stack && waker_user_stacks && !kthread && w.pid)
		w.user_stack_id = stack_of_current(ctx, true, legacy, trusted, 0);
	if (!legacy && want_user_stack && waker_user_stacks && runtimes_present())
		w.user_stack_id = runtime_stack_of_current(w.user_stack_id, w.tgid);
	d->waker_id = store_waker(&w);
	d->waking_ns = bpf_ktime_get_ns();
	count(CNT_WAKERS);
	/* The waker's process may be one that is not traced: its mappings
	 * are needed to name its user frames. */
	if (notify_new_tasks && !kthread && w.pid) {
		wd = get_data(waker, w.pid, trusted, true);
		if (wd)
			notify_new_mappings(waker, wd, w.tgid, w.pid, false);
	}
}

SEC("tp_btf/sched_waking")
int BPF_PROG(sched_waking_btf, struct task_struct *p)
{
	RUNTIME_BUILD(rt_build_waking);
	on_waking(ctx, p, HOOK_TP_BTF);
	return 0;
}

SEC("raw_tp/sched_waking")
int BPF_PROG(sched_waking_raw, struct task_struct *p)
{
	on_waking(ctx, p, HOOK_RAW_TP);
	return 0;
}


SEC("raw_tp/sched_waking")
int BPF_PROG(sched_waking_legacy, struct task_struct *p)
{
	on_waking(ctx, p, HOOK_RAW_TP | VARIANT_LEGACY);
	return 0;
}

#endif /* __OFFCPUTIME_WAKERS_H__ */
