//! `--snapshot`: the BPF program loaded without any hook, and its snapshot
//! iterator run once over every task. What it wrote (one `struct
//! snapshot_task` a task) and the stacks it stored are read back here.

use std::mem::MaybeUninit;

use anyhow::{anyhow, Context, Result};
use libbpf_rs::OpenObject;

use super::{
    choose_programs, comm_to_string, configure, fill_filters, first_that_loads, iterator_output,
    load_while, program_of, read_counters, read_stack, Attempt, Objects, Plan, Role, StartTables,
    TracerOptions, Unwind, UnwindStore,
};
use crate::bpf::types;
use crate::process::ticks_of_ns;
use crate::raw::{LossCounters, StackRef};

/// The letters of the task states, as /proc shows them, in the order of
/// the kernel's state index (`fs/proc/array.c`).
pub const STATE_LETTERS: &str = "RSDTtXZPI";

/// One task as the snapshot found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawTask {
    pub tgid: u32,
    /// When its process started (see [`crate::process::Proc`]).
    pub start: u64,
    pub pid: u32,
    pub comm: String,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    /// Its state letter (one of [`STATE_LETTERS`]).
    pub state: char,
    /// On a CPU when seen: no stacks were taken, and it is not off the CPU.
    pub on_cpu: bool,
    /// How long it had been off the CPU when seen, where the kernel keeps
    /// when it was last switched out.
    pub off_cpu_ns: Option<u64>,
}

/// Every task the snapshot kept, and the stacks they refer to.
#[derive(Clone, Debug, Default)]
pub struct RawSnapshot {
    pub tasks: Vec<RawTask>,
    /// Frames of each stored stack, innermost first.
    pub stacks: crate::raw::Stacks,
    pub counters: LossCounters,
    /// Whether the user stacks of other tasks could be read (the
    /// sleepable iterator, Linux 5.18).
    pub user_stacks: bool,
    /// When the first task was seen, CLOCK_MONOTONIC ns (0: no task).
    pub seen_ns: u64,
    /// The runtimes' notices of the frames the walks met
    /// ([`crate::raw::TaskEvent::RuntimeCode`]), with what else the frames
    /// said (an optimized JavaScript frame's return address).
    pub runtime_code: Vec<crate::raw::TaskEvent>,
}

/// Takes the snapshot: the program loaded with only its snapshot iterator,
/// the DWARF unwind tables written by `tables` (as for tracing), the
/// iterator run once. `states` is a mask of state indices (bit i: the
/// letter `STATE_LETTERS[i]`), 0 for all. As [`super::Tracer::start`], it
/// falls back to frame pointers where the DWARF unwinder cannot load, and
/// returns why.
pub fn take_snapshot(
    opts: &TracerOptions,
    states: u32,
    tables: &mut dyn StartTables,
) -> Result<(RawSnapshot, Option<anyhow::Error>)> {
    let mut ways = Vec::new();
    let user = !opts.test.no_start_user_stacks;
    if user {
        ways.push((opts.unwind, true));
        if opts.unwind == Unwind::Dwarf {
            ways.push((Unwind::FramePointers, true));
        }
    }
    ways.push((Unwind::FramePointers, false));
    let attempts: Vec<Attempt> = ways
        .into_iter()
        .map(|(unwind, user_stacks)| Attempt {
            unwind,
            hook: None,
            user_stacks,
        })
        .collect();
    let mut objects = Objects::default();
    let (taken, errors) = first_that_loads(&mut objects, &attempts, |room, a| {
        let opts = TracerOptions {
            unwind: a.unwind,
            ..opts.clone()
        };
        // One object: nothing is attached, nothing loaded later.
        try_snapshot(&mut room[0], &opts, states, a.user_stacks, tables)
    });
    let first_err = errors.into_iter().next().map(|(_, e)| e);
    match taken {
        Some((snap, a)) => Ok((snap, first_err.filter(|_| a.unwind != Unwind::Dwarf))),
        None => Err(first_err.unwrap_or_else(|| anyhow!("no way to load the snapshot iterator"))),
    }
}

