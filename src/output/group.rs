//! `--group`: the report with threads and processes that blocked in the
//! same stack merged into one entry, as pykdump's `bt -a` summary
//! (BTstack) groups the tasks of a crash dump, with the time each stack
//! cost. An entry gives the stacks as the report prints them, then how
//! many threads and processes blocked there, the commands among them with
//! how many threads each, the containers among them (where any was in
//! one), the blocks and the total time. Stacks are the
//! same when they print the same (after `-U`/`-K`/`-d`, `--states`,
//! `--wakers`): frames by name, or as `-s`/`--addresses` show them.
//!
//! Entries come fewest threads first (then least time), so that the stack
//! most threads share ends the output, next to the prompt, as the report
//! puts its largest entry last; `--group-sort desc` puts it first.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Write};

use super::text::write_stacks;
use super::Shape;
use crate::profile::{ns_to_us, Profile};
use crate::text::count;

pub use crate::shape::GroupSort;

/// One stack shared by threads.
#[derive(Default)]
struct Group {
    threads: BTreeSet<(u32, u32)>,
    /// Command -> its threads.
    commands: BTreeMap<String, BTreeSet<u32>>,
    /// Container (short id) -> its threads, for threads in one.
    containers: BTreeMap<String, BTreeSet<u32>>,
    total_ns: u64,
    blocks: u64,
}

pub fn write(
    profile: &Profile,
    shape: Shape,
    sort: GroupSort,
    w: &mut dyn Write,
) -> io::Result<()> {
    let profile = profile.by_name();
    let mut groups: HashMap<Vec<u8>, Group> = HashMap::new();
    for s in &profile.samples {
        let mut stack = Vec::new();
        write_stacks(&mut stack, s, shape)?;
        let g = groups.entry(stack).or_default();
        g.threads.insert((s.tgid, s.pid));
        g.commands.entry(s.comm.clone()).or_default().insert(s.pid);
        if let Some(id) = s.container.as_deref().and_then(|c| c.short_id()) {
            g.containers
                .entry(id.to_string())
                .or_default()
                .insert(s.pid);
        }
        g.total_ns += s.total_ns;
        g.blocks += s.count;
    }
    let mut groups: Vec<(Vec<u8>, Group)> = groups
        .into_iter()
        .filter(|(_, g)| ns_to_us(g.total_ns) > 0)
        .collect();
    groups.sort_by(|a, b| {
        a.1.threads
            .len()
            .cmp(&b.1.threads.len())
            .then_with(|| a.1.total_ns.cmp(&b.1.total_ns))
            .then_with(|| a.0.cmp(&b.0))
    });
    if sort == GroupSort::Desc {
        groups.reverse();
    }
    for (stack, g) in &groups {
        let processes: BTreeSet<u32> = g.threads.iter().map(|&(tgid, _)| tgid).collect();
        writeln!(
            w,
            "----- {} in {} -----",
            count(g.threads.len() as u64, "thread", "threads"),
            count(processes.len() as u64, "process", "processes")
        )?;
        w.write_all(stack)?;
        let commands: Vec<String> = g
            .commands
            .iter()
            .map(|(comm, tids)| format!("{comm} ({})", tids.len()))
            .collect();
        writeln!(w, "    {:<16} {}", "commands:", commands.join(", "))?;
        if !g.containers.is_empty() {
            let containers: Vec<String> = g
                .containers
                .iter()
                .map(|(id, tids)| format!("{id} ({})", tids.len()))
                .collect();
            writeln!(w, "    {:<16} {}", "containers:", containers.join(", "))?;
        }
        writeln!(
            w,
            "    {:<16} {}, {} us\n",
            "total:",
            count(g.blocks, "block", "blocks"),
            ns_to_us(g.total_ns)
        )?;
    }
    Ok(())
}
