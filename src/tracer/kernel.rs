//! What the running kernel's BPF offers, probed before the program loads.

use libbpf_rs::libbpf_sys;
use libbpf_rs::ProgramType;

use crate::ksyms::KernelOrc;

/// Whether the kernel lacks `bpf_loop` (Linux 5.17), which the DWARF
/// unwinder and the default programs need: the programs built for older
/// kernels (`legacy` in the BPF program, down to 5.10) are loaded instead.
/// (Tests ask for those on any kernel: `TestEnv::legacy`.)
pub fn lacks_bpf_loop() -> bool {
    // A probe that cannot run (no permission to load) answers as a kernel
    // that has it: loading then says what is wrong.
    matches!(
        ProgramType::RawTracepoint.is_helper_supported(libbpf_sys::BPF_FUNC_loop),
        Ok(false)
    )
}

/// Where the kernel stack walk reads the kernel's ORC tables (see
/// [`KernelOrc`]): looked up by name by a BPF program from Linux 6.2, else
/// read from `/proc/kallsyms` (about 50 ms of the kernel's time to write).
/// The lookup's helper came in 5.16, but before 6.2 the kernel looks a
/// name up by going through all its symbols, a module's after them: a
/// pass per module, slower than reading kallsyms once.
pub fn kernel_orc() -> Option<KernelOrc> {
    if version().is_none_or(|v| v < (6, 2)) {
        return KernelOrc::load();
    }
    match KernelOrc::looked_up(lookup_symbols) {
        Ok(orc) => orc,
        Err(_) => KernelOrc::load(),
    }
}

/// Each name's address in the kernel (`MODULE:SYMBOL` in a module), None
/// where it has none; or None for all where the kernel hides addresses
/// from this process (as kallsyms would, with zeros). Errs where the
/// kernel has no lookup for BPF or this process may not load it.
pub fn lookup_symbols(names: &[String]) -> anyhow::Result<Option<Vec<Option<u64>>>> {
    use crate::ksyms_bpf::KsymsSkelBuilder;
    use anyhow::Context;
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    // Probed first: libbpf would say a failed load on stderr. (The
    // program type first: where the kernel lacks it (before 5.14), the
    // helper's probe takes the helper as there.)
    let syscall = ProgramType::Syscall;
    let helper = libbpf_sys::BPF_FUNC_kallsyms_lookup_name;
    if !matches!(syscall.is_supported(), Ok(true))
        || !matches!(syscall.is_helper_supported(helper), Ok(true))
    {
        anyhow::bail!("this kernel has no symbol lookup for BPF (Linux 5.16)");
    }
    let mut object = std::mem::MaybeUninit::uninit();
    let mut open = KsymsSkelBuilder::default()
        .open(&mut object)
        .context("failed to open the symbol lookup")?;
    // Nothing to report when it does not load (an older kernel): kallsyms
    // is read instead.
    open.progs.lookup_ksyms.set_log_level(0);
    let mut skel = open.load().context("failed to load the symbol lookup")?;
    let mut out = Vec::with_capacity(names.len());
    let batch_len = skel
        .maps
        .bss_data
        .as_deref()
        .map(|b| b.ksym_lens.len())
        .filter(|&n| n > 0)
        .context("the symbol lookup has no room for names")?;
    for batch in names.chunks(batch_len) {
        {
            let bss = skel
                .maps
                .bss_data
                .as_deref_mut()
                .context("the symbol lookup has no .bss")?;
            bss.ksym_lens = [0; _];
            for (i, name) in batch.iter().enumerate() {
                let room = &mut bss.ksym_names[i];
                // With its NUL; a name too long for the room is not found.
                if name.len() < room.len() && !name.as_bytes().contains(&0) {
                    room.fill(0);
                    for (r, &b) in room.iter_mut().zip(name.as_bytes()) {
                        *r = b as _;
                    }
                    bss.ksym_lens[i] = name.len() as u32 + 1;
                }
            }
        }
        skel.progs
            .lookup_ksyms
            .test_run(libbpf_rs::ProgramInput::default())
            .context("failed to run the symbol lookup")?;
        let bss = skel
            .maps
            .bss_data
            .as_deref()
            .context("the symbol lookup has no .bss")?;
        for i in 0..batch.len() {
            // SAFETY: the mapped .bss, which the program has written.
            let (addr, err) = unsafe {
                (
                    std::ptr::read_volatile(&bss.ksym_addrs[i]),
                    std::ptr::read_volatile(&bss.ksym_errors[i]),
                )
            };
            if err == -i64::from(libc::EPERM) {
                return Ok(None);
            }
            out.push((err == 0 && addr != 0).then_some(addr));
        }
    }
    Ok(Some(out))
}