fn try_snapshot(
    object: &mut MaybeUninit<OpenObject>,
    opts: &TracerOptions,
    states: u32,
    user: bool,
    tables: &mut dyn StartTables,
) -> Result<RawSnapshot> {
    let build = super::load::Build::for_run(opts, None);
    let mut open = super::load::open_build(object, build)?;
    configure(&mut open, opts)?;
    if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
        rodata.snapshot_states = states;
        if super::load::Build::of_settings(rodata) != build {
            anyhow::bail!(
                "the settings are not those of the {build:?} build the object was opened as"
            );
        }
    }
    // Only the one iterator: nothing else is attached.
    let plan = Plan::snapshot(user);
    let logs = choose_programs(&mut open, &plan, None)?;
    open.maps.task_data_by_tid.set_max_entries(1)?;
    // Not used here, and not there to create before Linux 5.11.
    super::load::skip_task_storage(&mut open)?;
    open.maps.run_by_tid.set_max_entries(1)?;
    let mut arrays = match opts.unwind == Unwind::Dwarf {
        true => Some(super::UnwindArrays::new(&mut open, opts.unwind_capacity)?),
        false => None,
    };
    let mut room = Ok(());
    let (skel, _) = load_while(open, logs, opts.test.verifier_stats, || {
        if let Some(arrays) = arrays.as_mut() {
            tables.prepare(opts.unwind_capacity);
            room = arrays.first_room();
        }
    })
    .context("failed to load the BPF program (snapshot iterator)")?;
    room?;
    fill_filters(&skel, opts)?;
    if let Some(arrays) = arrays {
        tables.install(UnwindStore::new(&skel, arrays)?);
    }
    // The sleepable iterator reads the tasks' memory: their runtimes'
    // frames too.
    if user && opts.runtimes() {
        tables.install_runtimes(super::RuntimeStore::new(&skel)?);
    }
    let iterator = plan
        .program(Role::Snapshot)
        .ok_or_else(|| anyhow!("no snapshot iterator"))?;
    let prog = program_of(&skel, iterator)?;
    let bytes = snapshot_output(&prog).context("failed to run the snapshot iterator")?;
    let (tasks, seen_ns) = parse_tasks(&bytes)?;
    let mut ids: Vec<u64> = tasks
        .iter()
        .flat_map(|t| [t.user_stack, t.kernel_stack])
        .filter_map(|s| match s {
            StackRef::Id(id) => Some(id),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    // The notices the walks sent (the rest of the ring's news is of no use
    // here: nothing is traced).
    let runtime_code = std::cell::RefCell::new(Vec::new());
    {
        let mut builder = libbpf_rs::RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, |data: &[u8]| {
                if let Some(e @ crate::raw::TaskEvent::RuntimeCode { .. }) =
                    super::read::task_event(data)
                {
                    runtime_code.borrow_mut().push(e);
                }
                0
            })
            .context("failed to set up the event ring buffer")?;
        builder
            .build()
            .context("failed to set up the event ring buffer")?
            .consume()
            .context("failed to read the event ring buffer")?;
    }
    let mut stacks = crate::raw::Stacks::default();
    for id in ids {
        if let Some(frames) = read_stack(&skel, id)? {
            stacks.insert(id, &frames);
        }
    }
    Ok(RawSnapshot {
        tasks,
        stacks,
        counters: read_counters(&skel)?,
        user_stacks: user,
        seen_ns,
        runtime_code: runtime_code.into_inner(),
    })
}

/// Runs the snapshot iterator once and returns what it wrote. The reading
/// thread sleeps first, so that it is switched in just before the
/// iterator runs: its last switch-in then dates the reading on the
/// scheduler's clock (see `self_arrival_ns`).
fn snapshot_output(prog: &libbpf_rs::ProgramMut<'_>) -> Result<Vec<u8>> {
    iterator_output(prog, Some(std::time::Duration::from_micros(50)))
}

