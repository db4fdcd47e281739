//! The few parts of an ELF file the profiler reads itself, with positioned
//! reads of only what is needed (binaries can be hundreds of MB): the
//! header, the section headers and names (for the call-frame information
//! sections, see [`crate::unwind_table`]), and the loadable segments (to
//! turn file offsets into the addresses of the file, or of its separate
//! debug file, see [`crate::symbolize`] and [`crate::unwind`]), and a
//! few symbols looked up by name (the interpreter's globals, see
//! `crate::python`). Little-endian ELF64 for x86-64 only.

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
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
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
    /// For a symbol table, the index of its string table.
    link: u32,
}

/// A defined symbol: its value (an address of the file) and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Symbol {
    pub value: u64,
    pub size: u64,
}

/// The size of an `Elf64_Sym`.
const SYM_SIZE: u64 = 24;

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
                link: u32_at(h, 40),
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

    /// Where section `s` lies in the file (offset, size), where it lies
    /// within it.
    pub fn section_extent(&self, s: Section) -> Option<(u64, u64)> {
        s.offset
            .checked_add(s.size)
            .is_some_and(|e| e <= self.len)
            .then_some((s.offset, s.size))
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

    /// The bytes of symbol table `table` and of its string table; None
    /// where the file has no such table.
    fn symbol_table(&self, file: &File, table: SymbolTable) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let kind = match table {
            SymbolTable::Dynamic => SHT_DYNSYM,
            SymbolTable::Full => SHT_SYMTAB,
        };
        let Some(&symbols) = self.sections.iter().find(|s| s.kind == kind) else {
            return Ok(None);
        };
        let strings = self
            .sections
            .get(symbols.link as usize)
            .filter(|s| symbols.link != 0 && s.kind == SHT_STRTAB)
            .copied()
            .context("malformed ELF: a symbol table without its string table")?;
        Ok(Some((
            self.read_section(file, symbols)?,
            self.read_section(file, strings)?,
        )))
    }

    /// The first defined symbol of each of `names` in one symbol table
    /// (None where there is none, or where the file has no such table).
    /// The table and its string table are read whole, each bounded by
    /// [`MAX_SECTION_BYTES`]: `.dynsym` is small (what other objects may
    /// link against), `.symtab` can be tens of MB in a large program, so
    /// it is worth reading only for a file already known to be of
    /// interest.
    pub fn symbols(
        &self,
        file: &File,
        table: SymbolTable,
        names: &[&str],
    ) -> Result<Vec<Option<Symbol>>> {
        let mut found = vec![None; names.len()];
        let Some((symbols, strings)) = self.symbol_table(file, table)? else {
            return Ok(found);
        };
        let mut left = names.len();
        for sym in symbols.chunks_exact(SYM_SIZE as usize) {
            if left == 0 {
                break;
            }
            // SHN_UNDEF: a reference to another object's symbol.
            if u16_at(sym, 6) == 0 {
                continue;
            }
            let Some(rest) = strings.get(u32_at(sym, 0) as usize..) else {
                continue;
            };
            let Some(end) = rest.iter().position(|&b| b == 0) else {
                continue;
            };
            let name = &rest[..end];
            for (i, want) in names.iter().enumerate() {
                if found[i].is_none() && name == want.as_bytes() {
                    found[i] = Some(Symbol {
                        value: u64_at(sym, 8),
                        size: u64_at(sym, 16),
                    });
                    left -= 1;
                }
            }
        }
        Ok(found)
    }

    /// Every defined symbol of one symbol table whose name begins with
    /// `prefix`, with its name, and whether its section is zero-filled
    /// (`SHT_NOBITS`, `.bss`: the file holds no bytes of it, the loader
    /// maps zeros). For families of symbols that no list of names can
    /// name in advance: V8's post-mortem metadata (`v8dbg_*`) differs from
    /// release to release. Bounded like [`Elf::symbols`].
    pub fn symbols_with_prefix(
        &self,
        file: &File,
        table: SymbolTable,
        prefix: &str,
    ) -> Result<Vec<(String, Symbol, bool)>> {
        let mut found = Vec::new();
        let Some((symbols, strings)) = self.symbol_table(file, table)? else {
            return Ok(found);
        };
        for sym in symbols.chunks_exact(SYM_SIZE as usize) {
            let shndx = u16_at(sym, 6);
            if shndx == 0 {
                continue;
            }
            let Some(rest) = strings.get(u32_at(sym, 0) as usize..) else {
                continue;
            };
            let Some(end) = rest.iter().position(|&b| b == 0) else {
                continue;
            };
            let name = &rest[..end];
            if !name.starts_with(prefix.as_bytes()) {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            let zero_filled = self
                .sections
                .get(usize::from(shndx))
                .is_some_and(|s| s.kind == SHT_NOBITS);
            found.push((
                name.to_string(),
                Symbol {
                    value: u64_at(sym, 8),
                    size: u64_at(sym, 16),
                },
                zero_filled,
            ));
        }
        Ok(found)
    }

    /// Every function of the full symbol table with an address (tests
    /// that look at every function of a library).
    #[cfg(test)]
    pub fn function_symbols(&self, file: &File) -> Result<Vec<Symbol>> {
        let Some((symbols, _)) = self.symbol_table(file, SymbolTable::Full)? else {
            return Ok(Vec::new());
        };
        Ok(symbols
            .chunks_exact(SYM_SIZE as usize)
            .filter(|s| s[4] & 0xf == 2 && u64_at(s, 8) != 0)
            .map(|s| Symbol {
                value: u64_at(s, 8),
                size: u64_at(s, 16),
            })
            .collect())
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

/// Which symbol table [`Elf::symbols`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymbolTable {
    /// `.dynsym`: the exported symbols (and imports), kept by `strip`.
    Dynamic,
    /// `.symtab`: every symbol, local ones too; gone from stripped files.
    Full,
}

/// The bytes at the file's address `vaddr` (`len` of them, at most 1 MiB),
/// as the loader maps them from the file: None where a segment does not
/// hold them all in the file (zero-filled memory, or no segment at all).
pub(crate) fn read_at_vaddr(
    file: &File,
    segments: &[Segment],
    vaddr: u64,
    len: usize,
) -> Option<Vec<u8>> {
    if len > 1 << 20 {
        return None;
    }
    let end = vaddr.checked_add(len as u64)?;
    let seg = segments
        .iter()
        .find(|s| s.vaddr <= vaddr && s.vaddr.checked_add(s.filesz).is_some_and(|e| end <= e))?;
    let at = seg.offset.checked_add(vaddr - seg.vaddr)?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, at).ok()?;
    Some(buf)
}

