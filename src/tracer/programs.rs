//! The BPF object's programs in one table: what each is for (its role) and
//! which build of the program it belongs to (its flavour, and for the
//! switch hooks the hook; for the iterators whether they read user
//! stacks). Which programs load, which one a role attaches or runs, and
//! which print the verifier's statistics all come from it.

use anyhow::{anyhow, Result};

use super::Hook;

/// Which of the program's builds is loaded: with task-local storage
/// (`tp_btf` where the kernel has it), with the per-thread hash map
/// (`raw_tp`, the kprobe), or the programs for kernels without `bpf_loop`
/// (before 5.17: hash map, frame pointers, no atomic claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    TaskStorage,
    ByTid,
    Legacy,
}

/// What a program is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The context-switch hook.
    Switch,
    /// `--states`: the wake-up, where a block becomes a wait for a CPU.
    Wakeup,
    /// `--wakers`: the waker's stacks.
    Waking,
    /// New processes share their parent's unwind tables from the fork.
    Fork,
    /// The start iterator: blocks under way when tracing starts.
    Start,
    /// The end iterator: blocks under way when tracing ends.
    End,
    /// Run just before the kprobe's end iterator that reads user stacks:
    /// the kernel stacks of the blocks it takes (see
    /// [`Plan::end_user_stacks`]).
    EndKernelStacks,
    /// `-i`: blocks under way at an interval's end.
    Cut,
    /// `--snapshot`'s iterator.
    Snapshot,
    /// The runtimes' frames of new processes' first blocks (Python's of
    /// new CPython processes), walked again once their runtime is known.
    RuntimeRefresh,
    /// `--on-cpu`'s sampler, on a cpu-clock perf event.
    OnCpu,
    /// `--chains`: block I/O completions, which name the disk of a
    /// wake-up from one.
    DiskDone,
}

/// Which of a start's objects a program is loaded in. One start opens the
/// BPF object several times, all on the maps of one of them, which loads
/// no program: the hooks' object and the iterators' load side by side on
/// two threads (the verifier works on one program at a time), and the
/// programs needed only once some process is seen load when it is (see
/// `load::Objects`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Attached before the window opens: the switch hook and the hooks
    /// beside it.
    Hooks,
    /// Run at the window's start, at cuts and at the end.
    Iterators,
    /// Loaded when first needed, after the window has opened: the
    /// runtimes' refresh, when a runtime's process is first noted.
    Later,
}

impl Role {
    /// Whether the role's program has a runtime build: a hook that walks
    /// user stacks with the runtimes' walkers, which loads in the
    /// [`Part::Later`] object where the hooks load without them
    /// ([`Plan::runtimes_later`]).
    pub fn has_runtime_build(self) -> bool {
        matches!(self, Role::Switch | Role::Waking | Role::Fork | Role::OnCpu)
    }

    /// The object the role's program is loaded in.
    pub fn part(self) -> Part {
        match self {
            // The end iterator beside the switch hook: the start
            // iterator takes about as long to verify as the two together,
            // and the two objects load side by side.
            Role::Switch
            | Role::Wakeup
            | Role::Waking
            | Role::Fork
            | Role::OnCpu
            | Role::DiskDone
            | Role::End => Part::Hooks,
            Role::Start | Role::EndKernelStacks | Role::Cut | Role::Snapshot => Part::Iterators,
            Role::RuntimeRefresh => Part::Later,
        }
    }
}

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A BTF tracepoint, by its section.
    TpBtf,
    /// A raw tracepoint of this name.
    RawTp(&'static str),
    /// The `finish_task_switch` kprobe, at the symbol kallsyms names.
    Kprobe,
    /// A task iterator, run when needed.
    Iterator,
    /// A perf event's overflow handler.
    PerfEvent,
}

