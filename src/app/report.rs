//! What a trace says on stderr besides the profile: losses, what could
//! not be read or walked, `-v`'s summaries and the periodic statistics line.

use super::*;
use crate::text::{count, noun};

/// `--on-cpu`: samples left out, and with `-v` what the samples were.
/// `running_ns`: with `-i`, the running time of every interval (`profile`
/// is the last one's).
pub(super) fn report_on_cpu(profile: &Profile, running_ns: Option<u64>, config: &Config) {
    let Some(hz) = config.tracer.on_cpu_hz else {
        return;
    };
    let c = &profile.counters;
    if c.oncpu_untimed > 0 {
        let n = c.oncpu_untimed;
        eprintln!(
            "offcputime: {} {} left out of {} running time: the tracepoint did not report \
             {} switch-in, and the scheduler could not date it (threads outside CFS: \
             real-time, deadline)",
            count(n, "run", "runs"),
            noun(n, "is", "are"),
            noun(n, "its thread's", "their threads'"),
            noun(n, "its", "their"),
        );
    }
    if c.oncpu_orphan_samples > 0 {
        let n = c.oncpu_orphan_samples;
        eprintln!(
            "offcputime: {} of threads whose running time was not counted {} left out",
            count(n, "on-CPU sample", "on-CPU samples"),
            noun(n, "is", "are"),
        );
    }
    if config.verbose {
        let running =
            running_ns.unwrap_or_else(|| profile.running().map(|s| s.total_ns).sum::<u64>());
        eprintln!(
            "offcputime: on-CPU: {} at {hz} Hz on each CPU ({} outside the window left \
             out); {:.3} s running in total, of which {:.3} s of {} (per interval, with -i) \
             that no sample caught",
            count(c.oncpu_samples, "sample", "samples"),
            c.oncpu_outside,
            running as f64 / 1e9,
            c.oncpu_unsampled_ns as f64 / 1e9,
            count(c.oncpu_unsampled_threads, "thread", "threads"),
        );
    }
}

/// `-v`: the processes of other pid namespaces (containers) by their pid
/// there too, since the outputs show the host's.
pub(super) fn report_namespaces(registry: &Registry, verbose: bool) {
    if !verbose {
        return;
    }
    let pids = registry.namespace_pids();
    if pids.is_empty() {
        return;
    }
    pub(super) const SHOWN: usize = 20;
    let list: Vec<String> = pids
        .iter()
        .take(SHOWN)
        .map(|(pid, ns)| format!("{pid} is {ns}"))
        .collect();
    let more = match pids.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(", and {n} more"),
    };
    eprintln!(
        "offcputime: pids in their own pid namespace: {}{more}",
        list.join(", ")
    );
}

/// Processes and files the profiler had no right to read, and what that
/// cost, once each.
pub(super) fn report_denied(registry: &Registry, symbolizer: &Symbolizer, config: &Config) {
    if !config.shape.mode.user() {
        return;
    }
    if symbolizer.unparsable() > 0 {
        eprintln!(
            "offcputime: the symbols of {} could not be parsed (malformed): their frames are \
             named by file and offset",
            count(symbolizer.unparsable() as u64, "file", "files")
        );
    }
    if let Some(note) = registry.replaced_note() {
        eprintln!("offcputime: {note}");
    }
    for note in registry.jit_notes() {
        eprintln!("offcputime: {note}");
    }
    let d = registry.denied();
    if !d.processes.is_empty() {
        eprintln!(
            "offcputime: the memory maps of {} of other users could not be read (that needs \
             CAP_SYS_PTRACE): their user frames are [unknown]",
            count(d.processes.len() as u64, "process", "processes")
        );
    }
    if let Some((first, why)) = d.files.first() {
        eprintln!(
            "offcputime: {} mapped by traced processes could not be opened ({first}: \
             {why}{}): their frames are unnamed, their stacks walked with frame pointers",
            count(d.files.len() as u64, "file", "files"),
            if d.files.len() > 1 {
                ", and others"
            } else {
                ""
            },
        );
        if config.verbose {
            for (path, why) in &d.files[1..] {
                eprintln!("offcputime:   {path}: {why}");
            }
        }
    }
}

