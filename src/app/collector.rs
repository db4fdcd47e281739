//! The handler of the BPF program's news while tracing.

use super::*;

/// What is done with the program's news while tracing (see
/// [`Tracer::wait`]): snapshots first, they are what names the frames of a
/// process that exits soon; then unwind tables: at once for processes whose
/// files all have theirs already (a new process of a known program), else
/// as soon as the builder thread has built those of its new files.
/// Processes that have exited give back what was kept for them (see
/// [`Exits`]).
pub(super) struct Collector<'t> {
    pub(super) exits: Exits,
    pub(super) scan: Option<crate::tracer::StackScan<'t>>,
    pub(super) stats: StatsLine,
    /// Raised to nice -20 while copied stacks wait for their tables: under
    /// thousands of new threads, at the user's priority, it waited seconds
    /// for a CPU, and the new processes' tables came that late, their
    /// first stacks lost. (Raised all the time, it perturbs the threads
    /// it measures.)
    pub(super) raised: Option<crate::priority::Raised>,
    /// Where the BPF program is told of the processes of language
    /// runtimes (None where no runtime's frames are read, as with
    /// `--no-python`).
    pub(super) runtimes: Option<crate::tracer::RuntimeStore>,
    /// Runtimes' processes noted while tracing, and when: their blocks
    /// under way are walked again with their runtime's frames for a
    /// while.
    pub(super) refreshing: HashMap<u32, Instant>,
    /// The refresh failed once (said once).
    pub(super) refresh_failed: bool,
    /// Processes whose mappings were read, to be looked at for a runtime
    /// (with their address space).
    /// (Whether the mappings changed: an exec.)
    pub(super) runtime_later: Vec<(Proc, u64, bool)>,
    /// The runtimes' walkers the hooks loaded with (the start iterator
    /// too): the processes of those runtimes noted before the window
    /// opened have their frames in every walk.
    pub(super) walkers_from_start: crate::tracer::RuntimeKinds,
    /// For tests: that waits until this file exists (as if reading the
    /// runtime took that long: its first blocks are then walked before it
    /// is known).
    pub(super) runtime_gate: Option<std::path::PathBuf>,
    /// When the runtimes' processes not ready yet (a runtime starting)
    /// are looked at again.
    pub(super) runtime_retry: Instant,
    /// When the runtimes read their threads' names next.
    pub(super) runtime_threads: Instant,
    /// News taken in while the walkers loaded, up to the processes noted
    /// and no further, once a process of a runtime whose copies are walked
    /// with its frames was among those noted (see
    /// [`Collector::holds_news`]): the rest of its work is done when the
    /// load has ended.
    pub(super) held: Option<Held>,
}

/// What the loop's work on the program's news reads and changes (see
/// [`Collector::on_events`]): the tracer, the processes known, the unwind
/// tables, the copied stacks, and `walked`, told of each copied stack
/// walked and stored, with its frames.
pub(super) struct Work<'a, 't, 'o> {
    pub(super) tracer: &'t Tracer<'o>,
    pub(super) registry: &'a mut Registry,
    pub(super) unwinder: &'a mut Option<Unwinder>,
    pub(super) deferred: &'a mut Deferred,
    pub(super) walked: &'a mut dyn FnMut(u64, &[u64]),
}

/// A round's news whose processes are noted, the rest of its work (the
/// copies added, the tables built and installed) left for later.
pub(super) struct Held {
    events: Vec<TaskEvent>,
    spaces: Vec<Option<crate::raw::AddressSpace>>,
    stacks: Vec<crate::raw::RawUserStack>,
}

/// How often the runtimes' processes not ready yet are looked at again.
const RUNTIME_RETRY_EVERY: Duration = Duration::from_millis(100);

/// How often the runtimes read the names of their threads not named yet
/// (a thread that lives less than this may keep the kernel's name).
const THREAD_NAMES_EVERY: Duration = Duration::from_secs(1);

