//! A trace from start to end: start-up and its fallback, the event loop
//! with `-i`'s intervals, the end (stop, read, build, write) and what is
//! said on stderr after the profile.

use super::*;

/// A trace under way: the outputs opened, and what the BPF program's news
/// are read into. The program itself (its [`Tracer`]) is held apart, by
/// [`trace`]: the event loop's handler borrows it while the session is
/// changed.
pub(super) struct Session<'a> {
    /// What is traced, and how it is written.
    config: &'a Config,
    /// Opened before anything else, and discarded if the trace fails.
    outputs: Outputs,
    /// Set by SIGINT/SIGTERM, or when an interval could not be written.
    stop: Arc<AtomicBool>,
    /// Names the frames.
    symbolizer: Symbolizer,
    /// The processes traced, their mappings and what names their frames.
    registry: Registry,
    /// Gives the BPF program the unwind tables of the processes traced
    /// (None where user stacks are walked with frame pointers).
    unwinder: Option<Unwinder>,
    /// The user stacks copied for userspace to walk.
    deferred: Deferred,
    /// `OFFCPUTIME_STATS_INTERVAL`'s line, its clock started at start-up;
    /// taken by the event loop.
    stats: Option<StatsLine>,
    /// Raises the event loop's priority when copied stacks are lost or its
    /// news is late (see priority.rs): from start-up until the news is
    /// drained at the trace's end.
    lookout: Option<crate::priority::Lookout>,
    /// `-i`: the intervals written so far.
    intervals: Option<Intervals>,
    /// `--duration`: when tracing ends.
    deadline: Option<Instant>,
    /// When the event loop stopped the trace, and the process's CPU time
    /// then (ms): `-v` measures the report from there.
    stopped: Option<(Instant, f64)>,
    /// The hook's first kernel frame is the exact instruction pointer,
    /// not a return address (see [`crate::tracer::AttachedHook`]).
    kernel_first: bool,
    /// Runtimes' frames asked for (not --no-python) where the kernel
    /// cannot walk them: said at the end, if such a process was traced.
    runtimes_unwalked: bool,
    /// `--timeline`: where the blocks go.
    timeline: Option<crate::timeline::Timeline>,
    /// `--timeline`, `--chains`: the blocks sent so far.
    records: Option<crate::records::Records>,
}

/// What the end of a trace found besides the counts.
pub(super) struct End {
    /// The window traced, in CLOCK_MONOTONIC nanoseconds.
    window: (u64, u64),
    /// When tracing ended: `-v` measures the report from there.
    ended: Instant,
    /// The process's CPU time when tracing ended (ms).
    ended_cpu: f64,
    /// How long stopping and reading took (ms).
    read_ms: f64,
    /// Stacks of threads blocked since before the start without a user
    /// stack, whether this kernel reads them, and whether the hook takes
    /// stacks at the switch-in (see [`report_losses`]).
    unreadable: (usize, bool, bool),
    /// `OFFCPUTIME_TEST_KSTACK_CHECK`: the kernel stacks walked, with the
    /// kernel's own walks of the same threads.
    kernel_stack_pairs: Option<Result<crate::ksyms::StackPairs>>,
    /// Where the runtimes' walkers were loaded (`-v`).
    runtime_walkers: crate::tracer::RuntimeWalkers,
    /// Wake-ups whose hook the kernel skipped (see
    /// [`Tracer::wakeups_missed`]).
    wakeups_missed: u64,
    /// What the BPF program's tables held at the end (`-v`).
    in_use: Option<InUse>,
}

/// The stacks the BPF program stored (not the copies walked here) that
/// the counts name, their frames, and the counts, read at the end: what
/// its tables hold (`-v`, for measuring their memory against it).
struct InUse {
    stacks: usize,
    frames: usize,
    counts: usize,
}

/// The profile written: the whole trace's, or with `-i` the last
/// interval's.
pub(super) struct Written {
    /// Its off-CPU and on-CPU samples and counters.
    profile: Profile,
    /// Stacks that could not be shown (of every interval, with `-i`).
    missed: usize,
    /// Some off-CPU time was recorded.
    recorded: bool,
    /// When the profile was built, in ms after the end (without `-i`).
    built_ms: Option<f64>,
}

/// How long [`Session::wait`] handles the program's news.
#[derive(Clone, Copy)]
enum News {
    /// Until this time, or until tracing ends (`None`: no time of its own).
    Until(Option<Instant>),
    /// The trace is stopped: the news left, in one round.
    Left,
}

