//! Where the report goes: stdout, a device or pipe written in place, or a
//! regular file replaced whole.
//!
//! A regular file is written to a temporary file in its directory (an
//! unnamed `O_TMPFILE` where the file system has them) and renamed over the
//! target once the report is complete, so that a run that fails or is
//! killed leaves the old file as it was and never half a new one. The path
//! is checked before anything is opened: a symbolic link in a sticky,
//! world-writable directory (`/tmp`) is followed only if it belongs to the
//! caller or to the directory's owner, the rule of the kernel's
//! `fs.protected_symlinks`, which this does not rely on.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

/// At most this many symbolic links are followed, as the kernel does.
const MAX_LINKS: usize = 40;

pub enum Sink {
    Stdout,
    /// A device, a pipe or a socket: written in place, neither truncated
    /// nor synced.
    InPlace {
        file: File,
        show: PathBuf,
    },
    /// A regular file, new or replaced whole at the end.
    Replace(Box<Replacement>),
}

pub struct Replacement {
    /// The directory the file is in, held open so that the rename lands
    /// in it even if a path component changes meanwhile.
    dir: File,
    /// The file's name in `dir`.
    name: OsString,
    /// What the report is written to.
    tmp: File,
    /// Its name in `dir` when the file system has no unnamed temporary
    /// files; `None` for `O_TMPFILE`.
    tmp_name: Option<OsString>,
    /// The file being replaced: its mode and owner go to the new one.
    old: Option<std::fs::Metadata>,
    show: PathBuf,
    /// Tests: a pause before the file is put in place (see test_stall).
    stall: Option<std::time::Duration>,
}

impl Sink {
    /// Opens the output before tracing: a path that cannot be written
    /// fails now, before any measurement. `None` is stdout. `stall`: for
    /// tests (`TestEnv::stall_in_write`).
    pub fn open(path: Option<&Path>, stall: Option<std::time::Duration>) -> Result<Sink> {
        let Some(path) = path else {
            return Ok(Sink::Stdout);
        };
        let show = path.to_path_buf();
        let cannot = || format!("cannot write the output to {}", show.display());
        let target = resolve(path).with_context(cannot)?;
        match std::fs::metadata(&target) {
            Ok(m) if m.is_dir() => {
                anyhow::bail!("{}: it is a directory", cannot())
            }
            Ok(m) if !m.is_file() => {
                let ft = m.file_type();
                let special =
                    ft.is_char_device() || ft.is_block_device() || ft.is_fifo() || ft.is_socket();
                if !special {
                    anyhow::bail!("{}: not a regular file, a device or a pipe", cannot());
                }
                let file = OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&target)
                    .with_context(cannot)?;
                Ok(Sink::InPlace { file, show })
            }
            Ok(m) => Replacement::open(&target, Some(m), show.clone(), stall)
                .map(|r| Sink::Replace(Box::new(r)))
                .with_context(cannot),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Replacement::open(&target, None, show.clone(), stall)
                    .map(|r| Sink::Replace(Box::new(r)))
                    .with_context(cannot)
            }
            Err(e) => Err(e).with_context(cannot),
        }
    }

    /// A scratch file beside a regular file's output (in its directory,
    /// on its file system), to read and write, gone once closed: unnamed
    /// where the file system has them, else named and removed at once.
    /// None for stdout, a device or a pipe.
    pub fn scratch(&self) -> Option<io::Result<File>> {
        let Sink::Replace(r) = self else {
            return None;
        };
        Some(match open_unnamed(&r.dir, libc::O_RDWR) {
            Err(e) if unnamed_unsupported(&e) => {
                let mut name = r.name.clone();
                name.push(".scratch");
                open_named(&r.dir, &name, libc::O_RDWR)
                    .and_then(|(f, n)| unlinkat(&r.dir, &n).map(|_| f))
            }
            opened => opened,
        })
    }

    /// Nothing is written: an existing file stays as it was and no new one
    /// appears.
    pub fn discard(self) {
        if let Sink::Replace(r) = self {
            r.discard();
        }
    }

    /// Writes the report; for a regular file, then puts it in place.
    pub fn write(mut self, render: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
        if let Sink::Replace(r) = self {
            return r.write(render);
        }
        self.write_part(render)
    }

    /// Writes one part of the output (an interval of `-i`): to stdout, a
    /// device or a pipe at once; to a regular file's temporary file, put
    /// in place by [`Sink::finish`].
    pub fn write_part(
        &mut self,
        render: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<()> {
        match self {
            Sink::Stdout => {
                let stdout = io::stdout();
                let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
                render(&mut out)
                    .and_then(|()| out.flush())
                    .context("failed to write the report")
            }
            Sink::InPlace { file, show } => {
                let mut out = BufWriter::with_capacity(64 * 1024, &*file);
                render(&mut out)
                    .and_then(|()| out.flush())
                    .with_context(|| format!("failed to write the report to {}", show.display()))
            }
            Sink::Replace(r) => {
                let mut out = BufWriter::with_capacity(64 * 1024, &r.tmp);
                render(&mut out)
                    .and_then(|()| out.flush())
                    .with_context(|| format!("failed to write the report to {}", r.show.display()))
            }
        }
    }

    /// After [`Sink::write_part`]: a regular file is put in place.
    pub fn finish(self) -> Result<()> {
        match self {
            Sink::Replace(r) => r.write(|_| Ok(())),
            _ => Ok(()),
        }
    }
}

