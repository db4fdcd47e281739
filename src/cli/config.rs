//! The flags checked together and turned into a [`Config`](super::Config),
//! and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::output::Shape;
use crate::profile::StackMode;
use crate::tracer::{Hook, TracerOptions, Unwind, UnwindCapacity, MAX_STACK_DEPTH};

use super::describe::fmt_secs;
use super::{
    Args, Config, Format, HookArg, UnwindArg, DEFAULT_CHAIN_DEPTH, DEFAULT_TIMELINE_MIN_US,
    MAX_CHAIN_DEPTH, MAX_SAMPLE_US, MAX_TIMELINE_MIN_US,
};

pub(super) fn parse_u64(what: &str, s: &str) -> Result<u64> {
    let s = s.trim();
    if s.starts_with('-') {
        bail!("{what} must not be negative: {s}");
    }
    let v = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        s.parse::<u64>()
    };
    v.with_context(|| format!("{what} is not a whole number: {s:?}"))
}

fn parse_ids(what: &str, items: &[String]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            bail!("empty {what} in list");
        }
        let id: u32 = item
            .parse()
            .ok()
            .filter(|&v: &u32| v > 0 && v <= i32::MAX as u32)
            .with_context(|| format!("invalid {what}: {item:?}"))?;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

fn parse_duration(s: &str) -> Result<Duration> {
    parse_seconds("duration", s)
}