impl<'a> Session<'a> {
    /// Start-up: the outputs opened first (a path that cannot be written
    /// fails before any measurement), then the BPF program loaded and
    /// attached, with the unwind tables of the processes traced; what was
    /// attached is said. Returns the session and the program.
    pub(super) fn start<'o>(
        config: &'a Config,
        began: Instant,
        objects: &'o mut crate::tracer::Objects,
    ) -> Result<(Session<'a>, Tracer<'o>)> {
        let outputs = Outputs::open(config)?;
        let timeline = match &config.timeline {
            Some(path) => Some(crate::timeline::Timeline::open(path)?),
            None => None,
        };
        // With -i, the chains' records are kept interval by interval.
        let by_interval = config.interval.is_some() && config.chain_depth.is_some();
        let records = match (&timeline, config.tracer.records_min_ns()) {
            (_, None) => None,
            (Some(t), Some(_)) => Some(crate::records::Records::new(t.scratch()?)),
            (None, Some(_)) if by_interval => None,
            (None, Some(_)) => Some(crate::records::Records::new(outputs.scratch()?)),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut symbolizer = symbolizer_for(config);
        let mut registry = Registry::new();
        let mut unwinder: Option<Unwinder> = None;
        let mut raised = crate::priority::raise_start();
        crate::hold_freed_memory(true);
        let (tracer, started) = start_tracer(config, &stop, objects, &mut registry, &mut unwinder)?;
        // The window is open: the threads measured are not kept from a CPU.
        raised.leave_realtime();
        let tracer = fall_back(tracer, &mut unwinder);
        announce(config, &tracer, began, started);
        crate::hold_freed_memory(false);
        crate::give_back_freed_memory();
        if config.shape.mode.kernel() {
            symbolizer.warm_up_kernel();
        }

        let deadline = config.duration.map(|d| tracer.window_started_at() + d);
        let mut deferred = Deferred::new(config.tracer.max_stack_depth as usize);
        if let Some(stall) = config.tracer.test.stall_copy_walk {
            // For tests: copied stacks wait this long for their walk, as if
            // their tables took that long (a large new program's do).
            deferred.stall_walks(stall);
        }
        let stats = StatsLine::new(config.tracer.test.stats_interval, began);
        // Started before start-up's raise ends: under a burst of new threads
        // the loop may get no CPU from then on until the lookout raises it.
        let lookout = Some(crate::priority::Lookout::start(
            tracer.copies_lost_counter(),
            tracer.news_waiting(),
            deadline,
        ));
        drop(raised);

        if config.interval.is_some() {
            symbolizer.keep_user_names();
        }
        let mut intervals = Intervals::start(config, &tracer)?;
        if let Some(iv) = intervals.as_mut().filter(|_| by_interval) {
            let batch = crate::records::Records::new(outputs.scratch()?);
            iv.records = Some(IntervalRecords::new(batch, iv.schedule.end_of(0)));
        }
        // Copied stacks follow the frames of the runtimes the BPF program
        // walks.
        let walked = tracer.runtime_store().is_some();
        registry.walk_runtimes(&|kind| walked && config.tracer.runtime_on(kind));
        registry.keep_call_glue(config.python_glue);
        let session = Session {
            config,
            outputs,
            stop,
            symbolizer,
            registry,
            unwinder,
            deferred,
            stats: Some(stats),
            lookout,
            intervals,
            deadline,
            stopped: None,
            kernel_first: tracer.hook().kernel_first_frame_is_ip(),
            runtimes_unwalked: config.tracer.runtimes() && tracer.runtime_store().is_none(),
            timeline,
            records,
        };
        Ok((session, tracer))
    }

    /// The event loop: the program's news handled until tracing ends (at
    /// `--duration`, a signal, the window's end); with `-i`, each interval
    /// cut as it ends, and written once its copied stacks are walked.
    pub(super) fn run(&mut self, tracer: &mut Tracer<'_>) -> Result<()> {
        let stats = self.stats.take().expect("the event loop runs once");
        let mut collector = Collector::new(
            self.config,
            stats,
            tracer.runtime_store(),
            tracer.hooks_runtimes(),
        );
        loop {
            // With -i, the end of the current interval, unless the window
            // ends first.
            let cut = self
                .intervals
                .as_ref()
                .map(|i| i.schedule.end_of(i.taken))
                .filter(|&b| tracer.end_ns().is_none_or(|end| b < end));
            let until = match (self.deadline, cut.map(instant_of_monotonic)) {
                (Some(d), Some(c)) => Some(d.min(c)),
                (d, c) => d.or(c),
            };
            self.wait(tracer, &mut collector, News::Until(until))?;
            let Some(cut) = cut else {
                break;
            };
            if self.stop.load(Ordering::SeqCst) || crate::raw::monotonic_ns() < cut {
                break;
            }
            self.cut(tracer, cut)?;
        }
        // The trace stops here: the news of its last moments (a process
        // whose stack was copied as the trace ended, or by the end
        // iterator, and its mappings) is handled before the end walks the
        // copies.
        let mut collector = collector.without_scan();
        tracer.stop()?;
        self.stopped = Some((Instant::now(), process_cpu_ms()));
        let drained = self.wait(tracer, &mut collector, News::Left);
        // Nothing is late once the news is drained: the report runs at the
        // user's priority, the loop out of the real-time class (the
        // collector, dropped with this call, gives back its nice value).
        self.lookout = None;
        crate::priority::Lookout::end_raise();
        drained
    }

    /// Waits for the program's news as `news` says and hands it to
    /// `collector`; with `-i`, the intervals held are written as the
    /// copies of stacks they count are walked. A failed write stops the
    /// trace, and is returned.
    fn wait<'t>(
        &mut self,
        tracer: &'t Tracer<'_>,
        collector: &mut Collector<'t>,
        news: News,
    ) -> Result<()> {
        let Session {
            config,
            outputs,
            stop,
            symbolizer,
            registry,
            unwinder,
            deferred,
            intervals,
            kernel_first,
            records,
            ..
        } = self;
        let stop = &**stop;
        // For tests: no news read from a time on, until the trace stops.
        let mut news = news;
        let mut stalled_until = None;
        if let (News::Until(to), Some(after)) = (news, config.tracer.test.stall_news_after) {
            let from = tracer.window_started_at() + after;
            if to.is_none_or(|to| to > from) {
                stalled_until = Some(to);
                news = News::Until(Some(from));
            }
        }
        let mut failed = None;
        let handle = |events: &[crate::raw::TaskEvent], stacks| {
            let busy = collector.on_events(
                events,
                stacks,
                &mut Work {
                    tracer,
                    registry,
                    unwinder,
                    deferred,
                    walked: &mut |id, frames| {
                        if let Some(iv) = intervals.as_mut() {
                            iv.held.walked(id, frames);
                        }
                    },
                },
            );
            hand_blocks(tracer.take_blocks(), records, intervals);
            // Intervals taken while copies they count waited: written
            // once those are walked (just now, as a rule).
            if let (Some(iv), None) = (intervals.as_mut(), failed.as_ref()) {
                let written = iv.write_held(
                    deferred,
                    *kernel_first,
                    (&mut *registry, &*symbolizer),
                    config,
                    outputs.parts(),
                );
                if let Err(e) = written {
                    failed = Some(e);
                    stop.store(true, Ordering::SeqCst);
                }
            }
            busy
        };
        match news {
            News::Until(until) => tracer.wait(until, stop, handle)?,
            News::Left => tracer.drain(handle)?,
        }
        if let Some(to) = stalled_until {
            while !stop.load(Ordering::SeqCst) && to.is_none_or(|to| Instant::now() < to) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// `-i`: the interval that ends at `cut` (CLOCK_MONOTONIC) is cut and
    /// taken from the table, to be written once the copies of stacks it
    /// counts are walked.
    fn cut(&mut self, tracer: &Tracer<'_>, cut: u64) -> Result<()> {
        if self.intervals.is_none() {
            return Ok(());
        }
        if let Some(stall) = self.config.tracer.test.stall_before_cut {
            // For tests: the interval's end passed, its blocks under way
            // not cut yet for this long (a loaded machine's late wake-up).
            std::thread::sleep(stall);
        }
        tracer.cut(cut)?;
        // A switch-in that began before the cut may still be adding to
        // the interval on another CPU: a program runs for microseconds.
        std::thread::sleep(Duration::from_millis(2));
        // --chains: the interval's blocks are those read by now (the cut
        // iterator's among them).
        let by_interval = self
            .intervals
            .as_ref()
            .is_some_and(|iv| iv.records.is_some());
        if by_interval {
            let blocks = tracer.take_blocks_now()?;
            hand_blocks(blocks, &mut self.records, &mut self.intervals);
        }
        let Some(iv) = self.intervals.as_mut() else {
            return Ok(());
        };
        let records = match iv.records.as_mut() {
            Some(r) => Some(r.cut(iv.schedule.end_of(iv.taken + 1), self.outputs.scratch()?)),
            None => None,
        };
        let also = records.as_ref().map(|r| r.wanted()).unwrap_or_default();
        let taken = tracer.take_intervals_with(iv.taken, also);
        iv.taken += 1;
        let raw = taken?;
        // The copies of stacks its blocks were counted under were put on
        // the ring buffer before they were counted: all of them are read
        // now, and it is written once they are walked.
        match tracer.take_deferred() {
            Ok(stacks) => self.deferred.add(stacks, &|p| self.registry.copy_mark(p)),
            Err(e) => eprintln!("offcputime: {e:#}"),
        }
        let stacks = records.as_ref().map(|r| r.wanted().0).unwrap_or_default();
        iv.held.push(raw, records, stacks, Instant::now());
        iv.write_held(
            &self.deferred,
            self.kernel_first,
            (&mut self.registry, &self.symbolizer),
            self.config,
            self.outputs.parts(),
        )
    }

    /// The end of tracing: the program stopped, every copied stack walked
    /// or given up, the intervals held written, and the counts read (with
    /// `-i`, those of the intervals not taken yet). The program is let go.
    pub(super) fn end(&mut self, mut tracer: Tracer<'_>) -> Result<(crate::raw::RawProfile, End)> {
        let (ended, ended_cpu) =
            (self.stopped).unwrap_or_else(|| (Instant::now(), process_cpu_ms()));
        tracer.stop()?;
        let window = tracer.window_ns();
        // JIT code compiled since the perf maps were last read.
        self.registry.read_perf_maps_at_end();
        let intervals = &mut self.intervals;
        walk_deferred(
            &tracer,
            &mut self.deferred,
            &mut self.registry,
            self.unwinder.as_mut(),
            &mut |id, frames| {
                if let Some(iv) = intervals.as_mut() {
                    iv.held.walked(id, frames);
                }
            },
        );
        if let Some(iv) = self.intervals.as_mut() {
            // Every copy is walked or given up by now.
            iv.write_held(
                &self.deferred,
                self.kernel_first,
                (&mut self.registry, &self.symbolizer),
                self.config,
                self.outputs.parts(),
            )?;
        }
        // The blocks of the timeline read last (by the end's drain, the
        // end iterator's among them): their stacks and wakers are read with
        // the counts'.
        hand_blocks(tracer.take_blocks(), &mut self.records, &mut self.intervals);
        let mut also: (Vec<u64>, Vec<u64>) = match self.records.as_ref() {
            Some(r) => r.wanted(),
            None => Default::default(),
        };
        if let Some(r) = self.intervals.as_ref().and_then(|iv| iv.records.as_ref()) {
            let (stacks, wakers) = r.batch.wanted();
            also.0.extend(stacks);
            also.1.extend(wakers);
        }
        let mut raw = match self.intervals {
            Some(_) => tracer.take_intervals_with(u32::MAX, also),
            None => tracer.read_with(also),
        }?;
        Deferred::complete(&mut raw);
        let read_ms = ended.elapsed().as_secs_f64() * 1e3;
        // The profiler's own frames on top of the stacks taken at switches
        // are its programs', which the kernel names only while they are
        // loaded (until the tracer is dropped below, and the kernel frees
        // them a grace period later): named now, so that they are dropped
        // by name and no kallsyms is read for them.
        self.symbolizer
            .kernel(&crate::profile::kernel_addrs(&raw, self.kernel_first));
        let unreadable = raw
            .entries
            .iter()
            .filter(|e| e.user_stack == StackRef::NotReadable)
            .count();
        // Only said under -v: not counted otherwise.
        let in_use = self.config.verbose.then(|| {
            let (stacks, frames) = raw.stacks.count_where(|id| !crate::deferred::is_copy(id));
            InUse {
                stacks,
                frames,
                counts: raw.entries.len(),
            }
        });
        let end = End {
            window,
            ended,
            ended_cpu,
            read_ms,
            in_use,
            unreadable: (
                unreadable,
                tracer.start_user_stacks(),
                tracer.hook().stacks_at_switch_in(),
            ),
            kernel_stack_pairs: (self.config.tracer.test.kstack_check)
                .then(|| tracer.kernel_stack_pairs()),
            runtime_walkers: tracer.runtime_walkers(),
            wakeups_missed: tracer.wakeups_missed(),
        };
        Ok((raw, end))
    }

    /// The profile built from what was read at the end (`raw`) and written
    /// to every output, each file put in place; with `-i`, the intervals
    /// not written yet, the last up to the window's end. Says when nothing
    /// was recorded.
    pub(super) fn write(&mut self, mut raw: crate::raw::RawProfile, end: &End) -> Result<Written> {
        let config = self.config;
        // The records' stacks named first, from the stacks read (the
        // profile lets them go once built); then the timeline, whose
        // failure is returned once the profile is written; then the
        // chains, the profile's blocks with --chains.
        let named = name_records(
            self.records.take(),
            &mut raw,
            (&mut self.registry, &self.symbolizer),
            self.kernel_first,
        )?;
        let timeline = match &named {
            Some(named) => self.write_timeline(named, raw.counters.timeline_lost),
            None => Ok(()),
        };
        let chains = match (&named, config.chain_depth) {
            (Some(named), Some(depth)) if self.intervals.is_none() => {
                Some(self.follow_chains(named, depth, &raw, end.window)?)
            }
            _ => None,
        };
        drop(named);
        let written = if let Some(iv) = self.intervals.as_mut() {
            // --chains: the blocks of the intervals not written yet.
            let named = name_records(
                iv.records.take().map(|r| r.batch),
                &mut raw,
                (&mut self.registry, &self.symbolizer),
                self.kernel_first,
            )?;
            let mut profile = iv.write_rest(
                (raw, named.as_ref()),
                end.window.1,
                self.kernel_first,
                (&mut self.registry, &self.symbolizer),
                config,
                self.outputs.parts(),
            )?;
            self.outputs.finish_parts(config)?;
            iv.finish_push(config.verbose);
            iv.report_late();
            if let Some(depth) = config.chain_depth {
                report_chains(
                    &iv.chains,
                    profile.counters.timeline_lost,
                    depth,
                    config.verbose,
                );
            }
            // What every interval had, not the last one's alone.
            (
                profile.counters.user_unmapped_stacks,
                profile.counters.user_unmapped_ns,
            ) = iv.unmapped;
            Written {
                profile,
                missed: iv.missed,
                recorded: iv.recorded,
                built_ms: None,
            }
        } else {
            self.write_whole(raw, end, chains)?
        };
        if !written.recorded {
            eprintln!("offcputime: no off-CPU time was recorded for the chosen threads");
        }
        timeline?;
        Ok(written)
    }

    /// `--timeline`: the blocks written, and said on stderr with what was
    /// lost.
    fn write_timeline(&mut self, named: &crate::records::Named, lost: u64) -> Result<()> {
        let Some(timeline) = self.timeline.take() else {
            return Ok(());
        };
        let path = self.config.timeline.clone().unwrap_or_default();
        // With --chains the records are every thread's blocks.
        let only = (self.config.chain_depth.is_some())
            .then(|| self.config.tracer.timeline_min_ns.unwrap_or(0));
        let w = timeline.write(named, only)?;
        let min_ms = self.config.tracer.timeline_min_ns.unwrap_or(0) as f64 / 1e6;
        let samples = if self.config.tracer.on_cpu_hz.is_some() {
            format!(", {}", count(w.samples, "on-CPU sample", "on-CPU samples"))
        } else {
            String::new()
        };
        eprintln!(
            "offcputime: timeline: {} of at least {min_ms} ms{samples} and {} written to {} \
             ({:.1} MB)",
            count(w.blocks, "block", "blocks"),
            count(w.flows, "wake-up", "wake-ups"),
            path.display(),
            w.bytes as f64 / 1e6,
        );
        if self.config.verbose {
            eprintln!(
                "offcputime: timeline: {} (thread, stacks, state and waker) among them",
                count(w.keys as u64, "distinct block", "distinct blocks"),
            );
        }
        if lost > 0 {
            eprintln!(
                "offcputime: timeline: {} (blocks or samples) lost for a full ring buffer, read \
                 too late: the timeline lacks them, the profile has them",
                count(lost, "record", "records"),
            );
        }
        Ok(())
    }

    /// `--chains`: the blocks the filters keep, each followed down its
    /// chain over the window; what was cut or lost said on stderr.
    fn follow_chains(
        &self,
        named: &crate::records::Named,
        depth: u32,
        raw: &crate::raw::RawProfile,
        window: (u64, u64),
    ) -> Result<(Vec<profile::Sample>, Option<profile::WaitGraph>)> {
        let chains = follow(named, depth, self.config, window, self.config.graph)?;
        report_chains(
            &chains,
            raw.counters.timeline_lost,
            depth,
            self.config.verbose,
        );
        if let Some(g) = &chains.graph {
            report_knots(g);
        }
        Ok((chains.samples, chains.graph))
    }

    /// Without `-i`: the whole trace's profile, written to every output
    /// (`chains`: with `--chains`, its blocks).
    fn write_whole(
        &mut self,
        mut raw: crate::raw::RawProfile,
        end: &End,
        chains: Option<(Vec<profile::Sample>, Option<profile::WaitGraph>)>,
    ) -> Result<Written> {
        let config = self.config;
        crate::oncpu::divide(&mut raw, config.shape.mode.user());
        let mut profile = profile::build(
            &raw,
            &mut self.registry,
            &self.symbolizer,
            self.kernel_first,
        );
        if let Some((samples, graph)) = chains {
            with_chains(&mut profile, samples);
            profile.graph = graph.map(Arc::new);
        }
        // What was read is let go before the output is made: its frames
        // grow with the stacks, and would be held beside the output's
        // (see BENCHMARKS.md, peak RSS).
        drop(raw);
        let built_ms = Some(end.ended.elapsed().as_secs_f64() * 1e3);
        profile.window = Some(profile::Window::from_monotonic(end.window.0, end.window.1));
        if let Some(filter) = &config.filter {
            filter_profile(filter, &mut profile, config);
        }
        self.outputs
            .write(config, |format, out| render(&profile, config, format, out))?;
        Ok(Written {
            missed: profile.missed_stacks(config.shape.mode),
            recorded: !profile.samples.is_empty(),
            profile,
            built_ms,
        })
    }

    /// What is said on stderr after the profile: what was lost or could
    /// not be read, named or walked, and with `-v` the summaries.
    pub(super) fn report(&mut self, written: &Written, mut end: End) {
        let (config, profile) = (self.config, &written.profile);
        report_losses(profile, written.missed, config, end.unreadable);
        report_kernel_stacks(
            &profile.counters,
            config.verbose,
            end.kernel_stack_pairs.take(),
        );
        report_denied(&self.registry, &self.symbolizer, config);
        if let Some(u) = &self.unwinder {
            report_unwinding(u, &self.deferred, profile, config.verbose);
        }
        report_runtimes(
            &mut self.registry,
            profile,
            (config.verbose, self.runtimes_unwalked),
            &|kind| config.tracer.runtime_on(kind),
        );
        report_namespaces(&self.registry, config.verbose);
        if end.wakeups_missed > 0 {
            eprintln!(
                "offcputime: {} from interrupts came while the wake-up hook ran for another on \
                 the same CPU, which the kernel does not run it inside: the blocks they ended \
                 have an unknown waker",
                count(end.wakeups_missed, "wake-up", "wake-ups"),
            );
        }
        report_on_cpu(
            profile,
            self.intervals.as_ref().map(|iv| iv.running_ns),
            config,
        );
        if config.verbose {
            self.report_summary(written, &end);
        }
    }

    /// `-v`: what was traced, how long the report took, and the counters.
    fn report_summary(&self, written: &Written, end: &End) {
        let profile = &written.profile;
        let (window_start, window_end) = end.window;
        let (stacks, blocks, total_ns) = match &self.intervals {
            Some(iv) => (
                count(iv.current, "interval", "intervals"),
                iv.blocks,
                iv.total_ns,
            ),
            None => (
                count(profile.samples.len() as u64, "stack", "stacks"),
                profile.off_cpu().map(|s| s.count).sum::<u64>(),
                profile.off_cpu().map(|s| s.total_ns).sum::<u64>(),
            ),
        };
        let read_ms = end.read_ms;
        if end.runtime_walkers != crate::tracer::RuntimeWalkers::Off {
            eprintln!("offcputime: runtimes' walkers: {}", end.runtime_walkers);
        }
        eprintln!(
            "offcputime: traced {:.3} s (CLOCK_MONOTONIC {:.6} to {:.6}); {stacks}, {}, \
             {:.3} s off-CPU in total; {} under way at the start counted from it, {} in \
             progress at the end counted up to it; report in {:.1} ms (read {read_ms:.1} ms{}; \
             {:.1} ms of CPU)",
            (window_end - window_start) as f64 / 1e9,
            window_start as f64 / 1e9,
            window_end as f64 / 1e9,
            count(blocks, "block", "blocks"),
            total_ns as f64 / 1e9,
            count(profile.counters.blocks_at_start, "block", "blocks"),
            profile.counters.blocks_at_end,
            end.ended.elapsed().as_secs_f64() * 1e3,
            written.built_ms.map_or(String::new(), |b| format!(
                ", symbolized and merged {:.1} ms",
                b - read_ms
            )),
            process_cpu_ms() - end.ended_cpu,
        );
        // At their own sizes: a stack its key and frames, a count its
        // key (as the mode keys it) and value.
        if let Some(u) = &end.in_use {
            let key = if self.config.tracer.counts_whole() {
                std::mem::size_of::<crate::bpf::types::offcpu_key>()
            } else {
                std::mem::size_of::<crate::bpf::types::offcpu_key_plain>()
            };
            let count_bytes = key + std::mem::size_of::<crate::bpf::types::offcpu_val>();
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            eprintln!(
                "offcputime: in use at the end: {} of {} ({:.2} MiB at their own sizes), {} \
                 ({:.2} MiB)",
                count(u.stacks as u64, "stored stack", "stored stacks"),
                count(u.frames as u64, "frame", "frames"),
                mib(u.stacks * 8 + u.frames * 8),
                count(u.counts as u64, "count", "counts"),
                mib(u.counts * count_bytes),
            );
        }
        report_counters(
            profile,
            self.config,
            self.intervals.as_ref().map(|iv| iv.held.stats()),
        );
    }
}

/// Checks privileges and targets, installs the signal handler, and loads
/// and attaches the BPF program, writing the unwind tables of the
/// processes traced (see [`StartingTables`]); with why DWARF unwinding
/// could not be set up, if it could not, and when the load began (after
/// the checks: `-v` measures the load from there).
fn start_tracer<'o>(
    config: &Config,
    stop: &Arc<AtomicBool>,
    objects: &'o mut crate::tracer::Objects,
    registry: &mut Registry,
    unwinder: &mut Option<Unwinder>,
) -> Result<((Tracer<'o>, Option<anyhow::Error>), Instant)> {
    prepare(config, stop)?;
    let started = Instant::now();
    let opts = &config.tracer;
    use crate::tracer::RuntimeKinds;
    let running = match opts.test.runtimes_at_start.as_deref() {
        Some("0") => RuntimeKinds::default(),
        Some("1") => RuntimeKinds::ALL,
        Some(names) => RuntimeKinds::of(|k| names.split(',').any(|n| n.trim() == k.spec().name)),
        None => {
            let found = crate::runtime::maybe_running(&opts.tgids, &|k| opts.runtime_on(k));
            RuntimeKinds::of(|k| found.contains(&k))
        }
    };
    let opts = crate::tracer::TracerOptions {
        runtimes_running: running.and(opts.runtime_kinds()),
        ..opts.clone()
    };
    let tracer = Tracer::start(
        objects,
        &opts,
        &mut StartingTables::new(config, registry, unwinder),
    )?;
    Ok((tracer, started))
}

/// Says what was attached (with `-v`, how long it took: `began` is when
/// the program started, `started` when the load began), what is traced,
/// and that `--sample` saves little where stacks are walked at every
/// switch-out.
fn announce(config: &Config, tracer: &Tracer<'_>, began: Instant, started: Instant) {
    if config.verbose {
        eprintln!(
            "offcputime: attached {} {:.1} ms after start (load and attach {:.1} ms: {})",
            tracer.hook(),
            began.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3,
            tracer.phases(),
        );
        eprintln!("offcputime: {}", crate::tracer::Tracer::core_relocations());
        eprintln!("offcputime: {}", tracer.build());
    }
    eprintln!("{}", config.status_line());
    if config.tracer.sample_ns > 0 && !tracer.hook().stacks_at_switch_in() {
        eprintln!(
            "offcputime: --sample on {}: the stacks are walked at every switch-out, before a \
             block's length is known, so sampling saves little here (the finish_task_switch \
             kprobe, where the kernel has kprobes and no --state or -i is asked, walks only the \
             blocks taken)",
            tracer.hook()
        );
    }
}

/// `--graph`: the knots on stderr, heaviest first, each with what its
/// nodes were doing.
fn report_knots(g: &profile::WaitGraph) {
    let secs = |ns: u64| ns as f64 / 1e9;
    eprintln!(
        "offcputime: wait-for graph: {}, {}, {} (what others wait for, waiting for nothing \
         else for {:.0}% of the window or more), by the time waited on them:",
        count(g.nodes.len() as u64, "node", "nodes"),
        count(g.edges.len() as u64, "edge", "edges"),
        count(g.knots.len() as u64, "knot", "knots"),
        100.0 * g.min_edge_ns as f64 / g.window_ns.max(1) as f64,
    );
    for (i, k) in g.knots.iter().enumerate() {
        let nodes: Vec<String> = (k.nodes.iter())
            .map(|&n| {
                let node = &g.nodes[n];
                if node.what.is_empty() {
                    node.name.clone()
                } else if node.pseudo {
                    format!("{} (from {})", node.name, node.what)
                } else {
                    format!("{} ({} {:.3} s)", node.name, node.what, secs(node.own_ns))
                }
            })
            .collect();
        eprintln!(
            "offcputime:   {}. {:.3} s waited on {}",
            i + 1,
            secs(k.waited_ns),
            nodes.join(", ")
        );
    }
}

/// `--chains`: the blocks of `named` that the filters keep followed down
/// their chains inside `window` (`graph`: the wait-for graph too).
pub(super) fn follow(
    named: &crate::records::Named,
    depth: u32,
    config: &Config,
    window: (u64, u64),
    graph: bool,
) -> Result<crate::chains::Chains> {
    let t = &config.tracer;
    crate::chains::follow(
        named,
        crate::chains::Options {
            depth,
            min_ns: t.min_block_ns,
            max_ns: t.max_block_ns,
            mode: config.shape.mode,
            graph_of: graph.then_some(window.1 - window.0),
            window,
        },
    )
    .context("cannot read the records of the blocks back")
}

/// The profile's blocks are the chains' `samples` (no counts of blocks were
/// kept); with `--on-cpu` its running time stays.
pub(super) fn with_chains(profile: &mut Profile, samples: Vec<profile::Sample>) {
    profile
        .samples
        .retain(|s| s.state == Some(profile::OffState::Running));
    profile.samples.extend(samples);
    profile::sort_samples(&mut profile.samples);
}

/// What the chains cut or could not follow, said on stderr (`lost`: the
/// records lost for a full ring); with `verbose`, what they followed.
pub(super) fn report_chains(chains: &crate::chains::Chains, lost: u64, depth: u32, verbose: bool) {
    let share = |ns: u64| 100.0 * ns as f64 / chains.ns.max(1) as f64;
    if chains.cycle_ns > 0 {
        eprintln!(
            "offcputime: chains: {:.1}% of the time followed met a thread already on its \
             chain (a cycle): cut there, [cycle]",
            share(chains.cycle_ns)
        );
    }
    if chains.deep_ns > 0 {
        eprintln!(
            "offcputime: chains: {:.1}% of the time followed went deeper than \
             --chain-depth {depth}: cut there, [deeper]",
            share(chains.deep_ns)
        );
    }
    if chains.unindexed > 0 {
        eprintln!(
            "offcputime: chains: {} after the first {} not followed (the most held in \
             memory): their time is missing, and where a wait was followed into them it \
             shows as [running]",
            count(chains.unindexed, "block", "blocks"),
            crate::chains::MOST_BLOCKS,
        );
    }
    if chains.late > 0 {
        eprintln!(
            "offcputime: chains: {} read after their interval was written: their time \
             there is missing, and where a wait was followed into them it shows as [running]",
            count(chains.late, "block", "blocks"),
        );
    }
    if lost > 0 {
        eprintln!(
            "offcputime: chains: {} lost for a full ring buffer, read too late: their \
             time is missing, and where a wait was followed into them it shows as \
             [running]",
            count(lost, "block", "blocks"),
        );
    }
    if verbose {
        eprintln!(
            "offcputime: chains: {} followed, {} us in all, {:.1}% ending in a wake-up not \
             seen",
            count(chains.blocks, "block", "blocks"),
            profile::ns_to_us(chains.ns),
            share(chains.unknown_ns),
        );
    }
}

/// Blocks read from the program: to the records of the whole trace
/// (`--timeline`, `--chains` without `-i`) and to the interval's (`--chains`
/// with `-i`).
fn hand_blocks(
    blocks: Vec<crate::raw::RawBlock>,
    records: &mut Option<crate::records::Records>,
    intervals: &mut Option<Intervals>,
) {
    let by_interval = intervals.as_mut().and_then(|iv| iv.records.as_mut());
    match (records.as_mut(), by_interval) {
        (Some(r), Some(i)) => {
            i.add(blocks.clone());
            r.add(blocks);
        }
        (Some(r), None) => r.add(blocks),
        (None, Some(i)) => i.add(blocks),
        (None, None) => {}
    }
}

/// The stacks of `records` named from what was read (`raw`), as the
/// profile's are.
pub(super) fn name_records(
    records: Option<crate::records::Records>,
    raw: &mut crate::raw::RawProfile,
    (registry, symbolizer): (&mut Registry, &Symbolizer),
    kernel_first: bool,
) -> Result<Option<crate::records::Named>> {
    records
        .map(|r| r.name(raw, registry, symbolizer, kernel_first, Deferred::complete))
        .transpose()
        .context("cannot read the records of the blocks back")
}
