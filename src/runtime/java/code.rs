//! HotSpot's compiled code and methods, read from a JVM process through its
//! structure tables ([`super::vmstructs`]): the code cache's heaps, the
//! code blob that holds an address (through each heap's segment map), a
//! compiled method's `Method*` and compile id, and a method's names (its
//! class, name and signature, as the JVM prints them).
//!
//! Every offset comes from the tables ([`Layout`], resolved once per JVM,
//! with the names the fields had in each release); every read is of
//! another process's memory, bounded, and may fail.

use super::vmstructs::VmStructs;
use crate::runtime::Memory;

/// Where the fields read are, in one JVM.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `CodeCache::_heaps`: the address of the `GrowableArray<CodeHeap*>*`.
    pub(super) heaps: u64,
    pub(super) array_len: u64,
    pub(super) array_data: u64,
    pub(super) heap_memory: u64,
    pub(super) heap_segmap: u64,
    pub(super) heap_log2_segment: u64,
    pub(super) space_low: u64,
    pub(super) space_high: u64,
    pub(super) heap_block_size: u64,
    pub(super) block_used: u64,
    pub(super) blob_name: u64,
    /// `_code_begin` (a pointer, up to JDK 22) or `_code_offset` (an int
    /// from the blob, 23 on).
    pub(super) code_begin: CodeBegin,
    pub(super) nmethod_method: u64,
    pub(super) nmethod_compile_id: u64,
    pub(super) method_const: u64,
    pub(super) const_constants: u64,
    pub(super) const_name_index: u64,
    pub(super) const_signature_index: u64,
    pub(super) pool_holder: u64,
    pub(super) pool_size: u64,
    pub(super) klass_name: u64,
    pub(super) symbol_length: u64,
    pub(super) symbol_body: u64,
    /// JDK 11's anonymous classes (lambdas' among them): the offset of
    /// `InstanceKlass::_misc_flags` and the flag.
    pub(super) anonymous: Option<(u64, u16)>,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum CodeBegin {
    Pointer(u64),
    Offset(u64),
}

/// The first of `names` (type, field) the tables have: a member's offset.
pub(super) fn member(s: &VmStructs, names: &[(&str, &str)]) -> Result<u64, String> {
    names
        .iter()
        .find_map(|(t, f)| s.offset(t, f))
        .ok_or_else(|| format!("no {}::{} in its tables", names[0].0, names[0].1))
}

fn size(s: &VmStructs, ty: &str) -> Result<u64, String> {
    s.size(ty)
        .ok_or_else(|| format!("no size of {ty} in its tables"))
}

impl Layout {
    /// The layout of the JVM whose tables are `s`, or what it lacks.
    pub fn of(s: &VmStructs) -> Result<Layout, String> {
        let code_begin = match s.offset("CodeBlob", "_code_begin") {
            Some(o) => CodeBegin::Pointer(o),
            None => CodeBegin::Offset(member(s, &[("CodeBlob", "_code_offset")])?),
        };
        // The symbol's text: `_body` where the table has it, else just
        // after the length (JDK 11 and 17 alike: 6).
        let symbol_length = member(s, &[("Symbol", "_length")])?;
        let symbol_body = s.offset("Symbol", "_body").unwrap_or(6);
        Ok(Layout {
            heaps: s
                .address("CodeCache", "_heaps")
                .ok_or("no CodeCache::_heaps in its tables")?,
            array_len: member(
                s,
                &[
                    ("GrowableArrayBase", "_len"),
                    ("GenericGrowableArray", "_len"),
                ],
            )?,
            array_data: member(s, &[("GrowableArray<int>", "_data")])?,
            heap_memory: member(s, &[("CodeHeap", "_memory")])?,
            heap_segmap: member(s, &[("CodeHeap", "_segmap")])?,
            heap_log2_segment: member(s, &[("CodeHeap", "_log2_segment_size")])?,
            space_low: member(s, &[("VirtualSpace", "_low_boundary")])?,
            space_high: member(s, &[("VirtualSpace", "_high_boundary")])?,
            heap_block_size: size(s, "HeapBlock")?,
            block_used: member(s, &[("HeapBlock::Header", "_used")])?,
            blob_name: member(s, &[("CodeBlob", "_name")])?,
            code_begin,
            nmethod_method: member(s, &[("CompiledMethod", "_method"), ("nmethod", "_method")])?,
            nmethod_compile_id: member(s, &[("nmethod", "_compile_id")])?,
            method_const: member(s, &[("Method", "_constMethod")])?,
            const_constants: member(s, &[("ConstMethod", "_constants")])?,
            const_name_index: member(s, &[("ConstMethod", "_name_index")])?,
            const_signature_index: member(s, &[("ConstMethod", "_signature_index")])?,
            pool_holder: member(s, &[("ConstantPool", "_pool_holder")])?,
            pool_size: size(s, "ConstantPool")?,
            klass_name: member(s, &[("Klass", "_name")])?,
            symbol_length,
            symbol_body,
            anonymous: s
                .offset("InstanceKlass", "_misc_flags")
                .zip(s.int("InstanceKlass::_misc_is_anonymous"))
                .map(|(o, f)| (o, f as u16)),
        })
    }
}

