/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * CPython frames, appended to a user stack after its native frames (see
 * struct py_proc and PY_FRAME_MARK in offcputime.h).
 *
 * A thread blocked in time.sleep(), a socket read or a lock has released
 * the GIL: the interpreter's "current" thread state is then another
 * thread's, or none.  The GIL-state key still maps every thread to its own
 * state: glibc keeps the values of the first 32 keys in the thread's own
 * struct pthread, at the thread pointer (fsbase) + tls_specific, 16 bytes
 * a key ({seq, data}).  The state found must name the thread itself
 * (thread_id, its pthread_t: glibc's thread pointer), or the thread gets
 * native frames only.
 *
 * From the state's current frame the walk follows `previous` (3.10:
 * f_back) outwards, writing each frame's code object, a tag of the code
 * object (so that userspace does not name a frame after a code object
 * freed and another allocated in its place), and the instruction.  Where
 * an evaluation call's run of frames ends is marked, so that userspace can
 * put each run in place of its _PyEval_EvalFrameDefault frame.  The names
 * are read by userspace, from the process, when it first hears of a code
 * object (TASK_EVENT_PYCODE).
 */
#ifndef __OFFCPUTIME_PYTHON_H__
#define __OFFCPUTIME_PYTHON_H__

/* python_on: see runtime.h. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* Whether process `tgid` may have an entry in py_procs (its bit is set:
 * see runtime.h). */
static __always_inline bool python_pid(__u32 tgid)
{
	return python_on && runtime_pid(tgid);
}

/* The code objects whose notices this CPU sent lately, by a hash of the
 * process, address and tag: a notice each the first time, and again only
 * once another took its slot. */
#define PY_SEEN_SLOTS 1024
struct py_seen {
	__u64 code;
	__u32 tgid;
	__u32 tag;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PY_SEEN_SLOTS);
	__type(key, __u32);
	__type(value, struct py_seen);
} py_seen SEC(".maps");

/* A frame's bytes, and room past them: a field read at any offset below
 * PY_READ_MAX stays inside. */
#define PY_READ_MAX 128
/* The most read at once below a frame of the interpreter's data stack:
 * the frames that called it are there (py_frame_bytes). */
#define PY_WINDOW 2048
/* The code objects a walk remembers the tags of. */
#define PY_KNOWN 4
struct py_walk {
	struct py_proc p;
	__u64 frame;
	__u64 process_start;
	__u32 tgid;
	__u32 pid;
	/* Words written to the frames, and the most there is room for. */
	__u32 nr;
	__u32 max;
	/* Frames written since the last end of a run. */
	__u32 in_run;
	__u32 frames;
	bool done;
	/* A frame whose code object's tag could not be read: the walk is
	 * not kept. */
	bool tagless;
	__u8 _pad[2];
	/* The walk of the current thread: frames and shims followed, and
	 * the hash of their addresses and the words read of them. */
	__u32 steps;
	__u64 hash;
	/* Its thread state, and the frame found there. */
	__u64 state;
	__u64 first;
	/* The native frames' words: the Python frames' begin there. */
	__u32 base;
	/* python_stack_of_current: until when (2^20 ns) the process it
	 * looked at is left alone (PY_REST), 0 where it is not. */
	__u32 rest_until;
	/* The window of memory read last (see py_frame_bytes): from
	 * win_lo, win_len bytes, in buf; the frame being read starts at
	 * buf[at]. */
	__u32 win_len;
	__u64 win_lo;
	__u32 at;
	/* Windows read in this walk, and the lowest frame found in the
	 * first (which a proof of the walk reads alone, see py_kept). */
	__u32 reads;
	__u64 low;
	/* A proof's first window from here (py_kept's low), 0: none. */
	__u64 hint;
	/* The code objects met in this walk and their tags (py_known):
	 * the first known_nr of PY_KNOWN. */
	__u32 known_nr;
	__u64 known_code[PY_KNOWN];
	__u32 known_tag[PY_KNOWN];
	__u8 buf[PY_WINDOW + PY_READ_MAX + 8];
	__u8 tag[24];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_walk);
} py_walk_scratch SEC(".maps");

/* The same for the sleepable iterators, which a switch hook on their CPU
 * could interrupt while they wait for another task's memory. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_walk);
} py_walk_task SEC(".maps");

/*
 * A thread's last walk of its Python frames, kept to be proved unchanged
 * rather than walked again at its next block: the walk of the same
 * interpreter from the same thread state and frame, appended to the same
 * native stack (itself walked or proved), that follows as many frames,
 * each at its address with the same words of it (the code object, the
 * frame below, the instruction, is_entry or owner: all the walk takes of
 * a frame), is the walk kept.  The code objects' tags are not read again: a frame holds a
 * reference to its code object, and a code object freed and another made
 * at its address would have to be run by a frame of the same words in the
 * same place of the thread's stack, between two of its blocks.
 */
