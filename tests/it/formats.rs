//! The pprof and speedscope outputs, read by the real clients: `go tool
//! pprof` must find the same stacks, totals and labels as the folded output
//! of the same profile; speedscope's JSON must validate against the schema
//! the `speedscope` package ships, and the app itself must open it. Golden
//! files (`BLESS=1`) for both shapes of the synthetic profile.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use offcputime::output::pprof::{self, PprofOptions, SampleType};
use offcputime::output::speedscope::{self, SpeedscopeOptions};
use offcputime::output::{folded, Shape};
use offcputime::profile::{
    Frame, FrameInfo, ObjectInfo, OffState, Origin, Part, Profile, StackMode, Window,
};

use crate::golden::{check, synthetic};
use crate::util::{is_ci, profile, require_root, require_tool, serial, Workload};

/// Files every user frame is in: libc's functions in one, the program's
/// in the other.
const LIBC_FUNCTIONS: &[&str] = &["clock_nanosleep", "read", "poll", "start_thread"];

/// The synthetic profile with what a real one has beside names: user
/// frames in two files with build ids, kernel frames at kernel
/// addresses, and a function inlined into `worker_sleep`; threads 100
/// and 101 are one process.
pub fn with_addresses() -> Profile {
    let mut p = synthetic();
    for s in &mut p.samples {
        if s.pid == 101 {
            s.tgid = 100;
        }
    }
    p.window = Some(Window {
        start_unix_ns: 1_700_000_000_000_000_000,
        duration_ns: 5_000_000_000,
    });
    p.objects = vec![
        ObjectInfo {
            path: "/usr/bin/app".into(),
            build_id: vec![0xab, 0xcd, 0x01, 0x23],
        },
        ObjectInfo {
            path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            build_id: vec![0x93, 0xac, 0x61, 0xec],
        },
    ];
    let mut names = BTreeSet::new();
    for s in &p.samples {
        for part in [&s.user, &s.kernel] {
            if let Part::Frames(f) = part {
                names.extend(f.iter().map(|f| f.name.clone()));
            }
        }
    }
    let index = |n: &str| names.iter().position(|m| &**m == n).unwrap() as u64;
    for s in &mut p.samples {
        if let Part::Frames(f) = &mut s.user {
            let mut out = Vec::new();
            for frame in f.iter().cloned() {
                let object = u32::from(LIBC_FUNCTIONS.contains(&&*frame.name));
                let placed = Frame::new(FrameInfo {
                    addr: 0x1000 + 0x10 * index(&frame.name),
                    origin: Origin::Object(object),
                    ..(*frame).clone()
                });
                if &*placed.name == "worker_sleep" {
                    out.push(Frame::new(FrameInfo {
                        name: "sleep_once".into(),
                        inlined: true,
                        ..(*placed).clone()
                    }));
                }
                out.push(placed);
            }
            *f = out.into();
        }
        if let Part::Frames(f) = &mut s.kernel {
            let mut v = f.to_vec();
            for frame in v.iter_mut() {
                frame.addr = 0xffff_ffff_8100_0000 + 0x100 * index(&frame.name);
                frame.origin = Origin::Kernel;
            }
            *f = v.into();
        }
    }
    p
}

fn shape(mode: StackMode) -> Shape {
    Shape {
        mode,
        ..Shape::default()
    }
}

fn pprof_bytes(p: &Profile, shape: Shape, opts: &PprofOptions) -> Vec<u8> {
    let mut out = Vec::new();
    pprof::write(p, shape, opts, &mut out).unwrap();
    out
}

