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
        let mut raw = vec![0u8; table_len as usize];
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
        let mut data = vec![0u8; s.size as usize];
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
}