/// One program of the object.
#[derive(Debug)]
pub struct Program {
    pub name: &'static str,
    pub role: Role,
    /// The builds it serves.
    pub flavours: &'static [Flavour],
    /// For [`Role::Switch`]: the hook it is.
    pub hook: Option<Hook>,
    /// For the iterators: the sleepable one, which reads other tasks' user
    /// stacks (5.18).
    pub user_stacks: bool,
    pub attach: Attach,
}

use Flavour::{ByTid, Legacy, TaskStorage};

const fn program(
    name: &'static str,
    role: Role,
    flavours: &'static [Flavour],
    hook: Option<Hook>,
    user_stacks: bool,
    attach: Attach,
) -> Program {
    Program {
        name,
        role,
        flavours,
        hook,
        user_stacks,
        attach,
    }
}

/// Every program of `src/bpf/offcputime.bpf.c`: name, role, the builds it
/// serves, its hook, whether it reads user stacks, how it is attached.
#[rustfmt::skip]
pub const PROGRAMS: &[Program] = &[
    program("sched_switch_btf", Role::Switch, &[TaskStorage], Some(Hook::TpBtf), false, Attach::TpBtf),
    program("sched_switch_raw", Role::Switch, &[ByTid], Some(Hook::RawTp), false, Attach::RawTp("sched_switch")),
    program("finish_task_switch_kprobe", Role::Switch, &[ByTid], Some(Hook::FinishTaskSwitch), false, Attach::Kprobe),
    program("sched_switch_btf_legacy", Role::Switch, &[Legacy], Some(Hook::TpBtf), false, Attach::TpBtf),
    program("sched_switch_raw_legacy", Role::Switch, &[Legacy], Some(Hook::RawTp), false, Attach::RawTp("sched_switch")),
    program("finish_task_switch_legacy", Role::Switch, &[Legacy], Some(Hook::FinishTaskSwitch), false, Attach::Kprobe),
    program("sched_wakeup_btf", Role::Wakeup, &[TaskStorage], None, false, Attach::TpBtf),
    program("sched_wakeup_raw", Role::Wakeup, &[ByTid, Legacy], None, false, Attach::RawTp("sched_wakeup")),
    program("sched_waking_btf", Role::Waking, &[TaskStorage], None, false, Attach::TpBtf),
    program("sched_waking_raw", Role::Waking, &[ByTid], None, false, Attach::RawTp("sched_waking")),
    program("sched_waking_legacy", Role::Waking, &[Legacy], None, false, Attach::RawTp("sched_waking")),
    program("process_fork_btf", Role::Fork, &[TaskStorage], None, false, Attach::TpBtf),
    program("process_fork_raw", Role::Fork, &[ByTid], None, false, Attach::RawTp("sched_process_fork")),
    program("start_blocked", Role::Start, &[TaskStorage], None, false, Attach::Iterator),
    program("start_blocked_by_tid", Role::Start, &[ByTid], None, false, Attach::Iterator),
    program("start_blocked_user", Role::Start, &[TaskStorage], None, true, Attach::Iterator),
    program("start_blocked_user_by_tid", Role::Start, &[ByTid], None, true, Attach::Iterator),
    program("start_blocked_legacy", Role::Start, &[Legacy], None, false, Attach::Iterator),
    program("flush_in_progress", Role::End, &[TaskStorage], None, false, Attach::Iterator),
    program("flush_in_progress_by_tid", Role::End, &[ByTid], None, false, Attach::Iterator),
    program("flush_in_progress_user_by_tid", Role::End, &[ByTid], None, true, Attach::Iterator),
    program("flush_in_progress_legacy", Role::End, &[Legacy], None, false, Attach::Iterator),
    program("end_kernel_stacks_by_tid", Role::EndKernelStacks, &[ByTid], None, false, Attach::Iterator),
    program("cut_interval", Role::Cut, &[TaskStorage], None, false, Attach::Iterator),
    program("cut_interval_by_tid", Role::Cut, &[ByTid], None, false, Attach::Iterator),
    program("snapshot_tasks", Role::Snapshot, &[TaskStorage, ByTid, Legacy], None, false, Attach::Iterator),
    program("snapshot_tasks_user", Role::Snapshot, &[TaskStorage, ByTid, Legacy], None, true, Attach::Iterator),
    program("runtime_refresh", Role::RuntimeRefresh, &[TaskStorage], None, true, Attach::Iterator),
    program("on_cpu", Role::OnCpu, &[TaskStorage, ByTid], None, false, Attach::PerfEvent),
    program("on_cpu_legacy", Role::OnCpu, &[Legacy], None, false, Attach::PerfEvent),
    program("block_rq_complete", Role::DiskDone, &[TaskStorage, ByTid, Legacy], None, false, Attach::RawTp("block_rq_complete")),
];