impl<'t> Collector<'t> {
    /// A handler with nothing kept yet: `stats` prints the statistics
    /// line, `runtimes` is where the processes of runtimes are told of.
    pub(super) fn new(
        config: &Config,
        stats: StatsLine,
        runtimes: Option<crate::tracer::RuntimeStore>,
        walkers_from_start: crate::tracer::RuntimeKinds,
    ) -> Collector<'t> {
        Collector {
            exits: Exits::default(),
            scan: None,
            stats,
            raised: None,
            runtimes,
            refreshing: HashMap::new(),
            refresh_failed: false,
            runtime_later: Vec::new(),
            walkers_from_start,
            runtime_gate: config.tracer.test.python_gate.clone(),
            runtime_retry: Instant::now(),
            runtime_threads: Instant::now(),
            held: None,
        }
    }

    /// The handler without the pass under way over the counts of the
    /// processes that exited (what it was for keeps its snapshot): it
    /// borrows the tracer no longer, which can then be stopped.
    pub(super) fn without_scan<'u>(self) -> Collector<'u> {
        Collector {
            exits: self.exits,
            scan: None,
            stats: self.stats,
            raised: self.raised,
            runtimes: self.runtimes,
            refreshing: self.refreshing,
            refresh_failed: self.refresh_failed,
            runtime_later: self.runtime_later,
            walkers_from_start: self.walkers_from_start,
            runtime_gate: self.runtime_gate,
            runtime_retry: self.runtime_retry,
            runtime_threads: self.runtime_threads,
            held: self.held,
        }
    }

    /// Tells the BPF program of the runtimes' processes among those whose
    /// mappings were read, once due.
    pub(super) fn note_runtimes(&mut self, registry: &mut Registry) {
        let Some(store) = &self.runtimes else {
            self.runtime_later.clear();
            return;
        };
        if self.runtime_gate.as_ref().is_some_and(|g| !g.exists()) {
            return;
        }
        let now = Instant::now();
        for (p, mm, changed) in std::mem::take(&mut self.runtime_later) {
            // A process noted before the window opened is news once, with
            // its address space, at its first walk: where the hooks have
            // the walkers, none of its blocks was walked without its
            // runtime's frames, and the refresh (an object of its own to
            // load: 52,000 instructions to verify) has nothing to do.
            let at_start = registry.take_runtime_at_start(p) && !changed;
            let Some(kind) = note_runtime(store, registry, p, mm) else {
                continue;
            };
            if !(at_start && self.walkers_from_start.has(kind)) {
                self.refreshing.insert(p.tgid, now);
            }
        }
        if now >= self.runtime_retry {
            self.runtime_retry = now + RUNTIME_RETRY_EVERY;
            for p in registry.runtimes_pending() {
                // The address space is claimed by the process's next walk.
                if note_runtime(store, registry, p, 0).is_some() {
                    self.refreshing.insert(p.tgid, now);
                }
            }
        }
        if now >= self.runtime_threads {
            self.runtime_threads = now + THREAD_NAMES_EVERY;
            registry.read_runtime_threads();
        }
    }

    /// Walks again the blocks under way of the runtimes' processes noted
    /// lately, walked before their runtime was known (after their tables
    /// are written: the walk needs them). The walkers' first load takes
    /// the verifier hundreds of milliseconds: the news read meanwhile is
    /// taken in as it comes, and the tables built meanwhile installed
    /// ([`Collector::take_in`]), or a new process's first blocks would
    /// all be copied, and most lost, until it ends; but not where a
    /// process of a runtime whose copies carry its frames is among them
    /// ([`Collector::holds_news`]).
    fn refresh_runtimes(&mut self, work: &mut Work<'_, 't, '_>) {
        if self.refreshing.is_empty() {
            return;
        }
        let now = Instant::now();
        let done: Vec<u32> = self
            .refreshing
            .iter()
            .filter(|(_, &since)| now - since > RUNTIME_REFRESH_FOR)
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in &done {
            self.refreshing.remove(tgid);
        }
        let tgids: Vec<u32> = self.refreshing.keys().copied().collect();
        let tracer = work.tracer;
        let mut between = |events: &mut Vec<TaskEvent>, stacks: &mut Vec<_>| {
            if self.holds_news(work.registry) {
                return;
            }
            let events = std::mem::take(events);
            self.take_in(&events, std::mem::take(stacks), true, work);
        };
        let refreshed = tracer.refresh_runtimes(&tgids, &done, Some(&mut between));
        if let Err(e) = refreshed {
            if !std::mem::replace(&mut self.refresh_failed, true) {
                eprintln!("offcputime: {e:#}");
            }
        }
    }

    /// Whether the news read while the walkers load is left for after
    /// the load: where a process noted lately runs a runtime whose copies
    /// are walked with its frames (a JVM, node), tables installed meanwhile
    /// (its own, or its files') would let the hooks without the walker
    /// walk it, showing the runtime's own frames (V8's trampolines, a
    /// JVM's unnamed code) in place of its functions; its blocks are
    /// copied instead, and walked with its frames once the load has ended.
    /// So too where such a process is seen but not ready yet (a JVM
    /// starting): noted once ready, its tables would be in place already.
    fn holds_news(&self, registry: &Registry) -> bool {
        self.held.is_some()
            || self
                .refreshing
                .keys()
                .any(|&t| registry.copies_carry_runtime_frames(t))
            || registry.frames_carrying_runtime_pending()
    }

    /// Takes in a round's news: the processes and runtimes noted, the
    /// copies added, the tables built and installed and the copies walked
    /// with them; while the walkers load (`loading`), only up to the
    /// processes noted where the news is then held
    /// ([`Collector::holds_news`]). Returns whether tables are being built.
    fn take_in(
        &mut self,
        events: &[TaskEvent],
        stacks: Vec<crate::raw::RawUserStack>,
        loading: bool,
        work: &mut Work<'_, 't, '_>,
    ) -> bool {
        let spaces = self.note_events(events, work.registry);
        // The runtimes' processes noted before the copies are added: a
        // copy's mark is read from its process's runtime, if known.
        self.note_runtimes(work.registry);
        let hold = loading && self.holds_news(work.registry);
        self.held = Some(Held {
            events: events.to_vec(),
            spaces,
            stacks,
        });
        !hold && self.release_held(work)
    }

    /// The rest of the work of the news held (see [`Collector::take_in`]),
    /// if any: the copies added, then the tables built and installed, the
    /// stacks copied for processes that had none walked with them, before
    /// the processes that exited are let go. Returns whether tables are
    /// being built.
    fn release_held(&mut self, work: &mut Work<'_, 't, '_>) -> bool {
        let Some(held) = self.held.take() else {
            return false;
        };
        // The processes that exited in the news held are let go a grace
        // after their copies are added, not after their exit was read (a
        // load can outlast the grace).
        let now = Instant::now();
        for ev in &held.events {
            if let TaskEvent::Exited(p) = ev {
                if let Some(at) = self.exits.pending.get_mut(p) {
                    *at = now;
                }
            }
        }
        let registry = &mut *work.registry;
        work.deferred.add(held.stacks, &|p| registry.copy_mark(p));
        match work.unwinder.as_mut() {
            None => false,
            Some(u) => update_tables(
                u,
                &held.events,
                held.spaces,
                work.tracer,
                registry,
                work.deferred,
                work.walked,
            ),
        }
    }

    /// Returns whether work is under way (see [`Tracer::wait`]).
    pub(super) fn on_events(
        &mut self,
        events: &[TaskEvent],
        stacks: Vec<crate::raw::RawUserStack>,
        work: &mut Work<'_, 't, '_>,
    ) -> bool {
        let mut busy = self.take_in(events, stacks, false, work);
        self.refresh_runtimes(work);
        // What was held while the walkers loaded, older than the news the
        // load left for the next round.
        busy |= self.release_held(work);
        let Work {
            tracer,
            registry,
            unwinder,
            deferred,
            ..
        } = work;
        let tracer = *tracer;
        // Tables asked for meanwhile may still be building.
        busy |= unwinder.as_ref().is_some_and(|u| u.building() > 0);
        self.exits.sweep(registry);
        if self.scan.is_none() {
            self.scan = self.exits.due().map(|gone| tracer.scan_user_stacks(gone));
        }
        let scanning = self.scan_step(tracer, registry, unwinder, deferred);
        self.stats.maybe_print(unwinder.as_ref());
        if crate::priority::Lookout::take_raise()
            || deferred.is_waiting()
            || crate::priority::Lookout::news_late()
        {
            self.raised.get_or_insert_with(crate::priority::raise);
        } else {
            self.raised = None;
            crate::priority::Lookout::end_raise();
        }
        busy || scanning
    }

    /// Notes what each event says in the registry (and the exits, and the
    /// processes to look at for an interpreter): for each new or changed
    /// process, its address space if its mappings were read now.
    fn note_events(
        &mut self,
        events: &[TaskEvent],
        registry: &mut Registry,
    ) -> Vec<Option<crate::raw::AddressSpace>> {
        // The address space of each process whose mappings were read now,
        // None where they could not be (it is gone): copied stacks are
        // walked only with tables of the mappings of their own.
        let mut spaces = Vec::new();
        for &ev in events {
            match ev {
                TaskEvent::New(p, space) => {
                    self.stats.processes += 1;
                    let now = registry.note_process(p.tgid, Some(p.start), false);
                    if now {
                        self.runtime_later.push((p, space.mm, false));
                    }
                    spaces.push(now.then_some(space));
                }
                TaskEvent::Changed(p, space) => {
                    let now = registry.note_process(p.tgid, Some(p.start), true);
                    if now {
                        self.runtime_later.push((p, space.mm, true));
                    }
                    spaces.push(now.then_some(space));
                }
                TaskEvent::RuntimeCode {
                    kind,
                    proc,
                    code,
                    tag,
                    at,
                    ..
                } => registry.note_runtime_code(kind, proc, code, tag, at),
                TaskEvent::Exited(p) => {
                    registry.read_perf_map_after_exit(p);
                    self.exits.exited(p);
                }
                TaskEvent::Forked { child, parent, .. } => registry.forked(parent, child),
                TaskEvent::Mapped(p, vmas, n) => registry.note_mapped(p, &vmas[..n]),
            }
        }
        spaces
    }

    /// Takes a slice of the pass over the counts for the user stacks of
    /// processes that exited; once done, lets those processes go: whether
    /// the pass is under way.
    fn scan_step(
        &mut self,
        tracer: &'t Tracer<'_>,
        registry: &mut Registry,
        unwinder: &mut Option<Unwinder>,
        deferred: &mut Deferred,
    ) -> bool {
        // A slice of the pass over the counts at a time, between reads of
        // events.
        match &mut self.scan {
            None => false,
            Some(s) => match s.step(tracer, 4096) {
                None => true,
                Some(stacks) => {
                    let gone = self
                        .scan
                        .take()
                        .map(|s| s.procs().clone())
                        .unwrap_or_default();
                    let mut by_proc: HashMap<Proc, Vec<(u64, Vec<u64>)>> = HashMap::new();
                    for (p, id, frames) in stacks {
                        by_proc.entry(p).or_default().push((id, frames));
                    }
                    for &p in &gone {
                        registry.read_perf_map_after_exit(p);
                        registry.retire(p, by_proc.get(&p).map_or(&[][..], Vec::as_slice));
                        deferred.forget(p);
                        // Unless another process has its pid now, with
                        // tables of its own.
                        if !registry.has_pid(p.tgid) {
                            if let Some(u) = unwinder.as_mut() {
                                u.forget(p.tgid);
                            }
                            if let Some(store) = &self.runtimes {
                                store.remove(p.tgid);
                            }
                        }
                    }
                    self.stats.exited += gone.len();
                    crate::give_back_freed_memory();
                    false
                }
            },
        }
    }
}

