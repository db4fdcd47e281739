//! V8's post-mortem metadata, read from a node binary: the `v8dbg_*`
//! symbols that V8's build generates for debuggers (llnode, mdb_v8), each
//! a constant of the release: a field's offset in its class
//! (`v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_`),
//! an instance type (`v8dbg_type_Script__SCRIPT_TYPE`), a tagging constant
//! (`v8dbg_HeapObjectTag`), a frame's slot (`v8dbg_off_fp_function`) or a
//! frame type's marker (`v8dbg_frametype_InterpretedFrame`). [`Layout`]
//! holds what naming a frame needs of them, and what the BPF walk needs,
//! every offset from the metadata: nothing here is written per release
//! except what the metadata does not describe (the bits of a ScopeInfo's
//! flags, see [`ScopeInfoFlags`]), which is known only for the V8
//! versions [`ScopeInfoFlags::for_version`] lists.
//!
//! The symbols are read from the file (`.symtab`, else `.dynsym`), not
//! from a process: they are constant-initialized data (or `.bss` when
//! zero), the same in every process of the binary. Their names change
//! from release to release in the type suffix (`__Object` in V8 11,
//! `__Tagged_Object_` in 12 on) and sometimes in the field's name
//! (`script_or_debug_info` in 11, `script`/`raw_script` in 12 on), so a
//! field is looked up by class and field name, the suffix ignored, with
//! alternatives where a field was renamed. A missing symbol is an error
//! that names it.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::elf::{read_at_vaddr, Elf, SymbolTable};

/// The symbols' common prefix.
const PREFIX: &str = "v8dbg_";

/// The `v8dbg_*` constants of one binary, by name without the prefix
/// (`class_Script__name__Object`), and the V8 version the binary says it
/// is.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    pub values: HashMap<String, i64>,
    pub version: Option<Version>,
}

/// V8's version, from `v8::internal::Version`'s static members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub build: u32,
    pub patch: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}",
            self.major, self.minor, self.build, self.patch
        )
    }
}

/// `v8::internal::Version::{major_,minor_,build_,patch_}`, mangled: each
/// an `int` initialized at compile time (exported, so in `.dynsym` too).
const VERSION_SYMBOLS: [&str; 4] = [
    "_ZN2v88internal7Version6major_E",
    "_ZN2v88internal7Version6minor_E",
    "_ZN2v88internal7Version6build_E",
    "_ZN2v88internal7Version6patch_E",
];

/// The embedded builtins whose code runs an interpreted (Ignition)
/// frame, by name: a frame whose return address is in one of them is the
/// caller of an interpreted frame's callee.
/// What the error of a binary without the metadata says.
pub const NO_METADATA: &str = "no V8 post-mortem metadata";

pub const INTERPRETER_BUILTINS: [&str; 4] = [
    "Builtins_InterpreterEntryTrampoline",
    "Builtins_InterpreterEntryTrampolineForProfiling",
    "Builtins_InterpreterEnterAtBytecode",
    "Builtins_InterpreterEnterAtNextBytecode",
];

/// A metadata symbol's value, at most this many bytes (they are `int`s,
/// a few `uintptr_t`s).
const MAX_VALUE_BYTES: u64 = 8;

