/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * HotSpot frames in the native walk (see struct java_proc and
 * JAVA_INTERP_MARK in offcputime.h).
 *
 * Java code runs from the JVM's code cache, which no call-frame
 * information covers: the native walk (dwarf.h) hands each address there
 * to java_step(), which takes the frame as the JVM itself does:
 * - the interpreter's frames keep their frame pointer: the Method* and
 *   the bytecode pointer are in slots below it, the caller's pc and frame
 *   pointer above it, and the caller's stack pointer (before the
 *   interpreter extended its frame for the locals) in a slot of its own;
 * - a compiled method's (or a stub's) frame has the size its code blob
 *   says, found through the heap's segment map: the return address and
 *   the caller's frame pointer are the frame's last two words, with or
 *   without -XX:+PreserveFramePointer;
 * - a blob without a frame size (the call stub, where the JVM calls Java
 *   from C++) keeps its frame pointer: the native walk's own step.
 * Each Java frame is one word of the stack: the method and bytecode index
 * of an interpreted frame, the pc of a compiled one (named by userspace
 * from the process's memory: methods inlined there, lines).
 */
#ifndef __OFFCPUTIME_JAVA_H__
#define __OFFCPUTIME_JAVA_H__

/* Set at load: --no-java leaves it off. */
const volatile bool java_on = false;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct java_proc);
} java_procs SEC(".maps");

/* Whether process `tgid` may have an entry in java_procs (its bit is set:
 * see runtime.h). */
static __always_inline bool java_pid(__u32 tgid)
{
	return java_on && runtime_pid(tgid);
}

/* Whether the walk of a thread of process `tgid` (`task`, NULL: the
 * current task) meets Java frames: its process has an entry for its
 * address space (claimed by the first walk where userspace could not say
 * which: an exec since leaves the entry of another program). */
static __always_inline bool java_walkable(__u32 tgid, struct task_struct *task)
{
	struct java_proc *j;
	__u64 mm;

	if (!java_pid(tgid))
		return false;
	j = bpf_map_lookup_elem(&java_procs, &tgid);
	if (!j)
		return false;
	mm = (__u64)(task ? BPF_CORE_READ(task, mm) : BPF_CORE_READ(bpf_get_current_task_btf(), mm));
	if (!j->mm)
		j->mm = mm;
	return j->mm == mm;
}

/* Steps back through a segment map, at most (each up to 254 segments). */
#define JAVA_HOPS 16

#define JAVA_WORD(mark) ((__u64)(mark) << 60)

/* java_step()'s answers. */
#define JAVA_NOT_JAVA 0
#define JAVA_NEXT 1
#define JAVA_END 2
/* A blob without a frame size: the frame is the native step's, through
 * its frame pointer (its word written). */
#define JAVA_BY_FP 3

/* Ends a walk in Java code: why, in the frame's word, and counted. */
static __always_inline int java_cut(struct unwind_state *u, __u64 *ips, __u32 idx, __u32 why)
{
	ips[idx & MAX_STACK_DEPTH] = JAVA_WORD(JAVA_CUT_MARK) | why;
	count(why == JAVA_CUT_RUNNING ? CNT_JAVA_CUT_RUNNING : CNT_JAVA_CUT_UNREADABLE);
	u->truncated = true;
	u->unprovable = true;
	return JAVA_END;
}

/*
 * The frame at u's pc, if it is in process u->tgid's code cache: written
 * at ips[idx] and u moved to its caller (JAVA_NEXT), the walk ended
 * (JAVA_END), left to the frame-pointer step (JAVA_BY_FP), or not Java's
 * (JAVA_NOT_JAVA).  `exact`: the pc is where the thread stopped, not a
 * return address.
 */
static __always_inline int java_step(struct unwind_state *u, __u64 *ips, __u32 idx, bool exact,
				     struct stack_copy *c, struct ucache *pr,
				     struct task_struct *task)
{
	struct java_proc *j;
	__u64 pc = u->pc, fp = u->bp, lo = 0, hi = 0, map = 0, slot[2], method, bcp, cm;
	__u64 blob, bci, sender;
	__u32 tgid = u->tgid, k, log2 = 0;
	__s32 size = 0;
	__u32 id = 0, hop;
	__u8 b;

