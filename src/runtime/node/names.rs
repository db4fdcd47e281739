//! The names of JavaScript functions, read from a node process's heap:
//! for a `SharedFunctionInfo` (SFI), the function's name as V8's
//! `SharedFunctionInfo::DebugName()` (and so `CallSite.getFunctionName()`)
//! gives it, its script's name, and where it starts; for a source
//! position, its line and column.
//!
//! What is read, in V8's terms:
//!
//! - the SFI's `name_or_scope_info`: the name itself (a String, or Smi 0
//!   for none) while the function has not been compiled, else its
//!   ScopeInfo, whose variable part holds the name (the function variable's
//!   name slot) and the inferred name (`Module._compile` for a function
//!   assigned to a property). The variable part's layout depends on the
//!   ScopeInfo's flags, whose bits the metadata does not describe: they are
//!   known only for the V8 versions
//!   [`super::v8dbg::ScopeInfoFlags::for_version`] lists,
//!   and another version's compiled functions are "cannot tell"
//!   ([`Error::Unknown`]), never a guess;
//! - the SFI's script: its `name` (the file name, or `node:internal/...`),
//!   its `line_ends` (or, not computed yet, its `source`, whose line
//!   terminators are found here as V8 finds them);
//! - strings of every representation: sequential (one- or two-byte), cons,
//!   thin, sliced and external (through the cached pointer to the
//!   characters).
//!
//! Every byte read belongs to another process, which runs on and may have
//! freed or moved what a frame recorded: every object's type is checked
//! (through its map, and the map's own map), every length bounded, every
//! walk of strings bounded in depth and characters. Garbage is an
//! [`Error::Unreadable`], never a panic or an endless loop.

use crate::runtime::Memory;

use super::v8dbg::Layout;

/// Why a name could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The memory could not be read, or does not hold what V8 writes
    /// there (garbage, a freed or moved object).
    Unreadable(String),
    /// What was read is V8's, but reading it needs a layout this V8
    /// version's metadata does not give and that is not known here.
    Unknown(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unreadable(why) => write!(f, "unreadable: {why}"),
            Error::Unknown(what) => write!(f, "cannot tell {what} for this V8 version"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

pub(super) fn unreadable<T>(why: impl Into<String>) -> Result<T> {
    Err(Error::Unreadable(why.into()))
}

/// The longest name read, in characters: V8's names are short, an
/// inferred name of minified code a few hundred characters at most.
pub const MAX_NAME: usize = 4096;
/// The longest script name read (a path or URL).
pub const MAX_SCRIPT_NAME: usize = 8192;
/// The most characters of a script's source read to find its lines.
pub const MAX_SOURCE: usize = 64 << 20;
/// The most lines a script's `line_ends` may claim.
pub const MAX_LINES: usize = 4 << 20;
/// How deep a string's parts (cons, thin, sliced) are followed.
const MAX_STRING_DEPTH: u32 = 64;
/// How many parts of one string are read at most (a cons string of many
/// small parts, or garbage that looks like one).
const MAX_STRING_PARTS: u32 = 100_000;
/// Context locals a ScopeInfo may claim (V8's limit is far lower).
const MAX_CONTEXT_LOCALS: i64 = 1 << 16;

/// A function, as its SFI says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// As `SharedFunctionInfo::DebugName()` gives it: the function's own
    /// name, else its inferred name; empty for an anonymous function.
    pub name: String,
    /// The script's tagged pointer (None: the SFI has no script, a
    /// builtin's or an API function's), for [`LineTable::read`].
    pub script: Option<u64>,
    /// The script's name (None: it has none, such as code of `eval`).
    pub script_name: Option<String>,
    /// The function's start in its script's source: V8's
    /// `SharedFunctionInfo::StartPosition()`, in characters (for a
    /// function, where its parameters begin). None where not recorded
    /// or not known how to read.
    pub start_position: Option<u32>,
    /// Where it ends (`SharedFunctionInfo::EndPosition()`), where known.
    pub end_position: Option<u32>,
}

/// A heap object read: its untagged address and instance type.
#[derive(Clone, Copy, Debug)]
pub(super) struct Object {
    pub addr: u64,
    pub kind: u16,
}

/// Reads V8 objects from a process's memory with one release's layout.
pub struct Reader<'a> {
    pub layout: &'a Layout,
    pub mem: &'a dyn Memory,
}

