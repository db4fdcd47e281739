//! Reading what the program counted: the counts with their stacks,
//! wakers and loss counters, whole or an interval at a time, and the
//! user stacks of some processes.

use super::*;

/// A pass over the counts for some processes' user stacks.
pub struct StackScan<'t> {
    procs: HashSet<Proc>,
    keys: Box<dyn Iterator<Item = Vec<u8>> + 't>,
    wanted: HashSet<(Proc, u64)>,
}

impl StackScan<'_> {
    /// The processes scanned for.
    pub fn procs(&self) -> &HashSet<Proc> {
        &self.procs
    }

    /// Reads up to `n` more entries; once the pass is over, the stacks
    /// found: each (process, stack id, frames) once.
    pub fn step(&mut self, tracer: &Tracer<'_>, n: usize) -> Option<Vec<(Proc, u64, Vec<u64>)>> {
        let mut read = 0;
        for key_bytes in self.keys.by_ref().take(n) {
            read += 1;
            let Ok(key) = decode_key(&key_bytes) else {
                continue;
            };
            let p = Proc {
                tgid: key.tgid,
                start: ticks_of_ns(key.process_start),
            };
            if self.procs.contains(&p) {
                if let StackRef::Id(id) = StackRef::from_raw(key.user_stack_id) {
                    self.wanted.insert((p, id));
                }
            }
        }
        if read == n {
            return None;
        }
        // A stack that cannot be read leaves its frames unnamed, nothing
        // else.
        Some(
            self.wanted
                .drain()
                .filter_map(|(p, id)| Some((p, id, tracer.stack(id).ok()??)))
                .collect(),
        )
    }
}

/// The frames of the stored stack `id`, innermost first.
/// (In the table of its length, or in the spill table: see `stacks_spill`.)
pub(super) fn read_stack(skel: &OffcputimeSkel<'_>, id: u64) -> Result<Option<Vec<u64>>> {
    let key = id.to_ne_bytes();
    for table in stack_tables(skel, id) {
        if let Some(bytes) = table.lookup(&key, MapFlags::ANY)? {
            return Ok(Some(stack_frames(&bytes)));
        }
    }
    Ok(None)
}

/// The tables a stored stack can be in (`STACK_SHORT_DEPTH` in
/// offcputime.h), the one its id names first (a stack the program stored;
/// one stored by userspace, a walked copy, has no table in its id), the
/// spill table last.
pub(super) fn stack_tables<'a, 'obj>(
    skel: &'a OffcputimeSkel<'obj>,
    id: u64,
) -> [&'a libbpf_rs::Map<'obj>; 4] {
    let m = &skel.maps;
    match id & (STACK_ID_CLASS_SHORT | STACK_ID_CLASS_MID) {
        c if c == STACK_ID_CLASS_SHORT && id >> 63 == 1 => {
            [&m.stacks_short, &m.stacks_mid, &m.stacks, &m.stacks_spill]
        }
        c if c == STACK_ID_CLASS_MID && id >> 63 == 1 => {
            [&m.stacks_mid, &m.stacks_short, &m.stacks, &m.stacks_spill]
        }
        _ => [&m.stacks, &m.stacks_mid, &m.stacks_short, &m.stacks_spill],
    }
}

/// A key of either table of counts: `counts_plain`'s is the start of
/// `counts`' (struct offcpu_key_plain), the rest its defaults (zeros).
fn decode_key(key_bytes: &[u8]) -> Result<types::offcpu_key> {
    let whole = std::mem::size_of::<types::offcpu_key>();
    let plain = std::mem::size_of::<types::offcpu_key_plain>();
    if key_bytes.len() != whole && key_bytes.len() != plain {
        bail!("bad key in counts map: {} bytes", key_bytes.len());
    }
    let mut bytes = vec![0u8; whole];
    bytes[..key_bytes.len()].copy_from_slice(key_bytes);
    let mut key = types::offcpu_key::default();
    plain::copy_from_bytes(&mut key, &bytes)
        .map_err(|e| anyhow!("bad key in counts map: {e:?}"))?;
    Ok(key)
}

