/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * --chains: the disk a wake-up from an I/O completion came from.  The
 * switch hooks' part of --chains (every thread's blocks recorded, those
 * the filters keep marked BLOCK_PROFILED) is chains_on in settings.h and
 * its checks in switch.h, iter.h, blocks.h and timeline.h.
 */
#ifndef __OFFCPUTIME_CHAINS_H__
#define __OFFCPUTIME_CHAINS_H__

/* The request last completed on this CPU: its disk, and when. */
struct disk_done {
	__u64 at;
	__u32 dev;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct disk_done);
} disk_done SEC(".maps");

/* A wake-up this soon after a completion on its CPU may be that
 * completion's: the request ends (block_rq_complete), then its bios,
 * whose end wakes the waiter, all in one call. */
#define DISK_DONE_NS 200000ULL

/* Where the kernel keeps a request's disk: rq->q->disk (5.15 on), before
 * that rq->rq_disk.  The fields read, as CO-RE finds them in the running
 * kernel's types. */
struct gendisk___oc {
	int major;
	int first_minor;
} __attribute__((preserve_access_index));

struct request_queue___oc {
	struct gendisk___oc *disk;
} __attribute__((preserve_access_index));

struct request___oc {
	struct request_queue___oc *q;
	struct gendisk___oc *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk___oc *disk_of_request(struct request___oc *rq)
{
	struct request_queue___oc *q;

	if (bpf_core_field_exists(rq->rq_disk))
		return BPF_CORE_READ(rq, rq_disk);
	q = BPF_CORE_READ(rq, q);
	if (q && bpf_core_field_exists(q->disk))
		return BPF_CORE_READ(q, disk);
	return NULL;
}

/* A request is done (block_rq_complete, where it runs: in the interrupt
 * or the softirq of its completion): its disk noted on this CPU. */
SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete, void *rq)
{
	struct gendisk___oc *disk = disk_of_request(rq);
	struct disk_done *done;
	__u32 zero = 0;

	if (!disk)
		return 0;
	done = bpf_map_lookup_elem(&disk_done, &zero);
	if (!done)
		return 0;
	done->dev = (__u32)BPF_CORE_READ(disk, major) << 20 |
		    ((__u32)BPF_CORE_READ(disk, first_minor) & 0xfffff);
	done->at = bpf_ktime_get_ns();
	return 0;
}

/* The disk (MKDEV(major, minor) as the kernel packs it) of the request
 * completed on this CPU just before a wake-up from an interrupt at `now`,
 * or 0.  Userspace names the disk only where the wake-up's frames are a
 * block I/O completion's. */
static __noinline __u32 disk_just_done(__u64 now)
{
	struct disk_done *done;
	__u32 zero = 0;

	if (!chains_on)
		return 0;
	done = bpf_map_lookup_elem(&disk_done, &zero);
	if (!done || !done->at || now < done->at || now - done->at > DISK_DONE_NS)
		return 0;
	return done->dev;
}

#endif /* __OFFCPUTIME_CHAINS_H__ */
