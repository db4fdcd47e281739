/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Kernel stacks of tasks that are not running, whole.
 *
 * bpf_get_task_stack() walks a sleeping task's stack as the kernel's
 * stack_trace_save_tsk() does, which leaves out every frame in .sched.text
 * and .spinlock.text: __schedule, schedule, schedule_timeout,
 * do_nanosleep, io_schedule, __mutex_lock, ...  So a block under way at
 * the start, one under way at the end (for the kprobe, which takes stacks
 * at the switch-in) and a --snapshot would show shorter stacks than a
 * switch-out does.
 *
 * Here the stack is walked with the kernel's own ORC tables, read in
 * kernel memory (`__start_orc_unwind_ip`, `__start_orc_unwind`: from
 * kallsyms), from the task's saved frame (`thread.sp`, a struct
 * inactive_task_frame) as the kernel's unwinder starts a task that is not
 * running.  The walk follows the core kernel's text, and that of the
 * modules loaded at the start with their own tables (struct module's
 * arch.orc_unwind_ip, see korc_module_search).  At the first frame it does
 * not follow (a module loaded since, a BPF program's, a trampoline's, or
 * where the tables say something it does not handle), it stops, and the
 * rest of the stack is the kernel's own walk from that frame on: the
 * helper reports every frame from there that the walk would, since only
 * scheduler and lock frames are left out, and those are in the core
 * kernel.  Where that frame is not in the helper's stack, the helper's
 * stack is used alone and counted (CNT_KSTACK_NO_SCHED).
 *
 * With test_kstack_check, each whole stack is kept beside the helper's
 * for the same task, for userspace to compare (scheduler and lock frames
 * left out, they must be the same).
 */
#ifndef __OFFCPUTIME_KSTACK_H__
#define __OFFCPUTIME_KSTACK_H__

/* Set by userspace from kallsyms; kstack_orc false where anything is
 * missing. */
const volatile bool kstack_orc = false;
const volatile __u64 orc_ip_table = 0;
const volatile __u64 orc_entry_table = 0;
const volatile __u32 orc_entries = 0;
const volatile __u64 core_text_start = 0;
const volatile __u64 core_text_end = 0;
const volatile __u64 sched_text_start = 0;
const volatile __u64 sched_text_end = 0;
const volatile __u64 lock_text_start = 0;
const volatile __u64 lock_text_end = 0;
const volatile __u64 ret_from_fork_at = 0;
const volatile __u64 ret_from_fork_asm_at = 0;
/* Where a return address is replaced by a trampoline (function-graph
 * tracing, kretprobes): the walk stops there. */
const volatile __u64 ret_trampoline_a = 0;
const volatile __u64 ret_trampoline_b = 0;

/* The modules loaded at the start (from /proc/modules and kallsyms), by
 * the address of their text, ascending: where their text begins, and
 * their struct module (`__this_module`). */
#define KORC_MODULES 256
const volatile __u32 korc_modules = 0;
const volatile __u64 korc_module_text[KORC_MODULES] = {};
const volatile __u64 korc_module_at[KORC_MODULES] = {};

/* A task's kernel stack (THREAD_SIZE on x86-64 without KASAN). */
#define KSTACK_SIZE 16384
/* Kernel addresses start here (x86-64). */
#define KERNEL_SPACE 0xffff800000000000ULL

/* The kernel's struct orc_entry, 6 bytes: since 6.4 a 3-bit type and a
 * signal bit; before, a 2-bit type and an end bit (the numbering of the
 * types changed with them). */
struct orc_entry___new {
	short sp_offset;
	short bp_offset;
	unsigned int sp_reg : 4;
	unsigned int bp_reg : 4;
	unsigned int type : 3;
	unsigned int signal : 1;
} __attribute__((packed)) __attribute__((preserve_access_index));

struct orc_entry___old {
	short sp_offset;
	short bp_offset;
	unsigned int sp_reg : 4;
	unsigned int bp_reg : 4;
	unsigned int type : 2;
	unsigned int end : 1;
} __attribute__((packed)) __attribute__((preserve_access_index));

/* struct module: its text (6.4 on: mem[MOD_TEXT]; before: core_layout),
 * whether it is live, and its own ORC tables. */
struct module_memory___x {
	void *base;
	unsigned int size;
} __attribute__((preserve_access_index));

struct module_layout___x {
	void *base;
	unsigned int size;
	unsigned int text_size;
} __attribute__((preserve_access_index));

struct mod_arch_specific___x {
	unsigned int num_orcs;
	int *orc_unwind_ip;
	void *orc_unwind;
} __attribute__((preserve_access_index));

enum module_state___x { MODULE_STATE_LIVE___x = 0 };

struct module___new {
	enum module_state___x state;
	struct module_memory___x mem[1];
	struct mod_arch_specific___x arch;
} __attribute__((preserve_access_index));

struct module___old {
	enum module_state___x state;
	struct module_layout___x core_layout;
	struct mod_arch_specific___x arch;
} __attribute__((preserve_access_index));

struct inactive_task_frame___x {
	unsigned long bp;
	unsigned long ret_addr;
} __attribute__((preserve_access_index));

/* The registers ORC names (arch/x86/include/asm/orc_types.h). */
#define ORC_REG_UNDEFINED 0
#define ORC_REG_PREV_SP 1
#define ORC_REG_BP 4
#define ORC_REG_SP 5
#define ORC_REG_BP_INDIRECT 8

/* An entry, its type in one numbering. */
enum korc_type { KORC_UNDEFINED, KORC_END, KORC_CALL, KORC_REGS, KORC_REGS_PARTIAL };

struct korc_entry {
	__s16 sp_offset;
	__s16 bp_offset;
	__u8 sp_reg;
	__u8 bp_reg;
	__u8 type;
	__u8 signal;
};

enum korc_done {
	KORC_WALKING,
	/* The stack's end: user-mode registers, or the end of a kernel
	 * thread's stack. */
	KORC_COMPLETE,
	/* Stopped at stop_ip, to be taken up by the helper's stack. */
	KORC_SPLICE,
};

/*
 * The proof of a walk (see struct korc_kept): every word it read, where it
 * found it and what it held.  The kernel moves the stack of each system
 * call down by a random offset (below do_syscall_64's frame), and its frame
 * pointers point where they will, so a place is kept as it was found: an
 * offset from a base, the saved frame or a word read before (a frame
 * pointer, saved registers' sp), each a `sym` (KORC_SYM).  Checked again
 * from a new saved frame, the places follow the words read; the walk is the
 * same where each return address holds what it held (bit i of `need`),
 * every place is in the window, and the sps it went up by (`sp`, `m` of
 * them) are still in order on the stack.  A power of two, at most 32 (the
 * bits of `need`).
 */
