//! Inlined frames and source lines from DWARF in compressed sections (the
//! separate debug files distributions ship: libc6-dbg's `.debug_info` is
//! 2.3 MB in the file and 5.8 MB inflated). A general DWARF reader inflates
//! every section whole and indexes every unit, about 14 MB resident to name
//! a handful of libc frames. Here `.debug_aranges` says which compilation
//! units hold the addresses asked about, `.debug_info` is inflated as a
//! stream of which only those units are kept (and the stream left once the
//! last is read), and each unit is read on its own.
//!
//! The answers are those of blazesym's DWARF reader, which the caller uses
//! for every other file: the same function by address, the same chain of
//! inlined calls, the same line-table row and call sites. Where this reader
//! cannot be sure of that (an address no range list places, a reference
//! into another unit, a section it does not know how to inflate), it says
//! so with `None`, and the caller reads the file the general way.

use std::fs::File;
use std::os::unix::fs::FileExt;

use gimli::{EndianSlice, LittleEndian, SectionId};

use crate::elf::{Elf, Section};

/// A source location: the file's name as the line table has it, and the
/// line (None where the table says 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub file: String,
    pub line: Option<u32>,
}

/// What DWARF says of one address: where it is (None where no line-table
/// row covers it, and then nothing else is said) and the functions inlined
/// there, outermost first, each with where it is in the one it was inlined
/// into... as blazesym gives them (each inlined function carries the
/// location inside it, the function outside them the call site of the
/// outermost).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Found {
    pub location: Option<Loc>,
    pub inlined: Vec<(String, Option<Loc>)>,
}

/// `SHF_COMPRESSED`, and the one compression this reads (`ELFCOMPRESS_ZLIB`).
const SHF_COMPRESSED: u64 = 0x800;
/// A relocatable object's type (`ET_REL`).
const ET_REL: u16 = 1;
/// No abbreviation table or line table is longer (a hostile file's may
/// never end).
const MAX_SPAN: u64 = 64 << 20;
const ELFCOMPRESS_ZLIB: u32 = 1;
/// The size of an `Elf64_Chdr`.
const CHDR_BYTES: u64 = 24;
/// No section this reads is larger inflated (a hostile header says what it
/// likes; the buffers grow with what actually comes out).
const MAX_INFLATED: u64 = 1 << 30;
/// Compressed bytes read from the file at a time, and inflated bytes made
/// at a time.
const CHUNK: usize = 64 << 10;

/// Why this reader does not answer: the caller reads the file the general
/// way.
type Answer<T> = Option<T>;

/// The DWARF of each of `addrs` (addresses of the file's own layout) in the
/// ELF file `file`, or None where it cannot be read this way.
pub(super) fn find(file: &File, elf: &Elf, addrs: &[u64], inline: bool) -> Answer<Vec<Found>> {
    if addrs.is_empty() {
        return Some(Vec::new());
    }
    let info = elf.section(".debug_info")?;
    if info.flags & SHF_COMPRESSED == 0 {
        return None;
    }
    // Not read here: a supplementary file's strings and entries (dwz), and
    // an object file's relocations.
    if elf.e_type == ET_REL
        || [".gnu_debugaltlink", ".debug_sup"]
            .iter()
            .any(|n| elf.section(n).is_some())
    {
        return None;
    }
    let aranges = whole(file, elf, ".debug_aranges")?;
    let (units, aranged) = units_of(&aranges, addrs)?;
    drop(aranges);
    let mut wanted: Vec<u64> = units.iter().flatten().copied().collect();
    wanted.sort_unstable();
    wanted.dedup();
    // An address no arange holds is in no unit only if every unit has
    // aranges (one without is placed by its own ranges): then the whole
    // stream is walked to see that.
    let mut units = units;
    let every_unit = units.iter().any(Option::is_none);
    let (kept, others) =
        inflate_units(file, elf, info, &wanted, every_unit.then_some(&aranged[..]))?;
    let sections = Sections::read(file, elf)?;
    let mut kept = pieces(file, elf, kept)?;
    // The units without aranges place addresses by their own ranges (or,
    // without any, their line tables' sequences), as the general reader's.
    for piece in pieces(file, elf, others)? {
        let dwarf = sections.dwarf(&piece);
        let header = dwarf.units().next().ok()??;
        let unit = dwarf.unit(header).ok()?;
        let ranges = unit_ranges(unit.unit_ref(&dwarf))?;
        let mut holds = false;
        for (i, &a) in addrs.iter().enumerate() {
            if units[i].is_none() && ranges.iter().any(|&(b, e)| b <= a && a < e) {
                units[i] = Some(piece.offset);
                holds = true;
            }
        }
        drop(dwarf);
        if holds {
            kept.push(piece);
        }
    }
    let mut found = vec![Found::default(); addrs.len()];
    for piece in &kept {
        let offset = piece.offset;
        let dwarf = sections.dwarf(piece);
        let mut headers = dwarf.units();
        let header = headers.next().ok()??;
        if !matches!(header.type_(), gimli::UnitType::Compilation) {
            return None;
        }
        let unit = dwarf.unit(header).ok()?;
        if unit.dwo_id.is_some() {
            return None;
        }
        let unit = unit.unit_ref(&dwarf);
        let lines = Lines::read(unit)?;
        let functions = functions(unit)?;
        for (i, &addr) in addrs.iter().enumerate() {
            if units[i] == Some(offset) {
                found[i] = find_in_unit(unit, &lines, &functions, addr, inline)?;
            }
        }
    }
    Some(found)
}

