//! The report of `--snapshot`: one entry per stack that tasks wait in,
//! as pykdump's BTstack summarizes a crash dump's `foreach bt`.
//!
//! ```text
//! ----- 2 tasks like that -----
//!     do_nanosleep
//!     ...
//!     clock_nanosleep
//!     ...
//!     commands:        app (2)
//!     states:          S (2)
//!     youngest:        pid 101 (app), off CPU 1.250 s
//!     oldest:          pid 100 (app), off CPU 2.500 s
//! ```
//!
//! The stack is printed as the report prints it (kernel frames, then user
//! frames, most recent first). Entries come fewest tasks first, so that
//! the stack most tasks share ends the output (`--group-sort desc`: first).
//! Off-CPU times are since each task's last switch-out; where the kernel
//! cannot tell (a task running on a CPU, a real-time task), a line says
//! so. With `-v`, every task is listed: pid, command, state and time.

use std::collections::HashMap;
use std::io::{self, Write};

use super::group::GroupSort;
use super::Shape;
use crate::profile::Sample;
use crate::snapshot::{Group, OffCpu, Snapshot, Task};
use crate::text::count;

/// Seconds with milliseconds.
fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

fn off_cpu(t: &Task) -> String {
    match t.off_cpu {
        OffCpu::For(ns) => format!("off CPU {}", secs(ns)),
        OffCpu::Running => "on a CPU".to_string(),
        OffCpu::Unknown => "off CPU for an unknown time".to_string(),
    }
}

pub fn write(
    snapshot: &Snapshot,
    shape: Shape,
    sort: GroupSort,
    every_task: bool,
    w: &mut dyn Write,
) -> io::Result<()> {
    for g in groups(snapshot, shape, sort) {
        write_group(&g, every_task, w)?;
    }
    Ok(())
}

/// The tasks merged by stack, as the report prints it under `shape`:
/// fewest tasks first (BTstack's order; ties by stack), or most first
/// with [`GroupSort::Desc`].
pub fn groups(snapshot: &Snapshot, shape: Shape, sort: GroupSort) -> Vec<Group<'_>> {
    let mut by_stack: HashMap<String, Vec<&Task>> = HashMap::new();
    for t in &snapshot.tasks {
        by_stack
            .entry(stack_text(&t.sample, shape))
            .or_default()
            .push(t);
    }
    let mut groups: Vec<Group<'_>> = by_stack
        .into_iter()
        .map(|(stack, mut tasks)| {
            tasks.sort_by_key(|t| (t.sample.pid, t.sample.tgid));
            Group { stack, tasks }
        })
        .collect();
    groups.sort_by(|a, b| {
        a.tasks
            .len()
            .cmp(&b.tasks.len())
            .then_with(|| a.stack.cmp(&b.stack))
    });
    if sort == GroupSort::Desc {
        groups.reverse();
    }
    groups
}

/// The stacks of a sample as the report prints them.
fn stack_text(sample: &Sample, shape: Shape) -> String {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = super::text::write_stacks(&mut out, sample, shape);
    String::from_utf8_lossy(&out).into_owned()
}

fn write_group(g: &Group<'_>, every_task: bool, w: &mut dyn Write) -> io::Result<()> {
    let n = g.tasks.len();
    if n == 1 {
        writeln!(w, "----- 1 task -----")?;
    } else {
        // wording: a count never 1
        writeln!(w, "----- {n} tasks like that -----")?;
    }
    w.write_all(g.stack.as_bytes())?;
    let list = |items: Vec<String>| items.join(", ");
    writeln!(
        w,
        "    {:<16} {}",
        "commands:",
        list(
            g.commands()
                .iter()
                .map(|(c, n)| format!("{c} ({n})"))
                .collect()
        )
    )?;
    writeln!(
        w,
        "    {:<16} {}",
        "states:",
        list(
            g.states()
                .iter()
                .map(|(s, n)| format!("{s} ({n})"))
                .collect()
        )
    )?;
    // The containers among the tasks (where any is in one), with how many
    // tasks each.
    let mut containers: std::collections::BTreeMap<&str, usize> = Default::default();
    for t in &g.tasks {
        if let Some(id) = t.sample.container.as_deref().and_then(|c| c.short_id()) {
            *containers.entry(id).or_default() += 1;
        }
    }
    if !containers.is_empty() {
        writeln!(
            w,
            "    {:<16} {}",
            "containers:",
            list(
                containers
                    .iter()
                    .map(|(c, n)| format!("{c} ({n})"))
                    .collect()
            )
        )?;
    }
    let who = |t: &Task| format!("pid {} ({})", t.sample.pid, t.sample.thread_name());
    if let [only] = g.tasks[..] {
        writeln!(w, "    {:<16} {}", "time:", off_cpu(only))?;
    } else {
        match g.youngest_oldest() {
            // The one task whose time is known.
            Some((young, old)) if young.sample.pid == old.sample.pid => {
                writeln!(w, "    {:<16} {}, {}", "time:", who(young), off_cpu(young))?;
            }
            Some((young, old)) => {
                writeln!(
                    w,
                    "    {:<16} {}, {}",
                    "youngest:",
                    who(young),
                    off_cpu(young)
                )?;
                writeln!(w, "    {:<16} {}, {}", "oldest:", who(old), off_cpu(old))?;
            }
            None => {}
        }
        let tasks = |what: OffCpu| g.tasks.iter().filter(|t| t.off_cpu == what).count();
        let (running, unknown) = (tasks(OffCpu::Running), tasks(OffCpu::Unknown));
        let mut why = Vec::new();
        if running > 0 {
            why.push(format!(
                "{} on a CPU",
                count(running as u64, "task", "tasks")
            ));
        }
        if unknown > 0 {
            why.push(format!(
                "{} whose switch-out the kernel does not date",
                count(unknown as u64, "task", "tasks")
            ));
        }
        if !why.is_empty() {
            writeln!(w, "    {:<16} {}", "no time:", why.join(", "))?;
        }
    }
    if every_task {
        writeln!(w, "    tasks:")?;
        for t in &g.tasks {
            writeln!(
                w,
                "      {:>8} {:<16} {} {}",
                t.sample.pid,
                t.sample.thread_name(),
                t.state,
                off_cpu(t)
            )?;
        }
    }
    writeln!(w)
}
