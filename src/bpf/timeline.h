/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --timeline: each block of at least timeline_min_ns, sent to userspace as
 * it ends (struct block_record), beside the counts.
 */
#ifndef __OFFCPUTIME_TIMELINE_H__
#define __OFFCPUTIME_TIMELINE_H__

/* The shortest block recorded (0: --timeline not asked). */
const volatile __u64 timeline_min_ns = 0;

/* Sized by userspace at load (a page without --timeline). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} block_records SEC(".maps");

/* Userspace is woken once the ring holds this many bytes of records, not
 * at every record: it reads the ring at least every 100 ms anyway. */
const volatile __u64 timeline_wake_bytes = 0;

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

/*
 * Sends the block `key` tells of: inside the window [from, to), with
 * `flags` (enum block_record_flags); its waker from `d`.  Lost records are
 * counted.
 */
static __noinline void record_block(struct offcpu_key *key, struct task_data *d, __u64 from,
				    __u64 to, __u32 flags)
{
	struct block_record *r;
	__u64 waker;

	if (!key || !d)
		return;
	if (key->state == OFFCPU_STATE_RUNQUEUE)
		waker = WAKER_ID_PREEMPTED;
	else if (d->waker_id)
		waker = d->waker_id;
	else
		waker = (flags & BLOCK_AT_END) ? WAKER_ID_NOT_WOKEN : WAKER_ID_UNSEEN;
	r = bpf_ringbuf_reserve(&block_records, sizeof(*r), 0);
	if (!r) {
		count(CNT_TIMELINE_LOST);
		return;
	}
	fill_record(r, key, from, to, flags);
	r->waking_ns = d->waker_id ? d->waking_ns : 0;
	r->waker_id = waker;
	send_record(r);
}

/* --on-cpu: the sample `key` tells of, taken at `now`. */
static __noinline void record_sample(struct offcpu_key *key, __u64 now)
{
	struct block_record *r;

	if (!key)
		return;
	r = bpf_ringbuf_reserve(&block_records, sizeof(*r), 0);
	if (!r) {
		count(CNT_TIMELINE_LOST);
		return;
	}
	fill_record(r, key, now, now, BLOCK_ONCPU_SAMPLE);
	r->waking_ns = 0;
	r->waker_id = WAKER_ID_NONE;
	send_record(r);
}

/*
 * Where --timeline is asked: the block of `d` that `start` tells of (as
 * task_data.start_ns had it when the block was claimed), counted up to `to`
 * (its end, or the window's) and seen until `now`, with the stacks in `key`
 * and `state` the state it blocked in, is sent if it lasted at least
 * timeline_min_ns, measured as -m measures it (see block_part).  A block
 * cut at -i's interval ends is sent once, whole.  `at_end`: still under way
 * at the window's end.
 */
static __always_inline void timeline_block(struct offcpu_key *key, struct task_data *d,
					   __u32 state, __u64 start, __u64 to, __u64 now,
					   bool at_end)
{
	__u64 w = trace_start_ns, began;
	__u32 kept = key->state, flags = at_end ? BLOCK_AT_END : 0;

	if (!timeline_min_ns)
		return;
	if (began_before_window(start)) {
		began = w;
		flags |= BLOCK_AT_START;
	} else {
		began = (start & START_CUT) ? d->block_ns : start;
	}
	if (now <= began || now - began < timeline_min_ns)
		return;
	if (began < w)
		began = w;
	if (to <= began)
		return;
	key->state = state;
	record_block(key, d, began, to, flags);
	key->state = kept;
}

#endif /* __OFFCPUTIME_TIMELINE_H__ */