/// What could not be measured or shown. `missed`: the stacks that could
/// not be shown (of every interval, with -i); `unreadable`: how many stacks
/// of threads blocked since before the start have no user stack, and
/// whether this kernel could read such stacks at all.
pub(super) fn report_losses(
    profile: &Profile,
    missed: usize,
    config: &Config,
    (unreadable, could, at_switch_in): (usize, bool, bool),
) {
    report_unreadable(
        config,
        unreadable,
        could,
        match (at_switch_in, unreadable) {
            (true, 1) => {
                "stack of threads blocked since before tracing started, or still blocked at its \
                 end (the kprobe hook takes a block's stacks when it ends), shows no user stack: \
                 it is counted, but"
            }
            (true, _) => {
                "stacks of threads blocked since before tracing started, or still blocked at its \
                 end (the kprobe hook takes a block's stacks when it ends), show no user stack: \
                 they are counted, but"
            }
            (false, 1) => {
                "stack of threads blocked since before tracing started shows no user stack: it \
                 is counted from the start, but"
            }
            (false, _) => {
                "stacks of threads blocked since before tracing started show no user stack: they \
                 are counted from the start, but"
            }
        },
    );
    report_missed(profile, missed, config, unreadable);
}

/// Kernel stacks walked with the kernel's ORC tables (blocks taken at their
/// switch-in with the BTF tracepoint; threads blocked since before the
/// start, still blocked at the end, `--snapshot`): those left without their
/// scheduler frames or lost, and with `verbose` how they were walked; with
/// `OFFCPUTIME_TEST_KSTACK_CHECK`, the whole stacks against the kernel's
/// walks of the same threads.
pub(super) fn report_kernel_stacks(
    c: &crate::raw::LossCounters,
    verbose: bool,
    pairs: Option<Result<crate::ksyms::StackPairs>>,
) {
    let lacking = c.kstack_no_sched + c.kstack_moved + c.kstack_not_walked;
    if lacking > 0 {
        eprintln!(
            "offcputime: {} of threads not running {} the scheduler's frames (schedule, \
             __schedule, ...), which the kernel's own walk leaves out: {} where the kernel's \
             unwind tables (ORC) could not be used, {} of threads that ran while they were \
             walked, {} of threads that ran between the kprobe's two end iterators (the kernel \
             stacks' and the user stacks')",
            count(lacking, "kernel stack", "kernel stacks"),
            noun(lacking, "lacks", "lack"),
            c.kstack_no_sched,
            c.kstack_moved,
            c.kstack_not_walked
        );
    }
    if c.kstack_unseen > 0 {
        let (blocks, have) = if c.kstack_unseen == 1 {
            ("block", "has")
        } else {
            ("blocks", "have")
        };
        eprintln!(
            "offcputime: {} {blocks} {have} no kernel stack: it is taken when the thread is \
             switched in again, and the kernel did not report that switch",
            c.kstack_unseen
        );
    }
    if verbose && c.kstack_walked + c.kstack_proved + lacking > 0 {
        eprintln!(
            "offcputime: kernel stacks: {} walked with the kernel's ORC tables, of which {} \
             finished by the kernel's own walk from a module's or BPF frame on; {} proved the \
             same as one of the thread's last walks; {lacking} without their scheduler frames",
            c.kstack_walked, c.kstack_spliced, c.kstack_proved
        );
    }
    if verbose && c.shapes_full > 0 {
        eprintln!(
            "offcputime: {} not kept to be proved at the thread's next block, the table of \
             the walks' shapes full: walked again instead",
            count(c.shapes_full, "walk", "walks")
        );
    }
    match pairs {
        None => {}
        Some(Err(e)) => eprintln!("offcputime: kernel stack check: {e:#}"),
        Some(Ok(pairs)) => {
            let Some(orc) = crate::ksyms::KernelOrc::load() else {
                eprintln!("offcputime: kernel stack check: the ORC tables are not known");
                return;
            };
            let differ: Vec<_> = pairs.iter().filter(|(w, h)| !orc.agrees(w, h)).collect();
            eprintln!(
                "offcputime: kernel stack check: {} compared with the kernel's walk, {} {}",
                count(pairs.len() as u64, "stack", "stacks"),
                differ.len(),
                noun(differ.len() as u64, "differs", "differ"),
            );
            for (w, h) in differ.iter().take(3) {
                eprintln!("offcputime: kernel stack check: walked {w:x?}, the kernel's {h:x?}");
            }
        }
    }
}

