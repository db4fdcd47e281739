/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * User stacks copied for userspace to walk, where a process's tables are
 * not built yet.
 */
#ifndef __OFFCPUTIME_DEFERRED_H__
#define __OFFCPUTIME_DEFERRED_H__

/* Not a stack id (see enum stack_id_special): the current task's process
 * has no unwind tables yet, or its registers could not be read; its user
 * stack is to be walked with frame pointers. */
#define USTACK_NO_TABLES 4
/* ... or its user registers could not be read (walked as bpf_get_stack()
 * can, not counted). */
#define USTACK_NO_REGS 5

/* The copies of user stacks for userspace (struct deferred_stack), made
 * in this CPU's scratch. */
struct deferred_scratch {
	struct deferred_stack s;
	/* Copies made on this CPU: the ids' low bits. */
	__u64 seq;
	/* What this CPU may still copy (see DEFERRED_COPY_NS), and when
	 * that was last worked out. */
	__u64 credit_ns;
	__u64 credit_at;
};

/*
 * Copies cost the switch they are made in a few microseconds each: a CPU
 * makes one per DEFERRED_COPY_NS at most, in bursts of up to
 * DEFERRED_COPY_BURST, so that thousands of threads of new processes
 * blocking at once (before userspace has their tables, a few milliseconds)
 * cost a bounded share of it.  The blocks beyond are counted apart
 * (CNT_UNWIND_DEFER_PACED) from those lost for a full ring buffer.
 */
#define DEFERRED_COPY_NS 250000ULL
#define DEFERRED_COPY_BURST 512ULL

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct deferred_scratch);
} deferred_scratch SEC(".maps");

/* Sized by userspace at load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} deferred_stacks SEC(".maps");

#define DEFERRED_HEADER_BYTES ((__u32)__builtin_offsetof(struct deferred_stack, bytes))

#endif /* __OFFCPUTIME_DEFERRED_H__ */
