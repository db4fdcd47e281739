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

/* java_on: see runtime.h. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct java_proc);
} java_procs SEC(".maps");

#define JAVA_HEADER JAVA_HEADER_BYTES
/* A segment map's window read at once, and the steps back through it
 * (each into the window read last, or a new one), at most: a window a
 * bpf_loop step (JAVA_WINDOWS of them, each up to
 * JAVA_WINDOW_STEPS steps: the verifier checks a step once). */
#define JAVA_WINDOW 32
#define JAVA_WINDOWS 8
#define JAVA_WINDOW_STEPS 16

/* What a walk through Java frames works with: its process's entry, copied
 * at the walk's start (no lookup a frame), and room for what a frame
 * reads. */
struct java_scratch {
	struct java_proc p;
	__u64 frame[JAVA_FRAME_WORDS];
	__u8 header[JAVA_HEADER + 8];
	__u8 window[JAVA_WINDOW];
	/* The segment map's walk: the heap's code and map, the segment it is
	 * at, the window read last. */
	__u64 lo;
	__u64 map;
	__u64 k;
	__u64 base;
	__u32 log2;
	/* How the walk of the map ended (JAVA_HOP_*). */
	__u32 hop_end;
	/* The blob found, and the pc its frame is named by (the frame's own,
	 * where its return address is the deoptimization handler): kept here,
	 * not on the stack, which the current task's walk has little of. */
	__u64 blob;
	__u64 pc;
	/* The thread walked (for the notices of new words). */
	__u32 pid;
	__u64 process_start;
	/* Its r13 where it stopped (an interpreted frame's bytecode pointer
	 * there), and a Method's ConstMethod and bytecode count read to check
	 * it. */
	__u64 r13;
	__u64 cm;
	__u16 code_size;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct java_scratch);
} java_scratch SEC(".maps");

/* The same for the sleepable iterators' walks of other tasks (see
 * start_file_scratch). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct java_scratch);
} java_task_scratch SEC(".maps");

static __always_inline struct java_scratch *java_scratch_of(bool remote)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(remote ? (void *)&java_task_scratch : (void *)&java_scratch,
				   &zero);
}

/* Whether process `tgid` may have an entry in java_procs (its bit is set:
 * see runtime.h). */
static __always_inline bool java_pid(__u32 tgid)
{
	return java_on && runtime_pid(tgid);
}

/* Whether the walk of a thread of process `tgid` (`task`, NULL: the
 * current task) meets Java frames: its process has an entry for its
 * address space (claimed by the first walk where userspace could not say
 * which: an exec since leaves the entry of another program), copied where
 * the walk's steps find it. */
static __always_inline bool java_walkable(__u32 tgid, struct task_struct *task)
{
	struct java_scratch *js;
	struct java_proc *j;
	struct pt_regs *regs;
	__u64 mm;

	if (!java_pid(tgid))
		return false;
	j = bpf_map_lookup_elem(&java_procs, &tgid);
	js = java_scratch_of(task != NULL);
	if (!j || !js)
		return false;
	mm = (__u64)(task ? BPF_CORE_READ(task, mm) : BPF_CORE_READ(bpf_get_current_task_btf(), mm));
	if (!j->mm)
		j->mm = mm;
	if (j->mm != mm)
		return false;
	js->p = *j;
	regs = (struct pt_regs *)bpf_task_pt_regs(task ? task : bpf_get_current_task_btf());
	js->r13 = regs ? regs->r13 : 0;
	if (task) {
		js->pid = BPF_CORE_READ(task, pid);
		js->process_start = BPF_CORE_READ(task, group_leader, start_boottime);
	} else {
		js->pid = (__u32)bpf_get_current_pid_tgid();
		js->process_start = BPF_CORE_READ(bpf_get_current_task_btf(), group_leader,
						  start_boottime);
	}
	return true;
}

/* Tells userspace of Java word `word` of process `tgid` (see
 * runtime_notice_once()): the frame of a blocked thread keeps its method,
 * and its compiled code, there. */
static __always_inline void java_notice(struct java_scratch *js, __u32 tgid, __u64 word)
{
	runtime_notice_once(TASK_EVENT_JAVACODE, tgid, js->pid, js->process_start, js->p.mm, word,
			    0, CNT_JAVA_EVENTS_LOST);
}

#define JAVA_WORD(mark) ((__u64)(mark) << 60)