/// The unit (its offset in `.debug_info`) that `.debug_aranges` places each
/// address in (None where it places it in none), and the units it gives
/// ranges for, sorted.
fn units_of(aranges: &[u8], addrs: &[u64]) -> Answer<(Vec<Option<u64>>, Vec<u64>)> {
    let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
    let mut aranged = Vec::new();
    let mut headers = gimli::DebugAranges::new(aranges, LittleEndian).headers();
    while let Some(h) = headers.next().ok()? {
        let unit = h.debug_info_offset().0 as u64;
        let mut entries = h.entries();
        while let Some(e) = entries.next().ok()? {
            let r = e.range();
            if r.begin < r.end {
                ranges.push((r.begin, r.end, unit));
                aranged.push(unit);
            }
        }
    }
    ranges.sort_unstable();
    aranged.sort_unstable();
    aranged.dedup();
    let units = addrs
        .iter()
        .map(|&a| {
            let at = ranges.partition_point(|r| r.0 <= a);
            // Ranges of different units do not overlap in a sound file;
            // where they do, the general reader decides.
            let mut covering = ranges[..at].iter().rev().filter(|r| a < r.1);
            let Some(first) = covering.next() else {
                return Some(None);
            };
            covering.all(|r| r.2 == first.2).then_some(Some(first.2))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((units, aranged))
}

/// A section's bytes, inflated if compressed; None where the file has
/// none, or where it cannot be read.
fn whole(file: &File, elf: &Elf, name: &str) -> Answer<Vec<u8>> {
    let s = elf.section(name)?;
    if s.flags & SHF_COMPRESSED == 0 {
        return elf.read_section(file, s).ok();
    }
    let mut stream = Stream::open(file, elf, s)?;
    let mut out = Vec::with_capacity(stream.size.min(64 << 20) as usize);
    while let Some(bytes) = stream.next()? {
        out.extend_from_slice(bytes);
    }
    Some(out)
}

/// A compressed section, read from the file and inflated a chunk at a
/// time.
struct Stream<'f> {
    file: &'f File,
    z: flate2::Decompress,
    /// The inflated size its header gives (more is refused).
    size: u64,
    /// Where the compressed bytes not yet read are in the file, and end.
    at: u64,
    end: u64,
    input: Vec<u8>,
    filled: usize,
    used: usize,
    chunk: Vec<u8>,
    ended: bool,
}

impl<'f> Stream<'f> {
    fn open(file: &'f File, elf: &Elf, s: Section) -> Answer<Stream<'f>> {
        let (start, len) = elf.section_extent(s)?;
        let mut head = [0u8; CHDR_BYTES as usize];
        file.read_exact_at(&mut head, start).ok()?;
        Some(Stream {
            file,
            z: flate2::Decompress::new(true),
            size: chdr(&head)?,
            at: start.checked_add(CHDR_BYTES)?,
            end: start + len,
            input: vec![0u8; CHUNK],
            filled: 0,
            used: 0,
            chunk: vec![0u8; CHUNK],
            ended: false,
        })
    }

    /// The next inflated bytes (Some(None) once the stream has ended
    /// where its header says it does); None where it cannot be read.
    fn next(&mut self) -> Answer<Option<&[u8]>> {
        loop {
            if self.ended {
                return (self.z.total_out() == self.size).then_some(None);
            }
            if self.used == self.filled && self.at < self.end {
                let n = (self.end - self.at).min(CHUNK as u64) as usize;
                self.file
                    .read_exact_at(&mut self.input[..n], self.at)
                    .ok()?;
                self.at += n as u64;
                (self.filled, self.used) = (n, 0);
            }
            let (before_in, before_out) = (self.z.total_in(), self.z.total_out());
            let status = self
                .z
                .decompress(
                    &self.input[self.used..self.filled],
                    &mut self.chunk,
                    flate2::FlushDecompress::None,
                )
                .ok()?;
            let took = (self.z.total_in() - before_in) as usize;
            let made = (self.z.total_out() - before_out) as usize;
            self.used += took;
            if self.z.total_out() > self.size {
                return None;
            }
            match status {
                flate2::Status::StreamEnd => self.ended = true,
                _ if took == 0 && made == 0 && self.at >= self.end => return None,
                _ => {}
            }
            if made > 0 {
                return Some(Some(&self.chunk[..made]));
            }
        }
    }
}

/// The inflated size an `Elf64_Chdr` gives, where it is zlib's and sane.
fn chdr(raw: &[u8]) -> Answer<u64> {
    let h = raw.get(..CHDR_BYTES as usize)?;
    let kind = u32::from_le_bytes(h[0..4].try_into().ok()?);
    let size = u64::from_le_bytes(h[8..16].try_into().ok()?);
    (kind == ELFCOMPRESS_ZLIB && size <= MAX_INFLATED).then_some(size)
}

/// Units by offset, each whole.
type Units = Vec<(u64, Vec<u8>)>;

/// The units of the compressed `.debug_info` that start at `wanted`
/// (sorted), each whole, by offset: the section inflated as a stream,
/// read from the file a chunk at a time, the other units' bytes dropped as
/// they pass, and left once the last wanted unit is read. None where one
/// is not found at a unit's start. With `aranged` (sorted), the stream is
/// read to its end, and the units not among those are kept too, apart.
fn inflate_units(
    file: &File,
    elf: &Elf,
    info: Section,
    wanted: &[u64],
    aranged: Option<&[u64]>,
) -> Answer<(Units, Units)> {
    let mut stream = Stream::open(file, elf, info)?;
    let mut split = Splitter::new(wanted, stream.size, aranged);
    while let Some(bytes) = stream.next()? {
        if split.feed(bytes)? {
            return Some((split.kept, split.others));
        }
    }
    split.ended()
}

/// Splits the inflated `.debug_info` into its units as it comes, keeping
/// the wanted ones.
struct Splitter<'a> {
    wanted: &'a [u64],
    /// Where the units not among these are kept too: to the stream's end.
    aranged: Option<&'a [u64]>,
    /// The inflated size the section's header gives: no unit ends past it.
    size: u64,
    /// Offset of the next byte fed.
    pos: u64,
    /// The current unit's start, and its end once its length is read.
    unit: u64,
    end: Option<u64>,
    /// The current unit's length field, as it comes.
    length: Vec<u8>,
    /// The current unit's bytes so far, where it is kept, and whether
    /// among the others.
    keeping: Option<(Vec<u8>, bool)>,
    kept: Units,
    others: Units,
}

impl<'a> Splitter<'a> {
    fn new(wanted: &'a [u64], size: u64, aranged: Option<&'a [u64]>) -> Self {
        Splitter {
            wanted,
            aranged,
            size,
            pos: 0,
            unit: 0,
            end: None,
            length: Vec::with_capacity(12),
            keeping: None,
            kept: Vec::new(),
            others: Vec::new(),
        }
    }

    /// Takes the next inflated bytes: Some(true) once every wanted unit is
    /// kept, None where the units' lengths do not add up.
    fn feed(&mut self, mut data: &[u8]) -> Answer<bool> {
        while !data.is_empty() {
            let Some(end) = self.end else {
                self.length.push(data[0]);
                data = &data[1..];
                self.pos += 1;
                self.end = self.unit_end()?;
                if let Some(end) = self.end {
                    let other = self
                        .aranged
                        .is_some_and(|u| u.binary_search(&self.unit).is_err());
                    if other || self.wanted.binary_search(&self.unit).is_ok() {
                        let mut bytes =
                            Vec::with_capacity((end - self.unit).min(16 << 20) as usize);
                        bytes.extend_from_slice(&self.length);
                        self.keeping = Some((bytes, other));
                    }
                }
                continue;
            };
            let n = ((end - self.pos) as usize).min(data.len());
            if let Some((bytes, _)) = self.keeping.as_mut() {
                bytes.extend_from_slice(&data[..n]);
            }
            data = &data[n..];
            self.pos += n as u64;
            if self.pos == end {
                match self.keeping.take() {
                    Some((bytes, true)) => self.others.push((self.unit, bytes)),
                    Some((bytes, false)) => {
                        self.kept.push((self.unit, bytes));
                        if self.kept.len() == self.wanted.len() && self.aranged.is_none() {
                            return Some(true);
                        }
                    }
                    None => {}
                }
                self.unit = end;
                self.end = None;
                self.length.clear();
            }
        }
        Some(false)
    }

    /// At the stream's end: the units kept, if they are all that were
    /// wanted and the stream ends where a unit does.
    fn ended(self) -> Answer<(Units, Units)> {
        let whole = self.end.is_none() && self.length.is_empty() && self.pos == self.size;
        (whole && self.kept.len() == self.wanted.len()).then_some((self.kept, self.others))
    }

    /// The current unit's end, once its length field is whole (4 bytes,
    /// or 12 for 64-bit DWARF); Some(None) while it is not.
    fn unit_end(&self) -> Answer<Option<u64>> {
        let l = &self.length;
        let body = match l.len() {
            4 => match u32::from_le_bytes(l[..4].try_into().ok()?) {
                0xffff_ffff => return Some(None),
                n if n >= 0xffff_fff0 => return None,
                n => 4 + n as u64,
            },
            12 => 12u64.checked_add(u64::from_le_bytes(l[4..12].try_into().ok()?))?,
            _ => return Some(None),
        };
        let end = self.unit.checked_add(body)?;
        (end <= self.size).then_some(Some(end))
    }
}

/// The small sections a unit refers to, inflated whole (together under
/// half a MB in libc6-dbg; `.debug_abbrev` and `.debug_line` are ten
/// times that, and are read a unit's part at a time, see [`pieces`]).
struct Sections {
    line_str: Vec<u8>,
    str: Vec<u8>,
    str_offsets: Vec<u8>,
    addr: Vec<u8>,
    ranges: Vec<u8>,
    rnglists: Vec<u8>,
}

impl Sections {
    fn read(file: &File, elf: &Elf) -> Answer<Sections> {
        // A section the file lacks is empty; one it has that cannot be
        // read is a reason not to answer.
        let read = |name: &str| match elf.section(name) {
            None => Some(Vec::new()),
            Some(_) => whole(file, elf, name),
        };
        Some(Sections {
            line_str: read(".debug_line_str")?,
            str: read(".debug_str")?,
            str_offsets: read(".debug_str_offsets")?,
            addr: read(".debug_addr")?,
            ranges: read(".debug_ranges")?,
            rnglists: read(".debug_rnglists")?,
        })
    }

    /// These sections, with `piece` as the whole of `.debug_info`,
    /// `.debug_abbrev` and `.debug_line` (its offsets within the unit are
    /// its own, as they are in the file; those of its abbreviations and line
    /// table are 0 in its copy).
    fn dwarf<'a>(&'a self, piece: &'a Piece) -> gimli::Dwarf<EndianSlice<'a, LittleEndian>> {
        let none: Result<_, ()> = gimli::Dwarf::load(|id| {
            let bytes: &[u8] = match id {
                SectionId::DebugInfo => &piece.info,
                SectionId::DebugAbbrev => &piece.abbrev,
                SectionId::DebugLine => &piece.line,
                SectionId::DebugLineStr => &self.line_str,
                SectionId::DebugStr => &self.str,
                SectionId::DebugStrOffsets => &self.str_offsets,
                SectionId::DebugAddr => &self.addr,
                SectionId::DebugRanges => &self.ranges,
                SectionId::DebugRngLists => &self.rnglists,
                _ => &[],
            };
            Ok(EndianSlice::new(bytes, LittleEndian))
        });
        match none {
            Ok(d) => d,
            Err(()) => unreachable!("the loader does not fail"),
        }
    }
}

/// A unit, with its abbreviations and its line table: the three as
/// sections of their own, the unit's references to the other two
/// rewritten to 0.
struct Piece {
    offset: u64,
    info: Vec<u8>,
    abbrev: Vec<u8>,
    line: Vec<u8>,
}

/// Each unit with its abbreviations and line table, read from the
/// sections as streams (see [`spans`]).
fn pieces(file: &File, elf: &Elf, units: Units) -> Answer<Vec<Piece>> {
    if units.is_empty() {
        return Some(Vec::new());
    }
    // Where each unit's abbreviations are; 0 in its copy.
    let mut at = Vec::with_capacity(units.len());
    let mut units = units;
    for (_, info) in units.iter_mut() {
        let field = abbrev_field(info)?;
        let offset = u32::from_le_bytes(info.get(field..field + 4)?.try_into().ok()?);
        info[field..field + 4].fill(0);
        at.push(offset as u64);
    }
    let abbrevs = spans(file, elf, ".debug_abbrev", &at, abbrev_table_len)?;
    // Where each unit's line table is (None where it has none); 0 in its
    // copy.
    let mut pieces = Vec::with_capacity(units.len());
    let mut lines = Vec::new();
    for ((offset, mut info), a) in units.into_iter().zip(at) {
        let abbrev = abbrevs.iter().find(|s| s.0 == a)?.1.clone();
        let stmt = stmt_list(&info, &abbrev)?;
        if let Some((field, line)) = stmt {
            info[field..field + 4].fill(0);
            lines.push(line);
        }
        pieces.push((
            Piece {
                offset,
                info,
                abbrev,
                line: Vec::new(),
            },
            stmt.map(|s| s.1),
        ));
    }
    let tables = spans(file, elf, ".debug_line", &lines, length_prefixed)?;
    pieces
        .into_iter()
        .map(|(mut piece, line)| {
            if let Some(line) = line {
                piece.line = tables.iter().find(|s| s.0 == line)?.1.clone();
            }
            Some(piece)
        })
        .collect()
}

/// Where a unit's header holds its abbreviations' offset: a 32-bit unit
/// of DWARF 2 to 4, or a compilation unit of DWARF 5.
fn abbrev_field(info: &[u8]) -> Answer<usize> {
    if info.get(..4)? == [0xff; 4] {
        return None;
    }
    match u16::from_le_bytes(info.get(4..6)?.try_into().ok()?) {
        2..=4 => Some(6),
        // DW_UT_compile
        5 if *info.get(6)? == 1 => Some(8),
        _ => None,
    }
}

/// Where the unit's first entry holds its `DW_AT_stmt_list` (4 bytes),
/// and the line table's offset it gives; None inside where it has none.
fn stmt_list(info: &[u8], abbrev: &[u8]) -> Answer<Option<(usize, u64)>> {
    let header = gimli::DebugInfo::new(info, LittleEndian)
        .units()
        .next()
        .ok()??;
    let abbrevs = header
        .abbreviations(&gimli::DebugAbbrev::new(abbrev, LittleEndian))
        .ok()?;
    let mut entries = header.entries_raw(&abbrevs, None).ok()?;
    let first = entries.read_abbreviation().ok()??;
    let mut found = None;
    for spec in first.attributes() {
        let field = entries.next_offset().0;
        let attr = entries.read_attribute(*spec).ok()?;
        if attr.name() != gimli::DW_AT_stmt_list {
            continue;
        }
        // One, of 4 bytes (gimli would take the last of several).
        let four = matches!(
            spec.form(),
            gimli::DW_FORM_sec_offset | gimli::DW_FORM_data4
        );
        if found.is_some() || !four {
            return None;
        }
        found = Some(match attr.value() {
            gimli::AttributeValue::DebugLineRef(o) => (field, o.0 as u64),
            gimli::AttributeValue::Data4(o) => (field, o as u64),
            gimli::AttributeValue::SecOffset(o) => (field, o as u64),
            _ => return None,
        });
    }
    Some(found)
}

/// The bytes from each of `starts` of section `name` to the end of what
/// begins there, as `len` tells (None: malformed; Some(None): more bytes
/// needed): the section inflated as a stream (where compressed) and left
/// once the last is whole.
fn spans(
    file: &File,
    elf: &Elf,
    name: &str,
    starts: &[u64],
    len: fn(&[u8]) -> Answer<Option<usize>>,
) -> Answer<Units> {
    let mut starts = starts.to_vec();
    starts.sort_unstable();
    starts.dedup();
    if starts.is_empty() {
        return Some(Vec::new());
    }
    let s = elf.section(name)?;
    let mut done = Vec::with_capacity(starts.len());
    if s.flags & SHF_COMPRESSED == 0 {
        let all = elf.read_section(file, s).ok()?;
        for &st in &starts {
            let rest = all.get(st as usize..)?;
            let n = len(rest)??;
            done.push((st, rest.get(..n)?.to_vec()));
        }
        return Some(done);
    }
    let mut stream = Stream::open(file, elf, s)?;
    let inflated = stream.size;
    let (mut pos, mut next) = (0u64, 0usize);
    let mut open: Vec<(u64, Vec<u8>)> = Vec::new();
    while let Some(bytes) = stream.next()? {
        for (_, b) in open.iter_mut() {
            b.extend_from_slice(bytes);
        }
        let made = bytes.len() as u64;
        while next < starts.len() && starts[next] < pos + made {
            open.push((
                starts[next],
                bytes[(starts[next] - pos) as usize..].to_vec(),
            ));
            next += 1;
        }
        pos += made;
        let mut i = 0;
        while i < open.len() {
            let have = open[i].1.len();
            match len(&open[i].1)? {
                // Past the section's end, or too long to be one.
                Some(n) if open[i].0.checked_add(n as u64)? > inflated || n as u64 > MAX_SPAN => {
                    return None;
                }
                Some(n) if n <= have => {
                    let (st, mut b) = open.swap_remove(i);
                    b.truncate(n);
                    done.push((st, b));
                }
                None if have as u64 > MAX_SPAN => return None,
                _ => i += 1,
            }
        }
        if next == starts.len() && open.is_empty() {
            return Some(done);
        }
    }
    None
}

/// The length of a unit-like record (a line table): its 32-bit length
/// field and what it counts.
fn length_prefixed(b: &[u8]) -> Answer<Option<usize>> {
    let Some(l) = b.get(..4) else {
        return Some(None);
    };
    match u32::from_le_bytes(l.try_into().ok()?) {
        n if n >= 0xffff_fff0 => None,
        n => Some(Some(4 + n as usize)),
    }
}

/// The length of the abbreviation table `b` begins with: declarations
/// (code, tag, children, then name and form pairs up to 0, 0, with a value
/// after each `DW_FORM_implicit_const`) up to a 0 code.
fn abbrev_table_len(b: &[u8]) -> Answer<Option<usize>> {
    let mut at = 0;
    // A LEB128 number and its length at `at`; None where b ends within
    // it, and at the next step, where it is longer than a number's ten
    // bytes (malformed).
    let bad = |at: usize| {
        b.get(at..)
            .is_some_and(|r| r.len() >= 10 && r[..10].iter().all(|&x| x & 0x80 != 0))
    };
    let leb = |at: usize| -> Option<(u64, usize)> {
        let mut v = 0u64;
        for (i, &byte) in b.get(at..)?.iter().enumerate().take(10) {
            v |= ((byte & 0x7f) as u64) << (7 * i);
            if byte & 0x80 == 0 {
                return Some((v, i + 1));
            }
        }
        None
    };
    loop {
        let Some((code, n)) = leb(at) else {
            return (!bad(at)).then_some(None);
        };
        at += n;
        if code == 0 {
            return Some(Some(at));
        }
        let Some((_, n)) = leb(at) else {
            return (!bad(at)).then_some(None);
        };
        // The tag, and the children byte.
        at += n + 1;
        loop {
            let Some((name, n)) = leb(at) else {
                return (!bad(at)).then_some(None);
            };
            at += n;
            let Some((form, n)) = leb(at) else {
                return (!bad(at)).then_some(None);
            };
            at += n;
            if name == 0 && form == 0 {
                break;
            }
            if form == gimli::DW_FORM_implicit_const.0 as u64 {
                let Some((_, n)) = leb(at) else {
                    return (!bad(at)).then_some(None);
                };
                at += n;
            }
        }
    }
}

type R<'a> = EndianSlice<'a, LittleEndian>;
type UnitRef<'u, 'a> = gimli::UnitRef<'u, R<'a>>;

/// A unit's line table: its sequences (start, end, rows of address, file
/// index and line, one row per address: the last for it), sorted, and the
/// program's header for file names.
/// A line-table row: address, file index, line.
type Row = (u64, u64, u32);

struct Lines<'a> {
    sequences: Vec<(u64, u64, Vec<Row>)>,
    header: Option<gimli::LineProgramHeader<R<'a>>>,
}

