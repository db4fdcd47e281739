//! Objects' tables written into the shared rows and found by their files,
//! and processes' mappings written and pointed at them.

use std::time::Instant;

use super::builder::Requested;
use super::{FileEntry, ObjectEntry, ObjectTable, ProcessEntry, Processes, Unwinder};
use crate::bpf::types;
use crate::elf::Segment;
use crate::process::registry::ExecMapping;
use crate::unwind_table;

/// The most rows one object's table may have.
pub(super) const MAX_OBJECT_ROWS: usize = types::unwind_limits::UNWIND_MAX_OBJECT_ROWS.0 as usize;

impl Unwinder {
    /// Records what became of an object's table, keeping its references.
    pub(super) fn settle(
        &mut self,
        object: u32,
        table: Option<ObjectTable>,
        wants_rows: Option<usize>,
        no_cfi: bool,
    ) {
        if no_cfi {
            self.stats.objects_without_cfi += 1;
        }
        let (refs, idle_since, file) = self
            .objects
            .get(&object)
            .map_or((0, Some(Instant::now()), FileEntry::Never), |e| {
                (e.refs, e.idle_since, e.file)
            });
        self.objects.insert(
            object,
            ObjectEntry {
                table,
                wants_rows,
                refs,
                idle_since,
                file,
            },
        );
        if self.objects.get(&object).is_some_and(|e| e.table.is_some()) {
            for n in &mut self.not_covered {
                if n.object == Some(object) {
                    n.later = true;
                }
            }
        }
        self.register(object);
        self.update_stats();
    }

    /// Lets the BPF program find `object`'s table by its file, for the
    /// processes that map it before their own tables are written: the
    /// rows and the segments that turn a mapping's file offset into the
    /// object's addresses (see `bias`). An object without a table gets an
    /// entry too: frame pointers are followed through it, as through a
    /// process's mapping of it.
    pub(super) fn register(&mut self, object: u32) {
        let Some(&identity) = self.identities.get(&object) else {
            return;
        };
        let Some(e) = self.objects.get(&object) else {
            return;
        };
        let mut f = types::unwind_file {
            size: identity.size,
            ..Default::default()
        };
        if let Some(t) = &e.table {
            if t.segments.len() > f.segment.len() {
                return;
            }
            f.row_start = t.row_start;
            f.row_count = t.row_count;
            f.segments = t.segments.len() as u32;
            for (slot, seg) in f.segment.iter_mut().zip(&t.segments) {
                *slot = types::unwind_file_segment {
                    start: seg.offset & !0xfff,
                    end: seg.offset.saturating_add(seg.filesz),
                    delta: seg.vaddr.wrapping_sub(seg.offset),
                };
            }
        }
        let key = types::unwind_file_key {
            dev: identity.dev,
            ino: identity.ino,
        };
        let Some(store) = self.store.as_deref_mut() else {
            return;
        };
        if store.set_file(&key, &f).is_ok() {
            if let Some(e) = self.objects.get_mut(&object) {
                e.file = FileEntry::Written(identity);
            }
        }
    }

    /// The BPF program no longer finds `object` by its file: its rows can
    /// be reused [`GRACE`] from now.
    pub(super) fn unregister(&mut self, object: u32) {
        let Some(e) = self.objects.get_mut(&object) else {
            return;
        };
        let FileEntry::Written(identity) = e.file else {
            return;
        };
        e.file = FileEntry::Removed(Instant::now());
        let key = types::unwind_file_key {
            dev: identity.dev,
            ino: identity.ino,
        };
        if let Some(store) = self.store.as_deref_mut() {
            store.remove_file(&key);
        }
    }

    /// Writes built rows into the shared table, making room from idle
    /// objects if needed: the table, or None and the rows it needs.
    /// Err: the rows fit once idle objects give their room, [`GRACE`]
    /// from now.
    #[allow(clippy::type_complexity)]
    pub(super) fn place(
        &mut self,
        req: &Requested,
        rows: Vec<unwind_table::Row>,
        segments: Vec<Segment>,
    ) -> std::result::Result<
        (Option<ObjectTable>, Option<usize>),
        (Vec<unwind_table::Row>, Vec<Segment>),
    > {
        let max = MAX_OBJECT_ROWS;
        let start = if rows.len() > max {
            None
        } else {
            self.alloc_rows(rows.len(), &[])
        };
        if start.is_none()
            && rows.len() <= max
            && (self.rows.longest_with(&self.coming()) >= rows.len()
                || self.compact(rows.len())
                || self.let_go_cold(rows.len(), req.tgid))
        {
            return Err((rows, segments));
        }
        let Some(start) = start else {
            if req.first {
                self.refuse(
                    req.tgid,
                    &req.name,
                    format!(
                        // wording: a count never 1
                        "its {} unwind rows do not fit (--unwind-memory)",
                        rows.len()
                    ),
                );
                if let Some(n) = self.not_covered.last_mut() {
                    n.object = Some(req.object);
                }
            }
            return Ok((None, (rows.len() <= max).then_some(rows.len())));
        };
        // Written a piece at a time, so that no second copy of a large
        // table is made.
        let written = rows.chunks(1 << 16).enumerate().try_for_each(|(i, chunk)| {
            let converted: Vec<types::unwind_row> = chunk.iter().map(|&r| r.into()).collect();
            self.store().write_rows(start + (i << 16), &converted)
        });
        if let Err(e) = written {
            self.rows.free(start, rows.len());
            if req.first {
                self.refuse(req.tgid, &req.name, format!("{e:#}"));
            }
            return Ok((None, None));
        }
        Ok((
            Some(ObjectTable {
                row_start: start as u32,
                row_count: rows.len() as u32,
                segments,
            }),
            None,
        ))
    }