/// One entry of the tables of counts.
pub(super) fn decode_entry(key_bytes: &[u8], val_bytes: &[u8]) -> Result<RawEntry> {
    let key = decode_key(key_bytes)?;
    let mut val = types::offcpu_val::default();
    plain::copy_from_bytes(&mut val, val_bytes)
        .map_err(|e| anyhow!("bad value in counts map: {e:?}"))?;
    Ok(RawEntry {
        tgid: key.tgid,
        start: ticks_of_ns(key.process_start),
        pid: key.pid,
        comm: comm_to_string(&key.comm),
        user_stack: StackRef::from_raw(key.user_stack_id),
        kernel_stack: StackRef::from_raw(key.kernel_stack_id),
        state: OffState::from_raw(key.state),
        waker: WakerRef::from_raw(key.waker_id),
        interval: key.interval,
        span: key.span.max(1),
        total_ns: val.total_ns,
        count: val.count,
    })
}

/// A block record of the `block_records` ring (`struct block_record`).
pub(super) fn decode_block(data: &[u8]) -> Option<RawBlock> {
    let mut r = types::block_record::default();
    plain::copy_from_bytes(&mut r, data).ok()?;
    let flags = |f: types::block_record_flags| r.flags & f.0 != 0;
    Some(RawBlock {
        tgid: r.tgid,
        start: ticks_of_ns(r.process_start),
        pid: r.pid,
        comm: comm_to_string(&r.comm),
        from_ns: r.from,
        to_ns: r.to.max(r.from),
        waking_ns: (r.waking_ns != 0).then_some(r.waking_ns),
        user_stack: StackRef::from_raw(r.user_stack_id),
        kernel_stack: StackRef::from_raw(r.kernel_stack_id),
        state: OffState::from_raw(r.state),
        waker: WakerRef::from_raw(r.waker_id),
        at_start: flags(types::block_record_flags::BLOCK_AT_START),
        at_end: flags(types::block_record_flags::BLOCK_AT_END),
        sample: flags(types::block_record_flags::BLOCK_ONCPU_SAMPLE),
        profiled: flags(types::block_record_flags::BLOCK_PROFILED),
        cut: flags(types::block_record_flags::BLOCK_CUT),
    })
}

/// A stored stack's frames: its addresses up to the first 0.
pub(super) fn stack_frames(bytes: &[u8]) -> Vec<u64> {
    let (words, len) = stored_words(bytes);
    words.take(len).collect()
}

/// The BPF program's counters of lost and incomplete data.
pub(super) fn read_counters(skel: &OffcputimeSkel<'_>) -> Result<LossCounters> {
    let mut sums = [0u64; types::offcpu_counter::CNT_MAX.0 as usize];
    for (i, sum) in sums.iter_mut().enumerate() {
        let key = (i as u32).to_ne_bytes();
        if let Some(per_cpu) = skel.maps.counters.lookup_percpu(&key, MapFlags::ANY)? {
            for v in per_cpu {
                if v.len() >= 8 {
                    *sum += u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"));
                }
            }
        }
    }
    Ok(LossCounters::from_kernel(&sums))
}

