//! Renderings of a [`Profile`](crate::profile::Profile).

pub mod folded;
pub mod group;
pub mod pprof;
pub mod profile_proto;
pub mod sink;
pub mod snapshot;
pub mod speedscope;
pub mod svg;
pub mod text;

use crate::profile::StackMode;

/// How stacks are shaped by `-U`, `-K` and `-d`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    pub mode: StackMode,
    /// A `-` frame between the user and the kernel part.
    pub delimited: bool,
}

/// The frames of one sample as `-U`/`-K` show them, innermost (leaf)
/// first: the kernel part, then the user part; a part that was lost is
/// one frame named by its "missed" marker. `-d`'s delimiter is not a
/// frame here: these stacks are for formats that know which frames are the
/// kernel's.
pub(crate) fn leaf_first(
    sample: &crate::profile::Sample,
    shape: Shape,
) -> Vec<std::borrow::Cow<'_, crate::profile::Frame>> {
    use crate::profile::{Frame, Part};
    use std::borrow::Cow;
    fn part<'a>(p: &'a Part, missed: &str) -> Vec<Cow<'a, Frame>> {
        match p {
            Part::Absent => Vec::new(),
            Part::Missed => vec![Cow::Owned(Frame::named(missed))],
            Part::Frames(f) => f.iter().map(Cow::Borrowed).collect(),
        }
    }
    let mut out = Vec::new();
    if shape.mode.kernel() {
        out.extend(part(&sample.kernel, folded::MISSED_KERNEL));
    }
    if shape.mode.user() {
        out.extend(part(&sample.user, folded::MISSED_USER));
    }
    out
}
