/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The stack cache: a kept user walk proved unchanged (same registers, every
 * stack slot it read unchanged) instead of walked again.
 */
#ifndef __OFFCPUTIME_STACK_CACHE_H__
#define __OFFCPUTIME_STACK_CACHE_H__

/*
 * Keeps the shape `val` of a proof under `*key` in the shapes table `map`
 * (ucache_shapes, korc_shapes), unless some thread's walk kept it already:
 * a shape is added once and never changed.  False where the table is full
 * (counted): the walk is not kept.  `key` points into a map's memory, as
 * the verifiers before 6.1 want a map key to.
 */
#define keep_shape(map, key, val)                                                  \
	({                                                                         \
		bool kept_ = true;                                                 \
		if (!bpf_map_lookup_elem(map, key)) {                              \
			long err_ = bpf_map_update_elem(map, key, val, BPF_NOEXIST); \
			if (err_ && err_ != -EEXIST) {                             \
				count(CNT_SHAPES_FULL);                            \
				kept_ = false;                                     \
			}                                                          \
		}                                                                  \
		kept_;                                                             \
	})

/* Slots checked per bpf_loop step: the verifier checks the slots of one
 * step, each of them a few times over (an unrolled check of every slot was
 * half of the switch hook's verification; 16 a step, a third).  A step is
 * a call, its walk and window passed by its caller: 4 slots a step cost no
 * more per switch than 16 (measured with perf bench sched pipe and in
 * CPython). */
#define UCACHE_STEP 4

/* Reads the stack from `addr` into the window `w` (struct ucache_window),
 * up to `top` (the end of the walk's highest slot) and at most
 * UCACHE_WINDOW bytes; where that cannot be read, UCACHE_RANGE bytes or 8.
 * 0 where something was read. */
static __always_inline int ucache_read(struct ucache_window *w, __u64 addr, __u64 top)
{
	__u64 len;

	len = top - addr;
	if (top < addr + 8 || len > UCACHE_WINDOW)
		len = UCACHE_WINDOW;
	/* The bound, for the verifier. */
	asm volatile("" : "+r"(len));
	len &= 2 * UCACHE_WINDOW - 1;
	if (len < 8 || len > UCACHE_WINDOW)
		return -1;
	if (!bpf_probe_read_user(w->bytes, len, (void *)addr))
		w->have = len;
	else if (!bpf_probe_read_user(w->bytes, UCACHE_RANGE, (void *)addr))
		w->have = UCACHE_RANGE;
	else if (!bpf_probe_read_user(w->bytes, 8, (void *)addr))
		w->have = 8;
	else
		return -1;
	w->base = addr;
	return 0;
}

/* ucache_read() where a slot lies past the window (the first read is
 * ucache_proved()'s): a global function, which the verifier checks
 * once, not within each slot of a step (inline, the slots of a step were a
 * seventh of the switch hook's verification). */
__noinline int ucache_window_read(__u64 addr, __u64 top)
{
	struct ucache_window *w;
	__u32 zero = 0;

	w = bpf_map_lookup_elem(&ucache_window, &zero);
	if (!w)
		return -1;
	return ucache_read(w, addr, top);
}

/* The hash of the UCACHE_RANGE bytes at `off` in the window (a range
 * slot's, see ucache_range_hash()).  A global function: unrolled, the
 * hash took half of a step's verification, and range slots are few. */
__noinline __u64 ucache_window_hash(__u64 off, __u64 skip)
{
	struct ucache_window *w;
	__u32 zero = 0;

	w = bpf_map_lookup_elem(&ucache_window, &zero);
	if (!w)
		return 0;
	return ucache_range_hash((__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1))), skip);
}

/* The current thread's kept walk `way`, or NULL (its storage created where
 * `create`). */
static __always_inline struct ucache *ucache_entry(__u32 way, bool create)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 flags = create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0;
	struct ucache_ways *set;
	struct ucache_pair *more;

	if (way & 2) {
		more = bpf_task_storage_get(&ucache_more, task, 0, flags);
		if (!more)
			return NULL;
		/* Not to be offset before it is checked (the compiler would
		 * select between the two after adding). */
		asm volatile("" : "+r"(more));
		return &more->way[way & 1];
	}
	if (way & 1)
		return bpf_task_storage_get(&ucache_second, task, 0, flags);
	set = bpf_task_storage_get(&ucache_storage, task, 0, flags);
	return set ? &set->way0 : NULL;
}

/* Whether `task` has the storage of its way `way`. */
static __always_inline bool ucache_has(struct task_struct *task, __u32 way)
{
	if (way & 2)
		return bpf_task_storage_get(&ucache_more, task, 0, 0) != NULL;
	if (way & 1)
		return bpf_task_storage_get(&ucache_second, task, 0, 0) != NULL;
	return true;
}

/* What tells the registers a walk started from apart (struct
 * ucache_ways' `wanted`): a mix of its pc and sp. */