impl<'a> Lines<'a> {
    fn read(unit: UnitRef<'_, 'a>) -> Answer<Lines<'a>> {
        let Some(program) = unit.line_program.clone() else {
            return Some(Lines {
                sequences: Vec::new(),
                header: None,
            });
        };
        let mut sequences = Vec::new();
        let mut rows: Vec<Row> = Vec::new();
        let mut program_rows = program.rows();
        while let Some((_, row)) = program_rows.next_row().ok()? {
            if row.end_sequence() {
                if let Some(&(start, _, _)) = rows.first() {
                    sequences.push((start, row.address(), std::mem::take(&mut rows)));
                }
                continue;
            }
            let line = row.line().map_or(0, |l| l.get() as u32);
            match rows.last_mut() {
                Some(last) if last.0 == row.address() => {
                    *last = (row.address(), row.file_index(), line)
                }
                _ => rows.push((row.address(), row.file_index(), line)),
            }
        }
        sequences.sort_unstable_by_key(|s| s.0);
        Some(Lines {
            sequences,
            header: Some(program_rows.header().clone()),
        })
    }

    /// The row covering `addr`: its file index and line.
    fn row(&self, addr: u64) -> Option<(u64, u32)> {
        let s = self
            .sequences
            .binary_search_by(|s| {
                if addr < s.0 {
                    std::cmp::Ordering::Greater
                } else if addr >= s.1 {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .ok()?;
        let rows = &self.sequences[s].2;
        let i = match rows.binary_search_by_key(&addr, |r| r.0) {
            Ok(i) => i,
            Err(0) => return None,
            Err(i) => i - 1,
        };
        Some((rows[i].1, rows[i].2))
    }

    /// The name of file `index` of the table (empty for index 0 where the
    /// table has no such entry, as in DWARF 4); None where there is none.
    fn file(&self, unit: UnitRef<'_, 'a>, index: u64) -> Answer<Option<String>> {
        let Some(header) = &self.header else {
            return Some(None);
        };
        // The entries are numbered without a gap: one past a missing one
        // is not a file either.
        if (1..index).any(|i| header.file(i).is_none()) {
            return Some(None);
        }
        match header.file(index) {
            Some(f) => {
                let name = unit.attr_string(f.path_name()).ok()?;
                Some(Some(name.to_string_lossy().into_owned()))
            }
            None if index == 0 => Some(Some(String::new())),
            None => Some(None),
        }
    }

    fn loc(&self, unit: UnitRef<'_, 'a>, file: u64, line: u32) -> Answer<Option<Loc>> {
        Some(self.file(unit, file)?.map(|file| Loc {
            file,
            line: (line != 0).then_some(line),
        }))
    }
}

/// The ranges of an entry (low and high pc, or a range list), each begun
/// before it ends.
#[derive(Default)]
struct Ranges {
    low: Option<u64>,
    high: Option<u64>,
    size: Option<u64>,
    list: Option<gimli::RangeListsOffset>,
}

impl Ranges {
    /// Notes `attr` if it is one of the range attributes; whether it was.
    fn note<'a>(&mut self, unit: UnitRef<'_, 'a>, attr: &gimli::Attribute<R<'a>>) -> Answer<bool> {
        use gimli::AttributeValue as V;
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, V::Addr(a)) => self.low = Some(a),
            (gimli::DW_AT_low_pc, V::DebugAddrIndex(i)) => self.low = Some(unit.address(i).ok()?),
            (gimli::DW_AT_high_pc, V::Addr(a)) => self.high = Some(a),
            (gimli::DW_AT_high_pc, V::DebugAddrIndex(i)) => self.high = Some(unit.address(i).ok()?),
            (gimli::DW_AT_high_pc, V::Udata(n)) => self.size = Some(n),
            (gimli::DW_AT_ranges, v) => self.list = unit.attr_ranges_offset(v).ok()?,
            (gimli::DW_AT_low_pc | gimli::DW_AT_high_pc, _) => {}
            _ => return Some(false),
        }
        Some(true)
    }

    fn each(&self, unit: UnitRef<'_, '_>, mut f: impl FnMut(u64, u64)) -> Answer<()> {
        if let Some(list) = self.list {
            let mut ranges = unit.ranges(list).ok()?;
            while let Some(r) = ranges.next().ok()? {
                if r.begin < r.end {
                    f(r.begin, r.end);
                }
            }
        } else if let (Some(low), Some(high)) = (self.low, self.high) {
            if low < high {
                f(low, high);
            }
        } else if let (Some(low), Some(size)) = (self.low, self.size) {
            let high = low.wrapping_add(size);
            if low < high {
                f(low, high);
            }
        }
        Some(())
    }
}

