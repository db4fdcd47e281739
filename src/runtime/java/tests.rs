//! Unit tests of the HotSpot support: the structure tables read from made-up
//! memory (whole, not set up yet, hostile) and from the JVMs installed
//! (Debian's JDK 17, and the JDK 11, 21 and 25 runtimes `scripts/setup
//! --test` unpacks).

use super::vmstructs::{read, Unreadable, SYMBOLS};
use super::*;
use crate::runtime::{Memory, ProcMem};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Memory in regions: a read is whole within one, or fails.
#[derive(Clone, Default)]
struct Fake(BTreeMap<u64, Vec<u8>>);

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let fail = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "unmapped");
        let (&start, bytes) = self.0.range(..=addr).next_back().ok_or_else(fail)?;
        let off = (addr - start) as usize;
        let end = off.checked_add(buf.len()).ok_or_else(fail)?;
        buf.copy_from_slice(bytes.get(off..end).ok_or_else(fail)?);
        Ok(())
    }
}

const SYMS: u64 = 0x1000;
const STRINGS: u64 = 0x8_0000;

/// A process's memory with HotSpot's four tables, laid out as JDK 17 lays
/// them out (its entries' offsets and strides): `fields` (type, field,
/// static, offset or address), `types` (name, size), the constants.
struct Tables {
    mem: Fake,
    strings: Vec<u8>,
}

impl Tables {
    fn string(&mut self, s: &str) -> u64 {
        let at = STRINGS + self.strings.len() as u64;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        at
    }

    fn build(
        fields: &[(&str, &str, bool, u64)],
        types: &[(&str, u64)],
        ints: &[(&str, i32)],
        longs: &[(&str, u64)],
    ) -> Fake {
        let mut t = Tables {
            mem: Fake::default(),
            strings: Vec::new(),
        };
        let mut syms = [0u64; 24];
        // Fields: typeName 0, fieldName 8, typeString 16, isStatic 24,
        // offset 32, address 40; 48 bytes.
        let mut table = Vec::new();
        for &(ty, field, is_static, value) in fields {
            let mut e = [0u8; 48];
            e[0..8].copy_from_slice(&t.string(ty).to_le_bytes());
            e[8..16].copy_from_slice(&t.string(field).to_le_bytes());
            e[16..24].copy_from_slice(&t.string("int").to_le_bytes());
            e[24..28].copy_from_slice(&u32::from(is_static).to_le_bytes());
            let at = if is_static { 40 } else { 32 };
            e[at..at + 8].copy_from_slice(&value.to_le_bytes());
            table.extend_from_slice(&e);
        }
        table.extend_from_slice(&[0u8; 48]);
        t.mem.0.insert(0x10_0000, table);
        syms[..8].copy_from_slice(&[0x10_0000, 48, 0, 8, 16, 24, 32, 40]);
        // Types: typeName 0, superclassName 8, isOopType 16,
        // isIntegerType 20, isUnsigned 24, size 32; 40 bytes.
        let mut table = Vec::new();
        for &(ty, size) in types {
            let mut e = [0u8; 40];
            e[0..8].copy_from_slice(&t.string(ty).to_le_bytes());
            e[32..40].copy_from_slice(&size.to_le_bytes());
            table.extend_from_slice(&e);
        }
        table.extend_from_slice(&[0u8; 40]);
        t.mem.0.insert(0x20_0000, table);
        syms[8..16].copy_from_slice(&[0x20_0000, 40, 0, 8, 16, 20, 24, 32]);
        // Constants: name 0, value 8; 16 bytes.
        let mut table = Vec::new();
        for &(name, v) in ints {
            table.extend_from_slice(&t.string(name).to_le_bytes());
            table.extend_from_slice(&(v as u32 as u64).to_le_bytes());
        }
        table.extend_from_slice(&[0u8; 16]);
        t.mem.0.insert(0x30_0000, table);
        syms[16..20].copy_from_slice(&[0x30_0000, 16, 0, 8]);
        let mut table = Vec::new();
        for &(name, v) in longs {
            table.extend_from_slice(&t.string(name).to_le_bytes());
            table.extend_from_slice(&v.to_le_bytes());
        }
        table.extend_from_slice(&[0u8; 16]);
        t.mem.0.insert(0x40_0000, table);
        syms[20..24].copy_from_slice(&[0x40_0000, 16, 0, 8]);
        // The symbols: each a variable of its own, the value above.
        let mut vars = Vec::new();
        for v in syms {
            vars.extend_from_slice(&v.to_le_bytes());
        }
        t.mem.0.insert(SYMS, vars);
        let strings = std::mem::take(&mut t.strings);
        t.mem.0.insert(STRINGS, strings);
        t.mem
    }
}

fn symbols() -> vmstructs::Symbols {
    std::array::from_fn(|i| SYMS + 8 * i as u64)
}

fn sample() -> Fake {
    Tables::build(
        &[
            ("Method", "_constMethod", false, 8),
            ("CodeCache", "_heaps", true, 0x7f00_1234),
            ("Klass", "_name", false, 16),
        ],
        &[("Method", 88), ("Klass", 200)],
        &[("frame::interpreter_frame_method_offset", -3)],
        &[("markWord::klass_shift", 32)],
    )
}

/// A return poll's stub at its mov and its jmp, told from the same `mov
/// [r15+d],r10; jmp` after `xor r10,r10` (no pc stored: not known).
#[test]
fn poll_stubs_are_told_from_stores_of_zero() {
    use walk::FrameAt;
    // 8 bytes before the pc, then 16 from it.
    let at = |before: &[u8], from: &[u8]| {
        let mut code = [0x90u8; 24];
        code[8 - before.len()..8].copy_from_slice(before);
        code[8..8 + from.len()].copy_from_slice(from);
        walk::frame_at(&code)
    };
    let mov = [0x4d, 0x89, 0x97, 0x00, 0x05, 0x00, 0x00];
    let jmp = [0xe9, 0x10, 0x20, 0x00, 0x00];
    // lea r10,[rip-0x80] before: at the mov, at the jmp.
    let lea = [0x4c, 0x8d, 0x15, 0x80, 0xff, 0xff, 0xff];
    assert_eq!(
        at(&lea[6..], &[&mov[..], &jmp[..]].concat()),
        FrameAt::Return
    );
    assert_eq!(at(&[&lea[6..], &mov[..]].concat(), &jmp), FrameAt::Return);
    // xor r10,r10 before.
    let xor = [0x4d, 0x33, 0xd2];
    assert_eq!(at(&xor, &[&mov[..], &jmp[..]].concat()), FrameAt::Unknown);
    assert_eq!(at(&[&xor[2..], &mov[..]].concat(), &jmp), FrameAt::Unknown);
}