static __always_inline __u64 ucache_regs_tag(__u64 pc, __u64 sp)
{
	return ucache_mix(ucache_mix(UCACHE_HASH_SEED, pc), sp);
}

/* What each step checks: the kept walk, its slots' places and the window
 * (looked up once, by ucache_proved()). */
struct ucache_step_ctx {
	struct ucache *e;
	struct ucache_shape *s;
	struct ucache_window *w;
};

/* Where slot `at` of a walk from `sp` is. */
static __always_inline __u64 ucache_slot_addr(__u64 sp, __u32 at)
{
	if (at & UCACHE_RANGE_BIT)
		return sp + ((__u64)(at & UCACHE_RANGE_OFF_MAX) << 3);
	return sp + ((__u64)(at & UCACHE_WORD_MAX) << 3);
}

static long ucache_slots_step(__u32 i, void *arg)
{
	struct ucache_step_ctx *c = arg;
	struct ucache_window *w = c->w;
	struct ucache_shape *s = c->s;
	struct ucache *e = c->e;
	__u64 addr, off, span, v;
	__u32 k, at, j;

	if (!w || !e || !s)
		return 1;
	for (j = 0; j < UCACHE_STEP; j++) {
		k = w->k;
		if (k >= UCACHE_SLOTS || k >= e->n) {
			w->holds = 1;
			return 1;
		}
		/* Masked where it indexes (the compiler would drop a mask it
		 * can prove idle, and index from a copy the verifier has no
		 * bound for). */
		asm volatile("" : "+r"(k));
		k &= UCACHE_SLOTS - 1;
		at = s->off[k];
		span = at & UCACHE_RANGE_BIT ? UCACHE_RANGE : 8;
		addr = ucache_slot_addr(e->sp, at);
		off = addr - w->base;
		if (addr < w->base || off + span > w->have) {
			if (ucache_window_read(addr, e->sp + e->top) || span > w->have)
				goto fails;
			off = 0;
		}
		/* Through memory, read back as a number the verifier does not
		 * know: one state goes on from here, not one for each way
		 * here. */
		*(volatile __u64 *)&w->off = off;
		off = *(volatile __u64 *)&w->off;
		if (at & UCACHE_RANGE_BIT)
			v = ucache_window_hash(off, (at >> UCACHE_RANGE_SKIP_SHIFT) &
							UCACHE_RANGE_SKIP_MAX);
		else
			v = *(__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1)));
		w->hash = ucache_mix(w->hash, v);
		w->k = k + 1;
	}
	return 0;
fails:
	w->holds = 0;
	return 1;
}

/* The way of `set` kept from the registers in `u` (its index), else the
 * one to keep a new walk in, UCACHE_NEW_WAY added: the first that keeps
 * nothing (so that a thread's ways fill its storages in order), else the
 * one proved or kept least recently. */
#define UCACHE_NEW_WAY 0x100
static __always_inline __u32 ucache_way(struct ucache_ways *set, struct unwind_state *u)
{
	__u32 i, old = 0, free = UCACHE_WAYS, way = UCACHE_NEW_WAY;
	__u64 regs = ucache_regs_tag(u->pc, u->sp);

	for (i = 0; i < UCACHE_WAYS; i++) {
		if (set->kept & 1U << i) {
			if (set->regs[i] == regs) {
				way = i;
				break;
			}
		} else if (free == UCACHE_WAYS) {
			free = i;
		}
		if (set->tick - set->used[i] > set->tick - set->used[old])
			old = i;
	}
	if (way == UCACHE_NEW_WAY)
		way |= free < UCACHE_WAYS ? free : old;
	set->used[way & (UCACHE_WAYS - 1)] = ++set->tick;
	return way;
}

/* Begins the proof of the walk from the registers in `u`, in
 * ucache_scratch (its slots are noted as they are read, note_proof()). */
static __always_inline void ucache_begin(struct unwind_state *u)
{
	struct ucache_walk *pr;
	__u32 zero = 0;

	pr = bpf_map_lookup_elem(&ucache_scratch, &zero);
	if (!pr)
		return;
	pr->e.n = 0;
	pr->e.top = 0;
	pr->e.hash = UCACHE_HASH_SEED;
	pr->e.shape = UCACHE_HASH_SEED;
	pr->e.pc = u->pc;
	pr->e.sp = u->sp;
	pr->e.bp = u->bp;
}

/*
 * The stack id of the current thread's kept walk `way` where it holds for
 * the walk under way (struct ucache: its pc and sp, found by ucache_way()
 * and in ucache_scratch, its frame pointer `bp`), the address space `mm` and the
 * tables of generation `gen`, its frames counted; else 0.  The slots'
 * stack memory is read a window at a time, from a slot up to the end of
 * the highest (up to UCACHE_WINDOW bytes: the slots of a walk usually lie
 * in less); where that would cross into memory that cannot be read, the
 * slot alone.  In a global function: checked by the verifier once, for
 * every storage of the ways.
 */
