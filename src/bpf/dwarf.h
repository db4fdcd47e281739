/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The DWARF walk of user stacks: unwind rows and mappings found by binary
 * search, files' tables found through the address space, one frame per
 * bpf_loop step.
 */
#ifndef __OFFCPUTIME_DWARF_H__
#define __OFFCPUTIME_DWARF_H__

/* State of a DWARF unwind of a user stack: in a map, where the walk's
 * steps find it (`st` of file_scratch for the current task, of
 * start_file_scratch for another, see remote_state()). */
struct unwind_state {
	/* Registers of the frame being unwound. */
	__u64 pc;
	__u64 sp;
	__u64 bp;
	/* The process's slice of unwind_maps. */
	__u32 map_start;
	__u32 map_count;
	/* Frames written to `scratch`, and the most to write. */
	__u32 nr;
	__u32 max;
	/* 16 bits, and rax's test below kept as a bool: on 6.1 the stack of
	 * a chain of calls (the switch hook, user_stack_of_current, the
	 * bpf_loop callback, unwind_rule) is bounded to 512 bytes. */
	__u16 fp_frames;
	/* ... of which in an object's code that its tables do not cover
	 * (CNT_UNWIND_GAP_FRAMES). */
	__u16 gap_frames;
	/* The frame whose pc is not a return address, and so is looked up
	 * as it is: 0, or the one after a signal frame (the interrupted
	 * pc). */
	__u32 exact_at;
	bool truncated;
	/* For the cache (struct ucache): a read failed (the walk cannot be
	 * proved again); the starting frame pointer was used; bp no longer
	 * holds it. */
	bool unprovable;
	bool bp_used;
	bool bp_restored;
	/* rax of the first frame is 0 (UNWIND_CLONE: clone's child); past a
	 * signal frame, rax is not known. */
	bool ax_zero;
	bool ax_unknown;
	/* The frame being walked through frame pointers is in a gap of its
	 * object's tables (RULE_GAP). */
	bool in_gap;
	/* The process has an entry in java_procs (java.h), or in node_procs
	 * (v8.h); the runtime's frames walked (Java's or JavaScript's).  The
	 * second bool in the padding: on 6.1 a chain of calls' stack (the
	 * switch hook's, through defer_user_stack(), which keeps a state of
	 * its own) is bounded to 512 bytes. */
	bool java;
	__u16 rt_frames;
	bool v8;
	/* The walked task's process. */
	__u32 tgid;
};

struct file_scratch {
	__u64 node[MAPLE_NODE_WORDS];
	struct file_memo memo[FILE_MEMOS];
	/* The walk under way on this CPU, and the memo written next. */
	__u64 walk;
	struct unwind_file_key key;
	__u32 next;
	/* The mappings of files this walk went through (the first
	 * MAPPED_VMAS). */
	__u32 used;
	struct mapped_vma vma[MAPPED_VMAS];
	/* The walk itself, kept here, not on the stack: the verifier of 6.1
	 * bounds the stack of a chain of calls (the switch hook, this walk,
	 * its bpf_loop callback, file_rule()) to 512 bytes.  The address
	 * space walked; whether a file without tables yet was met (the walk
	 * is then given up). */
	struct unwind_state st;
	__u64 mm;
	__u32 needs_tables;
	/* maple_level(): the slot found in the node. */
	__u32 maple_off;
	/* The last address of the maple tree's slot walked into last
	 * (maple_level()). */
	__u64 maple_max;
};

/* Mapping notices sent per process (struct mapped_event): two, for its
 * first walks through files (userspace reads its mappings meanwhile): more
 * would crowd out the news of other new processes on the ring buffer under
 * a burst of them. */
#define MAPPED_NOTICES 2
struct mapped_sent {
	__u64 mm;
	__u64 exec_vm;
	__u32 sent;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct mapped_sent);
} mapped_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct file_scratch);
} file_scratch SEC(".maps");

/* The same for the start iterator, which may sleep: a switch hook on its
 * CPU would reuse the per-CPU one meanwhile. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct file_scratch);
} start_file_scratch SEC(".maps");

static __always_inline struct file_scratch *file_scratch_of(bool start)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(start ? (void *)&start_file_scratch : (void *)&file_scratch,
				   &zero);
}

/* The hash of a walk's slots (struct ucache) with one more slot's value
 * `v`: each step is a bijection of the hash for a given value and of the
 * value for a given hash, so a change of any one slot changes the end. */
static __always_inline __u64 ucache_mix(__u64 h, __u64 v)
{
	h = (h ^ v) * 0x100000001b3ULL;
	return h ^ (h >> 29);
}

/* The walk read `span` bytes at `addr` (8, or UCACHE_RANGE for a range
 * slot, `range`, leaving out its first `skip` words), which `val` stands
 * for: slot k of its proof in `pr`. */
static __always_inline void note_proof(struct ucache_walk *pr, struct unwind_state *u, __u64 addr,
				       __u64 val, __u32 span, bool range, __u32 skip)
{
	__u64 off;
	__u32 k, at;

	if (!pr)
		return;
	k = pr->e.n;
	off = addr - pr->e.sp;
	if (k >= UCACHE_SLOTS || addr < pr->e.sp || (off & 7) ||
	    (off >> 3) > (range ? UCACHE_RANGE_OFF_MAX : UCACHE_WORD_MAX) ||
	    skip > UCACHE_RANGE_SKIP_MAX) {
		u->unprovable = true;
		return;
	}
	at = off >> 3;
	if (range)
		at |= UCACHE_RANGE_BIT | skip << UCACHE_RANGE_SKIP_SHIFT;
	pr->e.n = k + 1;
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(k));
	k &= UCACHE_SLOTS - 1;
	pr->s.off[k] = at;
	pr->e.hash = ucache_mix(pr->e.hash, val);
	pr->e.shape = ucache_mix(pr->e.shape, at);
	if (off + span > pr->e.top)
		pr->e.top = off + span;
}

