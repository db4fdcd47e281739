//! How the stacks of a sample are shaped for the outputs and the frame
//! filters: which parts `-U`/`-K` keep, `-d`'s delimiter, the marker
//! frames of lost parts, and the order of grouped reports.

use crate::profile::StackMode;

/// The marker frame of a user part that was lost.
pub const MISSED_USER: &str = "[Missed User Stack]";
/// The marker frame of a kernel part that was lost.
pub const MISSED_KERNEL: &str = "[Missed Kernel Stack]";

/// How stacks are shaped by `-U`, `-K` and `-d`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    pub mode: StackMode,
    /// A `-` frame between the user and the kernel part.
    pub delimited: bool,
    /// `--per-container`: a `[container ID]` frame at the root of each
    /// stack (folded, flame graph), a speedscope profile per container.
    pub per_container: bool,
}

/// The root frame of a sample's stack with `--per-container`: its
/// container's short id, or that it is in none (or was not seen).
pub fn container_frame(sample: &crate::profile::Sample) -> String {
    match sample.container.as_deref().and_then(|c| c.short_id()) {
        Some(id) => format!("[container {id}]"),
        None => NO_CONTAINER.to_string(),
    }
}

/// The root frame of processes outside any container (`--per-container`).
pub const NO_CONTAINER: &str = "[no container]";

/// The frames of one sample as `-U`/`-K` show them, innermost (leaf)
/// first: the kernel part, then the user part; a part that was lost is
/// one frame named by its "missed" marker; with `--chains`, the hops
/// beyond the block's frames first. `-d`'s delimiter is not a
/// frame here: these stacks are for formats that know which frames are the
/// kernel's.
pub fn leaf_first(
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
    // --chains: the hops beyond the block's own frames.
    if let Some(chain) = sample.waker.as_ref().and_then(|w| w.chain()) {
        out.extend(part(chain, MISSED_KERNEL));
    }
    if shape.mode.kernel() {
        out.extend(part(&sample.kernel, MISSED_KERNEL));
    }
    if shape.mode.user() {
        out.extend(part(&sample.user, MISSED_USER));
    }
    out
}

/// The order of `--group`'s entries (and of `--snapshot`'s groups).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupSort {
    /// Fewest threads first (BTstack's order), the most shared stack last.
    #[default]
    Asc,
    /// Most threads first.
    Desc,
}
