//! Loading the program: the objects and attempts, the settings written
//! before the load, which programs load, the load on a thread of its own,
//! the task-iterator runner, and how long each step took.

use super::*;

/// An open skeleton handed to the thread that loads it.
pub(super) struct SendOpen<T>(T);

// SAFETY: the open skeleton (or the opener that makes one: see `Opener`)
// is used by one thread at a time (moved to the loading thread, which
// hands back the loaded one); libbpf objects are not tied to the thread
// that made them.
unsafe impl<T> Send for SendOpen<T> {}

/// How long each step of starting took.
#[derive(Debug)]
pub struct Phases {
    pub(super) last: Instant,
    pub steps: Vec<(&'static str, Duration)>,
    /// What ran side by side during the load: each object's load (the
    /// verifier, mostly) and the tables prepared meanwhile.
    pub overlapped: Vec<(&'static str, Duration)>,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            last: Instant::now(),
            steps: Vec::new(),
            overlapped: Vec::new(),
        }
    }
}

impl Phases {
    pub(super) fn mark(&mut self, what: &'static str) {
        let now = Instant::now();
        self.steps.push((what, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (what, d)) in self.steps.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{what} {:.1} ms", d.as_secs_f64() * 1e3)?;
        }
        for (i, (what, d)) in self.overlapped.iter().enumerate() {
            let sep = if i == 0 { "; during the load: " } else { ", " };
            write!(f, "{sep}{what} {:.1} ms", d.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

/// Sets which of the object's programs load, by the program table (of
/// `part` only, if given), and gives each a verifier log of its own (see
/// `VerifierLogs`).
pub(super) fn choose_programs(
    open: &mut crate::bpf::OpenOffcputimeSkel<'_>,
    plan: &Plan,
    part: Option<Part>,
) -> Result<VerifierLogs> {
    let mut logs = VerifierLogs(Vec::new());
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let p = programs::named(&name)?;
        let load = match part {
            Some(part) => plan.loads_in(p, part),
            None => plan.loads(p),
        };
        prog.set_autoload(load);
        if load {
            logs.give(&mut prog, name)?;
        }
    }
    Ok(logs)
}

/// The verifier's log of each program that loads, in a buffer of our own,
/// at level 4: its statistics and, when it refuses a program, its reason,
/// never the instructions. Left to itself libbpf loads a refused program
/// again with every instruction logged, and once more with a log twice as
/// large each time it does not fit, up to 2 GiB: for a program of half a
/// million verified instructions, minutes on a slow machine (ten under
/// emulation) for a load that has failed already, before the next hook is
/// tried. With a buffer of the caller's it loads each program once.
pub(super) struct VerifierLogs(Vec<(String, Box<[u8]>)>);

/// Room for a program's log: statistics and error lines, a few hundred
/// bytes (a log that does not fit would fail the load with ENOSPC).
const VERIFIER_LOG_BYTES: usize = 256 << 10;

/// The verifier's level of statistics alone (BPF_LOG_STATS).
const BPF_LOG_STATS: u32 = 4;

/// The proofs' shapes each table holds (one for each code path threads
/// block under: the stackfarm's 8,200 threads keep 551 user and 23 kernel
/// ones): its buckets take 128 KiB, its elements 512 bytes each as they
/// are added. Past them a walk is not kept to be proved, and is counted
/// (`shapes_full`).
const SHAPES: u32 = 8192;
/// ... where hash maps are allocated whole at load (before 6.1): 512 KiB.
const PREALLOCATED_SHAPES: u32 = 1024;

impl VerifierLogs {
    fn give(&mut self, prog: &mut libbpf_rs::OpenProgramMut<'_>, name: String) -> Result<()> {
        use libbpf_rs::AsRawLibbpf;
        let mut buf = vec![0u8; VERIFIER_LOG_BYTES].into_boxed_slice();
        prog.set_log_level(BPF_LOG_STATS);
        // SAFETY: the program is open and not loaded; the buffer is a heap
        // allocation that lives, unmoved, in `self` until the load has
        // returned (`VerifierLogs` is kept by the caller of the load and
        // read after it), and libbpf writes at most its length.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_program__set_log_buf(
                prog.as_libbpf_object().as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len() as libbpf_rs::libbpf_sys::size_t,
            )
        };
        if rc != 0 {
            bail!("could not give program {name} a verifier log ({rc})");
        }
        self.0.push((name, buf));
        Ok(())
    }

    /// The lines each program's log holds, by program, for those the
    /// verifier has seen (programs load in order and the load stops at
    /// the first refused).
    fn lines(&self) -> impl Iterator<Item = (&str, Vec<String>)> {
        self.0.iter().filter_map(|(name, buf)| {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            let text = String::from_utf8_lossy(&buf[..end]);
            let lines: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            (!lines.is_empty()).then_some((name.as_str(), lines))
        })
    }

    /// Each program's statistics on one line (`OFFCPUTIME_VERIFIER_STATS`).
    pub(super) fn print_statistics(&self) {
        for (name, lines) in self.lines() {
            let stats: Vec<&str> = lines
                .iter()
                .map(String::as_str)
                .filter(|l| is_statistics(l))
                .collect();
            eprintln!("offcputime: verifier: {name}: {}", stats.join("; "));
        }
    }

    /// Why the load failed, as the verifier said it: the last program it
    /// saw and the last line of its log that is not a statistic (at this
    /// level the lines before it are notes, such as the global functions
    /// it takes as valid).
    /// None where that log holds only statistics and notes: then the
    /// load failed elsewhere (before the verifier saw the program, or
    /// outside it), and the last log is another program's, which loaded.
    pub(super) fn refusal(&self) -> Option<String> {
        let (name, lines) = self.lines().last()?;
        let said = lines
            .iter()
            .rev()
            .find(|l| !is_statistics(l) && !l.ends_with("is global and assumed valid."))?;
        Some(format!("the verifier refused {name}: {said}"))
    }
}

fn is_statistics(line: &str) -> bool {
    line.starts_with("verification time")
        || line.starts_with("processed ")
        || line.starts_with("stack depth")
}

/// The most attempts at loading the program one start makes: two
/// unwinders, three hooks, with and without user stacks at the start.
pub(super) const ATTEMPTS: usize = 12;

/// The objects one attempt opens: one per [`Part`], the hooks' creating
/// every map, the others loading their programs on those maps (see
/// [`open_on_maps`]).
pub(super) const OBJECTS_PER_ATTEMPT: usize = 3;

/// Room for the BPF objects of one attempt.
pub(super) type Room = [MaybeUninit<OpenObject>; OBJECTS_PER_ATTEMPT];

/// Room for the BPF objects of each attempt at loading the program (a
/// failed attempt's objects are dropped in place; those of the one that
/// loads live as long as the tracer).
pub struct Objects([Room; ATTEMPTS]);

impl Default for Objects {
    fn default() -> Objects {
        Objects(std::array::from_fn(|_| {
            std::array::from_fn(|_| MaybeUninit::uninit())
        }))
    }
}

/// One way of loading the program.
#[derive(Clone, Copy, Debug)]
pub(super) struct Attempt {
    pub(super) unwind: Unwind,
    /// The switch hook; none for `--snapshot`.
    pub(super) hook: Option<Hook>,
    /// The start (or snapshot) iterator reads user stacks.
    pub(super) user_stacks: bool,
}

/// The attempts that failed, with why.
pub(super) type Failures = Vec<(Attempt, anyhow::Error)>;

/// Tries `attempts` in order, each with an object of its own, until one
/// loads: what it gave, and the errors of those before it (of all, if none
/// loads).
pub(super) fn first_that_loads<'obj, T>(
    objects: &'obj mut Objects,
    attempts: &[Attempt],
    mut load: impl FnMut(&'obj mut Room, &Attempt) -> Result<T>,
) -> (Option<(T, Attempt)>, Failures) {
    let mut errors = Vec::new();
    let mut room: &'obj mut [Room] = &mut objects.0;
    for a in attempts {
        let Some((object, rest)) = std::mem::take(&mut room).split_first_mut() else {
            errors.push((*a, anyhow!("more attempts at loading than room for them")));
            break;
        };
        room = rest;
        match load(object, a) {
            Ok(t) => return (Some((t, *a)), errors),
            Err(e) => errors.push((*a, e)),
        }
    }
    (None, errors)
}

/// The loaded program of a table entry.
pub(super) fn program_of<'a>(
    skel: &'a OffcputimeSkel<'_>,
    p: &programs::Program,
) -> Result<libbpf_rs::ProgramMut<'a>> {
    use libbpf_rs::skel::Skel;
    skel.object()
        .progs_mut()
        .find(|prog| prog.name() == std::ffi::OsStr::new(p.name))
        .ok_or_else(|| anyhow!("the BPF object has no program {}", p.name))
}

