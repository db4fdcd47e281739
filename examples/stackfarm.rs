//! `stackfarm`: many processes whose threads block under many distinct
//! stacks, for measuring how the profiler's report scales.
//!
//! ```text
//! cargo run --release --example stackfarm -- [--procs P] [--depth D] [--sleep-ms S] [--seconds N]
//!                                               [--variety K]
//! ```
//!
//! Starts P processes (this executable re-run as `stackfarm worker D S N K
//! INDEX`), each with D threads; thread d recurses d levels through
//! `farm_level` before it sleeps S ms (default 50) in a loop, so every
//! thread blocks under its own stack: P × D distinct stacks in all (1000 by
//! default). With `--variety K` (K > 1) each thread blocks under K stacks
//! of its own in turn, one sleep each: stack number k is a chain of 17
//! calls of `farm_zero` and `farm_one`, the bits of k (P × D × K distinct
//! stacks, up to 2^17).
//! Prints `ready` 300 ms after starting the workers, and exits after N
//! seconds (default 30) with them.

use std::hint::black_box;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Recurses `levels` more times, then sleeps until `end_ms` after `start`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn farm_level(levels: u32, sleep_ms: u64, end_ms: u64, start: &Instant) -> u32 {
    if levels == 0 {
        while (start.elapsed().as_millis() as u64) < end_ms {
            std::thread::sleep(Duration::from_millis(sleep_ms));
        }
        return 0;
    }
    // black_box keeps the call from becoming a loop.
    black_box(farm_level(black_box(levels - 1), sleep_ms, end_ms, start)) + 1
}

/// Bits of a stack number, one frame each (see `--variety`).
const BITS: u32 = 17;

#[no_mangle]
#[inline(never)]
pub extern "C" fn farm_zero(n: u64, bits: u32, sleep_ms: u64) -> u32 {
    black_box(farm_bits(black_box(n), bits, sleep_ms)) + 1
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn farm_one(n: u64, bits: u32, sleep_ms: u64) -> u32 {
    black_box(farm_bits(black_box(n), bits, sleep_ms)) + 2
}

/// Sleeps once under the stack that spells `n`'s lowest `bits` bits.
#[inline(always)]
fn farm_bits(n: u64, bits: u32, sleep_ms: u64) -> u32 {
    if bits == 0 {
        std::thread::sleep(Duration::from_millis(sleep_ms));
        0
    } else if n & 1 == 1 {
        farm_one(n >> 1, bits - 1, sleep_ms)
    } else {
        farm_zero(n >> 1, bits - 1, sleep_ms)
    }
}

fn worker(depth: u32, sleep_ms: u64, seconds: u64, variety: u64, index: u64) {
    // Killed with the farm, if it goes first.
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and nothing else.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let start = Instant::now();
    let end_ms = seconds * 1000;
    let threads: Vec<_> = (0..depth)
        .map(|d| {
            std::thread::Builder::new()
                .name(format!("farm-{d}"))
                .stack_size(256 * 1024)
                .spawn(move || {
                    if variety <= 1 {
                        farm_level(d, sleep_ms, end_ms, &start);
                        return;
                    }
                    let first = (index * depth as u64 + d as u64) * variety;
                    let mut j = 0;
                    while (start.elapsed().as_millis() as u64) < end_ms {
                        farm_bits((first + j) % (1 << BITS), BITS, sleep_ms);
                        j = (j + 1) % variety;
                    }
                })
                .expect("spawn")
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn flag(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        let depth = args[1].parse().expect("depth");
        let sleep_ms = args[2].parse().expect("sleep ms");
        let seconds = args[3].parse().expect("seconds");
        let variety = args[4].parse().expect("variety");
        let index = args[5].parse().expect("index");
        worker(depth, sleep_ms, seconds, variety, index);
        return ExitCode::SUCCESS;
    }
    let procs = flag(&args, "--procs", 25);
    let depth = flag(&args, "--depth", 40);
    let sleep_ms = flag(&args, "--sleep-ms", 50);
    let seconds = flag(&args, "--seconds", 30);
    let variety = flag(&args, "--variety", 1);
    let exe = std::env::current_exe().expect("own path");
    let mut children: Vec<Child> = (0..procs)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "worker",
                    &depth.to_string(),
                    &sleep_ms.to_string(),
                    &seconds.to_string(),
                    &variety.to_string(),
                    &i.to_string(),
                ])
                .stdin(Stdio::null())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    println!("ready");
    let mut ok = true;
    for c in &mut children {
        ok &= c.wait().map(|s| s.success()).unwrap_or(false);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