/* KORC_PROOF: in maps.h, with the proofs a thread keeps. */
/* Its shape (struct korc_shape, in maps.h): `need`, the words that held a
 * return address; `user`, the words that held a user-mode ip, where the
 * walk ended (what matters is only that they still do). */
struct korc_proof {
	struct korc_shape s;
	__u64 val[KORC_PROOF];
};

/* A place or a value in a proof: an offset (24 bits, signed) from the
 * saved frame, or from the word read at index `base` (the top 8 bits) of
 * the proof; KORC_UNKNOWN: neither (the walk cannot be proved). */
#define KORC_FRAME 0xff
/* korc_proof_holds()'s words and frame: KORC_FRAME's slot past the words'. */
#define KORC_VALS 64
#define KORC_UNKNOWN 0xfe
#define KORC_SYM(base, off) (((__u32)(base) << 24) | ((__u32)(off) & 0xffffff))
#define KORC_SYM_BASE(sym) ((sym) >> 24)
#define KORC_SYM_OFF(sym) ((__s32)((sym) << 8) >> 8)

static __always_inline __u32 korc_sym_add(__u32 sym, __s64 d)
{
	__s64 off = KORC_SYM_OFF(sym) + d;

	if (off < -0x800000 || off > 0x7fffff)
		return KORC_SYM(KORC_UNKNOWN, 0);
	return KORC_SYM(KORC_SYM_BASE(sym), off);
}

struct korc_walk {
	__u64 ip, sp, bp, regs, prev_regs, stack_lo;
	__u64 stop_ip;
	__u32 nr, max;
	/* orc_entries, read from here: a number the verifier does not know,
	 * so that it does not follow the search through each value. */
	__u32 entries;
	/* korc_finish: where the helper's stack takes over. */
	__u32 at;
	/* The stack from the saved frame up, as read in one go at the start
	 * (win): where it starts, and its length. */
	__u64 win_lo;
	__u32 win_len;
	__u8 signal, full_regs, done, _pad;
	/* Whether the walk can be proved again (struct korc_proof), and
	 * what its sp, bp, regs and prev_regs are in its proof (KORC_SYM). */
	__u8 provable;
	__u32 sp_sym, bp_sym, regs_sym, prev_regs_sym;
	struct korc_proof proof;
	/* korc_proof_holds(): the words read again, and the frame; the key
	 * of the proof's shape, copied here (6.1's verifier takes a map's
	 * key from the stack or a map, not from a global function's
	 * argument). */
	__u64 proof_val[KORC_VALS];
	__u64 shape_key;
	/* The walk's frames, then the stack made of them and the helper's. */
	__u64 ips[MAX_STACK_DEPTH + 1];
	/* korc_module_search: the entry found, and what it read of the
	 * module (here, not on the stack: the iterators' chain of calls to
	 * korc_step is at 6.1's bound of 512 bytes). */
	struct korc_entry found;
	/* The frame `found` is for (0: none). */
	__u64 found_for;
	__u64 mod_text, mod_ip_table, mod_entry_table;
	__u32 mod_size, mod_n;
	__s32 mod_state;
	/* The stack from the saved frame up, read in one go: the walk reads
	 * its words here, not one kernel read each. */
	__u8 win[KSTACK_SIZE];
};

/* Who walks: the iterators (and --snapshot), or the switch hook, which may
 * run on the same CPU while an iterator is preempted in the middle of a
 * walk; each has its own state, frames and window. */
#define KORC_ITER 0
#define KORC_SWITCH 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct korc_walk);
} korc_state SEC(".maps");

/* The entries found for the addresses walked through (a search of the
 * kernel's table reads about 20 of its words): the core kernel's tables do
 * not change.  Full, it takes no more. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct korc_entry);
} korc_entries SEC(".maps");

/* Whether this kernel's struct orc_entry is one of the two layouts known
 * (see korc_decode); -1 where neither. */
static __always_inline int korc_layout(void)
{
	bool has_end = bpf_core_field_exists(struct orc_entry___old, end);
	bool has_signal = bpf_core_field_exists(struct orc_entry___new, signal);

	if (has_signal && !has_end)
		return 0;
	if (has_end && !has_signal)
		return 1;
	return -1;
}

/* The index past the last address at most `ip` in a table of `entries`
 * addresses at `ip_table`, each held as an offset from its own slot: a
 * binary search, 0 where `ip` is below the first, -1 where the table
 * cannot be read. */
