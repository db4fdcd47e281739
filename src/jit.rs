//! Frames of JIT-compiled code, named from the runtime's perf map:
//! `/tmp/perf-PID.map`, one `START SIZE name` line per compiled function
//! (hexadecimal, no `0x`), as Node's `--perf-basic-prof`, Java's perf map
//! agent and Python 3.12's `-X perf` write it.
//!
//! The file belongs to the traced process's user, and anybody can write
//! into `/tmp`: it is read only if it is a regular file (never through a
//! symbolic link, nor through a `/tmp` that is one) owned by the process's
//! user or by root, at most [`MAX_BYTES`] of it; lines that do not parse
//! are skipped (and counted). It is read in the process's own root
//! (`/proc/PID/root/tmp`, under the pid the process has there), while the
//! process lives. The directory is kept open once a map was found there, so
//! that the map is read once more when its process has exited (a runtime
//! writes its last lines on its way out, and nothing else may tell the
//! profiler to read them): once, as soon as the exit is known, not where
//! another process has the pid already (it may append to the same file),
//! and taken only if it begins with what was read while the process lived.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// The most of a perf map read (a long-running JIT writes many MB).
pub const MAX_BYTES: u64 = 256 << 20;
/// Longer names are cut.
const MAX_NAME: usize = 1024;

/// The functions of one perf map, by start address.
#[derive(Debug, Default, Clone)]
pub struct PerfMap {
    /// (start, end, line number, name), sorted by start.
    entries: Vec<(u64, u64, u32, Box<str>)>,
    /// The file's size and modification time when read: read again only
    /// when they change.
    stamp: (u64, i64, i64),
    /// Lines that did not parse.
    pub bad_lines: usize,
    /// The file was larger than [`MAX_BYTES`]: only its start was read.
    pub truncated: bool,
    /// Where it was read, to read it again once its process is gone.
    kept: Option<Kept>,
}

/// The directory a perf map was read in (the process's `/tmp`, held open)
/// and what was read of it.
#[derive(Debug, Clone)]
struct Kept {
    dir: Arc<File>,
    name: Box<str>,
    /// The user the file must belong to (or root).
    owner: u32,
    /// The bytes parsed (whole lines) and their hash.
    read: u64,
    hash: u64,
}

