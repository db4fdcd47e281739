//! The reading tools: `--grep`/`--exclude`, `-s` with sizes and modules,
//! `--addresses`, `--group`, and JIT frames named from perf maps. Golden
//! files for each new shape (`BLESS=1`), flags and their errors, and end
//! to end on the `blocker` workload (root) and a Node program run with
//! `--perf-basic-prof`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use offcputime::filter::StackFilter;
use offcputime::output::group::{self, GroupSort};
use offcputime::output::pprof::{self, PprofOptions};
use offcputime::output::speedscope::{self, SpeedscopeOptions};
use offcputime::output::svg::{self, SvgOptions};
use offcputime::output::{folded, text, Shape};
use offcputime::profile::{Frame, Part, Profile, Sample, Waker};

use crate::golden::{check, synthetic};
use crate::util::{
    blocker_path, offcputime, parse_folded, profile, require_root, serial, Folded, Workload,
};

fn filter(grep: &[&str], exclude: &[&str]) -> StackFilter {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    StackFilter::new(&s(grep), &s(exclude))
        .expect("valid patterns")
        .expect("a filter")
}

fn folded_text(p: &Profile, shape: Shape) -> String {
    let mut out = Vec::new();
    folded::write(p, shape, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn report_text(p: &Profile, shape: Shape) -> String {
    let mut out = Vec::new();
    text::write(p, shape, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn filtered(grep: &[&str], exclude: &[&str]) -> Profile {
    let mut p = synthetic();
    filter(grep, exclude).apply(&mut p, Shape::default());
    p
}

#[test]
fn grep_and_exclude_golden() {
    check(
        "synthetic-grep.folded",
        &folded_text(
            &filtered(&["^do_nanosleep$", "pipe"], &[]),
            Shape::default(),
        ),
    );
    check(
        "synthetic-exclude.folded",
        &folded_text(&filtered(&[], &["nanosleep", "^poll$"]), Shape::default()),
    );
    check(
        "synthetic-grep-exclude.txt",
        &report_text(&filtered(&["__schedule"], &["futex"]), Shape::default()),
    );
}

#[test]
fn grep_rules() {
    let shape = Shape::default();
    let sample = |user: Part, kernel: Part, waker: Option<Waker>| Sample {
        comm: "app".into(),
        tgid: 1,
        pid: 1,
        thread: None,
        user,
        kernel,
        state: None,
        waker,
        container: None,
        total_ns: 1_000_000,
        count: 1,
    };
    let frames = |n: &[&str]| Part::Frames(n.iter().map(|&s| Frame::named(s)).collect());
    let plain = sample(frames(&["read", "main"]), frames(&["pipe_read"]), None);
    // Unanchored, any frame, user or kernel.
    assert!(filter(&["pipe"], &[]).keeps(&plain, shape));
    assert!(filter(&["^mai"], &[]).keeps(&plain, shape));
    assert!(!filter(&["^ain"], &[]).keeps(&plain, shape));
    // The command is not a frame.
    assert!(!filter(&["app"], &[]).keeps(&plain, shape));
    // Repeated: any of them.
    assert!(filter(&["nothing", "read"], &[]).keeps(&plain, shape));
    assert!(!filter(&[], &["nothing", "read"]).keeps(&plain, shape));
    // Both: a --grep match and no --exclude match.
    assert!(filter(&["read"], &["nothing"]).keeps(&plain, shape));
    assert!(!filter(&["read"], &["pipe_read"]).keeps(&plain, shape));
    // Only the frames -U/-K show.
    let user_only = Shape {
        mode: offcputime::profile::StackMode::UserOnly,
        ..shape
    };
    assert!(!filter(&["pipe_read"], &[]).keeps(&plain, user_only));
    // Missed stacks by their marker.
    let missed = sample(Part::Missed, frames(&["futex_wait"]), None);
    assert!(filter(&["Missed User"], &[]).keeps(&missed, shape));
    // With -s, the shown text too (the module).
    let mut shown = plain.clone();
    if let Part::Frames(f) = &mut shown.user {
        let mut v = f.to_vec();
        v[0].shown = Some("read+0x15/0x90 [libc.so.6]".into());
        *f = v.into();
    }
    assert!(filter(&["libc\\.so"], &[]).keeps(&shown, shape));
    assert!(filter(&["^read$"], &[]).keeps(&shown, shape));
    // The waker's frames count, its name does not.
    let woken = sample(
        frames(&["read", "main"]),
        frames(&["pipe_read"]),
        Some(Waker::Task {
            comm: "writer".into(),
            pid: 2,
            user: frames(&["wake_by_write"]),
            kernel: frames(&["try_to_wake_up"]),
        }),
    );
    assert!(filter(&["wake_by_write"], &[]).keeps(&woken, shape));
    assert!(filter(&["try_to_wake"], &[]).keeps(&woken, shape));
    assert!(!filter(&["^writer$"], &[]).keeps(&woken, shape));
    assert!(!filter(&[], &["wake_by"]).keeps(&woken, shape));
}

#[test]
fn bad_patterns_are_one_error_line() {
    for args in [
        &["--grep", "("][..],
        &["--exclude", "[z-a]"],
        &["--grep", "ok", "--exclude", "a{99999999}"],
        &["--grep", ""],
        &["--group", "-f"],
        &["--group", "--svg"],
        &["--group", "-o", "x.folded", "-o", "x.txt"],
        &["--group-sort", "desc"],
    ] {
        let out = offcputime().args(args).arg("1").output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("offcputime: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Tracing"), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
    assert!(!std::path::Path::new("x.folded").exists());
}

/// The synthetic profile as `-s` shows it: user frames in libc with
/// offsets and sizes, kernel frames in the kernel and one in a module.
fn with_offsets(addresses: bool) -> Profile {
    let mut p = synthetic();
    let decorate = |part: &mut Part, module: &dyn Fn(&str) -> &'static str| {
        if let Part::Frames(f) = part {
            let mut v = f.to_vec();
            for (i, frame) in v.iter_mut().enumerate() {
                let mut shown = format!(
                    "{}+{:#x}/{:#x} [{}]",
                    frame.name,
                    0x10 + i,
                    0x80 + 0x10 * i,
                    module(&frame.name)
                );
                if addresses {
                    shown = format!("{:#x}:{shown}", 0x7f00_0000_1000u64 + 0x100 * i as u64);
                }
                frame.shown = Some(shown.into());
            }
            *f = v.into();
        }
    };
    for s in &mut p.samples {
        decorate(&mut s.user, &|n| {
            if n == "main" {
                "app"
            } else {
                "libc.so.6"
            }
        });
        decorate(&mut s.kernel, &|n| {
            if n == "pipe_read" {
                "fuse"
            } else {
                "kernel"
            }
        });
    }
    p
}

#[test]
fn offsets_and_addresses_golden() {
    let delimited = Shape {
        delimited: true,
        ..Shape::default()
    };
    check(
        "synthetic-offsets.folded",
        &folded_text(&with_offsets(false), delimited),
    );
    check(
        "synthetic-offsets.txt",
        &report_text(&with_offsets(false), Shape::default()),
    );
    check(
        "synthetic-addresses.folded",
        &folded_text(&with_offsets(true), Shape::default()),
    );
}

#[test]
fn offsets_in_every_output_but_pprof_names() {
    let p = with_offsets(true);
    let shape = Shape::default();
    let mut svg_out = Vec::new();
    svg::write(&p, shape, &SvgOptions::default(), &mut svg_out).unwrap();
    let svg_text = String::from_utf8(svg_out).unwrap();
    assert!(
        svg_text.contains("0x7f0000001000:do_nanosleep+0x12/0xa0 [kernel]")
            || svg_text.contains("do_nanosleep+0x12/0xa0 [kernel]"),
        "the flame graph lacks the shown names"
    );
    let mut ss = Vec::new();
    speedscope::write(&p, shape, &SpeedscopeOptions::default(), &mut ss).unwrap();
    let ss = String::from_utf8(ss).unwrap();
    assert!(ss.contains("clock_nanosleep+0x10/0x80 [libc.so.6]"), "{ss}");
    // pprof has addresses and mappings of its own: bare function names.
    let message = pprof::build(&p, shape, &PprofOptions::default());
    for s in &message.string_table {
        assert!(
            !s.contains("+0x") && !s.starts_with("0x7f"),
            "a decorated name in pprof: {s:?}"
        );
    }
    assert!(message.string_table.iter().any(|s| s == "do_nanosleep"));
}

fn group_text(p: &Profile, shape: Shape, sort: GroupSort) -> String {
    let mut out = Vec::new();
    group::write(p, shape, sort, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn group_golden() {
    check(
        "synthetic-group.txt",
        &group_text(&synthetic(), Shape::default(), GroupSort::Asc),
    );
    let kernel_only = Shape {
        mode: offcputime::profile::StackMode::KernelOnly,
        ..Shape::default()
    };
    check(
        "synthetic-group-kernel-desc.txt",
        &group_text(&synthetic(), kernel_only, GroupSort::Desc),
    );
}

/// `----- N threads in M processes -----` of each entry, in order.
fn group_headers(text: &str) -> Vec<usize> {
    text.lines()
        .filter_map(|l| l.strip_prefix("----- "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

/// The frames of a folded line after its command.
fn stack_frames(l: &Folded) -> &[String] {
    &l.frames[1..]
}

#[test]
fn e2e_grep_and_exclude() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let w = Workload::start(&[]);
    let pid = w.pid.to_string();
    let dir = tempfile::tempdir().unwrap();
    let out_folded = dir.path().join("g.folded");
    let out_txt = dir.path().join("g.txt");
    // One run, two outputs: both filtered.
    profile(&[
        "-p",
        &pid,
        "--grep",
        "^wl_block_(pipe_read|futex_wait)$",
        "-o",
        out_folded.to_str().unwrap(),
        "-o",
        out_txt.to_str().unwrap(),
        "1",
    ]);
    let lines = parse_folded(&std::fs::read(&out_folded).unwrap());
    assert!(!lines.is_empty(), "--grep kept nothing");
    let comms: BTreeSet<&str> = lines.iter().map(|l| l.comm()).collect();
    assert_eq!(
        comms,
        BTreeSet::from(["wl-futex", "wl-pipe"]),
        "--grep: {lines:?}"
    );
    for l in &lines {
        assert!(
            l.has("wl_block_pipe_read") || l.has("wl_block_futex_wait"),
            "{l:?}"
        );
    }
    let report = std::fs::read_to_string(&out_txt).unwrap();
    let entries = crate::util::parse_report(report.as_bytes());
    assert!(!entries.is_empty());
    for e in &entries {
        assert!(
            e.frames
                .iter()
                .any(|f| f == "wl_block_pipe_read" || f == "wl_block_futex_wait"),
            "report entry without the pattern: {e:?}"
        );
    }

    // --exclude: no frame of any line matches; the other threads stay.
    let lines = parse_folded(&profile(&["-f", "-p", &pid, "--exclude", "nanosleep", "1"]).stdout);
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            !stack_frames(l).iter().any(|f| f.contains("nanosleep")),
            "--exclude left {l:?}"
        );
    }
    assert!(lines.iter().any(|l| l.comm() == "wl-pipe"));
    assert!(!lines.iter().any(|l| l.comm() == "wl-nanosleep"));

    // Both, and the pattern matches kernel frames too.
    let lines = parse_folded(
        &profile(&[
            "-f",
            "-p",
            &pid,
            "--grep",
            "^do_nanosleep$",
            "--exclude",
            "wl_block_shortsleep",
            "1",
        ])
        .stdout,
    );
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l.has("do_nanosleep"), "{l:?}");
        assert!(!l.has("wl_block_shortsleep"), "{l:?}");
    }
    assert!(lines.iter().any(|l| l.comm() == "wl-nanosleep"));

    // A pattern nothing matches: empty output, one line on stderr, success.
    let out = profile(&["-f", "-p", &pid, "--grep", "^no_such_function_here$", "1"]);
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no stack was left by --grep/--exclude"),
        "{err}"
    );
    drop(w);
}

/// `nm -S` of the workload: function name -> (address, size).
fn nm_sizes() -> Option<BTreeMap<String, (u64, u64)>> {
    let out = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(blocker_path())
        .output()
        .ok()?;
    let mut m = BTreeMap::new();
    let mut twice = BTreeSet::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let [addr, size, kind, name] = f[..] {
            if kind.eq_ignore_ascii_case("t") {
                let v = (
                    u64::from_str_radix(addr, 16).ok()?,
                    u64::from_str_radix(size, 16).ok()?,
                );
                if m.insert(name.to_string(), v).is_some() {
                    twice.insert(name.to_string());
                }
            }
        }
    }
    // Local symbols of the same name (`__rust_try`): which is which is
    // not for nm to say.
    m.retain(|n, _| !twice.contains(n));
    Some(m)
}

/// A frame as `-s --addresses` shows it: (address, name, offset, size,
/// module).
type Shown = (Option<u64>, String, u64, Option<u64>, String);

/// `[0xADDR:]name+0xOFF[/0xSIZE] [module]`.
fn parse_shown(f: &str) -> Option<Shown> {
    let (addr, rest) = match f.strip_prefix("0x").and_then(|r| r.split_once(':')) {
        Some((a, rest)) => (Some(u64::from_str_radix(a, 16).ok()?), rest),
        None => (None, f),
    };
    let (sym, module) = rest.rsplit_once(" [")?;
    let module = module.strip_suffix(']')?.to_string();
    let (name, off) = sym.rsplit_once("+0x")?;
    let (off, size) = match off.split_once("/0x") {
        Some((o, s)) => (o, Some(u64::from_str_radix(s, 16).ok()?)),
        None => (off, None),
    };
    Some((
        addr,
        name.to_string(),
        u64::from_str_radix(off, 16).ok()?,
        size,
        module,
    ))
}

/// Function symbols of /proc/kallsyms by name (the first of each name).
fn kallsyms() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for l in std::fs::read_to_string("/proc/kallsyms")
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 3 && f[1].eq_ignore_ascii_case("t") {
            if let Ok(a) = u64::from_str_radix(f[0], 16) {
                m.entry(f[2].to_string()).or_insert(a);
            }
        }
    }
    m
}