static __always_inline long korc_bsearch(__u64 ip, __u32 entries, __u64 ip_table)
{
	__u32 lo = 0, hi = entries, mid;
	__u64 at;
	__s32 off;
	int k;

	for (k = 0; k < 26 && lo < hi; k++) {
		mid = lo + (hi - lo) / 2;
		at = ip_table + (__u64)mid * 4;
		if (bpf_probe_read_kernel(&off, sizeof(off), (void *)at))
			return -1;
		if (at + (__s64)off <= ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo != hi)
		return -1;
	return lo;
}

/* korc_bsearch() in a global function: the verifier checks the search
 * once, not once for each way the walk's step reaches it. */
__noinline long korc_search(__u64 ip, __u32 entries, __u64 ip_table)
{
	return korc_bsearch(ip, entries, ip_table);
}

/* The entry covering `ip` in a table of `entries` (addresses at
 * `ip_table`, entries at `entry_table`): the last whose address is at most
 * `ip`.  `own_search`: the search inline, not korc_search() (a module's
 * lookup, at the end of a chain of calls whose frames are at the
 * verifier's bound of 512 bytes before 6.13). */
static __always_inline int korc_find(__u64 ip, struct korc_entry *e, __u32 entries,
				     __u64 ip_table, __u64 entry_table, const bool own_search)
{
	long lo = own_search ? korc_bsearch(ip, entries, ip_table)
			     : korc_search(ip, entries, ip_table);
	__u8 raw[16] = {};

	if (lo <= 0)
		return -1;
	if (bpf_probe_read_kernel(raw, 6, (void *)(entry_table + (__u64)(lo - 1) * 6)))
		return -1;
	e->sp_offset = *(__s16 *)&raw[0];
	e->bp_offset = *(__s16 *)&raw[2];
	/* The layout is known at load time (CO-RE): the other branch, whose
	 * relocations fail, is left out by the verifier. */
	if (korc_layout() == 1) {
		struct orc_entry___old *o = (void *)raw;
		__u32 type = BPF_CORE_READ_BITFIELD(o, type);

		e->sp_reg = BPF_CORE_READ_BITFIELD(o, sp_reg);
		e->bp_reg = BPF_CORE_READ_BITFIELD(o, bp_reg);
		e->signal = 0;
		if (e->sp_reg == ORC_REG_UNDEFINED)
			e->type = BPF_CORE_READ_BITFIELD(o, end) ? KORC_END : KORC_UNDEFINED;
		else if (type == 0)
			e->type = KORC_CALL;
		else if (type == 1)
			e->type = KORC_REGS;
		else if (type == 2)
			e->type = KORC_REGS_PARTIAL;
		else
			e->type = KORC_UNDEFINED;
	} else {
		struct orc_entry___new *n = (void *)raw;
		__u32 type = BPF_CORE_READ_BITFIELD(n, type);

		e->sp_reg = BPF_CORE_READ_BITFIELD(n, sp_reg);
		e->bp_reg = BPF_CORE_READ_BITFIELD(n, bp_reg);
		e->signal = BPF_CORE_READ_BITFIELD(n, signal);
		e->type = type <= 4 ? type : KORC_UNDEFINED;
	}
	return 0;
}

/* Notes a word the walk read, at `addr`, found at `sym`, in its proof
 * (`need`: a return address); its own sym, to find places from. */
static __always_inline __u32 korc_note(struct korc_walk *w, __u32 sym, __u64 v, bool need)
{
	__u32 i = w->proof.s.n;

	if (i >= KORC_PROOF || KORC_SYM_BASE(sym) == KORC_UNKNOWN) {
		w->provable = 0;
		return KORC_SYM(KORC_UNKNOWN, 0);
	}
	i &= KORC_PROOF - 1;
	w->proof.s.at[i] = sym;
	w->proof.val[i] = v;
	if (need)
		w->proof.s.need |= 1U << i;
	w->proof.s.n = i + 1;
	return KORC_SYM(i, 0);
}

/* The word at `addr`: from the window where it is in it, else read (and
 * the walk cannot be proved again).  `*sym`: the place (see struct
 * korc_proof), then the word's own. */
static __always_inline bool korc_read(struct korc_walk *w, __u8 *win, __u64 *v, __u64 addr,
				      __u32 *sym, bool need)
{
	__u64 off = addr - w->win_lo;

	if (addr >= w->win_lo && off + 8 <= w->win_len && !(off & 7)) {
		*v = *(__u64 *)(win + (off & (KSTACK_SIZE - 8)));
		*sym = korc_note(w, *sym, *v, need);
		return true;
	}
	w->provable = 0;
	*sym = KORC_SYM(KORC_UNKNOWN, 0);
	return bpf_probe_read_kernel(v, sizeof(*v), (void *)addr) == 0;
}

/* The entry for `ip` (the address looked up), from korc_entries or the
 * kernel's table. */
static __always_inline int korc_entry_of(struct korc_walk *w, __u64 ip, struct korc_entry *e)
{
	struct korc_entry *known;

	known = bpf_map_lookup_elem(&korc_entries, &ip);
	if (known) {
		*e = *known;
		return 0;
	}
	if (korc_find(ip, e, w->entries, orc_ip_table, orc_entry_table, false))
		return -1;
	bpf_map_update_elem(&korc_entries, &ip, e, BPF_NOEXIST);
	return 0;
}

/*
 * The entry for `ip` (the address looked up) in the tables of the module
 * loaded at the start whose text holds it, into the `found` of state `k`:
 * 0, or -1 where no such module is live with the text it had at the start
 * (unloaded since: its struct module is read again at each look, and must
 * still say the same text and that it is live).  A global function called
 * by korc_walk, between two steps, not by korc_step: one more call in the
 * chain would pass 6.1's bound of 512 bytes of stack for the iterators.
 */
__noinline int korc_module_search(__u64 ip, __u32 k)
{
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	__u32 lo = 0, hi = korc_modules, mid, i;
	int j;

	/* (A kernel without ORC tables has no such fields: their reads are
	 * left out.) */
	if (!w || hi > KORC_MODULES ||
	    !bpf_core_field_exists(struct mod_arch_specific___x, num_orcs))
		return -1;
	for (j = 0; j < 10 && lo < hi; j++) {
		mid = lo + (hi - lo) / 2;
		if (korc_module_text[mid & (KORC_MODULES - 1)] <= ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo != hi || lo == 0)
		return -1;
	i = (lo - 1) & (KORC_MODULES - 1);
	w->mod_text = 0;
	if (bpf_core_field_exists(struct module___new, mem)) {
		struct module___new *m = (void *)korc_module_at[i];

		if (BPF_CORE_READ_INTO(&w->mod_state, m, state) ||
		    BPF_CORE_READ_INTO(&w->mod_text, m, mem[0].base) ||
		    BPF_CORE_READ_INTO(&w->mod_size, m, mem[0].size) ||
		    BPF_CORE_READ_INTO(&w->mod_n, m, arch.num_orcs) ||
		    BPF_CORE_READ_INTO(&w->mod_ip_table, m, arch.orc_unwind_ip) ||
		    BPF_CORE_READ_INTO(&w->mod_entry_table, m, arch.orc_unwind))
			return -1;
	} else {
		struct module___old *m = (void *)korc_module_at[i];

		if (BPF_CORE_READ_INTO(&w->mod_state, m, state) ||
		    BPF_CORE_READ_INTO(&w->mod_text, m, core_layout.base) ||
		    BPF_CORE_READ_INTO(&w->mod_size, m, core_layout.text_size) ||
		    BPF_CORE_READ_INTO(&w->mod_n, m, arch.num_orcs) ||
		    BPF_CORE_READ_INTO(&w->mod_ip_table, m, arch.orc_unwind_ip) ||
		    BPF_CORE_READ_INTO(&w->mod_entry_table, m, arch.orc_unwind))
			return -1;
	}
	if (w->mod_state != MODULE_STATE_LIVE___x || w->mod_text != korc_module_text[i] ||
	    ip >= w->mod_text + w->mod_size || !w->mod_n || !w->mod_ip_table ||
	    !w->mod_entry_table)
		return -1;
	return korc_find(ip, &w->found, w->mod_n, w->mod_ip_table, w->mod_entry_table, true);
}

/* The frame's CFA, from its ORC entry `e`: false where the walk cannot
 * find it (SP_INDIRECT, whose meaning changed in 6.x, and the registers of
 * an interrupted context are left to the helper). */
static __always_inline bool korc_cfa(struct korc_walk *w, __u8 *win, struct korc_entry *e,
				     __u64 *cfa, __u32 *sym)
{
	switch (e->sp_reg) {
	case ORC_REG_SP:
		*cfa = w->sp + e->sp_offset;
		*sym = korc_sym_add(w->sp_sym, e->sp_offset);
		return true;
	case ORC_REG_BP:
		*cfa = w->bp + e->sp_offset;
		*sym = korc_sym_add(w->bp_sym, e->sp_offset);
		return true;
	case ORC_REG_BP_INDIRECT:
		*sym = korc_sym_add(w->bp_sym, e->sp_offset);
		return korc_read(w, win, cfa, w->bp + e->sp_offset, sym, false);
	default:
		return false;
	}
}

/* The caller's ip and sp, from the frame's CFA (`sym` in the proof), by
 * the kind of frame: a call, a full register frame (an exception's, a
 * system call's) or the hardware's partial one (an interrupt's); `regs`
 * becomes where the registers of an interrupted context are, or 0.  `old`:
 * the entries before 6.4's signal bit.  The syms of sp and regs in
 * `sp_sym`, `regs_sym`. */
static __always_inline bool korc_caller(struct korc_walk *w, __u8 *win, struct korc_entry *e,
					__u64 cfa, __u32 sym, bool old, __u64 *new_ip,
					__u64 *new_sp, __u64 *regs, __u32 *sp_sym, __u32 *regs_sym,
					__u32 *ip_sym_out)
{
	__u32 ip_sym = 0;

	*ip_sym_out = KORC_SYM(KORC_UNKNOWN, 0);
	switch (e->type) {
	case KORC_CALL:
		ip_sym = korc_sym_add(sym, -8);
		if (!korc_read(w, win, new_ip, cfa - 8, &ip_sym, true))
			return false;
		*ip_sym_out = ip_sym;
		*new_sp = cfa;
		*sp_sym = sym;
		*regs = 0;
		w->prev_regs = 0;
		if (old)
			w->signal = 0;
		return true;
	case KORC_REGS:
		ip_sym = korc_sym_add(sym, bpf_core_field_offset(struct pt_regs, ip));
		*sp_sym = korc_sym_add(sym, bpf_core_field_offset(struct pt_regs, sp));
		if (!korc_read(w, win, new_ip, cfa + bpf_core_field_offset(struct pt_regs, ip),
			       &ip_sym, true) ||
		    !korc_read(w, win, new_sp, cfa + bpf_core_field_offset(struct pt_regs, sp),
			       sp_sym, false))
			return false;
		*ip_sym_out = ip_sym;
		*regs = cfa;
		*regs_sym = sym;
		w->prev_regs = 0;
		w->full_regs = 1;
		if (old)
			w->signal = 1;
		return true;
	case KORC_REGS_PARTIAL:
		/* The hardware's frame: ip, cs, flags, sp, ss. */
		ip_sym = sym;
		*sp_sym = korc_sym_add(sym, 24);
		if (!korc_read(w, win, new_ip, cfa, &ip_sym, true) ||
		    !korc_read(w, win, new_sp, cfa + 24, sp_sym, false))
			return false;
		*ip_sym_out = ip_sym;
		if (w->full_regs) {
			w->prev_regs = w->regs;
			w->prev_regs_sym = w->regs_sym;
		}
		*regs = cfa - bpf_core_field_offset(struct pt_regs, ip);
		*regs_sym = korc_sym_add(sym, -(__s64)bpf_core_field_offset(struct pt_regs, ip));
		w->full_regs = 0;
		if (old)
			w->signal = 1;
		return true;
	default:
		return false;
	}
}

/* The caller's frame pointer: kept, saved in the frame, or in the
 * registers of an interrupted context (`regs`, or the full frame seen
 * before a partial one); its sym in `bp_sym`.  `sym`, `regs_sym`: the syms
 * of the CFA and of regs. */
static __always_inline bool korc_caller_bp(struct korc_walk *w, __u8 *win, struct korc_entry *e,
					   __u64 cfa, __u32 sym, __u64 regs, __u32 regs_sym,
					   __u64 *bp, __u32 *bp_sym)
{
	switch (e->bp_reg) {
	case ORC_REG_UNDEFINED:
		if (regs && w->full_regs) {
			*bp_sym = korc_sym_add(regs_sym, bpf_core_field_offset(struct pt_regs, bp));
			return korc_read(w, win, bp, regs + bpf_core_field_offset(struct pt_regs, bp),
					 bp_sym, false);
		}
		if (regs && w->prev_regs) {
			*bp_sym = korc_sym_add(w->prev_regs_sym,
					       bpf_core_field_offset(struct pt_regs, bp));
			return korc_read(w, win, bp,
					 w->prev_regs + bpf_core_field_offset(struct pt_regs, bp),
					 bp_sym, false);
		}
		*bp = w->bp;
		*bp_sym = w->bp_sym;
		return true;
	case ORC_REG_PREV_SP:
		*bp_sym = korc_sym_add(sym, e->bp_offset);
		return korc_read(w, win, bp, cfa + e->bp_offset, bp_sym, false);
	case ORC_REG_BP:
		*bp_sym = korc_sym_add(w->bp_sym, e->bp_offset);
		return korc_read(w, win, bp, w->bp + e->bp_offset, bp_sym, false);
	default:
		return false;
	}
}

/* Notes the sp the walk went up to (`sym`) in its proof. */
static __always_inline void korc_note_sp(struct korc_walk *w, __u32 sym)
{
	__u32 j = w->proof.s.m;

	if (j >= KORC_PROOF || KORC_SYM_BASE(sym) == KORC_UNKNOWN) {
		w->provable = 0;
		return;
	}
	w->proof.s.sp[j & (KORC_PROOF - 1)] = sym;
	w->proof.s.m = j + 1;
}

/* The word read at `sym` (its own) is a user-mode ip (see struct
 * korc_proof). */
static __always_inline void korc_user_ip(struct korc_walk *w, __u32 sym)
{
	__u32 i = KORC_SYM_BASE(sym);

	if (i < KORC_PROOF) {
		w->proof.s.need &= ~(1U << i);
		w->proof.s.user |= 1U << i;
	}
}

/* korc_step: the frame is a module's, whose entry is to be found first
 * (korc_frame). */
#define KORC_NEEDS_MODULE 2

/*
 * One frame: the current one kept, the caller's found.  0 to go on, 1 at
 * the end, KORC_NEEDS_MODULE for a module's frame not yet looked up.
 */
static __always_inline int korc_step(__u32 k)
{
	__u32 idx;
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	struct korc_entry e = {};
	__u64 ip, cfa, new_ip, new_sp, bp, regs, *ips;
	bool old = korc_layout() == 1, in_module;
	__u32 sym, sp_sym = 0, regs_sym = 0, bp_sym = 0, ip_sym;
	__u8 *win;

	if (!w)
		return 1;
	ips = w->ips;
	win = w->win;
	ip = w->ip;
	if (ip < KERNEL_SPACE) {
		w->done = KORC_COMPLETE;
		return 1;
	}
	if ((ret_trampoline_a && ip == ret_trampoline_a) ||
	    (ret_trampoline_b && ip == ret_trampoline_b)) {
		w->stop_ip = ip;
		w->done = KORC_SPLICE;
		return 1;
	}
	/* A module's frame: its own tables, looked up each time (a module
	 * may go and another come at its place).  Neither the thread's last
	 * walk nor korc_entries is used from there on. */
	in_module = ip < core_text_start || ip >= core_text_end;
	if (in_module && !korc_modules) {
		w->stop_ip = ip;
		w->done = KORC_SPLICE;
		return 1;
	}
	/* Its entry is found by korc_walk (korc_module_search), which then
	 * steps again. */
	if (in_module && w->found_for != ip)
		return KORC_NEEDS_MODULE;
	if (w->nr >= w->max) {
		w->done = KORC_COMPLETE;
		return 1;
	}
	idx = w->nr;
	ips[idx & MAX_STACK_DEPTH] = ip;
	w->nr = idx + 1;

	if (in_module) {
		w->found_for = 0;
		/* A module may go: its entries are not kept. */
		w->provable = 0;
		e = w->found;
	} else if (korc_entry_of(w, w->signal ? ip : ip - 1, &e)) {
		goto stop;
	}
	if (e.type == KORC_END) {
		w->done = KORC_COMPLETE;
		return 1;
	}
	if (e.type == KORC_UNDEFINED)
		goto stop;
	if (!old)
		w->signal = e.signal;

	if (!korc_cfa(w, win, &e, &cfa, &sym) ||
	    !korc_caller(w, win, &e, cfa, sym, old, &new_ip, &new_sp, &regs, &sp_sym, &regs_sym,
			 &ip_sym) ||
	    !korc_caller_bp(w, win, &e, cfa, sym, regs, regs_sym, &bp, &bp_sym))
		goto stop;

	w->regs = regs;
	w->regs_sym = regs_sym;
	w->ip = new_ip;
	if (new_ip < KERNEL_SPACE) {
		/* What matters of the word read last is only that it is
		 * not the kernel's. */
		korc_user_ip(w, ip_sym);
		/* User-mode registers: the stack's end. */
		w->done = KORC_COMPLETE;
		return 1;
	}
	/* Up the task's own stack, never back: a wrong table or a stack
	 * changed under the walk ends it. */
	if (new_sp <= w->sp || new_sp < w->stack_lo || new_sp >= w->stack_lo + KSTACK_SIZE)
		goto stop;
	korc_note_sp(w, sp_sym);
	w->sp = new_sp;
	w->sp_sym = sp_sym;
	w->bp = bp;
	w->bp_sym = bp_sym;
	return 0;
stop:
	/* The frame kept last is where the helper's stack takes over. */
	w->nr = idx;
	w->stop_ip = ip;
	w->done = KORC_SPLICE;
	return 1;
}

/* Whether `ip` is a frame the helper leaves out of a task's stack. */
static __always_inline bool korc_left_out(__u64 ip)
{
	return (ip >= sched_text_start && ip < sched_text_end) ||
	       (ip >= lock_text_start && ip < lock_text_end);
}

/*
 * The stack of the walk set up in korc_state, its frames in its `ips`,
 * made whole with the helper's `len` bytes of frames in start_scratch
 * (`scratch` for the switch hook's, k == KORC_SWITCH):
 * its length in bytes in `ips`, or -1 where the helper's stack is
 * to be used alone.  A global function, checked once.
 */
__noinline long korc_finish(long len, __u32 k)
{
	__u32 zero = 0, n, i, at, nr, max, more;
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	__u64 *h = bpf_map_lookup_elem(k == KORC_ITER ? (void *)&start_scratch : (void *)&scratch,
				       &zero);
	__u64 *ips, stop;

	if (!w || !h)
		return -1;
	ips = w->ips;
	n = len > 0 ? len / sizeof(__u64) : 0;
	if (n > MAX_STACK_DEPTH)
		n = MAX_STACK_DEPTH;
	/* Where the helper's stack takes over: after its last frame (the
	 * walk complete), or at stop_ip. */
	w->at = n;
	if (w->done == KORC_SPLICE) {
		/* A loop of a load and two tests a frame (the verifier goes
		 * through each); where it ends, through memory. */
		stop = w->stop_ip;
		w->at = MAX_STACK_DEPTH + 1;
		for (i = 0; i < MAX_STACK_DEPTH; i++) {
			if (i >= n)
				break;
			if (h[i] == stop) {
				w->at = i;
				break;
			}
		}
		at = *(volatile __u32 *)&w->at;
		if (at >= n)
			return -1;
		/* The helper's frames from `at` on, after the walk's, in one
		 * copy (the verifier checks one call, not a loop of them). */
		count(CNT_KSTACK_SPLICED);
		nr = w->nr;
		max = w->max < MAX_STACK_DEPTH ? w->max : MAX_STACK_DEPTH;
		if (nr < max) {
			more = n - at;
			if (more > max - nr)
				more = max - nr;
			/* Bounds the verifier sees: each below a stack's. */
			asm volatile("" : "+r"(nr), "+r"(at), "+r"(more));
			nr &= MAX_STACK_DEPTH;
			at &= MAX_STACK_DEPTH;
			more &= MAX_STACK_DEPTH;
			if (bpf_probe_read_kernel(&ips[nr], more * sizeof(__u64), &h[at]))
				return -1;
			w->nr = nr + more;
		}
	} else if (w->done != KORC_COMPLETE) {
		return -1;
	}
	i = w->nr;
	if (i > MAX_STACK_DEPTH)
		return -1;
	/* Masked where it indexes (the compiler would index from a copy
	 * the verifier has no bound for). */
	asm volatile("" : "+r"(i));
	ips[i & MAX_STACK_DEPTH] = 0;
	return i * sizeof(__u64);
}

__noinline __u64 store_korc_stack(long len, __u32 k)
{
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);

	return store_frames(w ? (struct frames *)w->ips : NULL, len, false);
}

/* test_kstack_check: each pair of a whole stack and the helper's for the
 * same task, for userspace to compare. */
struct korc_pair {
	__u64 whole;
	__u64 helper;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192);
	__type(key, struct korc_pair);
	__type(value, __u64);
} korc_pairs SEC(".maps");

