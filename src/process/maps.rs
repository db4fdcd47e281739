//! Reading a process's executable mappings (`/proc/PID/maps`) and opening
//! the files they map, as the process sees them: every file here belongs
//! to someone else, and any of them may be gone or replaced.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Where distributions install separate debug files, by build id.
const DEBUG_BUILD_ID_DIR: &str = "/usr/lib/debug/.build-id";

/// The separate debug file of the ELF file at `path`, if installed:
/// `/usr/lib/debug/.build-id/ab/cdef….debug`. Its symbol table names what
/// the stripped file's dynamic symbols leave unnamed (`start_thread`).
pub(crate) fn debug_file(path: &Path) -> Option<PathBuf> {
    debug_file_in(Path::new(DEBUG_BUILD_ID_DIR), path)
}

fn debug_file_in(dir: &Path, path: &Path) -> Option<PathBuf> {
    // The parser may panic on a malformed file: then there is no id.
    let id = std::panic::catch_unwind(|| blazesym::helper::read_elf_build_id(&path))
        .ok()?
        .ok()??;
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let p = dir.join(&hex[..2]).join(format!("{}.debug", &hex[2..]));
    p.is_file().then_some(p)
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum ObjectKey {
    File { dev: String, inode: u64 },
    Pseudo(String),
}

/// One executable line of `/proc/PID/maps`.
pub(crate) struct MapsLine<'a> {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) file_offset: u64,
    pub(crate) key: ObjectKey,
    pub(crate) path: &'a str,
}

impl MapsLine<'_> {
    /// The mapping's entry in `/proc/PID/map_files`: its range without
    /// the leading zeros the maps pad low addresses with (a non-PIE
    /// executable at 0x400000 is `00400000-0041f000` there, and
    /// `400000-41f000` in map_files).
    pub(crate) fn map_files_name(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }
}

/// Opens the file a process maps at `line`: through its
/// `/proc/PID/map_files` entry where the profiler may (CAP_SYS_ADMIN, or
/// since Linux 5.9 CAP_CHECKPOINT_RESTORE with CAP_DAC_READ_SEARCH: the
/// file even if deleted or in another mount namespace); else by its path as the process sees it
/// (`/proc/PID/root`, which needs the right to trace the process:
/// CAP_SYS_PTRACE for another user's), else by its path here. Either path
/// must lead to the file mapped (device and inode).
pub(crate) fn open_mapped(tgid: u32, line: &MapsLine<'_>) -> std::io::Result<File> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::MetadataExt;
    let denied = match File::open(format!("/proc/{tgid}/map_files/{}", line.map_files_name())) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    if denied.kind() != ErrorKind::PermissionDenied {
        return Err(denied);
    }
    let ObjectKey::File { dev, inode } = &line.key else {
        return Err(denied);
    };
    if !line.path.starts_with('/') || line.path.ends_with(" (deleted)") {
        return Err(Error::new(
            ErrorKind::NotFound,
            "deleted since it was mapped; opening it needs CAP_SYS_ADMIN, or \
             CAP_CHECKPOINT_RESTORE with CAP_DAC_READ_SEARCH",
        ));
    }
    let want = dev.split_once(':').and_then(|(a, b)| {
        Some((
            u32::from_str_radix(a, 16).ok()?,
            u32::from_str_radix(b, 16).ok()?,
        ))
    });
    let mapped = |f: &File| {
        f.metadata().is_ok_and(|m| {
            m.ino() == *inode && want == Some((libc::major(m.dev()), libc::minor(m.dev())))
        })
    };
    let mut refused = false;
    for path in [
        format!("/proc/{tgid}/root{}", line.path),
        line.path.to_string(),
    ] {
        match File::open(&path) {
            Ok(f) if mapped(&f) => return Ok(f),
            Ok(_) => {}
            Err(e) => refused |= e.kind() == ErrorKind::PermissionDenied,
        }
    }
    Err(if refused {
        Error::new(
            ErrorKind::PermissionDenied,
            "permission denied; CAP_SYS_PTRACE opens another user's process's files, \
             CAP_DAC_READ_SEARCH files this user may not read",
        )
    } else {
        Error::new(
            ErrorKind::NotFound,
            "its path leads to another file now (replaced, or in another mount namespace); \
             CAP_SYS_PTRACE or CAP_SYS_ADMIN opens the one mapped",
        )
    })
}

