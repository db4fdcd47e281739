//! Loads one floor program of the overhead benchmark on
//! tp_btf/sched_switch and keeps it attached until SIGINT/SIGTERM or the
//! given number of seconds (see scripts/bench-overhead).
//!
//!     floor empty|kernel|user|both|ktop|knext [SECONDS] [--top N]

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use offcputime::floor_bpf::FloorSkelBuilder;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("");
    let seconds: f64 = match args.get(1) {
        Some(s) if !s.starts_with("--") => s.parse().context("SECONDS")?,
        _ => 1e9,
    };
    let top: u32 = match args.iter().position(|a| a == "--top") {
        Some(i) => args.get(i + 1).context("--top N")?.parse()?,
        None => 8,
    };

    let mut object = MaybeUninit::uninit();
    let mut open = FloorSkelBuilder::default().open(&mut object)?;
    open.maps
        .rodata_data
        .as_deref_mut()
        .context("no .rodata")?
        .top_frames = top;
    let p = &mut open.progs;
    for (name, prog) in [
        ("empty", &mut p.floor_empty),
        ("kernel", &mut p.floor_kernel),
        ("user", &mut p.floor_user),
        ("both", &mut p.floor_both),
        ("ktop", &mut p.floor_ktop),
        ("knext", &mut p.floor_knext),
    ] {
        prog.set_autoload(name == which);
    }
    let skel = open.load().context("load")?;
    let progs = &skel.progs;
    let link = match which {
        "empty" => progs.floor_empty.attach(),
        "kernel" => progs.floor_kernel.attach(),
        "user" => progs.floor_user.attach(),
        "both" => progs.floor_both.attach(),
        "ktop" => progs.floor_ktop.attach(),
        "knext" => progs.floor_knext.attach(),
        _ => bail!("usage: floor empty|kernel|user|both|ktop|knext [SECONDS] [--top N]"),
    }
    .context("attach")?;

    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::SeqCst))?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(link);
    Ok(())
}