/// The kernel's release, as `uname -r` prints it.
pub fn release() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return "(unknown)".into();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The kernel's version, major and minor, from its release: None where
/// the release does not start with them.
pub fn version() -> Option<(u32, u32)> {
    version_of(&release())
}

fn version_of(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether a hash map's elements can be allocated as they are added in
/// any context, a context switch's included (the BPF memory allocator,
/// Linux 6.1): hash maps grow with use there. Before, a tracing program's
/// hash map allocating at run time could take a lock the scheduler holds,
/// and an `--on-cpu` perf-event program cannot have one at all: they are
/// allocated whole at load.
pub fn hash_maps_grow() -> bool {
    version().is_some_and(|v| v >= (6, 1))
}

/// The oldest kernel's BPF the programs can run on (Linux 5.10): the ring
/// buffer (5.8), task iterators (5.8) and `bpf_get_task_stack` (5.9). An
/// older kernel gets one line that names it and what it lacks. Probes that
/// cannot run (no permission) pass: loading then says what is wrong.
pub fn check_minimum() -> anyhow::Result<()> {
    use libbpf_rs::MapType;
    let missing = if MapType::RingBuf.is_supported().is_ok_and(|ok| !ok) {
        Some("BPF ring buffer (Linux 5.8)")
    } else if ProgramType::RawTracepoint
        .is_helper_supported(libbpf_sys::BPF_FUNC_get_task_stack)
        .is_ok_and(|ok| !ok)
    {
        Some("bpf_get_task_stack (Linux 5.9)")
    } else {
        None
    };
    match missing {
        Some(what) => anyhow::bail!(
            "Linux {} is too old: offcputime needs Linux 5.10 or newer, and this kernel has \
             no {what}",
            release()
        ),
        None => Ok(()),
    }
}

/// Returns once every BPF program that was running has returned: hooks run
/// with preemption disabled, and a global membarrier waits for an RCU grace
/// period, after which no CPU can be inside one. Where the kernel refuses
/// it (nohz_full), a pause far longer than any hook.
pub fn wait_for_running_hooks() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let done = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) } == 0;
    if !done {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Checks, before loading anything, what the kernel and our privileges
/// allow, so that the user gets one clear sentence instead of a libbpf
/// error code.
pub fn check_environment() -> anyhow::Result<()> {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        anyhow::bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing); \
             offcputime needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    let cap_eff = crate::process::effective_capabilities();
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    // (With the privilege to load: without it every probe says no.)
    if has(CAP_SYS_ADMIN) {
        return check_minimum();
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| *n)
        .collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "missing privilege: {} (run as root, or grant {} to the binary)",
            missing.join(" and "),
            missing.join(", ").to_lowercase()
        );
    }
    check_minimum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_versions_from_releases() {
        assert_eq!(version_of("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(version_of("5.10.0-33-cloud-amd64"), Some((5, 10)));
        assert_eq!(version_of("6.1"), Some((6, 1)));
        assert_eq!(version_of("(unknown)"), None);
        assert_eq!(version_of("6"), None);
    }
}
