//! The few parts of an ELF file the profiler reads itself, with positioned
//! reads of only what is needed (binaries can be hundreds of MB): the
//! header, the section headers and names (for the call-frame information
//! sections, see [`crate::unwind_table`]), and the loadable segments (to
//! turn file offsets into the addresses of the file, or of its separate
//! debug file, see [`crate::symbolize`] and [`crate::unwind`]).
//! Little-endian ELF64 for x86-64 only.

use std::fs::File;
use std::os::unix::fs::FileExt;

use anyhow::{bail, Context, Result};

/// A `PT_LOAD` program header: file offset, virtual address, size in the
/// file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

const PT_LOAD: u32 = 1;
pub(crate) const ET_EXEC: u16 = 2;
pub(crate) const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const SHT_NOBITS: u32 = 8;
pub(crate) const SHF_COMPRESSED: u64 = 0x800;
const SHN_XINDEX: u32 = 0xffff;

/// The largest section read (or section header table): far beyond any
/// real program's call-frame information, and small enough that a file
/// whose headers claim more (sparse, or hostile: any user can map one
/// into a process the profiler reads) costs a refusal, not the run.
pub(crate) const MAX_SECTION_BYTES: u64 = 256 << 20;

/// A zeroed buffer of `len` bytes, or an error if it is larger than
/// `max` or cannot be allocated (never an abort).
fn buffer(len: u64, max: u64, what: &str) -> Result<Vec<u8>> {
    if len > max {
        bail!(
            "{what} claims {len} bytes, more than the {} MiB read from a file",
            max >> 20
        );
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len as usize)
        .with_context(|| format!("no memory for {what} ({len} bytes)"))?;
    v.resize(len as usize, 0);
    Ok(v)
}

/// What is needed of one section header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Section {
    name: u32,
    kind: u32,
    pub flags: u64,
    pub addr: u64,
    offset: u64,
    size: u64,
}

/// The headers of a little-endian x86-64 ELF64 file: its type, its section
/// headers and their names, and where its program headers are.
pub(crate) struct Elf {
    pub e_type: u16,
    /// Program headers: offset, entry size, count.
    phoff: u64,
    phentsize: u64,
    phnum: u64,
    sections: Vec<Section>,
    /// The section-name string table.
    names: Vec<u8>,
    len: u64,
}

impl Elf {
    pub fn read(file: &File) -> Result<Elf> {
        let len = file.metadata().context("reading the file's size")?.len();
        let mut eh = [0u8; 64];
        if len < 64 {
            bail!("not an ELF file (too short)");
        }
        file.read_exact_at(&mut eh, 0)
            .context("reading the ELF header")?;
        if &eh[..4] != b"\x7fELF" {
            bail!("not an ELF file");
        }
        if eh[4] != 2 || eh[5] != 1 {
            bail!("not a little-endian ELF64 file");
        }
        let e_type = u16_at(&eh, 16);
        let machine = u16_at(&eh, 18);
        if machine != EM_X86_64 {
            bail!("not an x86-64 ELF file (e_machine {machine})");
        }
        let (phoff, phentsize, phnum) = (
            u64_at(&eh, 32),
            u64::from(u16_at(&eh, 54)),
            u64::from(u16_at(&eh, 56)),
        );
        let shoff = u64_at(&eh, 40);
        let shentsize = u64::from(u16_at(&eh, 58));
        let mut shnum = u64::from(u16_at(&eh, 60));
        let mut shstrndx = u32::from(u16_at(&eh, 62));
        if shoff == 0 {
            return Ok(Elf {
                e_type,
                phoff,
                phentsize,
                phnum,
                sections: Vec::new(),
                names: Vec::new(),
                len,
            });
        }
        if shentsize < 64 {
            bail!("malformed ELF: section header size {shentsize}");
        }
        let header = |i: u64| -> Result<[u8; 64]> {
            let mut h = [0u8; 64];
            let at = i
                .checked_mul(shentsize)
                .and_then(|o| o.checked_add(shoff))
                .filter(|o| o.checked_add(64).is_some_and(|e| e <= len))
                .context("malformed ELF: section header beyond the end of the file")?;
            file.read_exact_at(&mut h, at)
                .context("reading a section header")?;
            Ok(h)
        };
        // More than 0xff00 sections, or a name table index beyond that:
        // the real values are in section 0.
        if shnum == 0 || shstrndx == SHN_XINDEX {
            let h0 = header(0)?;
            if shnum == 0 {
                shnum = u64_at(&h0, 32);
            }
            if shstrndx == SHN_XINDEX {
                shstrndx = u32_at(&h0, 40);
            }
        }
        let table_len = shnum
            .checked_mul(shentsize)
            .filter(|&n| shoff.checked_add(n).is_some_and(|e| e <= len))
            .context("malformed ELF: section headers beyond the end of the file")?;
        let mut raw = buffer(table_len, MAX_SECTION_BYTES, "the section headers")?;
        file.read_exact_at(&mut raw, shoff)
            .context("reading the section headers")?;
        let sections: Vec<Section> = raw
            .chunks_exact(shentsize as usize)
            .map(|h| Section {
                name: u32_at(h, 0),
                kind: u32_at(h, 4),
                flags: u64_at(h, 8),
                addr: u64_at(h, 16),
                offset: u64_at(h, 24),
                size: u64_at(h, 32),
            })
            .collect();
        let mut elf = Elf {
            e_type,
            phoff,
            phentsize,
            phnum,
            sections,
            names: Vec::new(),
            len,
        };
        if let Some(&strtab) = elf.sections.get(shstrndx as usize) {
            if shstrndx != 0 && strtab.kind != SHT_NOBITS {
                elf.names = elf.read_section(file, strtab)?;
            }
        }
        Ok(elf)
    }

