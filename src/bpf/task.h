/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Task helpers: states, kernel threads, the filters (-p, -t, -u, -k,
 * --cgroup), per-thread records.
 */
#ifndef __OFFCPUTIME_TASK_H__
#define __OFFCPUTIME_TASK_H__

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

	if (trusted) {
		struct task_local *l = bpf_task_storage_get(&task_data_storage, t, 0,
							    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);

		return l ? &l->d : NULL;
	}
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
	return task_process_start(t, false);
}

#endif /* __OFFCPUTIME_TASK_H__ */