/* The walk read `val` at `addr`. */
static __always_inline void note_slot(struct ucache_walk *pr, struct unwind_state *u,
				      __u64 addr, __u64 val)
{
	note_proof(pr, u, addr, val, 8, false, 0);
}

/* The hash of a range slot's UCACHE_RANGE_WORDS words `w` (struct
 * ucache) but for the first `skip`: a change of any of them changes it but
 * for a chance of one in 2^64. */
static __always_inline __u64 ucache_range_hash(const __u64 *w, __u64 skip)
{
	__u64 h = UCACHE_HASH_SEED;
	int i;

#pragma clang loop unroll(full)
	for (i = 0; i < UCACHE_RANGE_WORDS; i++) {
		if (i < skip)
			continue;
		h = ucache_mix(h, w[i]);
	}
	return h;
}

/* The walk read the UCACHE_RANGE bytes `w` at `addr`: proved as one slot
 * (see UCACHE_RANGE_BIT), but for its first `skip` words (what the walk
 * did not use, such as the spill slots of a V8 frame, which change while
 * the frame's place in its code does not). */
static __always_inline void note_range(struct ucache_walk *pr, struct unwind_state *u, __u64 addr,
				       const __u64 *w, __u64 skip)
{
	if (pr)
		note_proof(pr, u, addr, ucache_range_hash(w, skip), UCACHE_RANGE, true, skip);
}

/* Reads the user memory of the current task, or of `task` from the copy
 * of its stack `c` where it has the bytes, else from the task (which may
 * sleep, so only from the sleepable start iterator). */
static __always_inline long read_user(void *dst, __u32 size, const void *src,
				      struct task_struct *task, struct stack_copy *c)
{
	__u64 off;

	if (!c)
		return bpf_probe_read_user(dst, size, src);
	off = (__u64)src - c->base;
	if ((__u64)src >= c->base && off < STACK_COPY_BYTES && off + size <= c->len)
		return bpf_probe_read_kernel(dst, size, &c->bytes[off & (STACK_COPY_BYTES - 1)]);
	return bpf_copy_from_user_task(dst, size, src, task, 0);
}

/* A binary search over `count` entries of an array map from `start`, one
 * halving per bpf_loop step: the verifier then checks a step once, not
 * every path through an unrolled search (which made loading slow). */
struct search {
	__u32 start;
	__u32 lo;
	__u32 hi;
	__u64 addr;
	/* find_mapping: s->lo is the mapping that holds addr. */
	__u32 found;
};

/*
 * Binary searches take SEARCH_STEPS steps per bpf_loop call: each call of
 * a callback is a call and a return, which the kernel's mitigations of
 * speculative execution make expensive (tens of ns each on some CPUs),
 * and a search takes up to 25 steps; the verifier checks the steps of
 * one call, not of the whole search.
 */
#define SEARCH_STEPS 5

static long mapping_step(__u32 i, void *arg)
{
	struct search *s = arg;
	struct unwind_mapping *m;
	__u32 mid, idx;
	int k;

	for (k = 0; k < SEARCH_STEPS; k++) {
		if (s->lo >= s->hi)
			return 1;
		mid = s->lo + (s->hi - s->lo) / 2;
		idx = s->start + mid;
		m = unwind_mapping_at(idx);
		if (!m)
			return 1;
		if (s->addr < m->start) {
			s->hi = mid;
		} else if (s->addr >= m->end) {
			s->lo = mid + 1;
		} else {
			s->lo = mid;
			s->hi = 0;
			s->found = 1;
			return 1;
		}
	}
	return 0;
}

/* The mapping that holds `addr` among the `count` from `start` (a
 * process's, sorted by start address): a binary search. */
static __always_inline struct unwind_mapping *find_mapping(__u32 start, __u32 count, __u64 addr)
{
	struct search s = { .start = start, .hi = count, .addr = addr };
	__u32 idx;

	/* 2^10 = UNWIND_MAX_PROC_MAPPINGS */
	bpf_loop((11 + SEARCH_STEPS - 1) / SEARCH_STEPS, mapping_step, &s, 0);
	if (!s.found)
		return NULL;
	idx = s.start + s.lo;
	return unwind_mapping_at(idx);
}

static long row_step(__u32 i, void *arg)
{
	struct search *s = arg;
	struct unwind_row *r;
	__u32 mid, idx;
	int k;

	for (k = 0; k < SEARCH_STEPS; k++) {
		if (s->lo >= s->hi)
			return 1;
		mid = s->lo + (s->hi - s->lo) / 2;
		idx = s->start + mid;
		r = unwind_row_at(idx);
		if (!r)
			return 1;
		if (r->pc <= s->addr)
			s->lo = mid + 1;
		else
			s->hi = mid;
	}
	return 0;
}

/* The last of the `count` rows from `start` whose pc is at most `pc`. */
static __always_inline struct unwind_row *find_row(__u32 start, __u32 count, __u32 pc)
{
	struct search s = { .start = start, .hi = count, .addr = pc };
	__u32 idx;

	/* 2^24 = UNWIND_MAX_OBJECT_ROWS */
	bpf_loop((25 + SEARCH_STEPS - 1) / SEARCH_STEPS, row_step, &s, 0);
	if (s.lo == 0 || s.lo > count || s.lo < s.hi)
		return NULL;
	idx = start + s.lo - 1;
	return unwind_row_at(idx);
}