/// Runs a task iterator program over every thread, once.
pub(super) fn run_iterator(prog: &libbpf_rs::ProgramMut<'_>) -> Result<()> {
    iterator_output(prog, None).map(drop)
}

/// Runs a task iterator program over every thread, once, and returns what
/// it wrote. `settle`: how long the reading thread sleeps between creating
/// the iterator and reading it (see `snapshot_output`).
pub(super) fn iterator_output(
    prog: &libbpf_rs::ProgramMut<'_>,
    settle: Option<Duration>,
) -> Result<Vec<u8>> {
    let link = prog
        .attach_iter_with_opts(libbpf_rs::IterOpts::None)
        .context("failed to attach the task iterator")?;
    let mut iter = Iter::new(&link).context("failed to create the task iterator")?;
    if let Some(settle) = settle {
        std::thread::sleep(settle);
    }
    let mut out = Vec::new();
    iter.read_to_end(&mut out)
        .context("failed to read the task iterator")?;
    Ok(out)
}

/// Loads `open` on a thread of its own (the verifier takes about as long as
/// the unwind tables take to prepare, and the two can use two CPUs) while
/// `meanwhile` runs on this one. Returns the loaded program, how long its
/// load took and how long `meanwhile` took.
pub(super) fn load_while<'obj>(
    open: crate::bpf::OpenOffcputimeSkel<'obj>,
    logs: VerifierLogs,
    stats: bool,
    meanwhile: impl FnOnce(),
) -> Result<(OffcputimeSkel<'obj>, (Duration, Duration))> {
    let load = move || Ok((open, logs));
    let (mut loaded, prepared) = load_side_by_side(
        vec![Box::new(load)],
        stats,
        Meanwhile::Once(Box::new(meanwhile)),
    )?;
    let (skel, took) = loaded.pop().expect("one object loaded");
    Ok((skel, (took, prepared)))
}