#[test]
fn e2e_offsets_sizes_modules_and_addresses() {
    if !require_root() {
        return;
    }
    let Some(nm) = nm_sizes() else {
        if crate::util::is_ci() {
            panic!("nm is needed (binutils) and CI=true forbids skipping");
        }
        eprintln!("skipped: nm not found");
        return;
    };
    let _g = serial();
    let w = Workload::start(&[]);
    let tid = w.tid("wl-nanosleep").to_string();
    let ksyms = kallsyms();
    let lines = parse_folded(
        &profile(&[
            "-f",
            "-d",
            "-s",
            "--addresses",
            "--no-inline",
            "-t",
            &tid,
            "1",
        ])
        .stdout,
    );
    let line = lines
        .iter()
        .filter(|l| {
            l.frames
                .iter()
                .any(|f| f.contains(":wl_block_nanosleep+0x"))
        })
        .max_by_key(|l| l.us)
        .unwrap_or_else(|| panic!("no stack through wl_block_nanosleep: {lines:?}"));
    let sep = line.pos("-").expect("the -d separator");
    let mut checked_user = 0;
    let mut bias = BTreeSet::new();
    for f in &line.frames[1..sep] {
        let (addr, name, off, size, module) =
            parse_shown(f).unwrap_or_else(|| panic!("user frame not as -s --addresses: {f:?}"));
        let addr = addr.expect("an address");
        if module == "blocker" {
            if let Some(&(nm_addr, nm_size)) = nm.get(&name) {
                assert_eq!(size, Some(nm_size), "{f}: nm -S says size {nm_size:#x}");
                assert!(off < nm_size, "{f}: offset past the size");
                bias.insert((addr - off).wrapping_sub(nm_addr));
                checked_user += 1;
            }
        } else if let Some(size) = size {
            assert!(off < size, "{f}: offset past the size");
        }
    }
    assert!(
        checked_user >= 2,
        "too few of the workload's functions checked against nm: {line:?}"
    );
    assert_eq!(
        bias.len(),
        1,
        "the addresses of the workload's functions disagree with nm's by different amounts: {bias:?}"
    );
    assert_eq!(
        bias.first().unwrap() % 4096,
        0,
        "load bias not page-aligned"
    );

    let mut checked_kernel = 0;
    for f in &line.frames[sep + 1..] {
        let (addr, name, off, size, module) =
            parse_shown(f).unwrap_or_else(|| panic!("kernel frame not as -s --addresses: {f:?}"));
        assert!(
            !module.is_empty()
                && module
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-'),
            "{f}: module {module:?}"
        );
        if let Some(size) = size {
            assert!(off < size, "{f}: offset past the size");
        }
        if let Some(&start) = ksyms.get(&name) {
            if start != 0 {
                assert_eq!(addr.unwrap() - off, start, "{f}: kallsyms has {start:#x}");
                checked_kernel += 1;
            }
        }
        if ["do_nanosleep", "schedule", "__schedule"].contains(&name.as_str()) {
            assert_eq!(module, "kernel", "{f}");
            assert!(size.is_some_and(|s| s > 0), "{f}: no size");
        }
    }
    assert!(checked_kernel >= 2, "kernel frames not checked: {line:?}");
    drop(w);
}

