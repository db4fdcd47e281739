//! What the running kernel's BPF offers, probed before the program loads.

use libbpf_rs::libbpf_sys;
use libbpf_rs::ProgramType;

use crate::ksyms::{KernelOrc, PrintedSym};

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

/// The highest pid the kernel gives, plus one (`kernel.pid_max`); where it
/// cannot be read, the most it can be (2^22, 64-bit kernels' limit).
pub fn pid_max() -> u32 {
    const LIMIT: u32 = 1 << 22;
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(LIMIT, |n| n.clamp(1, LIMIT))
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

/// Errs with `why` where syscall programs cannot call `helper`. Probed
/// before loading: libbpf would say a failed load on stderr. (The program
/// type first: where the kernel lacks it (before 5.14), the helper's probe
/// takes the helper as there.)
fn syscall_helper(helper: u32, why: &'static str) -> anyhow::Result<()> {
    let syscall = ProgramType::Syscall;
    if !matches!(syscall.is_supported(), Ok(true))
        || !matches!(syscall.is_helper_supported(helper), Ok(true))
    {
        anyhow::bail!(why);
    }
    Ok(())
}

/// The programs of `src/bpf/ksyms.bpf.c`, each loaded alone (each needs a
/// helper of its own kernel release).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ksyms {
    /// `lookup_ksyms`: addresses by name.
    Lookup,
    /// `name_ksyms`: names of addresses.
    Name,
}

/// The object of `ksyms.bpf.c` with only `which` of its programs loaded,
/// in `object`. Nothing is said when it does not load (an older kernel):
/// kallsyms is read instead.
fn load_ksyms(
    object: &mut std::mem::MaybeUninit<libbpf_rs::OpenObject>,
    which: Ksyms,
) -> anyhow::Result<crate::ksyms_bpf::KsymsSkel<'_>> {
    use anyhow::Context;
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    let mut open = crate::ksyms_bpf::KsymsSkelBuilder::default()
        .open(object)
        .context("failed to open the kernel's symbol programs")?;
    open.progs.lookup_ksyms.set_autoload(which == Ksyms::Lookup);
    open.progs.name_ksyms.set_autoload(which == Ksyms::Name);
    open.progs.lookup_ksyms.set_log_level(0);
    open.progs.name_ksyms.set_log_level(0);
    open.load()
        .context("failed to load the kernel's symbol programs")
}

