//! `--grep` and `--exclude`: samples kept or dropped by the names of their
//! frames, before any output is written.
//!
//! A pattern is a regular expression (the `regex` crate's syntax, matched
//! anywhere in the name unless anchored) tried on every frame the output
//! shows: the user and kernel frames of the blocked thread (as `-U`/`-K`
//! leave them), the missed-stack markers, and with `--wakers` the waker's
//! frames too. A frame matches by its function name, or by its name as
//! shown with `-s`/`--addresses` (`read+0x15/0x90 [libc.so.6]`), so a
//! module can be matched. The thread's command and the waker's name are not
//! frames here. `--grep` given several times keeps a sample if any of its
//! patterns matches a frame; `--exclude` given several times drops it if any
//! of its patterns does; with both, a sample is kept if it matches a
//! `--grep` and no `--exclude`.

use anyhow::{bail, Result};
use regex::{Regex, RegexSet};

use std::borrow::Cow;

use crate::profile::{Frame, Part, Profile, Sample};
use crate::shape::{Shape, MISSED_KERNEL, MISSED_USER};

/// The patterns of `--grep` and `--exclude`, compiled.
#[derive(Clone, Debug)]
pub struct StackFilter {
    grep: Option<RegexSet>,
    exclude: Option<RegexSet>,
}

/// The patterns of one flag as one set; `None` for none. A pattern that
/// does not compile is one error line naming the flag and the pattern.
fn compile(flag: &str, patterns: &[String]) -> Result<Option<RegexSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    for p in patterns {
        if p.is_empty() {
            bail!("{flag}: the pattern is empty (it would match every frame)");
        }
        if let Err(e) = Regex::new(p) {
            bail!(
                "{flag} {p:?} is not a valid regular expression: {}",
                regex_error(&e)
            );
        }
    }
    match RegexSet::new(patterns) {
        Ok(set) => Ok(Some(set)),
        Err(e) => bail!(
            "{flag}: the patterns together are too large: {}",
            regex_error(&e)
        ),
    }
}

/// A regex error in one line: the parser's own message is several lines
/// (the pattern with a caret under the fault), whose last says what is
/// wrong.
fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid pattern");
    last.trim().trim_start_matches("error: ").to_string()
}

impl StackFilter {
    /// The filter of `--grep` and `--exclude` patterns; `None` if neither
    /// was given.
    pub fn new(grep: &[String], exclude: &[String]) -> Result<Option<StackFilter>> {
        let grep = compile("--grep", grep)?;
        let exclude = compile("--exclude", exclude)?;
        if grep.is_none() && exclude.is_none() {
            return Ok(None);
        }
        Ok(Some(StackFilter { grep, exclude }))
    }

    /// Whether `sample` is kept when shown as `shape` says.
    pub fn keeps(&self, sample: &Sample, shape: Shape) -> bool {
        let frames = shown_frames(sample, shape);
        let any = |set: &RegexSet| {
            frames.iter().any(|f| {
                set.is_match(&f.name) || f.shown.as_deref().is_some_and(|s| set.is_match(s))
            })
        };
        self.grep.as_ref().is_none_or(any) && !self.exclude.as_ref().is_some_and(any)
    }

    /// Drops the samples the patterns do not keep; returns how many were
    /// dropped.
    pub fn apply(&self, profile: &mut Profile, shape: Shape) -> usize {
        let before = profile.samples.len();
        profile.samples.retain(|s| self.keeps(s, shape));
        before - profile.samples.len()
    }
}

/// Every frame of a sample the outputs show, markers of lost stacks as
/// frames named by them, the waker's included.
fn shown_frames(sample: &Sample, shape: Shape) -> Vec<Cow<'_, Frame>> {
    let mut out = crate::shape::leaf_first(sample, shape);
    if let Some(w) = &sample.waker {
        let (user, kernel) = w.parts();
        if shape.mode.kernel() {
            add(&mut out, kernel, MISSED_KERNEL);
        }
        if shape.mode.user() {
            add(&mut out, user, MISSED_USER);
        }
    }
    out
}

fn add<'a>(out: &mut Vec<Cow<'a, Frame>>, part: &'a Part, missed: &str) {
    match part {
        Part::Absent => {}
        Part::Missed => out.push(Cow::Owned(Frame::named(missed))),
        Part::Frames(f) => out.extend(f.iter().map(Cow::Borrowed)),
    }
}
