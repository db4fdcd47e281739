//! DWARF call-frame information (CFI) of an x86-64 ELF file, flattened into
//! a compact table sorted by pc that the BPF program binary-searches to
//! unwind user stacks built without frame pointers.
//!
//! [`build`] reads only the ELF header, the section headers, the section
//! name table and the CFI sections `.eh_frame` and `.debug_frame`, walks
//! every row of every FDE with gimli, and keeps for each row only what the
//! BPF unwinder can use: how to find the CFA (rsp or rbp plus an offset, or
//! the PLT expression), whether the return address is undefined (the
//! outermost frame), and where the caller's rbp was saved. A signal
//! trampoline's rows are [`KIND_SIGNAL`]: the interrupted code's registers
//! are read from the `struct ucontext` at rsp. The few instructions after
//! glibc's clone syscall, which no FDE covers, get a row of their own
//! ([`KIND_CLONE`], see [`clone_gaps`]). Rows it cannot express are
//! kept as [`KIND_UNSUPPORTED`] so that the unwinder stops there instead of
//! guessing.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::elf::{Elf, ET_DYN, ET_EXEC, SHF_COMPRESSED};
use anyhow::Result;
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register,
    RegisterRule, UnwindContext, UnwindOffset, UnwindSection,
};

/// How the canonical frame address (CFA) and the caller's registers are
/// found at a pc: `enum unwind_kind` of offcputime.h, which says what each
/// means.
pub const KIND_NONE: u8 = kind(K::UNWIND_NONE);
pub const KIND_CFA_RSP: u8 = kind(K::UNWIND_CFA_RSP);
pub const KIND_CFA_RBP: u8 = kind(K::UNWIND_CFA_RBP);
pub const KIND_END: u8 = kind(K::UNWIND_END);
pub const KIND_PLT: u8 = kind(K::UNWIND_PLT);
pub const KIND_UNSUPPORTED: u8 = kind(K::UNWIND_UNSUPPORTED);
pub const KIND_SIGNAL: u8 = kind(K::UNWIND_SIGNAL);
pub const KIND_CLONE: u8 = kind(K::UNWIND_CLONE);

use crate::bpf::types::unwind_kind as K;

const fn kind(k: K) -> u8 {
    k.0 as u8
}

/// What a stored user stack holds in place of a signal trampoline's pc
/// (`UNWIND_SIGNAL_FRAME` in offcputime.h): the frame where a signal
/// handler was called. The frame after it is the interrupted pc itself, not
/// a return address. A non-canonical address: no code runs there.
pub const SIGNAL_FRAME: u64 =
    (crate::bpf::types::unwind_frame_special::UNWIND_SIGNAL_FRAME_HI.0 as u64) << 32;

/// One row of the table: the unwind rule from `pc` up to the next row's pc.
///
/// Rows of kinds other than [`KIND_CFA_RSP`], [`KIND_CFA_RBP`],
/// [`KIND_PLT`] and [`KIND_CLONE`] have `cfa_off` and `rbp_off` 0, so that consecutive ones
/// merge. The layout is C's (8 bytes: `pc` at 0, `cfa_off` at 4, `kind` at
/// 6, `rbp_off` at 7), so the rows can be copied as they are into a BPF map
/// whose value is the same struct in C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Row {
    /// First address the row covers, in the object's own virtual addresses (ELF p_vaddr space, as FDE pc values are). The row holds until the next row's pc.
    pub pc: u32,
    /// KIND_CFA_RSP / KIND_CFA_RBP: CFA = reg + cfa_off. Must fit u16, else the row is KIND_UNSUPPORTED.
    pub cfa_off: u16,
    pub kind: u8,
    /// Where the caller's rbp was saved: at CFA + 8 * rbp_off. 0 means rbp is unchanged (rule "same value"/"undefined"/not mentioned). An offset that is not a multiple of 8 or out of i8*8 range makes the row KIND_UNSUPPORTED.
    pub rbp_off: i8,
}

impl From<Row> for crate::bpf::types::unwind_row {
    fn from(r: Row) -> crate::bpf::types::unwind_row {
        crate::bpf::types::unwind_row {
            pc: r.pc,
            cfa_off: r.cfa_off,
            kind: r.kind,
            rbp_off: r.rbp_off,
        }
    }
}

