//! offcputime: an off-CPU time profiler for Linux.
//!
//! The pipeline is [`cli`] (flags to a [`cli::Config`]) → [`tracer`] (the
//! BPF program: load, attach, read) → [`symbolize`] (kernel frames through
//! `ksyms`, a compact table of kallsyms) → [`profile`] (merged, symbolized
//! stacks; [`filter`] keeps or drops them by frame names) → [`output`]
//! (folded stacks, bcc's report, a flame graph, pprof or speedscope). JIT
//! frames are named from their runtime's perf map ([`jit`]). While
//! tracing, [`unwind`] gives the BPF program the DWARF unwind tables
//! ([`unwind_table`]) of every process it sees.
//!
//! Modules use only those before them in the order `tests/it/layers.rs`
//! holds (and fails on a use against): the kernel side first, from
//! [`raw`] (what it reports, as plain data), then files, processes and
//! the tracer, the profile and [`shape`] (how the outputs shape a sample's
//! stacks) before [`filter`] and [`output`], and [`cli`] and [`app`] last.

pub mod app;
mod btf;
pub mod chains;
pub mod cli;
pub mod container;
pub mod deferred;
mod elf;
pub mod filter;
#[cfg(test)]
mod hostile;
pub mod intervals;
pub mod jit;
pub mod ksyms;
pub mod oncpu;
pub mod output;
pub mod priority;
pub mod process;
pub mod profile;
pub mod push;
pub mod raw;
pub mod records;
pub mod runtime;
pub mod shape;
pub mod snapshot;
pub mod symbolize;
pub mod test_env;
pub mod text;
pub mod timeline;
pub mod tracer;
pub mod unwind;
pub mod unwind_table;

/// A module of a skeleton that libbpf-cargo generated (`build.rs`), with
/// the lints its generated code does not follow allowed.
macro_rules! skeleton {
    ($(#[$meta:meta])* mod $name:ident = $file:literal { $($more:tt)* }) => {
        $(#[$meta])*
        #[allow(
            clippy::all,
            non_camel_case_types,
            non_snake_case,
            non_upper_case_globals,
            dead_code
        )]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $file));
            $($more)*
        }
    };
}

skeleton! {
/// The generated BPF skeleton and the types shared with the BPF program.
mod bpf = "offcputime.skel.rs" {
    // SAFETY: plain C structs of integers, valid for any bit pattern.
    unsafe impl plain::Plain for types::offcpu_key {}
    unsafe impl plain::Plain for types::offcpu_val {}
    unsafe impl plain::Plain for types::task_event {}
    unsafe impl plain::Plain for types::unwind_proc {}
    unsafe impl plain::Plain for types::unwind_file_key {}
    unsafe impl plain::Plain for types::unwind_file {}
    unsafe impl plain::Plain for types::mapped_event {}
    unsafe impl plain::Plain for types::waker_info {}
    unsafe impl plain::Plain for types::snapshot_task {}
    unsafe impl plain::Plain for types::py_proc {}
    unsafe impl plain::Plain for types::block_record {}
    unsafe impl plain::Plain for types::korc_pair {}
    unsafe impl plain::Plain for types::py_code_event {}
    include!(concat!(env!("OUT_DIR"), "/offcputime.core.rs"));
    include!(concat!(env!("OUT_DIR"), "/offcputime.plain.rs"));

    std::thread_local! {
        /// Whether the skeleton opened on this thread now is the plain
        /// build (see [`opening_plain`]).
        static PLAIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The object the skeleton opens (build.rs puts this call in it):
    /// its own bytes, the general build's, or the plain build's.
    fn object_bytes(general: &'static [u8]) -> &'static [u8] {
        if PLAIN.get() {
            &OBJECT_PLAIN
        } else {
            general
        }
    }

    /// `open`, the skeleton's opening of the plain build of the object
    /// where `plain`, else of the general one (build.rs: both have the
    /// same maps, programs and variables).
    pub fn opening_plain<T>(plain: bool, open: impl FnOnce() -> T) -> T {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                PLAIN.set(false);
            }
        }
        PLAIN.set(plain);
        let _reset = Reset;
        open()
    }
}
}

skeleton! {
/// The lookup of kernel symbols by name (`src/bpf/ksyms.bpf.c`), used by
/// `tracer::kernel`.
mod ksyms_bpf = "ksyms.skel.rs" {}
}

skeleton! {
/// The floor programs of the overhead benchmark (`examples/floor.rs`): the
/// stack walks any profiler on `sched_switch` must pay for, and nothing else.
#[doc(hidden)]
mod floor_bpf = "floor.skel.rs" {}
}

/// Whether `err` is, anywhere in its chain, a write to a closed pipe: the
/// reader went away (`offcputime -f | head -1`), which is not a failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

static FREED_MEMORY_HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// While starting, [`give_back_freed_memory`] does nothing: each trim is
/// dozens of `madvise` calls, each a TLB shootdown that interrupts the
/// other threads starting (the BPF load, the table builders), milliseconds
/// of start-up in all. Once started, one trim gives it all back.
pub(crate) fn hold_freed_memory(hold: bool) {
    FREED_MEMORY_HELD.store(hold, std::sync::atomic::Ordering::Relaxed);
}

/// Makes the allocator return freed memory to the system: building a large
/// object's unwind table, or reading one object's symbols, takes tens of MB
/// for a moment, which must not stay resident for the rest of the run.
pub(crate) fn give_back_freed_memory() {
    if FREED_MEMORY_HELD.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
