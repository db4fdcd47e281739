/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The kernel variants of the programs.  Each program passes one constant,
 * its variant, to the handler it runs (on_switch_out, start_task, ...), and
 * the compiler keeps only the paths that variant takes.
 */
#ifndef __OFFCPUTIME_VARIANT_H__
#define __OFFCPUTIME_VARIANT_H__

/*
 * The task pointers are BTF pointers, read directly, and per-thread records
 * live in task-local storage.  Without it, tasks are read with probe reads
 * and the records live in the maps by thread id: the raw tracepoint and the
 * kprobe, the iterators that serve them (`*_by_tid`), and every program for
 * kernels before 5.11, whose tracing programs have no task storage.
 */
#define VARIANT_TRUSTED 1
/*
 * Runs after the switch, in the context of the task switched in (the
 * finish_task_switch kprobe): that task's stacks are the current ones, and
 * those of the task switched out are not taken.
 */
#define VARIANT_AFTER_SWITCH 2
/* A sleepable iterator: it reads other tasks' user stacks (5.18). */
#define VARIANT_USER_STACKS 4
/*
 * Built from what Linux 5.10 has: no bpf_loop (user stacks walked with
 * frame pointers), no atomic exchange (see swap_u64).
 */
#define VARIANT_LEGACY 8

#define VARIANT_BY_TID 0

/* The hooks. */
#define HOOK_TP_BTF VARIANT_TRUSTED
/* tp_btf before 5.11: BTF pointers, but no task storage for tracing. */
#define HOOK_TP_BTF_LEGACY (VARIANT_BY_TID | VARIANT_LEGACY)
#define HOOK_RAW_TP VARIANT_BY_TID
#define HOOK_KPROBE (VARIANT_BY_TID | VARIANT_AFTER_SWITCH)

#endif /* __OFFCPUTIME_VARIANT_H__ */