/// That `unreadable` user stacks, read from another task's context, could
/// not be read (`lead` says whose they are, agreeing with the count), and
/// why; `could`: whether this kernel reads them at all.
pub(super) fn report_unreadable(config: &Config, unreadable: usize, could: bool, lead: &str) {
    if unreadable > 0 && config.shape.mode.user() {
        let why = if could {
            format!(
                "{} process's memory map was locked for writing when tracing started (a thread \
                 in mmap, or one stuck in a page fault), and reading it could have held up the \
                 start",
                noun(unreadable as u64, "its", "their")
            )
        } else {
            "this kernel cannot read another thread's user stack from BPF (Linux 5.18 and \
             later can)"
                .to_string()
        };
        eprintln!("offcputime: {unreadable} {lead} {why}");
    }
}

/// What was lost, and why (bcc's warning, with every cause that counted
/// any, and the counters'). `missed`: the stacks that could not be shown,
/// `unreadable` of them for a reason said already.
pub(super) fn report_missed(profile: &Profile, missed: usize, config: &Config, unreadable: usize) {
    let c = &profile.counters;
    let missed = missed.saturating_sub(if config.shape.mode.user() {
        unreadable
    } else {
        0
    });
    if missed > 0 {
        let full = c.user_stack_full + c.kernel_stack_full > 0;
        let mut causes = vec![format!(
            "stack storage full: {} user and {}; walk failed: {} user and {} kernel",
            c.user_stack_full,
            count(c.kernel_stack_full, "kernel capture", "kernel captures"),
            c.user_stack_error,
            c.kernel_stack_error
        )];
        let (user, kernel) = (config.shape.mode.user(), config.shape.mode.kernel());
        // (One noun for one, another for more.)
        let mut cause = |shown: bool, n: u64, (one, many): (&str, &str)| {
            if shown && n > 0 {
                causes.push(format!("{n} {}", if n == 1 { one } else { many }));
            }
        };
        cause(
            true,
            c.stacks_no_memory,
            (
                "stack the kernel's BPF allocator had no memory for at the moment, with the \
                 spill table full too",
                "stacks the kernel's BPF allocator had no memory for at the moment, with the \
                 spill table full too",
            ),
        );
        cause(
            user,
            c.missed_not_walked,
            (
                "user stack copied to be walked once its process's unwind tables were ready, \
                 and never walked",
                "user stacks copied to be walked once their process's unwind tables were \
                 ready, and never walked",
            ),
        );
        cause(
            user,
            c.user_stack_in_exec,
            (
                "user stack taken inside an exec, past its point of no return: the thread's \
                 registers were still those of the image being replaced, its memory the new \
                 image's",
                "user stacks taken inside an exec, past its point of no return: the threads' \
                 registers were still those of the image being replaced, their memory the new \
                 image's",
            ),
        );
        cause(
            kernel,
            c.missed_no_switch_in,
            (
                "kernel stack due at a switch-in the kernel did not report",
                "kernel stacks due at switch-ins the kernel did not report",
            ),
        );
        cause(
            true,
            c.missed_not_stored,
            (
                "stack named by a count but not among those stored",
                "stacks named by a count but not among those stored",
            ),
        );
        let traces = if missed == 1 {
            "stack trace"
        } else {
            "stack traces"
        };
        eprintln!(
            "WARNING: {missed} {traces} could not be displayed ({}).{}",
            causes.join("; "),
            if full {
                " Consider increasing --stack-storage-size."
            } else {
                ""
            }
        );
    }
    if c.user_unmapped_stacks > 0 && config.shape.mode.user() {
        let (stacks, are, their) = match c.user_unmapped_stacks {
            1 => ("user stack", "is", "its"),
            _ => ("user stacks", "are", "their"),
        };
        eprintln!(
            // wording: not a count
            "WARNING: {} {stacks} ({:.3} s off-CPU) {are} all [unknown]: none of {their} \
             addresses is in a file {their} process maps, as read from /proc/PID/maps (again at \
             the end while it ran), and no perf map names them.",
            c.user_unmapped_stacks,
            c.user_unmapped_ns as f64 / 1e9
        );
    }
    if c.unseen_untimed > 0 {
        let (blocks, their) = match c.unseen_untimed {
            1 => ("block was", "its"),
            _ => ("blocks were", "their"),
        };
        eprintln!(
            "WARNING: {} {blocks} not counted: the kernel switched {their} thread back in \
             without reporting it, and only for normal (CFS) threads does it say when.",
            c.unseen_untimed
        );
    }
    if c.unwoken > 0 && config.tracer.states {
        let n = c.unwoken;
        eprintln!(
            "WARNING: {n} {} without the kernel reporting {} wake-up (sched_wakeup): {} wait for \
             a CPU is counted in the state {} blocked in.",
            noun(n, "block ended", "blocks ended"),
            noun(n, "its", "their"),
            noun(n, "its", "their"),
            noun(n, "it", "they"),
        );
    }
    if c.state_guessed > 0 && (config.tracer.states || config.tracer.state.is_some()) {
        let n = c.state_guessed;
        eprintln!(
            "WARNING: {n} {} as another CPU was already waking {} thread, and this hook does \
             not say which state the thread blocked in: {} counted as {} (interruptible). The \
             sched_switch tracepoint of Linux 5.18 and later says it.",
            noun(n, "block began", "blocks began"),
            noun(n, "its", "their"),
            noun(n, "it is", "they are"),
            noun(n, "a sleep", "sleeps"),
        );
    }
    if c.wakers_full > 0 {
        let n = c.wakers_full;
        eprintln!(
            "WARNING: {n} {} not recorded because the table of wakers was full (shown as \
             [Missed Waker]). Consider increasing --stack-storage-size.",
            noun(n, "waker was", "wakers were"),
        );
    }
    if c.counts_full > 0 {
        let n = c.counts_full;
        eprintln!(
            // wording: a count never 1
            "WARNING: {n} {} not counted because the table of distinct stacks was full ({} \
             entries, one per thread and pair of stacks: twice --stack-storage-size, at least \
             65536). Consider increasing --stack-storage-size.",
            noun(n, "block was", "blocks were"),
            crate::tracer::counts_capacity(config.tracer.stack_storage_size),
        );
    }
    if c.no_task_storage > 0 {
        let n = c.no_task_storage;
        eprintln!(
            "WARNING: {n} {} not timed (no per-task storage could be allocated).",
            noun(n, "block was", "blocks were"),
        );
    }
    if c.events_dropped > 0 && config.verbose {
        let n = c.events_dropped;
        eprintln!(
            "offcputime: {n} {} dropped; frames of processes that exited early may be unnamed",
            noun(
                n,
                "new-process notification was",
                "new-process notifications were"
            ),
        );
    }
}

