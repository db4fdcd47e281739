use super::*;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

fn row(pc: u32, kind: u8, cfa_off: u16, rbp_off: i8) -> Row {
    Row {
        pc,
        cfa_off,
        kind,
        rbp_off,
    }
}

/// The kinds are the BPF program's (`enum unwind_kind`).
#[test]
fn kinds_are_the_bpf_programs() {
    use crate::bpf::types::unwind_kind as K;
    let pairs = [
        (KIND_NONE, K::UNWIND_NONE),
        (KIND_CFA_RSP, K::UNWIND_CFA_RSP),
        (KIND_CFA_RBP, K::UNWIND_CFA_RBP),
        (KIND_END, K::UNWIND_END),
        (KIND_PLT, K::UNWIND_PLT),
        (KIND_UNSUPPORTED, K::UNWIND_UNSUPPORTED),
        (KIND_SIGNAL, K::UNWIND_SIGNAL),
        (KIND_CLONE, K::UNWIND_CLONE),
    ];
    for (rust, c) in pairs {
        assert_eq!(u32::from(rust), c.0, "{c:?}");
    }
    // Non-canonical with 4- and 5-level page tables: bits 63..56
    // (and so 63..47) are not all equal.
    let top = SIGNAL_FRAME >> 56;
    assert!(top != 0 && top != 0xff, "{SIGNAL_FRAME:#x}");
}

#[test]
fn row_layout() {
    assert_eq!(std::mem::size_of::<Row>(), 8);
    assert_eq!(std::mem::align_of::<Row>(), 4);
    assert_eq!(std::mem::offset_of!(Row, cfa_off), 4);
    assert_eq!(std::mem::offset_of!(Row, kind), 6);
    assert_eq!(std::mem::offset_of!(Row, rbp_off), 7);
}

#[test]
fn normalize_sorts_dedupes_and_merges() {
    let rows = vec![
        row(0x20, KIND_CFA_RSP, 8, 0),
        row(0x10, KIND_NONE, 0, 0), // end marker of an earlier FDE …
        row(0x00, KIND_CFA_RSP, 8, 0),
        row(0x04, KIND_CFA_RSP, 16, 0),
        row(0x08, KIND_CFA_RSP, 16, 0), // same rule: merged into 0x04
        row(0x0c, KIND_CFA_RSP, 8, 0),
        row(0x10, KIND_CFA_RSP, 8, 0), // … beaten by a real row at 0x10, then merged into 0x0c
        row(0x14, KIND_NONE, 0, 0),
        row(0x18, KIND_NONE, 0, 0),      // merged into 0x14
        row(0x20, KIND_CFA_RBP, 16, -2), // last written for 0x20 wins
        row(0x24, KIND_NONE, 0, 0),
        row(0x24, KIND_NONE, 0, 0),
    ];
    assert_eq!(
        normalize(rows),
        vec![
            row(0x00, KIND_CFA_RSP, 8, 0),
            row(0x04, KIND_CFA_RSP, 16, 0),
            row(0x0c, KIND_CFA_RSP, 8, 0),
            row(0x14, KIND_NONE, 0, 0),
            row(0x20, KIND_CFA_RBP, 16, -2),
            row(0x24, KIND_NONE, 0, 0),
        ]
    );
    assert_eq!(normalize(vec![]), vec![]);
}

#[test]
fn lookup_finds_the_covering_row() {
    let rows = normalize(vec![
        row(0x100, KIND_CFA_RSP, 8, 0),
        row(0x104, KIND_CFA_RSP, 16, 0),
        row(0x110, KIND_NONE, 0, 0),
        row(0x120, KIND_CFA_RBP, 16, -2),
        row(0x130, KIND_NONE, 0, 0),
    ]);
    assert_eq!(lookup(&rows, 0), None);
    assert_eq!(lookup(&rows, 0xff), None);
    assert_eq!(lookup(&rows, 0x100), Some(row(0x100, KIND_CFA_RSP, 8, 0)));
    assert_eq!(lookup(&rows, 0x103), Some(row(0x100, KIND_CFA_RSP, 8, 0)));
    assert_eq!(lookup(&rows, 0x10f), Some(row(0x104, KIND_CFA_RSP, 16, 0)));
    assert_eq!(lookup(&rows, 0x110), None); // the gap
    assert_eq!(lookup(&rows, 0x11f), None);
    assert_eq!(lookup(&rows, 0x12f), Some(row(0x120, KIND_CFA_RBP, 16, -2)));
    assert_eq!(lookup(&rows, 0x130), None);
    assert_eq!(lookup(&rows, u32::MAX), None);
    assert_eq!(lookup(&[], 5), None);
}

