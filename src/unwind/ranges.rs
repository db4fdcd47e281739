//! The free ranges of the shared tables (rows, mappings): first fit,
//! merged with their neighbours when given back.

use std::collections::BTreeMap;

/// Free ranges of a table, first fit, merged with their neighbours when
/// given back.
#[derive(Debug)]
pub(super) struct RangeAlloc {
    /// start -> length
    pub(super) free: BTreeMap<usize, usize>,
    pub(super) capacity: usize,
    pub(super) used: usize,
}

impl RangeAlloc {
    pub(super) fn new(capacity: usize) -> RangeAlloc {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        RangeAlloc {
            free,
            capacity,
            used: 0,
        }
    }

    pub(super) fn alloc(&mut self, len: usize) -> Option<usize> {
        if len == 0 {
            return Some(0);
        }
        let (&start, &have) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        self.used += len;
        Some(start)
    }

    pub(super) fn free(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        debug_assert!(start + len <= self.capacity);
        self.used -= len;
        let (mut start, mut len) = (start, len);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += l;
        }
        self.free.insert(start, len);
    }

    /// Where the last of ranges of `lens`, allocated in turn (first fit),
    /// would end: 0 where none fits.
    pub(super) fn end_after(&self, lens: &[usize]) -> usize {
        let mut free = self.free.clone();
        let mut end = 0;
        for &len in lens.iter().filter(|&&l| l > 0) {
            let Some((&start, &have)) = free.iter().find(|(_, &l)| l >= len) else {
                continue;
            };
            free.remove(&start);
            if have > len {
                free.insert(start + len, have - len);
            }
            end = end.max(start + len);
        }
        end
    }

    /// The longest free run there would be with `more` ranges given back
    /// too (start, length; not free now, not overlapping).
    pub(super) fn longest_with(&self, more: &[(usize, usize)]) -> usize {
        let mut all: Vec<(usize, usize)> = self.free.iter().map(|(&s, &l)| (s, l)).collect();
        all.extend(more.iter().copied().filter(|&(_, l)| l > 0));
        all.sort_unstable();
        let mut best = 0;
        let mut run: Option<(usize, usize)> = None;
        for (s, l) in all {
            let (a, e) = match run {
                Some((a, e)) if s <= e => (a, e.max(s + l)),
                _ => (s, s + l),
            };
            run = Some((a, e));
            best = best.max(e - a);
        }
        best
    }
}