impl Replacement {
    fn open(
        target: &Path,
        old: Option<std::fs::Metadata>,
        show: PathBuf,
        stall: Option<std::time::Duration>,
    ) -> io::Result<Self> {
        let (dir_path, name) = split(target)?;
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&dir_path)?;
        if old.is_some() {
            // The caller must be able to write the file itself, as with a
            // shell's `>`, not only its directory.
            check_writable(&dir, &name)?;
        }
        let (tmp, tmp_name) = match open_unnamed(&dir, libc::O_WRONLY) {
            Ok(f) => (f, None),
            Err(e) if unnamed_unsupported(&e) => {
                let (f, n) = open_named(&dir, &name, libc::O_WRONLY)?;
                (f, Some(n))
            }
            Err(e) => return Err(e),
        };
        Ok(Replacement {
            dir,
            name,
            tmp,
            tmp_name,
            old,
            show,
            stall,
        })
    }

    fn discard(self) {
        if let Some(n) = &self.tmp_name {
            let _ = unlinkat(&self.dir, n);
        }
    }

    fn write(self, render: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
        let done = (|| -> io::Result<()> {
            let mut out = BufWriter::with_capacity(64 * 1024, &self.tmp);
            render(&mut out)?;
            out.flush()?;
            drop(out);
            test_stall(self.stall);
            self.keep_mode_and_owner()?;
            self.tmp.sync_data()?;
            let named = match &self.tmp_name {
                Some(n) => n.clone(),
                None => self.link_unnamed()?,
            };
            let renamed = renameat(&self.dir, &named, &self.name);
            if renamed.is_err() {
                let _ = unlinkat(&self.dir, &named);
            }
            renamed?;
            // The rename itself on disk.
            let _ = self.dir.sync_all();
            Ok(())
        })();
        if done.is_err() {
            if let Some(n) = &self.tmp_name {
                let _ = unlinkat(&self.dir, n);
            }
        }
        done.with_context(|| format!("failed to write the report to {}", self.show.display()))
    }

    /// A replaced file keeps its permissions, and (when the caller may
    /// give it away, as root) its owner.
    fn keep_mode_and_owner(&self) -> io::Result<()> {
        let Some(old) = &self.old else {
            return Ok(());
        };
        // Not the set-id bits: the report is not a program.
        let mode = old.permissions().mode() & 0o777;
        self.tmp
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
        let meta = self.tmp.metadata()?;
        if meta.uid() != old.uid() || meta.gid() != old.gid() {
            // SAFETY: fchown on a descriptor we own.
            let r = unsafe { libc::fchown(self.tmp.as_raw_fd(), old.uid(), old.gid()) };
            if r != 0 {
                let e = io::Error::last_os_error();
                // Without the privilege the new file is the caller's, as
                // any file they create.
                if e.raw_os_error() != Some(libc::EPERM) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Gives the unnamed temporary file a name in the directory, to be
    /// renamed over the target (linkat cannot replace).
    fn link_unnamed(&self) -> io::Result<OsString> {
        let fd = CString::new(format!("/proc/self/fd/{}", self.tmp.as_raw_fd())).unwrap();
        let mut last = None;
        for attempt in 0..100u32 {
            let name = temp_name(&self.name, attempt);
            let c = cstr(&name)?;
            // SAFETY: both paths are NUL-terminated; the descriptors are open.
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    fd.as_ptr(),
                    self.dir.as_raw_fd(),
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if r == 0 {
                return Ok(name);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
            last = Some(e);
        }
        Err(last.unwrap())
    }
}

/// The tests' way to kill the profiler while a report is written
/// (`TestEnv::stall_in_write`): a pause once the report is in the
/// temporary file and before it is put in place.
fn test_stall(stall: Option<std::time::Duration>) {
    if let Some(stall) = stall {
        eprintln!(
            "offcputime: test: stalling {} ms in the write",
            stall.as_millis()
        );
        std::thread::sleep(stall);
    }
}

/// The file `path` names after its symbolic links, each checked against
/// the sticky-directory rule, and the links among its directories too.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        check_components(&p)?;
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        };
        if !m.file_type().is_symlink() {
            return Ok(p);
        }
        let to = std::fs::read_link(&p)?;
        p = if to.is_absolute() {
            to
        } else {
            p.parent().unwrap_or(Path::new(".")).join(to)
        };
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// Every symbolic link among `p`'s components (the last one included)
/// must be one the kernel's protected_symlinks rule would follow.
fn check_components(p: &Path) -> io::Result<()> {
    let mut prefix = PathBuf::new();
    for c in p.components() {
        prefix.push(c);
        if !matches!(c, Component::Normal(_)) {
            continue;
        }
        match std::fs::symlink_metadata(&prefix) {
            Ok(m) if m.file_type().is_symlink() => check_link(&prefix, &m)?,
            // Missing components are reported when the file is opened.
            _ => {}
        }
    }
    Ok(())
}

/// A link in a sticky, world-writable directory is followed only if it
/// belongs to the caller or to the directory's owner.
fn check_link(link: &Path, m: &std::fs::Metadata) -> io::Result<()> {
    let parent = match link.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::metadata(parent)?;
    let mode = dir.permissions().mode();
    let sticky_world_writable = mode & libc::S_ISVTX != 0 && mode & 0o002 != 0;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if sticky_world_writable && m.uid() != me && m.uid() != dir.uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link owned by another user (uid {}) in a sticky, \
                 world-writable directory; not followed",
                link.display(),
                m.uid()
            ),
        ));
    }
    Ok(())
}