impl Metadata {
    /// The metadata of the binary at `path`: every `v8dbg_*` symbol of its
    /// full symbol table (or, stripped, its dynamic one), and its V8
    /// version if it says.
    pub fn read(path: &Path) -> Result<Metadata> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let elf = Elf::read(&file).with_context(|| format!("reading {}", path.display()))?;
        let segments = elf.load_segments(&file)?;
        let mut symbols = elf.symbols_with_prefix(&file, SymbolTable::Full, PREFIX)?;
        if symbols.is_empty() {
            symbols = elf.symbols_with_prefix(&file, SymbolTable::Dynamic, PREFIX)?;
        }
        if symbols.is_empty() {
            bail!("{}: {NO_METADATA} (no {PREFIX}* symbols)", path.display());
        }
        let value = |sym: crate::elf::Symbol, zero_filled: bool| -> Option<i64> {
            // A symbol without a size is taken as an int, V8's usual type.
            let size = if sym.size == 0 { 4 } else { sym.size };
            if size > MAX_VALUE_BYTES {
                return None;
            }
            if zero_filled {
                return Some(0);
            }
            let bytes = read_at_vaddr(&file, &segments, sym.value, size as usize)?;
            let mut raw = [0u8; 8];
            raw[..bytes.len()].copy_from_slice(&bytes);
            let v = u64::from_le_bytes(raw);
            // Sign-extend: offsets from a frame pointer are negative.
            let shift = 64 - 8 * size as u32;
            Some(((v << shift) as i64) >> shift)
        };
        let mut values = HashMap::new();
        for (name, sym, zero_filled) in symbols {
            if let Some(v) = value(sym, zero_filled) {
                values.insert(name[PREFIX.len()..].to_string(), v);
            }
        }
        let mut version = None;
        for table in [SymbolTable::Dynamic, SymbolTable::Full] {
            let found = elf.symbols(&file, table, &VERSION_SYMBOLS)?;
            if found.iter().all(Option::is_some) {
                let part = |i: usize| {
                    found[i]
                        .and_then(|s| read_at_vaddr(&file, &segments, s.value, 4))
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                };
                if let (Some(major), Some(minor), Some(build), Some(patch)) =
                    (part(0), part(1), part(2), part(3))
                {
                    version = Some(Version {
                        major,
                        minor,
                        build,
                        patch,
                    });
                    break;
                }
            }
        }
        Ok(Metadata { values, version })
    }

    /// The constant `v8dbg_{name}`.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    fn need(&self, name: &str) -> Result<i64> {
        self.get(name)
            .with_context(|| format!("V8 metadata: no {PREFIX}{name}"))
    }

    /// The offset of a field of `class`, the first of `fields` (its names
    /// through the releases) that the metadata has, whatever its type
    /// suffix: `v8dbg_class_{class}__{field}__{type}`.
    pub fn field(&self, class: &str, fields: &[&str]) -> Option<i64> {
        fields.iter().find_map(|field| {
            let prefix = format!("class_{class}__{field}__");
            // Several suffixes may name one field (V8 22 lists
            // `JSFunction__context__Context` and `..._Tagged_Context_`);
            // they agree, the shortest is taken for a stable choice.
            self.values
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .min_by_key(|(k, _)| (k.len(), k.as_str()))
                .map(|(_, &v)| v)
        })
    }

    fn need_field(&self, class: &str, fields: &[&str]) -> Result<u64> {
        let v = self.field(class, fields).with_context(|| {
            format!(
                "V8 metadata: no {PREFIX}class_{class}__{}__*",
                fields.join("/")
            )
        })?;
        offset(v, class, fields[0])
    }

    /// The instance type of `class`: `v8dbg_type_{class}__{TYPE_NAME}`,
    /// the first of several (a class of several types, such as
    /// `ConsString`, is not asked for here).
    pub fn instance_type(&self, class: &str) -> Option<u16> {
        let prefix = format!("type_{class}__");
        self.values
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .min_by_key(|(k, _)| k.as_str())
            .and_then(|(_, &v)| u16::try_from(v).ok())
    }

    /// The instance types of every class whose name begins with
    /// `class_prefix` (`UncompiledData` and `UncompiledDataWith...`).
    pub fn instance_types(&self, class_prefix: &str) -> Vec<u16> {
        let prefix = format!("type_{class_prefix}");
        let mut v: Vec<u16> = self
            .values
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(_, &v)| u16::try_from(v).ok())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn need_type(&self, class: &str) -> Result<u16> {
        self.instance_type(class)
            .with_context(|| format!("V8 metadata: no {PREFIX}type_{class}__*"))
    }
}

/// An object field's offset: not negative, and small (V8's objects'
/// headers are well under a KiB).
fn offset(v: i64, class: &str, field: &str) -> Result<u64> {
    if !(0..4096).contains(&v) {
        bail!("V8 metadata: {class}.{field} at offset {v}");
    }
    Ok(v as u64)
}

/// A frame slot's offset from the frame pointer, in bytes.
fn fp_offset(m: &Metadata, name: &str) -> Result<i64> {
    let v = m.need(name)?;
    if !(-4096..4096).contains(&v) || v % 8 != 0 {
        bail!("V8 metadata: {PREFIX}{name} is {v}, not a frame slot");
    }
    Ok(v)
}

