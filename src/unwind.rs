//! DWARF unwind tables for the BPF program (`--unwind dwarf`).
//!
//! Each object (file) a process maps is turned into a table once
//! ([`unwind_table::build`]) and appended to the shared rows; each process
//! gets its executable mappings, sorted, each pointing at its object's rows
//! with the bias that turns an address into the object's own virtual
//! address. The BPF program unwinds a process only once it has its entry;
//! blocks before that are walked with frame pointers, and counted.
//!
//! Memory is fixed at load ([`UnwindCapacity`]): when it is full, new
//! objects get no table (frame pointers are followed through them) and new
//! processes get none at all, and [`Unwinder::not_covered`] says which.

use std::collections::{HashMap, HashSet};

use crate::bpf::types;
use crate::elf::{load_segments, Segment};
use crate::symbolize::{ExecMapping, Symbolizer};
use crate::tracer::UnwindStore;
use crate::unwind_table;

/// An object's table in the shared rows.
#[derive(Clone, Debug)]
struct ObjectTable {
    row_start: u32,
    row_count: u32,
    segments: Vec<Segment>,
}

/// Why an object or a process has no tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotCovered {
    pub tgid: u32,
    pub what: String,
    pub why: String,
}

/// Table statistics, for `-v`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UnwindStats {
    pub objects: usize,
    pub objects_without_cfi: usize,
    pub rows: usize,
    pub row_capacity: usize,
    pub mappings: usize,
    pub mapping_capacity: usize,
    pub processes: usize,
    /// Time spent building tables.
    pub build_ms: f64,
}

pub struct Unwinder {
    store: UnwindStore,
    rows_used: usize,
    mappings_used: usize,
    /// By symbolizer object id; None: no table (no CFI, unreadable, or no
    /// room left).
    objects: HashMap<u32, Option<ObjectTable>>,
    /// Processes dealt with, and the mappings they were dealt with for.
    processes: HashMap<u32, Vec<ExecMapping>>,
    /// Processes with tables.
    covered: HashSet<u32>,
    not_covered: Vec<NotCovered>,
    stats: UnwindStats,
}

impl Unwinder {
    pub fn new(mut store: UnwindStore) -> Unwinder {
        let stats = UnwindStats {
            row_capacity: store.rows().len(),
            mapping_capacity: store.mappings().len(),
            ..UnwindStats::default()
        };
        Unwinder {
            store,
            rows_used: 0,
            mappings_used: 0,
            objects: HashMap::new(),
            processes: HashMap::new(),
            covered: HashSet::new(),
            not_covered: Vec::new(),
            stats,
        }
    }

    /// Gives the BPF program the tables of `tgid`'s mappings as `sym` last
    /// snapshotted them (call [`Symbolizer::note_process`] first), unless
    /// it has them already for these same mappings. Without `may_build`,
    /// only if every file mapped has its table already (a quick update):
    /// returns false if it had to leave the process for later.
    pub fn note_process(&mut self, sym: &Symbolizer, tgid: u32, may_build: bool) -> bool {
        if tgid == 0 {
            return true;
        }
        let mappings = sym.mappings(tgid);
        if mappings.is_empty() || self.processes.get(&tgid) == Some(&mappings) {
            return true;
        }
        if !may_build
            && mappings
                .iter()
                .any(|m| !self.objects.contains_key(&m.object))
        {
            return false;
        }
        let began = std::time::Instant::now();
        let mut entries = Vec::with_capacity(mappings.len());
        for m in &mappings {
            let mut e = types::unwind_mapping {
                start: m.start,
                end: m.end,
                ..Default::default()
            };
            if let Some(t) = self.object_table(sym, tgid, m.object) {
                if let Some(bias) = bias(&t.segments, m) {
                    e.bias = bias;
                    e.row_start = t.row_start;
                    e.row_count = t.row_count;
                }
            }
            entries.push(e);
        }
        self.stats.build_ms += began.elapsed().as_secs_f64() * 1e3;
        // Whatever happens, these mappings are dealt with: a process that
        // cannot be covered is not tried (and reported) again until they
        // change.
        match self.store_process(tgid, &entries) {
            Ok(()) => {
                self.covered.insert(tgid);
                self.stats.processes = self.covered.len();
            }
            Err(why) => self.refuse(tgid, "the process", why),
        }
        self.processes.insert(tgid, mappings);
        true
    }

    /// Writes a process's mappings and points it at them.
    fn store_process(
        &mut self,
        tgid: u32,
        entries: &[types::unwind_mapping],
    ) -> Result<(), String> {
        let count = entries.len();
        if count > types::unwind_limits::UNWIND_MAX_PROC_MAPPINGS.0 as usize {
            return Err(format!("{count} executable mappings"));
        }
        let start = self.mappings_used;
        let slots = self.store.mappings();
        if start + count > slots.len() {
            return Err("the unwind tables are full (--unwind-memory)".into());
        }
        slots[start..start + count].copy_from_slice(entries);
        self.mappings_used += count;
        self.stats.mappings = self.mappings_used;
        self.store
            .set_process(tgid, start as u32, count as u32)
            .map_err(|e| format!("{e:#}"))
    }

