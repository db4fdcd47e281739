//! The BPF object's chains of frames, read from the object itself: before
//! private stacks (6.13) the verifier refuses a program where any chain of
//! calls from it — bpf_loop callbacks included, as the function whose
//! address is passed calls them — needs more than 512 bytes of stack, each
//! frame rounded up to 32. It counts what each frame touches on the paths
//! it verifies, which depends on the settings (`-i` once added 16 bytes to
//! the switch hook's frame and put it over on 6.1 and 6.12); what the
//! compiler gave each function is the most it can touch on any, so a chain
//! that fits here fits with every setting, on every kernel.

use std::collections::HashMap;

/// The object as build.rs compiled it: the general build and the plain one.
const OBJECTS: [(&str, &[u8]); 2] = [
    (
        "general",
        include_bytes!(concat!(env!("OUT_DIR"), "/offcputime.bpf.o")),
    ),
    (
        "plain",
        include_bytes!(concat!(env!("OUT_DIR"), "/plain/offcputime.bpf.o")),
    ),
];

/// The verifier's bound on a chain's stack (MAX_BPF_STACK).
const MAX_BPF_STACK: u64 = 512;

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const STT_FUNC: u8 = 2;
const R_BPF_64_64: u32 = 1;
const R_BPF_64_32: u32 = 10;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

struct Section {
    name: String,
    kind: u32,
    data: std::ops::Range<usize>,
    info: u32,
}

struct Symbol {
    name: String,
    kind: u8,
    section: usize,
    value: u64,
    size: u64,
}

/// A function: its section, its first instruction there and how many.
struct Function {
    section: usize,
    first: usize,
    count: usize,
}

struct Object {
    bytes: &'static [u8],
    sections: Vec<Section>,
    symbols: Vec<Symbol>,
    /// (section, byte offset) → (symbol, relocation type).
    relocations: HashMap<(usize, usize), (usize, u32)>,
}

fn c_string(b: &[u8], at: usize) -> String {
    let end = b[at..].iter().position(|&c| c == 0).unwrap() + at;
    String::from_utf8_lossy(&b[at..end]).into_owned()
}

fn read_object(b: &'static [u8]) -> Object {
    assert_eq!(&b[..4], b"\x7fELF", "not an ELF object");
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(b, 0x28) as usize,
        u16_at(b, 0x3a) as usize,
        u16_at(b, 0x3c) as usize,
        u16_at(b, 0x3e) as usize,
    );
    let header = |i: usize| shoff + i * shentsize;
    let names = u64_at(b, header(shstrndx) + 0x18) as usize;
    let sections: Vec<Section> = (0..shnum)
        .map(|i| {
            let h = header(i);
            let offset = u64_at(b, h + 0x18) as usize;
            Section {
                name: c_string(b, names + u32_at(b, h) as usize),
                kind: u32_at(b, h + 4),
                data: offset..offset + u64_at(b, h + 0x20) as usize,
                info: u32_at(b, h + 0x2c),
            }
        })
        .collect();
    let symtab_index = sections.iter().position(|s| s.kind == SHT_SYMTAB).unwrap();
    let symtab = &sections[symtab_index];
    let strtab = u64_at(
        b,
        header(u32_at(b, header(symtab_index) + 0x28) as usize) + 0x18,
    );
    let symbols = symtab
        .data
        .clone()
        .step_by(24)
        .map(|at| Symbol {
            name: c_string(b, strtab as usize + u32_at(b, at) as usize),
            kind: b[at + 4] & 0xf,
            section: u16_at(b, at + 6) as usize,
            value: u64_at(b, at + 8),
            size: u64_at(b, at + 16),
        })
        .collect();
    let mut relocations = HashMap::new();
    for s in sections.iter().filter(|s| s.kind == SHT_REL) {
        for at in s.data.clone().step_by(16) {
            let info = u64_at(b, at + 8);
            relocations.insert(
                (s.info as usize, u64_at(b, at) as usize),
                ((info >> 32) as usize, info as u32),
            );
        }
    }
    Object {
        bytes: b,
        sections,
        symbols,
        relocations,
    }
}

