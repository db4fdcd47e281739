//! bcc's default multi-line report: per thread and stack pair, the kernel
//! frames then the user frames (most recent first), `-  comm (tid)` and the
//! total in microseconds (the thread's whole name in its runtime where it
//! has one: a JVM's Java thread name, in place of the kernel's 15
//! characters); ascending by total so the largest ends up last,
//! next to the prompt. With `--states`, the thread state (`[sleep]`, ...)
//! is the last frame, as it is the outermost one in folded stacks. With
//! `--wakers`, each entry starts with its waker (`waker: comm (pid)`), the
//! waker's user then kernel frames outermost first, and `--`. A thread in
//! a container has its container's short id after its pid.

use std::io::{self, Write};

use super::folded::{MISSED_KERNEL, MISSED_USER, WAKER_SEPARATOR};
use super::Shape;
use crate::profile::{Part, Profile, Sample, Waker};

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    // Sorted ascending by time.
    let profile = profile.by_name();
    for s in &profile.samples {
        if s.total_us() == 0 {
            continue;
        }
        write_stacks(w, s, shape)?;
        match s.container.as_deref().and_then(|c| c.short_id()) {
            Some(id) => writeln!(
                w,
                "    {:<16} {} ({}) in container {id}",
                "-",
                s.thread_name(),
                s.pid
            )?,
            None => writeln!(w, "    {:<16} {} ({})", "-", s.thread_name(), s.pid)?,
        }
        writeln!(w, "        {}\n", s.total_us())?;
    }
    Ok(())
}

/// The stacks of one entry as the report prints them: the waker's (with
/// `--wakers`) and `--`, the kernel frames then the user frames, most
/// recent first, and the thread state (`--states`). Also the body of
/// `--group`'s entries.
pub(crate) fn write_stacks(w: &mut dyn Write, s: &Sample, shape: Shape) -> io::Result<()> {
    // The waker first, outermost frame first, so that the stacks read
    // from the waker's start down to the wake-up, then from where the
    // thread blocked out to its start, as the flame graph stacks them.
    // --chains: the hops first, innermost first, as the block's frames
    // are.
    if let Some(chain) = s.waker.as_ref().and_then(|w| w.chain()) {
        write_part(w, chain, MISSED_KERNEL)?;
    } else if let Some(waker) = &s.waker {
        match waker {
            Waker::Task { comm, pid, .. } => {
                writeln!(w, "    {:<16} {} ({})", "waker:", comm, pid)?
            }
            other => writeln!(w, "    {:<16} {}", "waker:", other.name())?,
        }
        let (user, kernel) = waker.parts();
        if shape.mode.user() {
            write_part_reversed(w, user, MISSED_USER)?;
        }
        if shape.mode.kernel() {
            let both = matches!(user, Part::Frames(_)) && matches!(kernel, Part::Frames(_));
            if shape.delimited && shape.mode.user() && both {
                writeln!(w, "    -")?;
            }
            write_part_reversed(w, kernel, MISSED_KERNEL)?;
        }
        writeln!(w, "    {:<16} {}", WAKER_SEPARATOR, WAKER_SEPARATOR)?;
    }
    if shape.mode.kernel() {
        write_part(w, &s.kernel, MISSED_KERNEL)?;
    }
    if shape.mode.user() {
        let both = matches!(s.user, Part::Frames(_)) && matches!(s.kernel, Part::Frames(_));
        if shape.delimited && shape.mode.kernel() && both {
            writeln!(w, "    --")?;
        }
        write_part(w, &s.user, MISSED_USER)?;
    }
    if let Some(state) = s.state {
        writeln!(w, "    {}", state.frame())?;
    }
    Ok(())
}

/// The frames of one part, outermost first, or its "missed" marker.
fn write_part_reversed(w: &mut dyn Write, part: &Part, missed: &str) -> io::Result<()> {
    match part {
        Part::Absent => Ok(()),
        Part::Missed => writeln!(w, "    {missed}"),
        Part::Frames(f) => f
            .iter()
            .rev()
            .try_for_each(|name| writeln!(w, "    {name}")),
    }
}

/// The frames of one part, most recent first, or its "missed" marker.
fn write_part(w: &mut dyn Write, part: &Part, missed: &str) -> io::Result<()> {
    match part {
        Part::Absent => Ok(()),
        Part::Missed => writeln!(w, "    {missed}"),
        Part::Frames(f) => f.iter().try_for_each(|name| writeln!(w, "    {name}")),
    }
}