struct py_kept {
	/* The native stack the frames were appended to, and the stack
	 * stored with them. */
	__u64 native;
	__u64 id;
	__u64 mm;
	/* The interpreter's GIL-state key (its struct py_proc), the thread
	 * state and its current frame. */
	__u64 tss;
	__u64 state;
	__u64 frame;
	__u64 hash;
	/* The lowest of its frames in the window read for the first: a
	 * proof reads from there to the first frame's end. */
	__u64 low;
	__u32 steps;
	__u32 frames;
	__u16 runtimes;
	__u8 _pad[6];
};

/* A thread's last walks from two native stacks (a thread that blocks in
 * two places by turns, as one that reads and writes): the way of the
 * native stack at hand, else the one not used last is replaced. */
#define PY_KEPT_WAYS 2
struct py_kept_set {
	struct py_kept way[PY_KEPT_WAYS];
	__u32 last;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct py_kept_set);
} py_kept SEC(".maps");

#define PY_HASH_SEED 0x9e3779b97f4a7c15ULL

struct py_ctx {
	struct py_walk *w;
	__u64 *ips;
	/* The task walked, when it is not the current one. */
	struct task_struct *task;
};

/* How long (in 2^20 ns, about ms) a process whose interpreter has not
 * started is left alone. */
#define PY_REST 10

/* Whether a time of rest `until` (2^20 ns, wrapping; 0: none) is still to
 * come at `now` (ns).  0 is never a time of rest (py_rest_from), so that a
 * record just made is not taken for one resting by a clock past 2^31. */
static __always_inline bool py_resting(__u32 until, __u64 now)
{
	return until && (__s32)(until - (__u32)(now >> 20)) > 0;
}

/* The end of a rest that begins at `now` (ns). */
static __always_inline __u32 py_rest_from(__u64 now)
{
	return ((__u32)(now >> 20) + PY_REST) | 1;
}

/* A field of the frame being read, at `off` (below PY_READ_MAX). */
static __always_inline __u64 py_u64(struct py_walk *w, __u32 off)
{
	__u32 at = w->at & (PY_WINDOW - 1);

	off &= PY_READ_MAX - 1;
	return *(__u64 *)&w->buf[at + off];
}

static __always_inline __u8 py_u8(struct py_walk *w, __u32 off)
{
	__u32 at = w->at & (PY_WINDOW - 1);

	off &= PY_READ_MAX - 1;
	return w->buf[at + off];
}

/* The 24 bytes from a code object's co_filename, as userspace hashes them
 * (src/runtime/python). */
static __always_inline __u32 py_tag(struct py_walk *w)
{
	__u64 h = 0xcbf29ce484222325ULL;
	int i;

	for (i = 0; i < 3; i++) {
		h ^= *(__u64 *)&w->tag[i * 8];
		h *= 0x100000001b3ULL;
		h ^= h >> 32;
	}
	return (__u32)h;
}

/* Tells userspace of a code object this CPU has not told it of lately. */
static __always_inline void py_notice(struct py_walk *w, __u64 code, __u32 tag)
{
	__u32 slot = (__u32)((code >> 4) ^ (code >> 16) ^ w->tgid ^ tag) & (PY_SEEN_SLOTS - 1);
	struct py_seen *s = bpf_map_lookup_elem(&py_seen, &slot);

	if (!s || (s->code == code && s->tgid == w->tgid && s->tag == tag))
		return;
	if (!runtime_notice(TASK_EVENT_PYCODE, w->tgid, w->pid, w->process_start, w->p.mm, code,
			    tag, 0, CNT_PY_EVENTS_LOST))
		return;
	s->code = code;
	s->tgid = w->tgid;
	s->tag = tag;
}

/* Writes a frame's two words; false where there is no room. */
static __always_inline bool py_put(struct py_ctx *c, __u64 code, __u64 flags, __u32 tag,
				   __u32 instr)
{
	struct py_walk *w = c->w;
	__u32 i = w->nr;

	if (i + 2 > w->max || i + 2 > MAX_STACK_DEPTH)
		return false;
	asm volatile("" : "+r"(i));
	c->ips[i & MAX_STACK_DEPTH] = PY_FRAME_MARK | (code & 0xffffffffffffULL);
	i++;
	asm volatile("" : "+r"(i));
	c->ips[i & MAX_STACK_DEPTH] = PY_WORD_MARK | (flags & 0x7f) << 56 | (__u64)tag << 24 |
				      (instr & 0xffffff);
	w->nr = i + 1;
	return true;
}

