/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The stacks of the current task: walked with the tables of its process or
 * its files, copied, or through the kernel's helper.
 */
#ifndef __OFFCPUTIME_CURRENT_STACK_H__
#define __OFFCPUTIME_CURRENT_STACK_H__

/*
 * The current task's user stack, copied for userspace to walk (see struct
 * deferred_stack): its id, STACK_ID_MISSED_ERROR where the ring buffer has
 * no room (counted), or USTACK_NO_REGS where its registers cannot be
 * read (or are not of its address space, see task_regs_stale()).  The stack is read a page at a time from the page of the stack
 * pointer, up to DEFERRED_STACK_PAGES or the first page that cannot be
 * read (the top of the stack).  A global function, checked once on its
 * own.
 */
__noinline __u64 defer_user_stack(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct unwind_state u = {};
	struct deferred_scratch *d;
	__u32 zero = 0;
	__u64 base, len = 0, now;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	int i;

	d = bpf_map_lookup_elem(&deferred_scratch, &zero);
	if (!d)
		return USTACK_NO_TABLES;
	/* No address space (an exiting task): no user memory to copy. */
	if (read_user_regs(task, &u) || !BPF_CORE_READ(task, mm))
		return USTACK_NO_REGS;
	now = bpf_ktime_get_ns();
	d->credit_ns += now - d->credit_at;
	d->credit_at = now;
	if (d->credit_ns > DEFERRED_COPY_NS * DEFERRED_COPY_BURST)
		d->credit_ns = DEFERRED_COPY_NS * DEFERRED_COPY_BURST;
	if (d->credit_ns < DEFERRED_COPY_NS) {
		count(CNT_UNWIND_DEFER_PACED);
		return STACK_ID_MISSED_ERROR;
	}
	d->credit_ns -= DEFERRED_COPY_NS;
	d->seq++;
	d->s.id = STACK_ID_DEFERRED_BIT | (__u64)bpf_get_smp_processor_id() << 40 |
		  (d->seq & ((1ULL << 40) - 1));
	d->s.tgid = pid_tgid >> 32;
	d->s.pid = (__u32)pid_tgid;
	d->s.process_start = BPF_CORE_READ(task, group_leader, start_boottime);
	d->s.mm = address_space(task, &d->s.exec_vm);
	d->s.pc = u.pc;
	d->s.sp = u.sp;
	d->s.bp = u.bp;
	d->s.ax = !u.ax_zero;
	d->s._pad = 0;
	/* Whole pages from the one that holds the stack pointer, up to the
	 * first that cannot be read (the top of the stack): reads of a
	 * constant size at constant offsets, which every verifier follows. */
	base = u.sp & ~4095ULL;
	for (i = 0; i < DEFERRED_STACK_PAGES; i++) {
		if (bpf_probe_read_user(&d->s.bytes[i * 4096], 4096, (void *)(base + i * 4096)))
			break;
		len += 4096;
	}
	d->s.len = len;
	if (bpf_ringbuf_output(&deferred_stacks, &d->s, DEFERRED_HEADER_BYTES + len, 0)) {
		count(CNT_UNWIND_DEFER_LOST);
		return STACK_ID_MISSED_ERROR;
	}
	count(CNT_UNWIND_DEFERRED);
	return d->s.id;
}

/*
 * Tells userspace which mappings the current task's walk through files
 * went through (struct mapped_event), for the first MAPPED_NOTICES walks
 * of its process in this address space.
 */
