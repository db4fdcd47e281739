//! Hostile input (tests only): every file the profiler parses belongs to
//! someone else, and any user can map a file into a process the profiler
//! reads. A seeded mutation test runs the ELF reader, the call-frame
//! information reader, the build-id lookup and the symbol-table reader
//! (blazesym) over mutated copies of real binaries, and the `/proc` parsers
//! (`maps`, `kallsyms`) and the JIT perf-map parser over mutated texts,
//! for a bounded time: no panic,
//! bounded time and memory per file.
//!
//! `OFFCPUTIME_FUZZ_S` (default 20) sets the time, `OFFCPUTIME_FUZZ_SEED`
//! the seed (printed, so that a failure can be replayed).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::elf::Elf;
use crate::process::maps::{debug_file, parse_maps};
use crate::symbolize::{names_in_file, SymbolizeOptions};

/// xorshift64*: small, seeded, good enough to pick mutations (the other
/// modules' tests of hostile input use it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// Values that break size and offset arithmetic.
const INTERESTING: [u64; 16] = [
    0,
    1,
    7,
    8,
    0x40,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX - 7,
    u64::MAX,
];

fn read_u(d: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = d.get(at..at + width) {
        b[..width].copy_from_slice(s);
    }
    u64::from_le_bytes(b)
}

fn write_u(d: &mut [u8], at: usize, width: usize, v: u64) {
    if let Some(s) = d.get_mut(at..at + width) {
        s.copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// A value for a field: an interesting one, the file's length (or near
/// it), or the old value nudged.
fn value(rng: &mut Rng, old: u64, len: u64) -> u64 {
    match rng.below(4) {
        0 => *rng.pick(&INTERESTING),
        1 => len.wrapping_sub(rng.below(16)),
        2 => old.wrapping_add(rng.below(64)).wrapping_sub(32),
        _ => rng.next(),
    }
}

/// The ELF structure of the original file, to aim mutations at.
struct Layout {
    shoff: usize,
    shnum: usize,
    phoff: usize,
    phnum: usize,
    /// (offset, size) of each section's contents in the file.
    sections: Vec<(usize, usize)>,
}

fn layout(d: &[u8]) -> Layout {
    let shoff = read_u(d, 0x28, 8) as usize;
    let shnum = read_u(d, 0x3c, 2) as usize;
    let sections = (0..shnum)
        .filter_map(|i| {
            let h = shoff + i * 64;
            let (off, size) = (
                read_u(d, h + 0x18, 8) as usize,
                read_u(d, h + 0x20, 8) as usize,
            );
            (size > 0 && off.checked_add(size).is_some_and(|e| e <= d.len())).then_some((off, size))
        })
        .collect();
    Layout {
        shoff,
        shnum,
        phoff: read_u(d, 0x20, 8) as usize,
        phnum: read_u(d, 0x38, 2) as usize,
        sections,
    }
}

/// Fields (offset, width) of the ELF header, a section header and a
/// program header.
const ELF_HEADER_FIELDS: &[(usize, usize)] = &[
    (0x10, 2),
    (0x18, 8),
    (0x20, 8),
    (0x28, 8),
    (0x34, 2),
    (0x36, 2),
    (0x38, 2),
    (0x3a, 2),
    (0x3c, 2),
    (0x3e, 2),
];
const SECTION_HEADER_FIELDS: &[(usize, usize)] = &[
    (0, 4),
    (4, 4),
    (8, 8),
    (0x10, 8),
    (0x18, 8),
    (0x20, 8),
    (0x28, 4),
    (0x2c, 4),
    (0x30, 8),
    (0x38, 8),
];
const PROGRAM_HEADER_FIELDS: &[(usize, usize)] = &[
    (0, 4),
    (4, 4),
    (8, 8),
    (0x10, 8),
    (0x20, 8),
    (0x28, 8),
    (0x30, 8),
];

/// One of `fields` of the header at `base` set to a new value.
fn set_field(rng: &mut Rng, d: &mut [u8], base: usize, fields: &[(usize, usize)]) {
    let (f, w) = *rng.pick(fields);
    let v = value(rng, read_u(d, base + f, w), d.len() as u64);
    write_u(d, base + f, w, v);
}

/// One to four mutations of `orig`, aimed at the headers, the section and
/// program headers, and the sections' contents.
fn mutate(rng: &mut Rng, orig: &[u8], l: &Layout) -> Vec<u8> {
    let mut d = orig.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = d.len() as u64;
        if len == 0 {
            break;
        }
        match rng.below(6) {
            0 => set_field(rng, &mut d, 0, ELF_HEADER_FIELDS),
            1 if l.shnum > 0 => {
                let h = l.shoff + rng.below(l.shnum as u64) as usize * 64;
                set_field(rng, &mut d, h, SECTION_HEADER_FIELDS);
            }
            2 if l.phnum > 0 => {
                let h = l.phoff + rng.below(l.phnum as u64) as usize * 56;
                set_field(rng, &mut d, h, PROGRAM_HEADER_FIELDS);
            }
            3 if !l.sections.is_empty() => {
                // Inside a section: CFI, symbol tables, strings, notes.
                let &(off, size) = rng.pick(&l.sections);
                for _ in 0..1 + rng.below(8) {
                    let at = off + rng.below(size as u64) as usize;
                    if at >= d.len() {
                        break;
                    }
                    if rng.below(2) == 0 {
                        d[at] = rng.next() as u8;
                    } else {
                        let w = *rng.pick(&[1usize, 2, 4, 8]);
                        let v = value(rng, read_u(&d, at, w), len);
                        write_u(&mut d, at, w, v);
                    }
                }
            }
            4 => {
                for _ in 0..1 + rng.below(32) {
                    let at = rng.below(len) as usize;
                    d[at] ^= 1 << rng.below(8);
                }
            }
            _ => {
                let keep = rng.below(len.max(1)) as usize;
                d.truncate(keep);
            }
        }
    }
    d
}

/// The peak resident memory since the last reset, in KiB, and resets it.
fn peak_kib_and_reset() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()?;
    // "5" resets the peak (Linux 4.0).
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    Some(kib)
}