#[test]
fn reads_the_four_tables() {
    let s = read(&sample(), &symbols()).unwrap();
    assert_eq!(s.offset("Method", "_constMethod"), Some(8));
    assert_eq!(s.offset("Klass", "_name"), Some(16));
    // A static field has an address, no offset.
    assert_eq!(s.address("CodeCache", "_heaps"), Some(0x7f00_1234));
    assert_eq!(s.offset("CodeCache", "_heaps"), None);
    assert_eq!(s.address("Method", "_constMethod"), None);
    assert_eq!(s.field("Method", "_nope"), None);
    assert_eq!(s.size("Method"), Some(88));
    assert_eq!(s.size("Klass"), Some(200));
    assert_eq!(s.int("frame::interpreter_frame_method_offset"), Some(-3));
    assert_eq!(s.long("markWord::klass_shift"), Some(32));
    assert_eq!(s.counts(), (3, 2, 1, 1));
}

/// Before libjvm's initializers run, its entry layouts are zero: not set
/// up yet, to be read again, not a malformed table.
#[test]
fn tables_not_set_up_yet_are_said_so() {
    let mut mem = sample();
    let vars = mem.0.get_mut(&SYMS).unwrap();
    for i in [1usize, 9, 17, 21] {
        vars[i * 8..i * 8 + 8].fill(0);
    }
    assert!(matches!(read(&mem, &symbols()), Err(Unreadable::NotReady)));
}

