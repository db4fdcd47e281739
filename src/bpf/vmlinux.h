/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Minimal kernel type definitions for offcputime.bpf.c.
 *
 * Why not a full bpftool-generated vmlinux.h?  The program touches only a
 * handful of kernel types and fields.  Declaring just those keeps the
 * repository small and reviewable, and every struct below is marked
 * preserve_access_index, so libbpf relocates each field access against the
 * running kernel's BTF at load time (CO-RE): the offsets written here do not
 * need to match any particular kernel, only the field names and types do.
 * A field renamed between kernels (task_struct::state became __state in
 * 5.14) is found from its neighbour's relocated offset and size rather than
 * through a "flavor" struct: a flavor is one more type to relocate (see
 * the types declared after the relocated region).
 *
 * Constants are the stable UAPI values from <linux/bpf.h>.
 */
#ifndef __OFFCPUTIME_VMLINUX_H__
#define __OFFCPUTIME_VMLINUX_H__
/* Tells bpf_tracing.h to use the kernel's pt_regs field names. */
#define __VMLINUX_H__

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;
typedef int pid_t;
typedef _Bool bool;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PROG_ARRAY = 3,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_NO_PREALLOC = 1,
};

enum {
	BPF_F_USER_STACK = 256,
};

enum {
	BPF_LOCAL_STORAGE_GET_F_CREATE = 1,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)


/* exec_vm: pages of executable, non-writable mappings (VM_EXEC). */
struct rw_semaphore {
	struct {
		long counter;
	} count;
} __attribute__((preserve_access_index));

/* The tree of a process's mappings (6.1 on): ma_root is its root node,
 * tagged with the node's type (see vma_of() in offcputime.bpf.c). */
struct maple_tree {
	unsigned int ma_flags;
	void *ma_root;
};

/* x86-64: where the vDSO is mapped. */
typedef struct {
	void *vdso;
} mm_context_t;

struct mm_struct {
	unsigned long exec_vm;
	unsigned long start_code;
	unsigned long start_stack;
	struct rw_semaphore mmap_lock;
	struct maple_tree mm_mt;
	mm_context_t context;
} __attribute__((preserve_access_index));

struct super_block {
	/* The kernel's encoding: major << 20 | minor. */
	unsigned int s_dev;
};

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
	long long i_size;
};

struct file {
	struct inode *f_inode;
};

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	struct mm_struct *vm_mm;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file *vm_file;
};

typedef struct {
	int counter;
} atomic_t;

/* live: threads of the process that have not exited yet. */
struct signal_struct {
	atomic_t live;
};

struct sched_entity {
	u64 sum_exec_runtime;
	/* sum_exec_runtime when the task was last picked to run (CFS). */
	u64 prev_sum_exec_runtime;
};

/* Kept with CONFIG_SCHED_INFO (delay accounting, schedstats). */
struct sched_info {
	/* When the task was last switched in (rq clock, ns). */
	unsigned long long last_arrival;
};

/* First in task_struct on x86 (CONFIG_THREAD_INFO_IN_TASK); its size
 * differs between kernels. */
struct thread_info {
	unsigned long flags;
};

/* x86-64: the user thread pointer (the fs base), saved at each switch and
 * set by arch_prctl(ARCH_SET_FS). */
struct thread_struct {
	unsigned long fsbase;
	/* The kernel stack pointer of a task switched out: its struct
	 * inactive_task_frame. */
	unsigned long sp;
};

/* A kernfs node: a cgroup's directory; its id is the inode number userspace
 * sees (on 64-bit) and bpf_get_current_cgroup_id() returns. */
struct kernfs_node {
	u64 id;
};

/* The part of a cgroup its controllers share: `parent` is the parent
 * cgroup's own `self`. */
struct cgroup_subsys_state {
	struct cgroup_subsys_state *parent;
};

/* `self` is the first member: a cgroup_subsys_state pointer to a cgroup's
 * `self` is a pointer to the cgroup. */
struct cgroup {
	struct cgroup_subsys_state self;
	struct kernfs_node *kn;
};

/* The cgroups of a task: dfl_cgrp is its cgroup in the v2 hierarchy. */
struct css_set {
	struct cgroup *dfl_cgrp;
};

struct task_struct {
	struct thread_info thread_info;
	unsigned int __state;
	unsigned int policy;
	struct sched_entity se;
	struct sched_info sched_info;
	unsigned int flags;
	/* 1 while the task runs on a CPU (from the switch to it until the
	 * switch away from it is finished). */
	int on_cpu;
	int exit_state;
	struct mm_struct *mm;
	pid_t pid;
	pid_t tgid;
	/* Boot-based start time (ns): with the pid, it tells a process from
	 * a later one that reuses its pid. */
	__u64 start_boottime;
	struct task_struct *group_leader;
	char comm[16];
	struct signal_struct *signal;
	/* Queued on a run queue (1), being migrated (2), or not (0). */
	int on_rq;
	/* Set while the task sleeps waiting for I/O (io_schedule()). */
	unsigned int in_iowait:1;
	struct thread_struct thread;
	struct css_set *cgroups;
	/* The base of its kernel stack. */
	void *stack;
	/* Its switches out, voluntary and not. */
	unsigned long nvcsw;
	unsigned long nivcsw;
};


#pragma clang attribute pop

/*
 * Not relocated: each type relocated above costs libbpf a search of the
 * running kernel's whole BTF at load (about 1.5 ms of start-up each), and
 * these layouts are fixed.
 *
 * The user registers saved at kernel entry (bpf_task_pt_regs): x86-64's
 * layout is the ptrace ABI's (struct user_regs_struct has the same
 * fields in the same order).
 */
struct pt_regs {
	long unsigned int r15;
	long unsigned int r14;
	long unsigned int r13;
	long unsigned int r12;
	long unsigned int bp;
	long unsigned int bx;
	long unsigned int r11;
	long unsigned int r10;
	long unsigned int r9;
	long unsigned int r8;
	long unsigned int ax;
	long unsigned int cx;
	long unsigned int dx;
	long unsigned int si;
	long unsigned int di;
	long unsigned int orig_ax;
	long unsigned int ip;
	long unsigned int cs;
	long unsigned int flags;
	long unsigned int sp;
	long unsigned int ss;
};

/* The context of task iterators: the verifier checks these two fields at
 * these offsets, which have not changed since task iterators came (5.8). */
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
	__u64 session_id;
	__u64 seq_num;
};

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
};


#endif /* __OFFCPUTIME_VMLINUX_H__ */