/// What DWARF unwinding did not cover, and with -v its tables' size.
/// What became of the frames of the runtimes' processes (Python's of
/// CPython processes): what could not be shown is said (once each), the
/// rest with `-v`.
pub(super) fn report_runtimes(
    registry: &mut Registry,
    profile: &Profile,
    (verbose, unwalked): (bool, bool),
    on: &dyn Fn(crate::runtime::Kind) -> bool,
) {
    if unwalked {
        let procs: Vec<Proc> = registry
            .processes()
            .filter_map(|(tgid, start)| {
                Some(Proc {
                    tgid,
                    start: start?,
                })
            })
            .collect();
        let mut found = std::collections::BTreeMap::new();
        for p in procs {
            if let Some(entry) = registry.note_runtime(p) {
                // Not said of a runtime whose frames were not asked for.
                if on(entry.kind) {
                    *found.entry(entry.kind).or_insert(0usize) += 1;
                }
            }
        }
        for (kind, n) in found {
            let spec = kind.spec();
            eprintln!(
                // wording: not a count
                "offcputime: {} frames are not read on Linux {} (their walk needs bpf_loop: \
                 5.17): the stacks of {n} {} {} show the {}'s frames",
                spec.label,
                crate::tracer::kernel::release(),
                spec.processes,
                noun(n as u64, "process", "processes"),
                spec.native,
            );
        }
    }
    registry.settle_runtimes();
    for r in registry.runtimes() {
        for line in r.report(&profile.counters, verbose) {
            eprintln!("offcputime: {line}");
        }
    }
}