/// The bits of a string's instance type that say what it is (V8's
/// `StringShape`): the masks and their values, from the metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringShape {
    /// Instance types below this are strings.
    pub first_nonstring_type: u16,
    pub encoding_mask: u16,
    pub one_byte_tag: u16,
    pub two_byte_tag: u16,
    pub representation_mask: u16,
    pub seq_tag: u16,
    pub cons_tag: u16,
    pub external_tag: u16,
    pub sliced_tag: u16,
    pub thin_tag: u16,
}

/// Frame markers: a frame that is not a JavaScript function's holds, in
/// its context-or-frame-type slot, its type as a Smi (V8's
/// `StackFrame::Type`), these values among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameTypes {
    /// Every `v8dbg_frametype_*`, name without the prefix and value.
    pub all: Vec<(String, i64)>,
    pub entry: i64,
    pub construct_entry: i64,
    pub exit: i64,
    pub interpreted: i64,
    pub baseline: i64,
    /// Turbofan-optimized frames (`TurbofanFrame` in V8 11,
    /// `TurbofanJSFrame` from 12).
    pub optimized: i64,
    pub maglev: Option<i64>,
    pub stub: i64,
    pub builtin: Option<i64>,
    pub builtin_exit: Option<i64>,
}

impl FrameTypes {
    /// The value of `v8dbg_frametype_{name}`.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.all.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// An embedded builtin's code: the file's address and size (add the
/// object's load bias for the process's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeRange {
    pub start: u64,
    pub size: u64,
}

/// The bit layout of a ScopeInfo's flags, which the metadata does not
/// describe (V8's torque `ScopeFlags` bitfield struct), and where the
/// flags are: known only for the V8 versions that [`Self::for_version`]
/// lists, each read from that version's `src/objects/scope-info.tq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeInfoFlags {
    /// Up to V8 12.7 the flags are a Smi in the first slot after the
    /// map; from 12.8 (V8 change 5627032) a raw uint32 in the first half
    /// of that slot (the other half padding), and the function's start
    /// and end positions fixed slots right after the context local
    /// count, not part of the variable part.
    pub smi_tagged: bool,
    /// `scope_type`: 4 bits at 0 in every listed version.
    pub scope_type_shift: u32,
    /// `has_saved_class_variable`: one slot in the variable part.
    pub saved_class_variable_bit: u32,
    /// `function_variable`: 2 bits, a `VariableAllocationInfo` (NONE 0,
    /// STACK 1, CONTEXT 2, UNUSED 3); not NONE: the function's name and
    /// its slot, two slots.
    pub function_variable_shift: u32,
    /// `has_inferred_function_name`: one slot.
    pub inferred_function_name_bit: u32,
    /// `function_kind`: 5 bits.
    pub function_kind_shift: u32,
    /// A scope with this many context locals or more has their names in
    /// a hash table (one slot), fewer inline (one slot each): V8's
    /// `kScopeInfoMaxInlinedLocalNamesSize`.
    pub max_inlined_local_names: u64,
    /// The `ScopeType` values whose variable part holds a position
    /// info (before V8 12.8): FUNCTION, SCRIPT, EVAL, MODULE (and a
    /// class scope, never a function's own).
    pub function_scope: u64,
    pub script_scope: u64,
    pub eval_scope: u64,
    pub module_scope: u64,
    /// The `FunctionKind`s whose debug name is not the function's name:
    /// class member initializers (`<instance_members_initializer>`,
    /// `<static_initializer>`).
    pub class_members_initializer_kind: u32,
    pub class_static_initializer_kind: u32,
}

impl ScopeInfoFlags {
    /// The layout of V8 `version`, if it is one of those whose
    /// `scope-info.tq` was read and whose layout the tests check against
    /// a real node: 11.3 (node 20), 12.4 (node 22), 13.6 (node 24).
    /// Another version: None, the names of compiled functions cannot be
    /// told.
    pub fn for_version(version: Version) -> Option<ScopeInfoFlags> {
        // The bit positions are the same in the three (scope_type 4 bits,
        // sloppy_eval_can_extend_vars, language_mode, declaration_scope,
        // receiver_variable 2 bits, class_scope_has_private_brand,
        // has_saved_class_variable at 10, has_new_target,
        // function_variable 2 bits at 12, has_inferred_function_name at
        // 14, is_asm_module, has_simple_parameters, function_kind 5 bits
        // at 17, has_outer_scope_info at 22, ...); what moved is where
        // the flags and the positions are, and `ScopeType`'s values
        // (REPL_MODE_SCOPE added before SCRIPT_SCOPE in V8 12.x is not in
        // these).
        let base = ScopeInfoFlags {
            smi_tagged: true,
            scope_type_shift: 0,
            saved_class_variable_bit: 10,
            function_variable_shift: 12,
            inferred_function_name_bit: 14,
            function_kind_shift: 17,
            max_inlined_local_names: 75,
            eval_scope: 1,
            function_scope: 2,
            module_scope: 3,
            script_scope: 4,
            class_members_initializer_kind: 24,
            class_static_initializer_kind: 25,
        };
        match (version.major, version.minor) {
            (11, 3) | (12, 4) => Some(base),
            (13, 6) => Some(ScopeInfoFlags {
                smi_tagged: false,
                ..base
            }),
            _ => None,
        }
    }
}