/* Marks the frame written last as the end of its run. */
static __always_inline void py_end_run(struct py_ctx *c)
{
	struct py_walk *w = c->w;
	__u32 i = w->nr - 1;

	if (w->nr <= w->base + 1 || i >= MAX_STACK_DEPTH)
		return;
	asm volatile("" : "+r"(i));
	c->ips[i & MAX_STACK_DEPTH] |= (__u64)PY_FLAG_ENTRY << 56;
}

static __always_inline long py_read(void *dst, __u32 size, __u64 src, struct task_struct *task)
{
	if (task)
		return bpf_copy_from_user_task(dst, size, (void *)src, task, 0);
	return bpf_probe_read_user(dst, size, (void *)src);
}

/* Reads the window of `len` bytes (at most PY_WINDOW) from `lo`, in which
 * the frame at w->frame is: 0, or the read's error. */
static __always_inline long py_window_read(struct py_walk *w, __u64 lo, __u64 len,
					   struct task_struct *task)
{
	long err;

	/* Below PY_WINDOW, as the verifier can see. */
	asm volatile("" : "+r"(len));
	if (len > PY_WINDOW)
		len = PY_WINDOW;
	err = py_read(w->buf, len, lo, task);
	w->reads++;
	w->win_len = err ? 0 : len;
	w->win_lo = lo;
	w->at = w->frame - lo;
	return err;
}

/*
 * Makes the `size` bytes of the frame at w->frame readable at buf[at]: 0,
 * or the read's error.  Each read of another process's memory costs a
 * switch some 70 ns however few bytes it copies, and from 3.11 the frames
 * that called a frame lie below it on the interpreter's data stack: a read
 * takes up to PY_WINDOW bytes below the frame (not below its page, which
 * is mapped where the frame is), and the frames found inside are read
 * from there (a frame whose callers are elsewhere, a generator's on the
 * heap or a shim on the C stack, costs a copy of up to PY_WINDOW bytes
 * more, not another read).  A window holds the bytes of one moment of one
 * walk, as the frames' own reads would: the thread walked is switched out.
 */
static __always_inline long py_frame_bytes(struct py_walk *w, __u32 size, struct task_struct *task)
{
	__u64 frame = w->frame, lo, end = frame + size;

	if (w->win_len && frame >= w->win_lo && end > frame && end <= w->win_lo + w->win_len) {
		w->at = frame - w->win_lo;
		return 0;
	}
	if (w->p.kind == PY_FRAMES_OBJECT) {
		/* 3.10: frames are objects of their own on the heap. */
		lo = frame;
	} else {
		lo = frame & ~4095ULL;
		if (end - lo > PY_WINDOW)
			lo = end - PY_WINDOW;
	}
	return py_window_read(w, lo, end - lo, task);
}

/* The tag of code object `code` where this walk met it already: a code
 * object lives at least as long as a frame running it, so within the walk
 * of a thread switched out an address is one code object.  Not in the
 * iterators' walks of other threads, which may run meanwhile.  PY_KNOWN + 1
 * where it is not known. */
static __always_inline __u32 py_known(struct py_walk *w, __u64 code)
{
	__u32 i;

	for (i = 0; i < PY_KNOWN; i++)
		if (i < w->known_nr && w->known_code[i] == code)
			return i;
	return PY_KNOWN + 1;
}

static __always_inline void py_remember(struct py_walk *w, __u64 code, __u32 tag)
{
	__u32 i = w->known_nr;

	if (i >= PY_KNOWN)
		return;
	w->known_code[i] = code;
	w->known_tag[i] = tag;
	w->known_nr = i + 1;
}

/* The hash `h` of a walk with one more frame, at `frame`, its bytes at
 * `f`: its address and the words the walk takes from it (its code object,
 * the instruction, is_entry or owner).  The frame below it is the next
 * step's address, hashed there (the last's is 0, which a proof checks). */
static __always_inline __u64 py_mix_frame(__u64 h, __u64 frame, const __u8 *f, __u32 code_off,
					  __u32 instr_off, __u32 entry_off)
{
	h = ucache_mix(h, frame);
	h = ucache_mix(h, *(__u64 *)&f[code_off & (PY_READ_MAX - 1)]);
	h = ucache_mix(h, *(__u64 *)&f[instr_off & (PY_READ_MAX - 1)]);
	return ucache_mix(h, f[entry_off & (PY_READ_MAX - 1)]);
}