/// The iterator's output: one `struct snapshot_task` after the other. Also
/// when the first was seen.
fn parse_tasks(bytes: &[u8]) -> Result<(Vec<RawTask>, u64)> {
    let size = std::mem::size_of::<types::snapshot_task>();
    if !bytes.len().is_multiple_of(size) {
        return Err(anyhow!(
            "the snapshot iterator wrote {} bytes, not a whole number of {size}-byte records",
            bytes.len()
        ));
    }
    let mut records = Vec::with_capacity(bytes.len() / size);
    for chunk in bytes.chunks_exact(size) {
        let mut t = types::snapshot_task::default();
        plain::copy_from_bytes(&mut t, chunk)
            .map_err(|e| anyhow!("bad record from the snapshot iterator: {e:?}"))?;
        records.push(t);
    }
    let first_seen = records.first().map_or(0, |t| t.seen_ns);
    // How far CLOCK_MONOTONIC is ahead of the scheduler's clock: at most
    // the least gap between a reading and the reader's last switch-in.
    let ahead = records
        .iter()
        .filter(|t| t.self_arrival_ns != 0)
        .map(|t| t.seen_ns.wrapping_sub(t.self_arrival_ns) as i64)
        .min();
    let mut out = Vec::with_capacity(records.len());
    for t in records {
        let on_cpu = t.on_cpu != 0;
        let off_cpu_ns = match ahead {
            Some(ahead) if !on_cpu && t.off_since_ns != 0 => {
                let since = t.off_since_ns as i64 + ahead;
                Some((t.seen_ns as i64).saturating_sub(since).max(0) as u64)
            }
            _ => None,
        };
        out.push(RawTask {
            tgid: t.tgid,
            start: ticks_of_ns(t.process_start),
            pid: t.pid,
            comm: comm_to_string(&t.comm),
            user_stack: StackRef::from_raw(t.user_stack_id),
            kernel_stack: StackRef::from_raw(t.kernel_stack_id),
            state: STATE_LETTERS
                .chars()
                .nth(t.state_index as usize)
                .unwrap_or('?'),
            on_cpu,
            off_cpu_ns,
        });
    }
    Ok((out, first_seen))
}

/// The mask of state indices for a string of state letters (`DS`); an
/// unknown letter is an error naming it.
pub fn states_mask(letters: &str) -> Result<u32> {
    let mut mask = 0;
    for c in letters.chars() {
        let i = STATE_LETTERS.find(c).ok_or_else(|| {
            anyhow!(
                "--snapshot {letters:?}: {c:?} is not a task state letter (one of {} as \
                 /proc shows them: R running, S sleeping, D uninterruptible, T stopped, t \
                 traced, X dead, Z zombie, P parked, I idle)",
                STATE_LETTERS
            )
        })?;
        mask |= 1 << i;
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_letters_to_mask() {
        assert_eq!(states_mask("").unwrap(), 0);
        assert_eq!(states_mask("R").unwrap(), 1);
        assert_eq!(states_mask("DS").unwrap(), 0b110);
        assert_eq!(states_mask("tI").unwrap(), (1 << 4) | (1 << 8));
        let err = states_mask("Dx").unwrap_err().to_string();
        assert!(err.contains("'x' is not a task state letter"), "{err}");
        assert!(states_mask("D\u{e9}").is_err());
    }

    fn record(pid: u32, since: u64, seen: u64, self_arrival: u64, on_cpu: bool) -> Vec<u8> {
        let t = types::snapshot_task {
            tgid: pid,
            pid,
            off_since_ns: since,
            seen_ns: seen,
            self_arrival_ns: self_arrival,
            state_index: if on_cpu { 0 } else { 2 },
            on_cpu: on_cpu.into(),
            ..Default::default()
        };
        // SAFETY: plain old data.
        unsafe { plain::as_bytes(&t) }.to_vec()
    }

    /// The scheduler's clock is tied to CLOCK_MONOTONIC by the least gap
    /// between a reading and the reader's last switch-in: here 11 ms
    /// behind, the gap 11.02 ms at the first record and 11.5 at the next.
    #[test]
    fn off_cpu_time_on_the_monotonic_clock() {
        let ms = 1_000_000u64;
        let mut bytes = record(1, 1000 * ms, 2011 * ms + 20_000, 2000 * ms, false);
        bytes.extend(record(2, 0, 2012 * ms, 2000 * ms + ms / 2, false));
        bytes.extend(record(3, 1500 * ms, 2013 * ms, 2001 * ms + ms / 2, true));
        let (tasks, first) = parse_tasks(&bytes).unwrap();
        assert_eq!(first, 2011 * ms + 20_000);
        // Switched out at 1000 ms on the scheduler's clock, 1011.02 ms on
        // CLOCK_MONOTONIC (the tie is 20 us late): seen 1000 ms later.
        assert_eq!(tasks[0].off_cpu_ns, Some(1000 * ms));
        assert_eq!(tasks[0].state, 'D');
        assert_eq!(tasks[1].off_cpu_ns, None, "no switch-out kept");
        assert_eq!(tasks[2].off_cpu_ns, None, "on a CPU");
        assert!(tasks[2].on_cpu);
        assert_eq!(tasks[2].state, 'R');
        assert!(parse_tasks(&bytes[..bytes.len() - 1]).is_err());
    }
}