    /// The first section named `name` that has contents in the file.
    pub fn section(&self, name: &str) -> Option<Section> {
        self.sections
            .iter()
            .find(|s| s.kind != SHT_NOBITS && self.name(s) == Some(name.as_bytes()))
            .copied()
    }

    fn name(&self, s: &Section) -> Option<&[u8]> {
        let rest = self.names.get(s.name as usize..)?;
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    }

    pub fn read_section(&self, file: &File, s: Section) -> Result<Vec<u8>> {
        if s.offset.checked_add(s.size).is_none_or(|e| e > self.len) {
            bail!("malformed ELF: a section lies beyond the end of the file");
        }
        let mut data = buffer(s.size, MAX_SECTION_BYTES, "a section")?;
        file.read_exact_at(&mut data, s.offset)
            .context("reading a section")?;
        Ok(data)
    }

    /// The loadable segments (`PT_LOAD`).
    pub fn load_segments(&self, file: &File) -> Result<Vec<Segment>> {
        if self.phentsize < 56 || self.phnum > 256 {
            bail!("malformed ELF: program header size {}", self.phentsize);
        }
        let mut ph = vec![0u8; (self.phentsize * self.phnum) as usize];
        file.read_exact_at(&mut ph, self.phoff)
            .context("reading the program headers")?;
        Ok(ph
            .chunks(self.phentsize as usize)
            .filter(|h| u32_at(h, 0) == PT_LOAD)
            .map(|h| Segment {
                offset: u64_at(h, 8),
                vaddr: u64_at(h, 16),
                filesz: u64_at(h, 32),
            })
            .collect())
    }
}