/* Adds the frame being read (at w->frame) to the walk's hash. */
static __always_inline void py_hash_frame(struct py_walk *w)
{
	if (w->reads == 1 && w->frame < w->low)
		w->low = w->frame;
	w->hash = py_mix_frame(w->hash, w->frame, &w->buf[w->at & (PY_WINDOW - 1)], w->p.f_code,
			       w->p.f_instr, w->p.f_entry);
	w->steps++;
}

/* The bytes of a frame read: its fields, PY_READ_MAX at most. */
static __always_inline __u32 py_frame_size(struct py_walk *w)
{
	__u32 size = w->p.frame_read;

	if (size > PY_READ_MAX)
		size = PY_READ_MAX;
	if (size < 8)
		size = 8;
	return size;
}

/* A step of the walk: the frame at w->frame.  `current`: of the current
 * thread, hashed. */
static __always_inline long py_step(struct py_ctx *c, struct task_struct *task, bool current)
{
	struct py_walk *w = c->w;
	__u32 size = w->p.frame_read, tag = 0, instr = 0xffffff, known;
	__u64 code, prev, flags = 0, ip;
	__u8 entry;

	if (!w->frame || w->done) {
		w->done = true;
		return 1;
	}
	if (size > PY_READ_MAX)
		size = PY_READ_MAX;
	if (size < 8)
		size = 8;
	if (py_frame_bytes(w, size, task)) {
		py_put(c, 0, PY_FLAG_UNREADABLE, 0, 0);
		count(CNT_PY_UNREADABLE);
		w->done = true;
		return 1;
	}
	code = py_u64(w, w->p.f_code);
	prev = py_u64(w, w->p.f_previous);
	entry = py_u8(w, w->p.f_entry);
	if (current)
		py_hash_frame(w);
	if (w->p.kind == PY_FRAMES_SHIM && entry == w->p.owner_cstack) {
		/* The shim below an evaluation call's frames. */
		if (w->in_run)
			py_end_run(c);
		else if (!py_put(c, 0, PY_FLAG_EMPTY | PY_FLAG_ENTRY, 0, 0))
			goto full;
		w->in_run = 0;
		w->frame = prev;
		return 0;
	}
	if (w->p.instr_is_index) {
		instr = (__u32)py_u64(w, w->p.f_instr);
	} else {
		ip = py_u64(w, w->p.f_instr);
		if (ip >= code && ip - code < 0xffffff)
			instr = ip - code;
	}
	if (w->p.kind == PY_FRAMES_OBJECT || (w->p.kind == PY_FRAMES_ENTRY_FLAG && entry))
		flags |= PY_FLAG_ENTRY;
	known = task ? PY_KNOWN + 1 : py_known(w, code);
	if (known < PY_KNOWN)
		tag = w->known_tag[known];
	else if (py_read(w->tag, sizeof(w->tag), code + w->p.co_tag, task)) {
		flags |= PY_FLAG_NO_TAG;
		w->tagless = true;
	} else
		tag = py_tag(w);
	if (!py_put(c, code, flags, tag, instr))
		goto full;
	if (!(flags & PY_FLAG_NO_TAG) && known >= PY_KNOWN) {
		py_notice(w, code, tag);
		py_remember(w, code, tag);
	}
	w->frames++;
	w->in_run = (flags & PY_FLAG_ENTRY) ? 0 : w->in_run + 1;
	w->frame = prev;
	return 0;
full:
	/* Flag the last Python frame written: the frames go on beyond. */
	if (w->nr > w->base + 1 && w->nr - 1 < MAX_STACK_DEPTH) {
		__u32 i = w->nr - 1;

		asm volatile("" : "+r"(i));
		c->ips[i & MAX_STACK_DEPTH] |= (__u64)PY_FLAG_TRUNCATED << 56;
	}
	count(CNT_PY_TRUNCATED);
	w->done = true;
	return 1;
}

/* After the loop: frames beyond its last step are said as for room. */
static __always_inline void py_finish(struct py_ctx *c)
{
	struct py_walk *w = c->w;
	__u32 i = w->nr - 1;

	if (!w->done && w->frame) {
		if (w->nr > w->base + 1 && i < MAX_STACK_DEPTH) {
			asm volatile("" : "+r"(i));
			c->ips[i & MAX_STACK_DEPTH] |= (__u64)PY_FLAG_TRUNCATED << 56;
		}
		count(CNT_PY_TRUNCATED);
	}
	count(CNT_PY_STACKS);
	count_n(CNT_PY_FRAMES, w->frames);
}