pub(crate) fn parse_maps(text: &str) -> Vec<MapsLine<'_>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        // The path is the rest of the line; it may contain spaces.
        let path = it.next().map_or("", |first| {
            let at = line.find(first).unwrap_or(line.len());
            line[at..].trim_end()
        });
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset), Ok(inode)) = (
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(offset, 16),
            inode.parse::<u64>(),
        ) else {
            continue;
        };
        let key = if inode != 0 {
            ObjectKey::File {
                dev: dev.to_string(),
                inode,
            }
        } else {
            ObjectKey::Pseudo(if path.is_empty() { "anon" } else { path }.to_string())
        };
        out.push(MapsLine {
            start,
            end,
            file_offset,
            key,
            path,
        });
    }
    out
}

/// A copy of this process's vDSO in an anonymous file. Every process on
/// the machine maps the same image, whole, so an address at offset X in
/// another process's `[vdso]` mapping is at file offset X in this copy
/// (`clock_gettime` and friends, where a thread can be preempted).
pub(crate) fn vdso_copy() -> Option<File> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = parse_maps(&maps)
        .into_iter()
        .find(|l| l.key == ObjectKey::Pseudo("[vdso]".into()))?;
    // SAFETY: the vDSO is mapped readable for the life of the process, at
    // the range /proc/self/maps gives.
    let image = unsafe {
        std::slice::from_raw_parts(line.start as *const u8, (line.end - line.start) as usize)
    };
    // SAFETY: memfd_create with a NUL-terminated name; the new descriptor
    // is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(c"vdso".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(image).ok()?;
    Some(file)
}

pub(crate) fn process_alive(tgid: u32) -> bool {
    Path::new(&format!("/proc/{tgid}/maps")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_keep_executable_mappings_and_whole_paths() {
        let text = "\
55d0c0a00000-55d0c0a20000 r--p 00000000 fe:01 1234 /usr/bin/prog
55d0c0a20000-55d0c0a80000 r-xp 00020000 fe:01 1234 /usr/bin/prog
7f0000000000-7f0000100000 r-xp 00028000 fe:01 99 /opt/my app/lib two.so (deleted)
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 [vdso]
7f0000300000-7f0000310000 rwxp 00000000 00:00 0
";
        let lines = parse_maps(text);
        assert_eq!(lines.len(), 4);
        assert_eq!(
            (lines[0].start, lines[0].end, lines[0].file_offset),
            (0x55d0c0a20000, 0x55d0c0a80000, 0x20000)
        );
        assert!(
            lines[0].key
                == ObjectKey::File {
                    dev: "fe:01".into(),
                    inode: 1234
                }
        );
        assert_eq!(lines[0].map_files_name(), "55d0c0a20000-55d0c0a80000");
        let low = parse_maps("0041f000-006d2000 r-xp 0001f000 fe:00 247706 /usr/bin/python3.11\n");
        assert_eq!(low[0].map_files_name(), "41f000-6d2000");
        assert_eq!(lines[1].path, "/opt/my app/lib two.so (deleted)");
        assert!(lines[2].key == ObjectKey::Pseudo("[vdso]".into()));
        assert!(lines[3].key == ObjectKey::Pseudo("anon".into()));
    }

    #[test]
    fn debug_files_are_found_by_build_id() {
        let exe = Path::new("/proc/self/exe");
        // The build id as binutils reads it, not through the library the
        // code uses.
        let me = std::env::current_exe().unwrap();
        let out = match std::process::Command::new("readelf")
            .arg("-n")
            .arg(&me)
            .output()
        {
            Ok(out) => out,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: readelf: {e}");
                return;
            }
            Err(e) => panic!("readelf: {e}"),
        };
        let notes = String::from_utf8_lossy(&out.stdout);
        let hex = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .expect("the test binary has a build id")
            .trim()
            .to_string();
        let dir = tempfile::tempdir().unwrap();
        assert!(debug_file_in(dir.path(), exe).is_none(), "not installed");
        let want = dir
            .path()
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        std::fs::create_dir_all(want.parent().unwrap()).unwrap();
        std::fs::write(&want, b"").unwrap();
        assert_eq!(debug_file_in(dir.path(), exe), Some(want));
        // No build id, no debug file.
        assert!(debug_file_in(dir.path(), Path::new("/proc/self/maps")).is_none());
    }
}