/* Stores the helper's stack (its `len` bytes in start_scratch, or
 * `scratch` for k == KORC_SWITCH), notes the pair with the whole stack
 * `whole`: returns `whole`. */
__noinline __u64 korc_note_pair(__u64 whole, long len, __u32 k)
{
	struct korc_pair pair = { .whole = whole };
	__u64 one = 1;

	pair.helper = k == KORC_ITER ? store_task_stack(len, false) : store_stack(len, false);
	if ((pair.whole & STACK_ID_HASH_BIT) && (pair.helper & STACK_ID_HASH_BIT))
		bpf_map_update_elem(&korc_pairs, &pair, &one, BPF_ANY);
	return pair.whole;
}

/*
 * Walks the stack of a task that is not running, from its saved frame at
 * `frame` (thread.sp), on its kernel stack from `stack_lo`, with the state
 * of `k` (KORC_ITER, KORC_SWITCH): 0, or -1 where it cannot be walked
 * here.  `kept` (KORC_WALK_WINDOW): the window is read already, else the
 * stack from the frame up is read in one go first.  A global function: checked once, not at each call in each
 * state of its callers.
 */
/* Reads the stack from the saved frame `frame` up into the window of `w`
 * (a stack from `stack_lo`): -1 where the frame is not on it. */