pub(super) fn report_unwinding(
    u: &Unwinder,
    deferred: &Deferred,
    profile: &Profile,
    verbose: bool,
) {
    let c = &profile.counters;
    if c.unwind_not_ready > 0 {
        eprintln!(
            "offcputime: {} {} walked with frame pointers because {} process's unwind tables \
             were not ready yet (its first blocks)",
            count(c.unwind_not_ready, "user stack", "user stacks"),
            noun(c.unwind_not_ready, "was", "were"),
            noun(c.unwind_not_ready, "its", "their"),
        );
    }
    let d = deferred.stats();
    if d.at_jit > 0 {
        eprintln!(
            "offcputime: {} taken before {} process's unwind tables were ready reached a \
             JVM's compiled code, which keeps no frame pointer, before the JVM's own frames \
             could be read (or with --no-java): cut there",
            count(d.at_jit as u64, "user stack", "user stacks"),
            noun(d.at_jit as u64, "its", "their"),
        );
    }
    if d.runtime_cut > 0 {
        eprintln!(
            "offcputime: {} taken before {} process's unwind tables were ready stopped in a \
             runtime's code: code compiled since the copy (another method's, perhaps), or a \
             thread stopped in the middle of it, or a frame that could not be read (shown as \
             the runtime's frames cut short or unreadable)",
            count(d.runtime_cut as u64, "user stack", "user stacks"),
            noun(d.runtime_cut as u64, "its", "their"),
        );
    }
    let copies_cut = |n: usize, why: &str| {
        if n > 0 {
            let n = n as u64;
            eprintln!(
                "offcputime: {} taken before {} process's unwind tables were ready {} cut \
                 short: {why}",
                count(n, "user stack", "user stacks"),
                noun(n, "its", "their"),
                noun(n, "was", "were"),
            );
        }
    };
    copies_cut(
        d.cut_deeper,
        &format!(
            "deeper than the {} KiB of stack copied at the block",
            crate::deferred::COPY_BYTES_ABOVE_SP >> 10
        ),
    );
    copies_cut(
        d.cut_outside,
        "the walk needed a word the copy does not hold, short of its whole size: above the \
         stack's top or a page that could not be read, below the stack pointer, or a frame \
         pointer guessed through code that keeps none (or registers or tables not of the \
         moment of the copy)",
    );
    copies_cut(d.cut_rule, "a rule of the tables the walk cannot follow");
    copies_cut(d.cut_depth, "deeper than --perf-max-stack-depth");
    let gaps = c.unwind_gap_frames + d.gap_frames as u64;
    if gaps > 0 {
        eprintln!(
            "offcputime: {} {} found through frame pointers in code that its object's \
             call-frame information does not cover (assembly or a PLT without it, or code built \
             without unwind tables): {} right only where that code keeps frame pointers",
            count(gaps, "user frame", "user frames"),
            noun(gaps, "was", "were"),
            noun(gaps, "it is", "they are"),
        );
    }
    let missed = (d.unwalked + d.unstored + d.dropped + d.unfinished + d.replaced) as u64
        + c.unwind_defer_lost
        + c.unwind_defer_paced;
    if missed > 0 {
        eprintln!(
            "offcputime: {} taken before {} process's unwind tables were ready {} missed: {} \
             of processes that exited before their mappings could be read or whose tables \
             could not be made, {} of an image an exec replaced before its mappings could be \
             read, {} still waiting for their tables when the trace ended, {} not copied \
             beyond their CPU's share of copies (more new threads blocking at once than a \
             switch may copy), {} lost for want of room to copy or keep them (the copies came \
             faster than the profiler read them), {} for want of room to store them \
             (--stack-storage-size)",
            count(missed, "user stack", "user stacks"),
            noun(missed, "its", "their"),
            noun(missed, "is", "are"),
            d.unwalked,
            d.replaced,
            d.unfinished,
            c.unwind_defer_paced,
            c.unwind_defer_lost + d.dropped as u64,
            d.unstored
        );
    }
    if verbose {
        for c in deferred.outside() {
            eprintln!(
                "offcputime: a copied user stack of process {} (address space {:#x} with {} \
                 bytes of executable mappings) cut at {:#x}, outside the {} bytes copied from \
                 {:#x}: pc {:#x}, sp {:#x}, bp {:#x}, frames {:x?}; the process's tables: {}",
                c.proc.tgid,
                c.space.mm,
                c.space.exec_vm,
                c.addr,
                c.len,
                c.base,
                c.regs.pc,
                c.regs.sp,
                c.regs.bp,
                c.frames,
                u.describe_process(c.proc.tgid)
            );
        }
        for (p, space) in deferred.unfinished() {
            eprintln!(
                "offcputime: a user stack of process {} still waiting for its tables at the \
                 end was copied in address space {:#x} with {} bytes of executable mappings; \
                 the process's tables: {}",
                p.tgid,
                space.mm,
                space.exec_vm,
                u.describe_process(p.tgid)
            );
        }
    }
    report_not_covered(u);
    if verbose {
        report_unwind_stats(u, &d, c);
    }
}

