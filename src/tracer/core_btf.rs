//! The kernel's types the BPF object's CO-RE relocations can match, for
//! libbpf to relocate each object against (`btf_custom_path`): a few
//! hundred types instead of the kernel's whole BTF, searched once per
//! object for each type relocated (see [`crate::btf`]). Built once per
//! run, at the first object opened, and kept in a memory file.
//!
//! Where it cannot be built (no kernel BTF to read here, a kind this
//! reader does not know, a type the kernel has only in a module), libbpf
//! relocates against the kernel's BTF as it would without it; `-v` says
//! why.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};

use crate::btf;

/// The kernel's types for CO-RE, in a memory file.
pub(super) struct KernelTypes {
    /// Keeps the memory file open for its path.
    _file: std::fs::File,
    /// `/proc/self/fd/N`, for libbpf to read.
    pub(super) path: std::path::PathBuf,
    /// How many types these are, of how many.
    pub(super) kept: usize,
    pub(super) of: usize,
}

/// The kernel's ids of the types the program casts to (0 where unknown).
#[derive(Default, Clone, Copy)]
struct KernelIds {
    task_struct: u32,
    pt_regs: u32,
}

/// What was read of the kernel's BTF: the kernel's ids of the types cast
/// to, and its types for CO-RE or why there are none.
type Read = (KernelIds, std::result::Result<KernelTypes, String>);

static TYPES: OnceLock<Read> = OnceLock::new();

fn read() -> &'static Read {
    TYPES.get_or_init(|| {
        let mut ids = KernelIds::default();
        let types = build(&mut ids).map_err(|e| format!("{e:#}"));
        (ids, types)
    })
}

/// The kernel's types for CO-RE, or why there are none (each object is
/// then relocated against the kernel's whole BTF).
pub(super) fn kernel_types() -> std::result::Result<&'static KernelTypes, &'static str> {
    read().1.as_ref().map_err(|e| e.as_str())
}

/// What `-v` says of the types the objects were relocated against.
pub(super) fn describe() -> String {
    match kernel_types() {
        Ok(t) => format!(
            // wording: a count never 1
            "CO-RE relocations against {} of the kernel's {} types",
            t.kept, t.of
        ),
        Err(why) => format!("CO-RE relocations against the kernel's whole BTF: {why}"),
    }
}

