//! Addresses to frame names, with one long-lived blazesym `Symbolizer`.
//!
//! A process's executable mappings are snapshotted the first time it is
//! seen blocking (see [`Symbolizer::note_process`]), so that its frames are
//! still named if it exits before tracing ends. The snapshot is small: each
//! mapping refers to a file by index, and each distinct file (by device and
//! inode) is opened once, through the process's `/proc/PID/map_files` (so
//! files in other mount namespaces, or deleted since, still resolve), and
//! shared by every process that maps it. Many short-lived processes of the
//! same programs thus cost a few dozen bytes per mapping, not a copy of
//! each process's memory map.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized};
use blazesym::Pid;

/// One executable mapping of a process.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into `Symbolizer::objects`.
    object: u32,
}

/// What a mapping maps: a file, or something without one (`[vdso]`, an
/// anonymous JIT region).
struct Object {
    /// File name for unnamed frames: `[libfoo.so+0x1234]`.
    name: String,
    /// Where blazesym reads the file: `/proc/self/fd/N` of the handle
    /// below, or the path in the maps if it could not be opened.
    path: Option<PathBuf>,
    _handle: Option<File>,
}

/// How frames are written.
#[derive(Clone, Copy, Debug, Default)]
pub struct SymbolizeOptions {
    /// `func+0x1a` instead of `func`.
    pub offsets: bool,
}

pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    /// Executable mappings by process, as last seen.
    processes: HashMap<u32, Vec<Mapping>>,
    objects: Vec<Object>,
    /// `objects` indices by (device, inode), or by name for mappings
    /// without a file.
    object_ids: HashMap<ObjectKey, u32>,
    opts: SymbolizeOptions,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum ObjectKey {
    File { dev: String, inode: u64 },
    Pseudo(String),
}

/// Where an address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrKind {
    /// The exact instruction pointer (the innermost frame of a stack).
    Ip,
    /// A return address: the call is the instruction before it.
    Return,
}

/// One executable line of `/proc/PID/maps`.
struct MapsLine<'a> {
    start: u64,
    end: u64,
    file_offset: u64,
    key: ObjectKey,
    range: &'a str,
    path: &'a str,
}

fn parse_maps(text: &str) -> Vec<MapsLine<'_>> {
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
            range,
            path,
        });
    }
    out
}

fn process_alive(tgid: u32) -> bool {
    Path::new(&format!("/proc/{tgid}/maps")).exists()
}

impl Symbolizer {
    pub fn new(opts: SymbolizeOptions) -> Symbolizer {
        let inner = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(false)
            .enable_inlined_fns(false)
            .enable_demangling(true)
            .build();
        Symbolizer {
            inner,
            processes: HashMap::new(),
            objects: Vec::new(),
            object_ids: HashMap::new(),
            opts,
        }
    }

    /// Snapshots what is needed to symbolize `tgid` later, even after it
    /// exits.  Cheap to call again for a known process, unless `changed`
    /// says that its mappings have.
    pub fn note_process(&mut self, tgid: u32, changed: bool) {
        if tgid == 0 || (!changed && self.processes.contains_key(&tgid)) {
            return;
        }
        self.refresh_process(tgid);
    }