    /// The BPF program's entries for `mappings`: each points at its
    /// object's rows, where it has a table.
    pub(super) fn entries_of(&self, mappings: &[ExecMapping]) -> Vec<types::unwind_mapping> {
        let mut entries = Vec::with_capacity(mappings.len());
        for m in mappings {
            let mut e = types::unwind_mapping {
                start: m.start,
                end: m.end,
                ..Default::default()
            };
            let table = self.objects.get(&m.object).and_then(|o| o.table.as_ref());
            if let Some(t) = table {
                if let Some(bias) = bias(&t.segments, m) {
                    e.bias = bias;
                    e.row_start = t.row_start;
                    e.row_count = t.row_count;
                }
            }
            entries.push(e);
        }
        entries
    }

    /// Writes the mappings of a process whose objects are all settled and
    /// points it at them.
    pub(super) fn install(
        &mut self,
        procs: &dyn Processes,
        tgid: u32,
        mappings: Vec<ExecMapping>,
        objects: Vec<u32>,
    ) {
        let _ = procs;

        let entries = self.entries_of(&mappings);

        for &o in &objects {
            if let Some(e) = self.objects.get_mut(&o) {
                e.refs += 1;
                e.idle_since = None;
                if matches!(e.file, FileEntry::Removed(_)) {
                    self.register(o);
                }
            }
        }
        let lacking: Vec<u32> = objects
            .iter()
            .copied()
            .filter(|o| {
                self.objects
                    .get(o)
                    .is_some_and(|e| e.table.is_none() && e.wants_rows.is_some())
            })
            .collect();
        self.let_go.remove(&tgid);
        self.pending.remove(&tgid);
        if lacking.is_empty() {
            self.retry_at.remove(&tgid);
        }
        let old = self.processes.remove(&tgid);
        if old
            .as_ref()
            .is_some_and(|o| o.lacking.len() > lacking.len() && o.mappings == mappings)
        {
            self.stats.processes_given_room += 1;
        }
        // Whatever happens, these mappings are dealt with: a process that
        // cannot be covered is not tried (and reported) again until they
        // change.
        let slice = match self.store_process(tgid, &entries) {
            Ok(slice) => {
                if old.as_ref().is_none_or(|o| o.slice.is_none()) {
                    self.stats.processes_covered += 1;
                }
                Some(slice)
            }
            Err(why) => {
                // Tables built for other mappings would be wrong now.
                self.store().remove_process(tgid);
                self.refuse(tgid, "the process", why);
                None
            }
        };
        if let Some(old) = old {
            self.release(old);
        }
        let space = self.address_spaces.get(&tgid).copied().unwrap_or_default();
        let earlier = self.earlier_spaces(tgid);
        self.processes.insert(
            tgid,
            ProcessEntry {
                mappings,
                slice,
                objects,
                space,
                earlier,
                lacking,
            },
        );
        self.update_stats();
    }

    /// Writes a process's mappings and points it at them.
    fn store_process(
        &mut self,
        tgid: u32,
        entries: &[types::unwind_mapping],
    ) -> Result<(usize, usize), String> {
        let count = entries.len();
        if count > types::unwind_limits::UNWIND_MAX_PROC_MAPPINGS.0 as usize {
            // wording: a count never 1
            return Err(format!("{count} executable mappings"));
        }
        let start = self
            .mappings
            .alloc(count)
            .ok_or("the unwind tables are full (--unwind-memory)")?;
        let written = self.store().write_mappings(start, entries).and_then(|()| {
            let space = self.address_spaces.get(&tgid).copied().unwrap_or_default();
            let image = super::image_for(&self.images, tgid, space);
            self.store()
                .set_process(tgid, start as u32, count as u32, space, image)
        });
        if let Err(e) = written {
            self.mappings.free(start, count);
            return Err(format!("{e:#}"));
        }
        self.slice_users.insert(start, 1);
        Ok((start, count))
    }
}

/// What to subtract from an address in mapping `m` to get the object's
/// virtual address: the mapping's file offset located in a loadable
/// segment. A segment's file offset need not be page-aligned while the
/// mapping's is, so the page a segment starts in may also hold the end of
/// the one before (linkers such as lld pack them): the last segment that
/// the mapping's first page reaches is the one mapped.
pub(super) fn bias(segments: &[Segment], m: &ExecMapping) -> Option<u64> {
    let s = segments.iter().rfind(|s| {
        m.file_offset >= s.offset & !0xfff
            && s.offset
                .checked_add(s.filesz)
                .is_some_and(|end| m.file_offset < end)
    })?;
    Some(
        m.start
            .wrapping_sub(m.file_offset)
            .wrapping_sub(s.vaddr.wrapping_sub(s.offset)),
    )
}