/// Entry layouts no JVM has (a stride past the bound, a field past its
/// entry), a table without its end, a name without its NUL: refused.
#[test]
fn malformed_tables_are_refused() {
    let set = |i: usize, v: u64| {
        let mut mem = sample();
        let vars = mem.0.get_mut(&SYMS).unwrap();
        vars[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        read(&mem, &symbols())
    };
    assert!(matches!(set(1, 4096), Err(Unreadable::Malformed(_))));
    assert!(matches!(set(6, 44), Err(Unreadable::Malformed(_))));
    // The fields' table with its last entry (the end) cut off: the read
    // past it fails.
    let mut mem = sample();
    let t = mem.0.get_mut(&0x10_0000).unwrap();
    t.truncate(t.len() - 48);
    assert!(read(&mem, &symbols()).is_err());
    // Strings without their NUL.
    let mut mem = sample();
    let s = mem.0.get_mut(&STRINGS).unwrap();
    for b in s.iter_mut() {
        if *b == 0 {
            *b = b'x';
        }
    }
    s.extend(std::iter::repeat_n(b'y', 1000));
    assert!(matches!(
        read(&mem, &symbols()),
        Err(Unreadable::Malformed(_))
    ));
}

/// Random bytes of the tables, their strings and their layouts changed:
/// every read ends, with tables or an error, never a panic.
#[test]
fn hostile_tables_never_panic() {
    let base = sample();
    let mut rng = crate::hostile::Rng(0x9e37_79b9_7f4a_7c15);
    let keys: Vec<u64> = base.0.keys().copied().collect();
    let mut read_ok = 0;
    for _ in 0..3000 {
        let mut mem = base.clone();
        for _ in 0..1 + rng.next() % 4 {
            let key = keys[(rng.next() % keys.len() as u64) as usize];
            let region = mem.0.get_mut(&key).unwrap();
            let at = (rng.next() % region.len() as u64) as usize;
            region[at] = match rng.next() % 4 {
                0 => 0,
                1 => 0xff,
                _ => rng.next() as u8,
            };
        }
        if read(&mem, &symbols()).is_ok() {
            read_ok += 1;
        }
    }
    // Most changes hit bytes no reader looks at (padding, values).
    assert!(read_ok > 0);
}

/// The sample's tables with the JVM's release (a static `char *`).
fn with_release(release: &str) -> Fake {
    let mut mem = Tables::build(
        &[
            ("Method", "_constMethod", false, 8),
            ("Abstract_VM_Version", "_s_vm_release", true, 0x50_0000),
        ],
        &[("Method", 88)],
        &[],
        &[],
    );
    mem.0.insert(0x50_0000, 0x60_0000u64.to_le_bytes().to_vec());
    let mut s = release.as_bytes().to_vec();
    s.push(0);
    mem.0.insert(0x60_0000, s);
    mem
}

static MEMORY: std::sync::Mutex<Option<Fake>> = std::sync::Mutex::new(None);

fn open_fake(_: u32) -> std::io::Result<Box<dyn Memory>> {
    Ok(Box::new(MEMORY.lock().unwrap().clone().unwrap()))
}

/// A JVM noted while it starts (libjvm's initializers not run yet): seen
/// and said, its tables read at the end, and its release said then.
#[test]
fn a_jvm_starting_is_read_again_at_the_end() {
    let mut starting = with_release("17.0.99+1");
    let vars = starting.0.get_mut(&SYMS).unwrap();
    for i in [1usize, 9, 17, 21] {
        vars[i * 8..i * 8 + 8].fill(0);
    }
    *MEMORY.lock().unwrap() = Some(starting);
    let mut jvms = Jvms::with_memory(open_fake);
    let segments = vec![Segment {
        offset: 0,
        vaddr: 0,
        filesz: 1 << 30,
    }];
    jvms.objects.insert(
        7,
        Some(Arc::new(Libjvm {
            symbols: symbols(),
            name_symbols: [0; 6],
            nmethod_vtable: 0,
            compile_count: 0,
            segments,
        })),
    );
    let p = Proc { tgid: 1, start: 1 };
    assert!(jvms.note_process(p, 7, 0, 0).is_none());
    assert!(jvms.seen(p) && !jvms.has_process(p));
    let report = |jvms: &Jvms| jvms.report(&LossCounters::default(), true).join("\n");
    let said = report(&jvms);
    assert!(
        said.contains("the Java frames of 1 JVM process were not walked"),
        "{said}"
    );
    *MEMORY.lock().unwrap() = Some(with_release("17.0.99+1"));
    jvms.settle();
    let said = report(&jvms);
    assert!(
        said.contains("the Java frames of 1 JVM process (HotSpot 17.0.99+1) were not walked"),
        "{said}"
    );
    assert!(
        said.contains("java: HotSpot 17.0.99+1: structure tables of 2 fields, 1 types"),
        "{said}"
    );
    assert_eq!(jvms.jvm(p).and_then(Jvm::major), Some(17));
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The JVMs installed: Debian's JDK 17, and the runtimes of 11, 21 and 25
/// under /opt/offcputime-test/jdk (scripts/setup --test). A missing one
/// fails under CI=true.
fn jdks() -> Vec<(u32, PathBuf)> {
    let mut found = Vec::new();
    let candidates = [
        (11, PathBuf::from("/opt/offcputime-test/jdk/11/bin/java")),
        (
            17,
            PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
        ),
        (21, PathBuf::from("/opt/offcputime-test/jdk/21/bin/java")),
        (25, PathBuf::from("/opt/offcputime-test/jdk/25/bin/java")),
    ];
    for (major, java) in candidates {
        if java.exists() {
            found.push((major, java));
        } else {
            assert!(!ci(), "{} is needed (CI=true)", java.display());
            eprintln!("skipped: {} not found", java.display());
        }
    }
    found
}

/// JavaBlockers compiled into a directory of its own (Debian's javac, for
/// release 11, so that every JVM runs it).
fn compiled_workload() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/JavaBlockers.java");
    let javac = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/bin/javac");
    if !javac.exists() {
        assert!(!ci(), "{} is needed (CI=true)", javac.display());
        eprintln!("skipped: no javac");
        return None;
    }
    let ok = Command::new(javac)
        .args(["--release", "11", "-d"])
        .arg(dir.path())
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "javac failed");
    Some(dir)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the workload printed of its threads: each thread's name and its
/// frames, innermost first, as `(class.method, line)` (the line where the
/// JVM has one).
type Reported = Vec<(String, Vec<(String, Option<u32>)>)>;

/// Starts JavaBlockers under `java` and waits for its threads to block:
/// the JVM, and what it reported of its threads.
fn start(java: &Path, classes: &Path, options: &[&str]) -> (KillOnDrop, Reported) {
    let mut child = KillOnDrop(
        Command::new(java)
            .args([
                "-XX:CompileCommand=quiet",
                "-XX:CompileCommand=exclude,JavaBlockers::mixedMiddle",
                "-XX:CompileCommand=dontinline,JavaBlockers::deoptBlock",
                "-XX:CompileCommand=exclude,JavaBlockers::spinInterpreted",
            ])
            .args(options)
            .arg("-cp")
            .arg(classes)
            .arg("JavaBlockers")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = BufReader::new(child.0.stdout.take().unwrap());
    let mut reported: Reported = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        if line.starts_with("READY") {
            return (child, reported);
        }
        if let Some(name) = line.strip_prefix("THREAD ") {
            reported.push((name.to_string(), Vec::new()));
        } else if let Some(frame) = line.strip_prefix("FRAME ") {
            let (method, place) = frame.split_once(' ').unwrap();
            let line = place.rsplit_once(':').and_then(|(_, n)| n.parse().ok());
            reported
                .last_mut()
                .unwrap()
                .1
                .push((method.to_string(), line));
        }
    }
    panic!("{} JavaBlockers ended before READY", java.display());
}

/// Where libjvm.so is mapped in process `pid`: its path and lowest
/// mapping's start and file offset.
fn libjvm_of(pid: u32) -> (PathBuf, u64, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for line in maps.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 6 && t[5].ends_with("/libjvm.so") {
            let start = u64::from_str_radix(t[0].split('-').next().unwrap(), 16).unwrap();
            return (
                PathBuf::from(t[5]),
                start,
                u64::from_str_radix(t[2], 16).unwrap(),
            );
        }
    }
    panic!("no libjvm.so in {pid}:\n{maps}");
}

/// The libjvm.so of running JVM `pid`, read, its load bias, and the
/// process's memory.
fn open_jvm(pid: u32) -> (Libjvm, u64, ProcMem) {
    let (path, start, offset) = libjvm_of(pid);
    let file = File::open(&path).unwrap();
    let lib = inspect(&file, "libjvm.so").unwrap().unwrap().unwrap();
    let bias = crate::elf::load_bias(&lib.segments, start, offset).unwrap();
    (lib, bias, ProcMem::open(pid).unwrap())
}