/// Heaps read, at most (HotSpot has one to three).
const MAX_HEAPS: u32 = 16;
/// Steps back through a segment map, at most: each step goes back up to
/// 254 segments (HotSpot's maps step back at most that far at once).
const MAX_HOPS: usize = 1 << 14;
/// A symbol's length, at most (a class or method name).
pub const MAX_SYMBOL: usize = 4096;

pub(super) fn u64_at(mem: &dyn Memory, addr: u64) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

pub(super) fn u32_at(mem: &dyn Memory, addr: u64) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    mem.read(addr, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(super) fn u16_at(mem: &dyn Memory, addr: u64) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    mem.read(addr, &mut b)?;
    Ok(u16::from_le_bytes(b))
}

/// A heap of the code cache: its code's range and its segment map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    pub low: u64,
    pub high: u64,
    pub(super) segmap: u64,
    pub(super) log2_segment: u32,
}

#[cfg(test)]
impl Heap {
    pub fn for_test(low: u64, high: u64, segmap: u64, log2_segment: u32) -> Heap {
        Heap {
            low,
            high,
            segmap,
            log2_segment,
        }
    }
}

/// The code cache's heaps (none before the JVM has made them).
pub fn heaps(mem: &dyn Memory, l: &Layout) -> std::io::Result<Vec<Heap>> {
    let array = u64_at(mem, l.heaps)?;
    if array == 0 {
        return Ok(Vec::new());
    }
    let len = u32_at(mem, array.wrapping_add(l.array_len))?.min(MAX_HEAPS);
    let data = u64_at(mem, array.wrapping_add(l.array_data))?;
    let mut heaps = Vec::new();
    for i in 0..u64::from(len) {
        let h = u64_at(mem, data.wrapping_add(8 * i))?;
        let log2_segment = u32_at(mem, h.wrapping_add(l.heap_log2_segment))?;
        if !(4..=16).contains(&log2_segment) {
            return Err(bad(format!(
                "a code heap's segments of 2^{log2_segment} bytes"
            )));
        }
        heaps.push(Heap {
            low: u64_at(mem, h.wrapping_add(l.heap_memory).wrapping_add(l.space_low))?,
            high: u64_at(
                mem,
                h.wrapping_add(l.heap_memory).wrapping_add(l.space_high),
            )?,
            segmap: u64_at(mem, h.wrapping_add(l.heap_segmap).wrapping_add(l.space_low))?,
            log2_segment,
        });
    }
    Ok(heaps)
}

pub(super) fn bad(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// The code blob that holds address `pc`, if one of `heaps` has it in a
/// block in use.
pub fn blob_at(
    mem: &dyn Memory,
    l: &Layout,
    heaps: &[Heap],
    pc: u64,
) -> std::io::Result<Option<u64>> {
    let Some(h) = heaps.iter().find(|h| pc >= h.low && pc < h.high) else {
        return Ok(None);
    };
    let mut i = (pc - h.low) >> h.log2_segment;
    for _ in 0..MAX_HOPS {
        let mut b = [0u8; 1];
        mem.read(h.segmap.wrapping_add(i), &mut b)?;
        match b[0] {
            // Free.
            0xff => return Ok(None),
            // A block's first segment.
            0 => {
                let block = h.low.wrapping_add(i << h.log2_segment);
                let mut used = [0u8; 1];
                mem.read(block.wrapping_add(l.block_used), &mut used)?;
                return Ok((used[0] != 0).then_some(block.wrapping_add(l.heap_block_size)));
            }
            hop => match i.checked_sub(u64::from(hop)) {
                Some(back) => i = back,
                None => return Err(bad("a segment map that leads out of its heap".into())),
            },
        }
    }
    Err(bad("a segment map that leads nowhere".into()))
}

/// A code blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub addr: u64,
    /// Its kind, as HotSpot names it: `nmethod`, `native nmethod`,
    /// `Interpreter`, a stub's name.
    pub name: String,
    pub code_begin: u64,
}