/*
 * A frame of the current thread's walk: its state in py_walk_scratch, its
 * frames in scratch.  A global function, so that the verifier checks the
 * step once, on its own, not again for each state its bpf_loop callback
 * is entered with (three quarters of python_stack_of_current()'s
 * verification).
 */
__noinline long py_step_of_current(void)
{
	__u32 zero = 0;
	struct py_ctx c = {};

	c.w = bpf_map_lookup_elem(&py_walk_scratch, &zero);
	c.ips = bpf_map_lookup_elem(&scratch, &zero);
	if (!c.w || !c.ips)
		return 1;
	return py_step(&c, NULL, true);
}

static long py_step_current(__u32 i, void *arg)
{
	/* A callback's answer must be known to be 0 or 1. */
	return py_step_of_current() ? 1 : 0;
}

static long py_step_task(__u32 i, void *arg)
{
	struct py_ctx *c = arg;

	return py_step(c, c->task, false);
}

/*
 * The thread state's thread_id and frame (or C frame) into v[3] and v[4],
 * the state being at v[2]: one read of the bytes from the first to the
 * last where they are within PY_READ_MAX of each other, else one each.
 */
static __always_inline bool py_thread_state(struct py_walk *w, __u64 *v, struct task_struct *task)
{
	__u32 id = w->p.ts_thread_id, frame = w->p.ts_frame;
	__u32 lo = id < frame ? id : frame, hi = id < frame ? frame : id;
	__u8 *b = w->buf + 64;

	if (hi - lo + 8 > PY_READ_MAX)
		return !py_read(&v[3], 8, v[2] + id, task) && !py_read(&v[4], 8, v[2] + frame, task);
	if (py_read(b, (hi - lo + 8) & (PY_READ_MAX * 2 - 1), v[2] + lo, task))
		return false;
	v[3] = *(__u64 *)&b[(id - lo) & (PY_READ_MAX - 1)];
	v[4] = *(__u64 *)&b[(frame - lo) & (PY_READ_MAX - 1)];
	return true;
}

/*
 * Finds the Python frames of a thread of process `tgid` (`task`, or the
 * current task where NULL) and sets up the walk in `w`: false where the
 * process has no interpreter known, or the thread no state of its own.
 */
static __always_inline bool py_begin(struct py_walk *w, struct task_struct *t, __u32 tgid,
				     __u32 pid, __u64 mm, struct task_struct *task)
{
	struct py_proc *p = bpf_map_lookup_elem(&py_procs, &tgid);
	__u64 *v = (__u64 *)w->buf;

	if (!p || !mm)
		return false;
	/* Claimed by the first walk where userspace could not say which
	 * address space it is for (the processes found at the start). */
	if (!p->mm)
		p->mm = mm;
	if (p->mm != mm)
		return false;
	w->p = *p;
	/* Read into the walk's buffer, not the stack: on 6.1 the stack of a
	 * chain of calls is bounded to 512 bytes.  v[0]: the key (Py_tss_t),
	 * v[1]: the thread pointer, v[2]: the thread state, v[3]: its
	 * thread_id, v[4]: the frame. */
	if (py_read(&v[0], 8, w->p.tss, task) || (__u32)v[0] != 1 || (v[0] >> 32) >= 32) {
		/* No interpreter running in the process: not looked at again
		 * for a while, each look costing a switch some 400 ns. */
		p->resting_until = py_rest_from(bpf_ktime_get_ns());
		goto no_state;
	}
	v[1] = BPF_CORE_READ(t, thread.fsbase);
	if (!v[1] ||
	    py_read(&v[2], 8, v[1] + w->p.tls_specific + (v[0] >> 32) * 16 + 8, task) || !v[2])
		goto no_state;
	/* Its thread_id is its pthread_t: under glibc the thread pointer.
	 * Both fields in one read where they are near (3.11 on). */
	if (!py_thread_state(w, v, task) || v[3] != v[1])
		goto no_state;
	if (w->p.cframe_frame != 0xffff && v[4] &&
	    py_read(&v[4], 8, v[4] + w->p.cframe_frame, task))
		goto no_state;
	w->frame = v[4];
	w->state = v[2];
	w->first = v[4];
	w->tgid = tgid;
	w->pid = pid;
	w->in_run = 0;
	w->frames = 0;
	w->done = false;
	w->tagless = false;
	w->steps = 0;
	w->hash = PY_HASH_SEED;
	w->win_len = 0;
	w->reads = 0;
	w->low = v[4];
	w->known_nr = 0;
	w->process_start = BPF_CORE_READ(t, group_leader, start_boottime);
	return true;
no_state:
	count(CNT_PY_NO_THREAD_STATE);
	return false;
}

