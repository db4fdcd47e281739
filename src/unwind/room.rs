//! Room for new tables in the full shared rows: idle objects' rows reused,
//! tables moved to put free rows together, the tables of processes gone
//! cold let go, and processes left lacking tables tried again.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use anyhow::Result;

use super::{FileEntry, ObjectEntry, Processes, Unwinder, COLD, GRACE, RETRY};
use crate::bpf::types;
use crate::process::registry::ExecMapping;

impl Unwinder {
    /// Processes installed without some of their tables for want of room
    /// and blocking now: their tables are built again where the room of
    /// processes gone cold can be had.
    pub(super) fn retry_lacking(&mut self, procs: &dyn Processes) {
        if self.retried.elapsed() < RETRY {
            return;
        }
        self.retried = Instant::now();
        let now = crate::raw::monotonic_ns();
        let lacking: Vec<u32> = self
            .processes
            .iter()
            .filter(|(tgid, p)| {
                !p.lacking.is_empty()
                    && p.slice.is_some()
                    && !self.waiting.contains(tgid)
                    && !p.lacking.iter().any(|o| self.building.contains_key(o))
            })
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in lacking {
            let Some(store) = self.store.as_deref() else {
                return;
            };
            let hot = store
                .last_used(tgid)
                .is_some_and(|t| now.saturating_sub(t) < COLD.as_nanos() as u64);
            if !hot {
                continue;
            }
            let Some(p) = self.processes.get(&tgid) else {
                continue;
            };
            // The largest: each object's rows are one run.
            let need: usize = p
                .lacking
                .iter()
                .filter_map(|o| self.objects.get(o).and_then(|e| e.wants_rows))
                .max()
                .unwrap_or(0);
            if need == 0 {
                continue;
            }
            let keep = p.objects.clone();
            // Tried before and still lacking: less and less often.
            let (at, tries) = self
                .retry_at
                .get(&tgid)
                .copied()
                .unwrap_or((Instant::now(), 0));
            if Instant::now() < at || !self.cold_room(need, &keep, tgid).1 {
                continue;
            }
            let wait = RETRY * (1u32 << tries.min(6));
            self.retry_at
                .insert(tgid, (Instant::now() + wait, tries + 1));
            let lacking = p.lacking.clone();
            for o in lacking {
                if self.objects.get(&o).is_some_and(|e| e.wants_rows.is_some()) {
                    self.request(procs, tgid, o);
                }
            }
            self.waiting.insert(tgid);
            self.pending.insert(tgid, keep);
        }
    }

    /// The processes that could give their tables for `tgid`, the
    /// longest unused first, and when each was last used (CLOCK_MONOTONIC
    /// ns): those with tables of their own, but not `tgid` nor those
    /// waiting for tables.
    fn by_last_use(&self, tgid: u32) -> Vec<(u64, u32)> {
        let Some(store) = self.store.as_deref() else {
            return Vec::new();
        };
        let mut v: Vec<(u64, u32)> = self
            .processes
            .iter()
            .filter(|(&pid, p)| pid != tgid && p.slice.is_some() && !self.waiting.contains(&pid))
            .map(|(&pid, _)| (store.last_used(pid).unwrap_or(0), pid))
            .collect();
        v.sort_unstable();
        v
    }

    /// The rows that letting go of the processes unused for [`COLD`]
    /// would free for `tgid` (mapping `keep`), with those of objects no
    /// process maps now: the processes to let go, and whether that is
    /// `len` rows with the free ones and those coming.
    fn cold_room(&self, len: usize, keep: &[u32], tgid: u32) -> (Vec<u32>, bool) {
        let now = crate::raw::monotonic_ns();
        let held: HashSet<u32> = keep
            .iter()
            .chain(self.pending.values().flatten())
            .copied()
            .collect();
        let range_of = |o: &u32| -> Option<(usize, usize)> {
            if held.contains(o) {
                return None;
            }
            let t = self.objects.get(o)?.table.as_ref()?;
            Some((t.row_start as usize, t.row_count as usize))
        };
        // Objects no process maps: theirs in any case.
        let mut coming: Vec<(usize, usize)> = self
            .objects
            .iter()
            .filter(|(_, e)| e.refs == 0)
            .filter_map(|(o, _)| range_of(o))
            .collect();
        coming.extend(self.moved_from.iter().map(|&(_, start, len)| (start, len)));
        let free = self.rows.capacity - self.rows.used;
        // In one run, or in pieces that moving tables puts together.
        let enough = |coming: &[(usize, usize)]| {
            self.rows.longest_with(coming) >= len
                || free + coming.iter().map(|&(_, l)| l).sum::<usize>() >= len
        };
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut victims = Vec::new();
        for (used, pid) in self.by_last_use(tgid) {
            if enough(&coming) || now.saturating_sub(used) < COLD.as_nanos() as u64 {
                break;
            }
            victims.push(pid);
            for o in &self.processes[&pid].objects {
                let r = refs
                    .entry(*o)
                    .or_insert_with(|| self.objects.get(o).map_or(0, |e| e.refs));
                *r = r.saturating_sub(1);
                if *r == 0 {
                    coming.extend(range_of(o));
                }
            }
        }
        let enough = enough(&coming);
        (victims, enough)
    }

