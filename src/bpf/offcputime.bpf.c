// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * offcputime: time threads spend switched out, by user and kernel stack.
 *
 * At switch-out the blocking thread's start time and, for the sched_switch
 * hooks, its stacks are kept per task: the user stack can only be read in
 * the thread's own context, and the kernel stack must be walked there too,
 * since bpf_get_task_stack() on a sleeping task leaves out every function in
 * .sched.text (schedule_timeout, do_nanosleep, __mutex_lock, ...).  The
 * profiler's own frames on top of it are dropped in userspace.  At
 * switch-in the blocked time is known, and the block is added to `counts`
 * if it passes the -m/-M filters.  On finish_task_switch, which runs in the
 * context of the task switched in, both stacks are taken only then, and only
 * for blocks that pass.
 *
 * Stacks live in `stacks`, keyed by a 64-bit hash of their frames: no 32-bit
 * bucket index that two different stacks can share, so a stack is never
 * dropped or merged by a hash collision, only when the map is full.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "offcputime.h"

#define PF_KTHREAD 0x00200000
#define TASK_INTERRUPTIBLE 0x00000001
#define TASK_UNINTERRUPTIBLE 0x00000002
#define TASK_STOPPED_OR_TRACED 0x0000000c
#define TASK_PARKED 0x00000040
#define TASK_DEAD 0x00000080
#define TASK_WAKING 0x00000200
#define TASK_NEW 0x00000800
#define RWSEM_WRITER_LOCKED 1
#define RWSEM_FLAG_WAITERS 2
#define SCHED_NORMAL 0
#define SCHED_BATCH 3
#define SCHED_IDLE 5
#define EFAULT 14
#define E2BIG 7
#define ENOMEM 12
#define EEXIST 17
#define BPF_F_MMAPABLE 1024

/*
 * The parts of the program, each using only those before it.  The programs
 * for kernels without bpf_loop (before 5.17; `legacy`) are at the end of
 * switch.h, wakers.h and iter.h.
 */
#include "settings.h"
#include "variant.h"
#include "maps.h"
#include "stacks.h"
#include "runtime.h"
#include "dwarf.h"
#include "stack_cache.h"
#include "deferred.h"
#include "python.h"
#include "runtimes.h"
#include "current_stack.h"
#include "task.h"
#include "kstack.h"
#include "notify.h"
#include "timeline.h"
#include "blocks.h"
#include "oncpu.h"
#include "switch.h"
#include "chains.h"
#include "wakers.h"
#include "iter.h"
#include "snapshot.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