#[test]
fn e2e_group() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let w = Workload::start(&[]);
    let pid = w.pid.to_string();
    let asc = String::from_utf8(profile(&["--group", "-K", "-p", &pid, "1"]).stdout).unwrap();
    let counts = group_headers(&asc);
    assert!(!counts.is_empty(), "{asc}");
    assert!(
        counts.windows(2).all(|p| p[0] <= p[1]),
        "not fewest first: {counts:?}"
    );
    // The two sleepers (and the main thread's feeder sleep) share their
    // kernel stack: one entry names them all.
    let shared = asc
        .split("\n\n")
        .find(|e| e.contains("do_nanosleep") && e.contains("wl-nanosleep (1)"))
        .unwrap_or_else(|| panic!("no entry with the sleepers: {asc}"));
    assert!(shared.contains("wl-shortsleep (1)"), "{shared}");
    assert!(shared.contains("threads in 1 process"), "{shared}");
    assert!(shared.contains(" blocks, "), "{shared}");
    assert!(shared.contains("total:"), "{shared}");
    let desc = String::from_utf8(
        profile(&["--group", "--group-sort", "desc", "-K", "-p", &pid, "1"]).stdout,
    )
    .unwrap();
    let counts = group_headers(&desc);
    assert!(
        counts.windows(2).all(|p| p[0] >= p[1]),
        "not most first: {counts:?}"
    );
    drop(w);
}