/* py_frame_bytes() for a proof: its first window as the walk found it,
 * from the lowest of the frames read there (w->hint) to the first frame's
 * end, rather than from the frame's page. */
static __always_inline long py_proof_window(struct py_walk *w, __u32 size)
{
	__u64 lo = w->hint, len = w->frame + size - lo;

	w->hint = 0;
	if (!lo || lo > w->frame || len > PY_WINDOW)
		return py_frame_bytes(w, size, NULL);
	return py_window_read(w, lo, len, NULL);
}

/* The frames a step of a proof follows (py_prove_step). */
#define PY_PROVE_BATCH 4

/* A step of a proof (py_proved): up to PY_PROVE_BATCH frames from
 * w->frame, of the current thread's walk in py_walk_scratch, hashed,
 * nothing written: 0 where the frames go on.  Its state is kept in
 * registers across its frames: the window read again only for a frame
 * outside it, a few words a frame, no map looked up.  A global function,
 * so that the verifier checks its frames once, not for each state its
 * bpf_loop callback is entered with (four times the switch hook's
 * verification). */
__noinline long py_prove_frames(void)
{
	__u32 size, code_off, instr_off, entry_off, prev_off, j, steps, zero = 0;
	__u64 h, frame, lo, len;
	struct py_walk *w;

	w = bpf_map_lookup_elem(&py_walk_scratch, &zero);
	if (!w)
		return 1;
	size = py_frame_size(w);
	code_off = w->p.f_code;
	instr_off = w->p.f_instr;
	entry_off = w->p.f_entry;
	prev_off = w->p.f_previous & (PY_READ_MAX - 1);
	h = w->hash;
	steps = w->steps;
	frame = w->frame;
	lo = w->win_lo;
	len = w->win_len;
	for (j = 0; j < PY_PROVE_BATCH && frame; j++) {
		__u32 at;

		if (len && frame >= lo && frame + size > frame && frame + size <= lo + len) {
			at = frame - lo;
		} else {
			w->frame = frame;
			if (py_proof_window(w, size))
				break;
			lo = w->win_lo;
			len = w->win_len;
			at = w->at;
		}
		at &= PY_WINDOW - 1;
		h = py_mix_frame(h, frame, &w->buf[at], code_off, instr_off, entry_off);
		frame = *(__u64 *)&w->buf[at + prev_off];
		steps++;
	}
	w->frame = frame;
	w->hash = h;
	w->steps = steps;
	return j == PY_PROVE_BATCH && frame ? 0 : 1;
}

static long py_prove_step(__u32 i, void *arg)
{
	/* A callback's answer must be known to be 0 or 1. */
	return py_prove_frames() ? 1 : 0;
}

/*
 * Whether the current thread's walk kept in `k` holds (struct py_kept),
 * the interpreter's entry `p` being the one it was walked with: its thread
 * state read again, and its frames followed, hashed, not written.
 */
static __always_inline bool py_proved(struct py_ctx *c, struct py_proc *p, struct py_kept *k,
				      struct task_struct *task)
{
	struct py_walk *w = c->w;
	__u64 *v = (__u64 *)w->buf;

	w->p = *p;
	v[1] = task_to_walk(task)->thread.fsbase;
	v[2] = k->state;
	if (!v[1] || !py_thread_state(w, v, NULL) || v[3] != v[1])
		return false;
	if (w->p.cframe_frame != 0xffff && v[4] &&
	    py_read(&v[4], 8, v[4] + w->p.cframe_frame, NULL))
		return false;
	if (v[4] != k->frame)
		return false;
	w->frame = v[4];
	w->win_len = 0;
	w->hint = k->low;
	w->steps = 0;
	w->hash = PY_HASH_SEED;
	bpf_loop(PY_MAX_FRAMES / PY_PROVE_BATCH, py_prove_step, NULL, 0);
	return !w->frame && w->steps == k->steps && w->hash == k->hash;
}

/* Keeps the walk just made of the current thread (in `w`), appended to
 * native stack `native` and stored as `id`, to be proved at its next
 * block from that native stack (py_proved): not a walk cut short, nor one
 * with a tag that could not be read, nor one whose stack was not stored
 * (the way of `native` is then let go). */
