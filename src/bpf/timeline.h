/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --timeline: each block of at least timeline_min_ns, sent to userspace as
 * it ends (struct block_record), beside the counts (the settings are in
 * settings.h).
 */
#ifndef __OFFCPUTIME_TIMELINE_H__
#define __OFFCPUTIME_TIMELINE_H__

/* Sized by userspace at load (a page without --timeline). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} block_records SEC(".maps");

/* bpf_ringbuf_submit()'s flags (uapi bpf.h). */
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2

/* In the skeleton's `types` module. */
struct block_record _block_record = {};
enum block_record_flags _block_record_flags = BLOCK_AT_START;

/* Whether the wake-ups' wakers are kept (--wakers, --timeline). */
static __always_inline bool keep_wakers(void)
{
	return want_wakers || timeline_min_ns;
}

/* Whether the state a block began in is kept (--states, --wakers,
 * --timeline). */
static __always_inline bool keep_state(void)
{
	return want_states || want_wakers || timeline_min_ns;
}

/* A record of what `key` tells of, inside the window [from, to). */
static __always_inline void fill_record(struct block_record *r, struct offcpu_key *key,
					__u64 from, __u64 to, __u32 flags)
{
	r->tgid = key->tgid;
	r->pid = key->pid;
	r->process_start = key->process_start;
	r->from = from;
	r->to = to;
	r->user_stack_id = key->user_stack_id;
	r->kernel_stack_id = key->kernel_stack_id;
	__builtin_memcpy(r->comm, key->comm, sizeof(r->comm));
	r->state = key->state;
	r->flags = flags;
}

/* Sent, userspace woken once the ring holds timeline_wake_bytes. */
static __always_inline void send_record(struct block_record *r)
{
	bpf_ringbuf_submit(r, bpf_ringbuf_query(&block_records, BPF_RB_AVAIL_DATA) >=
					      timeline_wake_bytes
				      ? BPF_RB_FORCE_WAKEUP
				      : BPF_RB_NO_WAKEUP);
	count(CNT_TIMELINE_SENT);
}

/* --on-cpu: the sample `key` tells of, taken at `now`; `profiled`: of a
 * thread the filters keep (--chains samples every thread). */
static __noinline void record_sample(struct offcpu_key *key, __u64 now, bool profiled)
{
	struct block_record *r;

	if (!key)
		return;
	r = bpf_ringbuf_reserve(&block_records, sizeof(*r), 0);
	if (!r) {
		count(CNT_TIMELINE_LOST);
		return;
	}
	fill_record(r, key, now, now, BLOCK_ONCPU_SAMPLE | (profiled ? BLOCK_PROFILED : 0));
	r->waking_ns = 0;
	r->waker_id = WAKER_ID_NONE;
	send_record(r);
}

/* task_data.timeline_end: when the block being closed was seen last (its
 * switch-in, or the window's end), and where it began before the window
 * (TIMELINE_AT_START: claimed by the start iterator) and whether it is
 * still under way at the window's end (TIMELINE_AT_END). */
#define TIMELINE_AT_END (1ULL << 63)
#define TIMELINE_AT_START (1ULL << 62)
/* ... and sent at an interval's end, under way (BLOCK_CUT). */
#define TIMELINE_AT_CUT (1ULL << 61)

/*
 * Where --timeline is asked: the block `d` holds, its stacks and the
 * state it blocked in in `key`, seen until its timeline_end, is sent if it
 * lasted at least timeline_min_ns, measured as -m measures it (see
 * block_part): from its switch-out (block_ns, kept whole across -i's cuts:
 * a cut block is sent once, whole), or from the window's start, to when
 * it was seen last or the window's end, whichever is first.  The key's
 * state is put back (OFFCPU_STATE_ANY: the count sets its own).  Lost
 * records are counted.  Out of line, and given nothing the hook would not
 * keep anyway (the times are in `d`, written by TIMELINE_SEEN where the
 * hook has them): the hooks' frames are near the 512 bytes the verifier
 * allows the deepest chain of calls (before private stacks, 6.13), and
 * each value a hook keeps across a call takes room there.  `cut_end`, where
 * not 0, stands for timeline_end (--chains with -i: the block under way at
 * a cut, TIMELINE_AT_CUT).
 */
static __noinline void timeline_block(struct offcpu_key *key, struct task_data *d, __u64 cut_end)
{
	__u64 w = trace_start_ns, wend = trace_end_ns, began, to, waker, end, now;
	struct block_record *r;
	__u32 flags = 0;

	if (!key || !d || !timeline_min_ns)
		return;
	end = cut_end ? cut_end : d->timeline_end;
	now = end & ~(TIMELINE_AT_END | TIMELINE_AT_START | TIMELINE_AT_CUT);
	if (end & TIMELINE_AT_END)
		flags |= BLOCK_AT_END;
	if (end & TIMELINE_AT_CUT)
		flags |= BLOCK_CUT;
	if (end & TIMELINE_AT_START) {
		began = w;
		flags |= BLOCK_AT_START;
	} else {
		began = d->block_ns;
	}
	if (now <= began || now - began < timeline_min_ns)
		goto out;
	if (began < w)
		began = w;
	to = wend && now > wend ? wend : now;
	if (to <= began)
		goto out;
	if (key->state == OFFCPU_STATE_RUNQUEUE)
		waker = WAKER_ID_PREEMPTED;
	else if (d->waker_id)
		waker = d->waker_id;
	else
		waker = (flags & BLOCK_AT_END) ? WAKER_ID_NOT_WOKEN : WAKER_ID_UNSEEN;
	r = bpf_ringbuf_reserve(&block_records, sizeof(*r), 0);
	if (!r) {
		count(CNT_TIMELINE_LOST);
		goto out;
	}
	/* (Read here, where nothing more is kept across a call.) */
	if (!chains_on || (d->flags & ((flags & BLOCK_AT_START) ? TD_PROFILED_START : TD_PROFILED)))
		flags |= BLOCK_PROFILED;
	fill_record(r, key, began, to, flags);
	r->waking_ns = d->waker_id ? d->waking_ns : 0;
	r->waker_id = waker;
	send_record(r);
out:
	key->state = OFFCPU_STATE_ANY;
}

/* Where --timeline is asked (a constant: the verifier drops the code
 * without it): the block that `start` (as task_data.start_ns had it when
 * the block was claimed) tells of was seen until `now`; `at_end`: it is
 * still under way at the window's end.  Where the hook has those at
 * hand. */
#define TIMELINE_SEEN(d, start, now, at_end)                                   \
	do {                                                                   \
		if (timeline_min_ns)                                           \
			(d)->timeline_end =                                    \
				(now) |                                        \
				(began_before_window(start) ? TIMELINE_AT_START \
							    : 0) |             \
				((at_end) ? TIMELINE_AT_END : 0);              \
	} while (0)

/* ... and once its stacks are known, with the state it blocked in, the
 * block sent (timeline_block). */
#define TIMELINE_BLOCK(key, d, state_)                                         \
	do {                                                                   \
		if (timeline_min_ns) {                                         \
			(key)->state = (state_);                               \
			timeline_block((key), (d), 0);                         \
		}                                                              \
	} while (0)

#endif /* __OFFCPUTIME_TIMELINE_H__ */