/// The table's entry of a program of the object.
pub fn named(name: &str) -> Result<&'static Program> {
    PROGRAMS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| anyhow!("the BPF object's program {name} is not in the program table"))
}

/// What one run of the profiler loads: a build, a hook, and the roles its
/// options want.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub flavour: Flavour,
    /// The switch hook; `None` for `--snapshot`, which attaches none.
    pub hook: Option<Hook>,
    /// The start iterator (and `--snapshot`'s) reads user stacks.
    pub start_user_stacks: bool,
    pub states: bool,
    pub wakers: bool,
    pub forks: bool,
    pub cut: bool,
    pub runtime_refresh: bool,
    /// The hooks load without the runtimes' walkers, and their runtime
    /// builds load in the [`Part::Later`] object when the first process of
    /// a runtime is noted (no such process ran at the start).
    pub runtimes_later: bool,
    pub on_cpu: bool,
    /// `--chains`.
    pub chains: bool,
}

impl Plan {
    /// The plan of `--snapshot`: its iterator alone.
    pub fn snapshot(user_stacks: bool) -> Plan {
        Plan {
            flavour: ByTid,
            hook: None,
            start_user_stacks: user_stacks,
            states: false,
            wakers: false,
            forks: false,
            cut: false,
            runtime_refresh: false,
            runtimes_later: false,
            on_cpu: false,
            chains: false,
        }
    }

    /// Whether `p` loads in the object of `part`: its role's, or the
    /// [`Part::Later`] object for a hook's runtime build.
    pub fn loads_in(&self, p: &Program, part: Part) -> bool {
        self.loads(p)
            && (p.role.part() == part
                || (part == Part::Later && self.runtimes_later && p.role.has_runtime_build()))
    }

    /// Whether the end iterator is the sleepable one that reads user
    /// stacks: the kprobe hook takes a block's stacks at its switch-in, so
    /// the blocks under way at the end have none until the end iterator
    /// takes them, and their user stacks can be read where the start
    /// iterator's can.
    pub fn end_user_stacks(&self) -> bool {
        self.hook == Some(Hook::FinishTaskSwitch) && self.flavour == ByTid && self.start_user_stacks
    }

    fn wants(&self, role: Role) -> bool {
        let tracing = self.hook.is_some();
        match role {
            Role::Switch | Role::Start | Role::End => tracing,
            Role::EndKernelStacks => tracing && self.end_user_stacks(),
            Role::Wakeup => tracing && self.states,
            Role::Waking => tracing && self.wakers,
            Role::Fork => tracing && self.forks,
            Role::Cut => tracing && self.cut,
            Role::RuntimeRefresh => tracing && self.runtime_refresh,
            Role::OnCpu => tracing && self.on_cpu,
            Role::DiskDone => tracing && self.chains,
            Role::Snapshot => !tracing,
        }
    }

    /// Whether `p` is loaded.
    pub fn loads(&self, p: &Program) -> bool {
        if !self.wants(p.role) {
            return false;
        }
        if p.role == Role::Snapshot {
            return p.user_stacks == self.start_user_stacks;
        }
        if !p.flavours.contains(&self.flavour) {
            return false;
        }
        match p.role {
            Role::Switch => p.hook == self.hook,
            Role::Start => p.user_stacks == (self.start_user_stacks && self.flavour != Legacy),
            Role::End => p.user_stacks == self.end_user_stacks(),
            _ => true,
        }
    }