/// A `.debug_frame` (version 1, 64-bit addresses) with one CIE
/// (CFA = rsp + 8, ra at CFA - 8) and one FDE per `(start, len, program)`.
fn debug_frame(fdes: &[(u64, u64, &[u8])]) -> Vec<u8> {
    let mut cie = vec![];
    cie.extend(0xffff_ffffu32.to_le_bytes()); // CIE id
    cie.extend([1, 0]); // version, augmentation ""
    cie.extend([1, 0x78, 16]); // code alignment 1, data alignment -8, ra column
    cie.extend([0x0c, 7, 8]); // DW_CFA_def_cfa: rsp, 8
    cie.extend([0x80 | 16, 1]); // DW_CFA_offset: r16 at cfa-8
    let mut out = vec![];
    out.extend((cie.len() as u32).to_le_bytes());
    out.extend(cie);
    for &(start, len, program) in fdes {
        let mut fde = vec![];
        fde.extend(0u32.to_le_bytes()); // the CIE at offset 0
        fde.extend(start.to_le_bytes());
        fde.extend(len.to_le_bytes());
        fde.extend(program);
        out.extend((fde.len() as u32).to_le_bytes());
        out.extend(fde);
    }
    out
}

fn table_of(data: &[u8]) -> (Vec<Row>, usize) {
    let mut section = DebugFrame::new(data, LittleEndian);
    section.set_address_size(8);
    let mut c = Collector::default();
    c.walk(&section, &BaseAddresses::default(), &[]);
    (normalize(c.rows), c.fdes)
}

#[test]
fn synthetic_cfi_translates_and_leaves_gaps() {
    let mut plt: Vec<u8> = vec![0x0f, PLT_EXPR.len() as u8]; // DW_CFA_def_cfa_expression
    plt.extend(PLT_EXPR);
    let push_rbp: &[u8] = &[
        0x41, // advance 1
        0x0e,
        16, // CFA = rsp + 16
        0x80 | 6,
        2,    // rbp at cfa-16
        0x43, // advance 3
        0x0d,
        6,    // CFA = rbp + 16
        0x48, // advance 8
        0x0c,
        7,
        8,    // CFA = rsp + 8
        0xc6, // DW_CFA_restore rbp
    ];
    let data = debug_frame(&[
        (0x1000, 0x10, push_rbp),
        // A gap at 0x1010..0x1020.
        (0x1020, 0x10, &[0x07, 16]),   // ra undefined: outermost
        (0x1030, 0x10, &plt),          // starts where the last one ends
        (0x1040, 0x10, &[0x09, 6, 3]), // rbp is in rbx: unsupported
        (0x1050, 0x10, &[0x0e, 0x80, 0x80, 0x04]), // CFA = rsp + 65536: unsupported
        (0x1060, 0x10, &[0x80 | 6, 1]), // rbp at cfa-8 and CFA = rsp + 8: fine
        (0x1_0000_0000, 0x10, &[]),    // beyond u32: skipped
        (0xffff_fff0, 0x10, &[]),      // ends at 2^32: skipped
        (0x2000, 0, &[]),              // empty: skipped
    ]);
    let (rows, fdes) = table_of(&data);
    assert_eq!(fdes, 6);
    assert_eq!(
        rows,
        vec![
            row(0x1000, KIND_CFA_RSP, 8, 0),
            row(0x1001, KIND_CFA_RSP, 16, -2),
            row(0x1004, KIND_CFA_RBP, 16, -2),
            row(0x100c, KIND_CFA_RSP, 8, 0),
            row(0x1010, KIND_NONE, 0, 0),
            row(0x1020, KIND_END, 0, 0),
            row(0x1030, KIND_PLT, 8, 0),
            row(0x1040, KIND_UNSUPPORTED, 0, 0),
            row(0x1060, KIND_CFA_RSP, 8, -1),
            row(0x1070, KIND_NONE, 0, 0),
        ]
    );
    assert_eq!(lookup(&rows, 0x1015), None);
    assert_eq!(lookup(&rows, 0x101f), None);
    assert_eq!(lookup(&rows, 0x1020).map(|r| r.kind), Some(KIND_END));
    assert_eq!(lookup(&rows, 0x103b).map(|r| r.kind), Some(KIND_PLT));
    assert_eq!(lookup(&rows, 0x1070), None);
    assert_eq!(lookup(&rows, 0xfff), None);

    // lit10 is the PLT rule too; any other expression is not.
    let mut plt10 = plt.clone();
    plt10[2 + PLT_EXPR_LIT_AT] = DW_OP_LIT10;
    let mut other = plt.clone();
    other[2 + 1] = 0x10; // DW_OP_breg7 +16
    let (rows, _) = table_of(&debug_frame(&[(0x10, 0x10, &plt10), (0x20, 0x10, &other)]));
    assert_eq!(
        rows,
        vec![
            row(0x10, KIND_PLT, 8, 0),
            row(0x20, KIND_UNSUPPORTED, 0, 0),
            row(0x30, KIND_NONE, 0, 0)
        ]
    );
}