// The same layout as `struct unwind_row` (its rows are copied into the
// BPF program's table as they are).
const _: () = {
    use crate::bpf::types::unwind_row as C;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Row>() == size_of::<C>());
    assert!(offset_of!(Row, pc) == offset_of!(C, pc));
    assert!(offset_of!(Row, cfa_off) == offset_of!(C, cfa_off));
    assert!(offset_of!(Row, kind) == offset_of!(C, kind));
    assert!(offset_of!(Row, rbp_off) == offset_of!(C, rbp_off));
};

/// Rows gathered from one file at most (before merging): twice what the
/// BPF program can search in one object (`UNWIND_MAX_OBJECT_ROWS`), so
/// that a table that could fit after merging is built, and a file that
/// claims endless rows is refused while it is read.
const MAX_ROWS: usize = 1 << 25;

/// Statistics for -v and tests.
///
/// `fdes` counts the FDEs whose rows went into the table (those of
/// `.debug_frame` that overlap `.eh_frame` ones, and those beyond 4 GiB or
/// empty, are not counted); `rows` and `unsupported_rows` count the rows
/// of the final, merged table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    pub fdes: usize,
    pub rows: usize,
    pub unsupported_rows: usize,
}

/// DWARF register numbers of x86-64.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// The CFA expression of the standard lazy-binding PLT (and of `.plt.sec`):
/// `DW_OP_breg7 (rsp): 8; DW_OP_breg16 (rip): 0; DW_OP_lit15; DW_OP_and;
/// DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`. Byte 6 is
/// `DW_OP_lit11` (GNU ld, the only form on this machine) or `DW_OP_lit10`
/// (some other linkers); the two agree at every instruction boundary of a
/// 16-byte PLT entry (0, 6, 11), so both are [`KIND_PLT`].
const PLT_EXPR: [u8; 11] = [
    0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
];
const PLT_EXPR_LIT_AT: usize = 6;
const DW_OP_LIT10: u8 = 0x3a;

fn is_plt_expression(expr: &[u8]) -> bool {
    expr.len() == PLT_EXPR.len()
        && expr
            .iter()
            .zip(PLT_EXPR)
            .enumerate()
            .all(|(i, (&b, p))| b == p || (i == PLT_EXPR_LIT_AT && b == DW_OP_LIT10))
}

/// Builds the table of one ELF file from .eh_frame and, where present, .debug_frame.
/// Returns Ok(None) if the file has no CFI at all. Errors only for I/O errors or malformed ELF.
///
/// Files that are not little-endian ELF64 for x86-64 are errors; relocatable
/// objects and other files that are neither executables nor shared objects
/// are `Ok(None)` (their pcs are not addresses). Compressed `.debug_frame`
/// sections (`SHF_COMPRESSED`) are ignored. CFI that gimli cannot parse is
/// skipped: an FDE that fails to evaluate contributes no rows, and a
/// section whose entry list cannot be parsed contributes the FDEs before the
/// bad entry.
///
/// Where both sections describe a pc, `.eh_frame` wins: an FDE of
/// `.debug_frame` that overlaps any FDE of `.eh_frame` is left out whole,
/// so that the rows of one function never mix the two sources.
pub fn build(file: &File) -> Result<Option<(Vec<Row>, TableStats)>> {
    build_within(file, MAX_BUILD_TIME)
}