/// A Node program whose main thread blocks in `wl_js_blocker` (a child
/// process run synchronously) in a loop until a file `stop` appears in
/// `dir`, with its perf map on. Returns the child, killed on drop, and its pid once it has run a while (its
/// functions compiled past the interpreter).
/// Node running `wl_js_loop` (calling `wl_js_blocker`, which blocks in
/// `execSync`) until file `stop` appears in `dir`, then `wl_js_last`
/// (blocking 0.3 s) once before it exits; with the perf map and V8's flags
/// `flags`.
fn start_node(
    node: &std::path::Path,
    dir: &std::path::Path,
    flags: &[&str],
) -> (crate::util::KillOnDrop, u32) {
    let script = dir.join("wl.js");
    std::fs::write(
        &script,
        "const { execSync } = require('child_process');\n\
             const { existsSync } = require('fs');\n\
             function wl_js_blocker() { execSync('sleep 0.05'); }\n\
             function wl_js_loop() { while (!existsSync('stop')) { wl_js_blocker(); } }\n\
             function wl_js_last() { execSync('sleep 0.3'); }\n\
             console.log('ready ' + process.pid);\n\
             wl_js_loop();\n\
             wl_js_last();\n",
    )
    .unwrap();
    // In the temporary directory: V8 may write its logs beside it.
    let mut child = Command::new(node)
        .current_dir(dir)
        .arg("--perf-basic-prof")
        .args(flags)
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start node");
    let pid = ready_pid(&mut child, "node");
    (crate::util::KillOnDrop(child), pid)
}

