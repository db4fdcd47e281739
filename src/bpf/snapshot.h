/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --snapshot: every task, its state, stacks and time off the CPU.
 */
#ifndef __OFFCPUTIME_SNAPSHOT_H__
#define __OFFCPUTIME_SNAPSHOT_H__

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

static __always_inline void snapshot_one(struct bpf_iter__task *ctx, const __u32 variant)
{
	bool user_stacks = variant & VARIANT_USER_STACKS;
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
				rec.kernel_stack_id = kernel_stack_of_task(task, true);
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
	snapshot_one(ctx, VARIANT_TRUSTED | VARIANT_USER_STACKS);
	return 0;
}

/* Where the kernel cannot read another task's user memory (before 5.18):
 * no user stacks. */
SEC("iter/task")
int snapshot_tasks(struct bpf_iter__task *ctx)
{
	snapshot_one(ctx, VARIANT_TRUSTED);
	return 0;
}

#endif /* __OFFCPUTIME_SNAPSHOT_H__ */
