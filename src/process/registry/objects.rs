//! The files that processes' mappings map, each opened once and found by
//! device and inode; what is known of them; JIT runtimes' perf maps.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{FileIdentity, Object, Registry};
use crate::elf::load_segments;
use crate::process::maps::{debug_file, open_mapped, vdso_copy, MapsLine, ObjectKey};
use crate::process::Proc;
use crate::text::{count, noun};

/// The kernel's encoding of a device given as `/proc/PID/maps` shows it
/// (hexadecimal major:minor).
fn kernel_dev(maps_dev: &str) -> Option<u64> {
    let (major, minor) = maps_dev.split_once(':')?;
    let major = u64::from_str_radix(major, 16).ok()?;
    let minor = u64::from_str_radix(minor, 16).ok()?;
    (major < 1 << 12 && minor < 1 << 20).then_some(major << 20 | minor)
}

impl Registry {
    /// The index of the object `line` maps, opening its file the first
    /// time it is seen.
    pub(super) fn object_of(&mut self, tgid: u32, line: &MapsLine<'_>) -> u32 {
        if let Some(&id) = self.files.object_ids.get(&line.key) {
            // Mapped again after its descriptor was let go: the unwinder
            // may need the file.
            let o = &mut self.files.objects[id as usize];
            if o.handle.is_none() && o.mapped.is_some() {
                if let Ok(f) = open_mapped(tgid, line) {
                    if !o.path_is_handle && o.segments.is_none() {
                        o.path = Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())));
                        o.path_is_handle = true;
                    }
                    o.handle = Some(f);
                }
            }
            return id;
        }
        let name = Path::new(line.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|_| line.path.starts_with('/'))
            .unwrap_or_else(|| match &line.key {
                ObjectKey::Pseudo(n) => n.clone(),
                ObjectKey::File { .. } => line.path.to_string(),
            });
        let (path, segments, handle) = match line.key {
            ObjectKey::Pseudo(ref n) if n == "[vdso]" => match vdso_copy() {
                Some(f) => (
                    Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
                    None,
                    Some(f),
                ),
                None => (None, None, None),
            },
            ObjectKey::Pseudo(_) => (None, None, None),
            ObjectKey::File { .. } => {
                let (path, handle) = match open_mapped(tgid, line) {
                    Ok(f) => (
                        PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
                        Some(f),
                    ),
                    Err(e) => {
                        self.notes
                            .denied
                            .files
                            .push((line.path.to_string(), e.to_string()));
                        // The path as mapped, for the names at least.
                        (PathBuf::from(line.path), None)
                    }
                };
                // A debug file's own segments need not point at its
                // contents: addresses are worked out in the file itself.
                let debug = debug_file(&path).and_then(|d| {
                    let segments = match &handle {
                        Some(f) => load_segments(f),
                        None => load_segments(&File::open(&path).ok()?),
                    }?;
                    Some((d, segments))
                });
                match debug {
                    Some((d, segments)) => (Some(d), Some(segments), handle),
                    None => (Some(path), None, handle),
                }
            }
        };
        let mapped = handle.as_ref().and_then(|f| {
            use std::os::unix::fs::MetadataExt;
            let m = f.metadata().ok()?;
            (line.path.starts_with('/') && !line.path.ends_with(" (deleted)"))
                .then(|| (PathBuf::from(line.path), m.dev(), m.ino()))
        });
        let path_is_handle = segments.is_none() && handle.is_some();
        let identity = match &line.key {
            ObjectKey::File { dev, inode } => {
                let size = handle
                    .as_ref()
                    .and_then(|f| f.metadata().ok())
                    .map(|m| m.len());
                kernel_dev(dev).zip(size).map(|(dev, size)| FileIdentity {
                    dev,
                    ino: *inode,
                    size,
                })
            }
            ObjectKey::Pseudo(n) if n == "[vdso]" && handle.is_some() => Some(FileIdentity {
                dev: 0,
                ino: 0,
                size: 0,
            }),
            ObjectKey::Pseudo(_) => None,
        };
        let id = self.files.objects.len() as u32;
        self.files.objects.push(Object {
            name,
            maps_path: line.path.to_string(),
            path,
            segments,
            handle,
            mapped,
            path_is_handle,
            users: 0,
            identity,
        });
        self.files.object_ids.insert(line.key.clone(), id);
        id
    }

    /// Reads live process `tgid`'s perf map again, if it has one and it
    /// changed.
    pub(super) fn read_perf_map(&mut self, tgid: u32) {
        let Some(&start) = self.snapshots.starts.get(&tgid) else {
            return;
        };
        let p = Proc { tgid, start };
        match crate::jit::read(tgid, self.jit.maps.get(&p)) {
            Ok(Some(map)) => {
                self.jit.maps.insert(p, map);
            }
            Ok(None) | Err(crate::jit::Refused::Absent | crate::jit::Refused::Rewritten) => {}
            Err(crate::jit::Refused::Unsafe(why)) => self.jit_refused(why),
        }
    }

    fn jit_refused(&mut self, why: String) {
        if !self.jit.refused.contains(&why) {
            self.jit.refused.push(why);
        }
    }

    /// Reads the perf map of process `p`, which has exited, once more
    /// where it was read while `p` lived: a runtime writes its last lines
    /// on its way out. Taken only if it begins with what was read before.
    /// Read once: nothing of `p` writes to it any more, so a later read
    /// could only find another process's lines (one that took the pid
    /// appends to the same file, as CPython's `-X perf` does); not at all
    /// where another process has the pid already.
    pub fn read_perf_map_after_exit(&mut self, p: Proc) {
        let Some(old) = self.jit.maps.get_mut(&p) else {
            return;
        };
        if !old.is_kept() {
            return;
        }
        let taken = crate::process::start_ticks(p.tgid).is_some_and(|s| s != p.start);
        let outcome = if taken {
            Err(crate::jit::Refused::Rewritten)
        } else {
            crate::jit::read_after_exit(old)
        };
        match outcome {
            Ok(Some(map)) => *old = map,
            Ok(None) | Err(crate::jit::Refused::Absent) => {}
            // The names read while it lived stay (they were its own).
            Err(crate::jit::Refused::Rewritten | crate::jit::Refused::Unsafe(_)) => {
                self.jit.rewritten += 1
            }
        }
        if let Some(m) = self.jit.maps.get_mut(&p) {
            m.let_go_of_file();
        }
    }

    /// At the end of a trace, the perf maps of the processes that exited
    /// and were not read after it (their exit's notice lost) read once
    /// more; those of the processes still alive are read with their
    /// mappings.
    pub fn read_perf_maps_at_end(&mut self) {
        let gone: Vec<Proc> = (self.jit.maps.iter())
            .filter(|(p, m)| m.is_kept() && crate::process::start_ticks(p.tgid) != Some(p.start))
            .map(|(p, _)| *p)
            .collect();
        for p in gone {
            self.read_perf_map_after_exit(p);
        }
    }

    /// What the perf maps read cost: refused files, lines skipped, maps
    /// cut at their size limit; one line each, for stderr.
    pub fn jit_notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .jit
            .refused
            .iter()
            .map(|why| format!("a JIT perf map was not read: {why}; its frames are unnamed"))
            .collect();
        let bad: usize = self.jit.maps.values().map(|m| m.bad_lines).sum();
        if bad > 0 {
            notes.push(format!(
                "{} of JIT perf maps did not parse and {} skipped",
                count(bad as u64, "line", "lines"),
                noun(bad as u64, "was", "were"),
            ));
        }
        if self.jit.rewritten > 0 {
            let n = self.jit.rewritten as u64;
            notes.push(format!(
                "{} {} not read again after {} process exited (written anew, or its pid taken \
                 by another process): code compiled after {} last read while it lived is \
                 unnamed",
                count(n, "JIT perf map", "JIT perf maps"),
                noun(n, "was", "were"),
                noun(n, "its", "their"),
                noun(n, "it was", "they were"),
            ));
        }
        let cut = self.jit.maps.values().filter(|m| m.truncated).count();
        if cut > 0 {
            let n = cut as u64;
            notes.push(format!(
                "{} {} larger than {} MiB: only {} start was read",
                count(n, "JIT perf map", "JIT perf maps"),
                noun(n, "was", "were"),
                crate::jit::MAX_BYTES >> 20,
                noun(n, "its", "their"),
            ));
        }
        notes
    }

    /// The file an object maps (the file itself, not its debug file),
    /// open, if it could be opened.
    pub fn object_file(&self, object: u32) -> Option<&File> {
        self.files.objects.get(object as usize)?.handle.as_ref()
    }

    /// The object's path as mapped and its build id, for outputs that
    /// name the files frames are in.
    pub fn object_info(&self, object: u32) -> super::ObjectInfo {
        let Some(o) = self.files.objects.get(object as usize) else {
            return Default::default();
        };
        // The descriptor where it is held, else the path it was read
        // from (a separate debug file has the same build id).
        let from = match &o.handle {
            Some(f) => Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
            None => o.path.clone(),
        };
        let build_id = from
            .and_then(|p| {
                // The parser may panic on a malformed file: then there is
                // no id.
                std::panic::catch_unwind(|| blazesym::helper::read_elf_build_id(&p))
                    .ok()?
                    .ok()?
            })
            .map(|id| id.to_vec())
            .unwrap_or_default();
        super::ObjectInfo {
            // A mapping without a file (JIT code) by its kind, `anon`.
            path: if o.maps_path.is_empty() {
                o.name.clone()
            } else {
                o.maps_path.clone()
            },
            build_id,
        }
    }

    /// The object's file name, for messages.
    /// How the kernel knows the file `object` maps, where it could be
    /// opened.
    pub fn object_identity(&self, object: u32) -> Option<FileIdentity> {
        self.files
            .objects
            .get(object as usize)
            .and_then(|o| o.identity)
    }

    pub fn object_name(&self, object: u32) -> &str {
        self.files
            .objects
            .get(object as usize)
            .map_or("?", |o| o.name.as_str())
    }

    /// An object, for the symbolizer.
    pub(crate) fn object(&self, object: u32) -> &Object {
        &self.files.objects[object as usize]
    }

    /// Whether any process has a perf map.
    pub(crate) fn has_perf_maps(&self) -> bool {
        !self.jit.maps.is_empty()
    }

    /// The perf map of process `p`, as last read while it lived.
    pub(crate) fn perf_map(&self, p: Proc) -> Option<&crate::jit::PerfMap> {
        self.jit.maps.get(&p)
    }
}
