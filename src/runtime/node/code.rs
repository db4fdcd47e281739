//! Where in its source a JavaScript frame is, and the functions an
//! optimized frame has inlined, read from a node process's heap with the
//! layouts of [`super::v8dbg::CodeLayout`].
//!
//! - An interpreted frame: its BytecodeArray's source position table at
//!   the frame's bytecode.
//! - A frame of generated code (baseline, Maglev, TurboFan): its `Code`,
//!   found from the frame's return address. Each `InstructionStream` (the
//!   code's instructions, in the code space) starts with its map and its
//!   `Code`, whose `instruction_start` points back just past that header:
//!   the search goes back from the return address over the places an
//!   instruction stream may begin (code is aligned) and takes the first
//!   whose header's `Code` says it begins there and holds the address.
//!   An optimizing compiler's Code has a source position table (at
//!   calls: every frame of an off-CPU stack is at one) whose positions
//!   carry an inlining id: the DeoptimizationData's inlining positions
//!   say, for each, which function was inlined (among its literals) and
//!   where its caller called it, down to the optimized function itself.
//!
//! Positions are V8's `SourcePosition`: bit 0 external (a position in
//! V8's own sources, not JavaScript), bits 1..31 the script offset plus
//! one, bits 31..47 the inlining id plus one. Tables are V8's
//! `SourcePositionTableIterator`'s: pairs of zigzag VLQ deltas (the code
//! offset, negated less one where not a statement; the position), from
//! code offset -1 and position 0.
//!
//! Everything read is checked as the names are (the object's type through
//! its map, lengths bounded): garbage, or code freed since, is an error,
//! never a frame named wrong.

use super::names::{unreadable, Reader, Result};
use super::v8dbg::{CodeLayout, BYTECODE_PREFIXES};

/// The most a search goes back from a return address for its code's
/// start: V8's largest optimized functions are a few hundred KiB.
const MAX_CODE: u64 = 1 << 20;
/// What the search reads at once.
const CHUNK: u64 = 16 << 10;
/// Where an instruction stream's instructions may begin (V8's
/// `kCodeAlignment` is 32 or 64 on x86-64).
const ALIGN: u64 = 32;
/// The longest position table or inlining table read.
const MAX_TABLE: i64 = 4 << 20;
/// The most functions one optimized frame is said to inline.
const MAX_INLINED: usize = 256;

/// A function's generated code, found from an address in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code {
    /// The Code object (a tagged pointer).
    pub code: u64,
    pub start: u64,
    pub size: u64,
    pub kind: u32,
}

/// One function of a frame: its SFI (tagged), and where in its script
/// the frame is (a character offset), if known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    pub shared: u64,
    pub position: Option<u32>,
}

/// A `SourcePosition`'s script offset and inlining id (None: none).
fn split_position(raw: i64) -> (Option<u32>, Option<usize>) {
    let raw = raw as u64;
    let offset = ((raw >> 1) & ((1 << 30) - 1)) as u32;
    let inlining = ((raw >> 31) & 0xffff) as usize;
    (offset.checked_sub(1), inlining.checked_sub(1))
}