fn parse_seconds(what: &str, s: &str) -> Result<Duration> {
    let s = s.trim();
    let secs: f64 = s
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .with_context(|| format!("{what} is not a number of seconds: {s:?}"))?;
    if secs <= 0.0 {
        bail!("{what} must be positive: {s}");
    }
    if secs > 1e9 {
        bail!("{what} is too long: {s}");
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Args {
    /// Checks the flags together and turns them into a [`Config`].
    pub fn into_config(self) -> Result<Config> {
        self.check_exclusive()?;
        let tgids = parse_ids("PID", &self.pid)?;
        let tids = parse_ids("TID", &self.tid)?;
        let cgroups = self
            .cgroup
            .iter()
            .map(|p| crate::container::cgroup_dir(p))
            .collect::<Result<Vec<_>>>()?;
        let (min_us, max_us, sample_us) = self.block_times()?;
        let state = self.block_state()?;
        let (storage, depth, unwind_mib) = self.sizes()?;
        let snapshot = self.snapshot_config()?;
        let duration = self.duration.as_deref().map(parse_duration).transpose()?;
        let interval = self.checked_interval()?;
        let push = self.push_options(interval.is_some())?;
        let filter = crate::filter::StackFilter::new(&self.grep, &self.exclude)?;
        let group = if snapshot.is_some() {
            None
        } else {
            self.group()?
        };
        let (format, output, more_outputs) = self.outputs(group.as_ref(), interval)?;

        let mode = self.stack_mode();
        let hook = self.tracer_hook();
        let mut config = Config {
            tracer: TracerOptions {
                duration,
                interval,
                tgids,
                tids,
                cgroups: cgroups.iter().map(|c| c.id).collect(),
                user_threads_only: self.user_threads_only,
                kernel_threads_only: self.kernel_threads_only,
                state,
                // A block counts when its length in whole microseconds is
                // within [min, max], as in bcc.
                min_block_ns: min_us.saturating_mul(1000),
                max_block_ns: match max_us.checked_add(1).and_then(|m| m.checked_mul(1000)) {
                    Some(ns) => ns - 1,
                    None => u64::MAX,
                },
                sample_ns: sample_us * 1000,
                user_stacks: mode.user(),
                kernel_stacks: mode.kernel(),
                stack_storage_size: storage as u32,
                max_stack_depth: depth as u32,
                hook,
                unwind: match self.unwind {
                    UnwindArg::Fp => Unwind::FramePointers,
                    UnwindArg::Dwarf if mode.user() => Unwind::Dwarf,
                    // No user stacks: no tables to build.
                    UnwindArg::Dwarf => Unwind::FramePointers,
                },
                unwind_capacity: UnwindCapacity::from_bytes(unwind_mib << 20),
                states: self.states,
                wakers: self.wakers,
                python: !self.no_python,
                java: !self.no_java,
                node: !self.no_node,
                // Looked at as the trace starts.
                runtimes_running: crate::tracer::RuntimeKinds::ALL,
                on_cpu_hz: self.on_cpu_hz()?,
                timeline_min_ns: self.timeline_min_ns()?,
                chains: self.chains || self.graph,
                test: crate::test_env::TestEnv::from_env(),
            },
            shape: Shape {
                mode,
                delimited: self.delimited,
                per_container: self.per_container,
            },
            cgroups: cgroups.into_iter().map(|c| c.path).collect(),
            format,
            output,
            more_outputs,
            offsets: self.offset,
            addresses: self.addresses,
            group,
            filter,
            inline: !self.no_inline,
            python_glue: self.python_glue,
            lines: self.lines,
            verbose: self.verbose,
            duration,
            interval,
            timestamp: self.timestamp,
            push,
            snapshot,
            timeline: self.timeline.clone(),
            chain_depth: self.chain_depth()?,
            graph: self.graph,
        };
        self.name_flame_graphs(&mut config);
        if let Some(t) = &config.timeline {
            let same = |p: &std::path::Path| {
                p == t
                    || std::fs::canonicalize(p)
                        .is_ok_and(|p| std::fs::canonicalize(t).is_ok_and(|t| p == t))
            };
            if config.outputs().any(|(p, _)| p.is_some_and(same)) {
                bail!(
                    "--timeline {} is also an output of the profile",
                    t.display()
                );
            }
        }
        Ok(config)
    }

    /// Flags that cannot go together.
    fn check_exclusive(&self) -> Result<()> {
        if self.user_threads_only && self.kernel_threads_only {
            bail!("-u/--user-threads-only and -k/--kernel-threads-only are mutually exclusive");
        }
        if self.user_stacks_only && self.kernel_stacks_only {
            bail!("-U/--user-stacks-only and -K/--kernel-stacks-only are mutually exclusive");
        }
        if self.user_stacks_only && self.kernel_threads_only {
            bail!("-U/--user-stacks-only with -k/--kernel-threads-only shows nothing: kernel threads have no user stacks");
        }
        Ok(())
    }

    /// `-m`, `-M` and `--sample`, in microseconds.
    fn block_times(&self) -> Result<(u64, u64, u64)> {
        let min_us = match &self.min_block_time {
            Some(s) => parse_u64("-m/--min-block-time", s)?,
            None => 1,
        };
        let max_us = match &self.max_block_time {
            Some(s) => parse_u64("-M/--max-block-time", s)?,
            None => u64::MAX,
        };
        if min_us > max_us {
            bail!("-m/--min-block-time ({min_us}) is greater than -M/--max-block-time ({max_us})");
        }
        let sample_us = match &self.sample {
            Some(s) => parse_u64("--sample", s)?,
            None => 0,
        };
        if self.sample.is_some() && !(1..=MAX_SAMPLE_US).contains(&sample_us) {
            bail!("--sample must be between 1 and {MAX_SAMPLE_US} microseconds: {sample_us}");
        }
        Ok((min_us, max_us, sample_us))
    }

    /// `--timeline-min` in ns, where `--timeline` is given.
    fn timeline_min_ns(&self) -> Result<Option<u64>> {
        let us = match (&self.timeline, &self.timeline_min) {
            (None, Some(_)) => bail!("--timeline-min is for --timeline FILE"),
            (None, None) => return Ok(None),
            (Some(_), Some(s)) => parse_u64("--timeline-min", s)?,
            (Some(_), None) => DEFAULT_TIMELINE_MIN_US,
        };
        if us > MAX_TIMELINE_MIN_US {
            bail!("--timeline-min is too long (at most {MAX_TIMELINE_MIN_US} us): {us}");
        }
        Ok(Some(us.max(1) * 1000))
    }

    /// `--chain-depth`, where `--chains` is given; the flags `--chains`
    /// does not go with yet.
    fn chain_depth(&self) -> Result<Option<u32>> {
        if !self.chains && !self.graph {
            if self.chain_depth.is_some() {
                bail!("--chain-depth is for --chains");
            }
            return Ok(None);
        }
        if self.graph && self.interval.is_some() {
            bail!("--graph is the whole window's: it does not go with -i/--interval");
        }
        let not_yet = [
            ("--wakers", self.wakers),
            ("--states", self.states),
            ("--sample", self.sample.is_some()),
            ("--push", self.push.is_some()),
            ("--push-otlp", self.push_otlp.is_some()),
        ];
        if let Some((flag, _)) = not_yet.iter().find(|f| f.1) {
            let what = if self.chains { "--chains" } else { "--graph" };
            bail!("{what} does not go with {flag} yet");
        }
        let depth = match &self.chain_depth {
            Some(s) => parse_u64("--chain-depth", s)?,
            None => u64::from(DEFAULT_CHAIN_DEPTH),
        };
        if !(1..=u64::from(MAX_CHAIN_DEPTH)).contains(&depth) {
            bail!("--chain-depth must be between 1 and {MAX_CHAIN_DEPTH}: {depth}");
        }
        Ok(Some(depth as u32))
    }

    /// `--state`.
    fn block_state(&self) -> Result<Option<u32>> {
        let state = match &self.state {
            Some(s) => {
                let v = parse_u64("--state", s)?;
                Some(u32::try_from(v).with_context(|| format!("--state is too large: {v}"))?)
            }
            None => None,
        };
        Ok(state)
    }

    /// `--stack-storage-size`, `--perf-max-stack-depth` and
    /// `--unwind-memory` (MiB).
    fn sizes(&self) -> Result<(u64, u64, u64)> {
        let storage = parse_u64("--stack-storage-size", &self.stack_storage_size)?;
        if storage == 0 || storage > 1 << 24 {
            bail!(
                "--stack-storage-size must be between 1 and {}: {storage}",
                1 << 24
            );
        }
        let depth = parse_u64("--perf-max-stack-depth", &self.perf_max_stack_depth)?;
        if depth == 0 || depth > MAX_STACK_DEPTH as u64 {
            bail!("--perf-max-stack-depth must be between 1 and {MAX_STACK_DEPTH}: {depth}");
        }
        let unwind_mib = if self.unwind_memory == "auto" {
            auto_unwind_mib(crate::process::memory_total())
        } else {
            parse_u64("--unwind-memory", &self.unwind_memory)?
        };
        if !(1..=4096).contains(&unwind_mib) {
            bail!("--unwind-memory must be between 1 and 4096 MiB: {unwind_mib}");
        }
        Ok((storage, depth, unwind_mib))
    }

    /// `-i`, checked with `--hook` and `-T`.
    fn checked_interval(&self) -> Result<Option<Duration>> {
        let interval = self
            .interval
            .as_deref()
            .map(|s| parse_seconds("-i/--interval", s))
            .transpose()?;
        if let Some(i) = interval {
            if i < Duration::from_millis(10) {
                bail!(
                    "-i/--interval must be at least 0.01 seconds: {}",
                    fmt_secs(i)
                );
            }
            if self.hook == HookArg::FinishTaskSwitch {
                bail!(
                    "-i needs the sched_switch tracepoint (--hook auto, sched-switch, tp-btf or \
                     raw-tp): the finish_task_switch kprobe takes stacks at switch-in, so a \
                     block under way at an interval's end would have none"
                );
            }
        } else if self.timestamp {
            bail!("-T/--timestamp dates each interval: add -i SECONDS");
        }
        Ok(interval)
    }

    /// The first output and its format, and the further files with theirs,
    /// checked with `--group` and `-i`.
    #[allow(clippy::type_complexity)]
    fn outputs(
        &self,
        group: Option<&crate::output::group::GroupSort>,
        interval: Option<Duration>,
    ) -> Result<(Format, Option<PathBuf>, Vec<(PathBuf, Format)>)> {
        let outputs: Vec<Option<PathBuf>> = self
            .output
            .iter()
            .map(|p| Some(p.clone()).filter(|p| p.as_os_str() != "-"))
            .collect();
        let mut formats = self.formats(&outputs)?;
        if group.is_some() && formats.iter().any(|f| *f != Format::Text) {
            bail!(
                "--group merges threads in the report only: folded stacks, flame graphs, pprof \
                 and speedscope merge them already (without -f, --svg or --format, or with -o \
                 FILE.txt)"
            );
        }
        if interval.is_some() {
            // The report and folded stacks follow one another; so do OTLP
            // requests, which read as one.
            let whole = |f: &Format| !matches!(f, Format::Text | Format::Folded | Format::Otlp(_));
            let paths = if outputs.is_empty() {
                vec![None]
            } else {
                outputs.clone()
            };
            let checked: Vec<(Option<PathBuf>, bool)> =
                paths.into_iter().zip(formats.iter().map(whole)).collect();
            crate::intervals::check_outputs(&checked)?;
        }
        let format = formats.remove(0);
        let output = outputs.first().cloned().flatten();
        let more_outputs: Vec<(PathBuf, Format)> =
            outputs.into_iter().skip(1).flatten().zip(formats).collect();
        Ok((format, output, more_outputs))
    }

    /// `-U`/`-K`.
    fn stack_mode(&self) -> StackMode {
        if self.user_stacks_only {
            StackMode::UserOnly
        } else if self.kernel_stacks_only {
            StackMode::KernelOnly
        } else {
            StackMode::Both
        }
    }

    /// `--hook`.
    fn tracer_hook(&self) -> Hook {
        match self.hook {
            HookArg::Auto => Hook::Auto,
            HookArg::SchedSwitch => Hook::SchedSwitch,
            HookArg::FinishTaskSwitch => Hook::FinishTaskSwitch,
            HookArg::TpBtf => Hook::TpBtf,
            HookArg::RawTp => Hook::RawTp,
        }
    }

    /// Flame graphs' subtitle (the description, unless given), and their
    /// names for `--snapshot`.
    fn name_flame_graphs(&self, config: &mut Config) {
        let description = config.description();
        let more = config.more_outputs.iter_mut().map(|(_, f)| f);
        for format in std::iter::once(&mut config.format).chain(more) {
            if let Format::Svg(o) = format {
                if config.snapshot.is_some() {
                    o.count_name = "tasks".to_string();
                    if self.title.is_none() {
                        o.title = "Tasks by Stack".to_string();
                    }
                }
                o.subtitle = match o.subtitle.take() {
                    None => Some(description.clone()),
                    Some(s) if s.is_empty() => None,
                    some => some,
                };
            }
        }
    }
}

/// `--unwind-memory auto`: 1/256 of the machine's memory (`total` bytes,
/// where known), at least 16 MiB and at most 128: room for the tables of
/// the largest programs (a compiler that maps LLVM needs about 20 MiB) on
/// any machine of 4 GiB or more.
fn auto_unwind_mib(total: Option<u64>) -> u64 {
    total.map_or(16, |t| (t >> 20) / 256).clamp(16, 128)
}

#[cfg(test)]
mod unwind_memory_tests {
    use super::auto_unwind_mib;

    #[test]
    fn auto_unwind_memory_follows_the_machine() {
        assert_eq!(auto_unwind_mib(None), 16);
        assert_eq!(auto_unwind_mib(Some(2 << 30)), 16);
        assert_eq!(auto_unwind_mib(Some(24 << 30)), 96);
        assert_eq!(auto_unwind_mib(Some(1 << 40)), 128);
    }
}