/* java_step()'s answers. */
#define JAVA_NOT_JAVA 0
#define JAVA_NEXT 1
#define JAVA_END 2
/* A blob without a frame size: the frame is the native step's, through
 * its frame pointer (its word written). */
#define JAVA_BY_FP 3

/* How the frame of a thread stopped at a pc in a compiled method's code
 * (not at a call) stands, from the instructions there (java_code_at()). */
#define JAVA_FRAME_WHOLE 0
/* Torn down to its return address, at the stack pointer. */
#define JAVA_FRAME_RETURN 1
/* Torn down to the caller's frame pointer (popped next) and the return
 * address above it. */
#define JAVA_FRAME_POPPING 2
#define JAVA_FRAME_UNKNOWN 3

/* Byte k (a constant) of the 24 bytes `a`, `b`, `c`: the 8 before the pc,
 * then the 16 at it (scalars: an array on the stack indexed so would have
 * clang or its address's bits with the index, which the verifier refuses
 * on a pointer). */
#define JAVA_BYTE(k)                                                                 \
	((__u8)(((k) < 8 ? a : (k) < 16 ? b : c) >> (8 * ((k) & 7))))

/* A conditional jump (ja, to a stub out of line) then a ret, at byte k. */
#define JAVA_JCC_RET(k)                                                              \
	(JAVA_BYTE(k) == 0x0f && JAVA_BYTE((k) + 1) == 0x87 && JAVA_BYTE((k) + 6) == 0xc3)

/* Whether the instructions at byte k lead to a ret without touching the
 * stack pointer: a ret; a return's safepoint poll (JDK 11: mov r10,
 * [r15+disp32], test eax,[r10]; from 17: cmp rsp,[r15+disp] then ja). */
static __always_inline bool java_ret_tail(__u64 a, __u64 b, __u64 c, __u32 k)
{
	if (JAVA_BYTE(k) == 0xc3 || JAVA_JCC_RET(k))
		return true;
	if (JAVA_BYTE(k) == 0x49) {
		if (JAVA_BYTE(k + 1) == 0x3b && JAVA_BYTE(k + 2) == 0xa7)
			return JAVA_JCC_RET(k + 7);
		if (JAVA_BYTE(k + 1) == 0x3b && JAVA_BYTE(k + 2) == 0x67)
			return JAVA_JCC_RET(k + 4);
		return false;
	}
	if (JAVA_BYTE(k) == 0x4d)
		return JAVA_BYTE(k + 1) == 0x8b && JAVA_BYTE(k + 2) == 0x97 &&
		       JAVA_BYTE(k + 7) == 0x41 && JAVA_BYTE(k + 8) == 0x85 &&
		       JAVA_BYTE(k + 9) == 0x02 && JAVA_BYTE(k + 10) == 0xc3;
	return JAVA_BYTE(k) == 0x41 && JAVA_BYTE(k + 1) == 0x85 && JAVA_BYTE(k + 2) == 0x02 &&
	       JAVA_BYTE(k + 3) == 0xc3;
}

/*
 * The frame of a thread stopped at a pc past its compiled method's
 * prologue, from the 24 bytes `a`, `b`, `c` (8 before the pc, 16 at it)
 * (JAVA_FRAME_*).  C1's and C2's code changes the stack pointer only in
 * its prologue and its epilogues: add rsp,N; pop rbp; then the return's
 * poll and ret, or a jump out (to an exception's unwinding, a method
 * handle's target).  Before the pop, the frame is whole; at the pop, the
 * caller's frame pointer and the return address are left; after it, the
 * return address: told by the add and pop just before the pc, or the
 * return's known instructions from the pc on (and a reserved stack
 * area's check, cmp rsp then jb, right after the pop), or the return
 * poll's stub.
 * A global function: checked once, whatever calls it.
 */