    /// Lets go the tables of the processes that have not blocked for
    /// longest, none used for [`COLD`], until `len` rows can be had
    /// [`GRACE`] from now for `tgid`: whether they can. Nothing is let go
    /// if they cannot. Those processes' tables are made again at a block
    /// that needs them (see [`Unwinder::wanted`]).
    pub(super) fn let_go_cold(&mut self, len: usize, tgid: u32) -> bool {
        let keep = self
            .processes
            .get(&tgid)
            .map(|p| p.objects.clone())
            .or_else(|| self.pending.get(&tgid).cloned())
            .unwrap_or_default();
        let (victims, enough) = self.cold_room(len, &keep, tgid);
        if !enough {
            return false;
        }
        for pid in victims {
            if let Some(p) = self.processes.remove(&pid) {
                self.store().remove_process(pid);
                self.release(p);
                self.let_go.insert(pid);
                self.stats.processes_let_go += 1;
            }
        }
        // Every object no process maps now gives its rows GRACE from now,
        // when no walk can still be reading them.
        let held: HashSet<u32> = keep
            .iter()
            .chain(self.pending.values().flatten())
            .copied()
            .collect();
        let free: Vec<u32> = self
            .objects
            .iter()
            .filter(|(o, e)| e.refs == 0 && e.table.is_some() && !held.contains(o))
            .map(|(&o, _)| o)
            .collect();
        let now = Instant::now();
        for o in free {
            self.unregister(o);
            if let Some(e) = self.objects.get_mut(&o) {
                if e.file == FileEntry::Never {
                    e.file = FileEntry::Removed(now);
                }
                e.idle_since = Some(e.idle_since.map_or(now, |t| t.min(now)));
            }
        }
        self.update_stats();
        true
    }

    /// Rows that come free within [`GRACE`]: those of objects whose file
    /// entries were removed and that no process maps, and those that tables
    /// moved from (see [`Unwinder::compact`]).
    pub(super) fn coming(&self) -> Vec<(usize, usize)> {
        let mut v = self.freeing();
        v.extend(self.moved_from.iter().map(|&(_, start, len)| (start, len)));
        v
    }

    /// Makes a run of `len` rows come free where the free rows are enough
    /// but in pieces: tables in use are moved down into the holes below
    /// them, the highest first, until there would be such a run. A table is
    /// copied to its new place, the processes that map it and its file
    /// entry are pointed there, and its old rows are given back [`GRACE`]
    /// later, when no walk can still be reading them. Whether any moved.
    pub(super) fn compact(&mut self, len: usize) -> bool {
        let free: usize = self.rows.capacity - self.rows.used;
        let coming: usize = self.coming().iter().map(|&(_, l)| l).sum();
        if free + coming < len {
            return false;
        }
        let mut order: Vec<(usize, u32, usize)> = self
            .objects
            .iter()
            .filter(|(_, e)| !(e.refs == 0 && matches!(e.file, FileEntry::Removed(_))))
            .filter_map(|(&o, e)| {
                let t = e.table.as_ref()?;
                Some((t.row_start as usize, o, t.row_count as usize))
            })
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let mut moved = false;
        for (from, object, count) in order {
            if self.rows.longest_with(&self.coming()) >= len {
                break;
            }
            let Some(to) = self.rows.alloc(count) else {
                continue;
            };
            if to >= from || self.move_rows(object, from, to, count).is_err() {
                self.rows.free(to, count);
                continue;
            }
            self.moved_from.push_back((Instant::now(), from, count));
            self.stats.tables_moved += 1;
            moved = true;
        }
        moved
    }

