/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The stack cache: a kept user walk proved unchanged (same registers, every
 * stack slot it read unchanged) instead of walked again.
 */
#ifndef __OFFCPUTIME_STACK_CACHE_H__
#define __OFFCPUTIME_STACK_CACHE_H__

/* Checking a kept walk's slots (struct ucache), one per bpf_loop call:
 * more per call (unrolled) multiply the paths the verifier follows. */
struct ucache_check {
	struct ucache *e;
	/* Every slot checked, and each held what it held. */
	bool holds;
};

static long ucache_check_step(__u32 i, void *arg)
{
	struct ucache_check *v = arg;
	struct ucache *e = v->e;
	__u32 zero = 0, k = i;
	__u64 addr, off, val, len;
	struct ucache_window *w = bpf_map_lookup_elem(&ucache_window, &zero);

	if (!w || !e)
		return 1;
	/* `i`, not a count kept in `v`: the verifier would follow a count
	 * from its known start through every value. */
	if (k >= e->n || k >= UCACHE_SLOTS) {
		v->holds = k >= e->n;
		return 1;
	}
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(k));
	k &= UCACHE_SLOTS - 1;
	addr = e->sp + e->off[k];
	off = addr - w->base;
	if (i == 0 || addr < w->base || off + 8 > w->len) {
		/* The stack from this slot up to the end of the highest, in
		 * one read (up to UCACHE_WINDOW bytes: the slots of a walk
		 * usually lie in less); where that would cross into memory
		 * that cannot be read, the slot alone. */
		len = e->sp + e->top - addr;
		if (e->sp + e->top < addr + 8 || len > UCACHE_WINDOW)
			len = UCACHE_WINDOW;
		/* The bound, for the verifier. */
		asm volatile("" : "+r"(len));
		len &= 2 * UCACHE_WINDOW - 1;
		if (len < 8 || len > UCACHE_WINDOW)
			return 1;
		w->base = addr;
		w->len = 0;
		off = 0;
		if (!bpf_probe_read_user(w->bytes, len, (void *)addr))
			w->len = len;
		else if (!bpf_probe_read_user(w->bytes, 8, (void *)addr))
			w->len = 8;
		else
			return 1;
	}
	val = *(__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1)));
	return val == e->val[k] ? 0 : 1;
}

/* Whether the current thread's kept walk `e` holds for the registers in
 * `u`, the address space `mm` and the tables of generation `gen`: the
 * proof of struct ucache. */
static __always_inline bool ucache_holds(struct ucache *e, struct unwind_state *u,
					 __u64 mm, __u64 gen)
{
	struct ucache_check v = { .e = e };

	if (!e->stack_id || e->mm != mm || e->gen != gen || e->pc != u->pc ||
	    e->sp != u->sp || (e->bp_used && e->bp != u->bp))
		return false;
	bpf_loop(UCACHE_SLOTS + 1, ucache_check_step, &v, 0);
	return v.holds;
}

/* Keeps the walk in `u` (its slots in `pr`), whose frames were stored as
 * `id`, in the thread's `e`, or nothing where it cannot be proved again. */
static __always_inline void ucache_keep(struct ucache *e, struct ucache *pr,
					struct unwind_state *u, __u64 mm, __u64 gen, __u64 id)
{
	e->stack_id = 0;
	if (!pr || u->unprovable || !(id & STACK_ID_HASH_BIT))
		return;
	/* All of them: straight-line code, which the verifier checks once
	 * (a loop up to n would be checked once per slot). */
	__builtin_memcpy(e->off, pr->off, sizeof(e->off));
	__builtin_memcpy(e->val, pr->val, sizeof(e->val));
	e->n = pr->n;
	e->top = pr->top;
	e->mm = mm;
	e->gen = gen;
	e->pc = pr->pc;
	e->sp = pr->sp;
	e->bp = pr->bp;
	e->bp_used = u->bp_used;
	e->truncated = u->truncated;
	e->fp_frames = u->fp_frames;
	e->gap_frames = u->gap_frames;
	e->stack_id = id;
}

#endif /* __OFFCPUTIME_STACK_CACHE_H__ */