/// An `.eh_frame` at address 0 with one CIE of augmentation `aug`
/// ("zR" or "zRS", pointers absolute) and one FDE of `program` over
/// 0x1000..0x1010.
fn eh_frame(aug: &str, program: &[u8]) -> Vec<u8> {
    let mut cie = vec![];
    cie.extend(0u32.to_le_bytes()); // CIE id
    cie.push(1); // version
    cie.extend(aug.as_bytes());
    cie.push(0);
    cie.extend([1, 0x78, 16]); // code alignment 1, data alignment -8, ra column
    cie.extend([1, 0x00]); // augmentation data: 'R' DW_EH_PE_absptr
    cie.extend([0x0c, 7, 8, 0x80 | 16, 1]); // CFA = rsp + 8, ra at cfa-8
    let mut out = vec![];
    out.extend((cie.len() as u32).to_le_bytes());
    out.extend(cie);
    let mut fde = vec![];
    fde.extend((out.len() as u32 + 4).to_le_bytes()); // back to the CIE
    fde.extend(0x1000u64.to_le_bytes());
    fde.extend(0x10u64.to_le_bytes());
    fde.push(0); // augmentation data length
    fde.extend(program);
    out.extend((fde.len() as u32).to_le_bytes());
    out.extend(fde);
    out
}

/// A signal trampoline's rows (glibc's `__restore_rt`: CFA = the saved
/// rsp, every register at its place in the ucontext) are
/// [`KIND_SIGNAL`]; the same rules under a CIE without 'S', or with
/// other places, are not.
#[test]
fn signal_trampoline_rows() {
    let rules = |rsp: u8, rbp: u8, rip: u8| {
        let mut p = vec![0x0f, 4]; // DW_CFA_def_cfa_expression
        p.extend(breg7(rsp));
        p.push(0x06); // DW_OP_deref
        for (reg, off) in [(6, rbp), (7, rsp), (16, rip)] {
            p.extend([0x10, reg, 3]); // DW_CFA_expression
            p.extend(breg7(off));
        }
        p
    };
    let kind = |aug: &str, program: &[u8]| {
        let data = eh_frame(aug, program);
        let mut section = EhFrame::new(&data, LittleEndian);
        section.set_address_size(8);
        let mut c = Collector::default();
        c.walk(&section, &BaseAddresses::default().set_eh_frame(0), &[]);
        assert_eq!(c.fdes, 1, "{aug} {program:x?}");
        let rows = normalize(c.rows);
        assert_eq!(rows.len(), 2, "{rows:?}");
        rows[0].kind
    };
    let good = rules(0xa0, 0x78, 0xa8);
    // As glibc writes it (readelf: DW_OP_breg7 (rsp): 160; DW_OP_deref).
    assert_eq!(&good[2..6], &[0x77, 0xa0, 0x01, 0x06]);
    assert_eq!(kind("zRS", &good), KIND_SIGNAL);
    assert_eq!(kind("zR", &good), KIND_UNSUPPORTED);
    assert_eq!(kind("zRS", &rules(0xa0, 0x80, 0xa8)), KIND_UNSUPPORTED);
    assert_eq!(kind("zRS", &rules(0xa0, 0x78, 0xb0)), KIND_UNSUPPORTED);
    assert_eq!(kind("zRS", &rules(0x98, 0x78, 0xa8)), KIND_UNSUPPORTED);
    // A signal CIE's plain rows (CFA = rsp + 8) are not followed.
    assert_eq!(kind("zRS", &[]), KIND_UNSUPPORTED);
}

