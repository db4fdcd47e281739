/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * What every language runtime's walker shares (its walker in a header of
 * its own, python.h; the hooks reach them only through runtimes.h): which
 * processes run a runtime whose frames are read, a bit per pid, and the
 * processes whose blocks under way are walked again once userspace has
 * noted their runtime (runtime_refresh, iter.h).  A process runs one
 * runtime at most; each runtime keeps its processes' entries in a map of
 * its own, keyed by the process (py_procs).
 */
#ifndef __OFFCPUTIME_RUNTIME_H__
#define __OFFCPUTIME_RUNTIME_H__

/* bpf_ringbuf_query(): the bytes not yet consumed (uapi bpf.h). */
#define BPF_RB_AVAIL_DATA 0

/* Set at load: whether any runtime's frames are read (--no-python leaves
 * Python's off). */
const volatile bool runtimes_on = false;

/* Set at load: which runtimes' walkers the build has.  --no-python,
 * --no-java and --no-node leave theirs off; where processes of some
 * runtimes run when tracing starts, the hooks load with those runtimes'
 * walkers only, and the build with every one loads later (see
 * runtimes_later). */
const volatile bool python_on = false;
const volatile bool java_on = false;
const volatile bool v8_on = false;

/* The build, as the stack cache marks the walks it keeps: a walk of one
 * build proves nothing to a build with another runtime's walker (a JVM's
 * frames).  A constant to the verifier. */
static __always_inline __u16 runtime_build(void)
{
	return (runtimes_on ? 1 : 0) | (python_on ? 2 : 0) | (java_on ? 4 : 0) | (v8_on ? 8 : 0);
}

/*
 * The hooks' runtime builds.  Where no runtime's process runs when tracing
 * starts, the hooks load without any runtime's walker (runtimes_on false,
 * so the verifier has none of their code to check) and with
 * runtimes_later set; the builds with the walkers load, in an object of
 * their own, the first time userspace notes a runtime's process, and go
 * into these arrays.  Each hook's first act is a tail call into its
 * runtime build: while the array is empty the call falls through and the
 * hook goes on as it is.  An array per hook: a tail call goes only to a
 * program of its caller's type and attach point.  (The runtime builds
 * have runtimes_later off: they call nothing.)
 */
const volatile bool runtimes_later = false;
/* In the runtime builds loaded later: the refresh walks again the blocks
 * claimed at the start too (walked by the start iterator without the
 * walkers). */
const volatile bool refresh_at_start = false;

#define RUNTIME_BUILD_ARRAY(name)                                              \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PROG_ARRAY);                         \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, __u32);                                          \
	} name SEC(".maps")

RUNTIME_BUILD_ARRAY(rt_build_switch);
RUNTIME_BUILD_ARRAY(rt_build_fork);
RUNTIME_BUILD_ARRAY(rt_build_waking);
RUNTIME_BUILD_ARRAY(rt_build_on_cpu);

/* A hook's first act (see runtimes_later): on into its runtime build, if
 * loaded. */
#define RUNTIME_BUILD(array)                                                   \
	do {                                                                   \
		if (runtimes_later)                                            \
			bpf_tail_call(ctx, &array, 0);                         \
	} while (0)

/* Set by userspace once it has written a process's entry for any runtime:
 * until then no stack pays for a lookup.  A global of a section of its
 * own, which userspace writes whole (no other variable shares it); read
 * with a load, not a helper call. */
volatile __u32 rt_any SEC(".data.runtimes") = 0;

/* The processes with an entry in a runtime's map, a bit each by pid
 * (pid_max is at most 2^22; userspace sizes it by pid_max at load): the
 * hooks test a bit, a load, before anything else, so that the switches of
 * other processes pay next to nothing while runtimes' processes run on the
 * machine. */
#define RT_PID_WORDS (1 << 16)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RT_PID_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} rt_pids SEC(".maps");

/* Whether process `tgid` may have an entry in a runtime's map (its bit is
 * set, or it has none: a pid past the pid_max the table was sized for, the
 * limit raised since, is looked up in the runtimes' maps). */
static __always_inline bool runtime_pid(__u32 tgid)
{
	__u32 word = tgid >> 6;
	__u64 *bits;

	if (!runtimes_on || !rt_any)
		return false;
	bits = bpf_map_lookup_elem(&rt_pids, &word);
	return !bits || (*bits & (1ULL << (tgid & 63)));
}

/* Sets the bit of pid `tgid` (a forked child's, its entry copied). */
static __always_inline bool runtime_pid_set(__u32 tgid)
{
	__u32 word = tgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&rt_pids, &word);

	if (!bits)
		return false;
	__sync_fetch_and_or(bits, 1ULL << (tgid & 63));
	return true;
}

/* The processes whose runtime userspace has just noted: their threads
 * blocked since before, walked without their runtime's frames, are walked
 * again by runtime_refresh. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} rt_refresh SEC(".maps");

/*
 * Tells userspace of code `code` (with `tag`) that a walk of thread `pid`
 * of process `tgid` (started at `start`, in address space `mm`) met: a
 * task event of kind `kind` followed by the code (struct py_code_event).
 * False where it was not told: the ring buffer, which carries news of
 * processes too and must not be crowded out, was half full or full
 * (counted in `lost`; what the code names is then read at the report).
 */
static __always_inline bool runtime_notice(__u32 kind, __u32 tgid, __u32 pid, __u64 start,
					   __u64 mm, __u64 code, __u32 tag, __u64 at, __u32 lost)
{
	struct py_code_event *ev;

	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > EVENTS_BYTES / 2) {
		count(lost);
		return false;
	}
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		count(lost);
		return false;
	}
	ev->e.tgid = tgid;
	ev->e.pid = pid;
	ev->e.kind = kind;
	ev->e.parent = 0;
	ev->e.map_start = 0;
	ev->e.map_count = 0;
	ev->e.process_start = start;
	ev->e.mm = mm;
	ev->e.exec_vm = 0;
	ev->code = code;
	ev->tag = tag;
	ev->_pad = 0;
	ev->at = at;
	bpf_ringbuf_submit(ev, 0);
	return true;
}

/* The runtimes' words this CPU told userspace of lately, by a hash of the
 * word and its process: a notice each the first time, and again only once
 * another took its slot. */
#define RT_SEEN_SLOTS 1024
struct rt_seen {
	__u64 word;
	__u32 tgid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RT_SEEN_SLOTS);
	__type(key, __u32);
	__type(value, struct rt_seen);
} rt_seen SEC(".maps");

/* Tells userspace of a runtime's frame word `word` of process `tgid`
 * (runtime_notice()'s event `kind`, with `at`: what else the frame says)
 * if this CPU has not told it of it lately: what it names is read while
 * the process runs. */
static __always_inline void runtime_notice_once(__u32 kind, __u32 tgid, __u32 pid, __u64 start,
						__u64 mm, __u64 word, __u64 at, __u32 lost)
{
	__u32 slot = (__u32)((word >> 3) ^ (word >> 19) ^ (word >> 40) ^ tgid) &
		     (RT_SEEN_SLOTS - 1);
	struct rt_seen *s = bpf_map_lookup_elem(&rt_seen, &slot);

	if (!s || (s->word == word && s->tgid == tgid))
		return;
	if (!runtime_notice(kind, tgid, pid, start, mm, word, 0, at, lost))
		return;
	s->word = word;
	s->tgid = tgid;
}

#endif /* __OFFCPUTIME_RUNTIME_H__ */
