//! The integration tests, one binary: golden files for the output formats
//! (no privileges needed); end-to-end runs of the profiler against the
//! `blocker` workload, fault tests and a soak run (root; under `CI=true`
//! they fail instead of skipping); and the kernel matrix in VMs.

mod cli;
mod e2e;
mod faults;
mod golden;
mod svg;
mod util;
mod vm;