/// libc's `__restore_rt` is a signal frame in its table, found at
/// the return address a handler returns to, minus one (the FDE
/// starts a byte early for that).
#[test]
fn libc_restore_rt_is_a_signal_frame() {
    let (rows, _) = build(&File::open(LIBC).unwrap()).unwrap().unwrap();
    let signal: Vec<&Row> = rows.iter().filter(|r| r.kind == KIND_SIGNAL).collect();
    assert_eq!(signal.len(), 1, "{signal:?}");
    let pc = signal[0].pc;
    assert_eq!(lookup(&rows, pc).map(|r| r.kind), Some(KIND_SIGNAL));
    assert_eq!(lookup(&rows, pc + 1).map(|r| r.kind), Some(KIND_SIGNAL));
}

/// libc's clone and clone3 have a [`KIND_CLONE`] row from their
/// syscall to the child's FDE, and nothing else has.
#[test]
fn libc_clone_tails_are_clone_rows() {
    let f = File::open(LIBC).unwrap();
    let (rows, _) = build(&f).unwrap().unwrap();
    let segments = Elf::read(&f).unwrap().load_segments(&f).unwrap();
    let clone: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].kind == KIND_CLONE)
        .collect();
    assert_eq!(clone.len(), 2, "{clone:?}");
    for i in clone {
        let r = rows[i];
        assert_eq!((r.cfa_off, r.rbp_off), (8, 0));
        assert_eq!(rows[i + 1].pc, r.pc + 10);
        assert_eq!(rows[i + 1].kind, KIND_END);
        let seg = segments
            .iter()
            .find(|s| (s.vaddr..s.vaddr + s.filesz).contains(&u64::from(r.pc)))
            .unwrap();
        let mut code = [0u8; 2];
        f.read_exact_at(&mut code, seg.offset + u64::from(r.pc) - seg.vaddr)
            .unwrap();
        assert_eq!(code, [0x0f, 0x05], "{:#x}: not a syscall", r.pc);
    }
}

#[test]
fn debug_frame_fdes_overlapping_eh_frame_ones_are_left_out() {
    let taken = union_of(vec![(0x30, 0x40), (0x10, 0x20), (0x18, 0x28)]);
    assert_eq!(taken, vec![(0x10, 0x28), (0x30, 0x40)]);
    assert!(!overlaps(&taken, 0x0, 0x10));
    assert!(overlaps(&taken, 0x0, 0x11));
    assert!(overlaps(&taken, 0x27, 0x30));
    assert!(!overlaps(&taken, 0x28, 0x30));
    assert!(overlaps(&taken, 0x3f, 0x50));
    assert!(!overlaps(&taken, 0x40, 0x50));
    assert!(overlaps(&taken, 0x0, 0x100));

    let data = debug_frame(&[(0x10, 0x10, &[0x41, 0x0e, 16]), (0x20, 0x10, &[])]);
    let mut section = DebugFrame::new(&data[..], LittleEndian);
    section.set_address_size(8);
    let mut c = Collector::default();
    c.walk(&section, &BaseAddresses::default(), &[(0x18, 0x1c)]);
    assert_eq!(c.fdes, 1);
    assert_eq!(
        normalize(c.rows),
        vec![row(0x20, KIND_CFA_RSP, 8, 0), row(0x30, KIND_NONE, 0, 0)]
    );
}

