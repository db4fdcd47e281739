//! HotSpot's own description of its structures, read from a JVM process:
//! the tables libjvm exports for its serviceability agent
//! (`gHotSpotVMStructs`: each field of each type, its offset or, for a
//! static field, its address; `gHotSpotVMTypes`: each type's size;
//! `gHotSpotVMIntConstants` and `gHotSpotVMLongConstants`). The tables'
//! entry layouts are exported too (each field's offset in an entry, and
//! the entries' stride), so nothing of a release's layout is written here.
//!
//! The offsets and strides are set by libjvm's static initializers, the
//! tables are arrays of pointers to strings: everything is read from the
//! process's memory, which belongs to another process. Counts, strides and
//! string lengths are bounded, and a table that does not look like one
//! ([`Unreadable`]) is refused, never a panic.

use std::collections::HashMap;
use std::sync::Arc;

use crate::runtime::Memory;

/// The exported symbols that describe the tables, in this order (see
/// [`Symbols`]).
pub const SYMBOLS: [&str; 24] = [
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySuperclassNameOffset",
    "gHotSpotVMTypeEntryIsOopTypeOffset",
    "gHotSpotVMTypeEntryIsIntegerTypeOffset",
    "gHotSpotVMTypeEntryIsUnsignedOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryArrayStride",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
];

/// Where the symbols of [`SYMBOLS`] are in the process (the file's values
/// plus the object's load bias), in that order: each a 64-bit variable.
pub type Symbols = [u64; 24];

/// Entries read of one table, at most: HotSpot has some 3,000 fields.
pub const MAX_ENTRIES: usize = 20_000;
/// A name's length, at most (the longest are under 100 characters).
pub const MAX_NAME: usize = 256;
/// An entry's stride, at most (48 bytes for the fields' entries).
const MAX_STRIDE: u64 = 256;
/// Entries read at once.
const BATCH: usize = 64;

/// A field of a HotSpot type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's C++ type, as the table names it (`Method*`).
    pub type_string: Option<Arc<str>>,
    pub is_static: bool,
    /// A member's offset in its structure (0 for a static field).
    pub offset: u64,
    /// A static field's address in the process (0 for a member).
    pub address: u64,
}

/// A HotSpot type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Type {
    pub superclass: Option<Arc<str>>,
    pub size: u64,
    pub is_oop: bool,
    pub is_integer: bool,
    pub is_unsigned: bool,
}

/// The tables of one JVM.
#[derive(Clone, Debug, Default)]
pub struct VmStructs {
    fields: HashMap<(Arc<str>, Arc<str>), Field>,
    types: HashMap<Arc<str>, Type>,
    ints: HashMap<Arc<str>, i32>,
    longs: HashMap<Arc<str>, u64>,
}

impl VmStructs {
    /// Field `field` of type `ty` (`("Method", "_constMethod")`).
    pub fn field(&self, ty: &str, field: &str) -> Option<&Field> {
        self.fields.get(&(Arc::from(ty), Arc::from(field)))
    }

    /// The offset of member `field` of type `ty`.
    pub fn offset(&self, ty: &str, field: &str) -> Option<u64> {
        self.field(ty, field)
            .filter(|f| !f.is_static)
            .map(|f| f.offset)
    }

    /// The address of static field `field` of type `ty`.
    pub fn address(&self, ty: &str, field: &str) -> Option<u64> {
        self.field(ty, field)
            .filter(|f| f.is_static)
            .map(|f| f.address)
    }

    pub fn type_of(&self, ty: &str) -> Option<&Type> {
        self.types.get(ty)
    }

    /// The size of type `ty`.
    pub fn size(&self, ty: &str) -> Option<u64> {
        self.types.get(ty).map(|t| t.size)
    }

    pub fn int(&self, name: &str) -> Option<i32> {
        self.ints.get(name).copied()
    }

    pub fn long(&self, name: &str) -> Option<u64> {
        self.longs.get(name).copied()
    }

    /// How many fields, types and int and long constants were read.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.fields.len(),
            self.types.len(),
            self.ints.len(),
            self.longs.len(),
        )
    }
}

