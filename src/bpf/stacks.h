/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The stack store: stacks kept under a 64-bit hash of their frames,
 * counters.
 */
#ifndef __OFFCPUTIME_STACKS_H__
#define __OFFCPUTIME_STACKS_H__

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += 1;
}

static __always_inline __u32 clamp_stack_bytes(void)
{
	__u32 size = stack_bytes;

	if (size > MAX_STACK_DEPTH * sizeof(__u64))
		size = MAX_STACK_DEPTH * sizeof(__u64);
	return size;
}

/* A stack's frames as the scratch maps hold them. */
struct frames {
	__u64 ip[MAX_STACK_DEPTH + 1];
};

/* The frames of stored stack `id` in its length's table (see
 * STACK_SHORT_DEPTH), or in the spill table; NULL where it is not stored.
 * Those of a short or middle stack end where their table's value does:
 * their frames are read by stored_frames_into(), or by a reader that
 * looks in each table itself (has_python_frames). */
static __always_inline __u64 *stored_frames(__u64 id)
{
	__u64 *f;

	if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_SHORT)
		f = bpf_map_lookup_elem(&stacks_short, &id);
	else if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_MID)
		f = bpf_map_lookup_elem(&stacks_mid, &id);
	else
		f = bpf_map_lookup_elem(&stacks, &id);
	return f ? f : bpf_map_lookup_elem(&stacks_spill, &id);
}

/* Copies stored stack `id`'s frames into `dst` (room for MAX_STACK_DEPTH
 * + 1 words), with a 0 after the last; false where it is not stored. */
static __always_inline bool stored_frames_into(__u64 id, __u64 *dst)
{
	__u64 *f;

	if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_SHORT) {
		f = bpf_map_lookup_elem(&stacks_short, &id);
		if (f) {
			__builtin_memcpy(dst, f, STACK_SHORT_DEPTH * sizeof(__u64));
			dst[STACK_SHORT_DEPTH] = 0;
			return true;
		}
	} else if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_MID) {
		f = bpf_map_lookup_elem(&stacks_mid, &id);
		if (f) {
			__builtin_memcpy(dst, f, STACK_MID_DEPTH * sizeof(__u64));
			dst[STACK_MID_DEPTH] = 0;
			return true;
		}
	} else {
		f = bpf_map_lookup_elem(&stacks, &id);
		if (f) {
			__builtin_memcpy(dst, f, MAX_STACK_DEPTH * sizeof(__u64));
			dst[MAX_STACK_DEPTH] = 0;
			return true;
		}
	}
	f = bpf_map_lookup_elem(&stacks_spill, &id);
	if (!f)
		return false;
	__builtin_memcpy(dst, f, MAX_STACK_DEPTH * sizeof(__u64));
	dst[MAX_STACK_DEPTH] = 0;
	return true;
}

/*
 * Store the first `len` bytes of frames `f` in the table of their length
 * (unless already there) and return their id, or one of the STACK_ID_*
 * codes.
 */
static __always_inline __u64 store_frames(struct frames *f, long len, int user)
{
	__u64 h = 0xcbf29ce484222325ULL;
	long nr;
	int i, err;

	if (!f)
		return STACK_ID_MISSED_ERROR;
	if (len == 0 || len == -EFAULT)
		return STACK_ID_NONE;
	if (len < 0) {
		count(user ? CNT_USTACK_ERROR : CNT_KSTACK_ERROR);
		return STACK_ID_MISSED_ERROR;
	}
	nr = len / sizeof(__u64);
	for (i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= nr)
			break;
		h ^= f->ip[i];
		h *= 0x100000001b3ULL;
		h ^= h >> 32;
	}
	h &= ~STACK_ID_CLASS_MASK;
	h |= STACK_ID_HASH_BIT;
	if (stack_classes && nr <= STACK_SHORT_DEPTH)
		h |= STACK_ID_CLASS_SHORT;
	else if (stack_classes && nr <= STACK_MID_DEPTH)
		h |= STACK_ID_CLASS_MID;

	if (stored_frames(h))
		return h;
	if (test_spill_stacks)
		err = -ENOMEM;
	else if ((h & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_SHORT)
		err = bpf_map_update_elem(&stacks_short, &h, f, BPF_NOEXIST);
	else if ((h & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_MID)
		err = bpf_map_update_elem(&stacks_mid, &h, f, BPF_NOEXIST);
	else
		err = bpf_map_update_elem(&stacks, &h, f, BPF_NOEXIST);
	if (!err || err == -EEXIST)
		return h;
	if (err != -ENOMEM) {
		count(user ? CNT_USTACK_FULL : CNT_KSTACK_FULL);
		return STACK_ID_MISSED_FULL;
	}
	/* No memory for it at the moment: kept in the spill table. */
	err = bpf_map_update_elem(&stacks_spill, &h, f, BPF_NOEXIST);
	if (!err)
		count(CNT_STACKS_SPILLED);
	if (!err || err == -EEXIST)
		return h;
	count(CNT_STACKS_NO_MEMORY);
	return STACK_ID_MISSED_FULL;
}

/*
 * store_frames() of the frames in `scratch`, and of those in `start_scratch`
 * (the start iterator's).  Global functions: the verifier checks each once,
 * not at every call in every state of their callers.  They look the frames
 * up themselves: 6.1 takes no map update value from memory passed as an
 * argument.
 */
__noinline __u64 store_stack(long len, int user)
{
	__u32 zero = 0;

	return store_frames(bpf_map_lookup_elem(&scratch, &zero), len, user);
}

__noinline __u64 store_task_stack(long len, int user)
{
	__u32 zero = 0;

	return store_frames(bpf_map_lookup_elem(&start_scratch, &zero), len, user);
}

static __always_inline void count_n(__u32 which, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += n;
}

/* What a walk of a user stack with tables, `w` (struct unwind_state, or
 * the struct ucache of a kept one proved again), counts besides
 * CNT_UNWIND_DWARF.  A macro that reads the fields where they are after
 * each count: values passed on would be kept on the stack across the
 * calls (see unwind_state). */
#define COUNT_WALK(w)                                                       \
	do {                                                                \
		if ((w)->truncated)                                         \
			count(CNT_UNWIND_TRUNCATED);                        \
		if ((w)->fp_frames)                                         \
			count_n(CNT_UNWIND_FP_FRAMES, (w)->fp_frames);      \
		if ((w)->gap_frames)                                        \
			count_n(CNT_UNWIND_GAP_FRAMES, (w)->gap_frames);    \
		if ((w)->rt_frames) {                                       \
			count((w)->v8 ? CNT_V8_STACKS : CNT_JAVA_STACKS);   \
			count_n((w)->v8 ? CNT_V8_FRAMES : CNT_JAVA_FRAMES,  \
				(w)->rt_frames);                            \
		}                                                           \
	} while (0)

#endif /* __OFFCPUTIME_STACKS_H__ */
