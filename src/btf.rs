//! BTF, the kernel's type information, read and written in its raw form:
//! enough to give libbpf's CO-RE relocations a small copy of the kernel's
//! types instead of all of them.
//!
//! libbpf relocates a BPF object's field offsets against the kernel's BTF
//! by looking, for each type the object's relocations name, through every
//! type the kernel has (some 130,000 on 6.18) for those of the same name;
//! and it does so again for each object it loads. [`minimal`] keeps of the
//! kernel's types those whose names the relocations ask for (as libbpf
//! matches them: up to a `___` suffix) and what they are made of, and
//! nothing else: the same candidates, the same members at the same
//! offsets, in a few hundred types. A pointer's target is kept as a
//! forward declaration of its name: libbpf compares a pointer field with
//! a pointer by kind only.
//!
//! [`relocated_types`] reads which types an object's relocations name
//! (`build.rs` writes them into the crate for the profiler's object). The
//! code uses nothing outside `std`, for `build.rs` to compile it too.
//!
//! Every input is someone else's file: a wrong length, count or reference
//! gives an error, never a panic or a read out of bounds.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a: names hashed by the hundred thousand, short, not chosen by an
/// adversary to collide (and a collision costs a comparison only).
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type FnvSet<T> = HashSet<T, BuildHasherDefault<Fnv>>;
type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// Why a BTF (or an ELF object holding one) could not be read.
pub type Error = String;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

pub const KIND_INT: u32 = 1;
pub const KIND_PTR: u32 = 2;
pub const KIND_ARRAY: u32 = 3;
pub const KIND_STRUCT: u32 = 4;
pub const KIND_UNION: u32 = 5;
pub const KIND_ENUM: u32 = 6;
pub const KIND_FWD: u32 = 7;
pub const KIND_TYPEDEF: u32 = 8;
pub const KIND_VOLATILE: u32 = 9;
pub const KIND_CONST: u32 = 10;
pub const KIND_RESTRICT: u32 = 11;
pub const KIND_FUNC: u32 = 12;
pub const KIND_FUNC_PROTO: u32 = 13;
pub const KIND_VAR: u32 = 14;
pub const KIND_DATASEC: u32 = 15;
pub const KIND_FLOAT: u32 = 16;
pub const KIND_DECL_TAG: u32 = 17;
pub const KIND_TYPE_TAG: u32 = 18;
pub const KIND_ENUM64: u32 = 19;

fn u16_at(b: &[u8], at: usize) -> Result<u16, Error> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, Error> {
    b.get(at..at.checked_add(4).ok_or("offset overflows")?)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("truncated at byte {at}"))
}

#[allow(dead_code)] // build.rs's
fn u64_at(b: &[u8], at: usize) -> Result<u64, Error> {
    let lo = u32_at(b, at)? as u64;
    let hi = u32_at(b, at + 4)? as u64;
    Ok(lo | hi << 32)
}

/// A type's kind, from its `info` word.
fn kind_of(info: u32) -> u32 {
    (info >> 24) & 0x1f
}

/// A type's count of members, values or parameters, from its `info` word.
fn vlen_of(info: u32) -> usize {
    (info & 0xffff) as usize
}

/// The length of a type's record: its 12 bytes and what follows for its
/// kind; an error for a kind this reader does not know.
fn record_len(kind: u32, vlen: usize) -> Result<usize, Error> {
    let extra = match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
        | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        other => return Err(format!("a type of kind {other}, unknown to this reader")),
    };
    Ok(12 + extra)
}

/// A raw BTF, its types indexed by id.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Where each type's record starts in `types`; id 0 (void) has none,
    /// so id `i` is at `at[i - 1]`.
    at: Vec<u32>,
}