impl Object {
    fn insn(&self, f: &Function, i: usize) -> &[u8] {
        let at = self.sections[f.section].data.start + (f.first + i) * 8;
        &self.bytes[at..at + 8]
    }

    /// The bytes below r10 the function reaches: the lowest stack offset
    /// it loads or stores at, or whose address it takes (r = r10; r += -n).
    fn frame(&self, f: &Function) -> u64 {
        let (mut deepest, mut from_r10) = (0u64, None);
        for i in 0..f.count {
            let insn = self.insn(f, i);
            let (code, dst, src) = (insn[0], insn[1] & 0xf, insn[1] >> 4);
            let off = i16::from_le_bytes([insn[2], insn[3]]) as i64;
            let imm = i32::from_le_bytes(insn[4..8].try_into().unwrap()) as i64;
            let class = code & 7;
            // BPF_MEM, BPF_MEMSX, BPF_ATOMIC.
            let memory = matches!(code & 0xe0, 0x60 | 0x80 | 0xc0);
            let base = match class {
                1 => Some(src),     // LDX
                2 | 3 => Some(dst), // ST, STX
                _ => None,
            };
            if memory && base == Some(10) && off < 0 {
                deepest = deepest.max(off.unsigned_abs());
            }
            if code == 0x07 && from_r10 == Some(dst) && imm < 0 {
                deepest = deepest.max(imm.unsigned_abs());
            }
            from_r10 = (code == 0xbf && src == 10).then_some(dst);
        }
        deepest
    }

