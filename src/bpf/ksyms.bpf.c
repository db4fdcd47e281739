// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Kernel symbols for userspace without reading /proc/kallsyms (formatting
 * its 120,000 lines takes the kernel 30 to 50 ms, and keeping them takes
 * megabytes), both ways: syscall programs run with BPF_PROG_TEST_RUN over
 * a batch.
 * - lookup_ksyms: addresses by name (bpf_kallsyms_lookup_name, Linux 5.16),
 *   the addresses the kernel stack walk is configured with before the
 *   profiler's object loads; a name "module:symbol" is looked up in that
 *   module. The helper says -EPERM where kallsyms would show the caller
 *   zeros.
 * - name_ksyms: names of the kernel frames in the report, as the kernel
 *   prints a symbol ("%pS" through bpf_snprintf, Linux 5.14):
 *   "name+0xoffset/0xsize [module]", or "0x..." where no symbol covers the
 *   address. The kernel's own lookup, so the same symbol as kallsyms.
 * Each is loaded alone (the other's autoload off): naming needs only 5.14.
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

/* The addresses to name (kaddr_count of them) and what the kernel printed
 * for each: its length with the NUL (more than KSYM_TEXT_BYTES: cut
 * short), or the helper's error. */
__u64 kaddr_in[KSYM_BATCH] = {};
__u32 kaddr_count = 0;
char kaddr_text[KSYM_BATCH][KSYM_TEXT_BYTES] = {};
__s64 kaddr_lens[KSYM_BATCH] = {};

static const char symbol_fmt[] = "%pS";

SEC("syscall")
int name_ksyms(void *ctx)
{
	for (__u32 i = 0; i < KSYM_BATCH; i++) {
		__u64 addr = kaddr_in[i];

		if (i >= kaddr_count)
			break;
		kaddr_lens[i] = bpf_snprintf(kaddr_text[i], KSYM_TEXT_BYTES,
					     symbol_fmt, &addr, sizeof(addr));
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