__noinline int java_code_at(__u64 a, __u64 b, __u64 c)
{
	bool add8_before = JAVA_BYTE(3) == 0x48 && JAVA_BYTE(4) == 0x83 && JAVA_BYTE(5) == 0xc4;
	bool add32_before = JAVA_BYTE(0) == 0x48 && JAVA_BYTE(1) == 0x81 && JAVA_BYTE(2) == 0xc4;

	if (JAVA_BYTE(7) == 0x5d && (add8_before || add32_before))
		return JAVA_FRAME_RETURN;
	/* A return's safepoint poll taken: its stub (in the code, before the
	 * stubs' section from JDK 17), reached with the frame torn down: lea
	 * r10,[rip+d] (or mov r10,imm64); mov [r15+d],r10; jmp.  (The mov
	 * r10,imm64 form cannot be told from a call's setting of the last
	 * Java pc: not known, below.) */
	if (JAVA_BYTE(8) == 0x4c && JAVA_BYTE(9) == 0x8d && JAVA_BYTE(10) == 0x15 &&
	    JAVA_BYTE(15) == 0x4d && JAVA_BYTE(16) == 0x89 && JAVA_BYTE(17) == 0x97 &&
	    JAVA_BYTE(22) == 0xe9)
		return JAVA_FRAME_RETURN;
	/* At the stub's mov or jmp, told by the instruction before the mov;
	 * at the jmp by its last byte alone: the top byte of the lea's
	 * displacement (the poll's pc, before the stub: 0xff) or of the
	 * mov's address (0x00).  After xor r10,r10, no pc is stored: no poll
	 * stub's, not known. */
	if (JAVA_BYTE(8) == 0x4d && JAVA_BYTE(9) == 0x89 && JAVA_BYTE(10) == 0x97 &&
	    JAVA_BYTE(15) == 0xe9) {
		if (JAVA_BYTE(5) == 0x4d && (JAVA_BYTE(6) == 0x33 || JAVA_BYTE(6) == 0x31) &&
		    JAVA_BYTE(7) == 0xd2)
			return JAVA_FRAME_UNKNOWN;
		return JAVA_FRAME_RETURN;
	}
	if (JAVA_BYTE(1) == 0x4d && JAVA_BYTE(2) == 0x89 && JAVA_BYTE(3) == 0x97 &&
	    JAVA_BYTE(8) == 0xe9) {
		if (JAVA_BYTE(0) == 0x00 || JAVA_BYTE(0) == 0xff)
			return JAVA_FRAME_RETURN;
		return JAVA_FRAME_UNKNOWN;
	}
	if (JAVA_BYTE(0) == 0x5d && JAVA_BYTE(1) == 0x49 && JAVA_BYTE(2) == 0x3b &&
	    JAVA_BYTE(3) == 0xa7 && JAVA_BYTE(8) == 0x0f && JAVA_BYTE(9) == 0x82)
		return JAVA_FRAME_RETURN;
	if (java_ret_tail(a, b, c, 8))
		return JAVA_FRAME_RETURN;
	if (JAVA_BYTE(8) == 0x5d) {
		if (java_ret_tail(a, b, c, 9) ||
		    (JAVA_BYTE(4) == 0x48 && JAVA_BYTE(5) == 0x83 && JAVA_BYTE(6) == 0xc4) ||
		    (JAVA_BYTE(1) == 0x48 && JAVA_BYTE(2) == 0x81 && JAVA_BYTE(3) == 0xc4))
			return JAVA_FRAME_POPPING;
		return JAVA_FRAME_UNKNOWN;
	}
	/* Just after a pop not read above (no add before it: a frame of two
	 * words), or a byte 0x5d ending another instruction: not known. */
	if (JAVA_BYTE(7) == 0x5d)
		return JAVA_FRAME_UNKNOWN;
	if (JAVA_BYTE(8) == 0x49 && JAVA_BYTE(9) == 0xba && JAVA_BYTE(18) == 0x4d &&
	    JAVA_BYTE(19) == 0x89 && JAVA_BYTE(20) == 0x97)
		return JAVA_FRAME_UNKNOWN;
	return JAVA_FRAME_WHOLE;
}

/* Ends a walk in Java code: why, in the frame's word, and counted. */
static __always_inline int java_cut(struct unwind_state *u, __u64 *ips, __u32 idx, __u32 why)
{
	ips[idx & MAX_STACK_DEPTH] = JAVA_WORD(JAVA_CUT_MARK) | why;
	u->rt_frames++;
	count(why == JAVA_CUT_RUNNING ? CNT_JAVA_CUT_RUNNING : CNT_JAVA_CUT_UNREADABLE);
	u->truncated = true;
	u->unprovable = true;
	return JAVA_END;
}

#define JAVA_HOP_GOING 0
#define JAVA_HOP_FOUND 1
#define JAVA_HOP_BAD 2

/*
 * One window of a walk back through a segment map to a block's first
 * segment (its state in the walk's java_scratch): read, then stepped back
 * through while the steps stay in it.  Returns 1 to stop (bpf_loop
 * callback).  `task`: the task whose memory is read (the iterators'), or
 * NULL for the current task's.
 */