/// What a loading thread does before the load: opens an object, chooses
/// its programs, and gives it its verifier logs. (Moved to the thread in
/// a [`SendOpen`]: it holds an open object, or the room for one and
/// shared references to what it is opened with.)
pub(super) type Opener<'a, 'obj> =
    Box<dyn FnOnce() -> Result<(crate::bpf::OpenOffcputimeSkel<'obj>, VerifierLogs)> + 'a>;

/// What the calling thread does while objects load (see
/// [`load_side_by_side`]).
pub(super) enum Meanwhile<'m> {
    /// Runs once; the helper threads it starts are lowered below the
    /// loading threads until the loads are over (the start: the unwind
    /// tables prepared beside the verifier).
    Once(Box<dyn FnOnce() + 'm>),
    /// Runs again and again until every object is loaded (a load while
    /// tracing: the rings read meanwhile).
    Until(&'m mut dyn FnMut()),
}

/// Opens and loads each object of `openers` on a thread of its own, side
/// by side, while `meanwhile` runs on this one. Returns the loaded
/// objects with how long each took to open and load, in order, and how
/// long `meanwhile` took; or the first error, in order.
pub(super) fn load_side_by_side<'a, 'obj>(
    openers: Vec<Opener<'a, 'obj>>,
    stats: bool,
    meanwhile: Meanwhile<'_>,
) -> Result<(Vec<(OffcputimeSkel<'obj>, Duration)>, Duration)> {
    std::thread::scope(|s| {
        let mut loaders = Vec::new();
        for open in openers {
            let open = SendOpen(open);
            let loader = std::thread::Builder::new()
                .name("bpf-load".into())
                .spawn_scoped(s, move || {
                    // The whole wrapper moves, not just its field.
                    let open = open;
                    crate::priority::join_raise();
                    let began = Instant::now();
                    let loaded = (open.0)().and_then(|(open, logs)| load(open, &logs, stats));
                    SendOpen((loaded, began.elapsed()))
                });
            match loader {
                Ok(l) => loaders.push(l),
                Err(e) => return Err(anyhow!(e).context("failed to start a loading thread")),
            }
        }
        let began = Instant::now();
        let lowers = matches!(meanwhile, Meanwhile::Once(_));
        if lowers {
            crate::priority::loading(true);
        }
        match meanwhile {
            Meanwhile::Once(work) => work(),
            Meanwhile::Until(work) => {
                while !loaders.iter().all(|l| l.is_finished()) {
                    work();
                }
            }
        }
        let prepared = began.elapsed();
        let joined: Vec<_> = loaders.into_iter().map(|l| l.join()).collect();
        if lowers {
            crate::priority::loading(false);
        }
        let mut loaded = Vec::new();
        for j in joined {
            let (skel, took) = match j {
                Ok(SendOpen(l)) => l,
                Err(p) => std::panic::resume_unwind(p),
            };
            loaded.push((skel?, took));
        }
        Ok((loaded, prepared))
    })
}

/// [`load`] on a thread of its own, `meanwhile` called on this one again
/// and again until it is done (the load made `stall` longer: a test's).
fn load_beside<'obj>(
    open: crate::bpf::OpenOffcputimeSkel<'obj>,
    logs: VerifierLogs,
    (stats, stall): (bool, Option<Duration>),
    meanwhile: &mut dyn FnMut(),
) -> Result<OffcputimeSkel<'obj>> {
    let opener: Opener<'_, 'obj> = Box::new(move || {
        if let Some(stall) = stall {
            std::thread::sleep(stall);
        }
        Ok((open, logs))
    });
    let (mut loaded, _) = load_side_by_side(vec![opener], stats, Meanwhile::Until(meanwhile))?;
    Ok(loaded.pop().expect("one object loaded").0)
}

/// Loads `open`, whose programs were given `logs`: their statistics said
/// if `stats`, and a refusal said as the verifier gave it.
fn load<'obj>(
    open: crate::bpf::OpenOffcputimeSkel<'obj>,
    logs: &VerifierLogs,
    stats: bool,
) -> Result<OffcputimeSkel<'obj>> {
    let loaded = open.load();
    if stats {
        logs.print_statistics();
    }
    loaded.map_err(|e| match logs.refusal() {
        Some(why) => anyhow!(e).context(why),
        None => anyhow!(e),
    })
}

/// A map another object loads on: its name and a descriptor of its own.
pub(super) type SharedMap = (std::ffi::OsString, std::os::fd::OwnedFd);