	j = bpf_map_lookup_elem(&java_procs, &tgid);
	if (!j)
		return JAVA_NOT_JAVA;
	if (pc >= j->interp_lo && pc < j->interp_hi) {
		if (!u->java_seen) {
			u->java_seen = true;
			count(CNT_JAVA_STACKS);
		}
		/* Stopped in the interpreter's own code: rbp may not be this
		 * frame's yet (or any more). */
		if (exact)
			return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
		if (read_user(&method, 8, (void *)(fp + j->interp_method), task, c) ||
		    read_user(&bcp, 8, (void *)(fp + j->interp_bcp), task, c) ||
		    read_user(&sender, 8, (void *)(fp + j->interp_sender_sp), task, c) ||
		    read_user(slot, 16, (void *)fp, task, c))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		note_slot(pr, u, fp + j->interp_method, method);
		note_slot(pr, u, fp + j->interp_bcp, bcp);
		note_slot(pr, u, fp + j->interp_sender_sp, sender);
		note_slot(pr, u, fp, slot[0]);
		note_slot(pr, u, fp + 8, slot[1]);
		if ((method & 7) || method >= (1ULL << 47) || !method ||
		    read_user(&cm, 8, (void *)(method + j->method_const), task, c))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		bci = bcp - (cm + j->const_size);
		if (bcp < cm + j->const_size || bci >= JAVA_NO_BCI)
			bci = JAVA_NO_BCI;
		ips[idx & MAX_STACK_DEPTH] = JAVA_WORD(JAVA_INTERP_MARK) | (method >> 3) << 16 | bci;
		count(CNT_JAVA_FRAMES);
		/* The caller's stack pointer before this frame extended it:
		 * a compiled caller's frame size counts from there. */
		if (sender < fp + 16 || sender - fp > (1 << 20))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		u->sp = sender;
		u->bp = slot[0];
		u->bp_restored = true;
		u->pc = slot[1];
		return slot[1] ? JAVA_NEXT : JAVA_END;
	}
#pragma clang loop unroll(full)
	for (k = 0; k < JAVA_HEAPS; k++) {
		if (k < j->heaps && pc >= j->heap_lo[k] && pc < j->heap_hi[k]) {
			lo = j->heap_lo[k];
			hi = j->heap_hi[k];
			map = j->segmap[k];
			log2 = j->log2_segment[k] & 31;
		}
	}
	if (!lo)
		return JAVA_NOT_JAVA;
	if (!u->java_seen) {
		u->java_seen = true;
		count(CNT_JAVA_STACKS);
	}
	/* The block that holds pc: back through the segment map to its
	 * first segment. */
	k = (pc - lo) >> log2;
	for (hop = 0; hop < JAVA_HOPS; hop++) {
		if (read_user(&b, 1, (void *)(map + k), task, c) || b == 0xff)
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		if (!b)
			break;
		if (b > k)
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		k -= b;
	}
	if (hop >= JAVA_HOPS)
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	blob = lo + ((__u64)k << log2) + j->block_header;
	if (read_user(&size, 4, (void *)(blob + j->frame_size), task, c) ||
	    read_user(&id, 4, (void *)(blob + j->compile_id), task, c))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	ips[idx & MAX_STACK_DEPTH] = JAVA_WORD(JAVA_CODE_MARK) |
				     (__u64)(id & ((1 << JAVA_CHECK_BITS) - 1)) << 47 |
				     (pc & ((1ULL << 47) - 1));
	count(CNT_JAVA_FRAMES);
	if (size <= 0)
		return JAVA_BY_FP;
	if (size > (1 << 16))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	/* Stopped in the code itself, not at a call: the frame may not be
	 * set up yet, or torn down already (its epilogue). */
	if (exact)
		return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
	sender = u->sp + 8 * (__u64)size;
	if (read_user(slot, 16, (void *)(sender - 16), task, c))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	note_slot(pr, u, sender - 16, slot[0]);
	note_slot(pr, u, sender - 8, slot[1]);
	u->sp = sender;
	u->bp = slot[0];
	u->bp_restored = true;
	u->pc = slot[1];
	return slot[1] ? JAVA_NEXT : JAVA_END;
}

#endif /* __OFFCPUTIME_JAVA_H__ */
