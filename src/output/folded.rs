//! Folded stacks, as bcc's `offcputime -f` writes them and `flamegraph.pl`
//! reads them: `comm;user frames;[-;]kernel frames value`, outermost frame
//! first, one line per distinct stack, the value in microseconds. With
//! `--states`, the thread state is a frame of its own after the command:
//! `comm;[sleep];user frames;...`. With `--wakers`, bcc `offwaketime`'s
//! shape: `...;kernel frames;--;waker kernel frames;[-;]waker user frames;
//! waker` with the waker's frames innermost first and its command last.

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

/// Suffix that marks a frame of the waker's part (`--wakers`); inferno
/// shows the name without it.
pub const WAKER_ANNOTATION: &str = "_[w]";

/// Between the blocked thread's stacks and its waker's (bcc's
/// `offwaketime`).
pub const WAKER_SEPARATOR: &str = "--";

/// The frames of one sample, outermost first, without the count. With
/// `annotate`, kernel frames end in [`KERNEL_ANNOTATION`] and the waker's
/// in [`WAKER_ANNOTATION`].
pub fn frames(sample: &Sample, shape: Shape, annotate: bool) -> Vec<String> {
    let kernel_name = |n: &str| {
        if annotate {
            format!("{}{KERNEL_ANNOTATION}", clean(n))
        } else {
            clean(n)
        }
    };
    let waker_name = |n: &str| {
        if annotate {
            format!("{}{WAKER_ANNOTATION}", clean(n))
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
            Part::Frames(f) => line.extend(f.iter().rev().map(|n| clean(n.text()))),
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
            Part::Frames(f) => line.extend(f.iter().rev().map(|n| kernel_name(n.text()))),
        }
    }
    // The waker, as bcc's offwaketime folds it: its kernel frames, then
    // its user frames, innermost first, and its name last.
    if let Some(waker) = &sample.waker {
        line.push(WAKER_SEPARATOR.to_string());
        let (user, kernel) = waker.parts();
        if shape.mode.kernel() {
            match kernel {
                Part::Absent => {}
                Part::Missed => line.push(waker_name(MISSED_KERNEL)),
                Part::Frames(f) => line.extend(f.iter().map(|n| waker_name(n.text()))),
            }
        }
        if shape.mode.user() {
            let both = matches!(user, Part::Frames(_)) && matches!(kernel, Part::Frames(_));
            if shape.delimited && shape.mode.kernel() && both {
                line.push("-".to_string());
            }
            match user {
                Part::Absent => {}
                Part::Missed => line.push(waker_name(MISSED_USER)),
                Part::Frames(f) => line.extend(f.iter().map(|n| waker_name(n.text()))),
            }
        }
        line.push(waker_name(waker.name()));
    }
    line
}

/// Distinct folded stacks with their total time in microseconds, hottest
/// first (ties by stack text). Stacks that round to 0 us are left out: this
/// is what `-f` prints and what `--svg` draws.
pub fn lines(profile: &Profile, shape: Shape, annotate: bool) -> Vec<(String, u64)> {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for s in &profile.samples {
        *totals
            .entry(frames(s, shape, annotate).join(";"))
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
