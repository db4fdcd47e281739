//! `--on-cpu`: a `cpu-clock` perf event on every online CPU, counting
//! every task (not the idle ones), whose overflow at each period runs the
//! BPF program's sampler.

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// `perf_event_attr.exclude_idle`: no samples of the idle tasks.
const EXCLUDE_IDLE: u64 = 1 << 7;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// The first 64 bytes of `struct perf_event_attr` (PERF_ATTR_SIZE_VER0),
/// which every kernel takes: type, size, config, sample_period,
/// sample_type, read_format, the flag bits, wakeup_events and bp_type,
/// config1.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The CPUs in a list as `/sys/devices/system/cpu/online` gives it
/// (`0-3,6`).
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let (a, b): (u32, u32) = match (a.trim().parse(), b.trim().parse()) {
            (Ok(a), Ok(b)) if a <= b && b < 65536 => (a, b),
            _ => bail!("not a CPU list: {:?}", text.trim()),
        };
        cpus.extend(a..=b);
    }
    if cpus.is_empty() {
        bail!("not a CPU list: {:?}", text.trim());
    }
    Ok(cpus)
}

/// One cpu-clock event per online CPU, sampling every `1 / hz` seconds of
/// that CPU's time.
pub fn open(hz: u32) -> Result<Vec<OwnedFd>> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .context("failed to read /sys/devices/system/cpu/online")?;
    let cpus = parse_cpu_list(&online)?;
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_period: (1_000_000_000 / u64::from(hz.max(1))).max(1),
        flags: EXCLUDE_IDLE,
        ..Default::default()
    };
    let mut fds = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        // SAFETY: `attr` is a valid perf_event_attr of the size it says,
        // alive for the call; the result is a new descriptor or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                -1 as libc::pid_t,
                cpu as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    " (--on-cpu samples every CPU: it needs CAP_PERFMON, or CAP_SYS_ADMIN, or \
                     kernel.perf_event_paranoid at -1)"
                }
                Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::EOPNOTSUPP) => {
                    " (this kernel has no cpu-clock perf event: CONFIG_PERF_EVENTS)"
                }
                _ => "",
            };
            bail!("failed to open a cpu-clock perf event on CPU {cpu}: {e}{hint}");
        }
        // SAFETY: a descriptor just returned to us, owned by nothing else.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list("0,2-4,7").unwrap(), vec![0, 2, 3, 4, 7]);
        assert_eq!(parse_cpu_list("5").unwrap(), vec![5]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("0-99999999").is_err());
    }

    #[test]
    fn the_attr_is_the_first_version() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 64);
    }
}