fn speedscope_text(p: &Profile, opts: &SpeedscopeOptions) -> String {
    let mut out = Vec::new();
    speedscope::write(p, Shape::default(), opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn golden_pprof() {
    let opts = PprofOptions {
        sample_type: SampleType::Offcpu,
        thread_ids: true,
        on_cpu: false,
    };
    let message = pprof::build(&with_addresses(), Shape::default(), &opts);
    check("synthetic.pprof.txt", &format!("{message:#?}\n"));
}

#[test]
fn golden_speedscope() {
    check(
        "synthetic.speedscope.json",
        &speedscope_text(&with_addresses(), &SpeedscopeOptions::default()),
    );
    check(
        "synthetic-per-process.speedscope.json",
        &speedscope_text(&with_addresses(), &SpeedscopeOptions { per_process: true }),
    );
}

/// The same profile twice gives the same bytes (a gzip header without a
/// time, ids in the order of the samples).
#[test]
fn pprof_is_deterministic() {
    let opts = PprofOptions::default();
    let p = with_addresses();
    assert_eq!(
        pprof_bytes(&p, Shape::default(), &opts),
        pprof_bytes(&p, Shape::default(), &opts)
    );
}

pub(crate) fn go() -> Option<PathBuf> {
    require_tool("go", &["/usr/bin/go".into(), "/usr/lib/go/bin/go".into()])
}

/// `go tool pprof ARGS FILE`; it must succeed.
pub(crate) fn go_pprof(go: &Path, args: &[&str], file: &Path) -> String {
    let out = Command::new(go)
        .args(["tool", "pprof", "-symbolize=none"])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", std::env::temp_dir())
        .output()
        .expect("run go tool pprof");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What `go tool pprof -raw` prints of a profile.
#[derive(Debug, Default)]
struct Raw {
    /// The `Time:` and `Duration:` lines, as printed.
    time: String,
    duration: String,
    sample_type: String,
    /// Value, location ids (leaf first), labels.
    samples: Vec<(u64, Vec<u64>, BTreeMap<String, String>)>,
    /// Location id -> (address, mapping id, function names, innermost
    /// first).
    locations: BTreeMap<u64, (u64, u64, Vec<String>)>,
    /// The mapping lines as printed.
    mappings: Vec<String>,
}

fn parse_raw(text: &str) -> Raw {
    let mut raw = Raw::default();
    let mut section = "";
    let mut last_location = None;
    for line in text.lines() {
        match line {
            "Samples:" | "Locations" | "Mappings" => {
                section = line;
                continue;
            }
            _ => {}
        }
        let t = line.trim();
        if section.is_empty() {
            if let Some(v) = t.strip_prefix("Time: ") {
                raw.time = v.to_string();
            } else if let Some(v) = t.strip_prefix("Duration: ") {
                raw.duration = v.to_string();
            }
        }
        match section {
            "Samples:" if raw.sample_type.is_empty() => raw.sample_type = t.to_string(),
            "Samples:" => {
                if let Some((value, ids)) = t
                    .split_once(':')
                    .filter(|(v, _)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                {
                    let ids = ids.split_whitespace().map(|i| i.parse().unwrap()).collect();
                    raw.samples
                        .push((value.parse().unwrap(), ids, BTreeMap::new()));
                } else {
                    // `key:[value] key:[value]`
                    let labels = &mut raw.samples.last_mut().expect("a sample").2;
                    for item in t.split("] ").map(|i| i.trim_end_matches(']')) {
                        let (k, v) = item.split_once(":[").expect("key:[value]");
                        labels.insert(k.to_string(), v.to_string());
                    }
                }
            }
            "Locations" => {
                // `ID: 0xADDR [M=N ]NAME :LINE s=START`, further lines of
                // the same location indented, one name each.
                let name_of = |s: &str| s[..s.rfind(" :").expect("NAME :LINE")].to_string();
                let header = t
                    .split_once(": 0x")
                    .filter(|(id, _)| id.bytes().all(|b| b.is_ascii_digit()));
                match header {
                    Some((id, rest)) => {
                        let id: u64 = id.parse().unwrap();
                        let (addr, rest) = rest.split_once(' ').unwrap();
                        let addr = u64::from_str_radix(addr, 16).unwrap();
                        let (mapping, rest) = match rest.strip_prefix("M=") {
                            Some(r) => {
                                let (m, r) = r.split_once(' ').unwrap();
                                (m.parse().unwrap(), r)
                            }
                            None => (0, rest),
                        };
                        raw.locations
                            .insert(id, (addr, mapping, vec![name_of(rest)]));
                        last_location = Some(id);
                    }
                    None => {
                        let id = last_location.expect("a location");
                        raw.locations.get_mut(&id).unwrap().2.push(name_of(t));
                    }
                }
            }
            "Mappings" if !t.is_empty() => raw.mappings.push(t.to_string()),
            _ => {}
        }
    }
    raw
}

/// The raw profile's stacks as folded lines: `comm;outermost;…;leaf`
/// with the total rounded to microseconds, lines that round to 0 left
/// out, as `-f` prints them.
fn raw_as_folded(raw: &Raw) -> BTreeMap<String, u64> {
    let mut ns: BTreeMap<String, u64> = BTreeMap::new();
    for (value, ids, labels) in &raw.samples {
        let mut frames: Vec<String> = Vec::new();
        for id in ids {
            // Innermost first within a location, as in the stack.
            frames.extend(raw.locations[id].2.iter().cloned());
        }
        // The one location of a block without frames (a kernel thread's,
        // under -U): the folded line is the thread's name alone.
        if frames == [pprof::NO_FRAMES] {
            frames.clear();
        }
        // With --states, the state is the frame after the comm.
        if let Some(state) = labels.get("state") {
            frames.push(format!("[{state}]"));
        }
        frames.push(labels["comm"].clone());
        frames.reverse();
        *ns.entry(frames.join(";")).or_default() += value;
    }
    ns.into_iter()
        .map(|(k, v)| (k, (v + 500) / 1000))
        .filter(|&(_, us)| us > 0)
        .collect()
}

fn folded_map(p: &Profile, shape: Shape) -> BTreeMap<String, u64> {
    folded::lines(p, shape, false).into_iter().collect()
}

/// The lines of a folded file: stack -> microseconds.
pub(crate) fn folded_file(path: &Path) -> BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, us) = l.rsplit_once(' ').unwrap();
            (stack.to_string(), us.parse().unwrap())
        })
        .collect()
}