fn split(target: &Path) -> io::Result<(PathBuf, OsString)> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_os_string()))
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check_writable(dir: &File, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: the path is NUL-terminated, the descriptor open. O_NONBLOCK:
    // a FIFO swapped in meanwhile must not block the open.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned here.
    drop(unsafe { File::from_raw_fd(fd) });
    Ok(())
}

fn open_unnamed(dir: &File, access: libc::c_int) -> io::Result<File> {
    let dot: &CStr = c".";
    // SAFETY: the path is NUL-terminated, the descriptor open.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            dot.as_ptr(),
            libc::O_TMPFILE | access | libc::O_CLOEXEC,
            0o666 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned here.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// File systems (and kernels) without `O_TMPFILE` answer with one of these.
fn unnamed_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOENT)
    )
}

fn open_named(dir: &File, name: &OsStr, access: libc::c_int) -> io::Result<(File, OsString)> {
    let mut last = None;
    for attempt in 0..100u32 {
        let n = temp_name(name, attempt);
        let c = cstr(&n)?;
        // SAFETY: the path is NUL-terminated, the descriptor open.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o666 as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: fd was just opened and is owned here.
            return Ok((unsafe { File::from_raw_fd(fd) }, n));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
        last = Some(e);
    }
    Err(last.unwrap())
}

/// `.NAME.offcputime-PID-N`: hidden, and never the name of another run's.
fn temp_name(name: &OsStr, attempt: u32) -> OsString {
    let mut n = OsString::from(".");
    n.push(name);
    n.push(format!(".offcputime-{}-{attempt}", std::process::id()));
    n
}

fn renameat(dir: &File, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both paths are NUL-terminated, the descriptor open.
    let r = unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn unlinkat(dir: &File, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: the path is NUL-terminated, the descriptor open.
    let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