impl Tracer<'_> {
    /// Reads the counts, the stacks they refer to and the loss counters.
    pub fn read(&self) -> Result<RawProfile> {
        self.read_counts(None, Default::default())
    }

    /// The same, with the stacks and wakers of `also` (ids the counts may
    /// not name: `--timeline`'s records) read too.
    pub fn read_with(&self, also: (Vec<u64>, Vec<u64>)) -> Result<RawProfile> {
        self.read_counts(None, also)
    }

    /// `-i`: takes the counts of intervals up to `last` out of the table
    /// (those of later intervals stay), with the stacks they refer to and
    /// the loss counters so far.
    pub fn take_intervals(&self, last: u32) -> Result<RawProfile> {
        self.read_counts(Some(last), Default::default())
    }

    /// The last intervals (see [`Tracer::take_intervals`]) with the
    /// stacks and wakers of `also` (see [`Tracer::read_with`]).
    pub fn take_intervals_with(&self, last: u32, also: (Vec<u64>, Vec<u64>)) -> Result<RawProfile> {
        self.read_counts(Some(last), also)
    }

    pub(super) fn read_counts(
        &self,
        take_through: Option<u32>,
        also: (Vec<u64>, Vec<u64>),
    ) -> Result<RawProfile> {
        let with_also = |(mut stacks, mut wakers): (Vec<u64>, Vec<u64>)| {
            stacks.extend_from_slice(&also.0);
            wakers.extend_from_slice(&also.1);
            (stacks, wakers)
        };
        // Once the hooks are detached nothing writes the tables: the
        // stacks are read whole, in batches, on a thread of their own while
        // the counts are read (both are mostly the kernel copying, and the
        // stacks run to many megabytes with many of them: see
        // BENCHMARKS.md, report time). Taking intervals out while tracing
        // goes key by key.
        if self.stopped && take_through.is_none() {
            let m = &self.skel.maps;
            let tables = [&m.stacks_short, &m.stacks_mid, &m.stacks].map(batch::Table::of);
            return std::thread::scope(|scope| {
                let all = scope.spawn(move || {
                    crate::priority::join_raise();
                    let mut all = Stacks::default();
                    for table in tables {
                        let outcome = batch::for_each_entry(table, |k, v| {
                            let id = u64::from_ne_bytes(k[..8].try_into().expect("8-byte key"));
                            all.insert_value(id, v);
                        });
                        // Where it failed, the stacks are looked up one by
                        // one.
                        if !matches!(outcome, Ok(batch::Outcome::Read)) {
                            return None;
                        }
                    }
                    Some(all)
                });
                let mut profile = RawProfile::default();
                let wanted = with_also(self.read_entries(&mut profile, None)?);
                let all = all
                    .join()
                    .map_err(|_| anyhow!("the stack reader panicked"))?;
                self.finish_read(profile, wanted, all)
            });
        }
        let mut profile = RawProfile::default();
        let wanted = with_also(self.read_entries(&mut profile, take_through)?);
        self.finish_read(profile, wanted, None)
    }

    /// The counts into `profile` (see [`Tracer::read_counts`]): the ids of
    /// the stacks and wakers they name.
    pub(super) fn read_entries(
        &self,
        profile: &mut RawProfile,
        take_through: Option<u32>,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        // Both tables (see `counts_plain`): the one the mode does not use
        // holds at most one count.
        let tables = [&self.skel.maps.counts_plain, &self.skel.maps.counts];
        // In batches once nothing writes the tables; key by key where the
        // kernel has no batched lookup or it failed part way.
        let mut batched = Vec::new();
        let mut read_whole = self.stopped && take_through.is_none();
        for counts in tables {
            read_whole = read_whole
                && self
                    .read_batched(counts, |k, v| {
                        batched.push(decode_entry(k, v)?);
                        Ok(())
                    })
                    .unwrap_or(false);
        }
        if read_whole {
            profile.entries = batched;
        } else {
            for counts in tables {
                let keys: Vec<Vec<u8>> = counts.keys().collect();
                for key_bytes in keys {
                    let val_bytes = match take_through {
                        None => counts.lookup(&key_bytes, MapFlags::ANY)?,
                        Some(last) if decode_key(&key_bytes)?.interval <= last => {
                            counts.lookup_and_delete(&key_bytes)?
                        }
                        Some(_) => None,
                    };
                    if let Some(val_bytes) = val_bytes {
                        profile.entries.push(decode_entry(&key_bytes, &val_bytes)?);
                    }
                }
            }
        }
        let mut wanted_stacks = Vec::new();
        let mut wanted_wakers = Vec::new();
        for e in &profile.entries {
            for s in [e.user_stack, e.kernel_stack] {
                if let StackRef::Id(id) = s {
                    wanted_stacks.push(id);
                }
            }
            if let Some(WakerRef::Id(id)) = e.waker {
                wanted_wakers.push(id);
            }
        }
        Ok((wanted_stacks, wanted_wakers))
    }

    /// The wakers and stacks the counts name, and the loss counters.
    /// `all`: every stored stack, where they were read whole.
    pub(super) fn finish_read(
        &self,
        mut profile: RawProfile,
        (mut wanted_stacks, mut wanted_wakers): (Vec<u64>, Vec<u64>),
        all: Option<Stacks>,
    ) -> Result<RawProfile> {
        wanted_wakers.sort_unstable();
        wanted_wakers.dedup();
        for id in wanted_wakers {
            if let Some(w) = self.waker(id)? {
                for s in [w.user_stack, w.kernel_stack] {
                    if let StackRef::Id(id) = s {
                        wanted_stacks.push(id);
                    }
                }
                profile.wakers.insert(id, w);
            }
        }
        wanted_stacks.sort_unstable();
        wanted_stacks.dedup();
        match all {
            Some(mut all) => {
                // Stacks nothing counts are let go where they are many
                // (a stack looked up by the counts is found either way).
                if all.len() > wanted_stacks.len() + wanted_stacks.len() / 4 {
                    all.retain(|id| wanted_stacks.binary_search(&id).is_ok());
                }
                // A stack stored behind the batch as it went (by a hook
                // still returning after the detach) is looked up alone.
                for &id in &wanted_stacks {
                    if !all.contains_key(&id) {
                        if let Some(frames) = self.stack(id)? {
                            all.insert(id, &frames);
                        }
                    }
                }
                profile.stacks = all;
            }
            None => {
                profile.stacks.reserve(wanted_stacks.len());
                for id in wanted_stacks {
                    if let Some(frames) = self.stack(id)? {
                        profile.stacks.insert(id, &frames);
                    }
                }
            }
        }
        profile.counters = self.read_counters()?;
        Ok(profile)
    }

    /// Every entry of `map` given to `f`, in batches: true if done, false
    /// where the kernel has no batched lookup for it (nothing was given).
    pub(super) fn read_batched<M: MapCore>(
        &self,
        map: &M,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let mut failed = None;
        let outcome = batch::for_each_entry(batch::Table::of(map), |k, v| {
            if failed.is_none() {
                if let Err(e) = f(k, v) {
                    failed = Some(e);
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(outcome == batch::Outcome::Read)
    }

    /// A pass over the counts for the user stacks counted so far for the
    /// processes in `procs`, done a slice at a time (see
    /// [`StackScan::step`]): the table holds every thread's stacks, tens
    /// of thousands on a busy machine, and reading it all at once would
    /// hold up the reading of events.
    pub fn scan_user_stacks(&self, procs: HashSet<Proc>) -> StackScan<'_> {
        // The wakers' stacks are few (one per distinct waker): all at once.
        let wanted = if self.wakers {
            self.waker_user_stacks(&procs).into_iter().collect()
        } else {
            HashSet::new()
        };
        // Key by key: the batched lookup of this libbpf-rs version gave
        // keys that matched no process under load (the soak test's
        // exited children lost their names), where the plain walk does not.
        let m = &self.skel.maps;
        let keys: Box<dyn Iterator<Item = Vec<u8>> + '_> =
            Box::new(m.counts_plain.keys().chain(m.counts.keys()));
        StackScan {
            procs,
            keys,
            wanted,
        }
    }

    pub(super) fn waker(&self, id: u64) -> Result<Option<RawWaker>> {
        let Some(bytes) = self
            .skel
            .maps
            .wakers
            .lookup(&id.to_ne_bytes(), MapFlags::ANY)?
        else {
            return Ok(None);
        };
        let mut w = types::waker_info::default();
        plain::copy_from_bytes(&mut w, &bytes)
            .map_err(|e| anyhow!("bad value in wakers map: {e:?}"))?;
        Ok(Some(RawWaker {
            tgid: w.tgid,
            start: ticks_of_ns(w.process_start),
            pid: w.pid,
            comm: comm_to_string(&w.comm),
            user_stack: StackRef::from_raw(w.user_stack_id),
            kernel_stack: StackRef::from_raw(w.kernel_stack_id),
            dev: w.dev,
        }))
    }

    /// The user stacks of the wakers of `procs` (`--wakers`): (process,
    /// stack id).
    pub(super) fn waker_user_stacks(&self, procs: &HashSet<Proc>) -> Vec<(Proc, u64)> {
        let wakers = &self.skel.maps.wakers;
        let mut out = Vec::new();
        for key in wakers.keys() {
            let Ok(Some(bytes)) = wakers.lookup(&key, MapFlags::ANY) else {
                continue;
            };
            let mut w = types::waker_info::default();
            if plain::copy_from_bytes(&mut w, &bytes).is_err() {
                continue;
            }
            let p = Proc {
                tgid: w.tgid,
                start: ticks_of_ns(w.process_start),
            };
            if let (true, StackRef::Id(id)) =
                (procs.contains(&p), StackRef::from_raw(w.user_stack_id))
            {
                out.push((p, id));
            }
        }
        out
    }

    /// `OFFCPUTIME_TEST_KSTACK_CHECK`: each pair of a kernel stack of a
    /// thread not running, walked whole, and the kernel's walk of the same
    /// thread (frames innermost first).
    pub fn kernel_stack_pairs(&self) -> Result<crate::ksyms::StackPairs> {
        let mut pairs = Vec::new();
        for key in self.skel.maps.korc_pairs.keys() {
            let mut pair = types::korc_pair::default();
            plain::copy_from_bytes(&mut pair, &key)
                .map_err(|e| anyhow!("bad key in korc_pairs: {e:?}"))?;
            if let (Some(whole), Some(helper)) = (self.stack(pair.whole)?, self.stack(pair.helper)?)
            {
                pairs.push((whole, helper));
            }
        }
        Ok(pairs)
    }

    pub(super) fn stack(&self, id: u64) -> Result<Option<Vec<u64>>> {
        read_stack(&self.skel, id)
    }

    pub(super) fn read_counters(&self) -> Result<LossCounters> {
        read_counters(&self.skel)
    }

    /// Whether every notice of a new process or address space reached
    /// userspace so far (none dropped for a full ring).
    pub fn no_news_lost(&self) -> bool {
        read_counters(&self.skel).is_ok_and(|c| c.events_dropped == 0)
    }
}

/// A record of the event ring decoded; None: too short for its kind.
pub(super) fn task_event(data: &[u8]) -> Option<TaskEvent> {
    let mut ev = types::task_event::default();
    if plain::copy_from_bytes(&mut ev, data).is_err() {
        return None;
    }
    use types::task_event_kind as K;
    let p = Proc {
        tgid: ev.tgid,
        start: ticks_of_ns(ev.process_start),
    };
    let space = AddressSpace {
        mm: ev.mm,
        exec_vm: ev.exec_vm,
    };
    let event = match K(ev.kind) {
        K::TASK_EVENT_NEW => TaskEvent::New(p, space),
        K::TASK_EVENT_CHANGED => TaskEvent::Changed(p, space),
        K::TASK_EVENT_MAPPED => {
            let mut m = types::mapped_event::default();
            if plain::copy_from_bytes(&mut m, data).is_err() {
                return None;
            }
            let mut vmas = [MappedVma::default(); MAPPED_VMAS];
            let n = (m.count as usize).min(MAPPED_VMAS).min(m.vma.len());
            for (to, from) in vmas.iter_mut().zip(&m.vma[..n]) {
                *to = MappedVma {
                    start: from.start,
                    end: from.end,
                    offset: from.offset,
                    dev: from.dev,
                    ino: from.ino,
                };
            }
            TaskEvent::Mapped(p, vmas, n)
        }
        K::TASK_EVENT_PYCODE | K::TASK_EVENT_JAVACODE | K::TASK_EVENT_V8CODE => {
            let mut c = types::py_code_event::default();
            if plain::copy_from_bytes(&mut c, data).is_err() {
                return None;
            }
            TaskEvent::RuntimeCode {
                kind: match ev.kind {
                    k if k == K::TASK_EVENT_JAVACODE.0 => crate::raw::RuntimeKind::Java,
                    k if k == K::TASK_EVENT_V8CODE.0 => crate::raw::RuntimeKind::Node,
                    _ => crate::raw::RuntimeKind::Python,
                },
                proc: p,
                space,
                code: c.code,
                tag: c.tag,
                at: c.at,
            }
        }
        K::TASK_EVENT_FORKED => TaskEvent::Forked {
            child: p,
            space,
            parent: ev.parent,
            map_start: ev.map_start,
            map_count: ev.map_count,
        },
        _ => TaskEvent::Exited(p),
    };
    Some(event)
}