/// The objects and processes left without DWARF unwinding (the first few).
fn report_not_covered(u: &Unwinder) {
    let (missing, more) = u.not_covered();
    if !missing.is_empty() {
        const SHOWN: usize = 3;
        for m in missing.iter().take(SHOWN) {
            if m.later {
                eprintln!(
                    "offcputime: no DWARF unwinding for {} in process {} at first: {}; frame \
                     pointers were used there until room was made (the tables of processes \
                     that had not blocked for {} s let go)",
                    m.what,
                    m.tgid,
                    m.why,
                    crate::unwind::COLD.as_secs()
                );
            } else {
                eprintln!(
                    "offcputime: no DWARF unwinding for {} in process {}: {}; frame pointers are \
                     used there",
                    m.what, m.tgid, m.why
                );
            }
        }
        if missing.len() + more > SHOWN {
            eprintln!(
                "offcputime: ... and {} without DWARF unwinding",
                count(
                    (missing.len() + more - SHOWN) as u64,
                    "more object or process",
                    "more objects or processes"
                )
            );
        }
    }
}

/// `-v`: the unwind tables' use, and the stacks walked with them.
fn report_unwind_stats(
    u: &Unwinder,
    d: &crate::deferred::DeferredStats,
    c: &crate::raw::LossCounters,
) {
    let s = u.stats();
    let mib = |n: usize, size: usize| (n * size) as f64 / (1 << 20) as f64;
    let row = std::mem::size_of::<crate::bpf::types::unwind_row>();
    let mapping = std::mem::size_of::<crate::bpf::types::unwind_mapping>();
    eprintln!(
        "offcputime: unwind tables: {} ({} without call-frame information), {}, {} of {}: \
         {:.1} MiB in {:.1} MiB allocated (at most {:.1}), built in {:.0} ms; {} walked with \
         them ({} cut short, {} proved unchanged since one of the thread's last walks), {} \
         through frame pointers ({} in code its object's tables do not cover)",
        count(s.objects as u64, "object", "objects"),
        s.objects_without_cfi,
        count(s.rows as u64, "row", "rows"),
        count(s.mappings as u64, "mapping", "mappings"),
        count(s.processes as u64, "process", "processes"),
        mib(s.rows, row) + mib(s.mappings, mapping),
        mib(s.allocated_bytes, 1),
        mib(s.row_capacity, row) + mib(s.mapping_capacity, mapping),
        s.build_ms,
        count(c.unwind_dwarf, "stack", "stacks"),
        c.unwind_truncated,
        c.unwind_cached,
        count(c.unwind_fp_frames, "frame", "frames"),
        c.unwind_gap_frames,
    );
    eprintln!(
        "offcputime: unwind tables: {} used {} parent's from the fork ({} shared by \
         userspace); {} of processes without tables of their own walked through those of the \
         files they map ({}); {} taken before {} process's tables were ready copied and walked \
         in userspace ({} walked, {} cut short, {} through frame pointers, {} with a runtime's \
         frames: {})",
        count(c.unwind_forked, "new process", "new processes"),
        noun(c.unwind_forked, "its", "their"),
        s.processes_forked,
        count(c.unwind_by_file, "user stack", "user stacks"),
        count(s.files as u64, "file", "files"),
        count(d.received as u64, "user stack", "user stacks"),
        noun(d.received as u64, "its", "their"),
        d.walked,
        d.cut,
        count(d.fp_frames as u64, "frame", "frames"),
        d.runtime_stacks,
        count(d.runtime_frames as u64, "frame", "frames"),
    );
    eprintln!(
        "offcputime: unwind tables: {} let {} go for room, not having blocked for {} s ({} \
         given them again at a later block); {} left without some for want of room got them \
         later; {} moved to put free rows together",
        count(s.processes_let_go as u64, "process", "processes"),
        noun(s.processes_let_go as u64, "its", "theirs"),
        crate::unwind::COLD.as_secs(),
        s.processes_taken_back,
        count(s.processes_given_room as u64, "process", "processes"),
        count(s.tables_moved as u64, "table", "tables"),
    );
}