static __always_inline int korc_window(struct korc_walk *w, __u64 frame, __u64 stack_lo)
{
	__u64 len;

	w->stack_lo = stack_lo;
	w->win_lo = frame;
	w->win_len = 0;
	if (!frame || frame < stack_lo || frame >= stack_lo + KSTACK_SIZE)
		return -1;
	/* Up to the stack's top, which holds the registers of user mode. */
	len = stack_lo + KSTACK_SIZE - frame;
	asm volatile("" : "+r"(len));
	len &= 2 * KSTACK_SIZE - 1;
	if (len <= KSTACK_SIZE && !bpf_probe_read_kernel(w->win, len, (void *)frame))
		w->win_len = len;
	return 0;
}

/* One frame of the walk in the state of `k` (korc_step), a module's entry
 * looked up first: 1 to stop.  A global function: the verifier checks a
 * frame once, not once for each frame of korc_walk()'s loop. */
__noinline int korc_frame(__u32 k)
{
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	__u64 ip;

	if (!w)
		return 1;
	ip = w->ip;
	/* As korc_step() finds it: a module's frame not looked up yet. */
	if (ip >= KERNEL_SPACE && korc_modules && (ip < core_text_start || ip >= core_text_end) &&
	    w->found_for != ip && !(ret_trampoline_a && ip == ret_trampoline_a) &&
	    !(ret_trampoline_b && ip == ret_trampoline_b)) {
		if (korc_module_search(w->signal ? ip : ip - 1, k)) {
			/* Not a module it knows: the helper's from here. */
			w->stop_ip = ip;
			w->done = KORC_SPLICE;
			return 1;
		}
		w->found_for = ip;
	}
	return korc_step(k) ? 1 : 0;
}