/// The load bias of an object (what to add to an address of the file to
/// get the process's) from one of its mappings: `start`, mapping the file
/// from `file_offset` (as `/proc/PID/maps` gives them). The mapping is of
/// the segment whose bytes in the file it begins with (its offset rounded
/// down to the page); None if no segment's are.
pub(crate) fn load_bias(segments: &[Segment], start: u64, file_offset: u64) -> Option<u64> {
    let seg = segments.iter().find(|s| {
        let page = s.offset & !0xfff;
        page <= file_offset && file_offset < s.offset.saturating_add(s.filesz.max(1))
    })?;
    Some(
        start
            .wrapping_add(seg.offset)
            .wrapping_sub(file_offset)
            .wrapping_sub(seg.vaddr),
    )
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

    /// `nm`'s (value, size) of `name` in `path` (`-D`: the dynamic table),
    /// None if nm is missing (a failure under CI=true).
    fn nm_symbol(path: &str, dynamic: bool, name: &str) -> Option<Option<(u64, u64)>> {
        let mut cmd = std::process::Command::new("nm");
        if dynamic {
            cmd.arg("-D");
        }
        let out = match cmd.arg("-S").arg(path).output() {
            Ok(out) => out,
            Err(_) => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(!ci, "nm (binutils) is needed to check the symbols");
                eprintln!("skipped: nm not found");
                return None;
            }
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|t| t.len() == 4 && t[2] != "U" && t[3].split('@').next() == Some(name))
                .map(|t| (hex(t[0]), hex(t[1]))),
        )
    }

    /// Symbols by name are nm's: libc's exported ones (`.dynsym`, also
    /// where it has no `.symtab`), and this test executable's own, local
    /// ones included (`.symtab`); an undefined import is not found, nor a
    /// name no table has.
    #[test]
    fn symbols_match_nm() {
        let libc = "/lib/x86_64-linux-gnu/libc.so.6";
        let f = File::open(libc).unwrap();
        let elf = Elf::read(&f).unwrap();
        let names = ["malloc", "pthread_getspecific", "environ", "no such symbol"];
        let got = elf.symbols(&f, SymbolTable::Dynamic, &names).unwrap();
        for (name, got) in names.iter().zip(got) {
            let Some(want) = nm_symbol(libc, true, name) else {
                return;
            };
            assert_eq!(got.map(|s| (s.value, s.size)), want, "{name}");
        }
        assert!(elf.symbols(&f, SymbolTable::Dynamic, &["malloc"]).unwrap()[0].is_some());

        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_str().unwrap();
        let f = File::open(exe).unwrap();
        let elf = Elf::read(&f).unwrap();
        let names = ["main", "rust_begin_unwind", "malloc"];
        let full = elf.symbols(&f, SymbolTable::Full, &names).unwrap();
        for (name, got) in names.iter().zip(&full) {
            let Some(want) = nm_symbol(exe, false, name) else {
                return;
            };
            assert_eq!(got.map(|s| (s.value, s.size)), want, "{name}");
        }
        assert!(full[0].is_some() && full[2].is_none(), "{full:?}");
        // malloc is an import: in .dynsym, but undefined.
        let dynamic = elf.symbols(&f, SymbolTable::Dynamic, &["malloc"]).unwrap();
        assert_eq!(dynamic, vec![None]);
    }

    /// A file with no section headers has no symbols (and no error); the
    /// bytes at an address come from the segment that holds them in the
    /// file, not from beyond it.
    #[test]
    fn symbols_and_data_of_odd_files() {
        let f = sparse_elf(0x3000, 0x1000);
        let elf = Elf::read(&f).unwrap();
        assert_eq!(
            elf.symbols(&f, SymbolTable::Full, &["x"]).unwrap(),
            vec![None]
        );
        let segments = [Segment {
            offset: 0x1000,
            vaddr: 0x40_1000,
            filesz: 0x100,
        }];
        assert!(read_at_vaddr(&f, &segments, 0x40_1000, 0x100).is_some());
        assert!(read_at_vaddr(&f, &segments, 0x40_10f8, 8).is_some());
        assert!(read_at_vaddr(&f, &segments, 0x40_10f9, 8).is_none());
        assert!(read_at_vaddr(&f, &segments, 0x40_0fff, 8).is_none());
        assert!(read_at_vaddr(&f, &segments, u64::MAX - 3, 8).is_none());
        assert!(read_at_vaddr(&f, &segments, 0x40_1000, 2 << 20).is_none());
        // Load biases: of a PIE's second mapping, of a non-PIE's.
        let pie = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x1234,
            },
            Segment {
                offset: 0x2040,
                vaddr: 0x3040,
                filesz: 0x500,
            },
        ];
        assert_eq!(load_bias(&pie, 0x7f00_0000_0000, 0), Some(0x7f00_0000_0000));
        assert_eq!(
            load_bias(&pie, 0x7f00_0000_3000, 0x2000),
            Some(0x7f00_0000_0000)
        );
        assert_eq!(load_bias(&pie, 0x7f00_0000_9000, 0x9000), None);
        let exec = [Segment {
            offset: 0,
            vaddr: 0x40_0000,
            filesz: 0x1000,
        }];
        assert_eq!(load_bias(&exec, 0x40_0000, 0), Some(0));
    }

    /// Symbol lookups over mutated section headers and symbol tables of
    /// libc: an answer or an error, never a panic, within bounded memory.
    #[test]
    fn symbols_of_mutated_files() {
        use std::io::Write;
        let original = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let shoff = u64_at(&original, 40) as usize;
        let shnum = usize::from(u16_at(&original, 60));
        let elf = Elf::read(&File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap();
        let dynsym = elf.sections.iter().find(|s| s.kind == SHT_DYNSYM).unwrap();
        let areas = [
            (0, 64),
            (shoff, shnum * 64),
            (dynsym.offset as usize, 64 * 24),
        ];
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&original).unwrap();
        let mut rng = crate::hostile::Rng(0x9e37_79b9_7f4a_7c15);
        let mut next = || rng.next();
        let values = [
            0u64,
            1,
            0xff,
            0xffff,
            0x7fff_ffff,
            0xffff_ffff,
            1 << 40,
            u64::MAX,
        ];
        for _ in 0..400 {
            let (start, len) = areas[(next() % 3) as usize];
            let at = start + (next() as usize % len) / 8 * 8;
            let v = values[(next() % values.len() as u64) as usize];
            let width = [1usize, 2, 4, 8][(next() % 4) as usize];
            f.write_all_at(&v.to_le_bytes()[..width], at as u64)
                .unwrap();
            largest::take();
            if let Ok(elf) = Elf::read(&f) {
                for table in [SymbolTable::Dynamic, SymbolTable::Full] {
                    let _ = elf.symbols(&f, table, &["malloc", "free"]);
                }
            }
            let cost = largest::take();
            assert!(cost <= original.len(), "{cost} bytes at once");
            f.write_all_at(&original[at..at + width], at as u64)
                .unwrap();
        }
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