#[derive(Default)]
struct Reached {
    elf: usize,
    rows: usize,
    named: usize,
}

/// Every reader over the file at `path`.
fn exercise(path: &Path, reached: &mut Reached) {
    let Ok(f) = File::open(path) else { return };
    if let Ok(elf) = Elf::read(&f) {
        reached.elf += 1;
        let _ = elf.load_segments(&f);
        for name in [".eh_frame", ".debug_frame", ".symtab", ".note.gnu.build-id"] {
            if let Some(s) = elf.section(name) {
                if let Ok(data) = elf.read_section(&f, s) {
                    assert!(data.len() as u64 <= f.metadata().unwrap().len());
                }
            }
        }
    }
    if let Ok(Some((rows, _))) = crate::unwind_table::build(&f) {
        reached.rows += 1;
        for pc in [0u32, 0x1000, 0x2_0000, u32::MAX] {
            let _ = crate::unwind_table::lookup(&rows, pc);
        }
    }
    let _ = debug_file(path);
    let opts = SymbolizeOptions {
        offsets: true,
        inline: true,
        lines: true,
        addresses: false,
    };
    let offsets = [0u64, 0x1000, 0x2_0000, 0x2_8000, 0x10_0000, u64::MAX];
    if let Some(names) = names_in_file(path, None, &offsets, opts) {
        reached.named += names.iter().flatten().count().min(1);
    }
}

/// Real binaries: glibc, a small program, and glibc's separate debug file
/// where installed (symbol tables and compressed DWARF).
fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let mut paths = vec![libc.to_path_buf(), PathBuf::from("/usr/bin/true")];
    if let Some(d) = debug_file(libc) {
        paths.push(d);
    }
    paths
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read(&p).ok()?)))
        .collect()
}

