//! The integration tests, one binary: golden files for the output formats
//! (no privileges needed); end-to-end runs of the profiler against the
//! `blocker` workload, fault tests and a soak run (root; under `CI=true`
//! they fail instead of skipping); the unwinding acceptance test against
//! gdb; and the kernel matrix in VMs.

mod chains;
mod cli;
mod containers;
mod docs;
mod e2e;
mod faults;
pub(crate) mod formats;
mod golden;
mod intervals;
mod java;
mod kstacks;
mod layers;
mod newprocs;
mod node;
mod oncpu;
mod otlp;
pub(crate) mod push;
mod python;
mod reading;
mod realworld;
mod sampling;
mod signals;
mod snapshot;
mod stackcache;
mod states;
mod svg;
mod timeline;
pub(crate) mod unwind;
mod util;
mod vm;
mod wakers;
mod wording;
