//! Addresses to frame names, with one long-lived blazesym `Symbolizer`.
//!
//! A process's memory map is snapshotted the first time the process is seen
//! blocking (see [`Symbolizer::note_process`]), so its frames are still named
//! if it exits before tracing ends.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use blazesym::symbolize::cache;
use blazesym::symbolize::source::{Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized};
use blazesym::Pid;

/// One executable mapping of a process, for naming frames that have no
/// symbol: `[libfoo.so+0x1234]`.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    name: String,
}

#[derive(Default)]
struct ProcessInfo {
    /// blazesym holds a snapshot of the VMAs.
    cached: bool,
    mappings: Vec<Mapping>,
}

/// How frames are written.
#[derive(Clone, Copy, Debug, Default)]
pub struct SymbolizeOptions {
    /// `func+0x1a` instead of `func`.
    pub offsets: bool,
}

pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    processes: HashMap<u32, ProcessInfo>,
    opts: SymbolizeOptions,
}

/// Where an address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrKind {
    /// The exact instruction pointer (the innermost frame of a stack).
    Ip,
    /// A return address: the call is the instruction before it.
    Return,
}

fn parse_maps(tgid: u32) -> Vec<Mapping> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        let path = it.nth(2).unwrap_or("");
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset)) = (
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        let name = if path.is_empty() {
            "anon".to_string()
        } else {
            Path::new(path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.to_string())
        };
        out.push(Mapping {
            start,
            end,
            file_offset,
            name,
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
            opts,
        }
    }

    /// Snapshots what is needed to symbolize `tgid` later, even after it
    /// exits.  Cheap to call again for a known process.
    pub fn note_process(&mut self, tgid: u32) {
        if tgid == 0 || self.processes.contains_key(&tgid) {
            return;
        }
        self.refresh_process(tgid);
    }

    fn refresh_process(&mut self, tgid: u32) {
        let mappings = parse_maps(tgid);
        if mappings.is_empty() {
            // Gone already, or a kernel thread: keep what we had.
            self.processes.entry(tgid).or_default();
            return;
        }
        let mut req = cache::Process::new(Pid::from(tgid));
        req.cache_perf_map = false;
        let cached = self.inner.cache(&cache::Cache::Process(req)).is_ok();
        let info = self.processes.entry(tgid).or_default();
        info.cached |= cached;
        info.mappings = mappings;
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
        self.resolve(&src, addrs, |_| None)
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
        let mut process = Process::new(Pid::from(tgid));
        process.perf_map = false;
        // An exited process has no /proc/PID/map_files; its cached VMAs and
        // the paths they name are used instead.
        process.map_files = alive;
        let src = Source::Process(process);
        let mappings = self
            .processes
            .get(&tgid)
            .map(|p| p.mappings.clone())
            .unwrap_or_default();
        self.resolve(&src, addrs, |addr| {
            mappings
                .iter()
                .find(|m| addr >= m.start && addr < m.end)
                .map(|m| format!("[{}+{:#x}]", m.name, addr - m.start + m.file_offset))
        })
    }

    fn resolve(
        &self,
        src: &Source<'_>,
        addrs: &[(u64, AddrKind)],
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
        let results = self.inner.symbolize(src, Input::AbsAddr(&lookup)).ok();
        let mut out = HashMap::with_capacity(unique.len());
        for (i, &(addr, kind)) in unique.iter().enumerate() {
            let named = results.as_ref().and_then(|r| match r.get(i) {
                Some(Symbolized::Sym(sym)) => {
                    let name = sym.name.to_string();
                    Some(if self.opts.offsets {
                        format!("{name}+{:#x}", addr.saturating_sub(sym.addr))
                    } else {
                        name
                    })
                }
                _ => None,
            });
            let name = named
                .or_else(|| fallback(addr))
                .unwrap_or_else(|| "[unknown]".to_string());
            out.insert((addr, kind), name);
        }
        out
    }
}