impl<'a> Btf<'a> {
    /// Reads `raw` (as `/sys/kernel/btf/vmlinux` holds it, or an object's
    /// `.BTF` section), in this machine's byte order (little endian).
    pub fn parse(raw: &'a [u8]) -> Result<Btf<'a>, Error> {
        if u16_at(raw, 0)? != MAGIC {
            return Err("not BTF, or not in this machine's byte order".into());
        }
        let hdr_len = u32_at(raw, 4)? as usize;
        if hdr_len < HEADER_LEN {
            return Err(format!("a header of {hdr_len} bytes"));
        }
        let section = |off: usize, len: usize| -> Result<&'a [u8], Error> {
            let (off, len) = (u32_at(raw, off)? as usize, u32_at(raw, len)? as usize);
            let start = hdr_len.checked_add(off);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(s), Some(e)) if e <= raw.len() => Ok(&raw[s..e]),
                _ => Err("a section past the end of the data".into()),
            }
        };
        let types = section(8, 12)?;
        let strings = section(16, 20)?;
        let mut at = Vec::with_capacity(types.len() / 16);
        let mut p = 0usize;
        while p < types.len() {
            let info = u32_at(types, p + 4)?;
            let len = record_len(kind_of(info), vlen_of(info))?;
            if p + len > types.len() {
                // wording: not a count
                return Err(format!("type {} runs past the types", at.len() + 1));
            }
            at.push(p as u32);
            p += len;
        }
        Ok(Btf { types, strings, at })
    }

    /// How many types, void not counted.
    pub fn count(&self) -> usize {
        self.at.len()
    }

    /// The record of type `id` (1 on).
    fn record(&self, id: u32) -> Result<&'a [u8], Error> {
        let i = (id as usize)
            .checked_sub(1)
            .filter(|&i| i < self.at.len())
            .ok_or_else(|| format!("a reference to type {id}, which is not there"))?;
        let start = self.at[i] as usize;
        let info = u32_at(self.types, start + 4)?;
        let len = record_len(kind_of(info), vlen_of(info))?;
        Ok(&self.types[start..start + len])
    }

    /// Type `id`'s kind.
    pub fn kind(&self, id: u32) -> Result<u32, Error> {
        Ok(kind_of(u32_at(self.record(id)?, 4)?))
    }

    /// The string at `off` of the string section, without its NUL.
    pub fn string(&self, off: u32) -> Result<&'a [u8], Error> {
        let rest = self
            .strings
            .get(off as usize..)
            .ok_or_else(|| format!("a name at {off}, past the strings"))?;
        let end = rest
            .iter()
            .position(|&c| c == 0)
            .ok_or("a name without its end")?;
        Ok(&rest[..end])
    }

    /// Type `id`'s name (empty for an anonymous type).
    pub fn name(&self, id: u32) -> Result<&'a [u8], Error> {
        self.string(u32_at(self.record(id)?, 0)?)
    }

    /// The id of the type of kind `kind` named each of `names` (the first
    /// if several), in one pass over the types.
    pub fn find_each<const N: usize>(&self, kind: u32, names: [&str; N]) -> [Option<u32>; N] {
        let mut found = [None; N];
        for id in 1..=self.at.len() as u32 {
            if found.iter().all(Option::is_some) {
                break;
            }
            if self.kind(id) != Ok(kind) {
                continue;
            }
            let Ok(name) = self.name(id) else { continue };
            for (at, want) in found.iter_mut().zip(names) {
                if at.is_none() && name == want.as_bytes() {
                    *at = Some(id);
                }
            }
        }
        found
    }
}

/// A name as libbpf matches it for CO-RE: up to its `___` suffix (a
/// flavour: `struct module___old` matches `struct module`).
pub fn essential(name: &[u8]) -> &[u8] {
    match name.windows(3).rposition(|w| w == b"___") {
        Some(i) => &name[..i],
        None => name,
    }
}

/// Kinds libbpf takes as candidates of each other: the same kind, and an
/// enum of either width for an enum.
fn kind_class(kind: u32) -> u32 {
    match kind {
        KIND_ENUM64 => KIND_ENUM,
        k => k,
    }
}

/// Where a type's record refers to other types and to strings, besides
/// its own name (at 0): byte offsets into the record.
struct References {
    /// Type ids.
    types: Vec<usize>,
    /// Names of its members, values or parameters.
    names: Vec<usize>,
}

/// The references of a record of `kind` with `vlen` entries.
fn references(kind: u32, vlen: usize) -> References {
    let mut r = References {
        types: Vec::new(),
        names: Vec::new(),
    };
    match kind {
        KIND_PTR | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
        | KIND_FUNC | KIND_VAR | KIND_DECL_TAG => r.types.push(8),
        // The element's type, then the index's.
        KIND_ARRAY => r.types.extend([12, 16]),
        // A member: its name, its type, its offset.
        KIND_STRUCT | KIND_UNION => {
            for m in 0..vlen {
                r.names.push(12 + 12 * m);
                r.types.push(12 + 12 * m + 4);
            }
        }
        // A variable: its type, its offset, its size.
        KIND_DATASEC => r.types.extend((0..vlen).map(|m| 12 + 12 * m)),
        KIND_ENUM | KIND_ENUM64 => {
            let step = if kind == KIND_ENUM { 8 } else { 12 };
            r.names.extend((0..vlen).map(|v| 12 + step * v));
        }
        // The return type, then each parameter's name and type.
        KIND_FUNC_PROTO => {
            r.types.push(8);
            for p in 0..vlen {
                r.names.push(12 + 8 * p);
                r.types.push(12 + 8 * p + 4);
            }
        }
        _ => {}
    }
    r
}

