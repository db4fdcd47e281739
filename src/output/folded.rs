//! Folded stacks, as bcc's `offcputime -f` writes them and `flamegraph.pl`
//! reads them: `comm;user frames;[-;]kernel frames value`, outermost frame
//! first, one line per distinct stack, the value in microseconds. With
//! `--states`, the thread state is a frame of its own after the command:
//! `comm;[sleep];user frames;...`.

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

/// Suffix that marks a kernel frame for flame-graph palettes (as perf's
/// `stackcollapse` writes it); inferno shows the name without it.
pub const KERNEL_ANNOTATION: &str = "_[k]";

/// The frames of one sample, outermost first, without the count. With
/// `annotate_kernel`, kernel frames end in [`KERNEL_ANNOTATION`].
pub fn frames(sample: &Sample, shape: Shape, annotate_kernel: bool) -> Vec<String> {
    let kernel_name = |n: &str| {
        if annotate_kernel {
            format!("{}{KERNEL_ANNOTATION}", clean(n))
        } else {
            clean(n)
        }
    };
    let mut line = vec![clean(&sample.comm)];
    if let Some(state) = sample.state {
        line.push(state.frame().to_string());
    }
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
            Part::Missed => line.push(kernel_name(MISSED_KERNEL)),
            Part::Frames(f) => line.extend(f.iter().rev().map(|n| kernel_name(n))),
        }
    }
    line
}

/// Distinct folded stacks with their total time in microseconds, hottest
/// first (ties by stack text). Stacks that round to 0 us are left out: this
/// is what `-f` prints and what `--svg` draws.
pub fn lines(profile: &Profile, shape: Shape, annotate_kernel: bool) -> Vec<(String, u64)> {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for s in &profile.samples {
        *totals
            .entry(frames(s, shape, annotate_kernel).join(";"))
            .or_default() += s.total_ns;
    }
    let mut out: Vec<(String, u64)> = totals
        .into_iter()
        .map(|(stack, ns)| (stack, ns_to_us(ns)))
        .filter(|&(_, us)| us > 0)
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    for (stack, us) in lines(profile, shape, false) {
        writeln!(w, "{stack} {us}")?;
    }
    Ok(())
}