#[test]
fn not_elf_is_an_error_not_a_panic() {
    use std::io::Write;
    let mut bytes: Vec<Vec<u8>> = vec![b"my-hostname\n".to_vec(), vec![], b"\x7fELF".to_vec()];
    // A real ELF header: with the section header table moved out of the
    // file; big-endian; with a name table larger than the file.
    let mut header = vec![0u8; 64];
    File::open(LIBC)
        .and_then(|f| f.read_exact_at(&mut header, 0))
        .unwrap();
    let mut far = header.clone();
    far[40..48].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bytes.push(far);
    let mut big_endian = header.clone();
    big_endian[5] = 2;
    bytes.push(big_endian);
    let with_sections = |size: u64, shstrndx: u16| {
        let mut elf = header.clone();
        elf[40..48].copy_from_slice(&64u64.to_le_bytes()); // right after the header
        elf[60..62].copy_from_slice(&2u16.to_le_bytes());
        elf[62..64].copy_from_slice(&shstrndx.to_le_bytes());
        elf.extend([0u8; 64]); // the null section
        let mut sh = [0u8; 64];
        sh[4..8].copy_from_slice(&1u32.to_le_bytes()); // PROGBITS
        sh[24..32].copy_from_slice(&0u64.to_le_bytes()); // sh_offset
        sh[32..40].copy_from_slice(&size.to_le_bytes()); // sh_size
        elf.extend(sh);
        elf
    };
    bytes.push(with_sections(u64::MAX, 1));
    bytes.push(with_sections(1 << 40, 1));
    for b in bytes {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&b).unwrap();
        assert!(build(&f).is_err(), "{b:?}");
    }
    // Sections but no CFI: Ok(None).
    for (size, shstrndx) in [(u64::MAX, 0), (64, 1), (0, 1)] {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&with_sections(size, shstrndx)).unwrap();
        assert!(build(&f).unwrap().is_none());
    }
}

#[test]
fn a_build_past_its_budget_is_refused() {
    let f = File::open(LIBC).unwrap();
    let err = build_within(&f, std::time::Duration::ZERO).unwrap_err();
    assert!(format!("{err:#}").contains("took more than"), "{err:#}");
    assert!(build(&f).unwrap().is_some());
}

#[test]
fn truncated_files_are_errors() {
    use std::io::Write;
    let data = std::fs::read("/proc/self/exe").unwrap();
    // The linker puts the section headers at the very end of the file
    // (e_shoff + e_shnum * e_shentsize), so any truncation cuts them.
    let u = |o: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&data[o..o + n]);
        u64::from_le_bytes(b) as usize
    };
    assert_eq!(u(40, 8) + u(60, 2) * u(58, 2), data.len());
    let whole = tempfile::tempfile().unwrap();
    (&whole).write_all(&data).unwrap();
    let (rows, _) = build(&whole).unwrap().expect("the whole file has CFI");
    assert!(rows.len() > 1000);
    for len in [0, 63, 64, 4096, data.len() / 2, data.len() - 1] {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data[..len]).unwrap();
        let err = build(&f).expect_err(&format!("{len} bytes of {}", data.len()));
        let msg = format!("{err:#}");
        assert!(
            msg.contains("not an ELF file") || msg.contains("beyond the end of the file"),
            "{len} bytes: {msg}"
        );
    }
}

/// The rules readelf prints for one pc: column name → value.
type ReadelfRow = BTreeMap<String, String>;

/// An FDE of `readelf --debug-dump=frames-interp`.
struct ReadelfFde {
    debug_frame: bool,
    start: u64,
    end: u64,
    /// The rows, last one per pc; empty if the FDE has no instructions
    /// (readelf then prints no table: the CIE's rules apply).
    rows: BTreeMap<u64, ReadelfRow>,
    cie: Option<ReadelfRow>,
    /// Its CIE's augmentation has 'S': a signal trampoline.
    signal: bool,
}

