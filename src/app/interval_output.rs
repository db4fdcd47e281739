//! `-i`: the intervals written (and pushed) as they end.

use super::*;

/// `-i`: the interval under way, and what was written so far.
pub(super) struct Intervals {
    /// `--push`, `--push-otlp`: where each interval is sent as well, in
    /// the order of [`Config::push`].
    pub(super) pushers: Vec<crate::push::Pusher>,
    /// The OTLP outputs that get every interval (no `{n}` in the name), by
    /// their place in [`Config::outputs`]: each interval a request that
    /// adds to the dictionary of those before.
    pub(super) otlp: HashMap<usize, crate::output::otlp::Stream>,
    pub(super) schedule: crate::intervals::Schedule,
    /// The interval to write next.
    pub(super) current: u32,
    /// The interval to take from the table next: later than `current`
    /// while intervals wait for their copied stacks (`held`).
    pub(super) taken: u32,
    pub(super) held: crate::intervals::Held<crate::records::Records>,
    pub(super) splitter: crate::intervals::Splitter,
    /// Some interval had off-CPU time.
    pub(super) recorded: bool,
    /// Stacks that could not be shown, in every interval.
    pub(super) missed: usize,
    /// Blocks (parts of blocks in an interval) and their time, in every
    /// interval.
    pub(super) blocks: u64,
    pub(super) total_ns: u64,
    /// `--on-cpu`: the running time, in every interval.
    pub(super) running_ns: u64,
    /// User stacks all `[unknown]`, and their time, in every interval
    /// (see [`crate::raw::LossCounters::user_unmapped_stacks`]).
    pub(super) unmapped: (u64, u64),
    /// `--chains`: the blocks of the interval under way ...
    pub(super) records: Option<IntervalRecords>,
    /// ... and what the chains of every interval followed and cut.
    pub(super) chains: crate::chains::Chains,
}

/// `--chains` with `-i`: the records of the blocks of the interval under
/// way, in a scratch file of its own; each interval's chains are followed
/// in its blocks alone, cut at its edges, as the profile is.
pub(super) struct IntervalRecords {
    pub(super) batch: crate::records::Records,
    /// Blocks read before the interval's cut that reach past its end (they
    /// ended while it was cut): the next interval's too.
    carry: Vec<crate::raw::RawBlock>,
    /// The end of the interval under way.
    end: u64,
}

impl IntervalRecords {
    pub(super) fn new(batch: crate::records::Records, end: u64) -> IntervalRecords {
        IntervalRecords {
            batch,
            carry: Vec::new(),
            end,
        }
    }

    /// Blocks sent (in any order).
    pub(super) fn add(&mut self, blocks: Vec<crate::raw::RawBlock>) {
        for b in &blocks {
            if b.to_ns > self.end || (b.sample && b.from_ns >= self.end) {
                self.carry.push(b.clone());
            }
        }
        self.batch.add(blocks);
    }

    /// The interval under way is cut: its records, taken; the next
    /// (ending at `next_end`) is kept in `scratch`.
    pub(super) fn cut(&mut self, next_end: u64, scratch: std::fs::File) -> crate::records::Records {
        let done = std::mem::replace(&mut self.batch, crate::records::Records::new(scratch));
        self.end = next_end;
        let carry = std::mem::take(&mut self.carry);
        self.add(carry);
        done
    }
}

