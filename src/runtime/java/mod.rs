//! HotSpot JVMs: which mapped objects are a HotSpot `libjvm.so` (it exports
//! its structure tables, [`vmstructs`]), each JVM process's tables and
//! release, read from the process, and through them its compiled code and
//! methods ([`code`]), a thread's Java frames ([`walk`]) and the names of
//! the frames the BPF program's walk found ([`frames`]).
//!
//! The BPF program walks a JVM's Java frames in its native walk once it
//! has the process's entry (`struct java_proc`: the interpreter's code,
//! the code cache's heaps and a few offsets, from the tables): a JVM
//! starting has no code cache yet, and is looked at again until it has
//! one. A `libjvm.so` that is not HotSpot's (no structure tables: OpenJ9)
//! is said, its processes' stacks native only.

pub mod code;
mod copies;
pub mod frames;
pub mod threads;
pub mod vmstructs;
pub mod walk;

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::sync::Arc;

use crate::bpf::types;
use crate::elf::{Elf, Segment, SymbolTable};
use crate::raw::{LossCounters, Proc};
use crate::runtime::{
    open_process, Frame, FrameName, Kind, Memory, NativeAt, Opener, Placed, ProcEntry, Runtime,
};
use crate::text::{count, noun};
use code::Heap;
use vmstructs::{Symbols, VmStructs, SYMBOLS};
use walk::WalkLayout;

/// A HotSpot `libjvm.so`: where its tables' symbols are in the file.
#[derive(Clone, Debug)]
pub struct Libjvm {
    /// The values of [`SYMBOLS`] in the file (add the load bias).
    pub symbols: Symbols,
    /// The values of [`threads::NAME_SYMBOLS`] in the file's full symbol
    /// table (0 for one absent).
    pub name_symbols: threads::NameSymbols,
    /// `nmethod`'s vtable in the file (`_ZTV7nmethod`, its full symbol
    /// table; 0 where absent): what tells compiled methods' blobs from
    /// others up to JDK 22.
    pub nmethod_vtable: u64,
    /// The JVM's compile count in the file (see [`COMPILE_COUNT`]; 0
    /// where absent).
    pub compile_count: u64,
    segments: Vec<Segment>,
}

