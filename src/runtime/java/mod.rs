//! HotSpot JVMs: which mapped objects are a HotSpot `libjvm.so` (it exports
//! its structure tables, [`vmstructs`]), each JVM process's tables and
//! release, read from the process, and through them its compiled code and
//! methods ([`code`]) and a blocked thread's Java frames ([`walk`]).
//!
//! Java frames are not walked yet: a JVM's stacks keep their native
//! frames, and the Java code's frames are its code's addresses. That is
//! said once at the end, with the JVMs' releases; a `libjvm.so` that is
//! not HotSpot's (no structure tables: OpenJ9) is said too.

pub mod code;
pub mod vmstructs;
pub mod walk;

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::sync::Arc;

use crate::elf::{Elf, Segment, SymbolTable};
use crate::raw::{LossCounters, Proc};
use crate::runtime::{FrameName, Kind, NativeAt, Placed, ProcEntry, ProcMem, Runtime};
use vmstructs::{Symbols, VmStructs, SYMBOLS};

/// A HotSpot `libjvm.so`: where its tables' symbols are in the file.
#[derive(Clone, Debug)]
pub struct Libjvm {
    /// The values of [`SYMBOLS`] in the file (add the load bias).
    pub symbols: Symbols,
    segments: Vec<Segment>,
}

/// Whether `file`, named `name`, is a JVM's `libjvm.so`: None if not;
/// Some(None) for one without HotSpot's structure tables.
pub fn inspect(file: &File, name: &str) -> anyhow::Result<Option<Option<Libjvm>>> {
    if name != "libjvm.so" {
        return Ok(None);
    }
    let elf = Elf::read(file)?;
    let found = elf.symbols(file, SymbolTable::Dynamic, &SYMBOLS)?;
    if found.iter().any(Option::is_none) {
        return Ok(Some(None));
    }
    let mut symbols = [0u64; 24];
    for (s, f) in symbols.iter_mut().zip(&found) {
        *s = f.map_or(0, |f| f.value);
    }
    Ok(Some(Some(Libjvm {
        symbols,
        segments: elf.load_segments(file)?,
    })))
}

/// What is known of one JVM process.
struct JvmProcess {
    /// The object mapped, and where its symbols are in the process.
    object: u32,
    symbols: Symbols,
    /// Its tables and release, once read.
    read: Option<Arc<Jvm>>,
}

/// A JVM's tables and release.
pub struct Jvm {
    pub structs: VmStructs,
    /// `17.0.21+2-...`, as the JVM reports it.
    pub release: String,
}

impl Jvm {
    /// Reads the tables and the release of the JVM whose symbols are at
    /// `symbols` in memory `mem`.
    pub fn read(mem: &dyn crate::runtime::Memory, symbols: &Symbols) -> Result<Jvm, String> {
        let structs = vmstructs::read(mem, symbols).map_err(|e| e.to_string())?;
        let release = structs
            .address("Abstract_VM_Version", "_s_vm_release")
            .and_then(|a| vmstructs::read_pointer(mem, a).ok())
            .and_then(|p| vmstructs::read_string(mem, p).ok().flatten())
            .map_or_else(|| "an unknown release".to_string(), |s| s.to_string());
        Ok(Jvm { structs, release })
    }

    /// The release's major version (`17`), if it says.
    pub fn major(&self) -> Option<u32> {
        let digits: String = self
            .release
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }
}

/// How a process's memory is opened (a fake in tests).
type Opener = fn(u32) -> std::io::Result<Box<dyn crate::runtime::Memory>>;

fn open_process(pid: u32) -> std::io::Result<Box<dyn crate::runtime::Memory>> {
    Ok(Box::new(ProcMem::open(pid)?))
}

/// What the profiler knows of JVMs.
pub struct Jvms {
    open: Opener,
    /// Objects read, by the registry's object id: None for those that are
    /// not HotSpot's libjvm.
    objects: HashMap<u32, Option<Arc<Libjvm>>>,
    procs: HashMap<Proc, JvmProcess>,
    /// Every JVM process seen, and its release once read.
    seen: HashMap<Proc, Option<String>>,
    /// JVMs that are not HotSpot, once each: the path's name.
    not_hotspot: BTreeSet<String>,
    /// Why tables could not be read, once each.
    unreadable: BTreeSet<String>,
}

impl Default for Jvms {
    fn default() -> Jvms {
        Jvms::with_memory(open_process)
    }
}

impl Jvms {
    fn with_memory(open: Opener) -> Jvms {
        Jvms {
            open,
            objects: HashMap::new(),
            procs: HashMap::new(),
            seen: HashMap::new(),
            not_hotspot: BTreeSet::new(),
            unreadable: BTreeSet::new(),
        }
    }