    /// The table of `object`, built the first time it is seen.
    fn object_table(&mut self, sym: &Symbolizer, tgid: u32, object: u32) -> Option<&ObjectTable> {
        if !self.objects.contains_key(&object) {
            let table = self.build_object(sym, tgid, object);
            if table.is_none() {
                self.stats.objects_without_cfi += 1;
            } else {
                self.stats.objects += 1;
            }
            self.objects.insert(object, table);
        }
        self.objects.get(&object).and_then(Option::as_ref)
    }

    fn build_object(&mut self, sym: &Symbolizer, tgid: u32, object: u32) -> Option<ObjectTable> {
        let file = sym.object_file(object)?;
        let segments = load_segments(file)?;
        let rows = match unwind_table::build(file) {
            Ok(Some((rows, _))) => rows,
            Ok(None) => return None,
            Err(e) => {
                let name = sym.object_name(object).to_string();
                self.refuse(tgid, &name, format!("{e:#}"));
                return None;
            }
        };
        let start = self.rows_used;
        let slots = self.store.rows();
        if rows.len() > types::unwind_limits::UNWIND_MAX_OBJECT_ROWS.0 as usize
            || start + rows.len() > slots.len()
        {
            let name = sym.object_name(object).to_string();
            self.refuse(
                tgid,
                &name,
                format!(
                    "its {} unwind rows do not fit (--unwind-memory)",
                    rows.len()
                ),
            );
            return None;
        }
        for (slot, r) in slots[start..start + rows.len()].iter_mut().zip(&rows) {
            *slot = types::unwind_row {
                pc: r.pc,
                cfa_off: r.cfa_off,
                kind: r.kind,
                rbp_off: r.rbp_off,
            };
        }
        self.rows_used += rows.len();
        self.stats.rows = self.rows_used;
        Some(ObjectTable {
            row_start: start as u32,
            row_count: rows.len() as u32,
            segments,
        })
    }

    fn refuse(&mut self, tgid: u32, what: &str, why: String) {
        self.not_covered.push(NotCovered {
            tgid,
            what: what.to_string(),
            why,
        });
    }

    /// Objects and processes left without tables, in the order met.
    pub fn not_covered(&self) -> &[NotCovered] {
        &self.not_covered
    }

    pub fn stats(&self) -> UnwindStats {
        self.stats
    }
}

/// What to subtract from an address in mapping `m` to get the object's
/// virtual address: the mapping's file offset located in a loadable
/// segment. A segment's file offset need not be page-aligned while the
/// mapping's is, so the page a segment starts in may also hold the end of
/// the one before (linkers such as lld pack them): the last segment that
/// the mapping's first page reaches is the one mapped.
fn bias(segments: &[Segment], m: &ExecMapping) -> Option<u64> {
    let s = segments
        .iter()
        .rfind(|s| m.file_offset >= s.offset & !0xfff && m.file_offset < s.offset + s.filesz)?;
    Some(
        m.start
            .wrapping_sub(m.file_offset)
            .wrapping_sub(s.vaddr.wrapping_sub(s.offset)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_of_a_shared_library_text_mapping() {
        // libc: text at file offset 0x28000, vaddr 0x28000, mapped at
        // 0x7f00_0002_8000.
        let segments = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x28000,
            },
            Segment {
                offset: 0x28000,
                vaddr: 0x28000,
                filesz: 0x15_0000,
            },
        ];
        let m = ExecMapping {
            start: 0x7f00_0002_8000,
            end: 0x7f00_0017_8000,
            file_offset: 0x28000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0x7f00_0000_0000));
    }

    #[test]
    fn bias_where_vaddr_and_offset_differ() {
        // A non-PIE executable: text at file offset 0x1000, vaddr 0x401000.
        let segments = [Segment {
            offset: 0x1000,
            vaddr: 0x401000,
            filesz: 0x2000,
        }];
        let m = ExecMapping {
            start: 0x401000,
            end: 0x403000,
            file_offset: 0x1000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0));
        let outside = ExecMapping {
            file_offset: 0x9000,
            ..m
        };
        assert_eq!(bias(&segments, &outside), None);
    }

    #[test]
    fn bias_of_a_text_segment_sharing_a_page_with_the_one_before() {
        // lld's layout: read-only data up to 0x4a5b0, text from file
        // offset 0x4a5c0 at vaddr 0x4b5c0; the text mapping starts at the
        // page holding both.
        let segments = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x4a5b0,
            },
            Segment {
                offset: 0x4a5c0,
                vaddr: 0x4b5c0,
                filesz: 0x9_0000,
            },
        ];
        let m = ExecMapping {
            start: 0x5555_5559_f000,
            end: 0x5555_5563_0000,
            file_offset: 0x4a000,
            object: 0,
        };
        assert_eq!(bias(&segments, &m), Some(0x5555_5559_f000 - 0x4b000));
    }
}