/* korc_walk's `kept`: the window is read already (korc_window()). */
#define KORC_WALK_WINDOW 2

__noinline int korc_walk(__u64 frame, __u64 stack_lo, __u32 k, int kept)
{
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	__u8 *win;
	__u32 sym;
	int i;

	if (!w || korc_layout() < 0 || !frame)
		return -1;
	win = w->win;
	if (!(kept & KORC_WALK_WINDOW) || w->win_lo != frame || w->stack_lo != stack_lo) {
		if (korc_window(w, frame, stack_lo))
			return -1;
	} else if (frame < stack_lo || frame >= stack_lo + KSTACK_SIZE) {
		return -1;
	}
	w->proof.s.n = 0;
	w->proof.s.m = 0;
	w->proof.s.need = 0;
	w->proof.s.user = 0;
	w->provable = 1;
	w->bp_sym = KORC_SYM(KORC_FRAME, bpf_core_field_offset(struct inactive_task_frame___x, bp));
	if (!korc_read(w, win, &w->bp,
		       frame + bpf_core_field_offset(struct inactive_task_frame___x, bp), &w->bp_sym,
		       false))
		return -1;
	sym = KORC_SYM(KORC_FRAME, bpf_core_field_offset(struct inactive_task_frame___x, ret_addr));
	if (!korc_read(w, win, &w->ip,
		       frame + bpf_core_field_offset(struct inactive_task_frame___x, ret_addr), &sym,
		       true))
		return -1;
	w->sp = frame + bpf_core_type_size(struct inactive_task_frame___x);
	w->sp_sym = KORC_SYM(KORC_FRAME, bpf_core_type_size(struct inactive_task_frame___x));
	korc_note_sp(w, w->sp_sym);
	if (w->sp < w->stack_lo || w->sp >= w->stack_lo + KSTACK_SIZE)
		return -1;
	w->signal = w->ip == ret_from_fork_at || (ret_from_fork_asm_at && w->ip == ret_from_fork_asm_at);
	w->regs = 0;
	w->prev_regs = 0;
	w->full_regs = 0;
	w->stop_ip = 0;
	w->nr = 0;
	w->max = clamp_stack_bytes() / sizeof(__u64);
	w->done = KORC_WALKING;
	w->entries = orc_entries;
	w->found_for = 0;
	for (i = 0; i < MAX_STACK_DEPTH; i++)
		if (korc_frame(k))
			break;
	return 0;
}

/* How many times `task` has been switched out. */
static __always_inline __u64 switches_of(struct task_struct *task)
{
	return BPF_CORE_READ(task, nvcsw) + BPF_CORE_READ(task, nivcsw);
}

/*
 * The kernel stack of `task`, which is not running: its id in `stacks`.
 * A task not running may be picked by another CPU at any time: the two
 * walks are kept only if it has not been switched out again, nor is on a
 * CPU, once both are done; else they are made again once, and then the
 * helper's stack is kept alone (CNT_KSTACK_MOVED).  `walk` false: the
 * helper's alone (CNT_KSTACK_NOT_WALKED), in the kprobe's end iterator that
 * also reads user stacks (whose chain of calls the walk would take past
 * 6.1's 512 bytes), for a thread that ran since end_kernel_stacks_by_tid
 * walked it.
 */
static __always_inline __u64 kernel_stack_of_task(struct task_struct *task, const bool walk)
{
	__u32 zero = 0;
	__u64 *buf = bpf_map_lookup_elem(&start_scratch, &zero);
	__u64 switches;
	long len = 0, whole;
	int attempt;

	if (!buf)
		return STACK_ID_MISSED_ERROR;
	if (!walk) {
		len = bpf_get_task_stack(task, buf, clamp_stack_bytes(), 0);
		if (len >= 0 && !BPF_CORE_READ(task, on_cpu))
			count(CNT_KSTACK_NOT_WALKED);
		return store_task_stack(len, false);
	}
	for (attempt = 0; attempt < 2; attempt++) {
		switches = switches_of(task);
		len = bpf_get_task_stack(task, buf, clamp_stack_bytes(), 0);
		/* A task on a CPU has no saved frame (nor a stack from the
		 * helper). */
		if (len < 0 || BPF_CORE_READ(task, on_cpu))
			return store_task_stack(len, false);
		if (!kstack_orc ||
		    korc_walk(BPF_CORE_READ(task, thread.sp), (__u64)BPF_CORE_READ(task, stack),
			      KORC_ITER, 0)) {
			count(CNT_KSTACK_NO_SCHED);
			return store_task_stack(len, false);
		}
		if (BPF_CORE_READ(task, on_cpu) || switches_of(task) != switches)
			continue;
		whole = korc_finish(len, KORC_ITER);
		if (whole < 0) {
			count(CNT_KSTACK_NO_SCHED);
			return store_task_stack(len, false);
		}
		count(CNT_KSTACK_WALKED);
		if (test_kstack_check)
			return korc_note_pair(store_korc_stack(whole, KORC_ITER), len, KORC_ITER);
		return store_korc_stack(whole, KORC_ITER);
	}
	count(CNT_KSTACK_MOVED);
	return store_task_stack(len, false);
}