/// Why the tables could not be read.
#[derive(Debug)]
pub enum Unreadable {
    /// The entry layouts are not set yet: libjvm's initializers have not
    /// run (the JVM is starting), or the memory is not libjvm's.
    NotReady,
    /// An entry layout or a table that no JVM writes.
    Malformed(String),
    Memory(std::io::Error),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::NotReady => write!(f, "its structure tables are not set up yet"),
            Unreadable::Malformed(why) => write!(f, "its structure tables look wrong: {why}"),
            Unreadable::Memory(e) => write!(f, "reading the process's memory: {e}"),
        }
    }
}

impl std::error::Error for Unreadable {}

impl From<std::io::Error> for Unreadable {
    fn from(e: std::io::Error) -> Unreadable {
        Unreadable::Memory(e)
    }
}

fn read_u64(mem: &dyn Memory, addr: u64) -> Result<u64, Unreadable> {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// A field of an entry: where it is and how wide.
#[derive(Clone, Copy)]
struct At {
    offset: usize,
    width: usize,
}

impl At {
    fn get(self, entry: &[u8]) -> u64 {
        let b = &entry[self.offset..self.offset + self.width];
        let mut w = [0u8; 8];
        w[..self.width].copy_from_slice(b);
        u64::from_le_bytes(w)
    }
}

/// One table's layout: its address, its stride and its fields' places.
struct Layout {
    table: u64,
    stride: usize,
    fields: Vec<At>,
}

/// The layout of a table whose symbols start at `first` of `syms`: the
/// table's pointer, its stride, then one offset per field of `widths`.
fn layout(
    mem: &dyn Memory,
    syms: &Symbols,
    first: usize,
    widths: &[usize],
) -> Result<Layout, Unreadable> {
    let table = read_u64(mem, syms[first])?;
    let stride = read_u64(mem, syms[first + 1])?;
    let offsets = widths
        .iter()
        .enumerate()
        .map(|(i, _)| read_u64(mem, syms[first + 2 + i]))
        .collect::<Result<Vec<u64>, _>>()?;
    if stride == 0 || table == 0 {
        return Err(Unreadable::NotReady);
    }
    if stride > MAX_STRIDE {
        return Err(Unreadable::Malformed(format!(
            // wording: not a count
            "{} entries {stride} bytes apart",
            SYMBOLS[first]
        )));
    }
    let mut fields = Vec::with_capacity(widths.len());
    for (&offset, &width) in offsets.iter().zip(widths) {
        if offset.saturating_add(width as u64) > stride {
            return Err(Unreadable::Malformed(format!(
                "a field of {} at {offset}, past its {stride}-byte entry",
                SYMBOLS[first]
            )));
        }
        fields.push(At {
            offset: offset as usize,
            width,
        });
    }
    Ok(Layout {
        table,
        stride: stride as usize,
        fields,
    })
}

/// The strings the tables point to, each read once.
struct Strings<'m> {
    mem: &'m dyn Memory,
    read: HashMap<u64, Arc<str>>,
}

impl Strings<'_> {
    /// The NUL-terminated string at `addr` (None for a null pointer).
    fn at(&mut self, addr: u64) -> Result<Option<Arc<str>>, Unreadable> {
        if addr == 0 {
            return Ok(None);
        }
        if let Some(s) = self.read.get(&addr) {
            return Ok(Some(s.clone()));
        }
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64];
        loop {
            let at = addr.wrapping_add(buf.len() as u64);
            // The last bytes of a mapping: read a byte at a time.
            let n = match self.mem.read(at, &mut chunk) {
                Ok(()) => chunk.len(),
                Err(_) => {
                    self.mem.read(at, &mut chunk[..1])?;
                    1
                }
            };
            if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
                buf.extend_from_slice(&chunk[..end]);
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_NAME {
                return Err(Unreadable::Malformed(format!(
                    "a name of more than {MAX_NAME} bytes at {addr:#x}"
                )));
            }
        }
        let s: Arc<str> = match String::from_utf8(buf) {
            Ok(s) => s.into(),
            Err(_) => {
                return Err(Unreadable::Malformed(format!(
                    "a name at {addr:#x} that is not text"
                )))
            }
        };
        self.read.insert(addr, s.clone());
        Ok(Some(s))
    }
}