/* unwind_rule()'s answer: kind | cfa_off << 8 | (__u8)rbp_off << 24,
 * and RULE_GAP where an object with tables maps the address but no row
 * covers it. */
#define RULE_GAP (1ULL << 32)
#define RULE_KIND(r) ((__u32)((r) & 0xff))
#define RULE_CFA_OFF(r) ((__u32)(((r) >> 8) & 0xffff))
#define RULE_RBP_OFF(r) ((__s64)(__s8)(((r) >> 24) & 0xff))

/*
 * The unwind rule of `addr` in the process whose mappings are the `count`
 * from `start` in unwind_maps: its mapping, then its object's row; kind
 * UNWIND_NONE where no call-frame information covers it (frame pointers
 * are followed there).  A global function, so that the verifier checks it
 * once for any address, on its own, instead of again at every call in
 * every state of its callers (most of the load time went there).  It
 * answers in its return value, not through memory: the verifier of 6.1
 * takes a caller's stack passed to a global function as unchanged by the
 * call (and drops the code that reads the answer as dead).  It only looks
 * up array maps, which sleepable and non-sleepable programs may both do.
 */
__noinline __u64 unwind_rule(__u64 addr, __u32 start, __u32 count)
{
	struct unwind_mapping *m;
	struct unwind_row *r = NULL;

	m = find_mapping(start, count, addr);
	if (!m || !m->row_count)
		return UNWIND_NONE;
	if (addr - m->bias <= 0xffffffffULL)
		r = find_row(m->row_start, m->row_count, addr - m->bias);
	if (!r || r->kind == UNWIND_NONE)
		return UNWIND_NONE | RULE_GAP;
	return (__u64)r->kind | (__u64)r->cfa_off << 8 | (__u64)(__u8)r->rbp_off << 24;
}

/* Maple tree nodes (lib/maple_tree.c): a node pointer is tagged with its
 * type in bits 3..6 (and the root with 2 in bits 0..1); nodes are
 * 256 bytes, aligned to 256.  A leaf or range node has 15 pivots (from
 * word 1) and 16 slots (from word 16), where a node with fewer than 16
 * entries keeps their count in the byte at 248 (its metadata); an
 * allocation-range node (the inner nodes of a tree of mappings) has 9
 * pivots, 10 slots (from word 10) and its count at byte 240.  Pivot k is
 * the last address of slot k. */
#define MAPLE_LEAF_64 1
#define MAPLE_RANGE_64 2
#define MAPLE_ARANGE_64 3
#define MAPLE_DEPTH 8
#define VM_EXEC 0x4

/* What maple_level() answers where a node cannot be read or is of a
 * type not known here: not a kernel address, so the walk ends there. */
#define MAPLE_FAIL 2

/*
 * One level of the walk of a maple tree (see vma_of()): the node `entry`
 * is read into the scratch of this walk and the entry of the slot that
 * holds `addr` is returned (0: a gap), MAPLE_FAIL where the node cannot
 * be read or its type is not known.  The last address the slot covers is
 * kept in the scratch's maple_max.  A global function, so that the
 * verifier checks a level once, not again for every state of every level
 * above it (this walk was half of the switch hook's verification).
 */
__noinline __u64 maple_level(__u64 entry, __u64 addr, bool start_iter)
{
	struct file_scratch *s = file_scratch_of(start_iter);
	__u64 max, piv, last;
	__u32 type, npiv, slots, end, off, k;

	if (!s)
		return MAPLE_FAIL;
	max = s->maple_max;
	type = (entry >> 3) & 15;
	if (bpf_probe_read_kernel(s->node, sizeof(s->node), (void *)(entry & ~255ULL)))
		return MAPLE_FAIL;
	if (type == MAPLE_ARANGE_64) {
		npiv = 9;
		slots = 10;
		end = ((__u8 *)s->node)[240];
	} else if (type == MAPLE_LEAF_64 || type == MAPLE_RANGE_64) {
		npiv = 15;
		slots = 16;
		last = s->node[15];
		if (!last)
			end = ((__u8 *)s->node)[248];
		else if (last == max)
			end = 14;
		else
			end = 15;
	} else {
		return MAPLE_FAIL;
	}
	if (end > npiv)
		end = npiv;
	/* The first pivot at or above addr, else the last slot: from the
	 * end down, so that the loop unrolls into plain compares (the
	 * verifier of 6.1 loses the bounds of a pointer walked through a
	 * loop that breaks early). */
	/* The slot found is kept in memory, not in a register: the verifier
	 * then has one state to follow down the compares, not one for each
	 * slot found so far. */
	*(volatile __u32 *)&s->maple_off = end;
#pragma clang loop unroll(full)
	for (k = 15; k > 0; k--) {
		piv = s->node[k & (MAPLE_NODE_WORDS - 1)];
		if (k - 1 < end && piv >= addr)
			*(volatile __u32 *)&s->maple_off = k - 1;
	}
	off = *(volatile __u32 *)&s->maple_off;
	if (off < end)
		s->maple_max = s->node[(1 + off) & (MAPLE_NODE_WORDS - 1)];
	return s->node[(slots + off) & (MAPLE_NODE_WORDS - 1)];
}

/*
 * The mapping of address space `mm` that holds `addr`: a lookup in its
 * maple tree as the kernel's own (mtree_lookup_walk()), with plain reads:
 * the tree may change meanwhile (another thread mapping or unmapping), so
 * what is found is checked to hold `addr` and to belong to `mm`.  0 where
 * nothing is found or the check fails, 1 where the tree has a gap at
 * `addr` (no mapping).
 */