/// What naming a frame needs of one V8 release, and what the BPF walk
/// needs: offsets in bytes (an object's from its untagged address),
/// frame slots from the frame pointer, instance types, tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: Option<Version>,

    // Tagging: a heap object's pointer has `heap_object_tag` in its
    // `heap_object_tag_mask` bits; a Smi has `smi_tag` in its
    // `smi_tag_mask` bits and its value shifted left by `smi_shift`
    // (`SmiShiftSize` + `SmiValueShift`: 32 on x86-64 without pointer
    // compression).
    pub heap_object_tag: u64,
    pub heap_object_tag_mask: u64,
    pub smi_tag: u64,
    pub smi_tag_mask: u64,
    pub smi_shift: u32,

    // Frame slots, from the frame pointer.
    pub off_fp_function: i64,
    pub off_fp_context: i64,
    pub off_fp_bytecode_array: i64,
    pub off_fp_bytecode_offset: i64,
    pub frame_types: FrameTypes,

    // Objects.
    pub heap_object_map: u64,
    pub map_instance_type: u64,
    pub js_function_shared: u64,
    pub js_function_context: u64,
    pub sfi_name_or_scope_info: u64,
    /// The Script (or, V8 11, the DebugInfo that holds it, or undefined).
    pub sfi_script: u64,
    /// The function's data (bytecode, uncompiled data): V8 11 only; 12
    /// on splits it into trusted and untrusted halves the metadata does
    /// not list.
    pub sfi_function_data: Option<u64>,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,
    pub string_length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub thin_actual: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub external_resource: u64,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,
    /// Where a BytecodeArray's bytecodes begin: the frame's bytecode
    /// offset counts from the array's tagged pointer, so a bytecode's
    /// index is the slot's value minus this plus the heap object tag.
    pub bytecode_array_data: u64,
    pub uncompiled_data_inferred_name: Option<u64>,
    pub uncompiled_data_start_position: Option<u64>,

    // ScopeInfo: slots (of the tagged size) after the map.
    pub scope_info_idx_nparams: u64,
    pub scope_info_idx_ncontextlocals: u64,
    pub scope_info_idx_first_vars: u64,
    /// None: a V8 version whose flags' layout is not known.
    pub scope_info_flags: Option<ScopeInfoFlags>,

    // Instance types.
    pub type_shared_function_info: u16,
    pub type_scope_info: u16,
    pub type_script: u16,
    pub type_js_function: u16,
    pub type_bytecode_array: u16,
    pub type_fixed_array: u16,
    /// A map's own map's type: a map among garbage is unlikely to have
    /// one.
    pub type_map: u16,
    pub type_debug_info: Option<u16>,
    /// The uncompiled function data types (their `inferred_name` and
    /// `start_position` are the metadata's).
    pub types_uncompiled_data: Vec<u16>,
    /// The external string types the metadata lists that keep a pointer
    /// to their characters (`resource_data`, the field after `resource`):
    /// an uncached one keeps only the resource, whose `data()` is
    /// virtual, and another type is not known to be cached.
    pub types_cached_external_string: Vec<u16>,
    pub strings: StringShape,

    /// The interpreter's entry builtins (see [`INTERPRETER_BUILTINS`]) that
    /// the file's full symbol table has, by name.
    pub interpreter_builtins: Vec<(String, CodeRange)>,

    /// V8's `Bytecodes::kBytecodeSizes` (from the file's full symbol
    /// table): the size of each bytecode with its operands, in three rows
    /// of one byte a bytecode, for operands of single, double and
    /// quadruple width. Where a baseline frame is in its bytecode is read
    /// by walking its bytecodes; not known (the reason) without it.
    pub bytecode_sizes: std::result::Result<Vec<u8>, String>,

    /// Where a frame is in its function's source, and which functions are
    /// inlined there: None for a V8 version whose layouts of these are
    /// not known (the reason).
    pub code: std::result::Result<CodeLayout, String>,
}