/// Calls `each` with every entry of table `l` up to the one whose first
/// field (its name) is null.
fn entries(
    mem: &dyn Memory,
    l: &Layout,
    mut each: impl FnMut(&[u8]) -> Result<(), Unreadable>,
) -> Result<(), Unreadable> {
    let name = l.fields[0];
    let mut buf = vec![0u8; l.stride * BATCH];
    let mut n = 0;
    while n < MAX_ENTRIES {
        let at = l.table.wrapping_add((n * l.stride) as u64);
        // A table ends somewhere in its batch: past its end the memory
        // may not be mapped, so a batch that cannot be read is read an
        // entry at a time.
        let got = match mem.read(at, &mut buf) {
            Ok(()) => BATCH,
            Err(_) => {
                mem.read(at, &mut buf[..l.stride])?;
                1
            }
        };
        for e in buf[..got * l.stride].chunks_exact(l.stride) {
            if name.get(e) == 0 {
                return Ok(());
            }
            each(e)?;
            n += 1;
        }
    }
    Err(Unreadable::Malformed(format!(
        // wording: a count never 1
        "a table of more than {MAX_ENTRIES} entries"
    )))
}

/// Reads the four tables of the JVM whose symbols are at `syms`.
pub fn read(mem: &dyn Memory, syms: &Symbols) -> Result<VmStructs, Unreadable> {
    let mut strings = Strings {
        mem,
        read: HashMap::new(),
    };
    let mut out = VmStructs::default();
    let missing = |what: &str| Unreadable::Malformed(format!("an entry without its {what}"));

    // typeName, fieldName, typeString, isStatic (int32), offset, address.
    let l = layout(mem, syms, 0, &[8, 8, 8, 4, 8, 8])?;
    entries(mem, &l, |e| {
        let f = &l.fields;
        let ty = strings.at(f[0].get(e))?.ok_or_else(|| missing("type"))?;
        // A type whose fields are not listed has an entry without one.
        let Some(field) = strings.at(f[1].get(e))? else {
            return Ok(());
        };
        let type_string = strings.at(f[2].get(e))?;
        let is_static = f[3].get(e) as u32 != 0;
        out.fields.insert(
            (ty, field),
            Field {
                type_string,
                is_static,
                offset: if is_static { 0 } else { f[4].get(e) },
                address: if is_static { f[5].get(e) } else { 0 },
            },
        );
        Ok(())
    })?;

    // typeName, superclassName, isOopType, isIntegerType, isUnsigned
    // (int32 each), size.
    let l = layout(mem, syms, 8, &[8, 8, 4, 4, 4, 8])?;
    entries(mem, &l, |e| {
        let f = &l.fields;
        let ty = strings.at(f[0].get(e))?.ok_or_else(|| missing("type"))?;
        let superclass = strings.at(f[1].get(e))?;
        out.types.insert(
            ty,
            Type {
                superclass,
                is_oop: f[2].get(e) as u32 != 0,
                is_integer: f[3].get(e) as u32 != 0,
                is_unsigned: f[4].get(e) as u32 != 0,
                size: f[5].get(e),
            },
        );
        Ok(())
    })?;

    // name, value (int32).
    let l = layout(mem, syms, 16, &[8, 4])?;
    entries(mem, &l, |e| {
        let name = strings
            .at(l.fields[0].get(e))?
            .ok_or_else(|| missing("name"))?;
        out.ints.insert(name, l.fields[1].get(e) as u32 as i32);
        Ok(())
    })?;

    // name, value (int64).
    let l = layout(mem, syms, 20, &[8, 8])?;
    entries(mem, &l, |e| {
        let name = strings
            .at(l.fields[0].get(e))?
            .ok_or_else(|| missing("name"))?;
        out.longs.insert(name, l.fields[1].get(e));
        Ok(())
    })?;
    if out.fields.is_empty() || out.types.is_empty() {
        return Err(Unreadable::Malformed("empty tables".into()));
    }
    Ok(out)
}

/// The NUL-terminated string at `addr`, at most [`MAX_NAME`] bytes.
pub fn read_string(mem: &dyn Memory, addr: u64) -> Result<Option<Arc<str>>, Unreadable> {
    Strings {
        mem,
        read: HashMap::new(),
    }
    .at(addr)
}

/// The pointer at `addr`.
pub fn read_pointer(mem: &dyn Memory, addr: u64) -> Result<u64, Unreadable> {
    read_u64(mem, addr)
}