/// The loadable segments of an ELF file, if it is one this module reads.
pub(crate) fn load_segments(file: &File) -> Option<Vec<Segment>> {
    Elf::read(file).ok()?.load_segments(file).ok()
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `LOAD` rows of `readelf -lW`: (offset, virtual address, size in
    /// the file); None if readelf is missing (a failure under CI=true).
    fn readelf_loads(path: &str) -> Option<Vec<(u64, u64, u64)>> {
        let out = match std::process::Command::new("readelf")
            .args(["-lW", path])
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(!ci, "readelf (binutils) is needed to check the segments");
                eprintln!("skipped: readelf not found");
                return None;
            }
            Err(e) => panic!("readelf: {e}"),
        };
        assert!(out.status.success(), "readelf -lW {path} failed");
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .filter(|t| t.first() == Some(&"LOAD"))
                .map(|t| (hex(t[1]), hex(t[2]), hex(t[4])))
                .collect(),
        )
    }

    /// The loadable segments are readelf's, field by field: of this test
    /// executable (a PIE whose later segments are placed at an address
    /// other than their offset, so the two cannot be confused) and of libc.
    #[test]
    fn load_segments_match_readelf() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        for path in [exe.to_str().unwrap(), "/lib/x86_64-linux-gnu/libc.so.6"] {
            let Some(want) = readelf_loads(path) else {
                return;
            };
            let segments = load_segments(&File::open(path).unwrap()).expect("an ELF64 file");
            let got: Vec<_> = segments
                .iter()
                .map(|s| (s.offset, s.vaddr, s.filesz))
                .collect();
            assert!(want.len() >= 2, "{path}: {want:x?}");
            assert_eq!(got, want, "{path}: segments differ from readelf -lW");
            if path != "/lib/x86_64-linux-gnu/libc.so.6" {
                assert!(
                    want.iter().any(|&(off, vaddr, _)| off != vaddr),
                    "{path}: every segment at its offset: the check cannot tell them apart"
                );
            }
        }
        // Not an ELF file.
        let text = File::open("/proc/self/maps").unwrap();
        assert!(load_segments(&text).is_none());
    }

    /// An ELF header and three section headers (null, the name table,
    /// `.eh_frame` of `eh_size` bytes at 0x1000) in a sparse file of
    /// `len` bytes.
    fn sparse_elf(len: u64, eh_size: u64) -> File {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let names = b"\0.shstrtab\0.eh_frame\0";
        let mut eh = [0u8; 64];
        eh[..4].copy_from_slice(b"\x7fELF");
        eh[4] = 2; // ELF64
        eh[5] = 1; // little-endian
        eh[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        eh[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        eh[40..48].copy_from_slice(&64u64.to_le_bytes()); // shoff
        eh[58..60].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        eh[60..62].copy_from_slice(&3u16.to_le_bytes()); // shnum
        eh[62..64].copy_from_slice(&1u16.to_le_bytes()); // shstrndx
        let section = |name: u32, offset: u64, size: u64| {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&1u32.to_le_bytes()); // PROGBITS
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h
        };
        f.write_all(&eh).unwrap();
        f.write_all(&[0u8; 64]).unwrap();
        f.write_all(&section(1, 256, names.len() as u64)).unwrap();
        f.write_all(&section(11, 0x1000, eh_size)).unwrap();
        f.write_all(names).unwrap();
        f.set_len(len).unwrap();
        f
    }

    /// The largest allocation made on each thread since it was last reset
    /// (allocations are counted for this test binary, the library's unit
    /// tests, only): what reading a file cost, in one number.
    mod largest {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static LARGEST: Cell<usize> = const { Cell::new(0) };
        }

        fn note(size: usize) {
            // (Not while the thread's locals are torn down.)
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }

        /// This thread's largest allocation since the last call, in bytes.
        pub fn take() -> usize {
            LARGEST.with(|l| l.replace(0))
        }

        struct Counting;

        // SAFETY: every call is passed on to the system allocator as it is.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                // SAFETY: the caller's guarantees, passed on.
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                // SAFETY: the caller's guarantees, passed on.
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                note(new_size);
                // SAFETY: the caller's guarantees, passed on.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: the caller's guarantees, passed on.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;
    }

    /// A section whose header puts 100 MiB of it beyond the end of a 12 KiB
    /// file (under the 256 MiB a section may have) is refused as such,
    /// before any buffer is allocated for it: a file any user can map into
    /// a process the profiler reads costs nothing to read.
    #[test]
    fn a_section_beyond_the_end_of_the_file_is_refused_before_allocating() {
        let f = sparse_elf(0x3000, 100 << 20);
        let elf = Elf::read(&f).expect("headers");
        let eh = elf.section(".eh_frame").expect("the section");
        largest::take();
        let err = elf.read_section(&f, eh).unwrap_err();
        let cost = largest::take();
        assert!(
            cost < 64 << 10,
            "{cost} bytes allocated at once to read a section that is not in the file ({err:#})"
        );
        assert!(
            format!("{err:#}").contains("a section lies beyond the end of the file"),
            "{err:#}"
        );
        assert!(crate::unwind_table::build(&f).is_err());
        let cost = largest::take();
        assert!(
            cost < 1 << 20,
            "{cost} bytes allocated at once to build tables from a section not in the file"
        );
    }

    #[test]
    fn a_section_claiming_a_terabyte_is_refused_not_allocated() {
        // Any user can map such a file into a process the profiler reads.
        let f = sparse_elf((1 << 40) + 0x2000, 1 << 40);
        let elf = Elf::read(&f).expect("headers");
        let eh = elf.section(".eh_frame").expect("the section");
        let err = elf.read_section(&f, eh).unwrap_err();
        assert!(
            format!("{err:#}").contains("more than the 256 MiB"),
            "{err:#}"
        );
        assert!(crate::unwind_table::build(&f).is_err());
        // Within the limit, the (empty) contents are read.
        let f = sparse_elf(0x3000, 0x1000);
        let elf = Elf::read(&f).unwrap();
        let eh = elf.section(".eh_frame").unwrap();
        assert_eq!(elf.read_section(&f, eh).unwrap().len(), 0x1000);
    }
}
