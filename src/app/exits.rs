//! Processes that have exited, until what was kept for them is given back.

use super::*;

/// Processes that have exited, until what was kept for them is given
/// back: their snapshot becomes the frames of the stacks counted for them,
/// and their unwind tables are freed. A process is let go at least
/// [`Exits::GRACE`] after it was seen exiting, when its threads have surely
/// stopped blocking, and those seen within [`Exits::EVERY`] are let go
/// together (one pass over the counts). Exits come from the BPF program; a sweep over the
/// processes kept finds those whose notice was lost.
#[derive(Default)]
pub(super) struct Exits {
    pub(super) pending: HashMap<Proc, Instant>,
    pub(super) last_due: Option<Instant>,
    pub(super) last_sweep: Option<Instant>,
}

impl Exits {
    pub(super) const GRACE: Duration = Duration::from_secs(1);
    /// Processes let go together at most this often: each time is one
    /// pass over the counts.
    pub(super) const EVERY: Duration = Duration::from_secs(3);
    pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(10);

    pub(super) fn exited(&mut self, p: Proc) {
        self.pending.entry(p).or_insert_with(Instant::now);
    }

    /// Every SWEEP_EVERY: the processes kept whose /proc entry is gone, or
    /// is another process's now.
    pub(super) fn sweep(&mut self, registry: &Registry) {
        let now = Instant::now();
        let last = *self.last_sweep.get_or_insert(now);
        if now.duration_since(last) < Self::SWEEP_EVERY {
            return;
        }
        self.last_sweep = Some(now);
        let gone: Vec<Proc> = registry
            .processes()
            .filter_map(|(tgid, start)| {
                let alive = crate::process::start_ticks(tgid);
                match (start, alive) {
                    (Some(s), a) if a != Some(s) => Some(Proc { tgid, start: s }),
                    (None, None) => Some(Proc { tgid, start: 0 }),
                    _ => None,
                }
            })
            .collect();
        for p in gone {
            self.exited(p);
        }
    }

    /// At most once per EVERY, the processes that exited at least GRACE
    /// ago.
    pub(super) fn due(&mut self) -> Option<HashSet<Proc>> {
        let now = Instant::now();
        if self.pending.is_empty()
            || self
                .last_due
                .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return None;
        }
        self.last_due = Some(now);
        let due: HashSet<Proc> = self
            .pending
            .iter()
            .filter(|(_, &at)| now.duration_since(at) >= Self::GRACE)
            .map(|(&p, _)| p)
            .collect();
        self.pending.retain(|p, _| !due.contains(p));
        (!due.is_empty()).then_some(due)
    }
}