/// A minimal BTF: see [`minimal`].
pub struct Minimal {
    /// The raw BTF.
    pub raw: Vec<u8>,
    /// How many types it holds.
    pub types: usize,
    /// Of the names asked for, those the kernel has no type of (libbpf
    /// would look for them in the kernel modules' BTF).
    pub missing: Vec<String>,
}

/// The types of the kernel's BTF `kernel` that libbpf's CO-RE could match
/// for the relocations naming `wanted` (kind, name), and what they are
/// made of, as a BTF of their own. A type reached only through a pointer
/// is a forward declaration there.
pub fn minimal<'a>(kernel: &Btf<'a>, wanted: &[(u32, &str)]) -> Result<Minimal, Error> {
    let wanted_list = wanted;
    let wanted: FnvSet<(u32, &[u8])> = wanted
        .iter()
        .map(|&(k, n)| (kind_class(k), essential(n.as_bytes())))
        .collect();
    let mut found: FnvSet<(u32, &[u8])> = FnvSet::default();
    // The kinds asked for, a bit each.
    let kinds: u32 = wanted.iter().fold(0, |m, &(k, _)| m | 1 << k);
    // The candidates: the roots of what is kept.
    let mut keep: FnvMap<u32, u32> = FnvMap::default();
    let mut order: Vec<u32> = Vec::new();
    let mut todo: Vec<u32> = Vec::new();
    for (i, &at) in kernel.at.iter().enumerate() {
        let info = u32_at(kernel.types, at as usize + 4)?;
        let class = kind_class(kind_of(info));
        if kinds & 1 << class == 0 {
            continue;
        }
        let id = i as u32 + 1;
        let name = kernel.string(u32_at(kernel.types, at as usize)?)?;
        if !name.is_empty() && wanted.contains(&(class, essential(name))) {
            found.insert((class, essential(name)));
            todo.push(id);
        }
    }
    let missing = wanted_list
        .iter()
        .filter(|&&(k, n)| !found.contains(&(kind_class(k), essential(n.as_bytes()))))
        .map(|&(_, n)| n.to_string())
        .collect();
    // What they are made of; pointers' targets by name only.
    let mut fwds: Vec<(u32, bool)> = Vec::new();
    let mut fwd_of: FnvMap<u32, u32> = FnvMap::default();
    while let Some(id) = todo.pop() {
        if id == 0 || keep.contains_key(&id) {
            continue;
        }
        keep.insert(id, 0);
        order.push(id);
        let record = kernel.record(id)?;
        let info = u32_at(record, 4)?;
        let kind = kind_of(info);
        for at in references(kind, vlen_of(info)).types {
            let target = u32_at(record, at)?;
            let target_kind = match (kind, target) {
                (KIND_PTR, 1..) => kernel.kind(target)?,
                _ => 0,
            };
            if matches!(target_kind, KIND_STRUCT | KIND_UNION) {
                fwd_of.entry(target).or_insert_with(|| {
                    fwds.push((target, target_kind == KIND_UNION));
                    0
                });
            } else {
                todo.push(target);
            }
        }
    }
    // New ids: the kept types in the kernel's order, then the forward
    // declarations.
    order.sort_unstable();
    for (i, id) in order.iter().enumerate() {
        keep.insert(*id, i as u32 + 1);
    }
    for (next, (target, _)) in (order.len() as u32 + 1..).zip(&fwds) {
        fwd_of.insert(*target, next);
    }
    let mut strings: Vec<u8> = vec![0];
    let mut string_at: FnvMap<&[u8], u32> = FnvMap::default();
    let mut add_string = |s: &'a [u8]| -> u32 {
        if s.is_empty() {
            return 0;
        }
        *string_at.entry(s).or_insert_with(|| {
            let at = strings.len() as u32;
            strings.extend_from_slice(s);
            strings.push(0);
            at
        })
    };
    let new_id = |id: u32| -> Result<u32, Error> {
        if id == 0 {
            return Ok(0);
        }
        keep.get(&id)
            .copied()
            .ok_or_else(|| format!("type {id} referenced but not kept"))
    };
    let mut types: Vec<u8> = Vec::new();
    let put = |out: &mut Vec<u8>, at: usize, v: u32| {
        out[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    for &id in &order {
        let record = kernel.record(id)?;
        let start = types.len();
        types.extend_from_slice(record);
        let info = u32_at(record, 4)?;
        let kind = kind_of(info);
        let refs = references(kind, vlen_of(info));
        // The type's own name, then its members', values' or parameters'.
        for at in std::iter::once(0).chain(refs.names) {
            let name = add_string(kernel.string(u32_at(record, at)?)?);
            put(&mut types, start + at, name);
        }
        for at in refs.types {
            let target = u32_at(record, at)?;
            let to = match fwd_of.get(&target) {
                Some(&fwd) if kind == KIND_PTR => fwd,
                _ => new_id(target)?,
            };
            put(&mut types, start + at, to);
        }
    }
    for &(target, union) in &fwds {
        let name = add_string(kernel.name(target)?);
        types.extend_from_slice(&name.to_le_bytes());
        let info = (KIND_FWD << 24) | if union { 1 << 31 } else { 0 };
        types.extend_from_slice(&info.to_le_bytes());
        types.extend_from_slice(&0u32.to_le_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_LEN + types.len() + strings.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(1); // version
    out.push(0); // flags
    for v in [
        HEADER_LEN as u32,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(&strings);
    Ok(Minimal {
        raw: out,
        types: order.len() + fwds.len(),
        missing,
    })
}

/// A section of a 64-bit little-endian ELF object, by name.
#[allow(dead_code)] // build.rs's
fn elf_section<'a>(elf: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, Error> {
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Err("not a 64-bit little-endian ELF object".into());
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    if shentsize < 64 {
        return Err("section headers too short".into());
    }
    let header = |i: usize| -> Result<(u32, &'a [u8]), Error> {
        let h = shoff
            .checked_add(i.checked_mul(shentsize).ok_or("too many sections")?)
            .ok_or("section headers past the end")?;
        let name = u32_at(elf, h)?;
        let off = u64_at(elf, h + 24)? as usize;
        let size = u64_at(elf, h + 32)? as usize;
        let data = off
            .checked_add(size)
            .and_then(|end| elf.get(off..end))
            .ok_or("a section past the end of the file")?;
        Ok((name, data))
    };
    let (_, names) = header(shstrndx)?;
    for i in 0..shnum {
        let (name_off, data) = header(i)?;
        let rest = names.get(name_off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        if &rest[..end] == name.as_bytes() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// The types (kind, name) that the CO-RE relocations of the BPF object
/// `elf` name, each once, in the order first named; anonymous ones left
/// out (libbpf relocates those against nothing).
#[allow(dead_code)] // build.rs's
pub fn relocated_types(elf: &[u8]) -> Result<Vec<(u32, String)>, Error> {
    let btf = Btf::parse(elf_section(elf, ".BTF")?.ok_or("no .BTF section")?)?;
    let Some(ext) = elf_section(elf, ".BTF.ext")? else {
        return Ok(Vec::new());
    };
    if u16_at(ext, 0)? != MAGIC {
        return Err(".BTF.ext: not BTF, or not in this machine's byte order".into());
    }
    let hdr_len = u32_at(ext, 4)? as usize;
    // The CO-RE relocations' place is in the header's last two words,
    // from version 1's 32 bytes on.
    if hdr_len < 32 {
        return Ok(Vec::new());
    }
    let off = u32_at(ext, 24)? as usize;
    let len = u32_at(ext, 28)? as usize;
    let relos = hdr_len
        .checked_add(off)
        .and_then(|s| Some((s, s.checked_add(len)?)))
        .and_then(|(s, e)| ext.get(s..e))
        .ok_or(".BTF.ext: CO-RE relocations past its end")?;
    if relos.is_empty() {
        return Ok(Vec::new());
    }
    let rec_size = u32_at(relos, 0)? as usize;
    if rec_size < 16 {
        return Err(format!(".BTF.ext: CO-RE records of {rec_size} bytes"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut p = 4;
    while p < relos.len() {
        let count = u32_at(relos, p + 4)? as usize;
        p += 8;
        for _ in 0..count {
            let type_id = u32_at(relos, p + 4)?;
            p = p
                .checked_add(rec_size)
                .ok_or(".BTF.ext: too many records")?;
            if p > relos.len() {
                return Err(".BTF.ext: a record past the end".into());
            }
            let name = btf.name(type_id)?;
            if name.is_empty() || !seen.insert(type_id) {
                continue;
            }
            let name = String::from_utf8_lossy(name).into_owned();
            out.push((btf.kind(type_id)?, name));
        }
    }
    Ok(out)
}
