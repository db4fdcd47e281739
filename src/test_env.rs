//! The environment variables that tests and benchmarks set to put the
//! profiler in a situation on demand (a loaded machine's delays, an older
//! kernel's programs, a switch the kernel did not report) or to measure one
//! part without another. They are read once, at start, into [`TestEnv`],
//! which is passed down to where each one acts: nothing below reads the
//! environment.

use std::time::Duration;

/// What the environment asked for; the default is a normal run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestEnv {
    /// `OFFCPUTIME_TEST_LEGACY`: the programs for kernels without
    /// `bpf_loop` (before 5.17), on any kernel.
    pub legacy: bool,
    /// `OFFCPUTIME_TEST_FAIL_TP_BTF`: the verifier refuses the tp_btf
    /// hook's program, as on a kernel whose BTF it cannot use.
    pub fail_tp_btf: bool,
    /// `OFFCPUTIME_TEST_NO_START_USER_STACKS`: as on a kernel whose
    /// iterators cannot read another task's user memory (before 5.18).
    pub no_start_user_stacks: bool,
    /// `OFFCPUTIME_TEST_DROP_SWITCH_IN=N`: about one switch-in in N of a
    /// thread traced is left unhandled by the hook, as the kernel leaves
    /// some unreported.
    pub drop_switch_in: u32,
    /// `OFFCPUTIME_TEST_RUN_CLOCK_STEP_US=N`: each new reading of a
    /// thread's run time (by which a switch-in the tracepoint did not
    /// report is dated) falls 0, N or 2N us short of the last, as a tick
    /// between two readings moves the kernel's count of it.
    pub run_clock_step_us: u32,
    /// `OFFCPUTIME_TEST_SPILL_STACKS`: the stacks table refuses every
    /// stack for want of memory, as its allocator does at moments: all
    /// go to its spill table.
    pub spill_stacks: bool,
    /// `OFFCPUTIME_TEST_RUNTIMES_AT_START=1|0|NAMES`: the hooks load with
    /// every runtime's walker (1), or without them and their builds with
    /// them when the first runtime's process is noted (0), or with those
    /// of the runtimes named (`python,java`) and the build with every one
    /// when a process of another is noted, whatever runs.
    pub runtimes_at_start: Option<String>,
    /// `OFFCPUTIME_TEST_STALL_BEFORE_ATTACH_MS`: the processes' tables
    /// installed and the hooks not attached yet for this long (a loaded
    /// machine's load), said as it begins.
    pub stall_before_attach: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_BEFORE_WINDOW_MS`: the hook attached and the
    /// window not open yet for this long (a loaded machine's start-up).
    pub stall_before_window: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_AFTER_ATTACH_MS`: the attaching thread held
    /// up after the window opened.
    pub stall_after_attach: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS`: `-i`, an interval's end
    /// passed and its blocks under way not cut yet for this long.
    pub stall_before_cut: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_COPY_WALK_MS`: copied user stacks wait this
    /// long for their walk (as a large new program's tables would).
    pub stall_copy_walk: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_LATER_LOAD_MS`: the runtimes' walkers loaded
    /// while tracing take this much longer to load (as the verifier does
    /// on a loaded machine).
    pub stall_later_load: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS`: from this long after the
    /// window opened, the event loop reads none of the program's news
    /// until the trace stops (as where it gets no CPU for that long).
    pub stall_news_after: Option<Duration>,
    /// `OFFCPUTIME_TEST_STALL_IN_WRITE_MS`: a pause once a report file is
    /// written and before it is put in place (to kill the profiler there).
    pub stall_in_write: Option<Duration>,
    /// `OFFCPUTIME_TEST_PYTHON_GATE`: a file whose presence holds up the
    /// reading of Python interpreters' states.
    pub python_gate: Option<std::path::PathBuf>,
    /// `OFFCPUTIME_NO_STACK_CACHE`: every user stack walked, none proved
    /// unchanged (to measure the cache against the walk it saves).
    pub no_stack_cache: bool,
    /// `OFFCPUTIME_NO_FILE_TABLES`: no walks through the tables of the
    /// files a process maps before its own are ready.
    pub no_file_tables: bool,
    /// `OFFCPUTIME_TEST_KSTACK_CHECK`: each kernel stack of a thread not
    /// running that is walked with the ORC tables is compared with the
    /// kernel's own walk, and differences counted.
    pub kstack_check: bool,
    /// `OFFCPUTIME_TEST_NO_KSTACK_WALK`: kernel stacks of threads not
    /// running from the kernel's helper alone, as before the ORC walk.
    pub no_kstack_walk: bool,
    /// `OFFCPUTIME_TEST_KALLSYMS`: kernel frames named from
    /// `/proc/kallsyms`, as on kernels that cannot name them for BPF
    /// (before 5.14).
    pub kallsyms_names: bool,
    /// `OFFCPUTIME_VERIFIER_STATS`: the verifier's statistics of every
    /// program loaded, on stderr.
    pub verifier_stats: bool,
    /// `OFFCPUTIME_TEST_TIMELINE_RING_KB`: `--timeline`'s ring buffer this
    /// small (a power of two, at least 4), so that a short storm fills it.
    pub timeline_ring_kb: Option<u32>,
    /// `OFFCPUTIME_TEST_COPY_RING_KB`: the ring of copied user stacks this
    /// small (a power of two, at least 4), so that a short burst fills it.
    pub copy_ring_kb: Option<u32>,
    /// `OFFCPUTIME_STATS_INTERVAL`: seconds between the statistics lines
    /// of `--stats`.
    pub stats_interval: Option<Duration>,
}