/// The ranges of a unit's code: its own entry's, else its line table's
/// sequences.
fn unit_ranges(unit: UnitRef<'_, '_>) -> Answer<Vec<(u64, u64)>> {
    let mut entries = unit.entries_raw(None).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    let mut ranges = Ranges::default();
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        ranges.note(unit, &attr)?;
    }
    let mut found = Vec::new();
    ranges.each(unit, |b, e| found.push((b, e)))?;
    if found.is_empty() {
        let lines = Lines::read(unit)?;
        found.extend(lines.sequences.iter().map(|s| (s.0, s.1)));
    }
    Some(found)
}

/// The unit's functions (`DW_TAG_subprogram` entries with code, at any
/// depth): each range as (begin, end, the entry's offset), by begin.
fn functions(unit: UnitRef<'_, '_>) -> Answer<Vec<(u64, u64, gimli::UnitOffset)>> {
    let mut found = Vec::new();
    let mut entries = unit.entries_raw(None).ok()?;
    while !entries.is_empty() {
        let offset = entries.next_offset();
        let Some(abbrev) = entries.read_abbreviation().ok()? else {
            continue;
        };
        if abbrev.tag() != gimli::DW_TAG_subprogram {
            entries.skip_attributes(abbrev.attributes()).ok()?;
            continue;
        }
        let mut ranges = Ranges::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec).ok()?;
            ranges.note(unit, &attr)?;
            refuse_other_units(&attr)?;
        }
        ranges.each(unit, |b, e| found.push((b, e, offset)))?;
    }
    found.sort_unstable_by_key(|f| f.0);
    Some(found)
}