/// Each JVM's tables, read from the running process as the profiler
/// reads them: its release is the one installed, and the fields and
/// sizes a walk of its frames needs are there.
#[test]
fn reads_the_tables_of_live_jvms() {
    let jdks = jdks();
    let Some(classes) = compiled_workload() else {
        return;
    };
    let running: Vec<(u32, (KillOnDrop, Reported))> = jdks
        .iter()
        .map(|(major, java)| (*major, start(java, classes.path(), &[])))
        .collect();
    for (major, (child, reported)) in &running {
        let pid = child.0.id();
        let (lib, bias, mem) = open_jvm(pid);
        let jvm = Jvm::read(&mem, &lib.symbols.map(|s| s + bias))
            .unwrap_or_else(|e| panic!("JDK {major}: {e}"));
        assert_eq!(jvm.major(), Some(*major), "release {}", jvm.release);
        let s = &jvm.structs;
        let (fields, types, ints, longs) = s.counts();
        eprintln!(
            "JDK {major} ({}): {fields} fields, {types} types, {ints} int and {longs} long constants",
            jvm.release
        );
        assert!(fields > 500 && types > 300 && ints > 50, "JDK {major}");
        for (ty, field) in [
            ("Method", "_constMethod"),
            ("ConstMethod", "_constants"),
            ("ConstantPool", "_pool_holder"),
            ("Klass", "_name"),
            ("Symbol", "_length"),
            ("CodeBlob", "_name"),
            ("JavaThread", "_anchor"),
        ] {
            let offset = s.offset(ty, field);
            let size = s.size(ty);
            assert!(
                offset.is_some() && size.is_some() && offset < size,
                "JDK {major}: {ty}::{field} at {offset:?} of {size:?}"
            );
        }
        // Known values, the same on every release: a Method's vtable
        // pointer, then its ConstMethod; a Klass's name after its layout
        // helper, id and super check offset.
        assert_eq!(s.offset("Method", "_constMethod"), Some(8), "JDK {major}");
        assert_eq!(s.offset("Klass", "_name"), Some(24), "JDK {major}");
        assert_eq!(
            s.offset("Symbol", "_length"),
            Some(if *major == 11 { 0 } else { 4 })
        );
        assert_eq!(s.size("Symbol"), Some(8), "JDK {major}");
        assert!(
            s.address("CodeCache", "_heaps").is_some_and(|a| a != 0),
            "JDK {major}: no CodeCache::_heaps"
        );
        for ty in ["Method", "ConstMethod", "nmethod", "JavaThread"] {
            assert!(
                s.size(ty).is_some_and(|n| n > 0),
                "JDK {major}: no size of {ty}"
            );
        }
        let blobs = compiled_methods_as_the_jvm_lists_them(*major, pid, &jvm, &mem);
        epilogues_are_told(*major, &jvm, &mem, lib.nmethod_vtable + bias, &blobs);
        let name_symbols = lib.name_symbols.map(|s| if s == 0 { 0 } else { s + bias });
        thread_names_as_the_jvm_reports_them(*major, pid, &jvm, &mem, &name_symbols, reported);
        threads_walk_as_the_jvm_reports_them(*major, pid, &jvm, &mem, reported);
        copies_walk_as_the_jvm_reports_them(*major, pid, &jvm, lib.compile_count + bias, reported);
        // The bytecode templates, one run of the interpreter's code, the
        // returning ones among them.
        let t = walk::templates(&mem, &jvm.structs)
            .unwrap()
            .unwrap_or_else(|| panic!("JDK {major}: no bytecode templates"));
        let (lo, hi) = walk::interpreter(&mem, &jvm.structs).unwrap();
        assert!(
            lo <= t.low && t.low < t.high && t.high <= hi,
            "JDK {major}: {t:x?}"
        );
        for r in t.returns {
            assert!(
                t.low <= r.0 && r.0 < r.1 && r.1 <= t.high,
                "JDK {major}: {t:x?}"
            );
        }
    }
}

/// Each blocked thread of the workload, walked from its frame anchor:
/// its Java frames, named and at their lines, are those the JVM reported
/// (`Thread.getAllStackTraces()`), in order.
fn threads_walk_as_the_jvm_reports_them(
    major: u32,
    pid: u32,
    jvm: &Jvm,
    mem: &ProcMem,
    reported: &Reported,
) {
    let l =
        walk::WalkLayout::of(&jvm.structs, major).unwrap_or_else(|e| panic!("JDK {major}: {e}"));
    let heaps = code::heaps(mem, &l.code).unwrap();
    let threads = walk::threads(mem, &l).unwrap();
    let mut compared = 0;
    let mut report = String::new();
    for (name, frames) in reported {
        let comm: String = name.chars().take(15).collect();
        let mut tried = Vec::new();
        let mut matched = false;
        for &(jt, tid) in &threads {
            let c =
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
            if c.trim_end() != comm {
                continue;
            }
            let walked = walk::walk(mem, &l, &heaps, jt).unwrap();
            let named: Vec<(String, Option<u32>)> = walked
                .iter()
                .map(|f| {
                    let m = code::method_name(mem, &l.code, f.method).unwrap();
                    if m.class == "JavaBlockers" {
                        let file = walk::source_file(mem, &l.code, &jvm.structs, f.method).unwrap();
                        assert_eq!(file.as_deref(), Some("JavaBlockers.java"), "JDK {major}");
                    }
                    (
                        format!("{}.{}", m.class, m.name),
                        walk::line(mem, &l, f.method, f.bci).unwrap(),
                    )
                })
                .collect();
            let same = named.len() == frames.len()
                && named.iter().zip(frames).all(|((n, ln), (want, want_ln))| {
                    n == want && (want_ln.is_none() || ln == want_ln)
                });
            matched |= same;
            tried.push(format!("{named:?}"));
        }
        compared += 1;
        if !matched {
            report.push_str(&format!(
                "{name}: the JVM says {frames:?}\n  walked: {}\n",
                tried.join("\n  or ")
            ));
        }
    }
    assert!(compared >= 8, "JDK {major}: {compared} threads");
    assert!(report.is_empty(), "JDK {major}:\n{report}");
}