/// The layouts of what says where in its source a frame is: a
/// BytecodeArray's source position table, and a function's generated code
/// (V8's `Code`, its `InstructionStream`, its `DeoptimizationData`), read
/// for an optimized frame's inlined functions and position. Most come
/// from the metadata; what the metadata leaves out (a BytecodeArray's
/// table, the Code's fields before its `instruction_start` in 12 and 13)
/// is known per V8 version, in [`CodeLayout::from_metadata`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// A BytecodeArray's `source_position_table`.
    pub bytecode_positions: u64,
    /// An InstructionStream's instructions, from its start (its map, then
    /// its Code, `istream_code`, before them).
    pub istream_header: u64,
    pub istream_code: u64,
    /// The Code's fields.
    pub code_deopt: u64,
    pub code_positions: u64,
    pub code_istream: u64,
    pub code_start: u64,
    pub code_flags: u64,
    pub code_size: u64,
    /// The code's kind, in its flags: `(flags >> shift) & mask`; kinds
    /// above `kind_baseline` are the optimizing compilers' (Maglev,
    /// TurboFan).
    pub kind_mask: u32,
    pub kind_shift: u32,
    pub kind_baseline: u32,
    /// DeoptimizationData's elements: how many functions are inlined,
    /// the literals (the inlined functions' SFIs first), the optimized
    /// function's SFI (in 13, in a wrapper: its field `wrapper_shared`),
    /// the inlining positions.
    pub deopt_inlined_count: u64,
    pub deopt_literals: u64,
    pub deopt_shared: u64,
    pub wrapper_shared: Option<u64>,
    pub deopt_inlining: u64,
    pub type_code: u16,
    pub type_istream: u16,
    /// A position table's types: ByteArray, and from 12.4 TrustedByteArray.
    pub types_byte_array: Vec<u16>,
}

impl CodeLayout {
    fn from_metadata(m: &Metadata) -> Result<CodeLayout> {
        let Some(v) = m.version else {
            bail!("V8 of unknown version");
        };
        let field = |class: &str, names: &[&str]| -> Result<Option<u64>> {
            m.field(class, names)
                .map(|o| offset(o, class, names[0]))
                .transpose()
        };
        // A BytecodeArray: in 11 a FixedArrayBase (map, length, constant
        // pool, handler table, then the positions); from 12.4 a trusted
        // object (map, length, wrapper, then the positions).
        let bytecode_positions = match (v.major, v.minor) {
            (11, _) => 32,
            (12, 4..) | (13, _) => 24,
            _ => bail!("V8 {v}: where a BytecodeArray keeps its source positions"),
        };
        let istream_header = m.need_field("InstructionStream", &["instruction_start"])?;
        let code_start = field("Code", &["instruction_start"])?;
        let (code_deopt, code_positions, code_start, code_flags, code_size) = match v.major {
            // 11: the metadata has the fields up to the instruction
            // stream (8 bytes after the positions); the start, the flags
            // (32 bits, then two of 16) and the size follow.
            11 => {
                let positions = m.need_field("Code", &["source_position_table"])?;
                let start = code_start.unwrap_or(positions + 16);
                (
                    m.need_field("Code", &["deoptimization_data"])?,
                    positions,
                    start,
                    field("Code", &["flags"])?.unwrap_or(start + 8),
                    field("Code", &["instruction_size"])?.unwrap_or(start + 16),
                )
            }
            // 12 and 13: the metadata has the start, the flags, the size;
            // the deoptimization data (or a baseline code's bytecode) and
            // the position table are the first fields after the map.
            12 | 13 => (
                8,
                16,
                code_start.context("V8 metadata: no Code instruction_start")?,
                m.need_field("Code", &["flags"])?,
                m.need_field("Code", &["instruction_size"])?,
            ),
            _ => bail!("V8 {v}: the layout of its generated code's objects"),
        };
        let code_istream = field("Code", &["instruction_stream"])?.unwrap_or(code_start - 8);
        let index = |name: &str| -> Result<u64> {
            let i = m.need(&format!("DeoptimizationData{name}Index"))?;
            if !(0..64).contains(&i) {
                bail!("V8 metadata: DeoptimizationData{name}Index is {i}");
            }
            Ok(i as u64)
        };
        let (deopt_shared, wrapper_shared) = match index("SharedFunctionInfo") {
            Ok(i) => (i, None),
            Err(_) => (
                index("WrappedSharedFunctionInfo")?,
                Some(m.need_field("SharedFunctionInfoWrapper", &["shared_info"])?),
            ),
        };
        let kind = |name: &str| -> Result<u32> {
            let k = m.need(&format!("CodeKind{name}"))?;
            u32::try_from(k).with_context(|| format!("V8 metadata: CodeKind{name} is {k}"))
        };
        Ok(CodeLayout {
            bytecode_positions,
            istream_header,
            istream_code: 8,
            code_deopt,
            code_positions,
            code_istream,
            code_start,
            code_flags,
            code_size,
            kind_mask: kind("FieldMask")?,
            kind_shift: m.get("CodeKindFieldShift").map_or(Ok(0), |s| {
                u32::try_from(s)
                    .ok()
                    .filter(|&s| s < 32)
                    .context("V8 metadata: CodeKindFieldShift")
            })?,
            kind_baseline: kind("Baseline")?,
            deopt_inlined_count: index("InlinedFunctionCount")?,
            deopt_literals: index("LiteralArray")?,
            deopt_shared,
            wrapper_shared,
            deopt_inlining: index("InliningPositions")?,
            type_code: m.need_type("Code")?,
            type_istream: m.need_type("InstructionStream")?,
            types_byte_array: [
                m.instance_type("ByteArray"),
                m.instance_type("TrustedByteArray"),
            ]
            .into_iter()
            .flatten()
            .collect(),
        })
    }
}