static __always_inline __u64 vma_of(__u64 mm, __u64 addr, struct file_scratch *s,
				    bool start_iter)
{
	struct mm_struct *m = (struct mm_struct *)mm;
	struct vm_area_struct *vma;
	__u64 entry = (__u64)BPF_CORE_READ(m, mm_mt.ma_root);
	bool leaf = false;
	int level;

	s->maple_max = ~0ULL;
	for (level = 0; level < MAPLE_DEPTH && !leaf; level++) {
		/* The root is an internal entry (tagged 2); the nodes below
		 * are tagged 4 (MAPLE_ENODE_NULL). */
		if (entry < (1ULL << 63) || (level == 0 && (entry & 3) != 2))
			return 0;
		leaf = ((entry >> 3) & 15) == MAPLE_LEAF_64;
		entry = maple_level(entry, addr, start_iter);
	}
	if (!leaf)
		return 0;
	if (!entry)
		return 1;
	if (entry < (1ULL << 63))
		return 0;
	vma = (struct vm_area_struct *)entry;
	if (BPF_CORE_READ(vma, vm_mm) != m || BPF_CORE_READ(vma, vm_start) > addr ||
	    BPF_CORE_READ(vma, vm_end) <= addr)
		return 0;
	return entry;
}

/* The answers of file_memo() that are not a memo. */
#define FILE_MEMO_NONE 0x100
#define FILE_MEMO_UNKNOWN 0x101

/*
 * The mapping of address space `mm` that holds `addr`, with the tables of
 * the file it maps (struct unwind_file): the index of the memo in
 * file_scratch that says where they are; FILE_MEMO_NONE where the mapping
 * has no tables, or no mapping holds `addr`, or it is not executable
 * (frame pointers are followed there, as through a process's own tables);
 * FILE_MEMO_UNKNOWN where the file has no entry yet, or the tree could not
 * be read.  The last mappings found in this walk (`walk`) are kept, so
 * that a stack through a few files looks each up once.  Split from the
 * row lookup (row_rule()) to keep each call's stack small (see struct
 * file_scratch).
 */
__noinline __u32 file_memo(__u64 addr, __u64 mm, __u64 walk, bool start_iter)
{
	struct unwind_file *f;
	struct file_scratch *s;
	struct vm_area_struct *vma;
	struct inode *inode;
	struct file *file;
	__u64 entry, start, off, size = 0;
	__u32 i, chosen = UNWIND_FILE_SEGMENTS, n;

	/* Here too, not only in the callers: a global function is checked on
	 * its own, and before 6.1 the tree's reads cannot be relocated. */
	if (!bpf_core_field_exists(((struct mm_struct *)0)->mm_mt))
		return FILE_MEMO_UNKNOWN;
	s = file_scratch_of(start_iter);
	if (!s)
		return FILE_MEMO_UNKNOWN;
	for (i = 0; i < FILE_MEMOS; i++) {
		if (s->memo[i].mm == mm && s->memo[i].walk == walk && s->memo[i].start <= addr &&
		    addr < s->memo[i].end)
			return i;
	}
	entry = vma_of(mm, addr, s, start_iter);
	if (!entry)
		return FILE_MEMO_UNKNOWN;
	if (entry == 1)
		return FILE_MEMO_NONE;
	vma = (struct vm_area_struct *)entry;
	if (!(BPF_CORE_READ(vma, vm_flags) & VM_EXEC))
		return FILE_MEMO_NONE;
	start = BPF_CORE_READ(vma, vm_start);
	file = BPF_CORE_READ(vma, vm_file);
	s->key.dev = 0;
	s->key.ino = 0;
	if (file) {
		inode = BPF_CORE_READ(file, f_inode);
		s->key.ino = BPF_CORE_READ(inode, i_ino);
		s->key.dev = BPF_CORE_READ(inode, i_sb, s_dev);
		size = BPF_CORE_READ(inode, i_size);
	} else if (start != (__u64)BPF_CORE_READ((struct mm_struct *)mm, context.vdso)) {
		/* Anonymous code (JIT): no tables, as in a process's. */
		return FILE_MEMO_NONE;
	}
	f = bpf_map_lookup_elem(&unwind_files, &s->key);
	if (!f || (file && f->size != size))
		return FILE_MEMO_UNKNOWN;
	off = BPF_CORE_READ(vma, vm_pgoff) << 12;
	n = f->segments;
	/* The last segment the mapping's first page reaches (as userspace's
	 * bias()). */
	for (i = 0; i < UNWIND_FILE_SEGMENTS; i++) {
		if (i < n && off >= f->segment[i].start && off < f->segment[i].end)
			chosen = i;
	}
	i = s->used;
	if (i < MAPPED_VMAS) {
		s->vma[i].start = start;
		s->vma[i].end = BPF_CORE_READ(vma, vm_end);
		s->vma[i].offset = off;
		s->vma[i].dev = s->key.dev;
		s->vma[i].ino = s->key.ino;
		s->used = i + 1;
	}
	i = s->next++ & (FILE_MEMOS - 1);
	s->memo[i].mm = mm;
	s->memo[i].walk = walk;
	s->memo[i].start = start;
	s->memo[i].end = BPF_CORE_READ(vma, vm_end);
	s->memo[i].bias = 0;
	s->memo[i].row_start = 0;
	s->memo[i].row_count = 0;
	if (chosen < UNWIND_FILE_SEGMENTS) {
		s->memo[i].bias =
			start - off - f->segment[chosen & (UNWIND_FILE_SEGMENTS - 1)].delta;
		s->memo[i].row_start = f->row_start;
		s->memo[i].row_count = f->row_count;
	}
	return i;
}