    /// The functions `f` calls, or passes to a helper to call (the
    /// address of a function loaded: a bpf_loop callback).
    fn callees(&self, f: &Function, by_start: &HashMap<(usize, usize), String>) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..f.count {
            let insn = self.insn(f, i);
            let at = (f.first + i) * 8;
            let imm = i32::from_le_bytes(insn[4..8].try_into().unwrap()) as i64;
            let target = match (insn[0], self.relocations.get(&(f.section, at))) {
                (0x85, Some(&(sym, R_BPF_64_32))) => {
                    let s = &self.symbols[sym];
                    Some((s.section, (s.value / 8) as i64 + imm + 1))
                }
                // A call within the section, pc-relative.
                (0x85, None) if insn[1] >> 4 == 1 => {
                    Some((f.section, (f.first + i) as i64 + imm + 1))
                }
                (0x18, Some(&(sym, R_BPF_64_64))) => {
                    let s = &self.symbols[sym];
                    Some((s.section, (s.value as i64 + imm) / 8))
                }
                _ => None,
            };
            if let Some((section, first)) = target {
                if let Some(name) = by_start.get(&(section, first as usize)) {
                    out.push(name.clone());
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// A chain of calls: each function with the bytes its frame reaches.
type Chain = Vec<(String, u64)>;

/// Every program's deepest chain in `object`: (program, bytes, the chain).
fn deepest_chains(object: &'static [u8]) -> Vec<(String, u64, Chain)> {
    let o = read_object(object);
    let mut functions = HashMap::new();
    let mut by_start = HashMap::new();
    for s in o
        .symbols
        .iter()
        .filter(|s| s.kind == STT_FUNC && s.size > 0)
    {
        by_start.insert((s.section, (s.value / 8) as usize), s.name.clone());
        let f = Function {
            section: s.section,
            first: (s.value / 8) as usize,
            count: (s.size / 8) as usize,
        };
        functions.insert(s.name.clone(), f);
    }
    let frames: HashMap<&str, u64> = functions
        .iter()
        .map(|(n, f)| (n.as_str(), o.frame(f)))
        .collect();
    let calls: HashMap<&str, Vec<String>> = functions
        .iter()
        .map(|(n, f)| (n.as_str(), o.callees(f, &by_start)))
        .collect();
    let rounded = |n: &str| frames[n].max(1).div_ceil(32) * 32;
    fn deepest<'a>(
        f: &'a str,
        calls: &'a HashMap<&str, Vec<String>>,
        rounded: &dyn Fn(&str) -> u64,
        path: &mut Vec<&'a str>,
    ) -> (u64, Vec<&'a str>) {
        path.push(f);
        let mut best = (0, Vec::new());
        for c in &calls[f] {
            if !path.contains(&c.as_str()) {
                let d = deepest(c, calls, rounded, path);
                if d.0 > best.0 {
                    best = d;
                }
            }
        }
        path.pop();
        best.1.insert(0, f);
        (best.0 + rounded(f), best.1)
    }
    let mut out = Vec::new();
    for (name, f) in &functions {
        if o.sections[f.section].name == ".text" {
            continue;
        }
        let (bytes, chain) = deepest(name, &calls, &rounded, &mut Vec::new());
        let chain = chain.iter().map(|c| (c.to_string(), frames[c])).collect();
        out.push((name.clone(), bytes, chain));
    }
    out.sort();
    out
}

fn show(chain: &[(String, u64)]) -> String {
    chain
        .iter()
        .map(|(n, b)| format!("{n} ({b} bytes)"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn every_chain_of_frames_fits_the_verifiers_bound() {
    let mut over = Vec::new();
    for (build, object) in OBJECTS {
        for (program, bytes, chain) in &deepest_chains(object) {
            if std::env::var_os("SHOW_FRAMES").is_some() {
                eprintln!("{build}: {program}: {bytes} bytes: {}", show(chain));
            }
            if *bytes > MAX_BPF_STACK {
                over.push(format!(
                    "{build}: {program}: {bytes} bytes: {}",
                    show(chain)
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "chains over {MAX_BPF_STACK} bytes (frames rounded up to 32):\n{}",
        over.join("\n")
    );
}

/// The reading itself: the switch hook's deepest chain is the DWARF
/// walk's through the files a process maps, down its bpf_loop callback to
/// the step and the maple tree's walk, and its frames are those the
/// compiler gave (a reading that missed calls or stack accesses would pass
/// the test above for nothing).  The callback itself only calls the step:
/// it may have no stack of its own.
#[test]
fn the_chains_are_read_whole() {
    for (_, object) in OBJECTS {
        chains_read_whole(object);
    }
}

fn chains_read_whole(object: &'static [u8]) {
    let chains = deepest_chains(object);
    assert!(chains.len() >= 20, "{} programs", chains.len());
    let (_, bytes, chain) = chains
        .iter()
        .find(|(p, _, _)| p == "sched_switch_btf")
        .expect("sched_switch_btf");
    let names: Vec<&str> = chain.iter().map(|(n, _)| n.as_str()).collect();
    for f in [
        "user_stack_by_files",
        "unwind_step_files",
        "unwind_step_of_current",
        "file_memo",
        "maple_level",
    ] {
        assert!(names.contains(&f), "{f} not in {}", show(chain));
    }
    assert!(chain.len() >= 6, "{}", show(chain));
    assert!(
        chain
            .iter()
            .all(|(n, b)| *b > 0 || n == "unwind_step_files"),
        "{}",
        show(chain)
    );
    assert!(*bytes > 384, "{bytes}: {}", show(chain));
}

/// The plain build has the same programs, each with at most the general
/// build's instructions, and the switch hook and the iterators that walk
/// user stacks far fewer: the code of the settings it has as constants is
/// not there (build.rs).
#[test]
fn the_plain_build_leaves_out_code() {
    let size = |object: &'static [u8]| -> HashMap<String, usize> {
        let o = read_object(object);
        o.symbols
            .iter()
            .filter(|s| s.kind == STT_FUNC && s.size > 0)
            .filter(|s| o.sections[s.section].name != ".text")
            .map(|s| (s.name.clone(), (s.size / 8) as usize))
            .collect()
    };
    let (general, plain) = (size(OBJECTS[0].1), size(OBJECTS[1].1));
    let mut names: Vec<&String> = general.keys().collect();
    names.sort();
    assert_eq!(names, {
        let mut p: Vec<&String> = plain.keys().collect();
        p.sort();
        p
    });
    for name in names {
        assert!(
            plain[name] <= general[name],
            "{name}: {} > {}",
            plain[name],
            general[name]
        );
    }
    for name in [
        "sched_switch_btf",
        "start_blocked_user",
        "flush_in_progress",
    ] {
        assert!(
            plain[name] * 10 < general[name] * 9,
            "{name}: {} instructions plain, {} general",
            plain[name],
            general[name]
        );
    }
}