/// Parses readelf's interpreted frames, or None if readelf is missing.
fn readelf_fdes(path: &str) -> Option<Vec<ReadelfFde>> {
    let out = match Command::new("readelf")
        .args([
            "--wide",
            "--debug-dump=no-follow-links",
            "--debug-dump=frames-interp",
            path,
        ])
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(
                !ci,
                "readelf (binutils) is needed to cross-check the unwind table"
            );
            println!("note: readelf not found, cross-check skipped");
            return None;
        }
        Err(e) => panic!("readelf: {e}"),
    };
    assert!(out.status.success(), "readelf failed on {path}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut cies: HashMap<(bool, u64), ReadelfRow> = HashMap::new();
    // The CIEs whose augmentation (`CIE "zRS"`) has 'S'.
    let mut signal_cies: std::collections::HashSet<(bool, u64)> = Default::default();
    let mut fdes: Vec<ReadelfFde> = vec![];
    let mut debug_frame = false;
    // The entry being read: a CIE (its offset) or the last FDE.
    let mut in_cie: Option<u64> = None;
    let mut columns: Vec<String> = vec![];
    for line in text.lines() {
        // Values are separated by spaces, but a register rule reads
        // "r9 (r9)": a token in parentheses belongs to the one before.
        let mut t: Vec<String> = vec![];
        for tok in line.split_whitespace() {
            match t.last_mut() {
                Some(last) if tok.starts_with('(') => {
                    last.push(' ');
                    last.push_str(tok);
                }
                _ => t.push(tok.to_string()),
            }
        }
        if line.starts_with("Contents of the ") {
            debug_frame = line.contains(".debug_frame");
            in_cie = None;
            continue;
        }
        if t.len() == 3 && t[1] == "ZERO" {
            columns.clear();
            continue;
        }
        if t.len() >= 4 && (t[3] == "CIE" || t[3] == "FDE") {
            columns.clear();
            if t[3] == "CIE" {
                let off = u64::from_str_radix(&t[0], 16).unwrap();
                in_cie = Some(off);
                if t.get(4)
                    .is_some_and(|a| a.starts_with('"') && a.contains('S'))
                {
                    signal_cies.insert((debug_frame, off));
                }
                continue;
            }
            in_cie = None;
            let cie = u64::from_str_radix(t[4].strip_prefix("cie=").unwrap(), 16).unwrap();
            let pc = t[5].strip_prefix("pc=").unwrap();
            let (start, end) = pc.split_once("..").unwrap();
            fdes.push(ReadelfFde {
                debug_frame,
                start: u64::from_str_radix(start, 16).unwrap(),
                end: u64::from_str_radix(end, 16).unwrap(),
                rows: BTreeMap::new(),
                cie: cies.get(&(debug_frame, cie)).cloned(),
                signal: signal_cies.contains(&(debug_frame, cie)),
            });
            continue;
        }
        if t.first().is_some_and(|t| t == "LOC") {
            columns = t[1..].to_vec();
            continue;
        }
        if columns.is_empty() || t.is_empty() {
            continue;
        }
        let loc = u64::from_str_radix(&t[0], 16);
        assert!(
            loc.is_ok() && t.len() == columns.len() + 1,
            "{path}: cannot read readelf's line {line:?} (columns {columns:?})"
        );
        let values: ReadelfRow = columns.iter().cloned().zip(t[1..].to_vec()).collect();
        match in_cie {
            Some(off) => {
                cies.insert((debug_frame, off), values);
            }
            None => {
                if let Some(fde) = fdes.last_mut() {
                    fde.rows.insert(loc.unwrap(), values);
                }
            }
        }
    }
    Some(fdes)
}

/// The address ranges of the sections `.plt` and `.plt.sec`, from
/// `readelf -SW`: the only places the standard PLT expression is used.
fn readelf_plt_ranges(path: &str) -> Vec<(u64, u64)> {
    let out = Command::new("readelf")
        .args(["-SW", path])
        .output()
        .expect("readelf");
    assert!(out.status.success(), "readelf -SW failed on {path}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_once(']')?.1.split_whitespace().collect();
            if t.len() < 5 || !matches!(t[0], ".plt" | ".plt.sec") {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
            let (addr, size) = (hex(t[2]), hex(t[4]));
            Some((addr, addr + size))
        })
        .collect()
}