    fn refresh_process(&mut self, tgid: u32) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
            // Gone already: keep what we had.
            self.processes.entry(tgid).or_default();
            return;
        };
        let mut mappings = Vec::new();
        for line in parse_maps(&text) {
            let object = self.object(tgid, &line);
            mappings.push(Mapping {
                start: line.start,
                end: line.end,
                file_offset: line.file_offset,
                object,
            });
        }
        mappings.shrink_to_fit();
        self.processes.insert(tgid, mappings);
    }

    /// The index of the object `line` maps, opening its file the first
    /// time it is seen.
    fn object(&mut self, tgid: u32, line: &MapsLine<'_>) -> u32 {
        if let Some(&id) = self.object_ids.get(&line.key) {
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
        let (path, handle) = match line.key {
            ObjectKey::Pseudo(_) => (None, None),
            ObjectKey::File { .. } => {
                match File::open(format!("/proc/{tgid}/map_files/{}", line.range)) {
                    Ok(f) => (
                        Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
                        Some(f),
                    ),
                    // Out of file descriptors, say: the path as mapped.
                    Err(_) => (Some(PathBuf::from(line.path)), None),
                }
            }
        };
        let id = self.objects.len() as u32;
        self.objects.push(Object {
            name,
            path,
            _handle: handle,
        });
        self.object_ids.insert(line.key.clone(), id);
        id
    }

    /// Reads the kernel's symbols now (kallsyms takes about 100 ms to
    /// parse), so that the report at the end does not wait for it.
    pub fn warm_up_kernel(&self) {
        let _ = self.kernel(&[(0, AddrKind::Ip)]);
    }

    /// Names of kernel frames.
    #[allow(clippy::field_reassign_with_default)]
    pub fn kernel(&self, addrs: &[(u64, AddrKind)]) -> HashMap<(u64, AddrKind), String> {
        // kallsyms only: looking for a vmlinux image with DWARF costs more
        // than it adds for function names. `Kernel` is non-exhaustive, so
        // its fields are set after `default()`.
        let mut kernel = Kernel::default();
        kernel.vmlinux = blazesym::MaybeDefault::None;
        kernel.debug_syms = false;
        let src = Source::Kernel(kernel);
        self.resolve(
            addrs,
            |lookup| {
                names(
                    self.inner.symbolize(&src, Input::AbsAddr(lookup)),
                    lookup.len(),
                )
            },
            |_| None,
        )
    }

    /// Names of user frames of process `tgid`.
    pub fn user(
        &mut self,
        tgid: u32,
        addrs: &[(u64, AddrKind)],
    ) -> HashMap<(u64, AddrKind), String> {
        let alive = process_alive(tgid);
        if alive {
            // Pick up libraries loaded since the first snapshot.
            self.refresh_process(tgid);
        }
        let mappings = self.processes.get(&tgid).cloned().unwrap_or_default();
        self.resolve(
            addrs,
            |lookup| {
                if alive {
                    let mut process = Process::new(Pid::from(tgid));
                    process.perf_map = false;
                    let src = Source::Process(process);
                    names(
                        self.inner.symbolize(&src, Input::AbsAddr(lookup)),
                        lookup.len(),
                    )
                } else {
                    self.exited(&mappings, lookup)
                }
            },
            |addr| self.unnamed(&mappings, addr),
        )
    }

    /// Names in a process that has exited, through its snapshot: file
    /// offsets, looked up file by file.
    fn exited(&self, mappings: &[Mapping], lookup: &[u64]) -> Vec<Option<(String, u64)>> {
        let mut out = vec![None; lookup.len()];
        let mut by_object: HashMap<u32, (Vec<usize>, Vec<u64>)> = HashMap::new();
        for (i, &addr) in lookup.iter().enumerate() {
            if let Some(m) = find(mappings, addr) {
                let e = by_object.entry(m.object).or_default();
                e.0.push(i);
                e.1.push(addr - m.start + m.file_offset);
            }
        }
        for (object, (idx, offsets)) in by_object {
            let Some(path) = &self.objects[object as usize].path else {
                continue;
            };
            let src = Source::Elf(Elf::new(path));
            let found = names(
                self.inner.symbolize(&src, Input::FileOffset(&offsets)),
                offsets.len(),
            );
            for (i, name) in idx.into_iter().zip(found) {
                out[i] = name;
            }
        }
        out
    }

    /// `[file+0xoffset]` for an address in a mapping with no symbol for it.
    fn unnamed(&self, mappings: &[Mapping], addr: u64) -> Option<String> {
        find(mappings, addr).map(|m| {
            format!(
                "[{}+{:#x}]",
                self.objects[m.object as usize].name,
                addr - m.start + m.file_offset
            )
        })
    }

    fn resolve(
        &self,
        addrs: &[(u64, AddrKind)],
        symbolize: impl FnOnce(&[u64]) -> Vec<Option<(String, u64)>>,
        fallback: impl Fn(u64) -> Option<String>,
    ) -> HashMap<(u64, AddrKind), String> {
        let unique: Vec<(u64, AddrKind)> = {
            let mut seen = HashSet::new();
            addrs.iter().copied().filter(|a| seen.insert(*a)).collect()
        };
        // A return address may be one past the end of the calling
        // function (a call as its last instruction): look up the call.
        let lookup: Vec<u64> = unique
            .iter()
            .map(|&(a, k)| {
                if k == AddrKind::Return {
                    a.saturating_sub(1)
                } else {
                    a
                }
            })
            .collect();
        let results = symbolize(&lookup);
        let mut out = HashMap::with_capacity(unique.len());
        for (i, &(addr, kind)) in unique.iter().enumerate() {
            let named = results.get(i).cloned().flatten().map(|(name, offset)| {
                if self.opts.offsets {
                    // From the start of the symbol to the address itself
                    // (not the looked-up call).
                    format!("{name}+{:#x}", offset + (addr - lookup[i]))
                } else {
                    name
                }
            });
            let name = named
                .or_else(|| fallback(addr))
                .unwrap_or_else(|| "[unknown]".to_string());
            out.insert((addr, kind), name);
        }
        out
    }
}

/// The mapping that holds `addr`.
fn find(mappings: &[Mapping], addr: u64) -> Option<&Mapping> {
    mappings.iter().find(|m| addr >= m.start && addr < m.end)
}

/// (name, offset of the address into the symbol) of each result, `len`
/// of them.
fn names(results: blazesym::Result<Vec<Symbolized<'_>>>, len: usize) -> Vec<Option<(String, u64)>> {
    match results {
        Ok(r) => r
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => Some((sym.name.to_string(), sym.offset as u64)),
                _ => None,
            })
            .collect(),
        Err(_) => vec![None; len],
    }
}