/*
 * At a switch, a block's kernel stack is taken when the thread is switched
 * in again, not when it is switched out: until then it does not run, so
 * its saved frame is the one it blocked with, and the walk from there is
 * the one of a thread blocked at the start or in a --snapshot, the
 * scheduler's frames included.  Only blocks that are counted (past -m/-M)
 * are walked.  The walk reads the stack in one go (the stack's words are
 * read again every time: their place moves, the kernel shifts each system
 * call's stack by a random offset) and takes each frame's entry from
 * korc_entries.  Before that, the proofs of the thread's last walks
 * (struct korc_proof, kept as struct korc_kept_proof) are checked: where
 * one holds, its stack is taken without a walk.  A thread keeps up to
 * KORC_WAYS of them: one that blocks in two places in turn (a read that
 * waits, a write preempted on its way back to user mode) is proved at
 * both.  With the tracepoint on BTF only (VARIANT_TRUSTED): the helper
 * that takes over where the walk stops needs a task it can trust.
 */
#define KORC_WAYS 2
/* struct korc_kept_proof, korc_way and korc_kept: in maps.h (a thread's
 * first way is kept in its task_local). */

/* The first kept way of `t`, in its record; none where it has no record
 * (made at its switch-out: a thread blocked since before the hooks, or not
 * traced then).  Out of line: the switch hook's own frame is at the
 * bound of the calls' stacks (see korc_keep_proof()). */
static __noinline struct korc_kept *korc_kept_of(struct task_struct *t)
{
	struct task_local *l = bpf_task_storage_get(&task_data_storage, t, 0, 0);

	return l ? &l->korc : NULL;
}

/* Notes which of the thread's ways (`e`'s) was proved or kept last. */
static __always_inline void korc_set_last(struct korc_kept *e, __u32 second)
{
	e->second_for = (e->second_for & ~KORC_LAST_BIT) | (second ? KORC_LAST_BIT : 0);
}
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct korc_way);
} korc_second SEC(".maps");

/* Whether the switch hook takes kernel stacks at the switch-in (above). */
static __always_inline bool kstack_at_switch_in(const __u32 variant)
{
	return kstack_orc && (variant & VARIANT_TRUSTED) &&
	       !(variant & (VARIANT_LEGACY | VARIANT_AFTER_SWITCH));
}

/* Keeps the proof of the walk in `w`, complete, of the stack stored as
 * `id`, for the thread `task` (its `e`), in its first way where that is
 * empty, else over the way proved or kept less recently (the second made
 * where the same stack would have taken it last time); none where it read
 * a word outside its window or went through a module.  Out of line: the
 * switch hook's own frame is at the bound of the calls' stacks (512
 * bytes, the walk's calls below it) on kernels without private stacks. */
static __noinline void korc_keep_proof(struct korc_walk *w, struct task_struct *task,
				       struct korc_kept *e, __u64 id)
{
	__u32 j, n = w->proof.s.n, m = w->proof.s.m, second = 0;
	struct korc_way *way = &e->way, *more;
	struct korc_kept_proof *pr;
	__u64 h = UCACHE_HASH_SEED, key;

	if (!w->provable || w->done != KORC_COMPLETE || !(id & STACK_ID_HASH_BIT))
		return;
	if (way->stack_id && way->stack_id != id) {
		more = bpf_task_storage_get(&korc_second, task, 0, 0);
		if (!more) {
			if ((e->second_for & ~KORC_LAST_BIT) != (id & ~KORC_LAST_BIT)) {
				e->second_for = (id & ~KORC_LAST_BIT) |
						(e->second_for & KORC_LAST_BIT);
				return;
			}
			more = bpf_task_storage_get(&korc_second, task, 0,
						    BPF_LOCAL_STORAGE_GET_F_CREATE);
			if (!more)
				return;
			second = 1;
		} else if (more->stack_id == id || !(e->second_for & KORC_LAST_BIT)) {
			second = 1;
		}
		if (second)
			way = more;
	}
	korc_set_last(e, second);
	pr = &way->proof;
	/* The words needed, hashed; the shape, hashed into its key. */
	key = ucache_mix(ucache_mix(UCACHE_HASH_SEED, (__u64)n << 32 | m),
			 (__u64)w->proof.s.need << 32 | w->proof.s.user);
	for (j = 0; j < KORC_PROOF; j++) {
		if (j >= n)
			break;
		if ((w->proof.s.need >> j) & 1)
			h = ucache_mix(h, w->proof.val[j]);
		key = ucache_mix(key, w->proof.s.at[j]);
	}
	for (j = 0; j < KORC_PROOF; j++) {
		if (j >= m)
			break;
		key = ucache_mix(key, w->proof.s.sp[j]);
	}
	/* The shape, unless some thread's walk kept it already; its key
	 * kept where the way's is (not on this function's stack, see
	 * above). */
	pr->shape = key;
	if (!keep_shape(&korc_shapes, &pr->shape, &w->proof.s)) {
		way->stack_id = 0;
		return;
	}
	way->stack_id = id;
	pr->hash = h;
}

/*
 * Whether the switch hook loads the words of a blocked thread's kernel
 * stack where they are (korc_word_at()) rather than copying the stack from
 * its saved frame up first: 6.2 on, with the kernel's id of struct pt_regs
 * known.  The copy, a word at a time (the kernel's nofault copy), was 145
 * ns of a switch in a pipe's ping-pong on an AMD host, the proof's words
 * about twenty of its hundred and thirty.
 */
static __always_inline bool korc_direct(void)
{
	return bpf_ksym_exists(bpf_rdonly_cast) && pt_regs_kernel_id;
}

/* The word of kernel memory at `addr`, loaded through a pointer the
 * verifier guards as any it does not trust (a load that faults reads 0):
 * `addr` cast to the kernel's struct pt_regs, whose first field is a
 * word. */