/// At most this long to build one file's table (libc takes 5 ms, a
/// 200 MB program a second or two): a file made to take longer is
/// refused, its frames walked with frame pointers.
pub const MAX_BUILD_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// [`build`], giving up after `budget`.
pub fn build_within(
    file: &File,
    budget: std::time::Duration,
) -> Result<Option<(Vec<Row>, TableStats)>> {
    let elf = Elf::read(file)?;
    if !matches!(elf.e_type, ET_EXEC | ET_DYN) {
        return Ok(None);
    }
    let eh_frame = elf.section(".eh_frame");
    let debug_frame = elf
        .section(".debug_frame")
        .filter(|s| s.flags & SHF_COMPRESSED == 0);
    if eh_frame.is_none() && debug_frame.is_none() {
        return Ok(None);
    }

    let mut out = Collector {
        deadline: Some(std::time::Instant::now() + budget),
        ..Collector::default()
    };
    if let Some(sec) = eh_frame {
        let data = elf.read_section(file, sec)?;
        let mut bases = BaseAddresses::default().set_eh_frame(sec.addr);
        if let Some(s) = elf.section(".text") {
            bases = bases.set_text(s.addr);
        }
        if let Some(s) = elf.section(".eh_frame_hdr") {
            bases = bases.set_eh_frame_hdr(s.addr);
        }
        if let Some(s) = elf.section(".got") {
            bases = bases.set_got(s.addr);
        }
        let mut section = EhFrame::new(&data, LittleEndian);
        section.set_address_size(8);
        out.walk(&section, &bases, &[]);
    }
    if let Some(sec) = debug_frame {
        let data = elf.read_section(file, sec)?;
        let mut section = DebugFrame::new(&data, LittleEndian);
        section.set_address_size(8);
        let taken = union_of(std::mem::take(&mut out.ranges));
        if !out.too_slow {
            out.walk(&section, &BaseAddresses::default(), &taken);
        }
    }
    if out.too_many {
        // wording: a count never 1
        anyhow::bail!("more than {MAX_ROWS} unwind rows");
    }
    if out.too_slow {
        anyhow::bail!("reading its call-frame information took more than {budget:?}");
    }
    if out.fdes == 0 {
        return Ok(None);
    }
    let mut rows = normalize(out.rows);
    clone_gaps(&elf, file, &mut rows);
    let stats = TableStats {
        fdes: out.fdes,
        rows: rows.len(),
        unsupported_rows: rows.iter().filter(|r| r.kind == KIND_UNSUPPORTED).count(),
    };
    Ok(Some((rows, stats)))
}

/// The row that applies at `pc` (last row with row.pc <= pc), if any and not KIND_NONE.
pub fn lookup(rows: &[Row], pc: u32) -> Option<Row> {
    let i = rows.partition_point(|r| r.pc <= pc);
    let row = *rows.get(i.checked_sub(1)?)?;
    (row.kind != KIND_NONE).then_some(row)
}

/// Sorts rows by pc, keeps one row per pc, and merges runs of equal rules.
///
/// The sort is stable, and of the rows at one pc the last one written wins,
/// except that a real row beats a [`KIND_NONE`] end marker (an FDE that
/// starts where another ends). Then a row whose (kind, cfa_off, rbp_off)
/// equals its predecessor's is dropped: the predecessor already covers it.
fn normalize(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort_by_key(|r| r.pc);
    // In place: rows[..kept] is the output, never ahead of the reading.
    let mut kept = 0;
    let mut i = 0;
    while i < rows.len() {
        let pc = rows[i].pc;
        let mut j = i;
        let mut pick = rows[i];
        while j < rows.len() && rows[j].pc == pc {
            if rows[j].kind != KIND_NONE || pick.kind == KIND_NONE {
                pick = rows[j];
            }
            j += 1;
        }
        i = j;
        let same_rule =
            |a: &Row| (a.kind, a.cfa_off, a.rbp_off) == (pick.kind, pick.cfa_off, pick.rbp_off);
        if kept == 0 || !same_rule(&rows[kept - 1]) {
            rows[kept] = pick;
            kept += 1;
        }
    }
    rows.truncate(kept);
    rows.shrink_to_fit();
    rows
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Rows and FDE ranges gathered from the CFI sections, in the order written.
#[derive(Default)]
struct Collector {
    rows: Vec<Row>,
    /// More than MAX_ROWS rows: the file is refused.
    too_many: bool,
    /// Past this, the walk stops and the file is refused.
    deadline: Option<std::time::Instant>,
    too_slow: bool,
    /// The pc ranges of the FDEs taken so far.
    ranges: Vec<(u32, u32)>,
    fdes: usize,
}

impl Collector {
    /// Adds the rows of every FDE of `section` whose range fits u32, is not
    /// empty, and does not overlap `taken` (sorted, disjoint ranges).
    fn walk<'a, S: UnwindSection<Slice<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        taken: &[(u32, u32)],
    ) {
        let mut cies: HashMap<usize, gimli::CommonInformationEntry<Slice<'a>>> = HashMap::new();
        let mut ctx = UnwindContext::new();
        let mut entries = section.entries(bases);
        // A parse error in the entry list leaves no way to find the next
        // entry: keep what came before.
        let mut seen = 0u32;
        while let Ok(Some(entry)) = entries.next() {
            seen = seen.wrapping_add(1);
            if seen.is_multiple_of(256)
                && self.deadline.is_some_and(|d| std::time::Instant::now() > d)
            {
                self.too_slow = true;
                return;
            }
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let fde = partial.parse(|section, bases, offset| {
                let key: usize = UnwindOffset::into(offset);
                if let Some(cie) = cies.get(&key) {
                    return Ok(cie.clone());
                }
                let cie = section.cie_from_offset(bases, offset)?;
                cies.insert(key, cie.clone());
                Ok(cie)
            });
            let Ok(fde) = fde else { continue };
            let (Ok(start), Ok(end)) = (
                u32::try_from(fde.initial_address()),
                u32::try_from(fde.end_address()),
            ) else {
                continue;
            };
            if start >= end || overlaps(taken, start, end) {
                continue;
            }
            let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
                continue;
            };
            let before = self.rows.len();
            let ok = loop {
                match table.next_row() {
                    Ok(Some(row)) => {
                        let (pc, row_end) = (row.start_address(), row.end_address());
                        // Empty rows (an advance by 0, or a last advance
                        // to the very end) hold nowhere.
                        if pc >= row_end || pc < u64::from(start) || pc >= u64::from(end) {
                            continue;
                        }
                        if self.rows.len() >= MAX_ROWS {
                            self.too_many = true;
                            return;
                        }
                        let mut r = if fde.cie().is_signal_trampoline() {
                            translate_signal(section, row)
                        } else {
                            translate(section, row)
                        };
                        r.pc = pc as u32;
                        self.rows.push(r);
                    }
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            };
            if !ok {
                self.rows.truncate(before);
                continue;
            }
            // The end marker; where another FDE starts at `end`, its first
            // row beats the marker in `normalize`.
            self.rows.push(Row {
                pc: end,
                cfa_off: 0,
                kind: KIND_NONE,
                rbp_off: 0,
            });
            self.ranges.push((start, end));
            self.fdes += 1;
        }
    }
}