/// `-v`: the counters of what was lost or left out, and what `--state`,
/// `--sample`, `-i`'s held intervals (`held`) and `--wakers` did.
pub(super) fn report_counters(
    profile: &Profile,
    config: &Config,
    held: Option<crate::intervals::HeldStats>,
) {
    let c = &profile.counters;
    eprintln!(
        "offcputime: stack captures lost: storage full {} user / {} kernel, walk failed \
         {} user / {} kernel (no stack is dropped for a hash collision: stacks are keyed by a 64-bit hash of \
         their frames; {} kept in the spill table when the stacks table had no memory at the \
         moment, {} lost with it full); {} of kernel threads (no user stack); {} untimed (no task \
         storage); {} dropped; {} the tracepoint did not report (blocks closed where the \
         kernel dates the switch)",
        c.user_stack_full,
        c.kernel_stack_full,
        c.user_stack_error,
        c.kernel_stack_error,
        c.stacks_spilled,
        c.stacks_no_memory,
        count(c.kernel_thread_blocks, "block", "blocks"),
        count(c.no_task_storage, "block", "blocks"),
        count(
            c.events_dropped,
            "new-process notification",
            "new-process notifications"
        ),
        count(c.unseen_switch_in, "switch", "switches"),
    );
    if config.tracer.states {
        let mut by_state: std::collections::BTreeMap<_, u64> = Default::default();
        for s in &profile.samples {
            if let Some(st) = s.state {
                *by_state.entry(st).or_default() += s.total_ns;
            }
        }
        let parts: Vec<String> = by_state
            .iter()
            .map(|(st, ns)| format!("{} {:.3} s", st.frame(), *ns as f64 / 1e9))
            .collect();
        eprintln!(
            "offcputime: by state: {}; {} a block, {} ended with none seen",
            parts.join(", "),
            count(c.wakeups, "wake-up split", "wake-ups split"),
            count(c.unwoken, "block", "blocks")
        );
    }
    if config.tracer.sample_ns > 0 {
        eprintln!(
            "offcputime: sampled below {} us: {} taken (each weighted up to it), {} left out; \
             times and block counts are estimates",
            config.tracer.sample_ns / 1000,
            count(c.sampled_short, "short block", "short blocks"),
            c.sampled_out
        );
    }
    if let Some(h) = held {
        eprintln!(
            "offcputime: {} for the stacks copied for {} to be walked before {} written \
             ({}: {} walked, {} given up, {} still waiting at the {} s bound)",
            count(h.intervals, "interval waited", "intervals waited"),
            noun(h.intervals, "it", "them"),
            noun(h.intervals, "it was", "they were"),
            count(h.stacks, "stack", "stacks"),
            h.walked,
            h.given_up,
            h.late,
            crate::intervals::Held::<()>::WAIT.as_secs()
        );
    }
    if config.tracer.wakers {
        eprintln!(
            "offcputime: {} recorded ({} distinct), {} lost for a full table",
            count(c.wakers, "waker", "wakers"),
            profile
                .samples
                .iter()
                .filter_map(|s| s.waker.as_ref())
                .collect::<std::collections::HashSet<_>>()
                .len(),
            c.wakers_full
        );
    }
}

/// With `OFFCPUTIME_STATS_INTERVAL=SECONDS` in the environment, a line on
/// stderr every so often while tracing, for long runs and benchmarks: how
/// many processes came and went, the unwind tables' use and the resident
/// memory.
pub(super) struct StatsLine {
    pub(super) every: Option<Duration>,
    pub(super) began: Instant,
    pub(super) last: Instant,
    pub(super) processes: usize,
    pub(super) exited: usize,
}

impl StatsLine {
    /// A line every `every` (None: never).
    pub(super) fn new(every: Option<Duration>, began: Instant) -> StatsLine {
        StatsLine {
            every,
            began,
            last: Instant::now(),
            processes: 0,
            exited: 0,
        }
    }

    pub(super) fn maybe_print(&mut self, unwinder: Option<&Unwinder>) {
        let Some(every) = self.every else {
            return;
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let tables = unwinder.map_or(String::new(), |u| {
            let s = u.stats();
            format!(
                // wording: not a count
                " objects={} rows={}/{} mappings={}/{} procs={} building={}",
                s.objects,
                s.rows,
                s.row_capacity,
                s.mappings,
                s.mapping_capacity,
                s.processes,
                u.building()
            )
        });
        let rss = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next().map(str::to_string))
            })
            .unwrap_or_default();
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        eprintln!(
            "offcputime: stats: t={:.1}s processes={} exited={}{tables} rss_kib={rss} fds={fds}",
            self.began.elapsed().as_secs_f64(),
            self.processes,
            self.exited,
        );
    }
}