/// Each name's address in the kernel (`MODULE:SYMBOL` in a module), None
/// where it has none; or None for all where the kernel hides addresses
/// from this process (as kallsyms would, with zeros). Errs where the
/// kernel has no lookup for BPF or this process may not load it.
pub fn lookup_symbols(names: &[String]) -> anyhow::Result<Option<Vec<Option<u64>>>> {
    use anyhow::Context;
    syscall_helper(
        libbpf_sys::BPF_FUNC_kallsyms_lookup_name,
        "this kernel has no symbol lookup for BPF (Linux 5.16)",
    )?;
    let mut object = std::mem::MaybeUninit::uninit();
    let mut skel = load_ksyms(&mut object, Ksyms::Lookup)?;
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

/// Names kernel addresses as the kernel prints a symbol (`%pS`), by a BPF
/// program run over them in batches (`src/bpf/ksyms.bpf.c`): the report's
/// kernel frames without reading `/proc/kallsyms` whole (30 to 50 ms of
/// the kernel's time, and megabytes to keep it). `None` where no symbol
/// covers an address. With no addresses, only says whether this kernel
/// can (Linux 5.14: syscall programs and `bpf_snprintf`), without loading
/// anything. Errs where it cannot, or this process may not: kallsyms is
/// read instead.
pub fn name_kernel_addresses(addrs: &[u64]) -> anyhow::Result<Vec<Option<PrintedSym>>> {
    use anyhow::Context;
    syscall_helper(
        libbpf_sys::BPF_FUNC_snprintf,
        "this kernel cannot name its symbols for BPF (Linux 5.14)",
    )?;
    if addrs.is_empty() {
        return Ok(Vec::new());
    }
    let mut object = std::mem::MaybeUninit::uninit();
    let mut skel = load_ksyms(&mut object, Ksyms::Name)?;
    let mut out = Vec::with_capacity(addrs.len());
    let batch_len = skel
        .maps
        .bss_data
        .as_deref()
        .map(|b| b.kaddr_in.len())
        .filter(|&n| n > 0)
        .context("the symbol naming has no room for addresses")?;
    for batch in addrs.chunks(batch_len) {
        {
            let bss = skel
                .maps
                .bss_data
                .as_deref_mut()
                .context("the symbol naming has no .bss")?;
            bss.kaddr_in[..batch.len()].copy_from_slice(batch);
            bss.kaddr_count = batch.len() as u32;
        }
        skel.progs
            .name_ksyms
            .test_run(libbpf_rs::ProgramInput::default())
            .context("failed to run the symbol naming")?;
        let bss = skel
            .maps
            .bss_data
            .as_deref()
            .context("the symbol naming has no .bss")?;
        for i in 0..batch.len() {
            // SAFETY: the mapped .bss, which the program has written.
            let (len, text) = unsafe {
                (
                    std::ptr::read_volatile(&bss.kaddr_lens[i]),
                    std::ptr::read_volatile(&bss.kaddr_text[i]),
                )
            };
            // An error, or a name cut short: not a wrong name, none.
            let whole = usize::try_from(len)
                .ok()
                .filter(|&n| (1..=text.len()).contains(&n));
            out.push(whole.and_then(|n| {
                let bytes: Vec<u8> = text[..n - 1].iter().map(|&c| c as u8).collect();
                PrintedSym::parse(std::str::from_utf8(&bytes).ok()?)
            }));
        }
    }
    Ok(out)
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

    /// The kernel names its symbols as kallsyms has them: the same
    /// function, offset and module for addresses all over the kernel image
    /// and its modules, each at a few offsets into its function.
    #[test]
    fn the_kernel_names_its_symbols_as_kallsyms_has_them() {
        let table = crate::ksyms::KernelSymbols::load().unwrap();
        let ci = std::env::var("CI").as_deref() == Ok("true");
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        // Functions' addresses, and whether each is a module's.
        let mut starts: Vec<(u64, bool)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                matches!(f.next()?, "t" | "T").then_some(())?;
                let module = f.nth(1).is_some_and(|m| !m.starts_with("[__builtin__"));
                Some((addr, module))
            })
            .filter(|&(a, _)| a != 0)
            .collect();
        if starts.len() < 1000 || name_kernel_addresses(&[]).is_err() {
            let why = "kallsyms shows no addresses, or this kernel cannot name them (run as root on 5.14 or later)";
            assert!(!ci, "{why}");
            println!("skipped: {why}");
            return;
        }
        starts.sort_unstable();
        let in_modules = starts.iter().filter(|s| s.1).count();
        let step = (starts.len() / 1000).max(1);
        let mut addrs = Vec::new();
        // About 1000 functions over all, and up to 200 modules' besides.
        let module_step = (in_modules / 200).max(1);
        let sampled = (0..starts.len()).step_by(step).chain(
            (0..starts.len())
                .filter(|&i| starts[i].1)
                .step_by(module_step),
        );
        for i in sampled {
            let start = starts[i].0;
            let next = starts.get(i + 1).map_or(start + 1, |n| n.0);
            for off in [0, 1, 0x13] {
                if start + off < next {
                    addrs.push(start + off);
                }
            }
        }
        let named = name_kernel_addresses(&addrs).unwrap();
        assert_eq!(named.len(), addrs.len());
        let (mut agreed, mut modules) = (0, 0);
        for (&addr, ours) in addrs.iter().zip(&named) {
            let Some(theirs) = table.resolve(addr) else {
                continue;
            };
            // The kernel does not look its ftrace and kprobe trampolines
            // up by address (kallsyms lists them apart): the symbolizer
            // reads kallsyms for those.
            let Some(ours) = ours else {
                assert!(
                    theirs.module.is_some_and(|m| m.starts_with("__builtin__")),
                    "{addr:#x}: not named, kallsyms has {theirs:?}"
                );
                continue;
            };
            assert_eq!(
                (ours.name.as_str(), ours.offset, ours.module.as_deref()),
                (theirs.name, theirs.offset, theirs.module),
                "{addr:#x}"
            );
            assert!(ours.size > ours.offset, "{addr:#x}: {ours:?}");
            agreed += 1;
            modules += usize::from(ours.module.is_some());
        }
        assert!(agreed > 2000, "{agreed} of {} compared", addrs.len());
        assert!(
            modules >= in_modules.min(100),
            "{modules} in modules, of {in_modules}"
        );
        println!("{agreed} addresses named alike, {modules} in modules ({in_modules} modules' functions)");
        // Outside every symbol: nothing.
        assert_eq!(name_kernel_addresses(&[1]).unwrap(), [None]);
    }

    #[test]
    fn reads_versions_from_releases() {
        assert_eq!(version_of("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(version_of("5.10.0-33-cloud-amd64"), Some((5, 10)));
        assert_eq!(version_of("6.1"), Some((6, 1)));
        assert_eq!(version_of("(unknown)"), None);
        assert_eq!(version_of("6"), None);
    }
}