/// The build id of `file` as binutils' `readelf -n` reads it (the file
/// must have one); None, said, where readelf cannot run, outside CI.
pub(crate) fn build_id(file: &Path) -> Option<String> {
    match Command::new("readelf").arg("-n").arg(file).output() {
        Ok(n) => {
            let notes = String::from_utf8_lossy(&n.stdout);
            let id = notes
                .lines()
                .find_map(|l| l.trim().strip_prefix("Build ID: "))
                .unwrap_or_else(|| panic!("{} has no build id", file.display()));
            Some(id.to_string())
        }
        Err(e) if !is_ci() => {
            eprintln!("skipped the build id check: readelf: {e}");
            None
        }
        Err(e) => panic!("readelf: {e}"),
    }
}

/// The total `go tool pprof -top` gives, in nanoseconds.
pub(crate) fn top_total_ns(go: &Path, file: &Path) -> u64 {
    let top = go_pprof(go, &["-top", "-unit=ns"], file);
    let line = top
        .lines()
        .find(|l| l.starts_with("Showing nodes accounting for"))
        .unwrap_or_else(|| panic!("no total in {top}"));
    let total = line
        .split("% of ")
        .nth(1)
        .and_then(|t| t.strip_suffix("ns total"))
        .unwrap_or_else(|| panic!("{line}"));
    total.parse().unwrap()
}

/// Label values as `go tool pprof -tags` lists them: key -> values.
pub(crate) fn tags(go: &Path, file: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let text = go_pprof(go, &["-tags"], file);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut key = None;
    for line in text.lines() {
        if let Some((k, _)) = line.trim().split_once(": Total ") {
            key = Some(k.to_string());
        } else if let (Some(k), Some((_, v))) = (&key, line.split_once("): ")) {
            out.entry(k.clone())
                .or_default()
                .insert(v.trim().to_string());
        }
    }
    out
}

/// A function name as `-top` and `-traces` print it, without their note
/// on inlining.
fn plain_name(name: &str) -> &str {
    name.trim_end_matches(" (inline)")
        .trim_end_matches(" (partial-inline)")
}

/// Every function `go tool pprof -top` lists (nothing left out), with
/// its cumulative time in nanoseconds.
fn top_functions(go: &Path, file: &Path) -> BTreeMap<String, u64> {
    let text = go_pprof(
        go,
        &["-top", "-nodefraction=0", "-nodecount=1000000", "-unit=ns"],
        file,
    );
    let ns = |v: &str| v.trim_end_matches("ns").parse::<u64>().unwrap();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
    {
        // flat flat% sum% cum cum% name (which may have spaces)
        let mut rest = line.trim_start();
        let mut cols = Vec::new();
        for _ in 0..5 {
            let (col, r) = rest.split_once(char::is_whitespace).unwrap();
            cols.push(col);
            rest = r.trim_start();
        }
        *out.entry(plain_name(rest).to_string()).or_default() += ns(cols[3]);
    }
    out
}