/// The instructions of glibc's `clone` and `clone3` (x86-64) from their
/// `syscall` on: `syscall; test %rax,%rax; jl <error>; je <child>; ret`,
/// where `<child>` is the next instruction. glibc ends the function's FDE
/// before the `syscall` (the child's registers are not the parent's) and
/// starts the child's, whose return address is undefined, after the
/// `ret`, so that no CFI covers these 10 bytes. A thread is found there
/// whenever it blocks in the syscall (a `vfork` parent waits there for
/// its child, as `posix_spawn` does) or is preempted right after it.
const CLONE_TAIL: [u8; 10] = [0x0f, 0x05, 0x48, 0x85, 0xc0, 0x7c, 0x00, 0x74, 0x01, 0xc3];
const CLONE_TAIL_ANY_AT: usize = 6;

/// Turns the gap after a clone's `syscall` ([`CLONE_TAIL`]) into a
/// [`KIND_CLONE`] row, where the FDE before it ends there with
/// CFA = rsp + 8 and rbp not saved, and the next one starts after its
/// `ret` with an undefined return address: in the parent the rule before
/// the syscall still holds (the syscall moves no register the rule reads),
/// in the child (rax 0) the stack starts there. The code is read from the
/// file only at such gaps (two in glibc); one that cannot be read stays a
/// gap.
fn clone_gaps(elf: &Elf, file: &File, rows: &mut [Row]) {
    let len = CLONE_TAIL.len() as u32;
    let candidates: Vec<usize> = (1..rows.len().saturating_sub(1))
        .filter(|&k| {
            let (before, gap, after) = (rows[k - 1], rows[k], rows[k + 1]);
            gap.kind == KIND_NONE
                && after.kind == KIND_END
                && gap.pc.checked_add(len) == Some(after.pc)
                && (before.kind, before.cfa_off, before.rbp_off) == (KIND_CFA_RSP, 8, 0)
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let Ok(segments) = elf.load_segments(file) else {
        return;
    };
    for k in candidates {
        let at = u64::from(rows[k].pc);
        let Some(seg) = segments.iter().find(|s| {
            at >= s.vaddr
                && (at - s.vaddr)
                    .checked_add(u64::from(len))
                    .is_some_and(|end| end <= s.filesz)
        }) else {
            continue;
        };
        let mut code = [0u8; CLONE_TAIL.len()];
        let Some(offset) = seg.offset.checked_add(at - seg.vaddr) else {
            continue;
        };
        if file.read_exact_at(&mut code, offset).is_err() {
            continue;
        }
        let matches = code
            .iter()
            .zip(CLONE_TAIL)
            .enumerate()
            .all(|(i, (&b, want))| i == CLONE_TAIL_ANY_AT || b == want);
        if matches {
            rows[k].kind = KIND_CLONE;
            rows[k].cfa_off = 8;
        }
    }
}

/// The row (without its pc) for one row of the DWARF table.
fn translate<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
) -> Row {
    let kind_only = |kind| Row {
        pc: 0,
        cfa_off: 0,
        kind,
        rbp_off: 0,
    };
    match row.register(RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return kind_only(KIND_END),
        _ => return kind_only(KIND_UNSUPPORTED),
    }
    let (kind, cfa_off) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                RSP => KIND_CFA_RSP,
                RBP => KIND_CFA_RBP,
                _ => return kind_only(KIND_UNSUPPORTED),
            };
            match u16::try_from(*offset) {
                Ok(off) => (kind, off),
                Err(_) => return kind_only(KIND_UNSUPPORTED),
            }
        }
        CfaRule::Expression(expr) => match expr.get(section) {
            Ok(e) if is_plt_expression(e.0.slice()) => (KIND_PLT, 8),
            _ => return kind_only(KIND_UNSUPPORTED),
        },
    };
    let rbp_off = match row.register(RBP) {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(n)) if n != 0 && n % 8 == 0 => match i8::try_from(n / 8) {
            Ok(off) => off,
            Err(_) => return kind_only(KIND_UNSUPPORTED),
        },
        Some(_) => return kind_only(KIND_UNSUPPORTED),
    };
    Row {
        pc: 0,
        cfa_off,
        kind,
        rbp_off,
    }
}

