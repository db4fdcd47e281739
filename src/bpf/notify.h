/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Notifications to userspace: new tasks and address spaces, exits, forks.
 */
#ifndef __OFFCPUTIME_NOTIFY_H__
#define __OFFCPUTIME_NOTIFY_H__

static __always_inline bool send_event(struct task_struct *t, __u32 tgid, __u32 tid, __u32 kind)
{
	struct task_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count(CNT_EVENTS_DROPPED);
		return false;
	}
	e->tgid = tgid;
	e->pid = tid;
	e->kind = kind;
	e->parent = 0;
	e->map_start = 0;
	e->map_count = 0;
	e->process_start = process_start(t);
	e->mm = address_space(t, &e->exec_vm);
	bpf_ringbuf_submit(e, 0);
	return true;
}

/*
 * Tells userspace to snapshot the mappings of `t`'s process, the first time
 * the thread blocks and again once its address space or the size of its
 * executable mappings has changed (exec, the dynamic loader, dlopen).
 * `mm`, `exec_vm`: its address space and the size of its executable
 * mappings (task_address_space()).
 */
static __always_inline void notify_new_space(struct task_struct *t, struct task_data *d,
					     __u32 tgid, __u32 tid, bool trusted, __u64 mm,
					     __u64 exec_vm)
{
	/* No address space: the task is exiting (exit_mm() has run), and
	 * there is nothing new to snapshot. */
	if (!mm)
		return;
	if (d->notified_mm == mm && d->notified_exec_vm == exec_vm)
		return;
	/* Only past the check above: every switch-out gets there. */
	struct notified *p, now = { .start = task_process_start(t, trusted), .mm = mm,
				    .exec_vm = exec_vm };
	__u32 kind = TASK_EVENT_NEW;

	/* Another thread of the process may have told it already. */
	p = bpf_map_lookup_elem(&notified_procs, &tgid);
	if (p && p->start == now.start) {
		if (p->mm == now.mm && p->exec_vm == now.exec_vm) {
			d->notified_mm = now.mm;
			d->notified_exec_vm = now.exec_vm;
			return;
		}
		kind = TASK_EVENT_CHANGED;
	}
	/* A notice the ring buffer had no room for is sent again at the
	 * thread's next block. */
	if (!send_event(t, tgid, tid, kind))
		return;
	bpf_map_update_elem(&notified_procs, &tgid, &now, BPF_ANY);
	d->notified_mm = now.mm;
	d->notified_exec_vm = now.exec_vm;
}

/* The same, reading the address space of `t` (`mm`, `exec_vm` above). */
static __always_inline void notify_new_mappings(struct task_struct *t, struct task_data *d,
						__u32 tgid, __u32 tid, bool trusted)
{
	__u64 exec_vm, mm = task_address_space(t, &exec_vm, trusted);

	notify_new_space(t, d, tgid, tid, trusted, mm, exec_vm);
}

/*
 * `t` is switched out for the last time.  If no thread of its process is
 * left alive (signal->live, decremented by each exiting thread, is 0), the
 * process is gone: userspace can give back its unwind tables and snapshot.
 */
static __always_inline void notify_exit(struct task_struct *t, __u32 tgid, __u32 tid)
{
	/* Processes not traced are told of only if a thread of theirs woke
	 * a traced one (--wakers). */
	if (filter_by_tgid && !bpf_map_lookup_elem(&tgids, &tgid) &&
	    !bpf_map_lookup_elem(&notified_procs, &tgid))
		return;
	if (filter_by_cgroup && !bpf_map_lookup_elem(&notified_procs, &tgid) && !in_cgroups(t))
		return;
	if (BPF_CORE_READ(t, signal, live.counter) == 0) {
		bpf_map_delete_elem(&notified_procs, &tgid);
		send_event(t, tgid, tid, TASK_EVENT_EXITED);
	}
}

/*
 * A new process (not a thread) was forked: it has a copy of its parent's
 * address space, with the same mappings at the same addresses until it
 * execs or maps something, so its parent's unwind tables hold for it from
 * its first instruction.  It gets an entry that points at its parent's
 * slice of unwind_maps, for its own address space (the mm check of
 * tables_of() makes the entry stale at an exec), and userspace is told, so
 * that the slice is kept while either process uses it.  Without that
 * notice (ring buffer full) the child gets no entry: its first blocks are
 * then handled as any new process's.  The fork hook runs before the child
 * is first woken, so the notice comes before anything the child does.
 */
static __always_inline void on_fork(struct task_struct *parent, struct task_struct *child,
				    const __u32 variant)
{
	bool trusted = variant & VARIANT_TRUSTED;
	__u32 ptgid = TASK_READ(trusted, parent, tgid);
	__u32 ctgid = TASK_READ(trusted, child, tgid);
	struct unwind_proc *p, c = {};
	struct task_event *e;
	__u64 pmm, cmm, pexec_vm, cexec_vm;

	if (ptgid == ctgid || kernel_threads_only)
		return;
	if (filter_by_tgid && !bpf_map_lookup_elem(&tgids, &ctgid))
		return;
	if (filter_by_tid && !bpf_map_lookup_elem(&tids, &ctgid))
		return;
	if (filter_by_cgroup && !in_cgroups(child))
		return;
	pmm = address_space(parent, &pexec_vm);
	cmm = address_space(child, &cexec_vm);
	p = bpf_map_lookup_elem(&unwind_procs, &ptgid);
	if (!p)
		return;
	/* Tables of other mappings (an exec, a library mapped since they
	 * were written), or a child without an address space. */
	if (!cmm || !pmm || (p->mm && (p->mm != pmm || p->exec_vm != pexec_vm)))
		return;
	c.map_start = p->map_start;
	c.map_count = p->map_count;
	c.mm = cmm;
	c.exec_vm = cexec_vm;
	c.gen = p->gen;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CNT_EVENTS_DROPPED);
		return;
	}
	e->tgid = ctgid;
	e->pid = ctgid;
	e->kind = TASK_EVENT_FORKED;
	e->parent = ptgid;
	e->map_start = c.map_start;
	e->map_count = c.map_count;
	e->process_start = BPF_CORE_READ(child, start_boottime);
	e->mm = cmm;
	e->exec_vm = cexec_vm;
	if (bpf_map_update_elem(&unwind_procs, &ctgid, &c, BPF_ANY)) {
		bpf_ringbuf_discard(e, 0);
		return;
	}
	/* The child's memory is a copy of its parent's: its interpreter, if
	 * it has one, is where the parent's is.  Only with the event, which
	 * tells userspace whose code objects the child's frames name. */
	if (python_on) {
		struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &ptgid);

		if (pp && (pp->mm == pmm || !pp->mm)) {
			struct py_proc cp = *pp;

			cp.mm = cmm;
			if (!bpf_map_update_elem(&py_procs, &ctgid, &cp, BPF_ANY))
				runtime_pid_set(ctgid);
		}
	}
	bpf_ringbuf_submit(e, 0);
	count(CNT_UNWIND_FORKED);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(process_fork_btf, struct task_struct *parent, struct task_struct *child)
{
	RUNTIME_BUILD(rt_build_fork);
	on_fork(parent, child, HOOK_TP_BTF);
	return 0;
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(process_fork_raw, struct task_struct *parent, struct task_struct *child)
{
	on_fork(parent, child, HOOK_RAW_TP);
	return 0;
}

#endif /* __OFFCPUTIME_NOTIFY_H__ */