/// The symbol of `nmethod`'s vtable.
const NMETHOD_VTABLE: &str = "_ZTV7nmethod";
/// The symbol of the JVM's compile count (`CompileBroker::
/// _compilation_id`, an int: the last compile id given).
const COMPILE_COUNT: &str = "_ZN13CompileBroker15_compilation_idE";

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
    let names: Vec<&str> = threads::NAME_SYMBOLS
        .iter()
        .flat_map(|n| n.iter().copied())
        .chain([NMETHOD_VTABLE, COMPILE_COUNT])
        .collect();
    let full = elf.symbols(file, SymbolTable::Full, &names)?;
    let mut name_symbols = [0u64; 6];
    let mut at = 0;
    for (s, alternatives) in name_symbols.iter_mut().zip(threads::NAME_SYMBOLS) {
        let found = &full[at..at + alternatives.len()];
        *s = found.iter().flatten().next().map_or(0, |f| f.value);
        at += alternatives.len();
    }
    let nmethod_vtable = full[at].map_or(0, |f| f.value);
    let compile_count = full[at + 1].map_or(0, |f| f.value);
    Ok(Some(Some(Libjvm {
        symbols,
        name_symbols,
        nmethod_vtable,
        compile_count,
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
    /// Once the BPF program has its entry: what its frames are named
    /// with.
    walked: Option<Walked>,
    /// Why its frames cannot be walked, for good.
    refused: bool,
    /// Where the statics its threads' names need are (see
    /// [`threads::NAME_SYMBOLS`]), and once read, how the names are read
    /// (Err: they cannot be).
    name_symbols: threads::NameSymbols,
    names: Option<Result<threads::NameLayout, ()>>,
    /// Where `nmethod`'s vtable is in the process (0: not known).
    nmethod_vtable: u64,
    /// Where the JVM's compile count is in the process (0: not known).
    compile_count: u64,
}

/// A JVM process whose Java frames the BPF program walks.
struct Walked {
    layout: WalkLayout,
    heaps: Vec<Heap>,
    mem: Box<dyn Memory>,
    /// The process's key among the methods named.
    key: u64,
    /// The BPF program's entry (its address space left to the tracer).
    entry: types::java_proc,
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
    /// The frames of each Java word of a stack met, by process.
    words: HashMap<(Proc, u64), Vec<Frame>>,
    names: frames::Names,
    next_key: u64,
    /// JVM processes whose frames were walked, and their releases.
    walked: HashMap<Proc, String>,
    /// What `-v` says of each JVM's tables read, once each.
    tables: BTreeSet<String>,
    /// Java's names of the JVMs' threads, by process and thread (kept
    /// after they end), with the `JavaThread` read: None for a thread id
    /// two of them had during the trace (which one a block was of is not
    /// known: the kernel's name stays).
    thread_names: HashMap<(Proc, u32), (u64, Option<Arc<str>>)>,
    /// Why a JVM's thread names could not be read, once each.
    names_unread: BTreeSet<String>,
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
            words: HashMap::new(),
            names: frames::Names::default(),
            next_key: 0,
            walked: HashMap::new(),
            tables: BTreeSet::new(),
            thread_names: HashMap::new(),
            names_unread: BTreeSet::new(),
        }
    }

    /// The BPF program's entry for process `p`, once its tables are read
    /// and its code cache is set up (None until then, or where its frames
    /// cannot be walked: said at the end).
    fn entry(&mut self, p: Proc) -> Option<ProcEntry> {
        let jp = self.procs.get_mut(&p)?;
        if jp.refused {
            return None;
        }
        if let Some(w) = &jp.walked {
            return Some(ProcEntry {
                kind: Kind::Java,
                value: unsafe { plain::as_bytes(&w.entry) }.to_vec(),
            });
        }
        let jvm = jp.read.clone()?;
        let mem = (self.open)(p.tgid).ok()?;
        let Some(major) = jvm.major() else {
            jp.refused = true;
            self.unreadable
                .insert(format!("HotSpot {}: not a release known", jvm.release));
            return None;
        };
        let layout = match WalkLayout::of(&jvm.structs, major) {
            Ok(l) => l,
            Err(why) => {
                jp.refused = true;
                self.unreadable
                    .insert(format!("HotSpot {}: {why}", jvm.release));
                return None;
            }
        };
        // A JVM starting: its code cache and interpreter come later.
        let heaps = code::heaps(mem.as_ref(), &layout.code).ok()?;
        let interpreter = walk::interpreter(mem.as_ref(), &jvm.structs).ok()?;
        if heaps.is_empty() || interpreter.0 == 0 {
            return None;
        }
        let key = self.next_key;
        self.next_key += 1;
        let mut w = Walked {
            layout,
            heaps,
            mem,
            key,
            entry: types::java_proc::default(),
        };
        let mut entry = match bpf_entry(&w, jp.nmethod_vtable) {
            Ok(e) => e,
            Err(why) => {
                jp.refused = true;
                self.unreadable
                    .insert(format!("HotSpot {}: {why}", jvm.release));
                return None;
            }
        };
        entry.interp_lo = interpreter.0;
        entry.interp_hi = interpreter.1;
        entry.call_stub_return = walk::call_stub_return(w.mem.as_ref(), &jvm.structs).unwrap_or(0);
        // Interpreted frames where a thread stopped in a bytecode's
        // template (else cut short there).
        if let Ok(Some(t)) = walk::templates(w.mem.as_ref(), &jvm.structs) {
            let l = &w.layout;
            let fits = |v: u64| u16::try_from(v).ok();
            if let (Some(method_const), Some(const_size), Some(const_code_size)) = (
                fits(l.code.method_const),
                fits(l.const_method_size),
                fits(l.const_code_size),
            ) {
                entry.templates_lo = t.low;
                entry.templates_hi = t.high;
                for (i, r) in t.returns.iter().enumerate() {
                    entry.returns_lo[i] = r.0;
                    entry.returns_hi[i] = r.1;
                }
                entry.method_const = method_const;
                entry.const_size = const_size;
                entry.const_code_size = const_code_size;
            }
        }
        w.entry = entry;
        jp.walked = Some(w);
        self.walked.insert(p, jvm.release.clone());
        Some(ProcEntry {
            kind: Kind::Java,
            value: unsafe { plain::as_bytes(&entry) }.to_vec(),
        })
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
                let (fields, types, ints, longs) = jvm.structs.counts();
                self.tables.insert(format!(
                    // wording: a count never 1
                    "java: HotSpot {}: structure tables of {fields} fields, {types} types, \
                     {ints} int and {longs} long constants",
                    jvm.release
                ));
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
        let name_symbols = lib
            .name_symbols
            .map(|s| if s == 0 { 0 } else { s.wrapping_add(bias) });
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
                    walked: None,
                    refused: false,
                    name_symbols,
                    names: None,
                    nmethod_vtable: if lib.nmethod_vtable == 0 {
                        0
                    } else {
                        lib.nmethod_vtable.wrapping_add(bias)
                    },
                    compile_count: if lib.compile_count == 0 {
                        0
                    } else {
                        lib.compile_count.wrapping_add(bias)
                    },
                },
            );
        }
        self.seen.entry(p).or_insert(None);
        self.read_process(p);
        self.entry(p)
    }

    fn forked(&mut self, _parent: u32, _child: Proc) {}

    fn exited(&mut self, p: Proc) {
        self.procs.remove(&p);
    }

    fn has_process(&self, p: Proc) -> bool {
        self.procs.get(&p).is_some_and(|jp| jp.walked.is_some())
    }

    fn pending(&self) -> Vec<Proc> {
        self.procs
            .iter()
            .filter(|(_, jp)| jp.walked.is_none() && !jp.refused)
            .map(|(&p, _)| p)
            .collect()
    }

    fn seen(&self, p: Proc) -> bool {
        self.seen.contains_key(&p)
    }

    fn owns(&self, word: u64) -> bool {
        frames::is_java_word(word)
    }

    fn note_code(&mut self, p: Proc, code: u64, _tag: u32, _at: u64) {
        self.resolve(p, &[code]);
    }

    fn resolve(&mut self, p: Proc, addrs: &[u64]) {
        let Some(w) = self
            .procs
            .get(&p)
            .and_then(|jp| Some((jp.read.as_ref()?, jp.walked.as_ref()?)))
        else {
            return;
        };
        let (jvm, w) = w;
        let r = frames::Reader {
            mem: w.mem.as_ref(),
            layout: &w.layout,
            structs: &jvm.structs,
            heaps: &w.heaps,
        };
        for &word in addrs {
            if frames::is_java_word(word) && !self.words.contains_key(&(p, word)) {
                let f = self.names.frames(&r, w.key, word);
                self.words.insert((p, word), f);
            }
        }
    }

    fn place(&self, p: Proc, addrs: &[u64], native: &[NativeAt]) -> Vec<Placed> {
        let mut out = Vec::with_capacity(addrs.len());
        for (i, &word) in addrs.iter().enumerate().take(native.len()) {
            if !frames::is_java_word(word) {
                out.push(Placed::Native(i));
                continue;
            }
            match self.words.get(&(p, word)) {
                Some(frames) => out.extend(frames.iter().map(|&f| Placed::Runtime(f))),
                None => out.push(Placed::Runtime(Frame::Unreadable)),
            }
        }
        out
    }

    fn name(&self, code: u32, at: u32) -> Option<FrameName<'_>> {
        self.names.name(code, at)
    }

    fn read_threads(&mut self) {
        for (&p, jp) in self.procs.iter_mut() {
            let (Some(jvm), Some(w)) = (&jp.read, &jp.walked) else {
                continue;
            };
            let mem = w.mem.as_ref();
            if jp.names.is_none() {
                let major = jvm.major().unwrap_or(0);
                match threads::NameLayout::read(mem, &jvm.structs, &jp.name_symbols, major) {
                    Ok(Some(l)) => jp.names = Some(Ok(l)),
                    // Not started yet.
                    Ok(None) => continue,
                    Err(why) => {
                        self.names_unread
                            .insert(format!("HotSpot {}: {why}", jvm.release));
                        jp.names = Some(Err(()));
                    }
                }
            }
            let Some(Ok(l)) = &jp.names else {
                continue;
            };
            let Ok(list) = walk::threads(mem, &w.layout) else {
                continue;
            };
            for (thread, tid) in list {
                match self.thread_names.get_mut(&(p, tid)) {
                    Some((seen, _)) if *seen == thread => {}
                    // The id again, another thread's now.
                    Some((_, name)) => *name = None,
                    None => {
                        if let Ok(Some(name)) = threads::name(mem, l, thread) {
                            self.thread_names
                                .insert((p, tid), (thread, Some(name.into())));
                        }
                    }
                }
            }
        }
    }

    fn thread_name(&self, p: Proc, tid: u32) -> Option<Arc<str>> {
        self.thread_names.get(&(p, tid))?.1.clone()
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

    fn copy_mark(&self, p: Proc) -> Option<u64> {
        let jp = self.procs.get(&p)?;
        if jp.compile_count == 0 || jp.refused {
            return None;
        }
        let opened;
        let mem = match &jp.walked {
            Some(w) => w.mem.as_ref(),
            None => {
                opened = (self.open)(p.tgid).ok()?;
                opened.as_ref()
            }
        };
        code::u32_at(mem, jp.compile_count).ok().map(u64::from)
    }

    fn copy_ready(&self, p: Proc) -> bool {
        self.procs
            .get(&p)
            .is_none_or(|jp| jp.refused || jp.walked.is_some())
    }

    fn step_copy(
        &self,
        p: Proc,
        mark: Option<u64>,
        at: crate::runtime::CopyAt,
        read: &dyn Fn(u64) -> Option<u64>,
    ) -> crate::runtime::CopyStep {
        match self.procs.get(&p).and_then(|jp| jp.walked.as_ref()) {
            Some(w) => copies::step(w, mark, at, read),
            None => crate::runtime::CopyStep::NotMine,
        }
    }

    fn report(&self, c: &LossCounters, verbose: bool) -> Vec<String> {
        let spec = Kind::Java.spec();
        let mut lines = Vec::new();
        let unwalked: Vec<&Option<String>> = self
            .seen
            .iter()
            .filter(|(p, _)| !self.walked.contains_key(p))
            .map(|(_, r)| r)
            .collect();
        if !unwalked.is_empty() {
            let releases: BTreeSet<&str> = unwalked.iter().filter_map(|r| r.as_deref()).collect();
            let releases = if releases.is_empty() {
                String::new()
            } else {
                format!(
                    " (HotSpot {})",
                    releases.into_iter().collect::<Vec<_>>().join(", ")
                )
            };
            let n = unwalked.len();
            let (processes, their) = if n == 1 {
                ("process", "its")
            } else {
                ("processes", "their")
            };
            lines.push(format!(
                // wording: not a count
                "the Java frames of {n} JVM {processes}{releases} were not walked (no code cache \
                 set up yet, or its tables could not be read): {their} stacks show the JVM's \
                 native frames, and the addresses of its code in place of Java methods"
            ));
        }
        if c.java_cut_running + c.java_cut_unreadable + self.names.unreadable > 0 {
            lines.push(format!(
                "{} of Java frames stopped where the thread was stopped in Java code (not at a \
                 call, its frame perhaps not set up), {} at a code cache or frame that could not \
                 be read, and {} could not be named: shown as {} and {}",
                count(c.java_cut_running, "walk", "walks"),
                c.java_cut_unreadable,
                count(self.names.unreadable, "Java frame", "Java frames"),
                spec.cut_short,
                spec.unreadable
            ));
        }
        if self.names.deoptimized > 0 {
            let n = self.names.deoptimized;
            lines.push(format!(
                "{} {} to be deoptimized and {} own pc was not found (the JVM's tables do not say \
                 where it is kept): shown as {}",
                count(n, "compiled Java frame", "compiled Java frames"),
                noun(n, "was", "were"),
                noun(n, "its", "their"),
                spec.unreadable
            ));
        }
        if self.names.replaced > 0 {
            let n = self.names.replaced;
            lines.push(format!(
                "{} {} in code replaced before it was named (recompiled or flushed): shown as {}",
                count(n, "compiled Java frame", "compiled Java frames"),
                noun(n, "was", "were"),
                frames::REPLACED
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
        for why in &self.names_unread {
            lines.push(format!(
                "a JVM's Java thread names cannot be read ({why}): its threads keep the kernel's \
                 names (15 characters)"
            ));
        }
        if verbose {
            lines.extend(self.tables.iter().cloned());
            if !self.walked.is_empty() {
                lines.push(format!(
                    "java: {} walked; {} through Java code, {}; {} named ({} of new frames \
                     lost)",
                    count(self.walked.len() as u64, "JVM process", "JVM processes"),
                    count(c.java_stacks, "user stack", "user stacks"),
                    count(c.java_frames, "Java frame", "Java frames"),
                    count(self.names.methods_read, "method", "methods"),
                    count(c.java_events_lost, "notice", "notices")
                ));
                let reused = self
                    .thread_names
                    .values()
                    .filter(|(_, n)| n.is_none())
                    .count();
                lines.push(format!(
                    "java: {} read; {} had by two Java threads, left with the kernel's names",
                    count(
                        self.thread_names.len() as u64,
                        "Java thread name",
                        "Java thread names"
                    ),
                    count(reused as u64, "thread id", "thread ids")
                ));
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests;

/// The BPF program's entry for the JVM `w`, whose `nmethod` vtable is at
/// `nmethod_vtable` (0: not known) (its interpreter's range and address
/// space left to the caller).
fn bpf_entry(w: &Walked, nmethod_vtable: u64) -> Result<types::java_proc, String> {
    let l = &w.layout;
    let heaps = types::java_proc::default().heap_lo.len();
    if w.heaps.len() > heaps {
        return Err(format!("a code cache of {} heaps", w.heaps.len()));
    }
    let narrow = |v: u64, what: &str| -> Result<u16, String> {
        u16::try_from(v).map_err(|_| format!("{what} at {v}"))
    };
    let slot = |words: i64| -> i16 { (words * 8) as i16 };
    let header_read = l.blob_frame_size.max(l.code.nmethod_compile_id) + 4;
    // Deoptimized frames are followed where their fields are in the
    // header read (else they are left unexpanded, said at the end).
    let deopt_end = |d: &walk::Deopt| {
        (d.handler + 8)
            .max(d.orig_pc_offset + 4)
            .max(d.blob_size + 4)
    };
    let deopt = l
        .deopt
        .filter(|d| deopt_end(d) <= u64::from(types::java_limits::JAVA_HEADER_BYTES.0));
    let header_read = deopt.map_or(header_read, |d| header_read.max(deopt_end(&d)));
    // Frames stopped in compiled code are followed where the blob's
    // fields are in the header read, and compiled methods' blobs can be
    // told (else they are cut short, as they are where these are not
    // known).
    let code_begin = match l.code.code_begin {
        code::CodeBegin::Pointer(o) => (o, false),
        code::CodeBegin::Offset(o) => (o, true),
    };
    let running = l.running.and_then(|r| {
        let (at, bytes, value) = match r.kind {
            walk::NmethodKind::Vtable if nmethod_vtable != 0 => {
                // The vtable pointer: past the offset-to-top and the
                // type info.
                (0, 8u8, nmethod_vtable.wrapping_add(16))
            }
            walk::NmethodKind::Vtable => return None,
            walk::NmethodKind::Byte(at, v) => (at, 1, u64::from(v)),
        };
        let end = (at + u64::from(bytes))
            .max(code_begin.0 + 8)
            .max(r.frame_complete + 4)
            .max(r.stub_offset + 4)
            .max(r.comp_level + 1);
        (end <= u64::from(types::java_limits::JAVA_HEADER_BYTES.0))
            .then_some((r, at, bytes, value, end))
    });
    let header_read = running.map_or(header_read, |r| header_read.max(r.4));
    if header_read > u64::from(types::java_limits::JAVA_HEADER_BYTES.0) {
        return Err(format!(
            "a blob's compile id at {}",
            l.code.nmethod_compile_id
        ));
    }
    let slots = [
        -(walk::INTERP_METHOD as i64),
        -(walk::INTERP_BCP as i64),
        l.interp_sender_sp,
    ];
    let low = i64::from(types::java_limits::JAVA_FRAME_LOW.0 as i32) / 8;
    if let Some(s) = slots.iter().find(|&&s| s < low || s >= 2) {
        // wording: a count never 1
        return Err(format!("an interpreted frame's slot at {s} words"));
    }
    let mut e = types::java_proc {
        block_header: narrow(l.code.heap_block_size, "a heap block's header")?,
        frame_size: narrow(l.blob_frame_size, "a blob's frame size")?,
        compile_id: narrow(l.code.nmethod_compile_id, "an nmethod's compile id")?,
        header_read: header_read as u16,
        heaps: w.heaps.len() as u16,
        interp_method: slot(slots[0]),
        interp_bcp: slot(slots[1]),
        interp_sender_sp: slot(slots[2]),
        ..Default::default()
    };
    if let Some(d) = deopt {
        e.deopt_handler = narrow(d.handler, "a compiled method's deoptimization handler")?;
        e.orig_pc_offset = narrow(d.orig_pc_offset, "an nmethod's original pc offset")?;
        e.blob_size = narrow(d.blob_size, "a blob's size")?;
        e.deopt_relative = u8::from(d.relative);
    }
    if let Some((r, at, bytes, value, _)) = running {
        e.nm_kind = value;
        e.nm_kind_at = narrow(at, "a blob's kind")?;
        e.nm_kind_bytes = bytes;
        e.code_begin = narrow(code_begin.0, "a blob's code")?;
        e.code_relative = u8::from(code_begin.1);
        e.frame_complete = narrow(r.frame_complete, "a blob's frame-complete offset")?;
        e.frame_complete_short = u8::from(r.frame_complete_short);
        e.stub_offset = narrow(r.stub_offset, "an nmethod's stubs")?;
        e.comp_level = narrow(r.comp_level, "an nmethod's compile level")?;
    }
    for (i, h) in w.heaps.iter().enumerate() {
        e.heap_lo[i] = h.low;
        e.heap_hi[i] = h.high;
        e.segmap[i] = h.segmap;
        e.log2_segment[i] = h.log2_segment as u8;
    }
    Ok(e)
}