/// None for a reference into another unit (or another file): this
/// reader holds one unit at a time.
fn refuse_other_units(attr: &gimli::Attribute<R<'_>>) -> Answer<()> {
    match attr.value() {
        gimli::AttributeValue::DebugInfoRef(_)
        | gimli::AttributeValue::DebugInfoRefSup(_)
        | gimli::AttributeValue::DebugStrRefSup(_)
        | gimli::AttributeValue::DebugTypesRef(_) => None,
        _ => Some(()),
    }
}

/// The name of the entry at `offset`: its linkage name, else its name,
/// else that of the entry it is an instance or the definition of, at most
/// `depth` references away.
fn name_at(unit: UnitRef<'_, '_>, offset: gimli::UnitOffset, depth: u32) -> Answer<Option<String>> {
    if depth == 0 {
        return Some(None);
    }
    let mut entries = unit.entries_raw(Some(offset)).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    let (mut name, mut next) = (None, None);
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        refuse_other_units(&attr)?;
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                if let Ok(s) = unit.attr_string(attr.value()) {
                    return Some(Some(s.to_string_lossy().into_owned()));
                }
            }
            gimli::DW_AT_name => {
                if let Ok(s) = unit.attr_string(attr.value()) {
                    name = Some(s.to_string_lossy().into_owned());
                }
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => next = Some(attr.value()),
            _ => {}
        }
    }
    if name.is_some() {
        return Some(name);
    }
    match next {
        Some(gimli::AttributeValue::UnitRef(o)) => name_at(unit, o, depth - 1),
        _ => Some(None),
    }
}