__noinline int send_mapped(__u64 mm, __u64 exec_vm, __u64 pid_tgid, __u64 start,
			   bool start_iter)
{
	__u32 tgid = pid_tgid >> 32, i, n;
	struct mapped_sent *m, fresh = { .mm = mm, .exec_vm = exec_vm };
	struct file_scratch *s = file_scratch_of(start_iter);
	struct mapped_event *ev;

	if (!s || !s->used)
		return 0;
	m = bpf_map_lookup_elem(&mapped_procs, &tgid);
	if (!m || m->mm != mm || m->exec_vm != exec_vm) {
		bpf_map_update_elem(&mapped_procs, &tgid, &fresh, BPF_ANY);
		m = bpf_map_lookup_elem(&mapped_procs, &tgid);
		if (!m)
			return 0;
	}
	if (m->sent >= MAPPED_NOTICES)
		return 0;
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		count(CNT_EVENTS_DROPPED);
		return 0;
	}
	m->sent++;
	ev->e.tgid = tgid;
	ev->e.pid = (__u32)pid_tgid;
	ev->e.kind = TASK_EVENT_MAPPED;
	ev->e.parent = 0;
	ev->e.map_start = 0;
	ev->e.map_count = 0;
	ev->e.process_start = start;
	ev->e.mm = mm;
	ev->e.exec_vm = exec_vm;
	n = s->used;
	ev->count = n;
	ev->_pad = 0;
	for (i = 0; i < MAPPED_VMAS; i++)
		ev->vma[i] = s->vma[i];
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

/*
 * The current task's user stack, walked through the tables of the files its
 * process maps (see file_rule()) where it has no tables of its own, and
 * stored: its stack id, or USTACK_NO_TABLES where a file without tables
 * was met (or the kernel keeps no maple tree: before 6.1).  A global
 * function, called from the hook itself with little of its own on the
 * stack (see struct file_scratch).
 */
__noinline __u64 user_stack_by_files(bool cache)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct ucache_ways *set = NULL;
	struct file_scratch *s;
	__u32 zero = 0, idx, way = 0;
	__u64 *ips, *files_gen, exec_vm, mm, gen, id;

	if (!unwind_by_file || !bpf_core_field_exists(((struct mm_struct *)0)->mm_mt))
		return USTACK_NO_TABLES;
	s = bpf_map_lookup_elem(&file_scratch, &zero);
	files_gen = bpf_map_lookup_elem(&unwind_files_gen, &zero);
	if (!s || !files_gen)
		return USTACK_NO_TABLES;
	mm = task_address_space(task, &exec_vm, true);
	if (!mm)
		return USTACK_NO_TABLES;
	__builtin_memset(&s->st, 0, sizeof(s->st));
	if (read_user_regs(task, &s->st))
		return USTACK_NO_TABLES;
	/* Apart from the generations of processes' own tables (counted up
	 * from 1 by userspace): the files' entries, and the executable
	 * mappings of the address space. */
	gen = 1ULL << 63 | (*files_gen & 0x7fffffff) << 32 | (exec_vm & 0xffffffff);
	if (ucache_on && cache) {
		set = bpf_task_storage_get(&ucache_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (set)
			way = ucache_way(set, &s->st);
		ucache_begin(&s->st);
		if (set && !(way & UCACHE_NEW_WAY) && (id = ucache_proved(way, mm, gen, s->st.bp))) {
			count(CNT_UNWIND_DWARF);
			count(CNT_UNWIND_BY_FILE);
			count(CNT_UNWIND_CACHED);
			return id;
		}
	}
	s->st.max = clamp_stack_bytes() / sizeof(__u64);
	s->st.tgid = bpf_get_current_pid_tgid() >> 32;
	s->st.java = java_walkable(s->st.tgid, NULL);
	s->st.v8 = !s->st.java && v8_walkable_of_current(s->st.tgid);
	s->mm = mm;
	s->needs_tables = 0;
	s->used = 0;
	s->walk++;
	bpf_loop(MAX_STACK_DEPTH, unwind_step_files, NULL, 0);
	ips = bpf_map_lookup_elem(&scratch, &zero);
	if (!ips || s->needs_tables)
		return USTACK_NO_TABLES;
	idx = s->st.nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		ips[idx & MAX_STACK_DEPTH] = 0;
	}
	count(CNT_UNWIND_DWARF);
	count(CNT_UNWIND_BY_FILE);
	COUNT_WALK(&s->st);
	send_mapped(mm, exec_vm, bpf_get_current_pid_tgid(),
		    task_process_start(task, true), false);
	id = store_stack(s->st.nr * sizeof(__u64), true);
	if (set)
		ucache_keep(way & (UCACHE_WAYS - 1), mm, gen, id);
	return id;
}

/*
 * The current task's user stack, walked with its process's tables (or
 * proved the same as at its last walk, see struct ucache) and stored: its
 * stack id, or USTACK_NO_TABLES.  A global function, checked once on its
 * own (see unwind_rule).
 */