/// Each blocked thread of the workload, its stack copied from its frame
/// anchor as the BPF program copies a new process's stacks, walked over
/// the copy as the profiler walks such copies (its Java frames' words
/// named): its Java frames are those the JVM reported, in order; with a
/// compile count from before the compiled frames' code was made (0), the
/// walk stops at the first compiled frame.
fn copies_walk_as_the_jvm_reports_them(
    major: u32,
    pid: u32,
    jvm: &Jvm,
    compile_count: u64,
    reported: &Reported,
) {
    use crate::runtime::{CopyAt, CopyStep, Frame};
    let mem = ProcMem::open(pid).unwrap();
    let layout = walk::WalkLayout::of(&jvm.structs, major).unwrap();
    let heaps = code::heaps(&mem, &layout.code).unwrap();
    let (interp_lo, interp_hi) = walk::interpreter(&mem, &jvm.structs).unwrap();
    let threads = walk::threads(&mem, &layout).unwrap();
    let count = code::u32_at(&mem, compile_count).unwrap();
    assert!(count > 20, "JDK {major}: a compile count of {count}");
    let w = Walked {
        layout: layout.clone(),
        heaps: heaps.clone(),
        mem: Box::new(ProcMem::open(pid).unwrap()),
        key: 1,
        entry: types::java_proc {
            interp_lo,
            interp_hi,
            call_stub_return: walk::call_stub_return(&mem, &jvm.structs).unwrap(),
            ..Default::default()
        },
    };
    let r = frames::Reader {
        mem: &mem,
        layout: &layout,
        structs: &jvm.structs,
        heaps: &heaps,
    };
    let mut names = frames::Names::default();
    let (mut compared, mut stopped) = (0, 0);
    let mut report = String::new();
    for (name, want) in reported {
        let comm: String = name.chars().take(15).collect();
        let mut tried = Vec::new();
        for &(jt, tid) in &threads {
            let c =
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
            if c.trim_end() != comm {
                continue;
            }
            let (sp, pc, fp) = walk::anchor(&mem, &layout, jt).unwrap();
            let mut copy = vec![0u8; 64 << 10];
            let n = walk::read_some(&mem, sp, &mut copy).unwrap();
            copy.truncate(n);
            let read = |addr: u64| -> Option<u64> {
                let off = usize::try_from(addr.checked_sub(sp)?).ok()?;
                Some(u64::from_le_bytes(copy.get(off..off + 8)?.try_into().ok()?))
            };
            let mut walk_copy = |mark: Option<u64>| -> (Vec<(String, Option<u32>)>, bool) {
                let mut at = CopyAt {
                    pc,
                    sp,
                    bp: fp,
                    exact: false,
                };
                let mut words = Vec::new();
                let mut cut = false;
                for _ in 0..256 {
                    match copies::step(&w, mark, at, &read) {
                        CopyStep::Next { word, pc, sp, bp } => {
                            words.push(word);
                            at = CopyAt {
                                pc,
                                sp,
                                bp,
                                exact: false,
                            };
                        }
                        CopyStep::End { word, cut: c } => {
                            words.push(word);
                            cut = c;
                            break;
                        }
                        CopyStep::ByFramePointer { word } => {
                            words.push(word);
                            break;
                        }
                        CopyStep::NotMine => break,
                    }
                }
                let mut named = Vec::new();
                for word in words {
                    for f in names.frames(&r, 1, word) {
                        if let Frame::Code { code, at } = f {
                            let n = names.name(code, at).unwrap();
                            if !n.name.starts_with('[') {
                                named.push((n.name.to_string(), n.line));
                            }
                        }
                    }
                }
                (named, cut)
            };
            let (named, cut) = walk_copy(Some(u64::from(count)));
            let same = !cut
                && named.len() == want.len()
                && named
                    .iter()
                    .zip(want)
                    .all(|((n, ln), (w, wln))| n == w && (wln.is_none() || ln == wln));
            if same {
                compared += 1;
                // With the count of a JVM that had compiled nothing, the
                // first compiled frame stops the walk.
                let (before, cut) = walk_copy(Some(0));
                if before.len() < named.len() {
                    assert!(cut, "JDK {major}: {name}: {before:?}");
                    stopped += 1;
                }
                tried.clear();
                break;
            }
            tried.push(format!("{named:?} (cut: {cut})"));
        }
        if !tried.is_empty() {
            report.push_str(&format!(
                "{name}: the JVM says {want:?}\n  walked: {}\n",
                tried.join("\n  or ")
            ));
        }
    }
    eprintln!(
        "JDK {major}: {compared} copied stacks walked, {stopped} stopped by the compile count"
    );
    assert!(report.is_empty(), "JDK {major}:\n{report}");
    assert!(
        compared >= 8 && stopped >= 2,
        "JDK {major}: {compared} threads, {stopped} stopped"
    );
}

/// Each thread's Java name, read as the profiler reads it: every thread
/// the workload reported is there by its whole name (the workload's are
/// longer than the kernel's 15 characters), at the thread whose kernel
/// name is its first 15 characters.
fn thread_names_as_the_jvm_reports_them(
    major: u32,
    pid: u32,
    jvm: &Jvm,
    mem: &ProcMem,
    syms: &threads::NameSymbols,
    reported: &Reported,
) {
    assert!(
        !syms[..5].contains(&0),
        "JDK {major}: libjvm's symbols lack {:?}",
        threads::NAME_SYMBOLS
    );
    let l = walk::WalkLayout::of(&jvm.structs, major).unwrap();
    let names = threads::NameLayout::read(mem, &jvm.structs, syms, major)
        .unwrap_or_else(|e| panic!("JDK {major}: {e}"))
        .unwrap_or_else(|| panic!("JDK {major}: no offsets yet"));
    let mut read = HashMap::new();
    for (jt, tid) in walk::threads(mem, &l).unwrap() {
        if let Some(name) = threads::name(mem, &names, jt).unwrap() {
            read.insert(name, tid);
        }
    }
    let mut long = 0;
    for (name, _) in reported {
        let tid = read
            .get(name)
            .unwrap_or_else(|| panic!("JDK {major}: no thread named {name:?} among {read:?}"));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap();
        if name != "main" {
            let short: String = name.chars().take(15).collect();
            assert_eq!(comm.trim_end(), short, "JDK {major}: thread {tid}");
        }
        long += usize::from(name.chars().count() > 15);
    }
    assert!(
        long >= 5,
        "JDK {major}: {long} names longer than the kernel's"
    );
    eprintln!("JDK {major}: {} thread names read", read.len());
}

/// Thread names where objects are laid out otherwise: without compressed
/// references (JDK 17: 8-byte references, 16-byte headers), and with
/// compact object headers (JDK 25: an array's length right after the mark
/// word).
#[test]
fn thread_names_in_other_object_layouts() {
    let jdks = jdks();
    let Some(classes) = compiled_workload() else {
        return;
    };
    let cases: [(u32, &[&str]); 3] = [
        (
            17,
            &["-XX:-UseCompressedOops", "-XX:-UseCompressedClassPointers"],
        ),
        (17, &["-XX:-UseCompressedOops"]),
        (25, &["-XX:+UseCompactObjectHeaders"]),
    ];
    for (major, options) in cases {
        let Some((_, java)) = jdks.iter().find(|(m, _)| *m == major) else {
            continue;
        };
        let (child, reported) = start(java, classes.path(), options);
        let pid = child.0.id();
        let (lib, bias, mem) = open_jvm(pid);
        let jvm = Jvm::read(&mem, &lib.symbols.map(|s| s + bias)).unwrap();
        let syms = lib.name_symbols.map(|s| if s == 0 { 0 } else { s + bias });
        eprintln!("JDK {major} {options:?}");
        thread_names_as_the_jvm_reports_them(major, pid, &jvm, &mem, &syms, &reported);
    }
}