/// An unsigned VLQ number at `table[*at..]` (seven bits a byte, the
/// lowest first, the top bit set on every byte but the last).
fn vlq_unsigned(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut u: u64 = 0;
    let mut shift = 0;
    loop {
        let b = *table.get(*at)?;
        *at += 1;
        u |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(u);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

/// A zigzag VLQ number at `table[*at..]`.
fn vlq(table: &[u8], at: &mut usize) -> Option<i64> {
    let u = vlq_unsigned(table, at)?;
    Some((u >> 1) as i64 ^ -((u & 1) as i64))
}

/// The size of the bytecode at `bytecodes[at..]`, with its prefix if it
/// has one (a prefix widens the operands of the bytecode after it), by
/// `sizes` (see [`super::v8dbg::Layout::bytecode_sizes`]).
fn bytecode_size(bytecodes: &[u8], at: usize, sizes: &[u8]) -> Option<usize> {
    let n = sizes.len() / 3;
    let b = usize::from(*bytecodes.get(at)?);
    if b >= BYTECODE_PREFIXES {
        return sizes.get(b).map(|&s| usize::from(s)).filter(|_| b < n);
    }
    // Wide and DebugBreakWide: double; the extra wide ones: quadruple.
    let row = if b % 2 == 0 { 1 } else { 2 };
    let next = usize::from(*bytecodes.get(at + 1)?);
    if next < BYTECODE_PREFIXES || next >= n {
        return None;
    }
    Some(1 + usize::from(sizes[row * n + next]))
}

/// The bytecode (its offset in `bytecodes`; -1: the function's entry) of
/// baseline code at `pc_offset` from its start, as V8's
/// `Code::GetBytecodeOffsetForBaselinePC` finds it: the code's bytecode
/// offset table holds the end of each bytecode's machine code (unsigned
/// VLQ deltas, the function's prologue first), the bytecodes in order.
/// None where the table or the bytecodes end before the address.
pub fn baseline_bytecode(
    table: &[u8],
    bytecodes: &[u8],
    sizes: &[u8],
    pc_offset: u64,
) -> Option<i64> {
    let mut at = 0;
    let mut end = vlq_unsigned(table, &mut at)?;
    let (mut bytecode, mut next) = (-1i64, 0usize);
    while end < pc_offset {
        end = end.checked_add(vlq_unsigned(table, &mut at)?)?;
        if next >= bytecodes.len() {
            return None;
        }
        bytecode = next as i64;
        next += bytecode_size(bytecodes, next, sizes)?;
    }
    Some(bytecode)
}

/// The JavaScript position (raw `SourcePosition`) of the last entry of
/// position table `table` at or before code offset `target`; None where
/// there is none, or the table is garbage.
pub fn position_at(table: &[u8], target: i64) -> Option<i64> {
    let (mut code, mut position) = (-1i64, 0i64);
    let mut found = None;
    let mut at = 0;
    while at < table.len() {
        let delta = vlq(table, &mut at)?;
        let delta = if delta >= 0 { delta } else { -(delta + 1) };
        code = code.checked_add(delta)?;
        position = position.checked_add(vlq(table, &mut at)?)?;
        if code > target {
            break;
        }
        if position & 1 == 0 {
            found = Some(position);
        }
    }
    found
}

impl Reader<'_> {
    fn code_layout(&self) -> Result<&CodeLayout> {
        self.layout
            .code
            .as_ref()
            .map_err(|_| super::names::Error::Unknown("where a frame is in its source"))
    }

    /// A byte array's bytes (a ByteArray, or 12 on a TrustedByteArray):
    /// its length (a Smi) after the map, its bytes after that.
    fn byte_array(&self, tagged: u64, what: &str) -> Result<Vec<u8>> {
        let l = self.layout;
        let o = self.object(tagged)?;
        if !self.code_layout()?.types_byte_array.contains(&o.kind) {
            return unreadable(format!("{what}: {tagged:#x} is not a byte array"));
        }
        let n = self.smi(self.field(o, l.fixed_array_length)?, what)?;
        if !(0..=MAX_TABLE).contains(&n) {
            return unreadable(format!("{what} of {n} bytes"));
        }
        let mut b = vec![0u8; n as usize];
        self.bytes(o.addr + l.fixed_array_data, &mut b)?;
        Ok(b)
    }

    /// Element `i` of a fixed array (of any of V8's kinds: its length, a
    /// Smi, after the map, then its elements).
    fn element(&self, tagged: u64, i: u64, what: &str) -> Result<u64> {
        let l = self.layout;
        let o = self.object(tagged)?;
        let n = self.smi(self.field(o, l.fixed_array_length)?, what)?;
        if i as i64 >= n {
            return unreadable(format!("{what} of {n} elements, not {}", i + 1));
        }
        self.field(o, l.fixed_array_data + 8 * i)
    }

    /// Whether `tagged` points to a BytecodeArray.
    pub fn is_bytecode_array(&self, tagged: u64) -> bool {
        self.object(tagged)
            .is_ok_and(|o| o.kind == self.layout.type_bytecode_array)
    }

    /// The script position of an interpreted frame: of bytecode `index` of
    /// BytecodeArray `bytecode` (tagged). None where V8 has not recorded
    /// the function's positions (it does when something asks, such as a
    /// stack trace).
    pub fn bytecode_position(&self, bytecode: u64, index: i64) -> Result<Option<u32>> {
        let c = self.code_layout()?;
        let o = self.typed(bytecode, self.layout.type_bytecode_array, "BytecodeArray")?;
        let length = self.smi(
            self.field(o, self.layout.fixed_array_length)?,
            "bytecode length",
        )?;
        if index < -1 || index >= length {
            return unreadable(format!("bytecode {index} of {length}"));
        }
        let table = self.field(o, c.bytecode_positions)?;
        // Not recorded: Smi 0 (12 on), undefined or an exception (11).
        if !self.layout.is_heap_object(table)
            || !c.types_byte_array.contains(&self.object(table)?.kind)
        {
            return Ok(None);
        }
        let table = self.byte_array(table, "a source position table")?;
        Ok(position_at(&table, index).and_then(|p| split_position(p).0))
    }

    /// The Code whose instructions hold `pc` (a return address, or the
    /// address after one's call), `istream_map` the map of instruction
    /// streams where known (found with the first code, for a quicker
    /// search).
    pub fn code_at(&self, pc: u64, istream_map: &mut Option<u64>) -> Result<Code> {
        let c = self.code_layout()?;
        let l = self.layout;
        let at = pc.wrapping_sub(1);
        let mut hi = at & !(ALIGN - 1);
        let floor = at.saturating_sub(MAX_CODE);
        let mut buf = vec![0u8; (CHUNK + c.istream_header) as usize];
        while hi > floor && hi >= CHUNK {
            let lo = hi - CHUNK;
            // The chunk, and the headers of the streams that may begin in
            // it (before their starts).
            let base = lo - c.istream_header;
            if self.bytes(base, &mut buf).is_err() {
                return unreadable(format!("no code before {pc:#x}"));
            }
            let word = |a: u64| {
                let i = (a - base) as usize;
                u64::from_le_bytes(buf[i..i + 8].try_into().unwrap())
            };
            let mut start = hi;
            while start > lo {
                let stream = start - c.istream_header;
                let map = word(stream);
                let code = word(stream + c.istream_code);
                let candidate = match *istream_map {
                    Some(m) => map == m,
                    None => l.is_heap_object(map) && l.is_heap_object(code),
                };
                if candidate && l.is_heap_object(code) {
                    if let Ok(found) = self.code_of_stream(c, code, stream, start) {
                        if at >= found.start && at - found.start < found.size {
                            if istream_map.is_none() {
                                let s = self.typed(
                                    stream + l.heap_object_tag,
                                    c.type_istream,
                                    "InstructionStream",
                                )?;
                                *istream_map = Some(self.u64(s.addr + l.heap_object_map)?);
                            }
                            return Ok(found);
                        }
                        // The stream before the address ends before it:
                        // the address is in no code.
                        return unreadable(format!("{pc:#x} in no code"));
                    }
                }
                start -= ALIGN;
            }
            hi = lo;
        }
        unreadable(format!("no code found before {pc:#x}"))
    }

    /// The Code `code` (tagged) of the instruction stream at `stream`
    /// whose instructions begin at `start`, if it says so.
    fn code_of_stream(&self, c: &CodeLayout, code: u64, stream: u64, start: u64) -> Result<Code> {
        let o = self.typed(code, c.type_code, "Code")?;
        if self.field(o, c.code_istream)? != stream + self.layout.heap_object_tag
            || self.field(o, c.code_start)? != start
        {
            return unreadable("a Code of another instruction stream");
        }
        let flags = self.u32(o.addr + c.code_flags)?;
        let size = self.u32(o.addr + c.code_size)?;
        Ok(Code {
            code,
            start,
            size: u64::from(size),
            kind: (flags >> c.kind_shift) & c.kind_mask,
        })
    }

    /// Whether `code` is an optimizing compiler's (it has inlined
    /// functions and positions at its calls).
    pub fn is_optimized(&self, code: &Code) -> bool {
        self.code_layout()
            .is_ok_and(|c| code.kind > c.kind_baseline)
    }

    /// Whether `code` is baseline code (Sparkplug's).
    pub fn is_baseline(&self, code: &Code) -> bool {
        self.code_layout()
            .is_ok_and(|c| code.kind == c.kind_baseline)
    }

    /// The script position of a baseline frame at return address `pc` in
    /// `code` (baseline): its bytecode, found with the code's bytecode
    /// offset table and its BytecodeArray (where an optimized code's
    /// deoptimization data would be), then that bytecode's position as
    /// for an interpreted frame. None where V8 has not recorded the
    /// function's positions.
    pub fn baseline_position(&self, code: &Code, pc: u64) -> Result<Option<u32>> {
        let c = self.code_layout()?;
        let l = self.layout;
        let sizes = l.bytecode_sizes.as_ref().map_err(|_| {
            super::names::Error::Unknown("where a baseline frame is in its bytecode")
        })?;
        let o = self.typed(code.code, c.type_code, "Code")?;
        let bytecode = self.field(o, c.code_deopt)?;
        let b = self.typed(bytecode, l.type_bytecode_array, "BytecodeArray")?;
        let length = self.smi(self.field(b, l.fixed_array_length)?, "bytecode length")?;
        if !(1..=MAX_TABLE).contains(&length) {
            return unreadable(format!("{length} bytes of bytecode"));
        }
        let mut bytecodes = vec![0u8; length as usize];
        self.bytes(b.addr + l.bytecode_array_data, &mut bytecodes)?;
        let table = self.byte_array(self.field(o, c.code_positions)?, "a bytecode offset table")?;
        let Some(index) = pc
            .checked_sub(code.start)
            .and_then(|offset| baseline_bytecode(&table, &bytecodes, sizes, offset))
        else {
            return unreadable(format!(
                "{pc:#x} past its baseline code's bytecode offset table"
            ));
        };
        self.bytecode_position(bytecode, index)
    }

    /// The functions of an optimized frame at return address `pc` in
    /// `code`, innermost first (the inlined ones, then the optimized
    /// function itself), each with its script position where the code's
    /// table has one.
    pub fn optimized_frames(&self, code: &Code, pc: u64) -> Result<Vec<Located>> {
        let c = self.code_layout()?;
        let l = self.layout;
        let o = self.typed(code.code, c.type_code, "Code")?;
        let deopt = self.field(o, c.code_deopt)?;
        let mut shared = self.element(deopt, c.deopt_shared, "DeoptimizationData")?;
        if let Some(f) = c.wrapper_shared {
            shared = self.field(self.object(shared)?, f)?;
        }
        self.typed(shared, l.type_shared_function_info, "SharedFunctionInfo")?;
        let table = self.field(o, c.code_positions)?;
        let raw = if l.is_heap_object(table) {
            let table = self.byte_array(table, "a source position table")?;
            position_at(&table, (pc - 1 - code.start) as i64)
        } else {
            None
        };
        let Some(mut raw) = raw else {
            return Ok(vec![Located {
                shared,
                position: None,
            }]);
        };
        let mut frames = Vec::new();
        let mut inlining: Option<Vec<u8>> = None;
        loop {
            let (position, id) = split_position(raw);
            let Some(id) = id else {
                frames.push(Located { shared, position });
                return Ok(frames);
            };
            if frames.len() >= MAX_INLINED {
                return unreadable("inlined functions without end");
            }
            if inlining.is_none() {
                let t = self.element(deopt, c.deopt_inlining, "DeoptimizationData")?;
                inlining = Some(self.byte_array(t, "inlining positions")?);
            }
            let table = inlining.as_deref().unwrap_or_default();
            let rec = table.get(id * 16..id * 16 + 16).map_or_else(
                || unreadable(format!("inlining {id} of {}", table.len() / 16)),
                Ok,
            )?;
            let caller = i64::from_le_bytes(rec[..8].try_into().unwrap());
            let function = i32::from_le_bytes(rec[8..12].try_into().unwrap());
            let inlined = if function < 0 {
                shared
            } else {
                let count = self.element(deopt, c.deopt_inlined_count, "DeoptimizationData")?;
                let count = self.smi(count, "the inlined function count")?;
                if i64::from(function) >= count {
                    return unreadable(format!("inlined function {function} of {count}"));
                }
                let literals = self.element(deopt, c.deopt_literals, "DeoptimizationData")?;
                // A weak reference's tag: a cleared one is not a pointer.
                let f = self.element(literals, function as u64, "deoptimization literals")? & !2;
                self.typed(f, l.type_shared_function_info, "SharedFunctionInfo")?;
                f
            };
            frames.push(Located {
                shared: inlined,
                position,
            });
            // The caller's position: an id below this one's, or none.
            if split_position(caller).1.is_some_and(|c| c >= id) {
                return unreadable("inlining positions out of order");
            }
            raw = caller;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zigzag(v: i64, out: &mut Vec<u8>) {
        let mut u = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let b = (u & 0x7f) as u8;
            u >>= 7;
            if u == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// A table of (code offset, statement, raw position) entries, as V8
    /// writes one.
    fn table(entries: &[(i64, bool, i64)]) -> Vec<u8> {
        let (mut code, mut position) = (-1, 0);
        let mut out = Vec::new();
        for &(c, statement, p) in entries {
            let d = c - code;
            zigzag(if statement { d } else { -d - 1 }, &mut out);
            zigzag(p - position, &mut out);
            code = c;
            position = p;
        }
        out
    }

    fn js(offset: i64, inlining: Option<i64>) -> i64 {
        (offset + 1) << 1 | inlining.map_or(0, |i| (i + 1) << 31)
    }

    #[test]
    fn a_table_gives_the_last_position_at_or_before_the_offset() {
        let t = table(&[
            (-1, true, js(10, None)),
            (0, true, js(14, None)),
            (7, false, js(120, Some(0))),
            (7, true, 3 /* external */),
            (30, true, js(40, Some(1))),
            (90, false, js(9, None)),
        ]);
        assert_eq!(position_at(&t, -1), Some(js(10, None)));
        assert_eq!(position_at(&t, 0), Some(js(14, None)));
        assert_eq!(position_at(&t, 6), Some(js(14, None)));
        // An external position is not JavaScript's: the one before stays.
        assert_eq!(position_at(&t, 7), Some(js(120, Some(0))));
        assert_eq!(position_at(&t, 89), Some(js(40, Some(1))));
        assert_eq!(position_at(&t, 1000), Some(js(9, None)));
        assert_eq!(split_position(js(120, Some(0))), (Some(120), Some(0)));
        assert_eq!(split_position(js(9, None)), (Some(9), None));
        assert_eq!(split_position(0), (None, None));
    }

    #[test]
    fn garbage_tables_end() {
        assert_eq!(position_at(&[0xff; 20], 5), None);
        assert_eq!(position_at(&[], 5), None);
        let mut seed = 7u64;
        for _ in 0..2000 {
            let t: Vec<u8> = (0..64)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) as u8
                })
                .collect();
            let _ = position_at(&t, (seed >> 40) as i64 % 500);
        }
    }

    /// Bytecodes of sizes 1 (bytecode 4), 2 (5) and 3 (6), 5 and 9 wide.
    fn sizes() -> Vec<u8> {
        let mut s = vec![1u8; 3 * 8];
        for (b, single) in [(5usize, 2u8), (6, 3)] {
            s[b] = single;
            s[8 + b] = 1 + 2 * (single - 1);
            s[16 + b] = 1 + 4 * (single - 1);
        }
        s
    }

    #[test]
    fn a_baseline_address_gives_its_bytecode() {
        // Bytecodes: 4 at 0, 5 at 1, Wide-prefixed 6 at 3 (1 + 5 bytes),
        // 4 at 9. Machine code: a prologue of 10 bytes, then 4, 6, 8, 2.
        let bytecodes = [4, 5, 0, 0, 6, 0, 0, 0, 0, 4];
        let table = [10, 4, 6, 8, 2];
        let at = |pc| baseline_bytecode(&table, &bytecodes, &sizes(), pc);
        assert_eq!(at(0), Some(-1));
        assert_eq!(at(10), Some(-1));
        assert_eq!(at(11), Some(0));
        assert_eq!(at(14), Some(0));
        assert_eq!(at(15), Some(1));
        assert_eq!(at(20), Some(1));
        assert_eq!(at(21), Some(3));
        assert_eq!(at(28), Some(3));
        assert_eq!(at(30), Some(9));
        assert_eq!(at(31), None);
    }

    #[test]
    fn garbage_bytecodes_end() {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        };
        for _ in 0..2000 {
            let t: Vec<u8> = (0..32).map(|_| next()).collect();
            let b: Vec<u8> = (0..32).map(|_| next() % 10).collect();
            let pc = u64::from(next()) * 8;
            let _ = baseline_bytecode(&t, &b, &sizes(), pc);
        }
    }
}
