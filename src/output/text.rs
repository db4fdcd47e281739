//! bcc's default multi-line report: per thread and stack pair, the kernel
//! frames then the user frames (most recent first), `-  comm (tid)` and the
//! total in microseconds; ascending by total so the largest ends up last,
//! next to the prompt. With `--states`, the thread state (`[sleep]`, ...)
//! is the last frame, as it is the outermost one in folded stacks.

use std::io::{self, Write};

use super::folded::{MISSED_KERNEL, MISSED_USER};
use super::Shape;
use crate::profile::{Part, Profile};

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    // Sorted ascending by time.
    let profile = profile.by_name();
    for s in &profile.samples {
        if s.total_us() == 0 {
            continue;
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
        writeln!(w, "    {:<16} {} ({})", "-", s.comm, s.pid)?;
        writeln!(w, "        {}\n", s.total_us())?;
    }
    Ok(())
}

/// The frames of one part, most recent first, or its "missed" marker.
fn write_part(w: &mut dyn Write, part: &Part, missed: &str) -> io::Result<()> {
    match part {
        Part::Absent => Ok(()),
        Part::Missed => writeln!(w, "    {missed}"),
        Part::Frames(f) => f.iter().try_for_each(|name| writeln!(w, "    {name}")),
    }
}