static __always_inline __u64 korc_word_at(__u64 addr)
{
	struct pt_regs *r;
	__u64 v;

	/* (Where the kernel has no cast, the call is left out as the verifier
	 * sees it: checked here, at each call.) */
	if (!korc_direct())
		return 0;
	r = bpf_rdonly_cast((void *)addr, pt_regs_kernel_id);
	v = r->r15;

	/* Not to be merged with a load from a map's memory into one
	 * instruction (the verifier takes an instruction's pointer to be of
	 * one kind). */
	asm volatile("" : "+r"(v));
	return v;
}

/*
 * Whether the walk proved by `pr` holds for the stack from the saved frame
 * `frame`: each word it read, at its place found again from the frame and
 * the words before it, is on the stack above the frame; each return
 * address holds what it held, each user-mode ip still is one; the sps it
 * went up by are still in order on the stack.  The walk from there is then
 * the same: its entries are those of the same addresses.  The words are
 * loaded where they are (`direct`, korc_direct()), else read from the
 * switch hook's window.  A global function: checked once.
 */
__noinline int korc_proof_holds(struct korc_kept_proof *pr, __u64 frame, int direct)
{
	__u32 i, n, m, sym, k = KORC_SWITCH;
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	__u64 at, v, off, len, sp, last = 0, *val, h = UCACHE_HASH_SEED;
	struct korc_shape *s;

	if (!w || !pr)
		return false;
	/* The words from the frame up to the stack's top (where the window
	 * would end), or those in the window. */
	if (direct) {
		if (!korc_direct() || frame < w->stack_lo || frame >= w->stack_lo + KSTACK_SIZE)
			return false;
		len = w->stack_lo + KSTACK_SIZE - frame;
	} else {
		if (w->win_lo != frame)
			return false;
		len = w->win_len;
	}
	/* Its shape (a shape kept under the same key but not the same
	 * would fail the hash of the words but for a chance of one in
	 * 2^64, as a word changed would). */
	w->shape_key = pr->shape;
	s = bpf_map_lookup_elem(&korc_shapes, &w->shape_key);
	if (!s)
		return false;
	n = s->n;
	m = s->m;
	if (!n || n > KORC_PROOF || !m || m > KORC_PROOF || len < 8)
		return false;
	/* The places' bases: the words read again, and the frame (whose
	 * sym's base, KORC_FRAME, is the last slot). */
	val = w->proof_val;
	val[KORC_FRAME & (KORC_VALS - 1)] = frame;
	for (i = 0; i < KORC_PROOF; i++) {
		if (i >= n)
			break;
		sym = s->at[i];
		at = val[KORC_SYM_BASE(sym) & (KORC_VALS - 1)] + KORC_SYM_OFF(sym);
		off = at - frame;
		if (off > len - 8 || (off & 7))
			return false;
		if (direct)
			v = korc_word_at(frame + off);
		else
			v = *(__u64 *)(w->win + (off & (KSTACK_SIZE - 8)));
		val[i] = v;
		if ((s->need >> i) & 1)
			h = ucache_mix(h, v);
		if ((s->user >> i) & 1 && v >= KERNEL_SPACE)
			return false;
	}
	if (h != pr->hash)
		return false;
	for (i = 0; i < KORC_PROOF; i++) {
		if (i >= m)
			return true;
		sym = s->sp[i];
		sp = val[KORC_SYM_BASE(sym) & (KORC_VALS - 1)] + KORC_SYM_OFF(sym);
		if (sp <= last || sp < w->stack_lo || sp >= w->stack_lo + KSTACK_SIZE)
			return false;
		last = sp;
	}
	return true;
}

/*
 * The kernel stack of `next`, being switched in by the tracepoint on BTF
 * (kstack_at_switch_in): it has not run since it blocked.  Its id in
 * `stacks`.  Proved the same as one of its last without a walk where it
 * can be (korc_proof_holds()), else walked with the entries of its last
 * walk.
 */
static __always_inline __u64 kernel_stack_at_switch_in(struct task_struct *next)
{
	__u32 zero = 0, k = KORC_SWITCH;
	/* Loaded directly: the tracepoint's task is trusted (its stack, a
	 * pointer, would not be a number to the verifier). */
	__u64 frame = next->thread.sp;
	__u64 lo = (__u64)BPF_CORE_READ(next, stack);
	__u64 *buf = bpf_map_lookup_elem(&scratch, &zero);
	struct korc_walk *w = bpf_map_lookup_elem(&korc_state, &k);
	struct korc_kept *e;
	struct korc_way *more;
	long len = 0, whole;
	bool direct;
	__u64 id;

	if (!buf || !w)
		return STACK_ID_MISSED_ERROR;
	e = korc_kept_of(next);
	/* Proved with the words loaded where they are, the stack is not
	 * copied: the walk reads it (the window's start is no frame). */
	direct = korc_direct();
	if (direct) {
		w->stack_lo = lo;
		w->win_lo = 0;
		w->win_len = 0;
	}
	if ((direct || korc_window(w, frame, lo) == 0) && e) {
		id = 0;
		if (e->way.stack_id && korc_proof_holds(&e->way.proof, frame, direct)) {
			id = e->way.stack_id;
			korc_set_last(e, 0);
		} else {
			more = bpf_task_storage_get(&korc_second, next, 0, 0);
			if (more && more->stack_id && korc_proof_holds(&more->proof, frame, direct)) {
				id = more->stack_id;
				korc_set_last(e, 1);
			}
		}
		if (id) {
			count(CNT_KSTACK_PROVED);
			if (test_kstack_check)
				korc_note_pair(id,
					       bpf_get_task_stack(next, buf, clamp_stack_bytes(), 0),
					       KORC_SWITCH);
			return id;
		}
	}
	if (korc_walk(frame, lo, KORC_SWITCH, KORC_WALK_WINDOW)) {
		count(CNT_KSTACK_NO_SCHED);
		return store_stack(bpf_get_task_stack(next, buf, clamp_stack_bytes(), 0), false);
	}
	if (w->done != KORC_COMPLETE || test_kstack_check)
		len = bpf_get_task_stack(next, buf, clamp_stack_bytes(), 0);
	whole = korc_finish(len, KORC_SWITCH);
	if (whole < 0) {
		count(CNT_KSTACK_NO_SCHED);
		return store_stack(len, false);
	}
	count(CNT_KSTACK_WALKED);
	id = store_korc_stack(whole, KORC_SWITCH);
	if (e)
		korc_keep_proof(w, next, e, id);
	if (test_kstack_check)
		korc_note_pair(id, len, KORC_SWITCH);
	return id;
}

#endif /* __OFFCPUTIME_KSTACK_H__ */
