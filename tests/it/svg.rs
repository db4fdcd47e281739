//! Flame graphs: the SVG that `--svg` writes, read back as XML and checked
//! against the folded stacks of the same profile, against the flame-graph
//! tools people feed `-f` output to, and in a real browser.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use offcputime::output::svg::{self, SvgOptions};
use offcputime::output::{folded, Shape};
use offcputime::profile::{Profile, StackMode};

use crate::golden::{check, synthetic};
use crate::util::*;

const DELIMITED: Shape = Shape {
    mode: StackMode::Both,
    delimited: true,
    per_container: false,
};

fn render(profile: &Profile, shape: Shape, opts: &SvgOptions) -> String {
    let mut out = Vec::new();
    svg::write(profile, shape, opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn folded_text(profile: &Profile, shape: Shape) -> String {
    let mut out = Vec::new();
    folded::write(profile, shape, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Every frame a flame graph of these folded lines must draw, worked out
/// here independently of any renderer: one per distinct stack prefix, with
/// the summed time of the lines under it, plus the root "all".
fn expected_frames(folded: &str) -> Vec<(String, u64)> {
    let mut prefixes: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    let mut total = 0;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        for depth in 1..=frames.len() {
            *prefixes.entry(frames[..depth].to_vec()).or_default() += n;
        }
        total += n;
    }
    let mut out: Vec<(String, u64)> = prefixes
        .into_iter()
        .map(|(k, v)| (k.last().unwrap().to_string(), v))
        .collect();
    out.push(("all".to_string(), total));
    out.sort();
    out
}

/// The synthetic profile's graph with every frame drawn and a fixed width.
fn full_options() -> SvgOptions {
    SvgOptions {
        subtitle: Some("synthetic profile".into()),
        width: Some(1200),
        min_width: 0.0,
        ..SvgOptions::default()
    }
}

fn is_kernel_frame(name: &str) -> bool {
    [
        "__schedule",
        "schedule",
        "do_nanosleep",
        "hrtimer_nanosleep",
        "pipe_read",
        "vfs_read",
        "worker_thread",
        "kthread",
        "futex_wait",
        folded::MISSED_KERNEL,
    ]
    .contains(&name)
}

#[test]
fn golden_svg() {
    let text = render(&synthetic(), DELIMITED, &full_options());
    check("synthetic-delimited.svg", &text);
    // Same stacks, same colours, byte for byte.
    assert_eq!(text, render(&synthetic(), DELIMITED, &full_options()));

    let g = parse_svg(&text);
    assert_eq!(g.texts["title"], "Off-CPU Time Flame Graph");
    assert_eq!(g.texts["subtitle"], "synthetic profile");
    assert_eq!(g.width, Some(1200.0));
    assert!(text.contains("fluiddrawing = false"));

    // The frames and times that -f gives for the same profile.
    let folded = folded_text(&synthetic(), DELIMITED);
    assert_eq!(g.frame_set(), expected_frames(&folded));
    let total = g.total_us();
    assert_eq!(total, 3_000_500 + 1_500 + 250 + 3 + 2);

    let normal_height = g.frame("all").height;
    for f in &g.frames {
        // Widths in percent of the total, as inferno prints them (4 decimals).
        let expected = f.us as f64 * 100.0 / total as f64;
        assert!(
            (f.width - expected).abs() < 0.0002,
            "{}: width {}% for {} of {total} us",
            f.name,
            f.width,
            f.us
        );
        let (r, _, b) = f.fill;
        if f.name == "-" {
            assert!(f.height < normal_height / 3.0, "separator is thin: {f:?}");
            assert!(f.label_hidden, "separator has no label: {f:?}");
        } else if is_kernel_frame(&f.name) {
            assert_eq!(f.height, normal_height);
            assert!(r > b, "kernel frame {} is orange: {:?}", f.name, f.fill);
        } else {
            assert_eq!(f.height, normal_height);
            assert!(b > r, "user frame {} is blue: {:?}", f.name, f.fill);
        }
    }
    assert!(g.frames.iter().any(|f| f.name == "-"));
}

#[test]
fn default_options() {
    let opts = SvgOptions::default();
    let text = render(&synthetic(), Shape::default(), &opts);
    let g = parse_svg(&text);
    assert_eq!(g.texts["title"], "Off-CPU Time Flame Graph");
    assert!(!g.texts.contains_key("subtitle"));
    // Fluid width: the viewer's script fits it to the window.
    assert!(text.contains("fluiddrawing = true"));
    // No delimiter without -d.
    assert!(g.frames.iter().all(|f| f.name != "-"));
    // Frames under 0.01% of the total are left out by default.
    assert!(g.frames.iter().all(|f| f.name != "futex_wait"));
    assert_eq!(g.total_us(), 3_002_255);
}

#[test]
fn inverted_and_reversed() {
    let base = full_options();
    let normal = parse_svg(&render(&synthetic(), DELIMITED, &base));
    let inverted = parse_svg(&render(
        &synthetic(),
        DELIMITED,
        &SvgOptions {
            inverted: true,
            ..base.clone()
        },
    ));
    // A flame graph grows up from "all"; an icicle graph hangs down from it.
    let top = |g: &Svg| g.frames.iter().map(|f| f.y).fold(f64::MAX, f64::min);
    let bottom = |g: &Svg| g.frames.iter().map(|f| f.y).fold(f64::MIN, f64::max);
    assert_eq!(normal.frame("all").y, bottom(&normal));
    assert_eq!(inverted.frame("all").y, top(&inverted));
    assert_eq!(normal.frame_set(), inverted.frame_set());

    // Reversed, the innermost frame sits on the root: every stack of the
    // synthetic profile ends in __schedule except the missed kernel ones.
    let reversed = parse_svg(&render(
        &synthetic(),
        DELIMITED,
        &SvgOptions {
            reverse: true,
            ..base
        },
    ));
    let all_y = reversed.frame("all").y;
    let mut first: Vec<&str> = reversed
        .frames
        .iter()
        .filter(|f| f.y < all_y && f.y >= all_y - 20.0)
        .map(|f| f.name.as_str())
        .collect();
    first.sort();
    assert_eq!(first, ["[Missed Kernel Stack]", "__schedule"]);
    assert_eq!(reversed.frame("__schedule").us, 3_000_500 + 1_500 + 250 + 3);
}

#[test]
fn palettes_keep_kernel_frames_apart() {
    let with = |colors: &str| {
        let opts = SvgOptions {
            palette: svg::parse_palette(colors).unwrap(),
            ..full_options()
        };
        parse_svg(&render(&synthetic(), DELIMITED, &opts))
    };
    // A warm user palette: kernel frames turn aqua (green and blue over red).
    let hot = with("hot");
    let sched = hot.frame("__schedule").fill;
    assert!(sched.1 > sched.0 && sched.2 > sched.0, "{sched:?}");
    let user = hot.frame("worker_sleep").fill;
    assert!(user.0 > user.2, "{user:?}");
    // A palette that knows the kernel annotation colours it itself.
    let java = with("java");
    let sched = java.frame("__schedule").fill;
    assert!(sched.0 > sched.2, "{sched:?}");
    assert!(svg::parse_palette("plaid").is_err());
}

/// inferno's own command-line tool, given our folded output, draws the same
/// frames with the same times as `--svg` does from the profile.
#[test]
fn same_frames_as_inferno_flamegraph() {
    let Some(tool) = require_tool("inferno-flamegraph", &[]) else {
        return;
    };
    for shape in [Shape::default(), DELIMITED] {
        let folded = folded_text(&synthetic(), shape);
        let theirs = parse_svg(&run_tool(
            &tool,
            &["--minwidth", "0", "--countname", "us"],
            &folded,
        ));
        let ours = parse_svg(&render(&synthetic(), shape, &full_options()));
        assert_eq!(theirs.frame_set(), ours.frame_set());
    }
}

/// Runs a flame-graph tool with `input` on stdin; returns its SVG.
pub fn run_tool(tool: &Path, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut cmd = if tool.extension().is_some_and(|e| e == "pl") {
        let mut c = Command::new("perl");
        c.arg(tool);
        c
    } else {
        Command::new(tool)
    };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", tool.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} failed: {}",
        tool.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A frame set with '<' and '>' written as '(' and ')', as this
/// flamegraph.pl writes them in names.
pub fn same_brackets(set: Vec<(String, u64)>) -> Vec<(String, u64)> {
    let mut v: Vec<_> = set
        .into_iter()
        .map(|(n, us)| (n.replace('<', "(").replace('>', ")"), us))
        .collect();
    v.sort();
    v
}

pub fn flamegraph_pl() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("FLAMEGRAPH_PL") {
        candidates.push(PathBuf::from(p));
    }
    // Debian's libdevel-nytprof-perl ships FlameGraph's script.
    candidates.push("/usr/share/perl5/Devel/NYTProf/flamegraph.pl".into());
    require_tool("flamegraph.pl", &candidates)
}

pub(crate) fn chromium() -> Option<PathBuf> {
    require_tool("chromium", &["/usr/bin/chromium".into()])
}

/// Loads `url` in headless Chromium; returns the DOM after the page's
/// scripts ran, and the messages the page logged.
pub(crate) fn browse(chromium: &Path, url: &str) -> (String, String) {
    let profile_dir = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,800",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.path().display()))
        .arg("--dump-dom")
        .arg(url)
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
        .collect::<Vec<_>>()
        .join("\n");
    (String::from_utf8(out.stdout).unwrap(), log)
}

/// A real run: the folded output goes through FlameGraph's flamegraph.pl
/// and inferno-flamegraph, which must draw the same frames; the `--svg`
/// output opens in Chromium, where search and zoom work.
#[test]
fn e2e_flame_graphs_in_the_tools_and_a_browser() {
    if !require_root() {
        return;
    }
    let (Some(pl), Some(inferno), Some(chromium)) = (
        flamegraph_pl(),
        require_tool("inferno-flamegraph", &[]),
        chromium(),
    ) else {
        return;
    };
    // Serial throughout: Chromium's start-up load would upset the accuracy
    // of the other end-to-end tests.
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let folded_path = dir.path().join("out.folded");
    let svg_path = dir.path().join("offcpu.svg");
    {
        let w = Workload::start(&[]);
        let pid = w.pid.to_string();
        profile(&[
            "-p",
            &pid,
            "-d",
            "-f",
            "-o",
            folded_path.to_str().unwrap(),
            "2",
        ]);
        // -o with an .svg name writes a flame graph.
        profile(&["-p", &pid, "-d", "-o", svg_path.to_str().unwrap(), "2"]);
    }

    // flamegraph.pl and inferno-flamegraph take the folded lines unchanged.
    let folded = std::fs::read_to_string(&folded_path).unwrap();
    let pl_svg = parse_svg(&run_tool(
        &pl,
        &["--minwidth=0", "--countname=us", "--colors=io"],
        &folded,
    ));
    let inferno_svg = parse_svg(&run_tool(
        &inferno,
        &["--minwidth", "0", "--countname", "us", "--colors", "io"],
        &folded,
    ));
    assert_eq!(
        same_brackets(pl_svg.frame_set()),
        same_brackets(inferno_svg.frame_set())
    );
    assert_eq!(inferno_svg.frame_set(), expected_frames(&folded));
    for g in [&pl_svg, &inferno_svg] {
        let sleep = g.frame("wl_nanosleep_thread").us;
        assert!(sleep > 1_960_000 && sleep <= 2_010_000, "{sleep}");
    }

    // Our own flame graph of the second run.
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let ours = parse_svg(&text);
    assert_eq!(ours.texts["title"], "Off-CPU Time Flame Graph");
    assert!(
        ours.texts["subtitle"].starts_with("PID "),
        "{:?}",
        ours.texts
    );
    let sleep = ours.frame("wl_nanosleep_thread");
    assert!(sleep.us > 1_960_000 && sleep.us <= 2_010_000, "{sleep:?}");
    assert!(ours.frame("do_nanosleep").fill.0 > ours.frame("do_nanosleep").fill.2);

    // In the browser: the script runs without errors, a search from the
    // URL finds the workload's frames, and a zoom from the URL hides the
    // frames outside the zoomed one.
    let url = format!("file://{}", svg_path.display());
    let (dom, log) = browse(&chromium, &format!("{url}?s=wl_nanosleep_thread"));
    assert!(log.is_empty(), "the page logged: {log}");
    let page = parse_svg(&dom);
    let matched = &page.texts["matched"];
    let pct: f64 = matched
        .trim()
        .strip_prefix("Matched: ")
        .and_then(|m| m.strip_suffix('%'))
        .unwrap_or_else(|| panic!("search did not run: {matched:?}"))
        .parse()
        .unwrap();
    let expected = sleep.us as f64 * 100.0 / ours.total_us() as f64;
    assert!(
        (pct - expected).abs() < 0.2,
        "matched {pct}%, frame is {expected}%"
    );

    let sleep_x = text
        .split("<g>")
        .find(|g| g.contains("<title>wl_nanosleep_thread ("))
        .and_then(|g| g.split("fg:x=\"").nth(1))
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    let (dom, log) = browse(
        &chromium,
        &format!("{url}?x={sleep_x}&y={}", sleep.y as u64),
    );
    assert!(log.is_empty(), "the page logged: {log}");
    let page = parse_svg(&dom);
    assert!(!page.classes["unzoom"].contains("hide"), "zoomed in");
    let zoomed = page.frame("wl_nanosleep_thread");
    assert!(zoomed.width > 99.9 && zoomed.x < 0.1, "{zoomed:?}");
    assert!(page.frame("wl_pipe_thread").class.contains("hide"));
    assert!(page
        .frames
        .iter()
        .any(|f| f.name == "do_nanosleep" && !f.class.contains("hide")));
}
