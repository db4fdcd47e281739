/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * V8 frames (Node.js) in the native walk (see struct node_proc and
 * V8_FRAME_MARK in offcputime.h).
 *
 * V8's generated code and its builtins have no call-frame information, and
 * keep frame pointers: the native walk hands each such address of a
 * Node.js process to v8_step(), which reads the frame's slots below its
 * frame pointer.  A JavaScript frame (interpreted, baseline or optimized)
 * keeps its context and its JSFunction there; its word names the
 * function's SharedFunctionInfo (read from the JSFunction now: the
 * function object may move or die, its shared part is what userspace
 * names), with the bytecode offset of an interpreted frame (or a hash of
 * a compiled frame's return address); its notice to userspace carries the
 * frame's BytecodeArray (or its return address), from which userspace
 * reads where in its source the frame is and, for optimized code, the
 * functions inlined there.  A frame of
 * V8's own (entry, exit, stub, construct frames) keeps a marker of its
 * type in the context's slot and stays a native frame (its builtin's
 * name).  Either way the caller is through the frame pointer, as V8 lays
 * its frames out: not a guess, so not counted as one.
 */
#ifndef __OFFCPUTIME_V8_H__
#define __OFFCPUTIME_V8_H__

/* v8_on (--no-node leaves it off): see runtime.h. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct node_proc);
} node_procs SEC(".maps");

/* What a walk through V8 frames works with: its process's entry, copied
 * at the walk's start, and room for what a frame reads. */
struct v8_scratch {
	struct node_proc p;
	__u64 frame[16];
	__u64 shared;
	/* An interpreted frame's BytecodeArray's map, and its type. */
	__u64 map;
	__u16 type;
	__u16 _pad16[3];
	/* The thread walked (for the notices of new words). */
	__u64 process_start;
	__u32 pid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct v8_scratch);
} v8_scratch SEC(".maps");

/* The same for the sleepable iterators' walks of other tasks (see
 * start_file_scratch). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct v8_scratch);
} v8_task_scratch SEC(".maps");

static __always_inline struct v8_scratch *v8_scratch_of(bool remote)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(remote ? (void *)&v8_task_scratch : (void *)&v8_scratch, &zero);
}

/* Whether the walk of a thread of process `tgid` (`task`, NULL: the
 * current task) meets V8 frames: its process has an entry for its address
 * space (claimed by the first walk where userspace could not say which),
 * copied where the walk's steps find it. */
static __always_inline bool v8_walkable(__u32 tgid, struct task_struct *task)
{
	struct v8_scratch *vs;
	struct node_proc *n;
	__u64 mm;

	if (!v8_on || !runtime_pid(tgid))
		return false;
	n = bpf_map_lookup_elem(&node_procs, &tgid);
	vs = v8_scratch_of(task != NULL);
	if (!n || !vs)
		return false;
	mm = (__u64)(task ? BPF_CORE_READ(task, mm) : BPF_CORE_READ(bpf_get_current_task_btf(), mm));
	if (!n->mm)
		n->mm = mm;
	if (n->mm != mm)
		return false;
	vs->p = *n;
	if (task) {
		vs->pid = BPF_CORE_READ(task, pid);
		vs->process_start = BPF_CORE_READ(task, group_leader, start_boottime);
	} else {
		vs->pid = (__u32)bpf_get_current_pid_tgid();
		vs->process_start = BPF_CORE_READ(bpf_get_current_task_btf(), group_leader,
						  start_boottime);
	}
	return true;
}

/* v8_walkable() of the current task: a global function, so that its
 * reads' room on the stack is not the caller's (on 6.1 the chain of calls
 * from the switch hook through the walk is at the verifier's bound of 512
 * bytes). */
__noinline int v8_walkable_of_current(__u32 tgid)
{
	return v8_walkable(tgid, NULL);
}

/* The frame's slot `off` bytes from its frame pointer (masked: a bound
 * for the verifier; the frame's slots are the first NODE_FRAME_WORDS). */
#define V8_SLOT(vs, off) ((vs)->frame[V8_INDEX(off)])
#define V8_INDEX(off) ((((off) - NODE_FRAME_LOW) >> 3) & 15)
#define V8_MIN(a, b) ((a) < (b) ? (a) : (b))

/* v8_step()'s answers. */
#define V8_NOT_V8 0
#define V8_NEXT 1
#define V8_END 2

/*
 * The frame at u's pc, a return address into code without call-frame
 * information in a Node.js process: if V8's (a JavaScript frame, its word
 * written in its place, or one of V8's own), its caller through its frame
 * pointer (V8_NEXT, V8_END); V8_NOT_V8 where its slots are not a V8
 * frame's, for the native walk's own step.
 */
static __always_inline int v8_step(struct unwind_state *u, __u64 *ips, __u32 idx,
				   struct stack_copy *c, struct ucache_walk *pr,
				   struct task_struct *task)
{
	struct v8_scratch *vs = v8_scratch_of(task != NULL);
	struct node_proc *n;
	__u64 context, function, at, extra, off, bytecode, skip;
	bool interpreted;
	__u32 w;