/// The maps `object` created (prepared or loaded), by name, each with a
/// descriptor of its own, for other objects to load on (see
/// [`open_on_maps`]).
pub(super) fn created_maps(
    object: &impl libbpf_rs::AsRawLibbpf<LibbpfType = libbpf_rs::libbpf_sys::bpf_object>,
) -> Result<Vec<SharedMap>> {
    use libbpf_rs::libbpf_sys as sys;
    use std::os::fd::BorrowedFd;
    let obj = object.as_libbpf_object().as_ptr();
    let mut shared = Vec::new();
    // SAFETY: `obj` is a live libbpf object; its maps, their names and
    // descriptors stay valid while it does, and each descriptor is
    // duplicated before the borrow ends.
    unsafe {
        let mut map = sys::bpf_object__next_map(obj, std::ptr::null());
        while !map.is_null() {
            let fd = sys::bpf_map__fd(map);
            // Those not created hold a placeholder descriptor (libbpf's).
            if sys::bpf_map__autocreate(map) && fd >= 0 {
                let name = std::ffi::CStr::from_ptr(sys::bpf_map__name(map));
                let name: &std::ffi::OsStr =
                    std::os::unix::ffi::OsStrExt::from_bytes(name.to_bytes());
                let owned = BorrowedFd::borrow_raw(fd)
                    .try_clone_to_owned()
                    .context("failed to share a map")?;
                shared.push((name.to_owned(), owned));
            }
            map = sys::bpf_object__next_map(obj, map);
        }
    }
    Ok(shared)
}

/// Opens the BPF object in `object` for the programs of `part` that `plan`
/// loads, on the maps of another object (`maps`, from [`created_maps`]):
/// each map it has there is reused, and it creates none. Its `.rodata` is
/// the other's too (frozen, as the verifier reads it), and its global
/// variables; but only the object that created them maps them in memory
/// (read and write them there).
pub(super) fn open_on_maps<'obj>(
    object: &'obj mut MaybeUninit<OpenObject>,
    maps: &[SharedMap],
    plan: &Plan,
    part: Part,
    build: Build,
) -> Result<(crate::bpf::OpenOffcputimeSkel<'obj>, VerifierLogs)> {
    open_on_maps_but(object, maps, plan, part, build, None)
}

/// [`open_on_maps`], but for the `.rodata` of the object's own, a copy of
/// `rodata` (for a build of other settings: the runtimes' builds).
fn open_on_maps_but<'obj>(
    object: &'obj mut MaybeUninit<OpenObject>,
    maps: &[SharedMap],
    plan: &Plan,
    part: Part,
    build: Build,
    rodata: Option<&crate::bpf::types::rodata>,
) -> Result<(crate::bpf::OpenOffcputimeSkel<'obj>, VerifierLogs)> {
    let mut open = open_build(object, build)?;
    for mut map in open.open_object_mut().maps_mut() {
        let own = rodata.is_some() && map.name().to_string_lossy().ends_with(".rodata");
        if own {
            continue;
        }
        match maps.iter().find(|(name, _)| name.as_os_str() == map.name()) {
            Some((name, fd)) => map
                .reuse_fd(std::os::fd::AsFd::as_fd(fd))
                .with_context(|| format!("map {}: could not share it", name.to_string_lossy()))?,
            None => map.set_autocreate(false)?,
        }
    }
    if let Some(rodata) = rodata {
        let own = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
        *own = *rodata;
    }
    let logs = choose_programs(&mut open, plan, Some(part))?;
    Ok((open, logs))
}