/// The blob at `addr`.
pub fn blob(mem: &dyn Memory, l: &Layout, addr: u64) -> std::io::Result<Blob> {
    let name_at = u64_at(mem, addr.wrapping_add(l.blob_name))?;
    let name = c_string(mem, name_at, 128)?;
    let code_begin = match l.code_begin {
        CodeBegin::Pointer(o) => u64_at(mem, addr.wrapping_add(o))?,
        CodeBegin::Offset(o) => addr.wrapping_add(u64::from(u32_at(mem, addr.wrapping_add(o))?)),
    };
    Ok(Blob {
        addr,
        name,
        code_begin,
    })
}

/// A compiled method's `Method*` and compile id.
pub fn nmethod(mem: &dyn Memory, l: &Layout, blob: u64) -> std::io::Result<(u64, u32)> {
    Ok((
        u64_at(mem, blob.wrapping_add(l.nmethod_method))?,
        u32_at(mem, blob.wrapping_add(l.nmethod_compile_id))?,
    ))
}

pub(super) fn c_string(mem: &dyn Memory, addr: u64, max: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; max];
    // A name near the end of its mapping: read less.
    let mut n = max;
    while mem.read(addr, &mut buf[..n]).is_err() {
        if n <= 8 {
            mem.read(addr, &mut buf[..1])?;
            n = 1;
            break;
        }
        n /= 2;
    }
    let end = buf[..n]
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| bad(format!("a name at {addr:#x} without its end")))?;
    String::from_utf8(buf[..end].to_vec()).map_err(|_| bad(format!("a name at {addr:#x}")))
}

/// A HotSpot `Symbol`'s text (modified UTF-8, read as UTF-8 where it is).
pub fn symbol(mem: &dyn Memory, l: &Layout, addr: u64) -> std::io::Result<String> {
    if addr == 0 {
        return Err(bad("a null symbol".into()));
    }
    let len = usize::from(u16_at(mem, addr.wrapping_add(l.symbol_length))?);
    if len > MAX_SYMBOL {
        return Err(bad(format!("a symbol of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    mem.read(addr.wrapping_add(l.symbol_body), &mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A method's names, as the JVM prints them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodName {
    /// `java.util.concurrent.LinkedBlockingQueue`, inner classes with `$`.
    pub class: String,
    pub name: String,
    /// `(J)V`.
    pub signature: String,
}

/// The names of the method at `method` (a `Method*`).
pub fn method_name(mem: &dyn Memory, l: &Layout, method: u64) -> std::io::Result<MethodName> {
    let cm = u64_at(mem, method.wrapping_add(l.method_const))?;
    let cp = u64_at(mem, cm.wrapping_add(l.const_constants))?;
    let holder = u64_at(mem, cp.wrapping_add(l.pool_holder))?;
    let mut class =
        symbol(mem, l, u64_at(mem, holder.wrapping_add(l.klass_name))?)?.replace('/', ".");
    // As the JVM names classes: a hidden class (JDK 15 on) with a slash
    // before its address, which its symbol has after a plus; an anonymous
    // one (JDK 11) with its address after a slash.
    if let Some(at) = class.rfind("+0x") {
        class.replace_range(at..at + 1, "/");
    } else if let Some((flags, anonymous)) = l.anonymous {
        if u16_at(mem, holder.wrapping_add(flags))? & anonymous != 0 {
            class.push_str(&format!("/{holder:#018x}"));
        }
    }
    let slot = |index: u16| -> std::io::Result<String> {
        // A slot of the constant pool: a Symbol* (its low bit a tag).
        let at = cp
            .wrapping_add(l.pool_size)
            .wrapping_add(8 * u64::from(index));
        symbol(mem, l, u64_at(mem, at)? & !1)
    };
    Ok(MethodName {
        class,
        name: slot(u16_at(mem, cm.wrapping_add(l.const_name_index))?)?,
        signature: slot(u16_at(mem, cm.wrapping_add(l.const_signature_index))?)?,
    })
}