	if (!vs || !u->bp)
		return V8_NOT_V8;
	if (read_user(vs->frame, NODE_FRAME_WORDS * 8, (void *)(u->bp + NODE_FRAME_LOW), task, c))
		return V8_NOT_V8;
	n = &vs->p;
	context = V8_SLOT(vs, n->fp_context);
	function = V8_SLOT(vs, n->fp_function);
	/* What the proof of the walk leaves out: the slots below those the
	 * frame is read by (an optimized frame's spills, an interpreted
	 * frame's registers change while it stays where it is). */
	skip = V8_MIN(V8_INDEX(n->fp_context), V8_INDEX(n->fp_function));
	if (!(context & 1)) {
		/* V8's own frame: its type's marker (a small even number). */
		if (context > 255)
			return V8_NOT_V8;
	} else {
		/* A JavaScript frame: its JSFunction, a heap object. */
		if ((function & 3) != 1 || function >= (1ULL << 47) || context >= (1ULL << 47))
			return V8_NOT_V8;
		if (read_user(&vs->shared, 8, (void *)(function - 1 + n->function_shared), task, c) ||
		    (vs->shared & 3) != 1 || vs->shared >= (1ULL << 47)) {
			/* Left as the native walk has it: counted, said. */
			count(CNT_V8_UNREADABLE);
			skip = 0;
		} else {
			/* Generated code: the word keeps a hash of the return
			 * address, told in full with the notice (userspace finds
			 * the code there, its inlined functions, its position). */
			at = (u->pc ^ u->pc >> 15 ^ u->pc >> 30 ^ u->pc >> 45) & V8_AT_MAX;
			extra = u->pc;
			/* Interpreted: its pc in one of the interpreter's entry
			 * builtins, or (where V8 runs a copy of its builtins
			 * near its code, not the binary's) a small integer in
			 * the bytecode offset's slot beside a BytecodeArray (by
			 * its map's type: a baseline frame keeps its feedback
			 * there, an optimized one what it spills). */
			off = V8_SLOT(vs, n->fp_bytecode_offset);
			bytecode = V8_SLOT(vs, n->fp_bytecode_array);
			interpreted = false;
#pragma clang loop unroll(full)
			for (w = 0; w < NODE_INTERP_RANGES; w++) {
				if (u->pc >= n->interp_lo[w] && u->pc < n->interp_hi[w])
					interpreted = true;
			}
			if (!interpreted && !(off & ((1ULL << (n->smi_shift & 63)) - 1)) &&
			    (off >> (n->smi_shift & 63)) < 0x100000 && (bytecode & 3) == 1 &&
			    bytecode < (1ULL << 47) &&
			    !read_user(&vs->map, 8, (void *)(bytecode - 1), task, c) &&
			    (vs->map & 3) == 1 && vs->map < (1ULL << 47) &&
			    !read_user(&vs->type, 2, (void *)(vs->map - 1 + n->map_instance_type),
				       task, c))
				interpreted = vs->type == n->type_bytecode_array;
			if (interpreted) {
				skip = V8_MIN(skip, V8_MIN(V8_INDEX(n->fp_bytecode_offset),
							   V8_INDEX(n->fp_bytecode_array)));
				off >>= n->smi_shift & 63;
				at = V8_AT_BYTECODE | (off < V8_AT_MAX ? off : V8_AT_MAX);
				extra = bytecode;
			}
			ips[idx & MAX_STACK_DEPTH] = (__u64)V8_FRAME_MARK << 60 |
						     ((vs->shared >> 3) & ((1ULL << 44) - 1)) << 16 |
						     at;
			u->rt_frames++;
			runtime_notice_once(TASK_EVENT_V8CODE, u->tgid, vs->pid, vs->process_start,
					    n->mm, ips[idx & MAX_STACK_DEPTH], extra,
					    CNT_V8_EVENTS_LOST);
		}
	}
	/* The frame's slots proved as one: they lie together (the caller's
	 * frame pointer and return address among them).  Where no frame
	 * before restored rbp, the walk's starting rbp, which a proof of the
	 * walk then checks. */
	if (!u->bp_restored)
		u->bp_used = true;
	note_range(pr, u, u->bp + NODE_FRAME_LOW, vs->frame, skip);
	u->sp = u->bp + 16;
	u->bp = V8_SLOT(vs, 0);
	u->bp_restored = true;
	u->pc = V8_SLOT(vs, 8);
	return u->pc ? V8_NEXT : V8_END;
}

/*
 * v8_step() in the walk of the current task's stack, whose state is in
 * file_scratch (`st`), its frames in `scratch`: a global function, so that
 * its stack is not the walk's step's (see java_step_of_current()).
 */
__noinline int v8_step_of_current(__u32 i)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&scratch, &zero);
	struct file_scratch *s = bpf_map_lookup_elem(&file_scratch, &zero);
	struct ucache_walk *pr = ucache_on ? bpf_map_lookup_elem(&ucache_scratch, &zero) : NULL;

	if (!ips || !s)
		return V8_END;
	return v8_step(&s->st, ips, i, NULL, pr, NULL);
}

#endif /* __OFFCPUTIME_V8_H__ */