/// The kernel's types for CO-RE; `ids` set to the kernel's ids of `struct
/// task_struct` and `struct pt_regs` once known, whatever follows.
fn build(ids: &mut KernelIds) -> Result<KernelTypes> {
    let path = "/sys/kernel/btf/vmlinux";
    let raw = Raw::read(path).with_context(|| format!("could not read {path}"))?;
    let kernel = btf::Btf::parse(raw.bytes()).map_err(|e| anyhow!("{path}: {e}"))?;
    let [task_struct, pt_regs] = kernel.find_each(btf::KIND_STRUCT, ["task_struct", "pt_regs"]);
    ids.pt_regs = pt_regs.unwrap_or(0);
    ids.task_struct = task_struct.ok_or_else(|| anyhow!("{path}: no struct task_struct"))?;
    let minimal =
        btf::minimal(&kernel, crate::bpf::CORE_TYPES).map_err(|e| anyhow!("{path}: {e}"))?;
    if let Some(name) = minimal.missing.first() {
        bail!("the kernel has no type {name}; libbpf looks for it in the modules' types");
    }
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor it
    // returns is new and owned by the File made of it.
    let fd = unsafe { libc::memfd_create(c"offcputime-btf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("could not create a memory file");
    }
    // SAFETY: see above.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(&minimal.raw)
        .context("could not write the memory file")?;
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{fd}"));
    if !path.exists() {
        bail!("{} is not there (no /proc?)", path.display());
    }
    Ok(KernelTypes {
        _file: file,
        path,
        kept: minimal.types,
        of: kernel.count(),
    })
}

/// A builder of the profiler's object that relocates it against the
/// kernel's types for CO-RE where there are some.
pub(super) fn builder() -> crate::bpf::OffcputimeSkelBuilder {
    use libbpf_rs::skel::SkelBuilder;
    let mut builder = crate::bpf::OffcputimeSkelBuilder::default();
    if let Ok(types) = kernel_types() {
        // A path without a NUL in it: this cannot fail.
        let _ = builder.object_builder_mut().btf_custom_path(&types.path);
    }
    builder
}

/// The kernel's id of `struct task_struct`, for the object's `.rodata`
/// (the program casts to it by id: a CO-RE type-id relocation against the
/// types kept would give their own id); 0 if the kernel's BTF could not
/// be read here.
pub(super) fn task_struct_id() -> u32 {
    read().0.task_struct
}

/// The kernel's id of `struct pt_regs`, for the object's `.rodata` (the
/// switch hook reads a blocked thread's kernel stack through it, see
/// `korc_word_at`); 0 if unknown.
pub(super) fn pt_regs_id() -> u32 {
    read().0.pt_regs
}

/// A file's bytes: mapped where the file can be (the kernel's BTF, from
/// Linux 6.15 on: one call, not a read per page), else read.
enum Raw {
    Mapped(*const u8, usize),
    Read(Vec<u8>),
}

impl Raw {
    fn read(path: &str) -> std::io::Result<Raw> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len() as usize;
        if len > 0 {
            // SAFETY: a private read-only mapping of an open file; it is
            // only read, within its length, and unmapped on drop.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if at != libc::MAP_FAILED {
                return Ok(Raw::Mapped(at as *const u8, len));
            }
        }
        let mut bytes = Vec::with_capacity(len);
        std::io::Read::read_to_end(&mut &file, &mut bytes)?;
        Ok(Raw::Read(bytes))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: mapped for `len` bytes, readable, until dropped.
            Raw::Mapped(at, len) => unsafe { std::slice::from_raw_parts(*at, *len) },
            Raw::Read(bytes) => bytes,
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Raw::Mapped(at, len) = *self {
            // SAFETY: the mapping made in `read`, unmapped once.
            unsafe { libc::munmap(at as *mut libc::c_void, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::libbpf_sys as sys;

    /// Each program of the object, by name, with its instructions as
    /// libbpf relocated them (the object prepared: relocated, its maps
    /// created, nothing loaded).
    fn relocated(
        builder: crate::bpf::OffcputimeSkelBuilder,
        plain: bool,
    ) -> std::result::Result<Vec<(String, Vec<sys::bpf_insn>)>, String> {
        use libbpf_rs::skel::{OpenSkel, SkelBuilder};
        use libbpf_rs::AsRawLibbpf;
        let mut object = std::mem::MaybeUninit::uninit();
        let mut open = crate::bpf::opening_plain(plain, || builder.open(&mut object))
            .map_err(|e| e.to_string())?;
        let obj = open.open_object_mut().as_libbpf_object().as_ptr();
        let mut out = Vec::new();
        // SAFETY: an open object, prepared once; its programs and their
        // instructions are read while it lives, and copied.
        unsafe {
            let rc = sys::bpf_object__prepare(obj);
            if rc != 0 {
                return Err(format!("could not prepare the object: {rc}"));
            }
            let mut prog = sys::bpf_object__next_program(obj, std::ptr::null_mut());
            while !prog.is_null() {
                let name = std::ffi::CStr::from_ptr(sys::bpf_program__name(prog));
                let insns = std::slice::from_raw_parts(
                    sys::bpf_program__insns(prog),
                    sys::bpf_program__insn_cnt(prog) as usize,
                );
                out.push((name.to_string_lossy().into_owned(), insns.to_vec()));
                prog = sys::bpf_object__next_program(obj, prog);
            }
        }
        Ok(out)
    }

    /// Relocated against the kernel's types kept, every program of the
    /// object (of each build) is what it is relocated against the
    /// kernel's whole BTF: each instruction the same, but for the
    /// descriptors of maps (each object creates its own). Needs the
    /// privilege to create maps (root, as under CI).
    #[test]
    fn relocations_against_the_types_kept_are_those_against_all() {
        let [general, plain] = [false, true].map(relocations_the_same);
        // Each build opened as asked: the plain one's switch hook is shorter.
        assert!(
            general == 0 || plain < general,
            "{plain} instructions plain, {general} general"
        );
    }

    /// The switch hook's instructions (0 where skipped).
    fn relocations_the_same(plain: bool) -> usize {
        let ci = std::env::var("CI").as_deref() == Ok("true");
        if let Err(why) = kernel_types() {
            assert!(!ci, "no kernel types for CO-RE: {why}");
            eprintln!("skipped: no kernel types for CO-RE: {why}");
            return 0;
        }
        let whole = match relocated(crate::bpf::OffcputimeSkelBuilder::default(), plain) {
            Ok(p) => p,
            Err(why) => {
                assert!(!ci, "{why} (root needed)");
                eprintln!("skipped: {why} (root needed)");
                return 0;
            }
        };
        let kept = relocated(builder(), plain).expect("relocated against the types kept");
        assert_eq!(whole.len(), kept.len());
        assert!(whole.len() > 20, "{} programs", whole.len());
        for ((name, a), (name_b, b)) in whole.iter().zip(&kept) {
            assert_eq!(name, name_b);
            assert_eq!(a.len(), b.len(), "{name}: instruction counts");
            let mut i = 0;
            while i < a.len() {
                let (x, y) = (&a[i], &b[i]);
                let what = format!("{name}: instruction {i}");
                assert_eq!(x.code, y.code, "{what}");
                assert_eq!(x._bitfield_1, y._bitfield_1, "{what}: registers");
                assert_eq!(x.off, y.off, "{what}");
                let map = x.code == 0x18 && matches!(x.src_reg(), 1 | 2 | 5 | 6);
                if map {
                    // ldimm64 of a map: its descriptor, then the offset.
                    assert_eq!(a[i + 1].imm, b[i + 1].imm, "{what}: offset into a map");
                    i += 2;
                    continue;
                }
                assert_eq!(x.imm, y.imm, "{what}");
                i += 1;
            }
        }
        assert!(task_struct_id() > 0);
        assert!(pt_regs_id() > 0);
        let hook = whole.iter().find(|(n, _)| n == "sched_switch_btf");
        hook.expect("sched_switch_btf").1.len()
    }

    /// The kernel's BTF damaged (cut short, bytes changed) is refused or
    /// read, never a panic, and never a loop without end.
    #[test]
    fn damaged_kernel_types_are_refused_not_panicked_on() {
        let Ok(raw) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no /sys/kernel/btf/vmlinux under CI"
            );
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        };
        let whole = btf::Btf::parse(&raw).unwrap();
        let kept = btf::minimal(&whole, crate::bpf::CORE_TYPES).unwrap();
        assert!(kept.missing.is_empty(), "{:?}", kept.missing);
        // The types kept read back, and hold every candidate.
        let back = btf::Btf::parse(&kept.raw).unwrap();
        assert_eq!(back.count(), kept.types);
        for &(kind, name) in crate::bpf::CORE_TYPES {
            let name = btf::essential(name.as_bytes());
            let count = |b: &btf::Btf<'_>| {
                (1..=b.count() as u32)
                    .filter(|&id| {
                        b.kind(id) == Ok(kind) && b.name(id).map(btf::essential) == Ok(name)
                    })
                    .count()
            };
            assert_eq!(
                count(&whole),
                count(&back),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..200 {
            let mut bytes = if round % 4 == 0 {
                let cut = (next() as usize) % raw.len();
                raw[..cut].to_vec()
            } else {
                raw.clone()
            };
            for _ in 0..1 + round % 8 {
                let at = (next() as usize) % bytes.len().max(1);
                if let Some(b) = bytes.get_mut(at) {
                    *b = next() as u8;
                }
            }
            // The header and the first types, where a change matters most.
            if round % 3 == 0 && bytes.len() > 64 {
                let at = (next() as usize) % 64;
                bytes[at] = next() as u8;
            }
            if let Ok(b) = btf::Btf::parse(&bytes) {
                let _ = btf::minimal(&b, crate::bpf::CORE_TYPES);
                let _ = b.find_each(btf::KIND_STRUCT, ["task_struct", "pt_regs"]);
            }
        }
    }
}