impl Layout {
    /// The layout of the node (or other V8-embedding) binary at `path`.
    pub fn read(path: &Path) -> Result<Layout> {
        let m = Metadata::read(path)?;
        let mut layout = Layout::from_metadata(&m)?;
        layout.interpreter_builtins = interpreter_builtins(path)?;
        layout.bytecode_sizes = bytecode_sizes(path)?;
        Ok(layout)
    }

    /// The layout that `m` describes (without the builtins' code ranges).
    pub fn from_metadata(m: &Metadata) -> Result<Layout> {
        let small = |name: &str| -> Result<u64> {
            let v = m.need(name)?;
            if !(0..=0xffff).contains(&v) {
                bail!("V8 metadata: {PREFIX}{name} is {v}");
            }
            Ok(v as u64)
        };
        // `SmiValueShift` is the tag's size (`kSmiTagSize`), `SmiShiftSize`
        // the bits between the tag and the value: 1 and 31 on x86-64
        // without pointer compression, a Smi's value in the upper half.
        let smi_shift = m.need("SmiShiftSize")? + m.get("SmiValueShift").unwrap_or(1);
        if !(1..=32).contains(&smi_shift) {
            bail!("V8 metadata: a Smi's value shifted by {smi_shift}");
        }
        let heap_object_tag = small("HeapObjectTag")?;
        let heap_object_tag_mask = small("HeapObjectTagMask")?;
        if heap_object_tag_mask == 0 || heap_object_tag & !heap_object_tag_mask != 0 {
            bail!(
                "V8 metadata: heap object tag {heap_object_tag} under mask {heap_object_tag_mask}"
            );
        }
        let frame = |name: &str| m.need(&format!("frametype_{name}"));
        let mut all: Vec<(String, i64)> = m
            .values
            .iter()
            .filter_map(|(k, &v)| Some((k.strip_prefix("frametype_")?.to_string(), v)))
            .collect();
        all.sort();
        let frame_types = FrameTypes {
            entry: frame("EntryFrame")?,
            construct_entry: frame("ConstructEntryFrame")?,
            exit: frame("ExitFrame")?,
            interpreted: frame("InterpretedFrame")?,
            baseline: frame("BaselineFrame")?,
            optimized: frame("TurbofanJSFrame").or_else(|_| {
                frame("TurbofanFrame").context("V8 metadata: no v8dbg_frametype_TurbofanJSFrame")
            })?,
            maglev: frame("MaglevFrame").ok(),
            stub: frame("StubFrame")?,
            builtin: frame("BuiltinFrame").ok(),
            builtin_exit: frame("BuiltinExitFrame").ok(),
            all,
        };
        let string_type = |name: &str| -> Result<u16> { Ok(small(name)? as u16) };
        let strings = StringShape {
            first_nonstring_type: string_type("FirstNonstringType")?,
            encoding_mask: string_type("StringEncodingMask")?,
            one_byte_tag: string_type("OneByteStringTag")?,
            two_byte_tag: string_type("TwoByteStringTag")?,
            representation_mask: string_type("StringRepresentationMask")?,
            seq_tag: string_type("SeqStringTag")?,
            cons_tag: string_type("ConsStringTag")?,
            external_tag: string_type("ExternalStringTag")?,
            sliced_tag: string_type("SlicedStringTag")?,
            thin_tag: string_type("ThinStringTag")?,
        };
        let optional = |class: &str, field: &str| -> Result<Option<u64>> {
            m.field(class, &[field])
                .map(|v| offset(v, class, field))
                .transpose()
        };
        let idx = |name: &str| -> Result<u64> {
            let v = small(name)?;
            if v > 64 {
                bail!("V8 metadata: {PREFIX}{name} is {v}");
            }
            Ok(v)
        };
        let fixed_array_length = m.need_field("FixedArrayBase", &["length"])?;
        let fixed_array_data = m.need_field("FixedArray", &["data"])?;
        // A FixedArray is its map, its length and its elements, each a
        // tagged value: 8 bytes apart unless pointers are compressed,
        // which node's builds do not and this reading does not handle.
        if fixed_array_data.checked_sub(fixed_array_length) != Some(8) {
            bail!("V8 with compressed pointers (a FixedArray's elements at {fixed_array_data})");
        }
        Ok(Layout {
            version: m.version,
            heap_object_tag,
            heap_object_tag_mask,
            smi_tag: small("SmiTag")?,
            smi_tag_mask: small("SmiTagMask")?,
            smi_shift: smi_shift as u32,
            off_fp_function: fp_offset(m, "off_fp_function")?,
            off_fp_context: fp_offset(m, "off_fp_context")?,
            off_fp_bytecode_array: fp_offset(m, "off_fp_bytecode_array")?,
            off_fp_bytecode_offset: fp_offset(m, "off_fp_bytecode_offset")?,
            frame_types,
            heap_object_map: m.need_field("HeapObject", &["map"])?,
            map_instance_type: m.need_field("Map", &["instance_type"])?,
            js_function_shared: m.need_field("JSFunction", &["shared"])?,
            js_function_context: m.need_field("JSFunction", &["context"])?,
            sfi_name_or_scope_info: m.need_field("SharedFunctionInfo", &["name_or_scope_info"])?,
            sfi_script: m.need_field(
                "SharedFunctionInfo",
                &["script_or_debug_info", "raw_script", "script"],
            )?,
            sfi_function_data: optional("SharedFunctionInfo", "function_data")?,
            script_name: m.need_field("Script", &["name"])?,
            script_source: m.need_field("Script", &["source"])?,
            script_line_ends: m.need_field("Script", &["line_ends"])?,
            string_length: m.need_field("String", &["length"])?,
            seq_one_byte_chars: m.need_field("SeqOneByteString", &["chars"])?,
            seq_two_byte_chars: m.need_field("SeqTwoByteString", &["chars"])?,
            cons_first: m.need_field("ConsString", &["first"])?,
            cons_second: m.need_field("ConsString", &["second"])?,
            thin_actual: m.need_field("ThinString", &["actual"])?,
            sliced_parent: m.need_field("SlicedString", &["parent"])?,
            sliced_offset: m.need_field("SlicedString", &["offset"])?,
            external_resource: m.need_field("ExternalString", &["resource"])?,
            fixed_array_length,
            fixed_array_data,
            bytecode_array_data: m.need_field("BytecodeArray", &["data"])?,
            uncompiled_data_inferred_name: optional("UncompiledData", "inferred_name")?,
            uncompiled_data_start_position: optional("UncompiledData", "start_position")?,
            scope_info_idx_nparams: idx("scopeinfo_idx_nparams")?,
            scope_info_idx_ncontextlocals: idx("scopeinfo_idx_ncontextlocals")?,
            scope_info_idx_first_vars: idx("scopeinfo_idx_first_vars")?,
            scope_info_flags: m.version.and_then(ScopeInfoFlags::for_version),
            type_shared_function_info: m.need_type("SharedFunctionInfo")?,
            type_scope_info: m.need_type("ScopeInfo")?,
            type_script: m.need_type("Script")?,
            type_js_function: m.need_type("JSFunction")?,
            type_bytecode_array: m.need_type("BytecodeArray")?,
            type_fixed_array: m.need_type("FixedArray")?,
            type_map: m.need_type("Map")?,
            type_debug_info: m.instance_type("DebugInfo"),
            types_uncompiled_data: m.instance_types("UncompiledData"),
            types_cached_external_string: [
                m.instance_types("ExternalOneByteString__"),
                m.instance_types("ExternalTwoByteString__"),
            ]
            .concat(),
            strings,
            interpreter_builtins: Vec::new(),
            bytecode_sizes: Err("not read".into()),
            code: CodeLayout::from_metadata(m).map_err(|e| format!("{e:#}")),
        })
    }