fn settings() -> (Duration, u64) {
    let secs = std::env::var("OFFCPUTIME_FUZZ_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20.0);
    let seed = std::env::var("OFFCPUTIME_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xffc9_u64);
    (Duration::from_secs_f64(secs), seed.max(1))
}

#[test]
fn mutated_binaries_do_not_break_the_readers() {
    let (time, seed) = settings();
    let corpus = corpus();
    assert!(!corpus.is_empty(), "no binaries to mutate");
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let mut reached = Reached::default();
    let (mut files, mut slowest, mut biggest) = (0usize, Duration::ZERO, 0u64);
    let base = peak_kib_and_reset().unwrap_or(0);
    let began = Instant::now();
    let mut i = 0u64;
    while began.elapsed() < time || files < corpus.len() {
        let (orig_path, orig) = &corpus[(i % corpus.len() as u64) as usize];
        i += 1;
        let l = layout(orig);
        let data = mutate(&mut rng, orig, &l);
        let path = dir.path().join(format!("m{}", i % 4));
        File::create(&path).unwrap().write_all(&data).unwrap();
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exercise(&path, &mut reached)
        }));
        let took = t.elapsed();
        let replay = format!(
            "mutation {i} of {} (OFFCPUTIME_FUZZ_SEED={seed}), kept as {}",
            orig_path.display(),
            path.display()
        );
        if r.is_err() {
            let keep = std::env::temp_dir().join(format!("offcputime-fuzz-{seed}-{i}"));
            let _ = std::fs::copy(&path, &keep);
            panic!(
                "a reader panicked on {replay} (copied to {})",
                keep.display()
            );
        }
        let peak = peak_kib_and_reset().unwrap_or(0).saturating_sub(base);
        assert!(took < Duration::from_secs(10), "{took:?} on {replay}");
        assert!(peak < 1 << 20, "{peak} KiB resident for {replay}");
        slowest = slowest.max(took);
        biggest = biggest.max(peak);
        files += 1;
    }
    eprintln!(
        "fuzz: {files} mutated files in {:.1} s (seed {seed}); {} read as ELF, {} with unwind \
         rows, {} with a symbol found; slowest {slowest:?}, most memory {biggest} KiB above \
         the start",
        began.elapsed().as_secs_f64(),
        reached.elf,
        reached.rows,
        reached.named
    );
    // Not vacuous: enough files, and mutations that the readers accept
    // in part, so that their insides ran.
    assert!(files >= 20, "only {files} files in {time:?}");
    assert!(
        reached.elf * 4 >= files,
        "too few mutated files read as ELF"
    );
    assert!(
        reached.rows > 0 && reached.named > 0,
        "no mutated file reached the readers' insides"
    );
}

#[test]
fn mutated_proc_texts_do_not_break_the_parsers() {
    let (time, seed) = settings();
    let maps = std::fs::read("/proc/self/maps").unwrap();
    let mut kallsyms = std::fs::read("/proc/kallsyms").unwrap_or_default();
    kallsyms.truncate(256 * 1024);
    // A JIT runtime's perf map, as Node writes it.
    let perf_map = b"7f3a10001000 1c0 JS:*wl_js_blocker /tmp/wl.js:2:23\n\
        7f3a10001200 40 Builtin:ArgumentsAdaptorTrampoline\n\
        7f3a10001240 ffff LazyCompile:~main node:internal/main:1:1\n"
        .to_vec();
    // Kernel symbols as the kernel prints them for BPF (`%pS`).
    let printed = b"schedule+0x5a/0xd0\next4_file_read_iter+0x1f/0x1c0 [ext4]\n\
        bpf_prog_0123456789abcdef_sched+0x10/0x200\nnvme_poll+0x4/0x10 [nvme 0123abcd]\n"
        .to_vec();
    let mut rng = Rng(seed ^ 0x5eed);
    let began = Instant::now();
    let mut n = 0u64;
    let budget = time / 4;
    while began.elapsed() < budget || n < 100 {
        n += 1;
        for orig in [&maps, &kallsyms, &perf_map, &printed] {
            let mut d = orig.clone();
            for _ in 0..1 + rng.below(16) {
                if d.is_empty() {
                    break;
                }
                let at = rng.below(d.len() as u64) as usize;
                match rng.below(4) {
                    0 => d[at] = rng.next() as u8,
                    1 => d[at] = *rng.pick(b" \n-:0fx(\t+/[]"),
                    2 => {
                        d.remove(at);
                    }
                    _ => d.truncate(at),
                }
            }
            let text = String::from_utf8_lossy(&d);
            let _ = parse_maps(&text);
            let jit = crate::jit::PerfMap::parse(&d);
            for a in [0u64, 0x7f3a_1000_1100, 0x7f3a_1000_1250, u64::MAX] {
                let _ = jit.lookup(a);
            }
            if let Ok(k) = crate::ksyms::KernelSymbols::parse(&d[..]) {
                for a in [0u64, 0xffff_ffff_8100_0000, u64::MAX] {
                    let _ = k.resolve(a);
                }
            }
            for line in text.lines() {
                let _ = crate::ksyms::PrintedSym::parse(line);
            }
        }
    }
    eprintln!(
        "fuzz: {n} mutated /proc/PID/maps, kallsyms, printed kernel symbols and perf map texts \
         (seed {seed})"
    );
}