/* The rule of the row of `count` from `start` that covers the object's
 * address `pc` (as unwind_rule()'s answer). */
__noinline __u64 row_rule(__u64 pc, __u32 start, __u32 count)
{
	struct unwind_row *r = NULL;

	if (!count)
		return UNWIND_NONE;
	if (pc <= 0xffffffffULL)
		r = find_row(start, count, pc);
	if (!r || r->kind == UNWIND_NONE)
		return UNWIND_NONE | RULE_GAP;
	return (__u64)r->kind | (__u64)r->cfa_off << 8 | (__u64)(__u8)r->rbp_off << 24;
}

/* The unwind rule of `addr` from the tables of the file mapped there (see
 * file_memo()), UNWIND_UNKNOWN where it has none yet. */
static __always_inline __u64 file_rule(__u64 addr, struct file_scratch *files, bool start_iter)
{
	__u32 m = file_memo(addr, files->mm, files->walk, start_iter);

	if (m == FILE_MEMO_UNKNOWN)
		return UNWIND_UNKNOWN;
	if (m >= FILE_MEMOS)
		return UNWIND_NONE;
	/* The compiler forgets the bound above (see unwind_step). */
	asm volatile("" : "+r"(m));
	m &= FILE_MEMOS - 1;
	return row_rule(addr - files->memo[m].bias, files->memo[m].row_start,
			files->memo[m].row_count);
}

#include "java.h"
#include "v8.h"

/* A signal trampoline's frame (UNWIND_SIGNAL): where the interrupted
 * registers are in the struct ucontext at rsp (x86-64: uc_mcontext at 40,
 * then r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip). */
#define UCONTEXT_RBP 0x78
#define UCONTEXT_RSP 0xa0
#define UCONTEXT_RIP 0xa8

/*
 * One frame: record its pc, then find the caller's pc, sp and bp, with the
 * object's table where it has one and through the frame pointer where it
 * has not (JIT code, objects without call-frame information).  Returns 1
 * to stop (bpf_loop callback).
 */
static __always_inline long unwind_step(__u32 i, struct unwind_state *u, __u64 *ips,
				       struct stack_copy *c, struct ucache_walk *pr,
				       struct file_scratch *files, struct task_struct *task)
{
	__u64 cfa, ra, frame[2], rule, ra_at, bp_at = 0, bp_val = 0;
	__u32 idx;
	__s64 rbp_off;

	/* `i`, not a count kept in the state, indexes the frames: the
	 * verifier then checks this callback once for any i, instead of once
	 * per depth. */
	if (i >= u->max || i >= MAX_STACK_DEPTH) {
		u->truncated = true;
		return 1;
	}
	/* The compiler forgets the check above, so that the verifier sees a
	 * mask. */
	idx = i;
	asm volatile("" : "+r"(idx));
	ips[idx & MAX_STACK_DEPTH] = u->pc;
	u->nr = i + 1;

