/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The stack cache: a kept user walk proved unchanged (same registers, every
 * stack slot it read unchanged) instead of walked again.
 */
#ifndef __OFFCPUTIME_STACK_CACHE_H__
#define __OFFCPUTIME_STACK_CACHE_H__

/* Whether every slot of the current thread's kept walk in way `way` still
 * holds what it held.  The stack is read a window at a time, from a slot
 * up to the end of the highest (up to UCACHE_WINDOW bytes: the slots of a
 * walk usually lie in less); where that would cross into memory that
 * cannot be read, the slot alone.  A bounded loop, a few instructions a
 * slot (a bpf_loop callback per slot cost a call and a lookup each), in a
 * global function: checked by the verifier once. */
__noinline int ucache_slots_hold(__u32 way)
{
	struct ucache_ways *set;
	struct ucache_window *w;
	__u64 addr, off, len, base = 0, have = 0, span;
	__u32 zero = 0, k, at;
	struct ucache *e;

	set = bpf_task_storage_get(&ucache_storage, bpf_get_current_task_btf(), 0, 0);
	w = bpf_map_lookup_elem(&ucache_window, &zero);
	if (!set || !w)
		return false;
	e = &set->way[way & 1];
	for (k = 0; k < UCACHE_SLOTS; k++) {
		if (k >= e->n)
			return true;
		at = e->off[k];
		span = at & UCACHE_RANGE_BIT ? UCACHE_RANGE : 8;
		addr = e->sp + (at & ~UCACHE_RANGE_BIT);
		off = addr - base;
		if (k == 0 || addr < base || off + span > have) {
			len = e->sp + e->top - addr;
			if (e->sp + e->top < addr + 8 || len > UCACHE_WINDOW)
				len = UCACHE_WINDOW;
			/* The bound, for the verifier. */
			asm volatile("" : "+r"(len));
			len &= 2 * UCACHE_WINDOW - 1;
			if (len < 8 || len > UCACHE_WINDOW)
				return false;
			if (!bpf_probe_read_user(w->bytes, len, (void *)addr))
				have = len;
			else if (!bpf_probe_read_user(w->bytes, UCACHE_RANGE, (void *)addr))
				have = UCACHE_RANGE;
			else if (!bpf_probe_read_user(w->bytes, 8, (void *)addr))
				have = 8;
			else
				return false;
			base = addr;
			off = 0;
			if (span > have)
				return false;
		}
		if (at & UCACHE_RANGE_BIT) {
			if (ucache_range_hash((__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1)))) !=
			    e->val[k])
				return false;
		} else if (*(__u64 *)(w->bytes + (off & (UCACHE_WINDOW - 1))) != e->val[k]) {
			return false;
		}
	}
	return true;
}

/* Whether the current thread's kept walk `e`, its way `way`, holds for the
 * registers in `u`, the address space `mm` and the tables of generation
 * `gen`: the proof of struct ucache. */
static __always_inline bool ucache_holds(struct ucache *e, __u32 way, struct unwind_state *u,
					 __u64 mm, __u64 gen)
{
	if (!e->stack_id || e->mm != mm || e->gen != gen || e->pc != u->pc ||
	    e->sp != u->sp || (e->bp_used && e->bp != u->bp))
		return false;
	return ucache_slots_hold(way);
}

/* The way of `set` kept from the registers in `u` (its index), else the
 * one to keep a new walk in, UCACHE_NEW_WAY added: the one proved or kept
 * less recently. */
#define UCACHE_NEW_WAY 0x100
static __always_inline __u32 ucache_way(struct ucache_ways *set, struct unwind_state *u)
{
	if (set->way[0].stack_id && set->way[0].pc == u->pc && set->way[0].sp == u->sp)
		return 0;
	if (set->way[1].stack_id && set->way[1].pc == u->pc && set->way[1].sp == u->sp)
		return 1;
	return UCACHE_NEW_WAY | ((set->last ^ 1) & 1);
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
	e->java_frames = u->java_frames;
	e->stack_id = id;
}

#endif /* __OFFCPUTIME_STACK_CACHE_H__ */