/// The pid in the `ready PID` line `child` (`what`) prints first.
fn ready_pid(child: &mut std::process::Child, what: &str) -> u32 {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{what} said {line:?}"))
}

#[test]
fn e2e_node_jit_frames_named_from_perf_map() {
    if !require_root() {
        return;
    }
    let Some(node) = crate::util::require_tool("node", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (child, pid) = start_node(&node, dir.path(), &[]);
    // Past the interpreter: the loop compiled (its perf map grows).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let p = pid.to_string();
    // --no-node: V8 itself would name the functions (tests/it/node.rs);
    // here the perf map must.
    let out = profile(&["-f", "-s", "--no-node", "-p", &p, "2"]);
    drop(child);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let lines = parse_folded(&out.stdout);
    let blocked: Vec<&Folded> = lines
        .iter()
        .filter(|l| l.frames.iter().any(|f| f.contains("wl_js_blocker")))
        .collect();
    assert!(
        !blocked.is_empty(),
        "no frame named wl_js_blocker from node's perf map: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let total: u64 = blocked.iter().map(|l| l.us).sum();
    let main: u64 = lines
        .iter()
        .filter(|l| l.comm() == "node" && l.frames.iter().any(|f| f.contains("node::Start")))
        .map(|l| l.us)
        .sum();
    // Most of the main thread's off-CPU time is under the JS function.
    assert!(
        total * 10 >= main * 8,
        "wl_js_blocker holds {total} us of the main thread's {main} us"
    );
    for l in &blocked {
        let f = l
            .frames
            .iter()
            .find(|f| f.contains("wl_js_blocker"))
            .unwrap();
        assert!(f.ends_with(" [jit]"), "-s: {f:?}");
        // Its caller, also JIT code, is named too.
        assert!(l.frames.iter().any(|f| f.contains("wl_js_loop")), "{l:?}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("perf map was not read"), "{err}");
}

/// The profiler started with `args`, stdout and stderr piped, once it
/// says it is tracing (however long its load took): the child, what it
/// said until then, and the rest of its stderr.
fn tracing(
    args: &[&str],
) -> (
    std::process::Child,
    String,
    std::io::BufReader<std::process::ChildStderr>,
) {
    use std::io::BufRead;
    let mut tracer = crate::util::offcputime()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run offcputime");
    let mut err = std::io::BufReader::new(tracer.stderr.take().unwrap());
    let mut said = String::new();
    let mut line = String::new();
    while !line.starts_with("Tracing") {
        line.clear();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        said.push_str(&line);
    }
    if !line.starts_with("Tracing") {
        let _ = tracer.wait();
        panic!("offcputime ended before tracing: {said}");
    }
    (tracer, said, err)
}

#[test]
fn e2e_node_jit_frames_of_an_exited_process() {
    if !require_root() {
        return;
    }
    let Some(node) = crate::util::require_tool("node", &[]) else {
        return;
    };
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // Interpreted functions get code of their own (a copy of the
    // interpreter's entry), written to the perf map at their first call:
    // `wl_js_last`'s line is written just before it blocks, with nothing
    // mapped that would have the map read again before node exits.
    let (child, pid) = start_node(&node, dir.path(), &["--interpreted-frames-native-stack"]);
    let p = pid.to_string();
    // Traced for a second once the profiler is attached (said by its
    // status line, however long the load took), then gone well before
    // the end of the trace.
    let (tracer, said, _err) = tracing(&["-f", "-p", &p, "4"]);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // It ends on its own (killed, it would lose the perf map's last lines,
    // which node writes through a buffer).
    std::fs::write(dir.path().join("stop"), "").unwrap();
    let mut child = child;
    let ended = child.0.wait().expect("wait for node");
    assert!(ended.success(), "node: {ended}");
    let out = tracer.wait_with_output().expect("wait for offcputime");
    assert!(out.status.success(), "offcputime failed: {said}");
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let lines = parse_folded(&out.stdout);
    for f in ["wl_js_blocker", "wl_js_last"] {
        assert!(
            lines
                .iter()
                .any(|l| l.comm() == "node" && l.frames.iter().any(|g| g.contains(f))),
            "the exited process's JIT frames lost their names ({f}): {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// `blocker jit`: a perf map's last line, written after the map was read
/// and followed by nothing that would have it read again, names the frame
/// that blocks under it: read once more after the process exits
/// (`stay` false), or at the end of the trace while it lives.
fn jit_map_read_last(stay: bool) {
    use std::io::Write;
    if !require_root() {
        return;
    }
    let _g = serial();
    let mut child = Command::new(crate::util::blocker_path())
        .args(["jit", if stay { "stay" } else { "exit" }])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start blocker jit");
    let pid = ready_pid(&mut child, "blocker");
    let stdin = child.stdin.take().unwrap();
    let mut child = crate::util::KillOnDrop(child);
    let p = pid.to_string();
    let (tracer, said, _err) = tracing(&["-f", "-p", &p, "2"]);
    // Blocked on its stdin, seen (its map read, without the last line).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut stdin = stdin;
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    if !stay {
        let ended = child.0.wait().expect("wait for blocker");
        assert!(ended.success(), "blocker jit: {ended}");
    }
    let out = tracer.wait_with_output().expect("wait for offcputime");
    drop(child);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    assert!(out.status.success(), "offcputime failed: {said}");
    let lines = parse_folded(&out.stdout);
    let last: u64 = lines
        .iter()
        .filter(|l| l.frames.iter().any(|f| f == "wl_jit_last"))
        .map(|l| l.us)
        .sum();
    // 300 ms, less what the kernel's clock and the window may cut; its
    // caller whole (the code keeps a frame pointer).
    assert!(
        lines
            .iter()
            .filter(|l| l.frames.iter().any(|f| f == "wl_jit_last"))
            .all(|l| l.has("blocker::main")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        (250_000..=310_000).contains(&last),
        "{} us under wl_jit_last (stay: {stay}): {}{}",
        last,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn jit_map_read_again_after_its_process_exits() {
    jit_map_read_last(false);
}

#[test]
fn jit_map_read_again_at_the_end() {
    jit_map_read_last(true);
}

#[test]
fn reading_flags_to_config() {
    use clap::Parser;
    use offcputime::cli::Args;
    let config = |args: &[&str]| {
        Args::try_parse_from(std::iter::once("offcputime").chain(args.iter().copied()))
            .unwrap()
            .into_config()
    };
    let c = config(&["--grep", "a", "--grep", "b", "--exclude", "c"]).unwrap();
    assert!(c.filter.is_some());
    assert!(config(&[]).unwrap().filter.is_none());
    assert_eq!(config(&["--group"]).unwrap().group, Some(GroupSort::Asc));
    assert_eq!(
        config(&["--group", "--group-sort", "desc", "-o", "out.txt"])
            .unwrap()
            .group,
        Some(GroupSort::Desc)
    );
    assert!(config(&["--group", "--format", "report"]).is_ok());
    assert!(config(&["--group", "--format", "pprof"]).is_err());
    assert!(config(&["--group", "-o", "out.speedscope.json"]).is_err());
    let c = config(&["-s", "--addresses"]).unwrap();
    assert!(c.offsets && c.addresses);
}
