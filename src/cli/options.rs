//! The options of each part taken from the flags: the outputs' formats,
//! pprof, flame graphs, `--on-cpu`, `--push`, `--snapshot`, `--group`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::output::otlp::OtlpOptions;
use crate::output::pprof::{PprofOptions, SampleType};
use crate::output::speedscope::SpeedscopeOptions;
use crate::output::svg::{self, SvgOptions};

use super::config::parse_u64;
use super::{
    format_by_name, Args, Format, FormatArg, GroupSortArg, HookArg, PushApiArg, SampleTypeArg,
    SnapshotConfig, DEFAULT_ON_CPU_HZ, MAX_ON_CPU_HZ,
};

impl Args {
    /// The format of each output (`None` is stdout): `--format`, `-f` or
    /// `--svg`, else what the file's name says, else the report. Several
    /// files each take the format their name says.
    pub(super) fn formats(&self, outputs: &[Option<PathBuf>]) -> Result<Vec<Format>> {
        let explicit = match (self.format, self.folded, self.svg) {
            (Some(f), _, _) => Some(f),
            (None, true, _) => Some(FormatArg::Folded),
            (None, _, true) => Some(FormatArg::Svg),
            _ => None,
        };
        let kinds: Vec<FormatArg> = if outputs.len() > 1 {
            if explicit.is_some() {
                bail!(
                    "with several -o, each file's name says its format (.svg, .pb.gz, \
                     .speedscope.json, .otlp, .folded, .txt): -f, --svg and --format are for one \
                     output"
                );
            }
            let mut seen = std::collections::HashSet::new();
            outputs
                .iter()
                .map(|o| {
                    let Some(path) = o else {
                        bail!("with several -o, stdout (-) cannot be one of them");
                    };
                    if !seen.insert(path) {
                        bail!("-o {} is given twice", path.display());
                    }
                    format_by_name(path).with_context(|| {
                        format!(
                            "-o {}: with several -o, each file's name must say its format \
                             (.svg, .pb.gz, .speedscope.json, .otlp, .folded, .txt)",
                            path.display()
                        )
                    })
                })
                .collect::<Result<_>>()?
        } else {
            let by_name = outputs
                .first()
                .cloned()
                .flatten()
                .and_then(|p| format_by_name(&p));
            vec![explicit.or(by_name).unwrap_or(FormatArg::Report)]
        };
        let wants = |k: FormatArg| kinds.contains(&k);
        if !wants(FormatArg::Svg) {
            let svg_flags = [
                ("--title", self.title.is_some()),
                ("--subtitle", self.subtitle.is_some()),
                ("--width", self.width.is_some()),
                ("--minwidth", self.minwidth.is_some()),
                ("--inverted", self.inverted),
                ("--reverse", self.reverse),
                ("--colors", self.colors.is_some()),
            ];
            if let Some((flag, _)) = svg_flags.iter().find(|f| f.1) {
                bail!("{flag} is a flame graph option: add --svg");
            }
        }
        if wants(FormatArg::Dot) && !self.graph {
            bail!("a DOT file is --graph's wait-for graph: add --graph");
        }
        let profiles = wants(FormatArg::Pprof) || wants(FormatArg::Otlp);
        if !profiles && self.push.is_none() && self.push_otlp.is_none() {
            let pprof_flags = [
                ("--pprof-sample-type", self.pprof_sample_type.is_some()),
                ("--thread-ids", self.thread_ids),
            ];
            if let Some((flag, _)) = pprof_flags.iter().find(|f| f.1) {
                bail!(
                    "{flag} is a pprof and OTLP option: add --format pprof or --format otlp (or \
                     --push, --push-otlp)"
                );
            }
        }
        if !wants(FormatArg::Speedscope) && self.per_process {
            bail!("--per-process is a speedscope option: add --format speedscope");
        }
        let svg = if wants(FormatArg::Svg) {
            Some(self.svg_options()?)
        } else {
            None
        };
        Ok(kinds
            .into_iter()
            .map(|k| match k {
                FormatArg::Folded => Format::Folded,
                FormatArg::Report => Format::Text,
                FormatArg::Svg => Format::Svg(svg.clone().unwrap_or_default()),
                FormatArg::Pprof => Format::Pprof(self.pprof_options()),
                FormatArg::Speedscope => Format::Speedscope(SpeedscopeOptions {
                    per_process: self.per_process,
                }),
                FormatArg::Otlp => Format::Otlp(OtlpOptions {
                    samples: self.pprof_options(),
                    resource: vec![("host.name".to_string(), host_name())],
                }),
                FormatArg::Dot => Format::Dot,
            })
            .collect())
    }

