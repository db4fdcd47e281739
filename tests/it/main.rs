//! The integration tests, one binary: golden files for the output formats
//! (no privileges needed) and end-to-end runs of the profiler against the
//! `blocker` example (root; under `CI=true` they fail instead of skipping).

mod cli;
mod e2e;
mod faults;
mod golden;
mod svg;
mod util;
