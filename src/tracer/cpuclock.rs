//! `--on-cpu`: a `cpu-clock` perf event on every online CPU, counting
//! every task (not the idle ones), whose overflow at each period runs the
//! BPF program's sampler.
//!
//! A fixed period samples a loop whose length is near a multiple of it at
//! the same few points, for as long as the two stay in step: a thread that
//! runs 1 ms in one function and 3 ms in another, sampled every 2.004 ms,
//! was seen 50:50 for seconds. So the period is dithered: every 20 to 80 ms
//! each event gets a period drawn uniformly within 25% of the one asked
//! for, and restarts from then, which moves the phase too. Samples only
//! divide exact time between stacks (see crate::oncpu), so their number
//! need not be exact: they must only not favour a stack.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// `_IOW('$', 4, __u64)`: a sampling event's new period.
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;

/// The thread that dithers the period of the events it is given.
pub struct Dither {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Dither {
    /// Dithers the events `fds` (at `hz`) until dropped. The descriptors
    /// are not its own (libbpf's links close them): it must be dropped
    /// before they are.
    pub fn start(fds: Vec<RawFd>, hz: u32) -> Result<Dither> {
        let stop = Arc::new(AtomicBool::new(false));
        let period = period_ns(hz);
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("cpu-clock".into())
                .spawn(move || dither(&fds, period, &stop))
                .context("failed to start the thread that dithers the sampling period")?
        };
        Ok(Dither {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Dither {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn period_ns(hz: u32) -> u64 {
    (1_000_000_000 / u64::from(hz.max(1))).max(1)
}

/// Until `stop`: every 20 to 80 ms, each event's period drawn within 25%
/// of `period` (xorshift, seeded from the clock: it need only be unrelated
/// to what is sampled).
fn dither(fds: &[RawFd], period: u64, stop: &AtomicBool) {
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
        | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(Duration::from_millis(20 + next() % 61));
        if stop.load(Ordering::Relaxed) {
            return;
        }
        for &fd in fds {
            let quarter = period / 4;
            let p: u64 = (period - quarter + next() % (2 * quarter + 1)).max(10_000);
            // SAFETY: an ioctl on a perf event descriptor kept open until
            // this thread has ended (see Dither::start), with a pointer to
            // a u64 alive for the call. A failure (the CPU went offline)
            // leaves the period as it was.
            unsafe { libc::ioctl(fd, PERF_EVENT_IOC_PERIOD as _, &p as *const u64) };
        }
    }
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
        sample_period: period_ns(hz),
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