__noinline __u64 ucache_proved(__u32 way, __u64 mm, __u64 gen, __u64 bp)
{
	struct ucache_step_ctx c;
	struct ucache_window *w;
	struct ucache_walk *pr;
	struct ucache_shape *s;
	struct ucache *e;
	__u32 zero = 0;

	w = bpf_map_lookup_elem(&ucache_window, &zero);
	pr = bpf_map_lookup_elem(&ucache_scratch, &zero);
	e = ucache_entry(way, false);
	if (!w || !e || !pr)
		return 0;
	/* The way was found by a hash of the registers: they are compared
	 * whole here (the walk under way's, in ucache_scratch). */
	if (!e->stack_id || e->pc != pr->e.pc || e->sp != pr->e.sp || e->mm != mm ||
	    e->gen != gen || e->runtimes != runtime_build() || (e->bp_used && e->bp != bp))
		return 0;
	/* Its slots' places, kept under the key the way holds (a place
	 * not where it was would fail the hash of the slots' values but
	 * for a chance of one in 2^64, as a value changed would). */
	s = bpf_map_lookup_elem(&ucache_shapes, &e->shape);
	if (!s)
		return 0;
	w->base = 0;
	w->have = 0;
	w->k = 0;
	w->holds = -1;
	w->hash = UCACHE_HASH_SEED;
	/* The window from the first slot on, here (the steps call a
	 * function only where a slot is past it). */
	if (e->n && ucache_read(w, ucache_slot_addr(e->sp, s->off[0]), e->sp + e->top))
		return 0;
	c.e = e;
	c.s = s;
	c.w = w;
	bpf_loop(UCACHE_SLOTS / UCACHE_STEP, ucache_slots_step, &c, 0);
	/* Undecided after every step: all UCACHE_SLOTS slots read.  The walk
	 * holds where they hash to what they did. */
	if (!(w->holds == 1 || (w->holds < 0 && w->k >= UCACHE_SLOTS)) || w->hash != e->hash)
		return 0;
	COUNT_WALK(e);
	return e->stack_id;
}

/*
 * Keeps the walk under way (struct file_scratch; its slots in
 * ucache_scratch), whose frames were stored as `id`, as the current
 * thread's way `way`, or nothing where it cannot be proved again.  A
 * global function, like ucache_proved().
 */
__noinline int ucache_keep(__u32 way, __u64 mm, __u64 gen, __u64 id)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct ucache_ways *set;
	struct file_scratch *s;
	struct ucache_walk *pr;
	struct unwind_state *u;
	struct ucache *e;
	__u32 zero = 0, bit = 1U << (way & (UCACHE_WAYS - 1));
	__u64 tag;

	set = bpf_task_storage_get(&ucache_storage, task, 0, 0);
	if (!set)
		return 0;
	set->kept &= ~bit;
	s = bpf_map_lookup_elem(&file_scratch, &zero);
	pr = bpf_map_lookup_elem(&ucache_scratch, &zero);
	if (!s || !pr)
		return 0;
	u = &s->st;
	if (u->unprovable || !(id & STACK_ID_HASH_BIT))
		return 0;
	/* A way in a storage the thread does not have yet: only for
	 * registers met again among the last such walks. */
	tag = ucache_regs_tag(pr->e.pc, pr->e.sp);
	if (!ucache_has(task, way)) {
		if (set->wanted[0] != tag && set->wanted[1] != tag && set->wanted[2] != tag &&
		    set->wanted[3] != tag) {
			set->wanted[set->tick & (UCACHE_WAYS - 1)] = tag;
			return 0;
		}
	}
	/* The slots' places, unless some thread's walk kept them already.
	 * The key is kept in the walk's scratch (a map's memory, not one
	 * more word on this function's stack). */
	pr->e.shape = ucache_mix(pr->e.shape, pr->e.n);
	if (!keep_shape(&ucache_shapes, &pr->e.shape, &pr->s))
		return 0;
	e = ucache_entry(way, true);
	if (!e)
		return 0;
	e->hash = pr->e.hash;
	e->shape = pr->e.shape;
	e->n = pr->e.n;
	e->top = pr->e.top;
	e->mm = mm;
	e->gen = gen;
	e->pc = pr->e.pc;
	e->sp = pr->e.sp;
	e->bp = pr->e.bp;
	e->bp_used = u->bp_used;
	e->truncated = u->truncated;
	e->fp_frames = u->fp_frames;
	e->gap_frames = u->gap_frames;
	e->rt_frames = u->rt_frames;
	e->v8 = u->v8;
	e->runtimes = runtime_build();
	e->stack_id = id;
	set->regs[way & (UCACHE_WAYS - 1)] = tag;
	set->kept |= bit;
	return 0;
}

#endif /* __OFFCPUTIME_STACK_CACHE_H__ */