impl TestEnv {
    /// From the process's environment.
    pub fn from_env() -> TestEnv {
        TestEnv::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// From `var`, which gives a variable's value (None: unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> TestEnv {
        let set = |name: &str| var(name).is_some();
        let number = |name: &str| var(name).and_then(|v| v.trim().parse::<u64>().ok());
        let ms = |name: &str| number(name).map(Duration::from_millis);
        TestEnv {
            legacy: set("OFFCPUTIME_TEST_LEGACY"),
            fail_tp_btf: set("OFFCPUTIME_TEST_FAIL_TP_BTF"),
            no_start_user_stacks: set("OFFCPUTIME_TEST_NO_START_USER_STACKS"),
            drop_switch_in: number("OFFCPUTIME_TEST_DROP_SWITCH_IN")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            run_clock_step_us: number("OFFCPUTIME_TEST_RUN_CLOCK_STEP_US")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            spill_stacks: set("OFFCPUTIME_TEST_SPILL_STACKS"),
            runtimes_at_start: var("OFFCPUTIME_TEST_RUNTIMES_AT_START")
                .map(|v| v.trim().to_string()),
            stall_before_attach: ms("OFFCPUTIME_TEST_STALL_BEFORE_ATTACH_MS"),
            stall_before_window: ms("OFFCPUTIME_TEST_STALL_BEFORE_WINDOW_MS"),
            stall_after_attach: ms("OFFCPUTIME_TEST_STALL_AFTER_ATTACH_MS"),
            stall_before_cut: ms("OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS"),
            stall_copy_walk: ms("OFFCPUTIME_TEST_STALL_COPY_WALK_MS"),
            stall_later_load: ms("OFFCPUTIME_TEST_STALL_LATER_LOAD_MS"),
            stall_news_after: ms("OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS"),
            stall_in_write: ms("OFFCPUTIME_TEST_STALL_IN_WRITE_MS"),
            python_gate: var("OFFCPUTIME_TEST_PYTHON_GATE").map(Into::into),
            no_stack_cache: set("OFFCPUTIME_NO_STACK_CACHE"),
            no_file_tables: set("OFFCPUTIME_NO_FILE_TABLES"),
            kstack_check: set("OFFCPUTIME_TEST_KSTACK_CHECK"),
            no_kstack_walk: set("OFFCPUTIME_TEST_NO_KSTACK_WALK"),
            kallsyms_names: set("OFFCPUTIME_TEST_KALLSYMS"),
            verifier_stats: set("OFFCPUTIME_VERIFIER_STATS"),
            timeline_ring_kb: number("OFFCPUTIME_TEST_TIMELINE_RING_KB").map(ring_kb),
            copy_ring_kb: number("OFFCPUTIME_TEST_COPY_RING_KB").map(ring_kb),
            stats_interval: var("OFFCPUTIME_STATS_INTERVAL")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64),
        }
    }
}

/// A ring buffer's size in KiB as a kernel takes it: a power of two, from
/// 4 KiB to 1 GiB.
fn ring_kb(kb: u64) -> u32 {
    u32::try_from(kb.clamp(4, 1 << 20))
        .unwrap_or(4)
        .next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_set_is_a_normal_run() {
        assert_eq!(TestEnv::from_vars(|_| None), TestEnv::default());
    }

    #[test]
    fn each_variable_reaches_its_field() {
        let env = TestEnv::from_vars(|name| {
            Some(match name {
                "OFFCPUTIME_TEST_DROP_SWITCH_IN" => "20".into(),
                "OFFCPUTIME_TEST_RUN_CLOCK_STEP_US" => "1500".into(),
                "OFFCPUTIME_TEST_STALL_BEFORE_CUT_MS" => "150".into(),
                "OFFCPUTIME_TEST_STALL_NEWS_AFTER_MS" => "1000".into(),
                "OFFCPUTIME_TEST_STALL_LATER_LOAD_MS" => "700".into(),
                "OFFCPUTIME_TEST_COPY_RING_KB" => "300".into(),
                "OFFCPUTIME_STATS_INTERVAL" => "0.5".into(),
                "OFFCPUTIME_TEST_PYTHON_GATE" => "/tmp/gate".into(),
                "OFFCPUTIME_TEST_RUNTIMES_AT_START" => "0".into(),
                _ => String::new(),
            })
        });
        assert!(env.legacy && env.no_start_user_stacks && env.no_stack_cache);
        assert!(env.fail_tp_btf);
        assert!(env.no_file_tables && env.verifier_stats);
        assert!(env.kstack_check && env.no_kstack_walk && env.spill_stacks);
        assert!(env.kallsyms_names);
        assert_eq!(env.drop_switch_in, 20);
        assert_eq!(env.run_clock_step_us, 1500);
        assert_eq!(env.runtimes_at_start.as_deref(), Some("0"));
        assert_eq!(env.stall_before_cut, Some(Duration::from_millis(150)));
        assert_eq!(env.stall_news_after, Some(Duration::from_secs(1)));
        assert_eq!(env.stall_later_load, Some(Duration::from_millis(700)));
        assert_eq!(env.copy_ring_kb, Some(512));
        assert_eq!(env.stats_interval, Some(Duration::from_millis(500)));
        assert_eq!(
            env.python_gate.as_deref(),
            Some(std::path::Path::new("/tmp/gate"))
        );
        // A number that does not parse is no stall.
        assert_eq!(env.stall_in_write, None);
    }
}
