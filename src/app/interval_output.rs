//! `-i`: the intervals written (and pushed) as they end.

use super::*;

/// `-i`: the interval under way, and what was written so far.
pub(super) struct Intervals {
    /// `--push`: where each interval is sent as well.
    pub(super) pusher: Option<crate::push::Pusher>,
    pub(super) schedule: crate::intervals::Schedule,
    /// The interval to write next.
    pub(super) current: u32,
    /// The interval to take from the table next: later than `current`
    /// while intervals wait for their copied stacks (`held`).
    pub(super) taken: u32,
    pub(super) held: crate::intervals::Held,
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
}

impl Intervals {
    /// Writes the current interval from what was taken from the table
    /// (`raw`: its entries and earlier ones), up to its end or `end`, and
    /// goes on to the next. Returns the interval's profile.
    pub(super) fn write(
        &mut self,
        raw: crate::raw::RawProfile,
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
        let entries = self.splitter.interval(raw.entries, i);
        let mut raw = crate::raw::RawProfile { entries, ..raw };
        crate::oncpu::divide(&mut raw, config.shape.mode.user());
        let mut profile = profile::build(&raw, registry, symbolizer, kernel_first);
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
        for ((path, format), sink) in config.outputs().zip(sinks.iter_mut()) {
            match path.and_then(NamePattern::new) {
                Some(pattern) => {
                    let name = pattern.name(u64::from(i) + 1, end_unix);
                    Sink::open(Some(&name), config.tracer.test.stall_in_write)?
                        .write(|out| render(&profile, config, format, out))?
                }
                None => sink.write_part(|out| {
                    let time = config.timestamp.then(|| timestamp_line(end_unix));
                    write_part(out, time.as_deref(), *format == Format::Text, |out| {
                        render(&profile, config, format, out)
                    })
                })?,
            }
        }
        if let (Some(pusher), Some(o)) = (&self.pusher, &config.push) {
            let mut pprof = Vec::new();
            crate::output::pprof::write(&profile, config.shape, &o.pprof, &mut pprof)
                .context("failed to build the pprof profile to push")?;
            pusher.push(
                profile.window.as_ref().map_or(0, |w| w.start_unix_ns),
                end_unix,
                pprof,
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
        for mut raw in self.held.ready(&|id| waiting.contains(&id), Instant::now()) {
            Deferred::complete(&mut raw);
            self.write(
                raw,
                None,
                kernel_first,
                (&mut *registry, symbolizer),
                config,
                sinks,
            )?;
        }
        Ok(())
    }

    /// `--push`: what is queued is sent, within a few seconds; what could
    /// not be sent is said.
    pub(super) fn finish_push(&mut self, verbose: bool) {
        let Some(pusher) = self.pusher.take() else {
            return;
        };
        let url = pusher.endpoint().to_string();
        let s = pusher.finish(PUSH_DEADLINE);
        let total = s.sent + s.failed + s.dropped;
        if s.failed + s.dropped > 0 {
            eprintln!(
                "offcputime: {} of {total} intervals could not be pushed to {url} ({} failed after \
                 retries or at the end's {} s deadline, {} given up for a full queue; last error: \
                 {})",
                s.failed + s.dropped,
                s.failed,
                PUSH_DEADLINE.as_secs(),
                s.dropped,
                s.last_error.as_deref().unwrap_or("none")
            );
        } else if verbose {
            eprintln!(
                "offcputime: pushed {} intervals ({} bytes of pprof) to {url}",
                s.sent, s.bytes
            );
        }
    }
}

/// `-i`, after the last interval: a file that got every interval is put in
/// place; one opened for a name pattern (to check it could be written)
/// is dropped, each interval having had a file of its own.
pub(super) fn finish_interval_sinks(config: &Config, sinks: Vec<Sink>) -> Result<()> {
    let mut sinks = sinks.into_iter();
    for ((path, _), sink) in config.outputs().zip(sinks.by_ref()) {
        if path.and_then(crate::intervals::NamePattern::new).is_some() {
            sink.discard();
        } else if let Err(e) = sink.finish() {
            sinks.for_each(Sink::discard);
            return Err(e);
        }
    }
    Ok(())
}