/// The processes, threads and cgroups of `-p`, `-t` and `--cgroup`, for
/// the program's filters.
pub(super) fn fill_filters(skel: &OffcputimeSkel<'_>, opts: &TracerOptions) -> Result<()> {
    let one = [1u8];
    for tgid in &opts.tgids {
        skel.maps
            .tgids
            .update(&tgid.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    for tid in &opts.tids {
        skel.maps
            .tids
            .update(&tid.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    for id in &opts.cgroups {
        skel.maps
            .cgroups
            .update(&id.to_ne_bytes(), &one, MapFlags::ANY)?;
    }
    Ok(())
}

/// Where the kernel's ORC tables are (kallsyms), and the modules whose
/// own tables the kernel stack walk reads: the walk is on where they are
/// found (see src/bpf/kstack.h).
fn set_kernel_orc(rodata: &mut crate::bpf::types::rodata) {
    if let Some(orc) = kernel::kernel_orc() {
        rodata.kstack_orc = true;
        rodata.orc_ip_table = orc.ip_table;
        rodata.orc_entry_table = orc.entry_table;
        rodata.orc_entries = orc.entries;
        (rodata.core_text_start, rodata.core_text_end) = orc.text;
        (rodata.sched_text_start, rodata.sched_text_end) = orc.sched_text;
        (rodata.lock_text_start, rodata.lock_text_end) = orc.lock_text;
        (rodata.ret_from_fork_at, rodata.ret_from_fork_asm_at) = orc.ret_from_fork;
        (rodata.ret_trampoline_a, rodata.ret_trampoline_b) = orc.ret_trampolines;
        // As many as the program has room for, the lowest: a
        // frame in any other is taken up by the kernel's walk.
        let room = rodata.korc_module_text.len();
        for (i, &(text, at)) in orc.modules.iter().take(room).enumerate() {
            rodata.korc_module_text[i] = text;
            rodata.korc_module_at[i] = at;
            rodata.korc_modules = i as u32 + 1;
        }
    }
}

/// Which build of the profiler's object (build.rs): the plain one, where
/// the settings of a plain run are constants and the code they turn off
/// is not there to verify, or the general one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Build {
    Plain,
    General,
}

impl Build {
    /// The build that has `rodata`'s settings.
    pub(super) fn of_settings(rodata: &crate::bpf::types::rodata) -> Build {
        match crate::bpf::plain_settings_hold(rodata) {
            true => Build::Plain,
            false => Build::General,
        }
    }

    /// The build for `opts`, with `hook` (None: the snapshot's iterator).
    pub(super) fn for_run(opts: &TracerOptions, hook: Option<Hook>) -> Build {
        // SAFETY: a C struct of integers, bools and arrays of them, all
        // valid as zero bytes.
        let mut probe: crate::bpf::types::rodata = unsafe { std::mem::zeroed() };
        settings(&mut probe, opts);
        if let Some(hook) = hook {
            hook_settings(&mut probe, opts, hook);
        }
        Build::of_settings(&probe)
    }

    /// What `-v` says of it.
    pub(super) fn describe(self) -> String {
        match self {
            // wording: a count never 1
            Build::Plain => format!(
                "BPF object: the plain build ({} settings of a run without --states, --wakers, \
                 --chains, --timeline, --on-cpu, -i or --sample fixed when it was compiled)",
                crate::bpf::PLAIN_SETTINGS
            ),
            Build::General => {
                "BPF object: the general build (every setting read at load, as this run's are \
                 not a plain run's)"
                    .into()
            }
        }
    }
}

/// Opens the profiler's object of `build` in `object`, relocated against
/// the kernel's types for CO-RE where there are some.
pub(super) fn open_build(
    object: &mut MaybeUninit<OpenObject>,
    build: Build,
) -> Result<crate::bpf::OpenOffcputimeSkel<'_>> {
    use libbpf_rs::skel::SkelBuilder;
    let builder = super::core_btf::builder();
    crate::bpf::opening_plain(build == Build::Plain, || builder.open(object))
        .context("failed to open the BPF object")
}

/// The settings that depend on the hook.
pub(super) fn hook_settings(
    rodata: &mut crate::bpf::types::rodata,
    opts: &TracerOptions,
    hook: Hook,
) {
    rodata.stacks_at_switch_in = hook == Hook::FinishTaskSwitch;
    rodata.test_refuse_tp_btf = hook == Hook::TpBtf && opts.test.fail_tp_btf;
}

/// The settings of `opts` in `.rodata`: all but where the kernel's
/// tables and entry points are (which `configure` reads from kallsyms) and
/// those of the hook ([`hook_settings`]).
pub(super) fn settings(rodata: &mut crate::bpf::types::rodata, opts: &TracerOptions) {
    rodata.task_struct_kernel_id = super::core_btf::task_struct_id();
    rodata.pt_regs_kernel_id = super::core_btf::pt_regs_id();
    rodata.filter_by_tgid = !opts.tgids.is_empty();
    rodata.filter_by_tid = !opts.tids.is_empty();
    rodata.filter_by_cgroup = !opts.cgroups.is_empty();
    rodata.user_threads_only = opts.user_threads_only;
    rodata.kernel_threads_only = opts.kernel_threads_only;
    rodata.filter_by_state = opts.state.is_some();
    rodata.state_mask = opts.state.unwrap_or(0);
    rodata.min_block_ns = opts.min_block_ns;
    rodata.max_block_ns = opts.max_block_ns;
    rodata.sample_ns = opts.sample_ns;
    rodata.want_user_stack = opts.user_stacks;
    rodata.want_kernel_stack = opts.kernel_stacks;
    rodata.notify_new_tasks = opts.user_stacks;
    rodata.stack_bytes = opts.max_stack_depth * 8;
    rodata.stack_classes = kernel::hash_maps_grow();
    rodata.unwind_dwarf = opts.unwind == Unwind::Dwarf;
    // For measuring and testing the cache against the walk it saves.
    rodata.ucache_on = !opts.test.no_stack_cache;
    rodata.unwind_by_file = !opts.test.no_file_tables;
    rodata.runtimes_on = opts.runtimes();
    rodata.python_on = opts.python && opts.user_stacks;
    rodata.java_on = opts.java && opts.user_stacks;
    rodata.v8_on = opts.node && opts.user_stacks;
    rodata.want_states = opts.states;
    rodata.want_wakers = opts.wakers;
    rodata.on_cpu_on = opts.on_cpu_hz.is_some();
    rodata.test_drop_switch_in = opts.test.drop_switch_in;
    rodata.test_run_clock_step_ns = u64::from(opts.test.run_clock_step_us) * 1000;
    rodata.test_spill_stacks = opts.test.spill_stacks;
    rodata.test_kstack_check = opts.test.kstack_check;
    rodata.chains_on = opts.chains;
    // --chains alone follows wakers by their threads.
    rodata.waker_user_stacks = !opts.chains || opts.wakers || opts.timeline_min_ns.is_some();
    if opts.chains {
        // -m and -M choose among the records in userspace.
        rodata.min_block_ns = 1;
        rodata.max_block_ns = u64::MAX;
    }
    if let Some(min) = opts.records_min_ns() {
        rodata.timeline_min_ns = min.max(1);
        rodata.timeline_wake_bytes = timeline_ring_bytes(opts) as u64 / 8;
    }
    rodata.trace_duration_ns = opts
        .duration
        .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX).max(1));
    rodata.interval_ns = opts
        .interval
        .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX).max(1));
}