impl Intervals {
    /// `-i`'s intervals, from the start of `tracer`'s window (None without
    /// `-i`); the senders of `--push` and `--push-otlp` are started.
    pub(super) fn start(config: &Config, tracer: &Tracer<'_>) -> Result<Option<Intervals>> {
        let pushers = config
            .push
            .iter()
            .map(|o| crate::push::Pusher::start(o.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(config.interval.map(|len| Intervals {
            pushers,
            otlp: HashMap::new(),
            schedule: crate::intervals::Schedule {
                start_ns: tracer.window_ns().0,
                len_ns: len.as_nanos().try_into().unwrap_or(u64::MAX),
            },
            current: 0,
            taken: 0,
            held: Default::default(),
            splitter: Default::default(),
            recorded: false,
            missed: 0,
            blocks: 0,
            total_ns: 0,
            running_ns: 0,
            unmapped: (0, 0),
            records: None,
            chains: Default::default(),
        }))
    }

    /// Writes the current interval from what was taken from the table
    /// (`raw`: its entries and earlier ones; with `--chains`, `named`: the
    /// records of its blocks), up to its end or `end`, and goes on to the
    /// next. Returns the interval's profile.
    pub(super) fn write(
        &mut self,
        (raw, named): (crate::raw::RawProfile, Option<&crate::records::Named>),
        end: Option<u64>,
        kernel_first: bool,
        (registry, symbolizer): (&mut Registry, &Symbolizer),
        config: &Config,
        sinks: &mut [Sink],
    ) -> Result<Profile> {
        use crate::intervals::{timestamp_line, write_part, NamePattern};
        let i = self.current;
        let start = self.schedule.start_of(i);
        let end = end.unwrap_or_else(|| self.schedule.end_of(i));
        let chains = match (named, config.chain_depth) {
            (Some(named), Some(depth)) => {
                let chains = follow(named, depth, config, (start, end), false)?;
                self.chains.add_counts(&chains);
                Some(chains.samples)
            }
            _ => None,
        };
        let entries = self.splitter.interval(raw.entries, i);
        let mut raw = crate::raw::RawProfile { entries, ..raw };
        crate::oncpu::divide(&mut raw, config.shape.mode.user());
        let mut profile = profile::build(&raw, registry, symbolizer, kernel_first);
        if let Some(samples) = chains {
            with_chains(&mut profile, samples);
        }
        let window = profile::Window::from_monotonic(start, end);
        let end_unix = window.start_unix_ns + window.duration_ns;
        profile.window = Some(window);
        if let Some(filter) = &config.filter {
            filter.apply(&mut profile, config.shape);
        }
        self.recorded |= !profile.samples.is_empty();
        self.missed += profile.missed_stacks(config.shape.mode);
        self.blocks += profile.off_cpu().map(|s| s.count).sum::<u64>();
        self.total_ns += profile.off_cpu().map(|s| s.total_ns).sum::<u64>();
        self.running_ns += profile.running().map(|s| s.total_ns).sum::<u64>();
        self.unmapped.0 += profile.counters.user_unmapped_stacks;
        self.unmapped.1 += profile.counters.user_unmapped_ns;
        for (k, ((path, format), sink)) in config.outputs().zip(sinks.iter_mut()).enumerate() {
            match (path.and_then(NamePattern::new), format) {
                (Some(pattern), _) => {
                    let name = pattern.name(u64::from(i) + 1, end_unix);
                    Sink::open(Some(&name), config.tracer.test.stall_in_write)?
                        .write(|out| render(&profile, config, format, out))?
                }
                // Binary: no time line; one request after another.
                (None, Format::Otlp(o)) => sink.write_part(|out| {
                    self.otlp
                        .entry(k)
                        .or_default()
                        .write(&profile, config.shape, o, out)
                })?,
                (None, _) => sink.write_part(|out| {
                    let time = config.timestamp.then(|| timestamp_line(end_unix));
                    write_part(out, time.as_deref(), *format == Format::Text, |out| {
                        render(&profile, config, format, out)
                    })
                })?,
            }
        }
        for (pusher, o) in self.pushers.iter().zip(&config.push) {
            pusher.push(
                profile.window.as_ref().map_or(0, |w| w.start_unix_ns),
                end_unix,
                o.payload(&profile, config.shape)?,
            );
        }
        self.current += 1;
        Ok(profile)
    }

    /// Writes the intervals held (see [`crate::intervals::Held`]) whose
    /// copied stacks are walked now or given up (no longer waiting in
    /// `deferred`), or that waited long enough.
    pub(super) fn write_held(
        &mut self,
        deferred: &Deferred,
        kernel_first: bool,
        (registry, symbolizer): (&mut Registry, &Symbolizer),
        config: &Config,
        sinks: &mut [Sink],
    ) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let waiting = deferred.waiting_ids();
        for (mut raw, records) in self.held.ready(&|id| waiting.contains(&id), Instant::now()) {
            Deferred::complete(&mut raw);
            let named = name_records(
                records,
                &mut raw,
                (&mut *registry, symbolizer),
                kernel_first,
            )?;
            self.write(
                (raw, named.as_ref()),
                None,
                kernel_first,
                (&mut *registry, symbolizer),
                config,
                sinks,
            )?;
        }
        Ok(())
    }

    /// The end of the trace: the intervals not written yet, from what was
    /// read at the end (`raw`; with `--chains`, `named`: the records of
    /// their blocks), the last up to the window's end (`window_end`): more
    /// than one when the trace ended while an interval was being written.
    /// Returns the last one's profile.
    pub(super) fn write_rest(
        &mut self,
        (raw, named): (crate::raw::RawProfile, Option<&crate::records::Named>),
        window_end: u64,
        kernel_first: bool,
        (registry, symbolizer): (&mut Registry, &Symbolizer),
        config: &Config,
        sinks: &mut [Sink],
    ) -> Result<Profile> {
        let last = self.schedule.last_before(window_end).max(self.current);
        let base = crate::raw::RawProfile {
            entries: Vec::new(),
            ..raw.clone()
        };
        let mut raw = Some(raw);
        let mut written = Err(anyhow::anyhow!("no interval was written"));
        while self.current <= last {
            let end = (self.current == last).then_some(window_end);
            let taken = raw.take().unwrap_or_else(|| base.clone());
            written = self.write(
                (taken, named),
                end,
                kernel_first,
                (&mut *registry, symbolizer),
                config,
                &mut *sinks,
            );
            if written.is_err() {
                break;
            }
        }
        written
    }

    /// Time counted in an interval after it was written is left out: how
    /// much, and in how many intervals.
    pub(super) fn report_late(&self) {
        if self.splitter.late.ns > 0 {
            eprintln!(
                "offcputime: {:.3} ms of time in {} was counted after the interval was \
                 written (switches the tracepoint did not report) and is left out",
                self.splitter.late.ns as f64 / 1e6,
                count(self.splitter.late.intervals, "interval", "intervals")
            );
        }
    }

    /// `--push`, `--push-otlp`: what is queued is sent, within a few
    /// seconds (the senders side by side); what could not be sent is said.
    pub(super) fn finish_push(&mut self, verbose: bool) {
        let pushers = std::mem::take(&mut self.pushers);
        std::thread::scope(|scope| {
            let finishing: Vec<_> = pushers
                .into_iter()
                .map(|pusher| {
                    let (url, api) = (pusher.endpoint().to_string(), pusher.api());
                    (url, api, scope.spawn(move || pusher.finish(PUSH_DEADLINE)))
                })
                .collect();
            for (url, api, finished) in finishing {
                match finished.join() {
                    Ok(s) => report_push(&url, api, &s, verbose),
                    Err(_) => eprintln!("offcputime: the push to {url} failed at the end"),
                }
            }
        });
    }
}

/// What became of the intervals pushed to `url`: said if any was not
/// pushed, else with `-v`.
fn report_push(url: &str, api: crate::push::PushApi, s: &crate::push::PushStats, verbose: bool) {
    if s.rejected_profiles > 0 {
        eprintln!(
            "offcputime: {url} rejected {} of the intervals it took (last reason: {})",
            count(s.rejected_profiles, "profile", "profiles"),
            s.rejection.as_deref().unwrap_or("none")
        );
    }
    let total = s.sent + s.failed + s.dropped;
    if s.failed + s.dropped > 0 {
        eprintln!(
            "offcputime: {} of {} could not be pushed to {url} ({} failed after retries or at \
             the end's {} s deadline, {} given up for a full queue; last error: {})",
            s.failed + s.dropped,
            count(total, "interval", "intervals"),
            s.failed,
            PUSH_DEADLINE.as_secs(),
            s.dropped,
            s.last_error.as_deref().unwrap_or("none")
        );
    } else if verbose {
        eprintln!(
            "offcputime: pushed {} ({} bytes of {}) to {url}",
            count(s.sent, "interval", "intervals"),
            s.bytes,
            api.payload()
        );
    }
}
