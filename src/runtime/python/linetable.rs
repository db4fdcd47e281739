//! Line numbers from a code object's `co_linetable`, in the two formats
//! the supported versions write:
//!
//! - 3.10 (PEP 626, `Objects/lnotab_notes.txt`): pairs of bytes, an
//!   unsigned byte count and a signed line delta; a delta of -128 means
//!   "no line", and a range of zero bytes only moves the line (the
//!   compiler splits deltas beyond ±127 and ranges beyond 254 bytes so).
//! - 3.11 on (the location table, `Objects/locations.md`): entries whose
//!   first byte has bit 7 set, code `(b >> 3) & 15` and length
//!   `(b & 7) + 1` code units, followed by varints: codes 0-9 keep the line
//!   (short form, columns in one byte), 10-12 add 0-2 (one-line form,
//!   columns in two bytes), 13 adds a signed varint (no columns), 14 adds a
//!   signed varint (long form, end line and columns follow), 15 has no
//!   location at all. Like CPython, a reader finds the next entry by the
//!   next byte with bit 7 set, so that only the line delta is decoded.
//!
//! Both are read the way CPython's own `co_lines()` reads them, and the
//! unit tests compare the two for every code unit of code compiled by each
//! installed interpreter. Every byte of a table comes from another process:
//! truncated or nonsensical tables end the ranges early or give no line,
//! never a panic, and a lookup costs one pass over the table.

/// The format of a line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 3.10: PEP 626's (byte delta, line delta) pairs.
    Pep626,
    /// 3.11 on: the location table.
    Locations,
}

/// A code object's line table, with what is needed to turn the instruction
/// the BPF program recorded into a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineTable {
    format: Format,
    table: Vec<u8>,
    firstlineno: i32,
    /// Where the bytecode begins in the code object (3.11 on), 0 in 3.10.
    code_start: u32,
}

/// One range of the bytecode, in bytes from its start, and its line (None:
/// instructions the compiler gave no line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    pub line: Option<i64>,
}

impl LineTable {
    /// A 3.10 table.
    pub fn pep626(table: Vec<u8>, firstlineno: i32) -> LineTable {
        LineTable {
            format: Format::Pep626,
            table,
            firstlineno,
            code_start: 0,
        }
    }