static __always_inline long java_hop(struct task_struct *task)
{
	struct java_scratch *js = java_scratch_of(task != NULL);
	void *at;
	__u64 k;
	__u32 n;
	__u8 b;

	if (!js)
		return 1;
	k = js->k;
	js->base = k >= JAVA_WINDOW - 1 ? k - (JAVA_WINDOW - 1) : 0;
	at = (void *)(js->map + js->base);
	if (task ? bpf_copy_from_user_task(js->window, JAVA_WINDOW, at, task, 0)
		 : bpf_probe_read_user(js->window, JAVA_WINDOW, at)) {
		js->hop_end = JAVA_HOP_BAD;
		return 1;
	}
	for (n = 0; n < JAVA_WINDOW_STEPS; n++) {
		b = js->window[(k - js->base) & (JAVA_WINDOW - 1)];
		if (b == 0xff || b > k) {
			js->hop_end = JAVA_HOP_BAD;
			return 1;
		}
		if (!b) {
			js->k = k;
			js->hop_end = JAVA_HOP_FOUND;
			return 1;
		}
		k -= b;
		if (k < js->base)
			break;
	}
	js->k = k;
	return 0;
}

static long java_hop_current(__u32 i, void *arg)
{
	return java_hop(NULL);
}

/* `arg`: the task (a struct java_hop_task). */
struct java_hop_task {
	struct task_struct *task;
};

static long java_hop_task(__u32 i, void *arg)
{
	return java_hop(((struct java_hop_task *)arg)->task);
}

/* A slot of an interpreted frame read into js->frame: the word at `off`
 * bytes from its frame pointer (JAVA_FRAME_LOW the lowest). */
#define JAVA_SLOT(js, off) ((js)->frame[(((off) - JAVA_FRAME_LOW) >> 3) & (JAVA_FRAME_WORDS - 1)])

/*
 * The frame at u's pc, if it is in the code cache of the walk's process
 * (u->java): written at ips[idx] and u moved to its caller (JAVA_NEXT),
 * the walk ended (JAVA_END), left to the frame-pointer step (JAVA_BY_FP),
 * or not Java's (JAVA_NOT_JAVA).  `exact`: the pc is where the thread
 * stopped, not a return address.
 */
static __always_inline int java_step(struct unwind_state *u, __u64 *ips, __u32 idx, bool exact,
				     struct stack_copy *c, struct ucache_walk *pr,
				     struct task_struct *task)
{
	struct java_scratch *js = java_scratch_of(task != NULL);
	struct java_proc *j;
	__u64 method, sender;
	__u32 w, n;
	__s32 size;
	__u8 b;

