// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Floor programs for the overhead benchmark (scripts/bench-overhead): the
 * least work any off-CPU profiler on tp_btf/sched_switch must do, against
 * which the real program's cost per switch is compared. Each walks the
 * outgoing task's stacks into a per-CPU buffer, at the profiler's default
 * depth, and keeps nothing. Like every profiler they leave out the idle
 * task (pid 0), whose "blocks" are CPU time, and kernel threads have no user
 * stack to walk. Loaded one at a time by examples/floor.rs.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "offcputime.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[MAX_STACK_DEPTH]);
} buffer SEC(".maps");

/* Frames walked by floor_kernel_top: a shallow walk. */
const volatile __u32 top_frames = 8;

#define PF_KTHREAD 0x00200000

/* The per-CPU buffer, or NULL when prev is the idle task. */
static __always_inline __u64 *buf(struct task_struct *prev)
{
	__u32 zero = 0;

	if (prev->pid == 0)
		return NULL;
	return bpf_map_lookup_elem(&buffer, &zero);
}

static __always_inline bool has_user_stack(struct task_struct *prev)
{
	return !(prev->flags & PF_KTHREAD);
}

/* Nothing: the cost of running a program on every switch at all. */
SEC("tp_btf/sched_switch")
int BPF_PROG(floor_empty, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_kernel, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *b = buf(prev);

	if (b)
		bpf_get_stack(ctx, b, MAX_STACK_DEPTH * sizeof(__u64), 0);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_user, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *b = buf(prev);

	if (b && has_user_stack(prev))
		bpf_get_stack(ctx, b, MAX_STACK_DEPTH * sizeof(__u64), BPF_F_USER_STACK);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_both, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *b = buf(prev);

	if (!b)
		return 0;
	bpf_get_stack(ctx, b, MAX_STACK_DEPTH * sizeof(__u64), 0);
	if (has_user_stack(prev))
		bpf_get_stack(ctx, b, MAX_STACK_DEPTH * sizeof(__u64), BPF_F_USER_STACK);
	return 0;
}

/* Only the innermost top_frames kernel frames. */
SEC("tp_btf/sched_switch")
int BPF_PROG(floor_ktop, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *b = buf(prev);
	__u32 n = top_frames;

	if (!b)
		return 0;
	if (n < 1)
		n = 1;
	if (n > MAX_STACK_DEPTH)
		n = MAX_STACK_DEPTH;
	bpf_get_stack(ctx, b, n * sizeof(__u64), 0);
	return 0;
}

/* The kernel stack of the task switched in, walked from outside it. */
SEC("tp_btf/sched_switch")
int BPF_PROG(floor_knext, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *b = buf(prev);

	if (b)
		bpf_get_task_stack(next, b, MAX_STACK_DEPTH * sizeof(__u64), 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