/* `now` of user_stack_of_current(): read the clock for the last-use mark
 * (a constant: the kprobe hook's frame, which holds its own time, is at
 * 6.1's limit of the stack of a call chain); 0: no mark (wakers). */
#define USED_READ_CLOCK 1
/* `mm` of user_stack_of_current(): the address space is read there (no
 * address space is at 1). */
#define SPACE_UNREAD 1

/* `mm`, `exec_vm`: the current task's address space and the size of its
 * executable mappings, as its caller read them (task_address_space()), or
 * SPACE_UNREAD. */
__noinline __u64 user_stack_of_current(bool cache, __u64 now, __u64 mm, __u64 exec_vm)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct unwind_proc *p;
	struct ucache_ways *set;
	struct unwind_state *u;
	struct file_scratch *s;
	__u32 zero = 0, way = 0;
	__u64 id, gen;

	if (mm == SPACE_UNREAD)
		mm = task_address_space(task, &exec_vm, true);
	p = tables_of(bpf_get_current_pid_tgid() >> 32, mm, exec_vm);
	if (!p)
		return USTACK_NO_TABLES;
	/* The walk's state is where its step (unwind_step_of_current())
	 * finds it. */
	s = bpf_map_lookup_elem(&file_scratch, &zero);
	if (!s)
		return USTACK_NO_TABLES;
	u = &s->st;
	__builtin_memset(u, 0, sizeof(*u));
	/* A block: the process uses its tables (see struct unwind_proc). */
	if (now == USED_READ_CLOCK)
		now = bpf_ktime_get_ns();
	if (now && now - p->used > USED_GRAIN_NS)
		p->used = now;
	if (read_user_regs(task, u))
		return USTACK_NO_REGS;
	gen = p->gen;
	if (ucache_on && cache) {
		set = bpf_task_storage_get(&ucache_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (set)
			way = ucache_way(set, u);
		ucache_begin(u);
		if (set && !(way & UCACHE_NEW_WAY) && (id = ucache_proved(way, mm, gen, u->bp))) {
			count(CNT_UNWIND_DWARF);
			count(CNT_UNWIND_CACHED);
			return id;
		}
	}
	walk_with_tables(u, p, NULL);
	id = store_stack(u->nr * sizeof(__u64), true);
	if (set)
		ucache_keep(way & (UCACHE_WAYS - 1), mm, gen, id);
	return id;
}

/* The user or kernel stack of the current task.  `legacy`: a program for
 * kernels without bpf_loop, which walks with frame pointers only.  `mm`,
 * `exec_vm`: see user_stack_of_current(). */
static __always_inline __u64 stack_of_current_in(void *ctx, bool user, bool legacy, bool cache,
						 __u64 now, __u64 mm, __u64 exec_vm)
{
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&scratch, &zero);
	__u64 id;
	long len;

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	if (user && unwind_dwarf && !legacy) {
		id = user_stack_of_current(cache, now, mm, exec_vm);
		if (id == USTACK_NO_TABLES) {
			id = user_stack_by_files(cache);
			if (id == USTACK_NO_TABLES)
				id = defer_user_stack();
		}
		if (id != USTACK_NO_TABLES && id != USTACK_NO_REGS)
			return id;
		if (id == USTACK_NO_TABLES)
			count(CNT_UNWIND_NOT_READY);
	}
	/* Registers of the image an exec replaces, over the new image's
	 * memory (see task_regs_stale): no walk from them, nor
	 * bpf_get_stack()'s. */
	if (user && task_regs_stale_read((struct task_struct *)bpf_get_current_task())) {
		count(CNT_USTACK_IN_EXEC);
		return STACK_ID_MISSED_ERROR;
	}
	len = bpf_get_stack(ctx, buf, clamp_stack_bytes(), user ? BPF_F_USER_STACK : 0);
	return store_stack(len, user);
}

static __always_inline __u64 stack_of_current(void *ctx, bool user, bool legacy, bool cache,
					      __u64 now)
{
	return stack_of_current_in(ctx, user, legacy, cache, now, SPACE_UNREAD, 0);
}

#endif /* __OFFCPUTIME_CURRENT_STACK_H__ */