/// `go tool pprof -traces`: each trace's folded stack (`comm;outermost;…;
/// leaf`, its comm from the label) and its time in nanoseconds, as far as
/// the tool's rounding of it shows.
fn traces(go: &Path, file: &Path) -> BTreeMap<String, f64> {
    let text = go_pprof(go, &["-traces"], file);
    let duration = |v: &str| -> f64 {
        let (number, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
            .iter()
            .find_map(|(unit, scale)| v.strip_suffix(unit).map(|n| (n, *scale)))
            .unwrap_or_else(|| panic!("a duration: {v:?}"));
        number.parse::<f64>().unwrap() * scale
    };
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let mut finish =
        |labels: &mut BTreeMap<String, String>, frames: &mut Vec<String>, value: &mut f64| {
            if !frames.is_empty() {
                // A block without frames: its folded line is the comm alone.
                if *frames == [pprof::NO_FRAMES] {
                    frames.clear();
                }
                if let Some(state) = labels.get("state") {
                    frames.push(format!("[{state}]"));
                }
                frames.push(labels.get("comm").cloned().unwrap_or_default());
                frames.reverse();
                *out.entry(frames.join(";")).or_default() += *value;
            }
            frames.clear();
            labels.clear();
            *value = 0.0;
        };
    let (mut labels, mut frames, mut value) = (BTreeMap::new(), Vec::new(), 0.0);
    // The header (file, type) ends at the first separator.
    let mut started = false;
    for line in text.lines() {
        if line.starts_with("-----------+") {
            finish(&mut labels, &mut frames, &mut value);
            started = true;
            continue;
        }
        if !started || line.len() < 12 || !line.is_char_boundary(11) {
            continue;
        }
        let (head, name) = (line[..11].trim(), line[11..].trim());
        if let Some(key) = head.strip_suffix(':') {
            labels.insert(key.to_string(), name.to_string());
        } else if !head.is_empty() {
            value = duration(head);
            frames.push(plain_name(name).to_string());
        } else if !frames.is_empty() {
            frames.push(plain_name(name).to_string());
        }
    }
    finish(&mut labels, &mut frames, &mut value);
    out
}

/// Each function of the folded lines with its cumulative time (once per
/// line it is in), in microseconds.
fn folded_functions(folded: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (stack, us) in folded {
        // Not the comm, nor the state (--states): labels in pprof.
        let frames: BTreeSet<&str> = stack
            .split(';')
            .enumerate()
            .filter(|&(i, f)| i > 1 || (i == 1 && OffState::from_frame(f).is_none()))
            .map(|(_, f)| f)
            .collect();
        for f in frames {
            *out.entry(f.to_string()).or_default() += us;
        }
    }
    out
}

/// `-top` and `-traces` agree with the folded lines of the same profile:
/// the same functions with the same cumulative times, the same stacks with
/// the same times, within the folded lines' rounding (and, for `-traces`,
/// the tool's own: three or four significant digits).
fn check_top_and_traces(go: &Path, file: &Path, folded: &BTreeMap<String, u64>) {
    let top = top_functions(go, file);
    let want = folded_functions(folded);
    let slack_ns = 500 * (folded.len() as u64 + 1);
    for (f, us) in &want {
        let got = top
            .get(f)
            .copied()
            .unwrap_or_else(|| panic!("{f} not in -top"));
        assert!(
            got.abs_diff(us * 1000) <= slack_ns,
            "{f}: -top {got} ns, folded {us} us"
        );
    }
    // Blocks without frames: folded lines of a comm alone.
    let frameless: u64 = folded
        .iter()
        .filter(|(s, _)| !s.contains(';'))
        .map(|(_, us)| us)
        .sum();
    let got = top.get(pprof::NO_FRAMES).copied().unwrap_or(0);
    assert!(
        got.abs_diff(frameless * 1000) <= slack_ns,
        "{got} ns vs {frameless} us"
    );
    // Functions only of stacks too short for a folded line.
    for (f, ns) in &top {
        assert!(
            want.contains_key(f) || f == pprof::NO_FRAMES || *ns < 500,
            "{f}: {ns} ns"
        );
    }
    let traces = traces(go, file);
    for (stack, us) in folded {
        let got = traces
            .get(stack)
            .unwrap_or_else(|| panic!("no trace {stack}"));
        let want = *us as f64 * 1000.0;
        assert!(
            (got - want).abs() <= want * 0.006 + 500.0,
            "{stack}: -traces {got} ns, folded {us} us"
        );
    }
    for (stack, ns) in &traces {
        assert!(
            folded.contains_key(stack) || *ns < 500.0,
            "{stack}: {ns} ns"
        );
    }
}

#[test]
fn pprof_in_go_tool_pprof() {
    let Some(go) = go() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = with_addresses();
    let file = dir.path().join("p.pb.gz");
    for mode in [StackMode::Both, StackMode::UserOnly, StackMode::KernelOnly] {
        std::fs::write(
            &file,
            pprof_bytes(&p, shape(mode), &PprofOptions::default()),
        )
        .unwrap();
        let raw = parse_raw(&go_pprof(&go, &["-raw"], &file));
        assert_eq!(raw.sample_type, "offcpu/nanoseconds[dflt]");
        assert_eq!(raw_as_folded(&raw), folded_map(&p, shape(mode)), "{mode:?}");
        check_top_and_traces(&go, &file, &folded_map(&p, shape(mode)));
        // Nanoseconds, unrounded: the block of 400 ns is there too.
        assert_eq!(top_total_ns(&go, &file), p.total_ns());
    }

    // Mappings: each file with its build id, then the kernel's.
    std::fs::write(
        &file,
        pprof_bytes(&p, Shape::default(), &PprofOptions::default()),
    )
    .unwrap();
    let raw = parse_raw(&go_pprof(&go, &["-raw"], &file));
    // Dated by the window.
    assert_eq!(raw.time, "2023-11-14 22:13:20 +0000 UTC");
    assert_eq!(raw.duration, "5s");
    // (pprof orders them as it likes: the main program first.)
    let mapping = |id: u64| -> &str {
        let prefix = format!("{id}: ");
        raw.mappings
            .iter()
            .find(|m| m.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no mapping {id} in {:?}", raw.mappings))
    };
    assert_eq!(raw.mappings.len(), 3, "{:?}", raw.mappings);
    for want in [
        "/usr/bin/app abcd0123 [FN][IN]",
        "/usr/lib/x86_64-linux-gnu/libc.so.6 93ac61ec [FN]",
        "[kernel.kallsyms]  [FN]",
    ] {
        assert!(
            raw.mappings.iter().any(|m| m.ends_with(want)),
            "no {want:?} in {:?}",
            raw.mappings
        );
    }
    // The inlined function and the one it is inlined into: one location.
    let (addr, mapping_id, names) = raw
        .locations
        .values()
        .find(|l| l.2.contains(&"worker_sleep".to_string()))
        .unwrap();
    assert_eq!(names, &["sleep_once", "worker_sleep"]);
    assert!(mapping(*mapping_id).contains("/usr/bin/app"));
    let worker_sleep = p.samples.iter().find_map(|s| match &s.user {
        Part::Frames(f) => f.iter().find(|f| &*f.name == "worker_sleep"),
        _ => None,
    });
    assert_eq!(Some(*addr), worker_sleep.map(|f| f.addr));
    // Kernel addresses kept, in the kernel's mapping.
    let schedule = raw
        .locations
        .values()
        .find(|l| l.2 == ["__schedule"])
        .unwrap();
    assert!(schedule.0 >= 0xffff_ffff_8100_0000);
    assert!(mapping(schedule.1).contains("[kernel.kallsyms]"));
    // User frames' addresses are offsets in their file.
    let poll = raw.locations.values().find(|l| l.2 == ["poll"]).unwrap();
    assert!(poll.0 < 0x2000 && mapping(poll.1).contains("libc.so.6"));

    // Labels, with thread ids; Parca's name for the sample type.
    let opts = PprofOptions {
        sample_type: SampleType::Wallclock,
        thread_ids: true,
        on_cpu: false,
    };
    std::fs::write(&file, pprof_bytes(&p, Shape::default(), &opts)).unwrap();
    let raw = parse_raw(&go_pprof(&go, &["-raw"], &file));
    assert_eq!(raw.sample_type, "wallclock/nanoseconds[dflt]");
    let t = tags(&go, &file);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(t["comm"], set(&["app", "kworker/0:1", "lost", "tiny"]));
    assert_eq!(t["pid"], set(&["100", "102", "103", "104", "105", "7"]));
    assert_eq!(
        t["thread_id"],
        set(&["100", "101", "102", "103", "104", "105", "7"])
    );
}

/// The `speedscope` npm package's directory (its app and schema).
fn speedscope_package() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("npm").args(["root", "-g"]).output() {
        let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !root.is_empty() {
            candidates.push(PathBuf::from(root).join("speedscope/package.json"));
        }
    }
    candidates.push("/usr/lib/node_modules/speedscope/package.json".into());
    candidates.push("/usr/local/lib/node_modules/speedscope/package.json".into());
    let found = require_tool("package.json of the speedscope npm package", &candidates);
    found.map(|p| p.parent().unwrap().to_path_buf())
}

fn jsonschema() -> Option<PathBuf> {
    require_tool("jsonschema", &["/usr/bin/jsonschema".into()])
}

/// Validates `doc` against speedscope's schema with the jsonschema tool;
/// its verdict and what it said.
fn validate(tool: &Path, package: &Path, doc: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let instance = dir.path().join("p.speedscope.json");
    std::fs::write(&instance, doc).unwrap();
    let out = Command::new(tool)
        .arg("-i")
        .arg(&instance)
        .arg(package.join("dist/release/file-format-schema.json"))
        .output()
        .expect("run jsonschema");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Total weight per thread name (the profile's name up to ` (`), in
/// microseconds.
fn speedscope_totals(doc: &serde_json::Value) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for p in doc["profiles"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let comm = name[..name.rfind(" (").unwrap()].to_string();
        let sum: f64 = p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_f64().unwrap())
            .sum();
        *out.entry(comm).or_default() += sum;
    }
    out
}

#[test]
fn speedscope_matches_its_schema() {
    let (Some(tool), Some(package)) = (jsonschema(), speedscope_package()) else {
        return;
    };
    for opts in [
        SpeedscopeOptions::default(),
        SpeedscopeOptions { per_process: true },
    ] {
        let doc = speedscope_text(&with_addresses(), &opts);
        let (ok, said) = validate(&tool, &package, &doc);
        assert!(ok, "{said}");
        // The validator does reject what the schema forbids.
        let broken = doc.replacen("\"type\":\"sampled\"", "\"type\":\"sample\"", 1);
        assert!(!validate(&tool, &package, &broken).0);

        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["$schema"], speedscope::SCHEMA);
        let frames = v["shared"]["frames"].as_array().unwrap();
        // Shared, each once.
        let distinct: BTreeSet<String> = frames.iter().map(|f| f.to_string()).collect();
        assert_eq!(distinct.len(), frames.len());
        for p in v["profiles"].as_array().unwrap() {
            assert_eq!(p["unit"], "microseconds");
            for w in p["weights"].as_array().unwrap() {
                assert!(w.as_f64().unwrap() > 0.0);
            }
        }
    }

    // One profile per thread, root first, weights to the nanosecond.
    let v: serde_json::Value = serde_json::from_str(&speedscope_text(
        &with_addresses(),
        &SpeedscopeOptions::default(),
    ))
    .unwrap();
    let profiles = v["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 7);
    assert_eq!(profiles[0]["name"], "app (100)");
    assert_eq!(profiles[0]["weights"][0].as_f64(), Some(2_000_400.0));
    let frames = v["shared"]["frames"].as_array().unwrap();
    let names: Vec<&str> = profiles[0]["samples"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            frames[i.as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(
        names,
        [
            "start_thread",
            "worker_sleep",
            "sleep_once",
            "clock_nanosleep",
            "hrtimer_nanosleep",
            "do_nanosleep",
            "schedule",
            "__schedule"
        ]
    );
    let tiny = profiles.iter().find(|p| p["name"] == "tiny (105)").unwrap();
    assert_eq!(tiny["weights"][0].as_f64(), Some(0.4));
}

/// Serves `dir` and `profile` (as `/profile.speedscope.json`) on a
/// loopback port, until the process exits; returns the base URL.
fn serve(dir: PathBuf, profile: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // The rest of the head, unread.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let path = path.split(['?', '#']).next().unwrap_or("/");
            let body = if path == "/profile.speedscope.json" {
                Some(profile.clone())
            } else {
                let name = path.trim_start_matches('/');
                let name = if name.is_empty() { "index.html" } else { name };
                (!name.contains("..") && !name.contains('/'))
                    .then(|| std::fs::read(dir.join(name)).ok())
                    .flatten()
            };
            let kind = match path.rsplit('.').next() {
                Some("html") | None => "text/html",
                Some("js") => "text/javascript",
                Some("css") => "text/css",
                Some("json") => "application/json",
                Some("wasm") => "application/wasm",
                Some("png") => "image/png",
                Some("woff2") => "font/woff2",
                _ => "application/octet-stream",
            };
            let _ = match body {
                Some(b) => write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .and_then(|()| conn.write_all(&b)),
                None => write!(conn, "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
            };
        }
    });
    url
}

/// What speedscope itself logs on a good load; anything else it logs is
/// taken for a problem.
fn benign(message: &str) -> bool {
    [
        "\"speedscope v",
        "\"WebGL initialized.",
        "\"Importing as speedscope json file\"",
        "\"import: ",
        "GL Driver Message",
        "GPU stall due to ReadPixels",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Opens `doc` in speedscope's app (from the npm package) in headless
/// Chromium, in its sandwich view (a table of the functions); returns the
/// page as rendered and what it logged.
fn open_in_speedscope(chromium: &Path, package: &Path, doc: &str) -> (String, Vec<String>) {
    let base = serve(package.join("dist/release"), doc.as_bytes().to_vec());
    let profile_url = format!("{base}/profile.speedscope.json").replace(':', "%3A");
    let url = format!("{base}/index.html#profileURL={profile_url}&view=sandwich");
    let user_dir = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-unsafe-swiftshader",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,800",
            // Until the profile is fetched and drawn.
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", user_dir.path().display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE"))
        .map(str::to_string)
        .collect();
    (String::from_utf8(out.stdout).unwrap(), log)
}

/// A real run written three ways at once (`-o` three times): the pprof
/// profile read by `go tool pprof` has exactly the stacks, totals and
/// labels of the folded output; the speedscope file validates, has the
/// same time per thread name, and opens in speedscope's app showing the
/// workload's functions.
#[test]
fn e2e_pprof_and_speedscope_of_one_run() {
    if !require_root() {
        return;
    }
    let (Some(go), Some(tool), Some(package), Some(chromium)) = (
        go(),
        jsonschema(),
        speedscope_package(),
        require_tool("chromium", &["/usr/bin/chromium".into()]),
    ) else {
        return;
    };
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let folded_path = dir.path().join("out.folded");
    let pprof_path = dir.path().join("out.pb.gz");
    let speedscope_path = dir.path().join("out.speedscope.json");
    let pid;
    {
        let w = Workload::start(&[]);
        pid = w.pid.to_string();
        profile(&[
            "-p",
            &pid,
            "-o",
            folded_path.to_str().unwrap(),
            "-o",
            pprof_path.to_str().unwrap(),
            "-o",
            speedscope_path.to_str().unwrap(),
            "2",
        ]);
    }
    let folded = folded_file(&folded_path);
    assert!(
        folded.keys().any(|s| s.contains("wl_nanosleep_thread")),
        "{folded:?}"
    );

    // pprof: the same stacks and totals, line for line.
    let raw = parse_raw(&go_pprof(&go, &["-raw"], &pprof_path));
    assert_eq!(raw.sample_type, "offcpu/nanoseconds[dflt]");
    let from_pprof = raw_as_folded(&raw);
    assert_eq!(from_pprof, folded);
    // Dated: the window of 2 s.
    assert!(!raw.time.is_empty());
    let secs: f64 = raw
        .duration
        .strip_suffix('s')
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("duration {:?}", raw.duration));
    assert!((1.99..2.1).contains(&secs), "{secs}");
    // -top and -traces: the same functions and stacks, the same times.
    check_top_and_traces(&go, &pprof_path, &folded);
    // Functions inlined at an address are lines of one location.
    assert!(
        raw.locations.values().any(|l| l.2.len() > 1),
        "no location with inlined functions"
    );
    // -top's total is the sum of the lines within their rounding.
    let total_ns = top_total_ns(&go, &pprof_path);
    let folded_us: u64 = folded.values().sum();
    let slack = 500 * raw.samples.len() as u64;
    assert!(
        total_ns.abs_diff(folded_us * 1000) <= slack,
        "{total_ns} ns vs {folded_us} us"
    );
    // Labels: the threads' names and the process.
    let t = tags(&go, &pprof_path);
    let comms: BTreeSet<String> = folded
        .keys()
        .map(|s| s.split(';').next().unwrap().to_string())
        .collect();
    assert_eq!(t["comm"], comms);
    assert_eq!(t["pid"], BTreeSet::from([pid.clone()]));
    // The workload's file, with the build id binutils reads, and the
    // kernel's mapping.
    let exe = crate::util::blocker_path();
    if let Some(id) = build_id(&exe) {
        let want = format!("{} {id} [FN]", exe.display());
        assert!(
            raw.mappings.iter().any(|m| m.contains(&want)),
            "no {want:?} in {:?}",
            raw.mappings
        );
    }
    assert!(raw.mappings.iter().any(|m| m.contains("[kernel.kallsyms]")));

    // speedscope: valid, the same time per thread name.
    let doc = std::fs::read_to_string(&speedscope_path).unwrap();
    let (ok, said) = validate(&tool, &package, &doc);
    assert!(ok, "{said}");
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let mut per_comm: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (stack, us) in &folded {
        let e = per_comm
            .entry(stack.split(';').next().unwrap().to_string())
            .or_default();
        e.0 += us;
        e.1 += 1;
    }
    let totals = speedscope_totals(&v);
    for (comm, (us, lines)) in &per_comm {
        let got = totals.get(comm).copied().unwrap_or(0.0);
        // Each folded line is rounded once, to the microsecond.
        assert!(
            (got - *us as f64).abs() <= 0.5 * *lines as f64 + 0.001,
            "{comm}: {got} us vs {us} us"
        );
    }

    // With --states, another run: the state labels give the folded lines'
    // state frames.
    let states_folded = dir.path().join("states.folded");
    let states_pprof = dir.path().join("states.pb.gz");
    {
        let w = Workload::start(&[]);
        profile(&[
            "--states",
            "-p",
            &w.pid.to_string(),
            "-o",
            states_folded.to_str().unwrap(),
            "-o",
            states_pprof.to_str().unwrap(),
            "2",
        ]);
    }
    let states_lines = folded_file(&states_folded);
    assert!(
        states_lines
            .keys()
            .any(|l| l.starts_with("wl-pipe;[sleep];")),
        "{states_lines:?}"
    );
    let raw = parse_raw(&go_pprof(&go, &["-raw"], &states_pprof));
    assert_eq!(raw_as_folded(&raw), states_lines);
    assert!(tags(&go, &states_pprof)["state"].contains("sleep"));

    // In speedscope's app: no errors, the workload's functions shown.
    let (dom, log) = open_in_speedscope(&chromium, &package, &doc);
    let bad: Vec<&String> = log.iter().filter(|l| !benign(l)).collect();
    assert!(bad.is_empty(), "speedscope logged: {bad:#?}");
    assert!(
        log.iter()
            .any(|l| l.contains("Importing as speedscope json file")),
        "speedscope did not import the file: {log:#?}"
    );
    assert!(dom.contains("Off-CPU time - speedscope"), "{dom}");
    let first = &v["profiles"][0];
    let frames = v["shared"]["frames"].as_array().unwrap();
    let workload_functions: BTreeSet<&str> = first["samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s.as_array().unwrap())
        .map(|i| {
            frames[i.as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
        })
        .filter(|n| n.starts_with("wl_"))
        .collect();
    assert!(!workload_functions.is_empty(), "{first}");
    for f in &workload_functions {
        assert!(dom.contains(f), "{f} not shown by speedscope");
    }
}

/// Output files by name, and their errors.
#[test]
fn several_outputs_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |args: &[&str]| {
        let out = crate::util::offcputime().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let a = dir.path().join("a.folded");
    let b = dir.path().join("b.pb.gz");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    assert!(bad(&["-f", "-o", a, "-o", b, "1"]).contains("each file's name says its format"));
    assert!(bad(&["-o", a, "-o", "x.dat", "1"]).contains("must say its format"));
    assert!(bad(&["-o", a, "-o", a, "1"]).contains("given twice"));
    assert!(bad(&["-o", a, "-o", "-", "1"]).contains("stdout"));
    assert!(bad(&["--thread-ids", "1"]).contains("--thread-ids is a pprof and OTLP option"));
    assert!(bad(&["-f", "--per-process", "1"]).contains("speedscope option"));
    assert!(bad(&["--format", "pdf", "1"]).contains("invalid value 'pdf'"));
    assert!(bad(&["--format", "pprof", "-f", "1"]).contains("cannot be used with"));
    // Neither file was created.
    assert!(!Path::new(a).exists() && !Path::new(b).exists());

    // Gzipped binary data is not written to a terminal (util-linux's
    // `script` gives the profiler one).
    let Some(script) = require_tool("script", &["/usr/bin/script".into()]) else {
        return;
    };
    let command = format!("{} --format pprof 1", env!("CARGO_BIN_EXE_offcputime"));
    let out = Command::new(script)
        .args(["-qec", &command, "/dev/null"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("a pprof profile is gzipped binary data: write it with -o FILE.pb.gz"),
        "{text}"
    );
}

#[test]
fn formats_by_flag_and_name() {
    use clap::Parser;
    use offcputime::cli::{Args, Format};
    let config = |args: &[&str]| {
        Args::try_parse_from(std::iter::once("offcputime").chain(args.iter().copied()))
            .unwrap()
            .into_config()
            .unwrap()
    };
    assert!(matches!(
        config(&["-o", "x.pb.gz"]).format,
        Format::Pprof(_)
    ));
    assert!(matches!(
        config(&["-o", "x.Speedscope.JSON"]).format,
        Format::Speedscope(_)
    ));
    assert_eq!(config(&["-o", "x.folded"]).format, Format::Folded);
    assert_eq!(config(&["-o", "x.txt"]).format, Format::Text);
    assert_eq!(config(&["-o", "x.json"]).format, Format::Text);
    // A flag says otherwise.
    assert_eq!(
        config(&["--format", "folded", "-o", "x.pb.gz"]).format,
        Format::Folded
    );
    assert_eq!(config(&["--format", "report"]).format, Format::Text);
    let c = config(&[
        "--format",
        "pprof",
        "--pprof-sample-type",
        "wallclock",
        "--thread-ids",
    ]);
    assert_eq!(
        c.format,
        Format::Pprof(PprofOptions {
            sample_type: SampleType::Wallclock,
            thread_ids: true,
            on_cpu: false,
        })
    );
    let c = config(&["--format", "speedscope", "--per-process"]);
    assert_eq!(
        c.format,
        Format::Speedscope(SpeedscopeOptions { per_process: true })
    );
    // Several files, each by its name; flame graph options reach the SVG.
    let c = config(&["-o", "a.svg", "-o", "b.pb.gz", "--title", "T", "-p", "7"]);
    let formats: Vec<&Format> = c.outputs().map(|(_, f)| f).collect();
    assert_eq!(formats.len(), 2);
    let Format::Svg(o) = formats[0] else {
        panic!("{formats:?}")
    };
    assert_eq!(o.title, "T");
    assert_eq!(o.subtitle.as_deref(), Some("PID 7, user + kernel stacks"));
    assert!(matches!(formats[1], Format::Pprof(_)));
}

/// With `--states`, the state is a pprof label and a speedscope frame: the
/// folded lines' state frame either way.
#[test]
fn states_as_labels_and_frames() {
    let p = crate::states::synthetic_states();
    if let Some(go) = go() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("states.pb.gz");
        std::fs::write(
            &file,
            pprof_bytes(&p, Shape::default(), &PprofOptions::default()),
        )
        .unwrap();
        let raw = parse_raw(&go_pprof(&go, &["-raw"], &file));
        let folded = folded_map(&p, Shape::default());
        assert!(folded.keys().any(|l| l.starts_with("app;[runqueue];")));
        assert_eq!(raw_as_folded(&raw), folded);
        check_top_and_traces(&go, &file, &folded);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            tags(&go, &file)["state"],
            set(&["blocked", "io", "runqueue", "sleep", "stopped"])
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&speedscope_text(&p, &SpeedscopeOptions::default())).unwrap();
    let frames = v["shared"]["frames"].as_array().unwrap();
    let app = v["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "app (100)")
        .unwrap();
    let roots: BTreeMap<&str, f64> = app["samples"]
        .as_array()
        .unwrap()
        .iter()
        .zip(app["weights"].as_array().unwrap())
        .map(|(s, w)| {
            let root = s[0].as_u64().unwrap() as usize;
            (frames[root]["name"].as_str().unwrap(), w.as_f64().unwrap())
        })
        .collect();
    assert_eq!(
        roots,
        BTreeMap::from([("[runqueue]", 400.0), ("[sleep]", 2_000_000.0)])
    );
}