/// An inlined call: the name of what was inlined, its call site (file
/// index and line), how deep it is, and its ranges.
struct Inlined {
    name: Option<String>,
    call_file: Option<u64>,
    call_line: u32,
    depth: usize,
    ranges: Vec<(u64, u64)>,
}

/// The calls inlined in the function at `offset`, at every depth (through
/// lexical blocks; not into functions defined within it).
fn inlined_in(unit: UnitRef<'_, '_>, offset: gimli::UnitOffset) -> Answer<Vec<Inlined>> {
    let mut entries = unit.entries_raw(Some(offset)).ok()?;
    let top = entries.next_depth();
    let abbrev = entries.read_abbreviation().ok()??;
    entries.skip_attributes(abbrev.attributes()).ok()?;
    let mut found = Vec::new();
    // The depth in the tree of each open inlined call, innermost last.
    let mut open: Vec<isize> = Vec::new();
    // Below this depth, a nested function's entries, skipped.
    let mut skipping: Option<isize> = None;
    while entries.next_depth() > top {
        let depth = entries.next_depth();
        let Some(abbrev) = entries.read_abbreviation().ok()? else {
            continue;
        };
        if skipping.is_some_and(|d| depth > d) {
            entries.skip_attributes(abbrev.attributes()).ok()?;
            continue;
        }
        skipping = None;
        while open.last().is_some_and(|&d| d >= depth) {
            open.pop();
        }
        match abbrev.tag() {
            gimli::DW_TAG_subprogram => {
                entries.skip_attributes(abbrev.attributes()).ok()?;
                skipping = Some(depth);
            }
            gimli::DW_TAG_inlined_subroutine => {
                let mut ranges = Ranges::default();
                let mut name = None;
                let (mut call_file, mut call_line) = (None, 0);
                for spec in abbrev.attributes() {
                    let attr = entries.read_attribute(*spec).ok()?;
                    refuse_other_units(&attr)?;
                    if ranges.note(unit, &attr)? {
                        continue;
                    }
                    match attr.name() {
                        gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                            if let Ok(s) = unit.attr_string(attr.value()) {
                                name = Some(s.to_string_lossy().into_owned());
                            }
                        }
                        gimli::DW_AT_name if name.is_none() => {
                            name = unit
                                .attr_string(attr.value())
                                .ok()
                                .map(|s| s.to_string_lossy().into_owned());
                        }
                        gimli::DW_AT_abstract_origin | gimli::DW_AT_specification
                            if name.is_none() =>
                        {
                            if let gimli::AttributeValue::UnitRef(o) = attr.value() {
                                name = name_at(unit, o, 16)?;
                            }
                        }
                        gimli::DW_AT_call_file => {
                            if let gimli::AttributeValue::FileIndex(f) = attr.value() {
                                if f > 0 || unit.header.version() >= 5 {
                                    call_file = Some(f);
                                }
                            }
                        }
                        gimli::DW_AT_call_line => {
                            call_line = attr.udata_value().unwrap_or(0) as u32
                        }
                        _ => {}
                    }
                }
                let mut rs = Vec::new();
                ranges.each(unit, |b, e| rs.push((b, e)))?;
                found.push(Inlined {
                    name,
                    call_file,
                    call_line,
                    depth: open.len(),
                    ranges: rs,
                });
                open.push(depth);
            }
            _ => entries.skip_attributes(abbrev.attributes()).ok()?,
        }
    }
    Some(found)
}

