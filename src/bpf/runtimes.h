/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The one place where the native walk meets the runtimes' frames read
 * apart from it: the hooks, the iterators and the refresh call these, and
 * these call the walker of the process's runtime (python.h).  A runtime's
 * frames are words of the user stack marked as its own (PY_FRAME_MARK),
 * which userspace puts in their places among the native frames.  A
 * runtime whose frames are the native stack's own (HotSpot's, java.h) is
 * walked in the native walk instead (dwarf.h), its words in place.
 */
#ifndef __OFFCPUTIME_RUNTIMES_H__
#define __OFFCPUTIME_RUNTIMES_H__

/* Whether any process has a runtime's entry: the hooks' test before
 * anything else (a load). */
static __always_inline bool runtimes_present(void)
{
	return runtimes_on && rt_any;
}

/*
 * The current task's user stack `id` (of process `tgid`), just walked or
 * proved unchanged, with its runtime's frames where its process has a
 * runtime known: the id of that stack, stored, or `id` itself.
 */
static __always_inline __u64 runtime_stack_of_current(__u64 id, __u32 tgid)
{
	if (python_on)
		return python_stack_of_current(id, tgid, 0, 0);
	return id;
}

/* The same at the switch-out of thread `d` at `now`, in address space `mm`,
 * where a process whose runtime has not started is left alone for a
 * while. */
static __always_inline __u64 runtime_stack_at_switch_out(struct task_data *d, __u64 id,
							 __u32 tgid, __u64 now, __u64 mm)
{
	if (python_on)
		return python_stack_at_switch_out(d, id, tgid, now, mm);
	return id;
}

/* Whether stored stack `id` has a runtime's frames. */
static __always_inline bool has_runtime_frames(__u64 id)
{
	return python_on && has_python_frames(id);
}

/*
 * Appends the runtime's frames of `task`, a thread of process `tgid` other
 * than the current task, to its user stack in `start_scratch` (`nr` words
 * so far); returns the stack's new length in words.  Only from the
 * sleepable iterators.
 */
static __always_inline __u32 runtime_frames_of_task(struct task_struct *task, __u32 tgid,
						    __u32 nr)
{
	if (python_on)
		return python_frames_of_task(task, tgid, nr);
	return nr;
}

#endif /* __OFFCPUTIME_RUNTIMES_H__ */