static __always_inline void py_keep(struct py_walk *w, struct task_struct *task, __u64 native,
				    __u64 id, __u64 mm)
{
	struct py_kept_set *set;
	struct py_kept *k;
	__u32 i;

	set = bpf_task_storage_get(&py_kept, task, 0, 0);
	if (w->frame || w->tagless || !(id & STACK_ID_HASH_BIT)) {
		/* The way of this native stack no longer holds. */
		if (set && set->way[0].native == native)
			set->way[0].native = 0;
		if (set && set->way[1].native == native)
			set->way[1].native = 0;
		return;
	}
	if (!set)
		set = bpf_task_storage_get(&py_kept, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!set)
		return;
	i = set->way[1].native == native ? 1 : set->way[0].native == native ? 0 : !set->last;
	set->last = i;
	k = &set->way[i & 1];
	k->native = native;
	k->id = id;
	k->mm = mm;
	k->tss = w->p.tss;
	k->state = w->state;
	k->frame = w->first;
	k->hash = w->hash;
	k->low = w->low;
	k->steps = w->steps;
	k->frames = w->frames;
	k->runtimes = runtime_build();
}

/*
 * The current task's user stack `id`, just walked (the task of process
 * `tgid`, at `now`, in address space `mm`: each 0 where the caller has not
 * read it), with its Python frames appended where its process has an
 * interpreter known: the id of that stack, stored, or `id` itself (no interpreter known, no Python frames
 * found, a stack that was not stored, or a copy for userspace to walk).
 * The native frames are those stored under `id` (the walk's, or the ones
 * the stack cache proved unchanged).  A global function, called from the
 * hook itself once the native walk has returned: a chain of calls under
 * the walk's would pass 6.1's bound of 512 bytes of stack.
 */
__noinline __u64 python_stack_of_current(__u64 id, __u32 tgid, __u64 now, __u64 mm)
{
	struct task_struct *task;
	__u64 pid_tgid, with;
	__u32 zero = 0, idx, nr;
	struct py_kept_set *set;
	struct py_kept *k = NULL;
	struct py_proc *p;
	struct py_ctx c = {};
	struct py_walk *w;

	w = bpf_map_lookup_elem(&py_walk_scratch, &zero);
	if (!w)
		return id;
	w->rest_until = 0;
	/* Its pid's bit first: a load, where other processes stop. */
	if (!(id & STACK_ID_HASH_BIT) || !python_pid(tgid))
		return id;
	pid_tgid = bpf_get_current_pid_tgid();
	if (!python_pid(pid_tgid >> 32))
		return id;
	tgid = pid_tgid >> 32;
	p = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!p)
		return id;
	if (!now)
		now = bpf_ktime_get_ns();
	if (py_resting(p->resting_until, now)) {
		count(CNT_PY_NO_THREAD_STATE);
		w->rest_until = p->resting_until;
		return id;
	}
	task = bpf_get_current_task_btf();
	if (!mm)
		mm = (__u64)BPF_CORE_READ(task, mm);
	/* The thread's last walk from this native stack, where it holds. */
	set = bpf_task_storage_get(&py_kept, task, 0, 0);
	if (set) {
		if (set->way[0].native == id)
			k = &set->way[0];
		else if (set->way[1].native == id)
			k = &set->way[1];
	}
	c.w = w;
	if (k && k->mm == mm && p->mm == mm && k->tss == p->tss &&
	    k->runtimes == runtime_build() && py_proved(&c, p, k, task)) {
		set->last = k == &set->way[1];
		count(CNT_PY_STACKS);
		count(CNT_PY_PROVED);
		count_n(CNT_PY_FRAMES, k->frames);
		return k->id;
	}
	c.ips = bpf_map_lookup_elem(&scratch, &zero);
	if (!c.ips || !stored_frames_into(id, c.ips))
		return id;
	for (nr = 0; nr < MAX_STACK_DEPTH; nr++)
		if (!c.ips[nr])
			break;
	/* The length through memory, read back as a number the verifier
	 * does not know: what follows is checked once, not once for each
	 * length the loop can end at (a quarter of the switch hook's
	 * verification). */
	w->nr = nr;
	nr = *(volatile __u32 *)&w->nr;
	if (!py_begin(w, task, pid_tgid >> 32, (__u32)pid_tgid, mm, NULL)) {
		if (py_resting(p->resting_until, bpf_ktime_get_ns()))
			w->rest_until = p->resting_until;
		return id;
	}
	if (nr >= MAX_STACK_DEPTH - 1) {
		/* No room left by the native frames. */
		count(CNT_PY_TRUNCATED);
		return id;
	}
	w->nr = nr;
	w->base = nr;
	w->max = clamp_stack_bytes() / sizeof(__u64);
	bpf_loop(PY_MAX_FRAMES, py_step_current, NULL, 0);
	py_finish(&c);
	if (w->nr == nr)
		return id;
	idx = w->nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		c.ips[idx & MAX_STACK_DEPTH] = 0;
	}
	/* Where it cannot be stored, the native stack stays. */
	with = store_stack(w->nr * sizeof(__u64), true);
	py_keep(w, task, id, with, mm);
	return (with & STACK_ID_HASH_BIT) ? with : id;
}