    fn pprof_options(&self) -> PprofOptions {
        PprofOptions {
            sample_type: match self.pprof_sample_type {
                Some(SampleTypeArg::Wallclock) => SampleType::Wallclock,
                Some(SampleTypeArg::Offcpu) => SampleType::Offcpu,
                // Running and waiting: the time on the wall.
                None if self.on_cpu => SampleType::Wallclock,
                None => SampleType::Offcpu,
            },
            thread_ids: self.thread_ids,
            on_cpu: self.on_cpu,
        }
    }

    /// `--on-cpu` and `-F`: the sampling rate, checked.
    pub(super) fn on_cpu_hz(&self) -> Result<Option<u32>> {
        let Some(f) = &self.frequency else {
            return Ok(self.on_cpu.then_some(DEFAULT_ON_CPU_HZ));
        };
        if !self.on_cpu {
            bail!("-F/--frequency is the on-CPU sampling rate: add --on-cpu");
        }
        match f.trim().parse::<u32>() {
            Ok(hz) if (1..=MAX_ON_CPU_HZ).contains(&hz) => Ok(Some(hz)),
            _ => bail!(
                "-F/--frequency must be a whole number of Hz from 1 to {MAX_ON_CPU_HZ}: {f:?}"
            ),
        }
    }

    /// `--push`, `--push-otlp`, `--app` and `--push-label`, checked: a
    /// push for each URL.
    pub(super) fn push_options(&self, intervals: bool) -> Result<Vec<crate::push::PushOptions>> {
        use crate::push::{check_app, parse_label, Endpoint, PushApi, PushOptions};
        if self.push.is_none() && self.push_api != PushApiArg::Pyroscope {
            bail!("--push-api says how --push pushes: add --push URL");
        }
        let urls: Vec<(PushApi, &String)> = [
            self.push.as_ref().map(|u| {
                let api = match self.push_api {
                    PushApiArg::Pyroscope => PushApi::Pyroscope,
                    PushApiArg::Parca => PushApi::Parca,
                };
                (api, u)
            }),
            self.push_otlp.as_ref().map(|u| (PushApi::Otlp, u)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if urls.is_empty() {
            if self.app.is_some() || !self.push_label.is_empty() {
                bail!("--app and --push-label name pushed profiles: add --push URL or --push-otlp URL");
            }
            return Ok(Vec::new());
        }
        if !intervals {
            bail!(
                "{} sends each interval: add -i SECONDS (e.g. -i 10)",
                urls[0].0.flag()
            );
        }
        let app = self.app.clone().unwrap_or_else(|| "offcputime".to_string());
        check_app(&app)?;
        let mut labels = vec![("host".to_string(), hostname())];
        for l in &self.push_label {
            let (k, v) = parse_label(l)?;
            if let Some(old) = labels.iter_mut().find(|(n, _)| *n == k) {
                old.1 = v;
            } else {
                labels.push((k, v));
            }
        }
        urls.into_iter()
            .map(|(api, url)| {
                Ok(PushOptions {
                    api,
                    endpoint: Endpoint::parse(api.flag(), url)?,
                    app: app.clone(),
                    labels: labels.clone(),
                    pprof: self.pprof_options(),
                })
            })
            .collect()
    }

    /// `--snapshot`, checked against the flags that only tracing takes,
    /// and the formats it can be written in.
    pub(super) fn snapshot_config(&self) -> Result<Option<SnapshotConfig>> {
        let Some(letters) = &self.snapshot else {
            return Ok(None);
        };
        let letters = letters.trim();
        if let Some(d) = &self.duration {
            bail!("--snapshot looks at every task once: it takes no duration ({d:?})");
        }
        if letters.chars().any(|c| c.is_ascii_digit()) {
            bail!(
                "--snapshot {letters}: it looks at every task once and takes no duration; \
                 STATES are letters (--snapshot D)"
            );
        }
        let tracing_only = [
            ("--states", self.states),
            ("--on-cpu", self.on_cpu),
            ("--wakers", self.wakers),
            ("--timeline", self.timeline.is_some()),
            ("--chains", self.chains),
            ("--graph", self.graph),
            ("-m/--min-block-time", self.min_block_time.is_some()),
            ("-M/--max-block-time", self.max_block_time.is_some()),
            ("--sample", self.sample.is_some()),
            ("--state", self.state.is_some()),
            ("--hook", self.hook != HookArg::Auto),
            ("-i/--interval", self.interval.is_some()),
            ("-T/--timestamp", self.timestamp),
            ("--push", self.push.is_some()),
            ("--push-otlp", self.push_otlp.is_some()),
        ];
        if let Some((flag, _)) = tracing_only.iter().find(|f| f.1) {
            let hint = if flag.starts_with("--state") {
                " (to keep tasks by state, give their letters: --snapshot D)"
            } else {
                ""
            };
            bail!("{flag} is about blocks while tracing, and --snapshot traces nothing{hint}");
        }
        let explicit = match (self.format, self.folded, self.svg) {
            (Some(f), _, _) => Some(f),
            (None, true, _) => Some(FormatArg::Folded),
            (None, _, true) => Some(FormatArg::Svg),
            _ => None,
        };
        let by_name = self.output.iter().filter_map(|p| format_by_name(p));
        if let Some(f) = explicit.into_iter().chain(by_name).find(|f| {
            matches!(
                f,
                FormatArg::Pprof | FormatArg::Speedscope | FormatArg::Otlp
            )
        }) {
            bail!(
                // wording: not a count
                "--snapshot counts tasks, and {} profiles are of time: write the report, \
                 folded stacks (-f) or a flame graph (--svg)",
                match f {
                    FormatArg::Pprof => "pprof",
                    FormatArg::Otlp => "OTLP",
                    _ => "speedscope",
                }
            );
        }
        let sort = match self.group_sort {
            Some(GroupSortArg::Desc) => crate::output::group::GroupSort::Desc,
            _ => crate::output::group::GroupSort::Asc,
        };
        Ok(Some(SnapshotConfig {
            letters: letters.to_string(),
            states: crate::tracer::states_mask(letters)?,
            sort,
        }))
    }

    /// `--group` and its order; `--group-sort` without it is an error.
    pub(super) fn group(&self) -> Result<Option<crate::output::group::GroupSort>> {
        use crate::output::group::GroupSort;
        match (self.group, self.group_sort) {
            (false, Some(_)) => bail!("--group-sort is a --group option: add --group"),
            (false, None) => Ok(None),
            (true, Some(GroupSortArg::Desc)) => Ok(Some(GroupSort::Desc)),
            (true, _) => Ok(Some(GroupSort::Asc)),
        }
    }

    fn svg_options(&self) -> Result<SvgOptions> {
        let mut o = SvgOptions::default();
        if let Some(t) = &self.title {
            o.title = t.clone();
        }
        // `None` until into_config fills in the description; "" is none.
        o.subtitle = self.subtitle.clone();
        if let Some(w) = &self.width {
            let w = parse_u64("--width", w)?;
            if !(100..=1_000_000).contains(&w) {
                bail!("--width must be between 100 and 1000000 pixels: {w}");
            }
            o.width = Some(w as usize);
        }
        if let Some(m) = &self.minwidth {
            let v: f64 = m
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && (0.0..=100.0).contains(v))
                .with_context(|| {
                    format!("--minwidth must be a percentage between 0 and 100: {m:?}")
                })?;
            o.min_width = v;
        }
        o.inverted = self.inverted;
        o.reverse = self.reverse;
        if let Some(c) = &self.colors {
            o.palette = svg::parse_palette(c.trim()).map_err(anyhow::Error::msg)?;
        }
        Ok(o)
    }
}

/// This machine's name, as the kernel has it ("unknown" if unread).
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    match name.trim() {
        "" => "unknown".to_string(),
        name => name.to_string(),
    }
}

/// This machine's name, as a label value (the characters that delimit
/// labels replaced).
fn hostname() -> String {
    host_name()
        .chars()
        .map(|c| {
            if matches!(c, '{' | '}' | ',' | '=' | '"') || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}