impl<'a> Reader<'a> {
    pub fn new(layout: &'a Layout, mem: &'a dyn Memory) -> Reader<'a> {
        Reader { layout, mem }
    }

    pub(super) fn bytes(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.mem
            .read(addr, buf)
            .or_else(|e| unreadable(format!("{} bytes at {addr:#x}: {e}", buf.len())))
    }

    pub(super) fn u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.bytes(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.bytes(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u16(&self, addr: u64) -> Result<u16> {
        let mut b = [0u8; 2];
        self.bytes(addr, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    pub(super) fn untag(&self, tagged: u64) -> Result<u64> {
        // Beyond any user address (57 bits with 5-level paging): so that
        // an object's address plus any offset read at does not overflow.
        if !self.layout.is_heap_object(tagged) || tagged >> 57 != 0 {
            return unreadable(format!("{tagged:#x} is not a heap object's pointer"));
        }
        Ok(tagged - self.layout.heap_object_tag)
    }

    /// The heap object `tagged` points to, its type from its map (whose
    /// own map must be the meta map: a map's type is `MAP_TYPE`).
    pub(super) fn object(&self, tagged: u64) -> Result<Object> {
        let addr = self.untag(tagged)?;
        let map = self.u64(addr + self.layout.heap_object_map)?;
        let map_addr = self.untag(map)?;
        let meta = self.untag(self.u64(map_addr + self.layout.heap_object_map)?)?;
        let meta_type = self.u16(meta + self.layout.map_instance_type)?;
        if meta_type != self.layout.type_map {
            return unreadable(format!("{tagged:#x}'s map {map:#x} is not a map"));
        }
        let kind = self.u16(map_addr + self.layout.map_instance_type)?;
        Ok(Object { addr, kind })
    }

    pub(super) fn typed(&self, tagged: u64, kind: u16, what: &str) -> Result<Object> {
        let o = self.object(tagged)?;
        if o.kind != kind {
            return unreadable(format!(
                "{tagged:#x} is not a {what} (instance type {}, not {kind})",
                o.kind
            ));
        }
        Ok(o)
    }

    pub(super) fn field(&self, o: Object, offset: u64) -> Result<u64> {
        self.u64(o.addr + offset)
    }

    pub(super) fn smi(&self, v: u64, what: &str) -> Result<i64> {
        self.layout
            .smi(v)
            .map_or_else(|| unreadable(format!("{what} {v:#x} is not a Smi")), Ok)
    }

    fn is_string(&self, o: Object) -> bool {
        o.kind < self.layout.strings.first_nonstring_type
    }

    /// The string `tagged` points to, at most `max` characters (longer:
    /// an error).
    pub fn string(&self, tagged: u64, max: usize) -> Result<String> {
        let units = self.string_units(tagged, 0, None, max)?;
        Ok(String::from_utf16_lossy(&units))
    }

    /// Characters `start..start + len` (all from `start` if None) of a
    /// string, as UTF-16 code units (a one-byte string's are Latin-1),
    /// at most `max` of them.
    fn string_units(
        &self,
        tagged: u64,
        start: usize,
        len: Option<usize>,
        max: usize,
    ) -> Result<Vec<u16>> {
        let mut out = Vec::new();
        let mut parts = 0;
        self.append(tagged, start, len, max, &mut out, 0, &mut parts)?;
        Ok(out)
    }

    /// Appends characters `start..start + len` of a string to `out`.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        tagged: u64,
        start: usize,
        len: Option<usize>,
        max: usize,
        out: &mut Vec<u16>,
        depth: u32,
        parts: &mut u32,
    ) -> Result<()> {
        *parts += 1;
        if depth > MAX_STRING_DEPTH || *parts > MAX_STRING_PARTS {
            return unreadable("a string of too many parts");
        }
        let o = self.object(tagged)?;
        if !self.is_string(o) {
            return unreadable(format!(
                "{tagged:#x} is not a string (instance type {})",
                o.kind
            ));
        }
        let s = &self.layout.strings;
        let length = self.u32(o.addr + self.layout.string_length)? as i32;
        let Ok(length) = usize::try_from(length) else {
            return unreadable(format!("a string of length {length}"));
        };
        if start > length {
            return unreadable("a slice beyond its string");
        }
        let len = len.unwrap_or(length - start);
        if len > length - start {
            return unreadable("a slice beyond its string");
        }
        if out.len() + len > max {
            return unreadable(format!("a string longer than {max} characters"));
        }
        if len == 0 {
            return Ok(());
        }
        let one_byte = o.kind & s.encoding_mask == s.one_byte_tag;
        let representation = o.kind & s.representation_mask;
        if representation == s.seq_tag {
            let chars = if one_byte {
                self.layout.seq_one_byte_chars
            } else {
                self.layout.seq_two_byte_chars
            };
            self.chars(o.addr + chars, start, len, one_byte, out)
        } else if representation == s.cons_tag {
            let first = self.field(o, self.layout.cons_first)?;
            let second = self.field(o, self.layout.cons_second)?;
            let first_len = self.length(first)?;
            if first_len > length {
                return unreadable("a cons string's first part longer than the string");
            }
            if start < first_len {
                let n = len.min(first_len - start);
                self.append(first, start, Some(n), max, out, depth + 1, parts)?;
            }
            let end = start + len;
            if end > first_len {
                let from = start.max(first_len) - first_len;
                self.append(
                    second,
                    from,
                    Some(end - first_len - from),
                    max,
                    out,
                    depth + 1,
                    parts,
                )?;
            }
            Ok(())
        } else if representation == s.thin_tag {
            let actual = self.field(o, self.layout.thin_actual)?;
            self.append(actual, start, Some(len), max, out, depth + 1, parts)
        } else if representation == s.sliced_tag {
            let parent = self.field(o, self.layout.sliced_parent)?;
            let offset = self.smi(
                self.field(o, self.layout.sliced_offset)?,
                "a slice's offset",
            )?;
            let Ok(offset) = usize::try_from(offset) else {
                return unreadable("a slice at a negative offset");
            };
            let Some(from) = offset.checked_add(start) else {
                return unreadable("a slice beyond its parent");
            };
            self.append(parent, from, Some(len), max, out, depth + 1, parts)
        } else if representation == s.external_tag {
            if !self.layout.types_cached_external_string.contains(&o.kind) {
                return unreadable(format!(
                    "an external string of type {} (its characters only through its resource)",
                    o.kind
                ));
            }
            // The cached pointer to the characters, right after the
            // resource.
            let data = self.u64(o.addr + self.layout.external_resource + 8)?;
            self.chars(data, start, len, one_byte, out)
        } else {
            unreadable(format!("a string of representation {representation}"))
        }
    }

    /// A string's length.
    fn length(&self, tagged: u64) -> Result<usize> {
        let o = self.object(tagged)?;
        if !self.is_string(o) {
            return unreadable(format!("{tagged:#x} is not a string"));
        }
        let length = self.u32(o.addr + self.layout.string_length)? as i32;
        usize::try_from(length).or_else(|_| unreadable(format!("a string of length {length}")))
    }

    /// Characters `start..start + len` of the characters at `addr`.
    fn chars(
        &self,
        addr: u64,
        start: usize,
        len: usize,
        one_byte: bool,
        out: &mut Vec<u16>,
    ) -> Result<()> {
        let width = if one_byte { 1 } else { 2 };
        let mut buf = Vec::new();
        buf.try_reserve_exact(len * width)
            .or_else(|_| unreadable("no memory for a string"))?;
        buf.resize(len * width, 0);
        let at = addr
            .checked_add((start * width) as u64)
            .filter(|a| a.checked_add(buf.len() as u64).is_some());
        let Some(at) = at else {
            return unreadable(format!("characters at {addr:#x}"));
        };
        self.bytes(at, &mut buf)?;
        if one_byte {
            out.extend(buf.iter().map(|&b| u16::from(b)));
        } else {
            out.extend(
                buf.chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]])),
            );
        }
        Ok(())
    }

    /// A name slot's string: a String, or (no name) Smi 0, undefined or
    /// another oddball: empty.
    fn name_slot(&self, v: u64) -> Result<String> {
        if self.layout.is_smi(v) {
            return Ok(String::new());
        }
        let o = self.object(v)?;
        if self.is_string(o) {
            self.string(v, MAX_NAME)
        } else {
            Ok(String::new())
        }
    }

    /// The `SharedFunctionInfo` (tagged) of the function object
    /// `function` of a frame whose context slot holds `context`, read now
    /// from the function: only where the object there still holds that
    /// context (a function object moved by the collector since, and another
    /// object in its place, would not).
    pub fn frame_shared(&self, function: u64, context: u64) -> Result<u64> {
        let addr = self.untag(function)?;
        if self.u64(addr + self.layout.js_function_context)? != context {
            return unreadable(format!(
                "the function object {function:#x} no longer holds its frame's context"
            ));
        }
        let shared = self.u64(addr + self.layout.js_function_shared)?;
        self.untag(shared)?;
        Ok(shared)
    }

    /// The function of the SFI `sfi` (a tagged pointer).
    pub fn function(&self, sfi: u64) -> Result<Function> {
        let l = self.layout;
        let o = self.typed(sfi, l.type_shared_function_info, "SharedFunctionInfo")?;
        let nosi = self.field(o, l.sfi_name_or_scope_info)?;
        let (mut name, mut inferred, mut start_position) = (String::new(), String::new(), None);
        let mut end_position = None;
        if l.is_smi(nosi) {
            // kNoSharedNameSentinel: no name of its own.
            self.smi(nosi, "a name")?;
        } else {
            let n = self.object(nosi)?;
            if n.kind == l.type_scope_info {
                let info = self.scope_info(n)?;
                if let Some(kind) = info.function_kind {
                    // Class fields' initializers: V8 names them so, their
                    // SFIs unnamed.
                    if let Some(flags) = l.scope_info_flags {
                        if kind == flags.class_members_initializer_kind {
                            name = "<instance_members_initializer>".into();
                        } else if kind == flags.class_static_initializer_kind {
                            name = "<static_initializer>".into();
                        }
                    }
                }
                if name.is_empty() {
                    name = info.name;
                }
                inferred = info.inferred_name;
                start_position = info.start_position;
                end_position = info.end_position;
            } else if self.is_string(n) {
                name = self.string(nosi, MAX_NAME)?;
            } else {
                return unreadable(format!("a name or scope info of instance type {}", n.kind));
            }
            if n.kind != l.type_scope_info {
                // Not compiled: the inferred name and the start are the
                // uncompiled data's, where the metadata says where the
                // function's data is (V8 11; 12 on keeps it where the
                // metadata does not say).
                if let Some(data) = self.uncompiled_data(o)? {
                    if let Some(off) = l.uncompiled_data_inferred_name {
                        inferred = self.name_slot(self.field(data, off)?)?;
                    }
                    if let Some(off) = l.uncompiled_data_start_position {
                        start_position = u32::try_from(self.u32(data.addr + off)? as i32).ok();
                    }
                } else if name.is_empty() && l.sfi_function_data.is_none() {
                    return Err(Error::Unknown("an uncompiled function's inferred name"));
                }
            }
        }
        if name.is_empty() {
            name = inferred;
        }
        let (script, script_name) = self.script_of(o)?;
        Ok(Function {
            name,
            script,
            script_name,
            start_position,
            end_position,
        })
    }

    /// The SFI's uncompiled data, if its function data is one (V8 11's
    /// metadata says where the function's data is).
    fn uncompiled_data(&self, sfi: Object) -> Result<Option<Object>> {
        let Some(off) = self.layout.sfi_function_data else {
            return Ok(None);
        };
        let data = self.field(sfi, off)?;
        if !self.layout.is_heap_object(data) {
            return Ok(None);
        }
        let d = self.object(data)?;
        Ok(self
            .layout
            .types_uncompiled_data
            .contains(&d.kind)
            .then_some(d))
    }

    /// The SFI's script and its name.
    fn script_of(&self, sfi: Object) -> Result<(Option<u64>, Option<String>)> {
        let l = self.layout;
        let script = self.field(sfi, l.sfi_script)?;
        if !l.is_heap_object(script) {
            return Ok((None, None));
        }
        let s = self.object(script)?;
        if Some(s.kind) == l.type_debug_info {
            // V8 11 puts the DebugInfo (which holds the script) in its
            // place while a debugger looks at the function; the
            // metadata does not say where in it the script is.
            return Err(Error::Unknown("the script of a function being debugged"));
        }
        if s.kind != l.type_script {
            // Undefined: a builtin's or an API function's.
            return Ok((None, None));
        }
        let name = self.field(s, l.script_name)?;
        let name = if l.is_heap_object(name) && self.is_string(self.object(name)?) {
            Some(self.string(name, MAX_SCRIPT_NAME)?)
        } else {
            None
        };
        Ok((Some(script), name))
    }

    /// A ScopeInfo's slot `i` (of the tagged size, counted after the map,
    /// as the metadata's `scopeinfo_idx_*` count them).
    fn slot(&self, o: Object, i: u64) -> Result<u64> {
        self.u64(o.addr + self.layout.heap_object_map + 8 + 8 * i)
    }

    /// What a function's ScopeInfo says of it.
    fn scope_info(&self, o: Object) -> Result<ScopeInfoNames> {
        let l = self.layout;
        let Some(f) = l.scope_info_flags else {
            return Err(Error::Unknown(
                "a compiled function's name (its ScopeInfo's layout)",
            ));
        };
        let flags = if f.smi_tagged {
            self.smi(self.slot(o, 0)?, "a ScopeInfo's flags")? as u64
        } else {
            u64::from(self.u32(o.addr + l.heap_object_map + 8)?)
        };
        let bit = |b: u32| flags >> b & 1 == 1;
        let scope_type = flags >> f.scope_type_shift & 0xf;
        let function_variable = flags >> f.function_variable_shift & 3;
        let function_kind = (flags >> f.function_kind_shift & 0x1f) as u32;
        let locals = self.smi(
            self.slot(o, l.scope_info_idx_ncontextlocals)?,
            "a ScopeInfo's context local count",
        )?;
        if !(0..MAX_CONTEXT_LOCALS).contains(&locals) {
            return unreadable(format!("a ScopeInfo of {locals} context locals"));
        }
        let locals = locals as u64;
        let mut i = l.scope_info_idx_first_vars;
        let (mut start_position, mut end_position) = (None, None);
        let has_positions = [
            f.function_scope,
            f.script_scope,
            f.eval_scope,
            f.module_scope,
        ]
        .contains(&scope_type);
        if !f.smi_tagged {
            // From V8 12.8 the positions are fixed slots before the
            // variable part, the module variable count its first slot.
            if l.scope_info_idx_first_vars != l.scope_info_idx_ncontextlocals + 3 {
                return Err(Error::Unknown("a ScopeInfo's positions"));
            }
            start_position = self.position(self.slot(o, l.scope_info_idx_ncontextlocals + 1)?)?;
            end_position = self.position(self.slot(o, l.scope_info_idx_ncontextlocals + 2)?)?;
            if scope_type == f.module_scope {
                i += 1;
            }
        } else if scope_type == f.module_scope {
            return Err(Error::Unknown("a module's ScopeInfo"));
        }
        // The context locals' names (or the hash table of them), then their
        // infos.
        i += if locals < f.max_inlined_local_names {
            locals
        } else {
            1
        };
        i += locals;
        if bit(f.saved_class_variable_bit) {
            i += 1;
        }
        let mut name = String::new();
        if function_variable != 0 {
            name = self.name_slot(self.slot(o, i)?)?;
            i += 2;
        }
        let mut inferred_name = String::new();
        if bit(f.inferred_function_name_bit) {
            inferred_name = self.name_slot(self.slot(o, i)?)?;
            i += 1;
        }
        if f.smi_tagged && has_positions {
            start_position = self.position(self.slot(o, i)?)?;
            end_position = self.position(self.slot(o, i + 1)?)?;
        }
        Ok(ScopeInfoNames {
            name,
            inferred_name,
            start_position,
            end_position,
            function_kind: (scope_type == f.function_scope).then_some(function_kind),
        })
    }

    /// A position slot: a Smi, -1 (`kNoSourcePosition`) for none.
    fn position(&self, v: u64) -> Result<Option<u32>> {
        let p = self.smi(v, "a source position")?;
        if p < -1 || p > i64::from(u32::MAX) {
            return unreadable(format!("a source position {p}"));
        }
        Ok(u32::try_from(p).ok())
    }
}