/*
 * The user stack `id` of the current thread `d`, of process `tgid`, being
 * switched out at `now`, in address space `mm`: with its Python frames
 * (python_stack_of_current).
 * A thread whose process was found without an interpreter running is left
 * alone as long as the process is (PY_REST), without a lookup of the
 * process: the switches of a program that links libpython without starting
 * it pay a load.
 */
static __always_inline __u64 python_stack_at_switch_out(struct task_data *d, __u64 id,
							__u32 tgid, __u64 now, __u64 mm)
{
	struct py_walk *w;
	__u32 zero = 0;

	if (!python_pid(tgid))
		return id;
	if (py_resting(d->py_rest_until, now)) {
		if (id & STACK_ID_HASH_BIT)
			count(CNT_PY_NO_THREAD_STATE);
		return id;
	}
	id = python_stack_of_current(id, tgid, now, mm);
	w = bpf_map_lookup_elem(&py_walk_scratch, &zero);
	if (w)
		d->py_rest_until = w->rest_until;
	return id;
}

/* Whether frames `f`, up to `n` of them, have Python frames. */
static __always_inline bool py_marked(const __u64 *f, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		if (!f[i])
			return false;
		if (f[i] >> 48 == PY_FRAME_MARK >> 48)
			return true;
	}
	return false;
}

/* Whether stored stack `id` has Python frames (in its length's table, see
 * STACK_SHORT_DEPTH, or in the spill table). */
static __always_inline bool has_python_frames(__u64 id)
{
	__u64 *f;

	if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_SHORT) {
		f = bpf_map_lookup_elem(&stacks_short, &id);
		if (f)
			return py_marked(f, STACK_SHORT_DEPTH);
	} else if ((id & STACK_ID_CLASS_MASK) == STACK_ID_CLASS_MID) {
		f = bpf_map_lookup_elem(&stacks_mid, &id);
		if (f)
			return py_marked(f, STACK_MID_DEPTH);
	} else {
		f = bpf_map_lookup_elem(&stacks, &id);
		if (f)
			return py_marked(f, MAX_STACK_DEPTH);
	}
	f = bpf_map_lookup_elem(&stacks_spill, &id);
	return f && py_marked(f, MAX_STACK_DEPTH);
}

/*
 * Appends the Python frames of `task`, a thread of process `tgid` other
 * than the current task, to its user stack in `start_scratch` (`nr` words
 * so far); returns the stack's new length in words.  Only from the
 * sleepable iterators, which can read another task's memory.
 */
static __always_inline __u32 python_frames_of_task(struct task_struct *task, __u32 tgid, __u32 nr)
{
	__u64 exec_vm, mm = address_space(task, &exec_vm);
	__u32 zero = 0, idx;
	struct py_ctx c = {};
	struct py_walk *w;

	if (!python_on || nr >= MAX_STACK_DEPTH)
		return nr;
	w = bpf_map_lookup_elem(&py_walk_task, &zero);
	c.ips = bpf_map_lookup_elem(&start_scratch, &zero);
	if (!w || !c.ips)
		return nr;
	c.w = w;
	c.task = task;
	if (!py_begin(w, task, tgid, BPF_CORE_READ(task, pid), mm, task))
		return nr;
	w->nr = nr;
	w->base = nr;
	w->max = clamp_stack_bytes() / sizeof(__u64);
	bpf_loop(PY_MAX_FRAMES, py_step_task, &c, 0);
	py_finish(&c);
	idx = w->nr;
	if (idx < MAX_STACK_DEPTH) {
		asm volatile("" : "+r"(idx));
		c.ips[idx & MAX_STACK_DEPTH] = 0;
	}
	return w->nr;
}


#endif /* __OFFCPUTIME_PYTHON_H__ */