/// The load-time configuration of the program (its `.rodata`) and the
/// sizes of its maps, as `opts` say: shared by the tracer and the
/// snapshot.
pub(super) fn configure(
    open: &mut crate::bpf::OpenOffcputimeSkel<'_>,
    opts: &TracerOptions,
) -> Result<()> {
    {
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
        settings(rodata, opts);
        if opts.kernel_stacks && !opts.test.no_kstack_walk {
            set_kernel_orc(rodata);
        }
        if opts.keeps_wakers() {
            // Unreadable or hidden: userspace tells interrupts by
            // their frames' names alone.
            let entries = crate::ksyms::InterruptEntries::load().unwrap_or_default();
            if entries.irq == (0, 0) {
                eprintln!(
                    "offcputime: where interrupts enter the kernel is not known (kallsyms \
                     hides its addresses without CAP_SYSLOG, or has no x86-64 entry stubs): \
                     a wake-up from an interrupt may be shown as the task it interrupted"
                );
            }
            (rodata.irq_entry_start, rodata.irq_entry_end) = entries.irq;
            (rodata.softirq_start, rodata.softirq_end) = entries.softirq;
        }
    }
    if opts.records_min_ns().is_some() {
        open.maps
            .block_records
            .set_max_entries(timeline_ring_bytes(opts))
            .context("block records ring buffer size")?;
    }
    if opts.unwind == Unwind::Dwarf {
        let cap = opts.unwind_capacity;
        // No more processes than pids (a limit raised while tracing may
        // fill it: counted and said as any full table).
        open.maps
            .unwind_procs
            .set_max_entries(cap.processes.min(kernel::pid_max()))
            .context("unwind processes map size")?;
        open.maps
            .unwind_files
            .set_max_entries(UNWIND_FILES)
            .context("unwind files map size")?;
        open.maps
            .deferred_stacks
            .set_max_entries(
                opts.test
                    .copy_ring_kb
                    .map_or(DEFERRED_RING_BYTES, |kb| kb.saturating_mul(1024)),
            )
            .context("deferred stacks ring buffer size")?;
    }
    if !kernel::hash_maps_grow() {
        // Allocated whole at load (see `hash_maps_grow`).
        let maps = &mut open.maps;
        for map in [
            &mut maps.stacks,
            &mut maps.stacks_short,
            &mut maps.stacks_mid,
            &mut maps.counts,
            &mut maps.counts_plain,
            &mut maps.wakers,
            &mut maps.korc_entries,
            &mut maps.korc_pairs,
            &mut maps.korc_shapes,
            &mut maps.ucache_shapes,
            &mut maps.java_procs,
            &mut maps.node_procs,
            &mut maps.py_procs,
            &mut maps.unwind_procs,
            &mut maps.unwind_files,
            &mut maps.notified_procs,
        ] {
            let flags = map.map_flags() & !libbpf_rs::libbpf_sys::BPF_F_NO_PREALLOC;
            map.set_map_flags(flags).context("hash map flags")?;
        }
    }
    // The stacks by their length where elements are allocated as they
    // are added (STACK_SHORT_DEPTH); else all in `stacks`, the others
    // left a single element. The tables keep their values' sizes whatever
    // --perf-max-stack-depth says: the program reads a stored stack at
    // the size of its table's value (a shorter stack ends with a 0).
    let classes = kernel::hash_maps_grow();
    for map in [&mut open.maps.stacks_short, &mut open.maps.stacks_mid] {
        map.set_max_entries(if classes { opts.stack_storage_size } else { 1 })
            .context("stacks map size")?;
    }
    open.maps
        .stacks
        .set_max_entries(opts.stack_storage_size)
        .context("stacks map size")?;
    // A few per CPU: each CPU's allocator cache runs dry on its own.
    let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
    open.maps
        .stacks_spill
        .set_max_entries(cpus.saturating_mul(4).clamp(256, 4096))
        .context("stacks spill map size")?;
    // The counts in the table the mode keys them in; the other left a
    // single element (see `counts_plain`).
    let (whole, plain) = if opts.counts_whole() {
        (counts_capacity(opts.stack_storage_size), 1)
    } else {
        (1, counts_capacity(opts.stack_storage_size))
    };
    open.maps
        .counts
        .set_max_entries(whole)
        .context("counts map size")?;
    open.maps
        .counts_plain
        .set_max_entries(plain)
        .context("counts map size")?;
    // One slot per distinct waker (task and stacks), at most as many
    // as stacks; a single one without --wakers.
    open.maps
        .wakers
        .set_max_entries(if opts.keeps_wakers() {
            opts.stack_storage_size
        } else {
            1
        })
        .context("wakers map size")?;
    // The shapes of the walks kept to be proved (see `ucache_shapes`):
    // one for each code path threads block under, so no more than the
    // stacks; where they are allocated whole at load, fewer.
    let shapes = opts.stack_storage_size.min(if kernel::hash_maps_grow() {
        SHAPES
    } else {
        PREALLOCATED_SHAPES
    });
    for map in [&mut open.maps.ucache_shapes, &mut open.maps.korc_shapes] {
        map.set_max_entries(shapes)
            .context("proofs' shapes map size")?;
    }
    // A bit for each pid the kernel gives now (see `rt_pids`).
    open.maps
        .rt_pids
        .set_max_entries(kernel::pid_max().div_ceil(64))
        .context("runtimes' pids map size")?;
    open.maps
        .tgids
        .set_max_entries(opts.tgids.len().max(1) as u32)?;
    open.maps
        .tids
        .set_max_entries(opts.tids.len().max(1) as u32)?;
    open.maps
        .cgroups
        .set_max_entries(opts.cgroups.len().max(1) as u32)?;
    Ok(())
}