    /// A location table (3.11 on), of a code object whose bytecode begins
    /// `code_start` bytes into it (`Layout::co_code_start`).
    pub fn locations(table: Vec<u8>, firstlineno: i32, code_start: u32) -> LineTable {
        LineTable {
            format: Format::Locations,
            table,
            firstlineno,
            code_start,
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The table's ranges, in order, as `co_lines()` gives them (ranges of
    /// no bytes left out).
    pub fn ranges(&self) -> Ranges<'_> {
        Ranges {
            format: self.format,
            table: &self.table,
            at: 0,
            addr: 0,
            line: i64::from(self.firstlineno),
        }
    }

    /// The line of the code unit `offset` bytes into the bytecode: None
    /// where the table gives it none, or does not reach it.
    pub fn line_at_offset(&self, offset: u64) -> Option<u32> {
        let r = self
            .ranges()
            .take_while(|r| r.start <= offset)
            .find(|r| offset < r.end)?;
        r.line.and_then(|l| u32::try_from(l).ok())
    }

    /// The line of the instruction the BPF program recorded for a frame of
    /// this code:
    ///
    /// - 3.10: `f_lasti`, the index (in 2-byte code units) of the
    ///   instruction the frame last started. In a frame that has called
    ///   another, that is the call instruction (`CALL_FUNCTION` and
    ///   kin): the evaluation loop sets `f_lasti` as it dispatches each
    ///   instruction, and the callee runs in a C-level call made from the
    ///   caller's instruction. (An instruction with an `EXTENDED_ARG`
    ///   prefix runs with `f_lasti` on the prefix, which has the
    ///   instruction's line.) A
    ///   negative value (-1: not started) is the first line, as CPython's
    ///   own `PyCode_Addr2Line` has it.
    /// - 3.11 on: the frame's instruction pointer less the code object's
    ///   address, so a byte offset from the code object, of which the
    ///   bytecode starts at `co_code_start`. 3.11 and 3.12 keep
    ///   `prev_instr`, set to the instruction itself as it starts; a frame
    ///   that called a Python function has it on the last inline cache
    ///   entry of its `CALL` (set before the callee's frame is pushed), one
    ///   that is in a C function on the `CALL` itself; both have the
    ///   `CALL`'s location. 3.13 keeps `instr_ptr`, on the `CALL` itself
    ///   in both cases. A frame not yet started (3.11 and 3.12: the code
    ///   unit before the first) is given the first code unit's line.
    ///
    /// (The tests check these against live interpreters: each frame of a
    /// thread blocked two calls deep names its call's line.)
    pub fn line(&self, instr: u32) -> Option<u32> {
        match self.format {
            Format::Pep626 => {
                let index = instr as i32;
                if index < 0 {
                    return u32::try_from(self.firstlineno).ok();
                }
                self.line_at_offset(u64::from(instr) * 2)
            }
            Format::Locations => {
                let offset = if instr.checked_add(2) == Some(self.code_start) {
                    0
                } else {
                    instr.checked_sub(self.code_start)?
                };
                if offset % 2 != 0 {
                    return None;
                }
                self.line_at_offset(u64::from(offset))
            }
        }
    }
}

/// The ranges of a [`LineTable`].
pub struct Ranges<'a> {
    format: Format,
    table: &'a [u8],
    at: usize,
    addr: u64,
    line: i64,
}

impl Iterator for Ranges<'_> {
    type Item = Range;

    fn next(&mut self) -> Option<Range> {
        loop {
            let (bytes, line) = match self.format {
                Format::Pep626 => self.next_pep626()?,
                Format::Locations => self.next_location()?,
            };
            let start = self.addr;
            self.addr = self.addr.saturating_add(bytes);
            if bytes > 0 {
                return Some(Range {
                    start,
                    end: self.addr,
                    line,
                });
            }
        }
    }
}

impl Ranges<'_> {
    /// The next pair's length in bytes and line.
    fn next_pep626(&mut self) -> Option<(u64, Option<i64>)> {
        let pair = self.table.get(self.at..self.at + 2)?;
        self.at += 2;
        let (bytes, delta) = (u64::from(pair[0]), pair[1] as i8);
        if delta == -128 {
            return Some((bytes, None));
        }
        self.line = self.line.saturating_add(i64::from(delta));
        Some((bytes, Some(self.line)))
    }

    /// The next entry's length in bytes and line.
    fn next_location(&mut self) -> Option<(u64, Option<i64>)> {
        // An entry starts at a byte with bit 7 set (a table that does not
        // is skipped up to one that does, as CPython does).
        while *self.table.get(self.at)? & 0x80 == 0 {
            self.at += 1;
        }
        let first = self.table[self.at];
        let code = (first >> 3) & 15;
        let bytes = (u64::from(first & 7) + 1) * 2;
        let delta = match code {
            13 | 14 => signed_varint(self.table.get(self.at + 1..).unwrap_or(&[])),
            10..=12 => i64::from(code - 10),
            _ => 0,
        };
        self.at += 1;
        while self.table.get(self.at).is_some_and(|b| b & 0x80 == 0) {
            self.at += 1;
        }
        if code == 15 {
            return Some((bytes, None));
        }
        self.line = self.line.saturating_add(delta);
        Some((bytes, Some(self.line)))
    }
}

/// A varint of the location table: 6 bits a byte, least significant first,
/// bit 6 set on all but the last byte. Stops at the end of `b`, or after
/// the bits an `int` holds (CPython's own reader keeps 32).
fn varint(b: &[u8]) -> u64 {
    let mut value = 0u64;
    for (i, &byte) in b.iter().take(6).enumerate() {
        value |= u64::from(byte & 63) << (6 * i);
        if byte & 64 == 0 {
            break;
        }
    }
    value & 0xffff_ffff
}

