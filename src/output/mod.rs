//! Renderings of a [`Profile`](crate::profile::Profile).

pub mod folded;
pub mod sink;
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