    /// Copies `object`'s `count` rows from `from` to `to` and points its
    /// processes and its file entry at them.
    fn move_rows(&mut self, object: u32, from: usize, to: usize, count: usize) -> Result<()> {
        let mut copy: Vec<types::unwind_row> = Vec::new();
        let store = self
            .store
            .as_deref_mut()
            .ok_or_else(|| anyhow::anyhow!("no store"))?;
        store.read(&mut |rows, _| {
            if let Some(r) = rows.get(from..from + count) {
                copy = r.to_vec();
            }
        })?;
        if copy.len() != count {
            anyhow::bail!("the rows to move are not there");
        }
        for (i, chunk) in copy.chunks(1 << 16).enumerate() {
            store.write_rows(to + (i << 16), chunk)?;
        }
        drop(copy);
        if let Some(t) = self.objects.get_mut(&object).and_then(|e| e.table.as_mut()) {
            t.row_start = to as u32;
        }
        let users: Vec<(usize, Vec<ExecMapping>)> = self
            .processes
            .values()
            .filter(|p| p.objects.contains(&object))
            .filter_map(|p| Some((p.slice?.0, p.mappings.clone())))
            .collect();
        let mut done = HashSet::new();
        for (start, mappings) in users {
            // A slice shared with a forked child is written once.
            if done.insert(start) {
                let entries = self.entries_of(&mappings);
                self.store().write_mappings(start, &entries)?;
            }
        }
        if matches!(
            self.objects.get(&object).map(|e| e.file),
            Some(FileEntry::Written(_))
        ) {
            self.register(object);
        }
        Ok(())
    }

    /// The longest run of rows that is free or could be freed for an
    /// object now (each object's rows are one run).
    pub(super) fn room(&self, keep: &[u32]) -> usize {
        let now = Instant::now();
        let idle: Vec<(usize, usize)> = self
            .objects
            .iter()
            .filter(|(id, e)| Self::idle(id, e, keep, now))
            .filter_map(|(_, e)| e.table.as_ref())
            .map(|t| (t.row_start as usize, t.row_count as usize))
            .collect();
        self.rows.longest_with(&idle)
    }

    /// An object with rows that no process noted maps, for [`GRACE`].
    fn idle(id: &u32, e: &ObjectEntry, keep: &[u32], now: Instant) -> bool {
        e.table.is_some()
            && e.refs == 0
            && !keep.contains(id)
            && e.idle_since.is_some_and(|t| now.duration_since(t) >= GRACE)
    }

    /// ... whose rows no walk can be reading: the BPF program has not
    /// found it by its file for [`GRACE`] either.
    fn evictable(id: &u32, e: &ObjectEntry, keep: &[u32], now: Instant) -> bool {
        Self::idle(id, e, keep, now)
            && match e.file {
                FileEntry::Never => true,
                FileEntry::Written(_) => false,
                FileEntry::Removed(t) => now.duration_since(t) >= GRACE,
            }
    }

    /// Rows that objects whose file entries were removed give within
    /// [`GRACE`].
    fn freeing(&self) -> Vec<(usize, usize)> {
        self.objects
            .values()
            .filter(|e| e.refs == 0 && matches!(e.file, FileEntry::Removed(_)))
            .filter_map(|e| e.table.as_ref())
            .map(|t| (t.row_start as usize, t.row_count as usize))
            .collect()
    }

    /// Room for `len` rows: free space, else the space of objects idle for
    /// longer than [`GRACE`], the longest idle first.
    pub(super) fn alloc_rows(&mut self, len: usize, keep: &[u32]) -> Option<usize> {
        loop {
            if let Some(start) = self.rows.alloc(len) {
                return Some(start);
            }
            let now = Instant::now();
            let victim = self
                .objects
                .iter()
                .filter(|(id, e)| Self::evictable(id, e, keep, now))
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(&id, _)| id);
            let Some(victim) = victim else {
                // Idle objects the BPF program may still find by their
                // files: no longer, the longest idle first, until their
                // rows would do (they can be reused GRACE from now).
                let mut idle: Vec<(Instant, u32, usize)> = self
                    .objects
                    .iter()
                    .filter(|(id, e)| {
                        Self::idle(id, e, keep, now) && matches!(e.file, FileEntry::Written(_))
                    })
                    .filter_map(|(&id, e)| {
                        Some((e.idle_since?, id, e.table.as_ref()?.row_count as usize))
                    })
                    .collect();
                idle.sort_unstable();
                let mut coming = self.coming();
                for (_, id, _) in idle {
                    if self.rows.longest_with(&coming) >= len {
                        break;
                    }
                    self.unregister(id);
                    if let Some(t) = self.objects.get(&id).and_then(|e| e.table.as_ref()) {
                        coming.push((t.row_start as usize, t.row_count as usize));
                    }
                }
                return None;
            };
            if let Some(ObjectEntry { table: Some(t), .. }) = self.objects.remove(&victim) {
                self.rows.free(t.row_start as usize, t.row_count as usize);
                self.stats.objects_evicted += 1;
            }
        }
    }
}