/// A signed varint: the low bit is the sign, the rest the magnitude.
fn signed_varint(b: &[u8]) -> i64 {
    let v = varint(b);
    let magnitude = (v >> 1) as i64;
    if v & 1 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pep626_pairs() {
        // firstlineno 10: 6 bytes on line 11, 0 bytes +127 then 4 bytes +3
        // (line 141), 2 bytes with no line, 254 + 10 bytes on line 140.
        let t = LineTable::pep626(
            vec![6, 1, 0, 127, 4, 3, 2, 0x80, 254, (-1i8) as u8, 10, 0],
            10,
        );
        let got: Vec<_> = t.ranges().map(|r| (r.start, r.end, r.line)).collect();
        assert_eq!(
            got,
            vec![
                (0, 6, Some(11)),
                (6, 10, Some(141)),
                (10, 12, None),
                (12, 266, Some(140)),
                (266, 276, Some(140)),
            ]
        );
        assert_eq!(t.line(0), Some(11));
        assert_eq!(t.line(2), Some(11));
        assert_eq!(t.line(3), Some(141));
        assert_eq!(t.line(5), None);
        assert_eq!(t.line(137), Some(140));
        assert_eq!(t.line(138), None, "beyond the table");
        assert_eq!(t.line(u32::MAX), Some(10), "f_lasti -1: not started");
    }

    #[test]
    fn location_entries() {
        let entry = |code: u8, units: u8| 0x80 | (code << 3) | (units - 1);
        let t = LineTable::locations(
            vec![
                entry(14, 1), // long form: +2, end line, columns
                0x04,
                0x00,
                0x01,
                0x02,
                entry(0, 3), // short form: same line
                0x12,
                entry(15, 1), // no location
                entry(12, 2), // one-line form: +2
                0x05,
                0x07,
                entry(13, 1), // no columns: -3
                0x07,
                entry(13, 8), // no columns: +100 (two bytes: 200 = 8 | 3 << 6)
                0x48,
                0x03,
            ],
            5,
            200,
        );
        let got: Vec<_> = t.ranges().map(|r| (r.start, r.end, r.line)).collect();
        assert_eq!(
            got,
            vec![
                (0, 2, Some(7)),
                (2, 8, Some(7)),
                (8, 10, None),
                (10, 14, Some(9)),
                (14, 16, Some(6)),
                (16, 32, Some(106)),
            ]
        );
        assert_eq!(t.line(200), Some(7));
        assert_eq!(t.line(198), Some(7), "not started: the first unit");
        assert_eq!(t.line(196), None);
        assert_eq!(t.line(201), None, "not a code unit");
        assert_eq!(t.line(208), None);
        assert_eq!(t.line(212), Some(9));
        assert_eq!(t.line(230), Some(106));
        assert_eq!(t.line(232), None, "beyond the table");
    }

    /// Tables from another process may be anything: no panic, no endless
    /// loop, and no line beyond what the bytes can say.
    #[test]
    fn nonsense_tables() {
        let mut rng = crate::hostile::Rng(0x9e37_79b9_7f4a_7c15);
        for len in 0..300 {
            let table: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            for t in [
                LineTable::pep626(table.clone(), i32::MAX),
                LineTable::locations(table.clone(), i32::MIN, 2),
                LineTable::locations(table, 1, 0),
            ] {
                assert!(t.ranges().count() <= len);
                for instr in [0, 1, 2, 3, 100, 1000, u32::MAX - 1, u32::MAX] {
                    t.line(instr);
                }
            }
        }
        // A varint that never ends.
        assert_eq!(varint(&[0x7f; 100]), 0xffff_ffff);
        assert_eq!(signed_varint(&[]), 0);
    }
}
