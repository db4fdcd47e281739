//! Java's thread names, read from a JVM's memory: the kernel keeps 15
//! characters of a thread's name (`pool-3-thread-1`, `C2 CompilerThre`),
//! Java keeps the whole name in the thread's `java.lang.Thread` object.
//!
//! From each `JavaThread` (the JVM's list of its threads, [`super::walk`])
//! to its `java.lang.Thread` object (`_threadObj`: the object, or from
//! JDK 17 on a handle to it), to the object's `name` field (a `String`),
//! to the string's `value` (a byte array) and `coder` (Latin-1 or UTF-16).
//!
//! The structure tables do not have the Java objects' field offsets: the
//! JVM computes them when it starts and keeps each in a static of
//! `libjvm.so` (`java_lang_Thread::_name_offset`, ...), found in the
//! object's full symbol table; so are the flags that decide how an object
//! refers to another (compressed or not) and where an array's elements
//! begin. A `libjvm.so` without its full symbol table keeps the kernel's
//! names, said with `-v`.

use super::code::{member, u32_at, u64_at};
use super::vmstructs::VmStructs;
use crate::runtime::Memory;

/// A name's bytes read, at most: a longer name is cut there, with `…`.
pub const MAX_NAME_BYTES: u32 = 512;

/// The statics of `libjvm.so` a thread's name needs, each a list of the
/// names it had across releases, in [`NameSymbols`]' order.
pub const NAME_SYMBOLS: [&[&str]; 6] = [
    &["_ZN16java_lang_Thread12_name_offsetE"],
    &[
        "_ZN16java_lang_String13_value_offsetE",
        "_ZN16java_lang_String12value_offsetE",
    ],
    &[
        "_ZN16java_lang_String13_coder_offsetE",
        "_ZN16java_lang_String12coder_offsetE",
    ],
    &["UseCompressedOops"],
    &["UseCompressedClassPointers"],
    // JDK 24 on; absent before (no compact headers).
    &["UseCompactObjectHeaders"],
];

/// Where the statics of [`NAME_SYMBOLS`] are (in the file, or in the
/// process once the load bias is added); 0 for one absent.
pub type NameSymbols = [u64; 6];

/// How a JVM's threads' names are read, once it has started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameLayout {
    /// `JavaThread::_threadObj`, and whether it is a handle (`OopHandle`,
    /// JDK 17 on) rather than the object.
    thread_obj: u64,
    handle: bool,
    /// `java.lang.Thread.name`, `String.value`, `String.coder`.
    name: u64,
    value: u64,
    coder: u64,
    /// A reference to an object as a 32-bit number (base, shift), or a
    /// pointer (None).
    narrow: Option<(u64, u32)>,
    /// An array's length and its first element, from the array.
    array_length: u64,
    array_base: u64,
}