    fn read_object(&mut self, id: u32, name: &str, file: Option<&File>) -> Option<Arc<Libjvm>> {
        if let Some(o) = self.objects.get(&id) {
            return o.clone();
        }
        let found = match file.map(|f| inspect(f, name)) {
            Some(Ok(Some(Some(lib)))) => Some(Arc::new(lib)),
            Some(Ok(Some(None))) => {
                self.not_hotspot.insert(name.to_string());
                None
            }
            _ => None,
        };
        self.objects.insert(id, found.clone());
        found
    }

    /// Reads the tables of process `p`, if not read yet and it runs.
    fn read_process(&mut self, p: Proc) {
        let Some(jp) = self.procs.get_mut(&p) else {
            return;
        };
        if jp.read.is_some() {
            return;
        }
        let Ok(mem) = (self.open)(p.tgid) else {
            return;
        };
        match Jvm::read(mem.as_ref(), &jp.symbols) {
            Ok(jvm) => {
                self.seen.insert(p, Some(jvm.release.clone()));
                jp.read = Some(Arc::new(jvm));
            }
            Err(why) => {
                // Not set up yet (a JVM starting): read again later.
                if !why.contains("not set up yet") {
                    self.unreadable.insert(why);
                }
            }
        }
    }

    /// The tables of process `p`, if read.
    pub fn jvm(&self, p: Proc) -> Option<&Jvm> {
        self.procs.get(&p)?.read.as_deref()
    }
}

impl Runtime for Jvms {
    fn kind(&self) -> Kind {
        Kind::Java
    }

    fn object(&mut self, id: u32, name: &str, file: Option<&File>) -> bool {
        self.read_object(id, name, file).is_some()
    }

    fn note_process(
        &mut self,
        p: Proc,
        object: u32,
        start: u64,
        file_offset: u64,
    ) -> Option<ProcEntry> {
        let lib = self.objects.get(&object)?.clone()?;
        let bias = crate::elf::load_bias(&lib.segments, start, file_offset)?;
        let symbols = lib.symbols.map(|s| s.wrapping_add(bias));
        let same = self
            .procs
            .get(&p)
            .is_some_and(|jp| jp.object == object && jp.symbols == symbols);
        if !same {
            self.procs.insert(
                p,
                JvmProcess {
                    object,
                    symbols,
                    read: None,
                },
            );
        }
        self.seen.entry(p).or_insert(None);
        self.read_process(p);
        // Java frames are not walked: no entry for the BPF program.
        None
    }

    fn forked(&mut self, _parent: u32, _child: Proc) {}

    fn exited(&mut self, p: Proc) {
        self.procs.remove(&p);
    }

    fn has_process(&self, _p: Proc) -> bool {
        // Its frames are not read: its stacks are native.
        false
    }

    fn seen(&self, p: Proc) -> bool {
        self.seen.contains_key(&p)
    }

    fn owns(&self, _word: u64) -> bool {
        false
    }

    fn note_code(&mut self, _p: Proc, _code: u64, _tag: u32) {}

    fn resolve(&mut self, _p: Proc, _addrs: &[u64]) {}

    fn place(&self, _p: Proc, _addrs: &[u64], native: &[NativeAt]) -> Vec<Placed> {
        (0..native.len()).map(Placed::Native).collect()
    }

    fn name(&self, _code: u32, _at: u32) -> Option<FrameName<'_>> {
        None
    }

    fn settle(&mut self) {
        let pending: Vec<Proc> = self
            .procs
            .iter()
            .filter(|(_, jp)| jp.read.is_none())
            .map(|(&p, _)| p)
            .collect();
        for p in pending {
            self.read_process(p);
        }
    }

    fn report(&self, _counters: &LossCounters, verbose: bool) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.seen.is_empty() {
            let releases: BTreeSet<&str> =
                self.seen.values().flatten().map(String::as_str).collect();
            let releases = if releases.is_empty() {
                String::new()
            } else {
                format!(
                    " (HotSpot {})",
                    releases.into_iter().collect::<Vec<_>>().join(", ")
                )
            };
            let n = self.seen.len();
            let (processes, their) = if n == 1 {
                ("process", "its")
            } else {
                ("processes", "their")
            };
            lines.push(format!(
                "the Java frames of {n} JVM {processes}{releases} are not walked: {their} stacks \
                 show the JVM's native frames, and the addresses of its code in place of Java \
                 methods"
            ));
        }
        for name in &self.not_hotspot {
            lines.push(format!(
                "{name} without HotSpot's structure tables (not a HotSpot JVM): its processes' \
                 stacks show native frames only"
            ));
        }
        for why in &self.unreadable {
            lines.push(format!("a JVM's Java frames cannot be read: {why}"));
        }
        if verbose {
            let tables: BTreeSet<String> = self
                .procs
                .values()
                .filter_map(|jp| jp.read.as_deref())
                .map(|jvm| {
                    let (fields, types, ints, longs) = jvm.structs.counts();
                    format!(
                        "java: HotSpot {}: structure tables of {fields} fields, {types} types, \
                         {ints} int and {longs} long constants",
                        jvm.release
                    )
                })
                .collect();
            lines.extend(tables);
        }
        lines
    }
}

#[cfg(test)]
mod tests;