/// Every method the JVM lists as compiled (`jcmd PID Compiler.codelist`:
/// compile id, level, state, `Class.name(signature)`, then the blob and
/// its code's range): the blob found at its code's first and middle
/// address, its kind, code and compile id, and its method named as the
/// JVM names it.
fn compiled_methods_as_the_jvm_lists_them(
    major: u32,
    pid: u32,
    jvm: &Jvm,
    mem: &ProcMem,
) -> Vec<u64> {
    let l = code::Layout::of(&jvm.structs).unwrap_or_else(|e| panic!("JDK {major}: {e}"));
    let heaps = code::heaps(mem, &l).unwrap();
    assert!(!heaps.is_empty(), "JDK {major}: no code heaps");
    let jcmd = match major {
        17 => PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/bin/jcmd"),
        _ => PathBuf::from(format!("/opt/offcputime-test/jdk/{major}/bin/jcmd")),
    };
    let out = Command::new(&jcmd)
        .arg(pid.to_string())
        .arg("Compiler.codelist")
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let mut blobs = Vec::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for line in list.lines() {
        // `4 0 0 java.lang.Object.hashCode()I [0x7f.., 0x7f.. - 0x7f..]`
        let Some((head, range)) = line.split_once(" [") else {
            continue;
        };
        let f: Vec<&str> = head.splitn(4, ' ').collect();
        let r: Vec<&str> = range
            .trim_end_matches(']')
            .split([',', '-', ' '])
            .filter(|x| !x.is_empty())
            .collect();
        if f.len() != 4 || r.len() != 3 {
            continue;
        }
        let (id, name): (u32, &str) = (f[0].parse().unwrap(), f[3]);
        let (addr, begin, end) = (hex(r[0]), hex(r[1]), hex(r[2]));
        let at = code::blob_at(mem, &l, &heaps, begin).unwrap();
        let mid = code::blob_at(mem, &l, &heaps, begin + (end - begin) / 2).unwrap();
        let blob = code::blob(mem, &l, addr).unwrap();
        let (method, compile_id) = code::nmethod(mem, &l, addr).unwrap();
        let m = code::method_name(mem, &l, method).unwrap();
        let named = format!("{}.{}{}", m.class, m.name, m.signature);
        checked += 1;
        blobs.push(addr);
        if at != Some(addr)
            || mid != Some(addr)
            || !blob.name.ends_with("nmethod")
            || blob.code_begin != begin
            || compile_id != id
            || named != name
        {
            wrong.push(format!(
                "{line}\n  found {at:x?} {mid:x?} {} {:#x} {compile_id} {named}",
                blob.name, blob.code_begin
            ));
        }
    }
    eprintln!("JDK {major}: {checked} compiled methods checked");
    assert!(
        checked >= 20,
        "JDK {major}: {checked} methods listed:\n{list}"
    );
    assert!(
        wrong.is_empty(),
        "JDK {major}: {} of {checked} compiled methods read otherwise:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    blobs
}

/// Where a thread stopped in compiled code is told as the BPF program
/// tells it: every compiled method's blob is told from other blobs (the
/// interpreter's, the call stub's), native methods' wrappers from C1's
/// and C2's code, and in the code of each method C1 or C2 compiled, at
/// every epilogue (`add rsp,N; pop rbp`, then the return's poll and
/// `ret`, or a jump out), the frame is whole before the pop, popping at
/// it, down to its return address at each instruction after it.
fn epilogues_are_told(major: u32, jvm: &Jvm, mem: &ProcMem, nmethod_vtable: u64, blobs: &[u64]) {
    let w = walk::WalkLayout::of(&jvm.structs, major).unwrap();
    let r = w
        .running
        .unwrap_or_else(|| panic!("JDK {major}: no frame-complete offsets"));
    let is_nmethod = |blob: u64| match r.kind {
        walk::NmethodKind::Vtable => {
            assert_ne!(nmethod_vtable, 0, "JDK {major}: no _ZTV7nmethod");
            code::u64_at(mem, blob).unwrap() == nmethod_vtable + 16
        }
        walk::NmethodKind::Byte(at, v) => {
            let mut b = [0u8];
            mem.read(blob + at, &mut b).unwrap();
            b[0] == v
        }
    };
    let heaps = code::heaps(mem, &w.code).unwrap();
    let (interp, _) = walk::interpreter(mem, &jvm.structs).unwrap();
    let interp_blob = code::blob_at(mem, &w.code, &heaps, interp)
        .unwrap()
        .unwrap();
    assert!(
        !is_nmethod(interp_blob),
        "JDK {major}: the interpreter told as compiled"
    );
    let call_stub = walk::call_stub_return(mem, &jvm.structs).unwrap();
    let stub_blob = code::blob_at(mem, &w.code, &heaps, call_stub)
        .unwrap()
        .unwrap();
    assert!(
        !is_nmethod(stub_blob),
        "JDK {major}: the call stub told as compiled"
    );
    let (mut methods, mut pops, mut poll_stubs) = (0, 0, 0);
    for &b in blobs {
        let blob = code::blob(mem, &w.code, b).unwrap();
        assert!(
            is_nmethod(b),
            "JDK {major}: {} not told as compiled",
            blob.name
        );
        // A native method's wrapper, of compile level 0, is not walked
        // where a thread stopped in its code.
        let mut level = [0u8];
        mem.read(b + r.comp_level, &mut level).unwrap();
        assert_eq!(
            level[0] == 0,
            blob.name == "native nmethod",
            "JDK {major}: {} of level {}",
            blob.name,
            level[0]
        );
        if level[0] == 0 {
            continue;
        }
        methods += 1;
        let stubs = b + u64::from(code::u32_at(mem, b + r.stub_offset).unwrap());
        // The code, with 8 bytes before it and 16 after.
        let mut code = vec![0u8; (stubs - blob.code_begin) as usize + 24];
        mem.read(blob.code_begin - 8, &mut code).unwrap();
        let at = |p: usize| -> walk::FrameAt {
            walk::frame_at(&code[p - 8..p + 16].try_into().unwrap())
        };
        for p in 16..code.len() - 16 {
            let add_before = code[p - 4..p - 1] == [0x48, 0x83, 0xc4]
                || code[p - 7..p - 4] == [0x48, 0x81, 0xc4];
            if code[p] == 0x5d && add_before {
                pops += 1;
                let said = |q: usize| {
                    format!(
                        "JDK {major}: {} at +{q}: {:02x?}",
                        blob.name,
                        &code[p - 7..p + 16]
                    )
                };
                // At the add: whole (or, where the instruction before
                // it ends with a byte 0x5d, not known: cut, not guessed).
                let add = if code[p - 4..p - 1] == [0x48, 0x83, 0xc4] {
                    p - 4
                } else {
                    p - 7
                };
                assert!(
                    matches!(at(add), walk::FrameAt::Whole | walk::FrameAt::Unknown),
                    "{}",
                    said(add)
                );
                assert_eq!(at(p), walk::FrameAt::Popping, "{}", said(p));
                // Each instruction after the pop, to the ret or the jump
                // out: the return address alone left.
                let mut q = p + 1;
                loop {
                    assert_eq!(at(q), walk::FrameAt::Return, "{}", said(q));
                    let len = match code[q..q + 4] {
                        [0xc3, ..] | [0xe9, ..] => break,
                        [0x0f, 0x82..=0x87, ..] => 6,
                        [0x49, 0x3b, 0xa7, _] | [0x4d, 0x8b, 0x97, _] => 7,
                        [0x49, 0x3b, 0x67, _] => 4,
                        [0x41, 0x85, 0x02, _] => 3,
                        _ => panic!("{}: an instruction not known after the pop", said(q)),
                    };
                    q += len;
                    if code[q - len] == 0x0f && code[q - len + 1] == 0x82 {
                        // A reserved stack area's check: its slow path
                        // (a call) follows, not walked.
                        break;
                    }
                }
            }
            // A return poll's stub, reached with the frame torn down
            // (`lea r10,[rip+d]; mov [r15+d],r10; jmp`): the return
            // address alone at each of its instructions; and its `mov;
            // jmp` nowhere else.
            if code[p..p + 3] == [0x4c, 0x8d, 0x15]
                && code[p + 7..p + 10] == [0x4d, 0x89, 0x97]
                && code[p + 14] == 0xe9
            {
                poll_stubs += 1;
                for q in [p, p + 7, p + 14] {
                    assert_eq!(
                        at(q),
                        walk::FrameAt::Return,
                        "JDK {major}: a poll stub at +{q}: {:02x?}",
                        &code[p - 8..p + 16]
                    );
                }
            }
            if code[p..p + 3] == [0x4d, 0x89, 0x97] && code[p + 7] == 0xe9 {
                // After `lea r10,[rip+d]`, or `mov r10,imm64` (then not
                // known at that mov: a call's setting of the last Java pc
                // looks the same).
                let lea = code[p - 7..p - 4] == [0x4c, 0x8d, 0x15];
                let movabs = code[p - 10..p - 8] == [0x49, 0xba];
                // After `xor r10,r10` (seen in JDK 21's code on a loaded
                // machine): no pc stored, no poll stub's: not known.
                let zeroed = matches!(code[p - 3..p], [0x4d, 0x33, 0xd2] | [0x4d, 0x31, 0xd2]);
                if zeroed {
                    assert_eq!(at(p), walk::FrameAt::Unknown, "JDK {major} +{p}");
                    assert_eq!(at(p + 7), walk::FrameAt::Unknown, "JDK {major} +{p}");
                    continue;
                }
                assert!(
                    lea || movabs,
                    "JDK {major}: mov [r15+d],r10; jmp at +{p} not in a poll stub: {:02x?}",
                    &code[p - 10..p + 8]
                );
                if movabs {
                    poll_stubs += 1;
                    assert_eq!(at(p - 10), walk::FrameAt::Unknown, "JDK {major} +{p}");
                    assert_eq!(at(p), walk::FrameAt::Return, "JDK {major} +{p}");
                    assert_eq!(at(p + 7), walk::FrameAt::Return, "JDK {major} +{p}");
                }
            }
        }
    }
    eprintln!("JDK {major}: {methods} compiled methods, {pops} epilogues, {poll_stubs} poll stubs");
    assert!(methods >= 20 && pops >= 20, "JDK {major}");
    assert!(major < 17 || poll_stubs >= 1, "JDK {major}: no poll stub");
}

/// What is not a HotSpot libjvm is told apart: another name is not looked
/// at, a libjvm.so without the tables is one without them.
#[test]
fn inspect_tells_hotspot_apart() {
    let me = File::open("/proc/self/exe").unwrap();
    assert!(inspect(&me, "offcputime").unwrap().is_none());
    assert!(matches!(inspect(&me, "libjvm.so").unwrap(), Some(None)));
    for (major, java) in jdks() {
        let lib = java
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("lib/server/libjvm.so");
        let file = File::open(&lib).unwrap();
        let found = inspect(&file, "libjvm.so").unwrap();
        assert!(
            matches!(found, Some(Some(_))),
            "JDK {major}: {} not HotSpot's",
            lib.display()
        );
        assert_eq!(SYMBOLS.len(), 24);
    }
}

/// Memory that holds noise everywhere (each byte a hash of its address
/// and a seed), or nothing past `limit`.
struct Noise {
    seed: u64,
    limit: u64,
}

impl Memory for Noise {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if addr.saturating_add(buf.len() as u64) > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "unmapped",
            ));
        }
        for (i, b) in buf.iter_mut().enumerate() {
            let mut x = (addr + i as u64) ^ self.seed;
            x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 29;
            // Mostly small bytes and zeros, so that lengths, hops and
            // names end now and then.
            *b = match x % 5 {
                0 => 0,
                1 => (x >> 8) as u8 & 3,
                _ => (x >> 16) as u8,
            };
        }
        Ok(())
    }
}