    /// The program loaded for `role`, if the plan wants it.
    pub fn program(&self, role: Role) -> Option<&'static Program> {
        PROGRAMS.iter().find(|p| p.role == role && self.loads(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOOKS: [Hook; 3] = [Hook::TpBtf, Hook::RawTp, Hook::FinishTaskSwitch];
    const ROLES: [Role; 12] = [
        Role::Switch,
        Role::Wakeup,
        Role::Waking,
        Role::Fork,
        Role::Start,
        Role::End,
        Role::EndKernelStacks,
        Role::Cut,
        Role::Snapshot,
        Role::RuntimeRefresh,
        Role::OnCpu,
        Role::DiskDone,
    ];

    /// Every plan the tracer can make: a build per hook (task storage on
    /// `tp_btf` alone), every option on and off.
    fn tracing_plans() -> Vec<Plan> {
        let mut plans = Vec::new();
        for hook in HOOKS {
            for legacy in [false, true] {
                let flavour = match hook {
                    _ if legacy => Legacy,
                    Hook::TpBtf => TaskStorage,
                    _ => ByTid,
                };
                for bits in 0..512u32 {
                    let bit = |i: u32| bits & (1 << i) != 0;
                    // As the tracer makes them: no sleepable iterators,
                    // forks, -i or Python refresh in the legacy build;
                    // the refresh with task storage and user stacks.
                    let user = bit(0) && !legacy;
                    let refresh = bit(5) && user && flavour == TaskStorage;
                    plans.push(Plan {
                        flavour,
                        hook: Some(hook),
                        start_user_stacks: user,
                        states: bit(1),
                        wakers: bit(2),
                        forks: bit(3) && !legacy,
                        cut: bit(4) && !legacy,
                        runtime_refresh: refresh,
                        runtimes_later: bit(7) && refresh,
                        on_cpu: bit(6),
                        chains: bit(8),
                    });
                }
            }
        }
        plans
    }

    /// Each role a plan wants has exactly one program, and no program of
    /// another role is loaded.
    #[test]
    fn one_program_per_role() {
        let mut plans = tracing_plans();
        plans.extend([Plan::snapshot(false), Plan::snapshot(true)]);
        for plan in plans {
            for role in ROLES {
                let n = PROGRAMS
                    .iter()
                    .filter(|p| p.role == role && plan.loads(p))
                    .count();
                assert_eq!(n, usize::from(plan.wants(role)), "{plan:?} {role:?}");
            }
        }
    }

    /// Each program loads in one object, but for the hooks' runtime
    /// builds: with `runtimes_later`, each hook the plan loads that walks
    /// user stacks loads again in the later object, beside the refresh,
    /// and nothing else does.
    #[test]
    fn runtime_builds_load_later_beside_their_hooks() {
        const PARTS: [Part; 3] = [Part::Hooks, Part::Iterators, Part::Later];
        for plan in tracing_plans() {
            for p in PROGRAMS {
                let objects: Vec<Part> = PARTS
                    .into_iter()
                    .filter(|&part| plan.loads_in(p, part))
                    .collect();
                let want = if !plan.loads(p) {
                    vec![]
                } else if plan.runtimes_later && p.role.has_runtime_build() {
                    vec![p.role.part(), Part::Later]
                } else {
                    vec![p.role.part()]
                };
                assert_eq!(objects, want, "{} in {plan:?}", p.name);
            }
            if plan.runtimes_later {
                let later: Vec<&str> = PROGRAMS
                    .iter()
                    .filter(|p| plan.loads_in(p, Part::Later))
                    .map(|p| p.name)
                    .collect();
                assert!(later.contains(&"sched_switch_btf"), "{later:?}");
                assert!(later.contains(&"runtime_refresh"), "{later:?}");
            }
        }
    }

    /// What the tracer loaded before the table, written out case by case:
    /// the table gives the same programs for every plan.
    #[test]
    fn the_table_loads_what_the_tracer_loaded() {
        for plan in tracing_plans() {
            let hook = plan.hook.unwrap();
            let legacy = plan.flavour == Legacy;
            let modern = !legacy;
            let trusted = plan.flavour == TaskStorage;
            let by_tid = plan.flavour == ByTid;
            let user = plan.start_user_stacks;
            let end_user = hook == Hook::FinishTaskSwitch && by_tid && user;
            let before = |name: &str| -> bool {
                match name {
                    "sched_switch_btf" => hook == Hook::TpBtf && modern,
                    "sched_switch_raw" => hook == Hook::RawTp && modern,
                    "finish_task_switch_kprobe" => hook == Hook::FinishTaskSwitch && modern,
                    "sched_switch_btf_legacy" => hook == Hook::TpBtf && legacy,
                    "sched_switch_raw_legacy" => hook == Hook::RawTp && legacy,
                    "finish_task_switch_legacy" => hook == Hook::FinishTaskSwitch && legacy,
                    "sched_wakeup_btf" => plan.states && trusted,
                    "sched_wakeup_raw" => plan.states && !trusted,
                    "sched_waking_btf" => plan.wakers && trusted,
                    "sched_waking_raw" => plan.wakers && !trusted && modern,
                    "sched_waking_legacy" => plan.wakers && legacy,
                    "process_fork_btf" => plan.forks && trusted,
                    "process_fork_raw" => plan.forks && !trusted,
                    "flush_in_progress" => trusted,
                    "flush_in_progress_by_tid" => by_tid && !end_user,
                    "flush_in_progress_user_by_tid" => end_user,
                    "flush_in_progress_legacy" => legacy,
                    "end_kernel_stacks_by_tid" => end_user,
                    "start_blocked" => trusted && !user,
                    "start_blocked_by_tid" => by_tid && !user,
                    "start_blocked_user" => trusted && user,
                    "start_blocked_user_by_tid" => by_tid && user,
                    "start_blocked_legacy" => legacy,
                    "cut_interval" => plan.cut && trusted,
                    "cut_interval_by_tid" => plan.cut && !trusted,
                    "snapshot_tasks" | "snapshot_tasks_user" => false,
                    "runtime_refresh" => plan.runtime_refresh,
                    "on_cpu" => plan.on_cpu && modern,
                    "on_cpu_legacy" => plan.on_cpu && legacy,
                    "block_rq_complete" => plan.chains,
                    other => panic!("no rule for {other}"),
                }
            };
            for p in PROGRAMS {
                assert_eq!(plan.loads(p), before(p.name), "{} in {plan:?}", p.name);
            }
        }
        for user in [false, true] {
            let plan = Plan::snapshot(user);
            let loaded: Vec<&str> = PROGRAMS
                .iter()
                .filter(|p| plan.loads(p))
                .map(|p| p.name)
                .collect();
            let want = if user {
                "snapshot_tasks_user"
            } else {
                "snapshot_tasks"
            };
            assert_eq!(loaded, [want]);
        }
    }

    /// The table names every program of the BPF object, and nothing else.
    #[test]
    fn the_table_is_the_objects_programs() {
        use libbpf_rs::skel::SkelBuilder;
        let mut object = std::mem::MaybeUninit::uninit();
        let open = crate::bpf::OffcputimeSkelBuilder::default()
            .open(&mut object)
            .expect("open the BPF object (no privileges needed)");
        use libbpf_rs::skel::OpenSkel;
        let mut names: Vec<String> = open
            .open_object()
            .progs()
            .map(|p| p.name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut table: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        table.sort();
        assert_eq!(names, table);
    }
}
