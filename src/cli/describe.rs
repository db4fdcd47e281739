//! A [`Config`](super::Config) described for people: what is traced, and
//! the status line.

use std::time::Duration;

use crate::profile::StackMode;

use super::{Config, Format};

impl Config {
    /// Every output: the first (`None` is stdout), then the further files.
    pub fn outputs(&self) -> impl Iterator<Item = (Option<&std::path::Path>, &Format)> {
        std::iter::once((self.output.as_deref(), &self.format)).chain(
            self.more_outputs
                .iter()
                .map(|(p, f)| (Some(p.as_path()), f)),
        )
    }

    /// What was traced, in a few words: the flame graph's default subtitle.
    pub fn description(&self) -> String {
        let t = &self.tracer;
        let mut parts = vec![self.threads()];
        if let Some(snap) = &self.snapshot {
            if !snap.letters.is_empty() {
                parts.push(format!("state {}", snap.letters));
            }
            // wording: not a count
            parts.push(format!("{} stacks, tasks now", self.stacks()));
            return parts.join(", ");
        }
        // wording: not a count
        parts.push(format!("{} stacks", self.stacks()));
        if self.shape.per_container {
            parts.push("by container".to_string());
        }
        if t.min_block_ns > 1000 || t.max_block_ns != u64::MAX {
            let min = t.min_block_ns / 1000;
            parts.push(if t.max_block_ns == u64::MAX {
                format!("blocks of {min} us or more")
            } else {
                format!("blocks of {min} to {} us", t.max_block_ns / 1000)
            });
        }
        if t.sample_ns > 0 {
            parts.push(format!("blocks under {} us sampled", t.sample_ns / 1000));
        }
        if let Some(s) = t.state {
            parts.push(format!("state {s}"));
        }
        if t.states {
            parts.push("split by thread state".to_string());
        }
        if t.wakers {
            parts.push("with wakers".to_string());
        }
        if let Some(hz) = t.on_cpu_hz {
            parts.push(format!(
                "on-CPU time sampled at {hz} Hz in warm colours, off-CPU in cool ones"
            ));
        }
        parts.join(", ")
    }

    fn threads(&self) -> String {
        let t = &self.tracer;
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let who = if !t.tgids.is_empty() {
            format!("PID {}", list(&t.tgids))
        } else if !t.tids.is_empty() {
            format!("TID {}", list(&t.tids))
        } else if t.user_threads_only {
            "user threads".to_string()
        } else if t.kernel_threads_only {
            "kernel threads".to_string()
        } else {
            "all threads".to_string()
        };
        if self.cgroups.is_empty() {
            return who;
        }
        let paths: Vec<String> = self
            .cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let who = if who == "all threads" {
            "threads".to_string()
        } else {
            who
        };
        format!("{who} in cgroup {}", paths.join(", "))
    }

    fn stacks(&self) -> &'static str {
        match self.shape.mode {
            StackMode::Both => "user + kernel",
            StackMode::UserOnly => "user",
            StackMode::KernelOnly => "kernel",
        }
    }

    /// bcc's opening line: what is traced, by which stacks, for how long.
    pub fn status_line(&self) -> String {
        let (threads, stacks) = (self.threads(), self.stacks());
        if let Some(snap) = &self.snapshot {
            let states = if snap.letters.is_empty() {
                String::new()
            } else {
                format!(" in state {}", snap.letters)
            };
            return format!("Snapshot of {threads}{states} by {stacks} stack.");
        }
        let every = match self.interval {
            Some(i) => format!(", output every {} secs", fmt_secs(i)),
            None => String::new(),
        };
        let when = match self.duration {
            Some(d) => format!("{every} for {} secs.", fmt_secs(d)),
            None => format!("{every}... Hit Ctrl-C to end."),
        };
        let sampled = match self.tracer.sample_ns {
            0 => String::new(),
            ns => format!(" (blocks under {} us sampled)", ns / 1000),
        };
        let what = match self.tracer.on_cpu_hz {
            Some(hz) => format!("on- and off-CPU time (us, on-CPU sampled at {hz} Hz)"),
            None => "off-CPU time (us)".to_string(),
        };
        format!("Tracing {what} of {threads} by {stacks} stack{sampled}{when}")
    }
}

pub(super) fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}