    /// Whether `v` is a heap object's tagged pointer.
    pub fn is_heap_object(&self, v: u64) -> bool {
        v & self.heap_object_tag_mask == self.heap_object_tag
    }

    /// Whether `v` is a Smi.
    pub fn is_smi(&self, v: u64) -> bool {
        v & self.smi_tag_mask == self.smi_tag
    }

    /// A Smi's value (None if `v` is not one).
    pub fn smi(&self, v: u64) -> Option<i64> {
        self.is_smi(v).then(|| (v as i64) >> self.smi_shift)
    }

    /// The bytecode's index in its BytecodeArray that an interpreted
    /// frame's bytecode offset slot (a Smi, decoded) says.
    pub fn bytecode_index(&self, frame_offset: i64) -> i64 {
        frame_offset - (self.bytecode_array_data as i64 - self.heap_object_tag as i64)
    }
}

/// V8's symbol for the bytecodes' sizes.
const BYTECODE_SIZES: &str = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE";
/// The prefix bytecodes (`Wide`, `ExtraWide`, `DebugBreakWide`,
/// `DebugBreakExtraWide`): the first four, each of one byte.
pub const BYTECODE_PREFIXES: usize = 4;

/// The bytecodes' sizes of the file (see [`Layout::bytecode_sizes`]): the
/// reason they are not known where the symbol is missing or its table
/// does not look like V8's.
fn bytecode_sizes(path: &Path) -> Result<std::result::Result<Vec<u8>, String>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let elf = Elf::read(&file)?;
    let Some(sym) = elf.symbols(&file, SymbolTable::Full, &[BYTECODE_SIZES])?[0] else {
        return Ok(Err(
            "no table of the bytecodes' sizes (a stripped binary)".into()
        ));
    };
    let count = sym.size / 3;
    if sym.size % 3 != 0 || !(BYTECODE_PREFIXES as u64 + 1..=1024).contains(&count) {
        return Ok(Err(format!(
            "a table of bytecodes' sizes of {} bytes",
            sym.size
        )));
    }
    let segments = elf.load_segments(&file)?;
    let Some(table) = read_at_vaddr(&file, &segments, sym.value, sym.size as usize) else {
        return Ok(Err(
            "the table of the bytecodes' sizes not in the file".into()
        ));
    };
    // The prefixes are one byte in every width; no bytecode is empty.
    let n = count as usize;
    if table.contains(&0)
        || (0..3).any(|row| {
            table[row * n..][..BYTECODE_PREFIXES]
                .iter()
                .any(|&b| b != 1)
        })
    {
        return Ok(Err("a table of bytecodes' sizes unlike V8's".into()));
    }
    Ok(Ok(table))
}

/// The interpreter's entry builtins in the file's full symbol table (none
/// in a stripped file).
fn interpreter_builtins(path: &Path) -> Result<Vec<(String, CodeRange)>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let elf = Elf::read(&file)?;
    let found = elf.symbols(&file, SymbolTable::Full, &INTERPRETER_BUILTINS)?;
    Ok(INTERPRETER_BUILTINS
        .iter()
        .zip(found)
        .filter_map(|(name, s)| {
            let s = s?;
            (s.size > 0).then(|| {
                (
                    name.to_string(),
                    CodeRange {
                        start: s.value,
                        size: s.size,
                    },
                )
            })
        })
        .collect())
}