	/* Java code, in a JVM's code cache (no call-frame information
	 * there): its frame as the JVM lays it out (java.h), or through its
	 * frame pointer where its code keeps one (the call stub). */
	rule = UNWIND_NONE;
	/* (The constants first: where no runtime's walker is loaded, the
	 * verifier has none of this to check, which a field alone would not
	 * tell it.) */
	if (runtimes_on && java_on && u->java) {
		/* c: another task's walk (its stack copied), a constant in
		 * the current task's (NULL), so that each keeps one. */
		switch (c ? java_step(u, ips, idx, i == u->exact_at, c, pr, task)
			  : java_step_of_current(idx, i == u->exact_at)) {
		case JAVA_NEXT:
			return 0;
		case JAVA_END:
			return 1;
		case JAVA_BY_FP:
			u->in_gap = false;
			goto by_fp;
		default:
			break;
		}
	}
	/* A return address is looked up at the call before it. */
	if (files)
		rule = file_rule(i == u->exact_at ? u->pc : u->pc - 1, files, c != NULL);
	else
		rule = unwind_rule(i == u->exact_at ? u->pc : u->pc - 1, u->map_start,
				   u->map_count);
	if (RULE_KIND(rule) != UNWIND_NONE) {
		switch (RULE_KIND(rule)) {
		case UNWIND_UNKNOWN:
			if (files)
				files->needs_tables = 1;
			u->truncated = true;
			u->unprovable = true;
			return 1;
		case UNWIND_END:
			return 1;
		case UNWIND_SIGNAL:
			/* The handler returned here: rsp points at the struct
			 * ucontext, whose registers are the interrupted code's.
			 * It is a frame of its own, and the next one is the
			 * interrupted pc (looked up as it is).  With SA_ONSTACK
			 * the interrupted code's frames are on another stack:
			 * their reads leave the copy of the stack (read_user),
			 * and note_slot() marks the walk unprovable where they
			 * are below the starting sp or far above it. */
			bp_at = u->sp + UCONTEXT_RBP;
			ra_at = u->sp + UCONTEXT_RIP;
			if (read_user(&bp_val, sizeof(bp_val), (void *)bp_at, task, c) ||
			    read_user(frame, sizeof(frame), (void *)(u->sp + UCONTEXT_RSP), task, c)) {
				u->truncated = true;
				u->unprovable = true;
				return 1;
			}
			note_slot(pr, u, u->sp + UCONTEXT_RSP, frame[0]);
			ips[idx & MAX_STACK_DEPTH] = UNWIND_SIGNAL_FRAME;
			/* The interrupted frame's rax is not read: it could
			 * only matter in clone's few instructions. */
			u->ax_unknown = true;
			/* i + 1, read back: kept in a register it would be
			 * spilled (see unwind_state). */
			u->exact_at = u->nr;
			u->bp = bp_val;
			u->bp_restored = true;
			u->sp = frame[0];
			ra = frame[1];
			goto noted;
		case UNWIND_CLONE:
			/* A return address is never there, and rax is known
			 * only at the first frame.  The cache does not check
			 * rax: the walk is not kept. */
			u->unprovable = true;
			if (i != 0 || u->ax_unknown) {
				u->truncated = true;
				return 1;
			}
			if (u->ax_zero)
				return 1;
			cfa = u->sp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_CFA_RSP:
			cfa = u->sp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_CFA_RBP:
			if (!u->bp_restored)
				u->bp_used = true;
			cfa = u->bp + RULE_CFA_OFF(rule);
			break;
		case UNWIND_PLT:
			cfa = u->sp + 8 + ((u->pc & 15) >= 11 ? 8 : 0);
			break;
		default:
			u->truncated = true;
			return 1;
		}
		rbp_off = RULE_RBP_OFF(rule);
		if (read_user(&ra, sizeof(ra), (void *)(cfa - 8), task, c)) {
			u->truncated = true;
			u->unprovable = true;
			return 1;
		}
		ra_at = cfa - 8;
		if (rbp_off) {
			bp_at = cfa + rbp_off * 8;
			if (read_user(&u->bp, sizeof(u->bp), (void *)bp_at, task, c)) {
				u->truncated = true;
				u->unprovable = true;
				return 1;
			}
			bp_val = u->bp;
			u->bp_restored = true;
		}
		u->sp = cfa;
	} else {
		/* In the state, not a register: it would be kept on the
		 * stack across the reads and calls below (see unwind_state). */
		u->in_gap = !!(rule & RULE_GAP);
		/* V8's code in a Node.js process (v8.h): its frames as V8
		 * lays them out, a JavaScript frame named by its function.
		 * Not where the thread stopped: the frame may not be set up
		 * there. */
		if (runtimes_on && v8_on && u->v8 && i != u->exact_at) {
			/* The frame's index as `i`, not idx: the compiler would
			 * keep idx on the stack across the calls before. */
			switch (c ? v8_step(u, ips, idx, c, pr, task) : v8_step_of_current(i)) {
			case V8_NEXT:
				return 0;
			case V8_END:
				return 1;
			default:
				break;
			}
		}
by_fp:
		/* No call-frame information for this address: the saved
		 * frame pointer and return address at bp.  A chain that ends
		 * (bp is 0 in _start and thread entry points) or cannot be
		 * read is the end of the stack. */
		if (!u->bp_restored)
			u->bp_used = true;
		if (!u->bp)
			return 1;
		if (read_user(frame, sizeof(frame), (void *)u->bp, task, c)) {
			u->unprovable = true;
			return 1;
		}
		bp_at = u->bp;
		bp_val = frame[0];
		ra_at = u->bp + 8;
		u->bp_restored = true;
		ra = frame[1];
		u->sp = u->bp + 16;
		u->bp = frame[0];
		u->fp_frames++;
		if (u->in_gap)
			u->gap_frames++;
	}
	/* What the walk read, for the cache: one place, so that the
	 * verifier checks the recording once, not in each path. */
noted:
	note_slot(pr, u, ra_at, ra);
	if (bp_at)
		note_slot(pr, u, bp_at, bp_val);
	if (!ra)
		return 1;
	u->pc = ra;
	return 0;
}

/*
 * A frame of the walk of the current task's user stack, whose state is in
 * file_scratch (`st`): through its process's tables, or through the
 * tables of the files it maps (`files`).  A global function, so that the
 * verifier checks the step once, on its own, not again for each state
 * its bpf_loop callback is entered with.
 */
__noinline long unwind_step_of_current(__u32 i, bool files)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&scratch, &zero);
	struct file_scratch *s = bpf_map_lookup_elem(&file_scratch, &zero);
	struct ucache_walk *pr = ucache_on ? bpf_map_lookup_elem(&ucache_scratch, &zero) : NULL;

	if (!ips || !s)
		return 1;
	return unwind_step(i, &s->st, ips, NULL, pr, files ? s : NULL, NULL);
}

/* The callbacks of those walks (a callback's answer must be known to be
 * 0 or 1). */
static long unwind_step_current(__u32 i, void *arg)
{
	return unwind_step_of_current(i, false) ? 1 : 0;
}

static long unwind_step_files(__u32 i, void *arg)
{
	return unwind_step_of_current(i, true) ? 1 : 0;
}

/* The bpf_loop context of a walk of another task's stack: the task, a
 * pointer the verifier trusts, on the stack, which the steps do not
 * write.  The walk's state is in start_file_scratch (remote_state()):
 * kept on the caller's stack, each step's writes to it made the verifier
 * check the callback again for each state they left (a third of the
 * start iterator's verification). */
struct task_walk {
	struct task_struct *task;
};

static __always_inline long unwind_step_remote(__u32 i, struct task_walk *t, bool files)
{
	__u32 zero = 0;
	__u64 *ips = bpf_map_lookup_elem(&start_scratch, &zero);
	struct stack_copy *c = bpf_map_lookup_elem(&start_stack, &zero);
	struct file_scratch *s = file_scratch_of(true);

	if (!ips || !c || !s)
		return 1;
	return unwind_step(i, &s->st, ips, c, NULL, files ? s : NULL, t->task);
}