	if (!js)
		return JAVA_NOT_JAVA;
	j = &js->p;
	if (u->pc >= j->interp_lo && u->pc < j->interp_hi) {
		/* Stopped in the interpreter's own code: rbp is this frame's in
		 * a bytecode's template (but for those that return), its
		 * bytecode pointer in r13 (known for the walk's first frame:
		 * the registers where the thread stopped); elsewhere rbp may
		 * not be this frame's yet (or any more). */
		if (exact && (idx != 0 || u->pc < j->templates_lo || u->pc >= j->templates_hi ||
			      (u->pc >= j->returns_lo[0] && u->pc < j->returns_hi[0]) ||
			      (u->pc >= j->returns_lo[1] && u->pc < j->returns_hi[1])))
			return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
		/* The frame is at rbp: where no frame before restored it, the
		 * walk's starting rbp, which a proof of the walk then checks. */
		if (!u->bp_restored)
			u->bp_used = true;
		if (read_user(js->frame, 16 - JAVA_FRAME_LOW, (void *)(u->bp + JAVA_FRAME_LOW), task,
			      c))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		/* The frame's slots proved as one: they lie together. */
		note_range(pr, u, u->bp + JAVA_FRAME_LOW, js->frame, 0);
		method = JAVA_SLOT(js, j->interp_method);
		sender = JAVA_SLOT(js, j->interp_sender_sp);
		/* The caller's stack pointer before this frame extended it
		 * (a compiled caller's frame size counts from there). */
		if ((method & 7) || method >= (1ULL << 47) || !method || sender < u->bp + 16 ||
		    sender - u->bp > (1 << 20))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		sender = JAVA_SLOT(js, j->interp_bcp);
		if (exact) {
			/* r13, the bytecode pointer but in a call's last
			 * instructions (the callee's sender's stack pointer
			 * then): among the method's bytecodes, or not known. */
			if (read_user(&js->cm, 8, (void *)(method + j->method_const), task, c) ||
			    read_user(&js->code_size, 2, (void *)(js->cm + j->const_code_size), task,
				      c) ||
			    js->r13 < js->cm + j->const_size ||
			    js->r13 >= js->cm + j->const_size + js->code_size)
				return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
			sender = js->r13;
			/* A register no proof of the walk checks: walked again
			 * each time. */
			u->unprovable = true;
		}
		/* The bytecode pointer's low 16 bits: userspace finds the
		 * index from the method's bytecodes (fewer than 2^16). */
		ips[idx & MAX_STACK_DEPTH] =
			JAVA_WORD(JAVA_INTERP_MARK) | (method >> 3) << 16 | (sender & 0xffff);
		sender = JAVA_SLOT(js, j->interp_sender_sp);
		u->sp = sender;
		u->bp = JAVA_SLOT(js, 0);
		u->bp_restored = true;
		u->pc = JAVA_SLOT(js, 8);
		u->rt_frames++;
		java_notice(js, u->tgid, ips[idx & MAX_STACK_DEPTH]);
		return u->pc ? JAVA_NEXT : JAVA_END;
	}
	js->lo = 0;
#pragma clang loop unroll(full)
	for (w = 0; w < JAVA_HEAPS; w++) {
		if (w < j->heaps && u->pc >= j->heap_lo[w] && u->pc < j->heap_hi[w]) {
			js->lo = j->heap_lo[w];
			js->map = j->segmap[w];
			js->log2 = j->log2_segment[w] & 31;
		}
	}
	if (!js->lo)
		return JAVA_NOT_JAVA;
	/* The block that holds pc: back through the segment map to its
	 * first segment, a window of the map read at a time. */
	js->k = (u->pc - js->lo) >> js->log2;
	/* A window a bpf_loop step: the verifier checks one. */
	js->hop_end = JAVA_HOP_GOING;
	if (task) {
		struct java_hop_task hop = { .task = task };

		bpf_loop(JAVA_WINDOWS, java_hop_task, &hop, 0);
	} else {
		bpf_loop(JAVA_WINDOWS, java_hop_current, NULL, 0);
	}
	/* Looked up again: the verifier forgets what a pointer to a map
	 * value held across the call. */
	js = java_scratch_of(task != NULL);
	if (!js || js->hop_end != JAVA_HOP_FOUND)
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	j = &js->p;
	n = j->header_read;
	if (n > JAVA_HEADER)
		n = JAVA_HEADER;
	if (n < 8)
		n = 8;
	js->blob = js->lo + (js->k << (js->log2 & 31)) + j->block_header;
	if (read_user(js->header, n, (void *)js->blob, task, c))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	size = *(__s32 *)&js->header[j->frame_size & (JAVA_HEADER - 1)];
	js->pc = u->pc;
	/* A frame to be deoptimized returns into its method's deoptimization
	 * handler: the pc it was at (where the method's debug information
	 * describes the frame, its inlined methods among it) is in the frame,
	 * where the nmethod says. */
	if (j->deopt_handler && !exact &&
	    js->pc == (j->deopt_relative
			       ? js->blob + *(__s32 *)&js->header[j->deopt_handler & (JAVA_HEADER - 1)]
			       : *(__u64 *)&js->header[j->deopt_handler & (JAVA_HEADER - 1)])) {
		/* The original pc's offset from the frame's stack pointer
		 * (C2's is often 0), kept in the blob's slot for it. */
		sender = u->sp + *(__s32 *)&js->header[j->orig_pc_offset & (JAVA_HEADER - 1)];
		if (sender < u->sp || sender - u->sp > (1 << 16) ||
		    read_user(js->frame, 8, (void *)sender, task, c))
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		js = java_scratch_of(task != NULL);
		if (!js)
			return JAVA_END;
		j = &js->p;
		/* In the same method's code, or the frame is not one. */
		if (js->frame[0] <= js->blob ||
		    js->frame[0] - js->blob >=
			    (__u32)*(__s32 *)&js->header[j->blob_size & (JAVA_HEADER - 1)])
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		note_slot(pr, u, sender, js->frame[0]);
		js->pc = js->frame[0];
	}
	ips[idx & MAX_STACK_DEPTH] =
		JAVA_WORD(JAVA_CODE_MARK) |
		(__u64)(*(__u32 *)&js->header[j->compile_id & (JAVA_HEADER - 1)] &
			((1 << JAVA_CHECK_BITS) - 1))
			<< 47 |
		(js->pc & ((1ULL << 47) - 1));
	u->rt_frames++;
	java_notice(js, u->tgid, ips[idx & MAX_STACK_DEPTH]);
	if (size <= 0) {
		/* Other blobs without a frame size keep no frame pointer of
		 * their own: not guessed through one.  Nor is the call stub's
		 * where the thread stopped in its own code (its frame pointer
		 * may not be set up). */
		if (exact)
			return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
		if (j->call_stub_return && js->pc != j->call_stub_return)
			return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
		return JAVA_BY_FP;
	}
	if (size > (1 << 16))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	if (exact) {
		/* Stopped in the code itself, not at a call: in the code of a
		 * method compiled by C1 or C2 (not a native method's wrapper,
		 * of compile level 0), between its prologue and its stubs,
		 * the instructions at pc tell how much of the frame stands. */
		n = JAVA_FRAME_UNKNOWN;
		if ((j->nm_kind_bytes == 8 ? *(__u64 *)&js->header[j->nm_kind_at & (JAVA_HEADER - 1)] ==
						     j->nm_kind
					   : j->nm_kind_bytes == 1 &&
						     js->header[j->nm_kind_at & (JAVA_HEADER - 1)] ==
							     (__u8)j->nm_kind) &&
		    js->header[j->comp_level & (JAVA_HEADER - 1)]) {
			method = j->code_relative
					 ? js->blob + *(__s32 *)&js->header[j->code_begin &
									   (JAVA_HEADER - 1)]
					 : *(__u64 *)&js->header[j->code_begin & (JAVA_HEADER - 1)];
			sender = j->frame_complete_short
					 ? (__u64)(__s64) * (__s16 *)&js->header[j->frame_complete &
										(JAVA_HEADER - 1)]
					 : (__u64)(__s64) * (__s32 *)&js->header[j->frame_complete &
										(JAVA_HEADER - 1)];
			if ((__s64)sender >= 0 && u->pc >= method + sender &&
			    u->pc < js->blob + *(__u32 *)&js->header[j->stub_offset & (JAVA_HEADER - 1)] &&
			    !read_user(js->frame, 24, (void *)(u->pc - 8), task, c))
				n = java_code_at(js->frame[0], js->frame[1], js->frame[2]);
		}
		js = java_scratch_of(task != NULL);
		if (!js || n == JAVA_FRAME_UNKNOWN)
			return java_cut(u, ips, idx, JAVA_CUT_RUNNING);
		if (n != JAVA_FRAME_WHOLE) {
			if (read_user(js->frame, 16, (void *)u->sp, task, c))
				return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
			if (n == JAVA_FRAME_POPPING) {
				note_slot(pr, u, u->sp, js->frame[0]);
				note_slot(pr, u, u->sp + 8, js->frame[1]);
				u->bp = js->frame[0];
				u->bp_restored = true;
				u->pc = js->frame[1];
				u->sp += 16;
			} else {
				note_slot(pr, u, u->sp, js->frame[0]);
				u->pc = js->frame[0];
				u->sp += 8;
			}
			return u->pc ? JAVA_NEXT : JAVA_END;
		}
	}
	sender = u->sp + 8 * (__u64)size;
	js = java_scratch_of(task != NULL);
	if (!js || read_user(js->frame, 16, (void *)(sender - 16), task, c))
		return java_cut(u, ips, idx, JAVA_CUT_UNREADABLE);
	note_slot(pr, u, sender - 16, js->frame[0]);
	note_slot(pr, u, sender - 8, js->frame[1]);
	u->sp = sender;
	u->bp = js->frame[0];
	u->bp_restored = true;
	u->pc = js->frame[1];
	return u->pc ? JAVA_NEXT : JAVA_END;
}

/*
 * java_step() in the walk of the current task's stack, whose state is in
 * file_scratch (`st`), its frames in `scratch`: a global function, so
 * that its stack is not the walk's step's (the chain of calls from the
 * switch hook through a walk by files to the maple tree's is at the
 * verifier's bound), and the verifier checks it once.
 */
__noinline int java_step_of_current(__u32 idx, bool exact)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&scratch, &zero);
	struct file_scratch *s = bpf_map_lookup_elem(&file_scratch, &zero);
	struct ucache_walk *pr = ucache_on ? bpf_map_lookup_elem(&ucache_scratch, &zero) : NULL;

	if (!ips || !s)
		return JAVA_END;
	return java_step(&s->st, ips, idx, exact, NULL, pr, NULL);
}

#endif /* __OFFCPUTIME_JAVA_H__ */