impl NameLayout {
    /// The layout of the JVM of tables `s` and major version `major`,
    /// whose statics of [`NAME_SYMBOLS`] are at `syms` in memory `mem`.
    /// Err: why names cannot be read (for good), or Ok(None) while the JVM
    /// has not computed its objects' offsets yet.
    pub fn read(
        mem: &dyn Memory,
        s: &VmStructs,
        syms: &NameSymbols,
        major: u32,
    ) -> Result<Option<NameLayout>, String> {
        if syms[..5].contains(&0) {
            return Err("no java_lang_Thread or String offsets in libjvm's symbols".into());
        }
        let thread_obj = member(s, &[("JavaThread", "_threadObj")])?;
        let handle = s
            .field("JavaThread", "_threadObj")
            .and_then(|f| f.type_string.as_deref())
            .is_some_and(|t| t == "OopHandle");
        let int = |at: u64| u32_at(mem, at).map_err(|e| format!("java_lang offsets: {e}"));
        let flag = |at: u64| -> Result<bool, String> {
            if at == 0 {
                return Ok(false);
            }
            let mut b = [0u8];
            mem.read(at, &mut b)
                .map_err(|e| format!("the JVM's flags: {e}"))?;
            Ok(b[0] != 0)
        };
        let (name, value, coder) = (int(syms[0])?, int(syms[1])?, int(syms[2])?);
        // Computed as the JVM starts; 0 until then (no field is at 0: the
        // object's header is).
        if name == 0 || value == 0 {
            return Ok(None);
        }
        let narrow = if flag(syms[3])? {
            // `_narrow_oop._base` up to JDK 24 (in `Universe` in 11),
            // `_base` in 25.
            let at = |field: &str| {
                ["CompressedOops", "Universe"]
                    .iter()
                    .find_map(|t| {
                        s.address(t, &format!("_narrow_oop.{field}"))
                            .or_else(|| s.address(t, field))
                    })
                    .ok_or_else(|| format!("no CompressedOops::{field} in its tables"))
            };
            let base = u64_at(mem, at("_base")?).map_err(|e| format!("oop base: {e}"))?;
            let shift = u32_at(mem, at("_shift")?).map_err(|e| format!("oop shift: {e}"))?;
            if shift > 8 {
                return Err(format!("a compressed-oop shift of {shift}"));
            }
            Some((base, shift))
        } else {
            None
        };
        // The header: the mark word, then the class (none with compact
        // headers, 4 bytes compressed, else 8), then an array's length.
        let array_length = if flag(syms[5])? {
            8
        } else if flag(syms[4])? {
            12
        } else {
            16
        };
        // The elements right after the length from JDK 22 on; before,
        // at the next 8-byte boundary.
        let array_base = if major >= 22 {
            array_length + 4
        } else {
            (array_length + 4 + 7) & !7
        };
        Ok(Some(NameLayout {
            thread_obj,
            handle,
            name: u64::from(name),
            value: u64::from(value),
            coder: u64::from(coder),
            narrow,
            array_length,
            array_base,
        }))
    }

    /// The object a reference field at `at` points to (0: none).
    fn reference(&self, mem: &dyn Memory, at: u64) -> std::io::Result<u64> {
        Ok(match self.narrow {
            Some((base, shift)) => match u32_at(mem, at)? {
                0 => 0,
                n => base.wrapping_add(u64::from(n) << shift),
            },
            None => u64_at(mem, at)?,
        })
    }
}

/// The Java name of `JavaThread` `thread`: None for a thread without a
/// `java.lang.Thread` (yet), or one whose name is not a string the JVM
/// could have made.
pub fn name(mem: &dyn Memory, l: &NameLayout, thread: u64) -> std::io::Result<Option<String>> {
    let mut obj = u64_at(mem, thread.wrapping_add(l.thread_obj))?;
    if l.handle && obj != 0 {
        obj = u64_at(mem, obj)?;
    }
    if obj == 0 {
        return Ok(None);
    }
    let string = l.reference(mem, obj.wrapping_add(l.name))?;
    if string == 0 {
        return Ok(None);
    }
    let value = l.reference(mem, string.wrapping_add(l.value))?;
    let mut coder = [0u8];
    mem.read(string.wrapping_add(l.coder), &mut coder)?;
    if value == 0 || coder[0] > 1 {
        return Ok(None);
    }
    let len = u32_at(mem, value.wrapping_add(l.array_length))?;
    // UTF-16: two bytes a character.
    if len > i32::MAX as u32 || (coder[0] == 1 && len % 2 == 1) {
        return Ok(None);
    }
    let take = len.min(MAX_NAME_BYTES) & !u32::from(coder[0]);
    let mut bytes = vec![0u8; take as usize];
    mem.read(value.wrapping_add(l.array_base), &mut bytes)?;
    let mut s: String = if coder[0] == 0 {
        bytes.iter().map(|&b| char::from(b)).collect()
    } else {
        let units = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]));
        char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect()
    };
    if take < len {
        s.push('…');
    }
    // A line of the report each: no control characters.
    let s = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Ok(Some(s))
}