static long unwind_step_task(__u32 i, void *arg)
{
	return unwind_step_remote(i, arg, false);
}

static long unwind_step_task_files(__u32 i, void *arg)
{
	return unwind_step_remote(i, arg, true);
}

/* The state of a walk of another task's stack, zeroed, where its steps
 * find it (see struct task_walk); NULL where the map cannot be had. */
static __always_inline struct unwind_state *remote_state(void)
{
	struct file_scratch *s = file_scratch_of(true);

	if (!s)
		return NULL;
	__builtin_memset(&s->st, 0, sizeof(s->st));
	return &s->st;
}

/* Copies the stack of `task` from u's stack pointer: as much of
 * STACK_COPY_BYTES as can be read (at least the rest of its page, which
 * holds the stack pointer). */
static __always_inline void copy_stack(struct unwind_state *u, struct task_struct *task)
{
	__u32 zero = 0, n;
	struct stack_copy *c = bpf_map_lookup_elem(&start_stack, &zero);

	if (!c)
		return;
	c->base = u->sp;
	c->len = 0;
	if (!bpf_copy_from_user_task(c->bytes, STACK_COPY_BYTES, (void *)u->sp, task, 0)) {
		c->len = STACK_COPY_BYTES;
		return;
	}
	n = 4096 - (u->sp & 4095);
	if (n > STACK_COPY_BYTES)
		return;
	if (!bpf_copy_from_user_task(c->bytes, n, (void *)u->sp, task, 0))
		c->len = n;
}

/*
 * Walks the stack from u's registers into `scratch` (`start_scratch` for
 * another task, `task`; NULL: the current one), through the tables of u's
 * mappings if it has any, else through frame pointers.  u is where the
 * steps find it: the current task's in file_scratch, another's from
 * remote_state().  Returns the number of frames.
 */
static __always_inline __u32 walk_user(struct unwind_state *u, struct task_struct *task)
{
	struct task_walk t = { .task = task };
	bool remote = task != NULL;
	__u64 *ips;
	__u32 zero = 0, idx;

	u->max = clamp_stack_bytes() / sizeof(__u64);
	u->tgid = remote ? BPF_CORE_READ(task, tgid) : bpf_get_current_pid_tgid() >> 32;
	u->java = java_walkable(u->tgid, task);
	u->v8 = !u->java && (task ? v8_walkable(u->tgid, task) : v8_walkable_of_current(u->tgid));
	if (remote) {
		copy_stack(u, task);
		bpf_loop(MAX_STACK_DEPTH, unwind_step_task, &t, 0);
	} else
		bpf_loop(MAX_STACK_DEPTH, unwind_step_current, NULL, 0);
	/* Frames end at a zero, as bpf_get_stack() leaves them: the buffer
	 * still holds deeper stacks walked before. */
	if (u->nr < MAX_STACK_DEPTH) {
		ips = bpf_map_lookup_elem(remote ? (void *)&start_scratch : (void *)&scratch, &zero);
		idx = u->nr;
		asm volatile("" : "+r"(idx));
		if (ips)
			ips[idx & MAX_STACK_DEPTH] = 0;
	}
	return u->nr;
}

/*
 * A field of task `t`: loaded directly where `t` is a pointer the verifier
 * lets a program dereference (`trusted`: the arguments of tp_btf, the
 * current task, an iterator's task), else read with bpf_probe_read_kernel
 * (raw_tp and kprobe arguments are plain numbers).  The load is one
 * instruction the JIT guards; the helper is a call and several returns,
 * each expensive where returns are made safe against speculation (AMD's
 * spec_rstack_overflow).  `trusted` is a constant at every call, so the
 * other branch is not compiled.  Only for fields of the task itself: the
 * verifier checks every direct load against the type's members, and loads
 * through a pointer walked from the task (group_leader, mm) tripled the
 * switch hook's verification time, for little.
 */
#define TASK_READ(trusted, t, field) ((trusted) ? (t)->field : BPF_CORE_READ(t, field))

/*
 * `t`, a task the program may load through (see TASK_READ), as a pointer
 * the verifier no longer trusts (bpf_rdonly_cast(), 6.2 on; else `t`
 * itself), to walk from it to another object (group_leader, mm): the loads
 * are the same, guarded the same way, but the verifier does not look up
 * whether the pointer loaded is one it trusts (6.4 on: up to four linear
 * searches of the kernel's BTF, some 100k types, at each load it checks,
 * a fourth of the switch hook's verification on 6.18).  The cast costs
 * nothing: the verifier turns the call into a move.
 */
static __always_inline struct task_struct *task_to_walk(struct task_struct *t)
{
	if (!bpf_ksym_exists(bpf_rdonly_cast) || !task_struct_kernel_id)
		return t;
	return bpf_rdonly_cast(t, task_struct_kernel_id);
}

/*
 * Whether `task`'s user registers are not those of its address space.  A
 * thread inside an exec (task_struct's in_execve) keeps the registers of
 * the image being replaced until the new image's are set, at the exec's
 * end, while its address space is the new one from the exec's point of no
 * return on (exec_mmap(), which frees the old one: where a busy CPU
 * preempts it).  The new address space's start_code is 0 until the new
 * image is loaded, just before its registers are set.  A walk from the old
 * registers over the new memory would read another stack and name the old
 * pc with the new mappings: such a stack is not taken (counted where it is
 * given up: stack_of_current_in(), user_stack_of_task()).  Before the point
 * of no return (the binary read, the other threads waited for, a vfork
 * parent woken) registers and memory are both the old image's, and are
 * walked.  task_regs_stale() loads through a pointer the verifier knows,
 * task_regs_stale_read() reads through any other.
 */
