// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Kernel symbols looked up by name for userspace, without reading
 * /proc/kallsyms (formatting its 120,000 lines takes the kernel about
 * 50 ms): the addresses the kernel stack walk is configured with before
 * the profiler's object loads. A syscall program (bpf_kallsyms_lookup_name,
 * Linux 5.16), run with BPF_PROG_TEST_RUN over a batch of names; a name
 * "module:symbol" is looked up in that module. The helper says -EPERM
 * where kallsyms would show the caller zeros.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "offcputime.h"

/* The batch: each name with its terminating NUL, its length with the NUL
 * (0: no name), and what the lookup gave (0 and the helper's error). */
char ksym_names[KSYM_BATCH][KSYM_NAME_BYTES] = {};
__u32 ksym_lens[KSYM_BATCH] = {};
__u64 ksym_addrs[KSYM_BATCH] = {};
__s64 ksym_errors[KSYM_BATCH] = {};

SEC("syscall")
int lookup_ksyms(void *ctx)
{
	for (__u32 i = 0; i < KSYM_BATCH; i++) {
		__u32 len = ksym_lens[i];
		__u64 addr = 0;

		if (len < 2 || len > KSYM_NAME_BYTES) {
			ksym_addrs[i] = 0;
			ksym_errors[i] = 0;
			continue;
		}
		ksym_errors[i] = bpf_kallsyms_lookup_name(ksym_names[i], len, 0, &addr);
		ksym_addrs[i] = addr;
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
