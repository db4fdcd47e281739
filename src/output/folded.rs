//! Folded stacks, as bcc's `offcputime -f` writes them and `flamegraph.pl`
//! reads them: `comm;user frames;[-;]kernel frames value`, outermost frame
//! first, one line per distinct stack, the value in microseconds.

use std::collections::HashMap;
use std::io::{self, Write};

use super::Shape;
use crate::profile::{ns_to_us, Part, Profile, Sample};

pub const MISSED_USER: &str = "[Missed User Stack]";
pub const MISSED_KERNEL: &str = "[Missed Kernel Stack]";

/// A frame name as it can stand in a folded line: `;` separates frames.
fn clean(name: &str) -> String {
    name.replace(';', ":")
}

/// The frames of one sample, outermost first, without the count.
pub fn frames(sample: &Sample, shape: Shape) -> Vec<String> {
    let mut line = vec![clean(&sample.comm)];
    if shape.mode.user() {
        match &sample.user {
            Part::Absent => {}
            Part::Missed => line.push(MISSED_USER.to_string()),
            Part::Frames(f) => line.extend(f.iter().rev().map(|n| clean(n))),
        }
    }
    if shape.mode.kernel() {
        let both =
            matches!(sample.user, Part::Frames(_)) && matches!(sample.kernel, Part::Frames(_));
        if shape.delimited && shape.mode.user() && both {
            line.push("-".to_string());
        }
        match &sample.kernel {
            Part::Absent => {}
            Part::Missed => line.push(MISSED_KERNEL.to_string()),
            Part::Frames(f) => line.extend(f.iter().rev().map(|n| clean(n))),
        }
    }
    line
}

/// Distinct folded stacks with their total time in nanoseconds, hottest
/// first (ties by stack text).
pub fn lines(profile: &Profile, shape: Shape) -> Vec<(String, u64)> {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for s in &profile.samples {
        *totals.entry(frames(s, shape).join(";")).or_default() += s.total_ns;
    }
    let mut out: Vec<(String, u64)> = totals.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    for (stack, ns) in lines(profile, shape) {
        let us = ns_to_us(ns);
        if us == 0 {
            continue;
        }
        writeln!(w, "{stack} {us}")?;
    }
    Ok(())
}