/// What [`Reader::scope_info`] reads.
struct ScopeInfoNames {
    name: String,
    inferred_name: String,
    start_position: Option<u32>,
    end_position: Option<u32>,
    /// A function scope's `FunctionKind`.
    function_kind: Option<u32>,
}

/// The lines of a script: where each line ends (the position of its line
/// terminator, the last line's at the source's end), as V8's
/// `Script::line_ends` has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineTable {
    pub ends: Vec<u32>,
}

impl LineTable {
    /// The lines of the script `script` (a tagged pointer): its
    /// `line_ends` where V8 has computed them (for a stack trace, or a
    /// debugger), else found in its source as V8 finds them.
    pub fn read(r: &Reader, script: u64) -> Result<LineTable> {
        let l = r.layout;
        let s = r.typed(script, l.type_script, "Script")?;
        let ends = r.field(s, l.script_line_ends)?;
        if l.is_heap_object(ends) {
            let a = r.object(ends)?;
            if a.kind == l.type_fixed_array {
                let n = r.smi(r.field(a, l.fixed_array_length)?, "a FixedArray's length")?;
                if !(0..=MAX_LINES as i64).contains(&n) {
                    // wording: a count never 1
                    return unreadable(format!("a script of {n} lines"));
                }
                let mut raw = vec![0u8; n as usize * 8];
                r.bytes(a.addr + l.fixed_array_data, &mut raw)?;
                let mut ends = Vec::with_capacity(n as usize);
                for c in raw.chunks_exact(8) {
                    let v = r.smi(u64::from_le_bytes(c.try_into().unwrap()), "a line end")?;
                    let v = u32::try_from(v).or_else(|_| unreadable("a negative line end"))?;
                    if ends.last().is_some_and(|&last| v < last) {
                        return unreadable("line ends out of order");
                    }
                    ends.push(v);
                }
                return Ok(LineTable { ends });
            }
        }
        let source = r.field(s, l.script_source)?;
        let units = r.string_units(source, 0, None, MAX_SOURCE)?;
        Ok(LineTable::from_source(&units))
    }

    /// The line ends of a source, as V8's `String::CalculateLineEnds`
    /// finds them (with the source's end as the last line's): a line ends
    /// at `\n`, at `\r` not followed by `\n`, at U+2028 and at U+2029.
    pub fn from_source(units: &[u16]) -> LineTable {
        let mut ends = Vec::new();
        for (i, &c) in units.iter().enumerate() {
            let end = match c {
                0x0a | 0x2028 | 0x2029 => true,
                0x0d => units.get(i + 1) != Some(&0x0a),
                _ => false,
            };
            if end {
                ends.push(i as u32);
            }
        }
        // V8 adds one past the source's end as the last line's end (a
        // position at the end is on the last line).
        ends.push(units.len() as u32);
        LineTable { ends }
    }

    /// The 1-based line and column of a position (V8's
    /// `Script::GetPositionInfo`, plus one each); None beyond the last
    /// line.
    pub fn line_column(&self, position: u32) -> Option<(u32, u32)> {
        let line = self.ends.partition_point(|&end| end < position);
        if line >= self.ends.len() {
            return None;
        }
        let line_start = if line == 0 {
            0
        } else {
            self.ends[line - 1] + 1
        };
        Some((line as u32 + 1, position.saturating_sub(line_start) + 1))
    }
}
