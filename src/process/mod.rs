//! What the profiler knows of processes: who a process is (its pid and
//! when it started: a pid can be reused while tracing, and the start time
//! tells the later process from the one whose stacks were counted under
//! the same pid), its mappings and the files they map ([`registry`],
//! read from `/proc` by [`maps`]), and the profiler's own capabilities.

pub mod maps;
pub mod registry;

pub use registry::Registry;

pub use crate::raw::{ticks_of_ns, Proc};

/// A file frames are in: its path as the process mapped it and its GNU
/// build id (empty if it has none, or could not be read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectInfo {
    pub path: String,
    pub build_id: Vec<u8>,
}

/// Whether this process has capability `cap` (its number, as in
/// `linux/capability.h`) in its effective set.
pub fn has_capability(cap: u32) -> bool {
    effective_capabilities() & (1u64 << cap) != 0
}

/// The effective capability set, from `/proc/self/status`.
pub fn effective_capabilities() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

pub const CAP_SYS_PTRACE: u32 = 19;

/// When process `tgid` started, if it exists.
pub fn start_ticks(tgid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    parse_start(&stat)
}

/// The parent of process `tgid` (field 4 of `/proc/PID/stat`).
pub fn parent_pid(tgid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(4 - 3)?.parse().ok()
}

/// Which program image process `tgid` runs: where its code starts and
/// where its stack started (fields 26 and 28 of `/proc/PID/stat`, the
/// kernel's `start_code` and `start_stack`), which an exec sets anew (the
/// code at another address, with address space randomization; the stack
/// top with another program's arguments). `None` where they cannot be read
/// (the kernel shows zeros to a user who may not trace the process).
pub fn image_of(tgid: u32) -> Option<crate::raw::Image> {
    let stat = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    parse_image(&stat)
}

fn parse_image(stat: &str) -> Option<crate::raw::Image> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let start_code: u64 = fields.nth(26 - 3)?.parse().ok()?;
    let start_stack: u64 = fields.nth(28 - 26 - 1)?.parse().ok()?;
    (start_code != 0 && start_stack != 0).then_some(crate::raw::Image {
        start_code,
        start_stack,
    })
}

/// Whether the address space of process `tgid` is gone: it is exiting
/// (a zombie's mappings read empty), or it has exited.
pub fn address_space_gone(tgid: u32) -> bool {
    match std::fs::read(format!("/proc/{tgid}/maps")) {
        Ok(maps) => maps.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Field 22 of a `/proc/PID/stat` line. The command (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields
/// after it are counted from the last `)`.
fn parse_start(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the command.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The machine's memory in bytes (`MemTotal` in /proc/meminfo), if it can
/// be read.
pub fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_field_after_a_command_with_spaces_and_parentheses() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        assert_eq!(parse_start(line), Some(987654));
        assert_eq!(parse_start("1 (x) S 1"), None);
        assert_eq!(parse_start("garbage"), None);
    }

    #[test]
    fn image_fields_after_a_command_with_spaces_and_parentheses() {
        // Fields 3 to 28: the state, 22 more, then start_code (26), end_code
        // and start_stack (28).
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615 94000000000000 94000000100000 \
                    140720000000000 0 0 0";
        assert_eq!(
            parse_image(line),
            Some(crate::raw::Image {
                start_code: 94000000000000,
                start_stack: 140720000000000
            })
        );
        // Zeros (another user's process, not to be traced) say nothing.
        assert_eq!(parse_image(&line.replace("94000000000000 ", "0 ")), None);
        assert_eq!(parse_image("1 (x) S 1"), None);
        // This process's own, read twice: the same image.
        let me = std::process::id();
        assert!(image_of(me).is_some());
        assert_eq!(image_of(me), image_of(me));
    }

    #[test]
    fn this_process_started_when_the_kernel_says() {
        let me = std::process::id();
        let start = start_ticks(me).expect("own stat");
        // Since boot, and not after now.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        let now = ticks_of_ns(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
        assert!(start > 0 && start <= now, "{start} {now}");
    }
}