/// What the table should say for a row readelf prints: (kind, cfa_off,
/// rbp_off). readelf prints any CFA expression as "exp": one in a PLT
/// section (`in_plt`) is the standard PLT expression, any other is
/// unsupported; in a signal trampoline (`signal`), the CFA, rbp and ra
/// given by expressions are the ucontext's (which
/// `signal_trampoline_rows` checks byte for byte).
fn expected(r: &ReadelfRow, in_plt: bool, signal: bool) -> (u8, u16, i8) {
    const UNSUPPORTED: (u8, u16, i8) = (KIND_UNSUPPORTED, 0, 0);
    if signal {
        let exp = |k: &str| r.get(k).is_some_and(|v| v == "exp");
        return if exp("CFA") && exp("rbp") && exp("ra") {
            (KIND_SIGNAL, 0, 0)
        } else {
            UNSUPPORTED
        };
    }
    match r.get("ra").map(String::as_str) {
        Some("c-8") => {}
        Some("u") => return (KIND_END, 0, 0),
        _ => return UNSUPPORTED,
    }
    let cfa = r.get("CFA").map(String::as_str).unwrap_or("");
    let (kind, off) = if let Some(n) = cfa.strip_prefix("rsp+") {
        (KIND_CFA_RSP, n.parse::<u16>())
    } else if let Some(n) = cfa.strip_prefix("rbp+") {
        (KIND_CFA_RBP, n.parse::<u16>())
    } else if cfa == "exp" && in_plt {
        (KIND_PLT, Ok(8))
    } else {
        return UNSUPPORTED;
    };
    let Ok(off) = off else { return UNSUPPORTED };
    let rbp = match r.get("rbp").map(String::as_str) {
        None | Some("u") | Some("s") => 0,
        Some(v) => match v.strip_prefix("c-").and_then(|n| n.parse::<i64>().ok()) {
            Some(n) if n != 0 && n % 8 == 0 && n / 8 <= 128 => (-n / 8) as i8,
            _ => return UNSUPPORTED,
        },
    };
    (kind, off, rbp)
}

/// Checks the table of `path` against every row readelf prints, and
/// that exactly `plt_rows` of them are PLT rows.
fn cross_check(path: &str, min_checked: usize, plt_rows: usize) {
    let Some(fdes) = readelf_fdes(path) else {
        return;
    };
    let plt_sections = readelf_plt_ranges(path);
    let t0 = Instant::now();
    let (rows, stats) = build(&File::open(path).unwrap()).unwrap().unwrap();
    let took = t0.elapsed();
    let fits = |f: &ReadelfFde| f.start < f.end && f.end <= u64::from(u32::MAX);
    // Which FDEs the table holds, worked out here: all of .eh_frame's,
    // and those of .debug_frame that no .eh_frame FDE overlaps.
    let eh: Vec<(u64, u64)> = fdes
        .iter()
        .filter(|f| !f.debug_frame && fits(f))
        .map(|f| (f.start, f.end))
        .collect();
    let overlaps_eh = |f: &ReadelfFde| eh.iter().any(|&(s, e)| s < f.end && f.start < e);
    let (mut checked, mut mismatches, mut plt) = (0, 0, 0);
    let mut unsupported: BTreeMap<String, usize> = BTreeMap::new();
    for f in fdes.iter().filter(|f| fits(f)) {
        if f.debug_frame && overlaps_eh(f) {
            continue;
        }
        let cie_rows;
        let rows_here = if f.rows.is_empty() {
            let Some(cie) = &f.cie else { continue };
            cie_rows = BTreeMap::from([(f.start, cie.clone())]);
            &cie_rows
        } else {
            &f.rows
        };
        for (&loc, values) in rows_here.range(f.start..f.end) {
            checked += 1;
            let in_plt = plt_sections.iter().any(|&(s, e)| s <= loc && loc < e);
            let want = expected(values, in_plt, f.signal);
            let got = lookup(&rows, loc as u32).map(|r| (r.kind, r.cfa_off, r.rbp_off));
            let ok = got == Some(want);
            if want.0 == KIND_PLT {
                plt += 1;
            }
            if want.0 == KIND_UNSUPPORTED {
                let key: Vec<String> = values
                    .iter()
                    .filter(|(k, v)| {
                        matches!(k.as_str(), "CFA" | "rbp" | "ra") || v.as_str() == "exp"
                    })
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                *unsupported.entry(key.join(" ")).or_default() += 1;
            }
            if !ok {
                mismatches += 1;
                if mismatches <= 10 {
                    println!(
                            "{path}: mismatch at {loc:#x} (FDE {:#x}..{:#x}): readelf {values:?}, want {want:?}, table {got:?}",
                            f.start, f.end
                        );
                }
            }
        }
    }
    println!(
        "{path}: {stats:?} in {took:?}; {checked} readelf rows checked, {plt} PLT, \
             {mismatches} mismatches"
    );
    for (k, n) in &unsupported {
        println!("  unsupported: {n} x {k}");
    }
    assert!(
        checked >= min_checked,
        "{path}: only {checked} rows checked"
    );
    assert_eq!(mismatches, 0, "{path}: rows differ from readelf");
    assert_eq!(plt, plt_rows, "{path}: PLT rows");
}

