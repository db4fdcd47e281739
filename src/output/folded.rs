//! Folded stacks, as bcc's `offcputime -f` writes them and `flamegraph.pl`
//! reads them: `comm;user frames;[-;]kernel frames value`, outermost frame
//! first, one line per distinct stack, the value in microseconds. With
//! `--states`, the thread state is a frame of its own after the command:
//! `comm;[sleep];user frames;...`. With `--wakers`, bcc `offwaketime`'s
//! shape: `...;kernel frames;--;waker kernel frames;[-;]waker user frames;
//! waker` with the waker's frames innermost first and its command last.

use std::io::{self, Write};
use std::sync::Arc;

use super::Shape;
use crate::profile::{ns_to_us, Frame, Part, Profile, Sample};

pub const MISSED_USER: &str = "[Missed User Stack]";
pub const MISSED_KERNEL: &str = "[Missed Kernel Stack]";

/// A frame name as it can stand in a folded line: `;` separates frames.
fn clean(name: &str) -> String {
    name.replace(';', ":")
}

/// Appends `name` to `text` as [`clean`] writes it.
fn push_clean(text: &mut String, name: &str) {
    if name.contains(';') {
        text.push_str(&clean(name));
    } else {
        text.push_str(name);
    }
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

/// How a part's frames are written: the order and the annotation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Run {
    /// The thread's user frames: outermost first.
    User,
    /// The thread's kernel frames: outermost first, annotated.
    Kernel,
    /// The waker's frames: innermost first, annotated.
    Waker,
}

/// The folded text of each distinct part, made once: samples share their
/// parts (a profile of 100,000 stacks has a few thousand kernel parts).
/// Keyed by the address of the part's frames, which the profile keeps.
#[derive(Default)]
struct Texts {
    runs: ahash::AHashMap<(usize, Run), Option<String>>,
}

impl Texts {
    /// Appends the frames of `part` to `line` as `run` writes them.
    fn push(&mut self, line: &mut String, part: &Part, run: Run, annotate: bool) {
        let annotated = |n: &str| match run {
            Run::User => clean(n),
            Run::Kernel if annotate => format!("{}{KERNEL_ANNOTATION}", clean(n)),
            Run::Waker if annotate => format!("{}{WAKER_ANNOTATION}", clean(n)),
            _ => clean(n),
        };
        match part {
            Part::Absent => {}
            Part::Missed => {
                let marker = match run {
                    Run::User => MISSED_USER,
                    _ => MISSED_KERNEL,
                };
                push(line, &annotated(marker));
            }
            Part::Frames(f) => {
                let text = self
                    .runs
                    .entry((Arc::as_ptr(f) as *const Frame as usize, run))
                    .or_insert_with(|| {
                        let suffix = match run {
                            Run::Kernel if annotate => KERNEL_ANNOTATION,
                            Run::Waker if annotate => WAKER_ANNOTATION,
                            _ => "",
                        };
                        let mut text = String::new();
                        let mut add = |n: &Frame| {
                            if !text.is_empty() {
                                text.push(';');
                            }
                            push_clean(&mut text, n.text());
                            text.push_str(suffix);
                        };
                        match run {
                            Run::Waker => f.iter().for_each(&mut add),
                            _ => f.iter().rev().for_each(&mut add),
                        }
                        (!text.is_empty()).then_some(text)
                    });
                if let Some(text) = text {
                    push(line, text);
                }
            }
        }
    }

    /// The folded stack of one sample, without the count. With
    /// `annotate`, kernel frames end in [`KERNEL_ANNOTATION`] and the
    /// waker's in [`WAKER_ANNOTATION`].
    fn line(&mut self, sample: &Sample, shape: Shape, annotate: bool) -> String {
        let mut line = clean(&sample.comm);
        if let Some(state) = sample.state {
            push(&mut line, state.frame());
        }
        if shape.mode.user() {
            self.push(&mut line, &sample.user, Run::User, annotate);
        }
        if shape.mode.kernel() {
            let both =
                matches!(sample.user, Part::Frames(_)) && matches!(sample.kernel, Part::Frames(_));
            if shape.delimited && shape.mode.user() && both {
                push(&mut line, "-");
            }
            self.push(&mut line, &sample.kernel, Run::Kernel, annotate);
        }
        // The waker, as bcc's offwaketime folds it: its kernel frames,
        // then its user frames, innermost first, and its name last.
        if let Some(waker) = &sample.waker {
            push(&mut line, WAKER_SEPARATOR);
            let (user, kernel) = waker.parts();
            if shape.mode.kernel() {
                self.push(&mut line, kernel, Run::Waker, annotate);
            }
            if shape.mode.user() {
                let both = matches!(user, Part::Frames(_)) && matches!(kernel, Part::Frames(_));
                if shape.delimited && shape.mode.kernel() && both {
                    push(&mut line, "-");
                }
                // The waker's missed user stack keeps its own marker.
                match user {
                    Part::Missed => {
                        let marker = if annotate {
                            format!("{}{WAKER_ANNOTATION}", clean(MISSED_USER))
                        } else {
                            clean(MISSED_USER)
                        };
                        push(&mut line, &marker);
                    }
                    _ => self.push(&mut line, user, Run::Waker, annotate),
                }
            }
            let name = if annotate {
                format!("{}{WAKER_ANNOTATION}", clean(waker.name()))
            } else {
                clean(waker.name())
            };
            push(&mut line, &name);
        }
        line
    }
}

/// Appends one frame (or a run of them) to a folded line.
fn push(line: &mut String, frames: &str) {
    line.push(';');
    line.push_str(frames);
}

/// Distinct folded stacks with their total time in microseconds, hottest
/// first (ties by stack text). Stacks that round to 0 us are left out: this
/// is what `-f` prints and what `--svg` draws.
pub fn lines(profile: &Profile, shape: Shape, annotate: bool) -> Vec<(String, u64)> {
    let mut texts = Texts::default();
    let mut totals: ahash::AHashMap<String, u64> =
        ahash::AHashMap::with_capacity(profile.samples.len());
    for s in &profile.samples {
        *totals.entry(texts.line(s, shape, annotate)).or_default() += s.total_ns;
    }
    let mut out: Vec<(String, u64)> = totals
        .into_iter()
        .map(|(stack, ns)| (stack, ns_to_us(ns)))
        .filter(|&(_, us)| us > 0)
        .collect();
    // Stacks are distinct: an unstable sort gives one order.
    out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    for (stack, us) in lines(profile, shape, false) {
        w.write_all(stack.as_bytes())?;
        writeln!(w, " {us}")?;
    }
    Ok(())
}