/// The code cache's and the methods' readers, led by noise through
/// another process's memory: every read ends, never a panic.
#[test]
fn code_readers_survive_noise() {
    let fields: Vec<(&str, &str, bool, u64)> = vec![
        ("CodeCache", "_heaps", true, 0x1000),
        ("GrowableArrayBase", "_len", false, 0),
        ("GrowableArray<int>", "_data", false, 8),
        ("CodeHeap", "_memory", false, 8),
        ("CodeHeap", "_segmap", false, 120),
        ("CodeHeap", "_log2_segment_size", false, 256),
        ("VirtualSpace", "_low_boundary", false, 0),
        ("VirtualSpace", "_high_boundary", false, 8),
        ("HeapBlock::Header", "_used", false, 8),
        ("CodeBlob", "_name", false, 96),
        ("CodeBlob", "_code_begin", false, 32),
        ("CompiledMethod", "_method", false, 112),
        ("nmethod", "_compile_id", false, 304),
        ("Method", "_constMethod", false, 8),
        ("ConstMethod", "_constants", false, 8),
        ("ConstMethod", "_name_index", false, 34),
        ("ConstMethod", "_signature_index", false, 36),
        ("ConstantPool", "_pool_holder", false, 24),
        ("Klass", "_name", false, 24),
        ("Symbol", "_length", false, 4),
        ("ThreadsSMRSupport", "_java_thread_list", true, 0x2000),
        ("ThreadsList", "_length", false, 4),
        ("ThreadsList", "_threads", false, 16),
        ("JavaThread", "_osthread", false, 560),
        ("OSThread", "_thread_id", false, 208),
        ("JavaThread", "_anchor", false, 656),
        ("JavaFrameAnchor", "_last_Java_sp", false, 0),
        ("JavaFrameAnchor", "_last_Java_pc", false, 8),
        ("JavaFrameAnchor", "_last_Java_fp", false, 16),
        ("CodeBlob", "_frame_size", false, 28),
        ("nmethod", "_scopes_pcs_offset", false, 268),
        ("nmethod", "_dependencies_offset", false, 272),
        ("CompiledMethod", "_scopes_data_begin", false, 120),
        ("nmethod", "_metadata_offset", false, 260),
        ("PcDesc", "_pc_offset", false, 0),
        ("PcDesc", "_scope_decode_offset", false, 4),
        ("ConstMethod", "_flags", false, 28),
        ("ConstMethod", "_code_size", false, 32),
        ("ConstantPool", "_source_file_name_index", false, 54),
    ];
    let tables = Tables::build(
        &fields,
        &[
            ("HeapBlock", 16),
            ("ConstantPool", 72),
            ("PcDesc", 16),
            ("ConstMethod", 48),
        ],
        &[("ConstMethod::_has_linenumber_table", 1)],
        &[],
    );
    let s = read(&tables, &symbols()).unwrap();
    let l = code::Layout::of(&s).unwrap();
    let w = walk::WalkLayout::of(&s, 21).unwrap();
    let mut rng = crate::hostile::Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..2000 {
        let mem = Noise {
            seed: rng.next(),
            limit: if rng.next() % 2 == 0 {
                u64::MAX
            } else {
                1 << 20
            },
        };
        let heaps = code::heaps(&mem, &l).unwrap_or_default();
        let pc = rng.next() % (1 << 21);
        let _ = code::blob_at(&mem, &l, &heaps, pc);
        let addr = rng.next() % (1 << 21);
        let _ = code::blob(&mem, &l, addr);
        let _ = code::nmethod(&mem, &l, addr);
        let _ = code::method_name(&mem, &l, addr);
        let made_up = [code::Heap::for_test(0, 1 << 20, 1 << 19, 7)];
        let _ = code::blob_at(&mem, &l, &made_up, pc);
        let _ = walk::threads(&mem, &w);
        let _ = walk::walk(&mem, &w, &made_up, addr);
        let _ = walk::walk(&mem, &w, &heaps, addr);
        let _ = walk::line(&mem, &w, addr, (rng.next() % 1000) as i32);
        // A copied stack's walk over hostile code and hostile stack words.
        let walked = Walked {
            layout: w.clone(),
            heaps: made_up.to_vec(),
            mem: Box::new(Noise {
                seed: mem.seed,
                limit: mem.limit,
            }),
            key: 1,
            entry: types::java_proc {
                interp_lo: 1 << 18,
                interp_hi: 1 << 19,
                ..Default::default()
            },
        };
        let word = rng.next();
        let read = |a: u64| (!a.is_multiple_of(3)).then_some(a ^ word);
        for pc in [pc, (1 << 18) + rng.next() % (1 << 18)] {
            let at = crate::runtime::CopyAt {
                pc,
                sp: rng.next() % (1 << 21),
                bp: rng.next() % (1 << 21),
                exact: rng.next().is_multiple_of(2),
            };
            let mark = [None, Some(rng.next() % 100), Some(u64::MAX)][(rng.next() % 3) as usize];
            let _ = copies::step(&walked, mark, at, &read);
        }
        let _ = walk::source_file(&mem, &l, &s, addr);
        let _ = walk::bytecodes(&mem, &w, addr);
        // The words of the BPF program's walk, each kind, as userspace
        // names them from this memory.
        let r = frames::Reader {
            mem: &mem,
            layout: &w,
            structs: &s,
            heaps: &made_up,
        };
        let mut names = frames::Names::default();
        for word in [
            0xa << 60 | (addr >> 3) << 16 | (rng.next() & 0xffff),
            0xb << 60 | (rng.next() & 0x1fff) << 47 | pc,
            0xb << 60 | (rng.next() & ((1 << 60) - 1)),
            0xc << 60 | 1,
        ] {
            for f in names.frames(&r, 1, word) {
                if let crate::runtime::Frame::Code { code, at } = f {
                    let _ = names.name(code, at);
                }
            }
        }
    }
}