#[test]
fn matches_readelf_on_libc() {
    // One FDE covers .plt, with one row.
    cross_check(LIBC, 10_000, 1);
}

#[test]
fn matches_readelf_on_this_executable() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    // lld gives the PLT no call-frame information.
    cross_check(exe.to_str().unwrap(), 10_000, 0);
}

/// A C program whose own functions have only `.debug_frame` (the C
/// runtime's `_start` has `.eh_frame`), with frames on rbp and on rsp.
#[test]
fn matches_readelf_on_a_program_with_debug_frame() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("t.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int leaf(int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += a[i] * i;
    return s;
}
__attribute__((noinline)) int mid(int n) {
    int *a = alloca(n * sizeof(int));
    for (int i = 0; i < n; i++) a[i] = rand();
    return leaf(a, n) + printf("%d\n", n);
}
int main(int argc, char **argv) { return mid(argc * 100) & 1; }
"#,
    )
    .unwrap();
    for (name, flags) in [
        ("fp", &["-fno-omit-frame-pointer"][..]),
        ("nofp", &["-fomit-frame-pointer"][..]),
    ] {
        let exe = dir.path().join(name);
        let status = Command::new("cc")
            .args(["-g", "-O2", "-fno-asynchronous-unwind-tables", "-o"])
            .arg(&exe)
            .args(flags)
            .arg(&src)
            .status();
        match status {
            Ok(s) => assert!(s.success(), "cc failed"),
            Err(e) => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(!ci, "cc: {e}");
                println!("note: no C compiler ({e}), .debug_frame check skipped");
                return;
            }
        }
        let (rows, _) = build(&File::open(&exe).unwrap()).unwrap().unwrap();
        if name == "fp" {
            assert!(rows.iter().any(|r| r.kind == KIND_CFA_RBP), "{rows:?}");
        }
        cross_check(exe.to_str().unwrap(), 10, 1);
    }
}

#[test]
fn timing() {
    for path in [LIBC, "/usr/bin/bash", "/proc/self/exe"] {
        let Ok(f) = File::open(path) else {
            println!("{path}: missing");
            continue;
        };
        let t0 = Instant::now();
        let (rows, stats) = build(&f).unwrap().unwrap();
        let took = t0.elapsed();
        let mut kinds = [0usize; KIND_CLONE as usize + 1];
        for r in &rows {
            kinds[r.kind as usize] += 1;
        }
        // The table is what the BPF side's binary search needs: sorted,
        // one row per change of rule, offsets only where the kind has
        // them, ended by a row of no CFI; and the statistics count it.
        assert_eq!(stats.rows, rows.len(), "{path}");
        assert_eq!(
            stats.unsupported_rows, kinds[KIND_UNSUPPORTED as usize],
            "{path}"
        );
        assert!(
            stats.fdes > 0 && stats.fdes < rows.len(),
            "{path}: {stats:?}"
        );
        for w in rows.windows(2) {
            assert!(w[0].pc < w[1].pc, "{path}: unsorted {w:?}");
            let rule = |r: &Row| (r.kind, r.cfa_off, r.rbp_off);
            assert_ne!(rule(&w[0]), rule(&w[1]), "{path}: not merged {w:?}");
        }
        for r in &rows {
            if !matches!(r.kind, KIND_CFA_RSP | KIND_CFA_RBP | KIND_PLT | KIND_CLONE) {
                assert_eq!((r.cfa_off, r.rbp_off), (0, 0), "{path}: {r:?}");
            }
            assert!(
                r.kind <= KIND_SIGNAL || r.kind == KIND_CLONE,
                "{path}: {r:?}"
            );
        }
        assert_eq!(rows.last().unwrap().kind, KIND_NONE, "{path}");
        assert!(
            kinds[KIND_CFA_RSP as usize] > kinds.iter().sum::<usize>() / 4,
            "{path}: {kinds:?}"
        );
        println!(
                "timing {path}: {took:?}, {stats:?}, by kind (none, rsp, rbp, end, plt, unsupported, signal) {kinds:?}, {} KiB",
                rows.len() * std::mem::size_of::<Row>() / 1024
            );
        assert!(stats.rows > 100);
    }
}