/// The programs and maps for `hook` (with the legacy programs, or not;
/// `start_user_stacks`: the kernel's user-stack start iterator loads): the
/// maps sized in `open`, which creates them; no program chosen yet (the
/// object loads its part's, the other parts load in objects of their own
/// on its maps: [`open_on_maps`]).
pub(super) fn plan_programs(
    open: &mut crate::bpf::OpenOffcputimeSkel<'_>,
    opts: &TracerOptions,
    hook: Hook,
    start_user_stacks: bool,
    legacy: bool,
    dwarf: bool,
) -> Result<Plan> {
    let flavour = match hook {
        _ if legacy => Flavour::Legacy,
        Hook::TpBtf => Flavour::TaskStorage,
        _ => Flavour::ByTid,
    };
    let trusted = flavour == Flavour::TaskStorage;
    let modern = !legacy;
    // sched_switch passes the state the thread blocked in since 5.18,
    // the kernel that also made the user-stack start iterator load.
    open.maps
        .rodata_data
        .as_deref_mut()
        .ok_or_else(|| anyhow!("BPF object has no .rodata"))?
        .switch_has_prev_state = start_user_stacks && modern && hook != Hook::FinishTaskSwitch;
    let plan = Plan {
        flavour,
        hook: Some(hook),
        start_user_stacks,
        states: opts.states,
        wakers: opts.keeps_wakers(),
        // New processes share their parent's unwind tables from the
        // fork.
        forks: dwarf && modern && opts.user_stacks,
        // -i's iterator, never with the legacy programs (refused in
        // start).
        cut: opts.interval.is_some() && modern,
        // The runtimes' frames of new processes' first blocks (a CPython
        // process's Python frames), walked again once the runtime is
        // known (sleepable, task storage).
        runtime_refresh: opts.runtimes() && trusted && start_user_stacks && modern,
        // Where no runtime's process runs now: their hooks' builds with
        // the runtimes' walkers in the later object, beside the refresh.
        runtimes_later: opts.runtimes()
            && trusted
            && start_user_stacks
            && modern
            && opts.runtimes_running.and(opts.runtime_kinds()) != opts.runtime_kinds(),
        on_cpu: opts.on_cpu_hz.is_some(),
        // The disk of a wake-up from a block I/O completion.
        chains: opts.chains,
    };
    for mut prog in open.open_object_mut().progs_mut() {
        prog.set_autoload(false);
    }
    if trusted {
        // Only task-local storage is used; keep the tid map tiny.
        open.maps.task_data_by_tid.set_max_entries(1)?;
    }
    if trusted || opts.on_cpu_hz.is_none() {
        open.maps.run_by_tid.set_max_entries(1)?;
    }
    if legacy {
        // Before 5.11 tracing programs have no task-local storage,
        // and its map cannot even be created.
        skip_task_storage(open)?;
    }
    Ok(plan)
}

/// Leaves the task-local storage maps out of the load: for programs that
/// do not use them, and kernels that cannot create them (before 5.11).
pub(super) fn skip_task_storage(open: &mut crate::bpf::OpenOffcputimeSkel<'_>) -> Result<()> {
    open.maps
        .task_data_storage
        .set_autocreate(false)
        .context("task storage map")?;
    open.maps
        .ucache_storage
        .set_autocreate(false)
        .context("stack cache map")?;
    open.maps
        .ucache_more
        .set_autocreate(false)
        .context("stack cache map")?;
    open.maps
        .run_storage
        .set_autocreate(false)
        .context("running time map")?;
    open.maps
        .korc_second
        .set_autocreate(false)
        .context("kernel stack cache map")?;
    open.maps
        .ucache_second
        .set_autocreate(false)
        .context("stack cache map")?;
    open.maps
        .py_kept
        .set_autocreate(false)
        .context("Python walk cache map")?;
    Ok(())
}