struct task_struct___exec {
	unsigned int in_execve : 1;
} __attribute__((preserve_access_index));

#define TASK_REGS_STALE(t, read_bit, start_code)                                   \
	(bpf_core_field_exists(((struct task_struct___exec *)(t))->in_execve) &&   \
	 read_bit((struct task_struct___exec *)(t), in_execve) && !(start_code))

static __always_inline bool task_regs_stale(struct task_struct *task)
{
	return TASK_REGS_STALE(task, BPF_CORE_READ_BITFIELD, task_to_walk(task)->mm->start_code);
}

/* A function of its own: its reads' room on the stack is not added to the
 * deepest chains of the hooks that call it (src/tracer/stack_depth.rs). */
static __noinline int task_regs_stale_read(struct task_struct *task)
{
	return TASK_REGS_STALE(task, BPF_CORE_READ_BITFIELD_PROBED,
			       BPF_CORE_READ(task, mm, start_code));
}

/* Where `task` entered the kernel from user space: its pc, sp and bp
 * (read at the fixed offsets of struct pt_regs, see vmlinux.h); -1 where
 * they cannot be read, or are not of its address space (an exec's, see
 * task_regs_stale()). */
static __always_inline int read_user_regs(struct task_struct *task, struct unwind_state *u)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);

	if (!regs)
		return -1;
	if (task_regs_stale(task))
		return -1;
	/* Loaded directly: bpf_task_pt_regs() gives a pointer the verifier
	 * lets a program dereference (see TASK_READ). */
	u->pc = regs->ip;
	u->sp = regs->sp;
	u->bp = regs->bp;
	u->ax_zero = !regs->ax;
	/* A load that faults reads 0, where the helper failed: no user code
	 * runs at 0, and the walk is then not made (counted as a missed
	 * stack, as before). */
	return u->pc && u->sp ? 0 : -1;
}

/* The address space of `task` and the size of its executable mappings
 * (0, 0 for a task without one).  `trusted`: `task` is a pointer the
 * verifier lets a program load through (see TASK_READ): the size is
 * loaded, not read with a helper's call (some 40 ns a switch).  The
 * address space itself is read: loaded, it would be a pointer to the
 * verifier, not a number to compare and keep. */
static __always_inline __u64 task_address_space(struct task_struct *task, __u64 *exec_vm,
						bool trusted)
{
	struct mm_struct *mm = BPF_CORE_READ(task, mm);

	*exec_vm = !mm ? 0 : trusted ? task_to_walk(task)->mm->exec_vm : BPF_CORE_READ(mm, exec_vm);
	return (__u64)mm;
}

/* When the process of `t` started (see process_start()). */
static __always_inline __u64 task_process_start(struct task_struct *t, bool trusted)
{
	return trusted ? task_to_walk(t)->group_leader->start_boottime
		       : BPF_CORE_READ(t, group_leader, start_boottime);
}

static __always_inline __u64 address_space(struct task_struct *task, __u64 *exec_vm)
{
	return task_address_space(task, exec_vm, false);
}

/* The unwind tables of process `tgid` if they are ready for its address
 * space `mm` with executable mappings of `exec_vm` pages, else NULL.  The
 * tables describe the mappings they were built for: the first unwind
 * claims them where userspace could not say whose they are (if it is of
 * the image they were read from), and an exec(),
 * a library mapped or unmapped, or a reused pid since makes them stale
 * until userspace has built new ones. */
static __always_inline struct unwind_proc *tables_of(__u32 tgid, __u64 mm, __u64 exec_vm)
{
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);

	if (p && mm && !p->mm) {
		struct mm_struct *m = (struct mm_struct *)mm;

		/* Of another image than the mappings read (see start_code). */
		if (p->start_code && (BPF_CORE_READ(m, start_code) != p->start_code ||
				      BPF_CORE_READ(m, start_stack) != p->start_stack))
			return NULL;
		p->exec_vm = exec_vm;
		p->mm = mm;
	}
	if (p && mm && p->mm == mm && p->exec_vm == exec_vm)
		return p;
	return NULL;
}

/* Walks from u's registers with the tables `p`, and counts the walk (see
 * walk_user()). */
static __always_inline void walk_with_tables(struct unwind_state *u, struct unwind_proc *p,
					     struct task_struct *task)
{
	u->map_start = p->map_start;
	u->map_count = p->map_count;
	if (u->map_count > UNWIND_MAX_PROC_MAPPINGS)
		u->map_count = UNWIND_MAX_PROC_MAPPINGS;
	walk_user(u, task);
	count(CNT_UNWIND_DWARF);
	COUNT_WALK(u);
}

/*
 * Walks the user stack of another task, `task`, from the user registers
 * saved at its kernel entry, with the DWARF tables of its process, or with
 * frame pointers where it has none (yet): the caller could not walk it
 * (the verifier checks each walk called).  Returns its length in bytes, or
 * -1 where the registers cannot be read.
 */
static __always_inline long unwind_task(struct task_struct *task, __u32 tgid)
{
	struct unwind_state *u = remote_state();
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	struct unwind_proc *p = tables_of(tgid, mm, exec_vm);

	if (!u || read_user_regs(task, u))
		return -1;
	if (p) {
		walk_with_tables(u, p, task);
	} else {
		count(CNT_UNWIND_NOT_READY);
		walk_user(u, task);
	}
	return u->nr * sizeof(__u64);
}

#endif /* __OFFCPUTIME_DWARF_H__ */