/// Gives the unwinder the tables of the processes the events name (the
/// address spaces `spaces` says were read), and walks the copied stacks
/// whose tables are ready, storing each (`walked` is told): whether
/// tables are still being built.
fn update_tables(
    u: &mut Unwinder,
    events: &[TaskEvent],
    spaces: Vec<Option<crate::raw::AddressSpace>>,
    tracer: &Tracer<'_>,
    registry: &mut Registry,
    deferred: &mut Deferred,
    walked: &mut dyn FnMut(u64, &[u64]),
) -> bool {
    let mut spaces = spaces.into_iter();
    for ev in events {
        match *ev {
            TaskEvent::New(p, space) | TaskEvent::Changed(p, space) => {
                // Mappings not read now (the process is
                // gone or exiting, or another) give no new
                // tables: the copies of a process gone are
                // given up now.
                if spaces.next().flatten().is_none() {
                    use crate::deferred::ProcessTables;
                    let gone = crate::process::start_ticks(p.tgid) != Some(p.start)
                        || crate::process::address_space_gone(p.tgid);
                    if gone && u.slice(p.tgid, space).is_none() {
                        deferred.unwalkable(p, space);
                    }
                    continue;
                }
                u.note_address_space(p.tgid, space);
                u.note_process(registry, p.tgid);
            }
            TaskEvent::Forked {
                child,
                space,
                parent,
                map_start,
                map_count,
            } => {
                u.forked(
                    parent,
                    child.tgid,
                    space,
                    (map_start as usize, map_count as usize),
                );
            }
            TaskEvent::Exited(_) | TaskEvent::Mapped(..) | TaskEvent::RuntimeCode { .. } => {}
        }
    }
    // Copies of processes whose tables were let go for room:
    // they block again, and get them back.
    for tgid in deferred.waiting_tgids() {
        u.wanted(registry, tgid);
    }
    let building = u.poll(registry);
    if deferred.is_waiting() {
        walk_copies(u, tracer, registry, deferred, walked, true);
    }
    building
}

/// Walks the copies of every process that has tables now (see
/// [`Deferred::walk_ready`]), stores their frames, and tells `walked` of
/// each copy stored. `patient`: a copy whose runtime is not ready to step
/// over its frames yet waits for it (not at the end).
pub(super) fn walk_copies(
    u: &mut Unwinder,
    tracer: &Tracer<'_>,
    registry: &Registry,
    deferred: &mut Deferred,
    walked: &mut dyn FnMut(u64, &[u64]),
    patient: bool,
) {
    let guess = |tgid| registry.jit_keeps_frame_pointers(tgid);
    deferred.walk_ready(
        u,
        (&|tgid| registry.start_of(tgid), &guess),
        (
            &|p, mark, at, read| registry.step_copy(p, mark, at, read),
            &|p| !patient || registry.copy_ready(p),
        ),
        &mut |id, frames| {
            let stored = tracer.store_stack(id, frames);
            if stored {
                walked(id, frames);
            }
            stored
        },
    );
}