/// The object of the programs loaded when first needed ([`Part::Later`]):
/// the runtimes' refresh, and where the hooks loaded without the runtimes'
/// walkers ([`Plan::runtimes_later`]), their builds with them.
pub(super) enum Later<'obj> {
    /// None is wanted.
    None,
    /// Not loaded yet: its room, and the runtimes' settings of the
    /// runtimes' builds (those the hooks loaded without).
    Unopened(&'obj mut MaybeUninit<OpenObject>, RuntimeKinds),
    Loaded(Box<OffcputimeSkel<'obj>>),
    /// Its load failed (said by the first caller).
    Failed,
}

impl RuntimeKinds {
    /// The runtimes' walkers of `rodata`.
    pub(super) fn of_build(rodata: &crate::bpf::types::rodata) -> RuntimeKinds {
        RuntimeKinds {
            python: rodata.runtimes_on && rodata.python_on,
            java: rodata.runtimes_on && rodata.java_on,
            node: rodata.runtimes_on && rodata.v8_on,
        }
    }

    /// Leaves the walkers of the runtimes other than `running` out of the
    /// build of `rodata` (all of them where none runs), the hooks then
    /// calling their runtime builds once loaded; returns what those
    /// builds are to have (every runtime's walker that `rodata` had).
    pub(super) fn leave_out(
        rodata: &mut crate::bpf::types::rodata,
        running: RuntimeKinds,
    ) -> RuntimeKinds {
        let all = RuntimeKinds::of_build(rodata);
        let kept = all.and(running);
        rodata.runtimes_on = kept.any();
        rodata.python_on = kept.python;
        rodata.java_on = kept.java;
        rodata.v8_on = kept.node;
        rodata.runtimes_later = true;
        all
    }

    /// The build of `rodata` with these walkers in.
    fn put_in(self, rodata: &mut crate::bpf::types::rodata) {
        rodata.runtimes_on = true;
        rodata.python_on = self.python;
        rodata.java_on = self.java;
        rodata.v8_on = self.node;
        rodata.runtimes_later = false;
        rodata.refresh_at_start = true;
    }
}

impl<'obj> Later<'obj> {
    /// The object, loaded now on the maps of `maps` if it was not; the
    /// runtimes' builds of the hooks it holds put where the hooks call
    /// them (from then on every hook runs its runtime build). The
    /// verifier runs on a thread of its own while `meanwhile` is called
    /// on this one, again and again, until it is done (it is to wait a
    /// little, for news): its hundreds of milliseconds must not leave the
    /// program's rings unread (a ring that fills loses what it would have
    /// held).
    pub(super) fn load(
        &mut self,
        maps: &OffcputimeSkel<'_>,
        plan: &Plan,
        (stats, stall): (bool, Option<Duration>),
        mut meanwhile: impl FnMut(),
    ) -> Result<&OffcputimeSkel<'obj>> {
        if let Later::Unopened(..) = self {
            let Later::Unopened(room, settings) = std::mem::replace(self, Later::Failed) else {
                unreachable!("matched above");
            };
            let shared = created_maps(libbpf_rs::skel::Skel::object(maps))?;
            let hooks_rodata = maps
                .maps
                .rodata_data
                .ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
            // The hooks' build: the runtimes' settings are variables of
            // both.
            let build = Build::of_settings(hooks_rodata);
            let (open, logs) = if plan.runtimes_later {
                let mut rodata = *hooks_rodata;
                settings.put_in(&mut rodata);
                open_on_maps_but(room, &shared, plan, Part::Later, build, Some(&rodata))?
            } else {
                open_on_maps(room, &shared, plan, Part::Later, build)?
            };
            let skel = load_beside(open, logs, (stats, stall), &mut meanwhile)
                .context("failed to load the runtimes' walkers and refresh program")?;
            if plan.runtimes_later {
                put_runtime_builds(maps, &skel, plan)?;
            }
            *self = Later::Loaded(Box::new(skel));
        }
        match self {
            Later::Loaded(skel) => Ok(skel),
            Later::None => bail!("no program is loaded later"),
            _ => bail!("the runtimes' walkers and refresh program could not be loaded"),
        }
    }

    /// Whether the object is loaded (the runtimes' builds in use).
    pub(super) fn loaded(&self) -> bool {
        matches!(self, Later::Loaded(_))
    }
}

/// Puts the runtime build of each hook `plan` loads in `later` into the
/// array the hook calls it through, in `maps`.
fn put_runtime_builds(
    maps: &OffcputimeSkel<'_>,
    later: &OffcputimeSkel<'_>,
    plan: &Plan,
) -> Result<()> {
    use std::os::fd::{AsFd, AsRawFd};
    // The switch hook last: by then the others walk as it will.
    for role in [Role::Fork, Role::Waking, Role::OnCpu, Role::Switch] {
        let Some(p) = plan.program(role) else {
            continue;
        };
        let array = match role {
            Role::Fork => &maps.maps.rt_build_fork,
            Role::Waking => &maps.maps.rt_build_waking,
            Role::OnCpu => &maps.maps.rt_build_on_cpu,
            _ => &maps.maps.rt_build_switch,
        };
        let prog = program_of(later, p)?;
        let fd = prog.as_fd().as_raw_fd() as u32;
        array
            .update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("failed to put the runtimes' build of {} in place", p.name))?;
    }
    Ok(())
}

/// The size of `--timeline`'s ring buffer (a test may shrink it).
fn timeline_ring_bytes(opts: &TracerOptions) -> u32 {
    opts.test.timeline_ring_kb.map_or(
        // --chains: every block, four times the room.
        if opts.chains {
            4 * TIMELINE_RING_BYTES
        } else {
            TIMELINE_RING_BYTES
        },
        |kb| kb.saturating_mul(1024),
    )
}