/// Where the kernel's `struct ucontext` (at rsp in a signal trampoline,
/// x86-64) holds the interrupted rbp, rsp and rip: the BPF unwinder reads
/// them there (`UCONTEXT_*` in src/bpf/dwarf.h).
const UCONTEXT_RBP: u8 = 0x78;
const UCONTEXT_RSP: u8 = 0xa0;
const UCONTEXT_RIP: u8 = 0xa8;

/// `DW_OP_breg7 (rsp): off`, for an `off` of 64 or more (two bytes of
/// SLEB128).
fn breg7(off: u8) -> [u8; 3] {
    [0x77, 0x80 | (off & 0x7f), off >> 7]
}

/// The row of a signal trampoline's FDE (its CIE has the 'S'
/// augmentation): [`KIND_SIGNAL`] where the rules are the ucontext's as
/// the BPF unwinder reads it (CFA = the saved rsp, rbp and rip at their
/// places in it), else [`KIND_UNSUPPORTED`].
fn translate_signal<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
) -> Row {
    let bytes = |e: &gimli::UnwindExpression<usize>| e.get(section).ok().map(|e| e.0.slice());
    let cfa_ok = match row.cfa() {
        CfaRule::Expression(e) => {
            let want = [&breg7(UCONTEXT_RSP)[..], &[0x06]].concat(); // DW_OP_deref
            bytes(e) == Some(&want[..])
        }
        _ => false,
    };
    let at = |reg, off| match row.register(reg) {
        Some(RegisterRule::Expression(e)) => bytes(&e) == Some(&breg7(off)[..]),
        _ => false,
    };
    Row {
        pc: 0,
        cfa_off: 0,
        kind: if cfa_ok && at(RA, UCONTEXT_RIP) && at(RBP, UCONTEXT_RBP) {
            KIND_SIGNAL
        } else {
            KIND_UNSUPPORTED
        },
        rbp_off: 0,
    }
}

/// Sorted, disjoint ranges covering the same pcs as `ranges`.
fn union_of(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Whether [start, end) overlaps any of the sorted, disjoint `ranges`.
fn overlaps(ranges: &[(u32, u32)], start: u32, end: u32) -> bool {
    let i = ranges.partition_point(|r| r.0 < end);
    i > 0 && ranges[i - 1].1 > start
}

#[cfg(test)]
mod tests;