impl PerfMap {
    /// Parses a perf map's text; bad lines are skipped and counted.
    pub fn parse(text: &[u8]) -> PerfMap {
        let mut map = PerfMap::default();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = String::from_utf8_lossy(line);
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            match parse_line(line) {
                Some((start, size, name)) => {
                    map.entries
                        .push((start, start + size, n as u32, name.into()))
                }
                None => map.bad_lines += 1,
            }
        }
        map.entries.sort_unstable_by_key(|e| (e.0, e.2));
        map.entries.shrink_to_fit();
        map
    }

    /// The function `addr` is in, and its start and size. Where
    /// entries overlap (code moved or compiled again at the same place),
    /// the latest line wins.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64, u64)> {
        let past = self.entries.partition_point(|e| e.0 <= addr);
        // Entries that start at or below `addr`: the nearest few may
        // cover it.
        self.entries[..past]
            .iter()
            .rev()
            .take(64)
            .filter(|e| addr < e.1)
            .max_by_key(|e| e.2)
            .map(|e| (&*e.3, e.0, e.1 - e.0))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Not to be read again: its directory is closed.
    pub fn let_go_of_file(&mut self) {
        self.kept = None;
    }

    /// Whether it can be read again where it was read.
    pub fn is_kept(&self) -> bool {
        self.kept.is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `START SIZE name`: hexadecimal numbers without `0x` (a `0x` is
/// accepted), the name the rest of the line. A size of 0, a range past
/// the end of the address space or an empty name is a bad line.
fn parse_line(line: &str) -> Option<(u64, u64, String)> {
    let mut it = line.splitn(3, ' ');
    let hex = |s: &str| {
        let s = s.strip_prefix("0x").unwrap_or(s);
        (!s.is_empty() && s.len() <= 16)
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    let start = hex(it.next()?)?;
    let size = hex(it.next()?)?;
    let name = it.next()?.trim();
    if size == 0 || name.is_empty() || start.checked_add(size).is_none() {
        return None;
    }
    // Frame names must not break the folded format's separators, nor
    // carry control characters to a terminal.
    let mut name: String = name
        .chars()
        .map(|c| if c == ';' || c.is_control() { '_' } else { c })
        .collect();
    if name.len() > MAX_NAME {
        let mut cut = MAX_NAME;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    Some((start, size, name))
}

/// Why a perf map was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// There is none (the common case: no JIT, or no perf map asked for).
    Absent,
    /// Not a regular file, a symbolic link, or owned by somebody else.
    Unsafe(String),
    /// Read again after its process exited, it no longer begins with what
    /// was read before: written anew by another process.
    Rewritten,
}

/// The pid process `tgid` has in its own pid namespace (the last of
/// `NStgid`), which names its perf map.
fn namespace_pid(tgid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NStgid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

fn open_nofollow(dir: Option<&File>, path: &str, flags: i32) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let c = CString::new(path).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: a valid C string; the descriptor returned is owned below.
    let fd = unsafe {
        match dir {
            Some(d) => libc::openat(d.as_raw_fd(), c.as_ptr(), flags),
            None => libc::open(c.as_ptr(), flags),
        }
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Reads process `tgid`'s perf map unless it is unchanged since `old` was
/// read (then `Ok(None)`).
pub fn read(tgid: u32, old: Option<&PerfMap>) -> Result<Option<PerfMap>, Refused> {
    let owner = std::fs::metadata(format!("/proc/{tgid}"))
        .map_err(|_| Refused::Absent)?
        .uid();
    let nspid = namespace_pid(tgid).unwrap_or(tgid);
    // `tmp` itself must not be a symbolic link: it would be followed in
    // this process's root, not the traced one's.
    let tmp = open_nofollow(
        None,
        &format!("/proc/{tgid}/root/tmp"),
        libc::O_RDONLY | libc::O_DIRECTORY,
    )
    .map_err(|_| Refused::Absent)?;
    let name = format!("perf-{nspid}.map");
    read_in(Arc::new(tmp), &name, owner, old, false)
}

/// Reads the perf map `old` once more where it was read, its process
/// having exited (`/proc` no longer leads to it): `Ok(None)` where it is
/// unchanged or was never found, [`Refused::Rewritten`] where it no
/// longer begins with what was read (another process's now).
pub fn read_after_exit(old: &PerfMap) -> Result<Option<PerfMap>, Refused> {
    let Some(k) = &old.kept else {
        return Ok(None);
    };
    read_in(k.dir.clone(), &k.name, k.owner, Some(old), true)
}

/// Reads perf map `name` in directory `tmp`, where it must be a regular
/// file of user `owner` or root, unless unchanged since `old`; `extends`:
/// only if it begins with what was read of `old`.
fn read_in(
    tmp: Arc<File>,
    name: &str,
    owner: u32,
    old: Option<&PerfMap>,
    extends: bool,
) -> Result<Option<PerfMap>, Refused> {
    let mut file = match open_nofollow(Some(&tmp), name, libc::O_RDONLY) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Refused::Unsafe(format!("/tmp/{name} is a symbolic link")))
        }
        Err(_) => return Err(Refused::Absent),
    };
    let meta = file.metadata().map_err(|_| Refused::Absent)?;
    if !meta.file_type().is_file() {
        return Err(Refused::Unsafe(format!(
            "/tmp/{name} is not a regular file"
        )));
    }
    if meta.uid() != owner && meta.uid() != 0 {
        return Err(Refused::Unsafe(format!(
            "/tmp/{name} belongs to user {}, not to the process's user {owner}",
            meta.uid()
        )));
    }
    let stamp = (meta.size(), meta.mtime(), meta.mtime_nsec());
    if old.is_some_and(|o| o.stamp == stamp) {
        return Ok(None);
    }
    let mut text = Vec::new();
    (&mut file)
        .take(MAX_BYTES)
        .read_to_end(&mut text)
        .map_err(|_| Refused::Absent)?;
    // A line being written as we read: left for the next read.
    match text.iter().rposition(|&b| b == b'\n') {
        Some(end) => text.truncate(end + 1),
        None => text.clear(),
    }
    if extends {
        let before = old.and_then(|o| o.kept.as_ref());
        let begins = before.is_some_and(|k| {
            text.len() as u64 >= k.read && hash(&text[..k.read as usize]) == k.hash
        });
        if !begins {
            return Err(Refused::Rewritten);
        }
    }
    let mut map = PerfMap::parse(&text);
    map.stamp = stamp;
    map.truncated = meta.size() > MAX_BYTES;
    map.kept = Some(Kept {
        dir: tmp,
        name: name.into(),
        owner,
        read: text.len() as u64,
        hash: hash(&text),
    });
    Ok(Some(map))
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_parsed_defensively() {
        let text = b"7f0000001000 100 JS:*wl_js_blocker /tmp/x.js:2:1\n\
            not a line\n\
            7f0000002000 0 zero size\n\
            ffffffffffffff00 1000 past the end\n\
            7f0000003000 20\n\
            0x7f0000004000 0x10 with;semicolon\x07bell\n\
            7f0000001000 80 LazyCompile:~again\n\
            12345678901234567 10 too long\n\
            \n";
        let map = PerfMap::parse(text);
        assert_eq!(map.len(), 3);
        assert_eq!(map.bad_lines, 5);
        // Overlapping entries: the latest line wins where it covers.
        assert_eq!(
            map.lookup(0x7f00_0000_1010),
            Some(("LazyCompile:~again", 0x7f00_0000_1000, 0x80))
        );
        assert_eq!(
            map.lookup(0x7f00_0000_10a0),
            Some(("JS:*wl_js_blocker /tmp/x.js:2:1", 0x7f00_0000_1000, 0x100))
        );
        assert_eq!(map.lookup(0x7f00_0000_1100), None);
        assert_eq!(map.lookup(0x7f00_0000_0fff), None);
        assert_eq!(
            map.lookup(0x7f00_0000_4000).map(|l| l.0),
            Some("with_semicolon_bell")
        );
        let long = format!("1000 10 {}\n", "é".repeat(2000));
        let map = PerfMap::parse(long.as_bytes());
        assert!(map.lookup(0x1000).unwrap().0.len() <= MAX_NAME);
    }

    #[test]
    fn planted_files_are_refused() {
        // This process's own perf map: a symbolic link, then a file of
        // another user, then its own.
        let me = std::process::id();
        let nspid = namespace_pid(me).unwrap_or(me);
        let path = format!("/tmp/perf-{nspid}.map");
        let _ = std::fs::remove_file(&path);
        assert_eq!(read(me, None).unwrap_err(), Refused::Absent);
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let r = read(me, None);
        let _ = std::fs::remove_file(&path);
        assert!(matches!(r, Err(Refused::Unsafe(_))), "{r:?}");
        std::fs::write(&path, "1000 10 mine\n1100 10 half").unwrap();
        let r = read(me, None);
        let owner = std::fs::metadata(format!("/proc/{me}")).unwrap().uid();
        if owner == 0 {
            // Root's process: chown to another user must be refused.
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            let other = read(me, None);
            assert!(matches!(other, Err(Refused::Unsafe(_))), "{other:?}");
        }
        let _ = std::fs::remove_file(&path);
        let map = r.unwrap().unwrap();
        assert_eq!(map.lookup(0x1004).map(|l| l.0), Some("mine"));
        // The line without its newline is being written: not read.
        assert_eq!(map.lookup(0x1104), None);
    }

    #[test]
    fn read_after_exit_only_what_extends_the_map_read() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = Arc::new(File::open(dir.path()).unwrap());
        let path = dir.path().join("perf-7.map");
        let me = unsafe { libc::geteuid() };
        std::fs::write(&path, "1000 10 first\n").unwrap();
        let map = read_in(tmp, "perf-7.map", me, None, false)
            .unwrap()
            .unwrap();
        assert_eq!(map.len(), 1);
        // Unchanged: nothing to read.
        assert!(read_after_exit(&map).unwrap().is_none());
        // The runtime's last lines, written on its way out (the one being
        // written is left).
        std::fs::write(&path, "1000 10 first\n2000 10 last\n3000 10 half").unwrap();
        let more = read_after_exit(&map).unwrap().unwrap();
        assert_eq!(more.lookup(0x2004).map(|l| l.0), Some("last"));
        assert_eq!(more.lookup(0x3004), None);
        // Another process's map at the same name: refused, whatever its
        // length.
        std::fs::write(&path, "1000 10 other\n2000 10 last\n4000 10 more\n").unwrap();
        assert_eq!(read_after_exit(&more).unwrap_err(), Refused::Rewritten);
        std::fs::write(&path, "1000 10 first\n").unwrap();
        assert_eq!(read_after_exit(&more).unwrap_err(), Refused::Rewritten);
        // Gone: absent.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read_after_exit(&more).unwrap_err(), Refused::Absent);
        // A map never found has nothing to read again.
        assert!(read_after_exit(&PerfMap::default()).unwrap().is_none());
    }
}