/// What the unit says of `addr`.
fn find_in_unit<'a>(
    unit: UnitRef<'_, 'a>,
    lines: &Lines<'a>,
    functions: &[(u64, u64, gimli::UnitOffset)],
    addr: u64,
    inline: bool,
) -> Answer<Found> {
    let Some((file, line)) = lines.row(addr) else {
        return Some(Found::default());
    };
    let mut location = lines.loc(unit, file, line)?;
    if !inline {
        // The row's own location, as blazesym gives it without inlined
        // functions.
        return Some(Found {
            location,
            inlined: Vec::new(),
        });
    }
    let Some(function) = covering(functions, addr) else {
        return Some(Found {
            location,
            inlined: Vec::new(),
        });
    };
    let calls = inlined_in(unit, function)?;
    // The chain of calls covering addr, outermost first: at each depth, the
    // one whose range holds it.
    let mut chain: Vec<&Inlined> = Vec::new();
    while let Some(c) = calls
        .iter()
        .find(|c| c.depth == chain.len() && c.ranges.iter().any(|&(b, e)| b <= addr && addr < e))
    {
        chain.push(c);
    }
    let mut inlined: Vec<(String, Option<Loc>)> = Vec::with_capacity(chain.len());
    for c in chain {
        let mut at = match c.call_file {
            Some(f) => lines.loc(unit, f, c.call_line)?.map(|mut l| {
                // A call site's line is kept as given, 0 included.
                l.line = Some(c.call_line);
                l
            }),
            None => None,
        };
        // Each location moves up a level: the function outside gets the
        // call site of the outermost inlined call, each call that of the
        // one inside it, and the innermost the address's own row.
        match inlined.last_mut() {
            Some(last) => std::mem::swap(&mut at, &mut last.1),
            None => {
                if let (Some(a), Some(l)) = (at.as_mut(), location.as_mut()) {
                    std::mem::swap(a, l);
                }
            }
        }
        inlined.push((c.name.clone().unwrap_or_default(), at));
    }
    Some(Found { location, inlined })
}

/// The entry of the function whose range holds `addr`.
fn covering(functions: &[(u64, u64, gimli::UnitOffset)], addr: u64) -> Option<gimli::UnitOffset> {
    functions
        .binary_search_by(|&(b, e, _)| {
            if addr < b {
                std::cmp::Ordering::Greater
            } else if addr >= e {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .ok()
        .map(|i| functions[i].2)
}
