//! The OTLP output, read by the `opentelemetry-proto` package's own classes
//! (PyPI; `tests/otlp_read.py` resolves every index and checks what the
//! profiles signal requires): the same stacks and totals as the folded
//! output of the same profile, thread names and states as attributes,
//! kernel and user frames with their mappings and build ids, one profile
//! per interval; a golden file (`BLESS=1`) of the synthetic profile.
//! `--push-otlp` against an OTLP/HTTP receiver in the test: each interval
//! received, and with the receiver down, slow or mute, nothing lost that
//! stderr does not say.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use offcputime::output::otlp::{self, OtlpOptions};
use offcputime::output::pprof::PprofOptions;
use offcputime::output::{folded, Shape};
use offcputime::profile::{Profile, Window};

use crate::formats::with_addresses;
use crate::golden::check;
use crate::push::{Request, Server};
use crate::util::{is_time_line, offcputime, profile, python_with, require_root, serial, Workload};

/// Where `scripts/setup --test` installs opentelemetry-proto.
const VENV_PYTHON: &str = "/opt/offcputime-test/otlp-venv/bin/python3";

/// A Python that imports opentelemetry-proto's profiles classes. Outside
/// CI, none skips the test; under CI=true it fails.
pub(crate) fn otlp_python() -> Option<PathBuf> {
    python_with(
        VENV_PYTHON,
        "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        "opentelemetry-proto",
    )
}

/// `tests/otlp_read.py FILES`: each file's request as JSON; the script must
/// accept them.
pub(crate) fn read_otlp(python: &Path, files: &[&Path]) -> Vec<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_read.py");
    let out = Command::new(python)
        .arg(script)
        .args(files)
        .output()
        .expect("run tests/otlp_read.py");
    assert!(
        out.status.success(),
        "opentelemetry-proto did not accept {files:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every sample of a request as a folded line (`thread name;[state;]frames
/// outermost first`), nanoseconds summed per line then rounded to
/// microseconds as the folded output rounds them.
pub(crate) fn as_folded(request: &serde_json::Value) -> BTreeMap<String, u64> {
    let mut ns: BTreeMap<String, u64> = BTreeMap::new();
    for r in request["resources"].as_array().unwrap() {
        for p in r["profiles"].as_array().unwrap() {
            for (line, v) in profile_lines(p) {
                *ns.entry(line).or_default() += v;
            }
        }
    }
    ns.into_iter()
        .map(|(k, v)| (k, (v + 500) / 1000))
        .filter(|&(_, us)| us > 0)
        .collect()
}

/// One profile's samples as folded lines and nanoseconds.
fn profile_lines(p: &serde_json::Value) -> Vec<(String, u64)> {
    p["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let attrs = &s["attributes"];
            let mut parts = vec![attrs["thread.name"].as_str().unwrap().to_string()];
            if let Some(state) = attrs["thread.state"].as_str() {
                parts.push(format!("[{state}]"));
            }
            for f in s["frames"].as_array().unwrap() {
                parts.push(f["name"].as_str().unwrap().replace(';', ":"));
            }
            (parts.join(";"), s["value"].as_u64().unwrap())
        })
        .collect()
}

/// Total nanoseconds of each profile, in the order of the request.
fn profile_totals(request: &serde_json::Value) -> Vec<u64> {
    let mut by_time: BTreeMap<u64, u64> = BTreeMap::new();
    for r in request["resources"].as_array().unwrap() {
        for p in r["profiles"].as_array().unwrap() {
            let total: u64 = profile_lines(p).iter().map(|l| l.1).sum();
            *by_time
                .entry(p["time_unix_nano"].as_u64().unwrap())
                .or_default() += total;
        }
    }
    by_time.into_values().collect()
}

/// The folded lines of a profile, each thread named as `thread.name`
/// names it: by its runtime's name where it has one (a JVM's thread name),
/// where the folded output has its command.
fn folded_map(p: &Profile) -> BTreeMap<String, u64> {
    let mut p = p.clone();
    for s in &mut p.samples {
        s.comm = s.thread_name().to_string();
    }
    folded::lines(&p, Shape::default(), false)
        .into_iter()
        .collect()
}

fn options(thread_ids: bool) -> OtlpOptions {
    OtlpOptions {
        samples: PprofOptions {
            thread_ids,
            ..Default::default()
        },
        resource: vec![("host.name".into(), "testhost".into())],
    }
}

fn otlp_bytes(p: &Profile, opts: &OtlpOptions) -> Vec<u8> {
    let mut out = Vec::new();
    otlp::write(p, Shape::default(), opts, &mut out).unwrap();
    out
}

#[test]
fn golden_otlp() {
    let message = otlp::build(&with_addresses(), Shape::default(), &options(true));
    // The scope's version is the crate's: not part of what is checked.
    let text = format!("{message:#?}\n")
        .replace(&format!("\"{}\"", env!("CARGO_PKG_VERSION")), "\"VERSION\"");
    check("synthetic.otlp.txt", &text);
}

/// The synthetic profile, as opentelemetry-proto reads it: the folded
/// lines, thread ids, kernel and native frames with their mappings and
/// build ids, and the processes as resources.
#[test]
fn otlp_read_by_opentelemetry_proto() {
    let Some(python) = otlp_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = with_addresses();
    let file = dir.path().join("synthetic.otlp");
    std::fs::write(&file, otlp_bytes(&p, &options(true))).unwrap();
    let got = read_otlp(&python, &[&file]).remove(0);
    assert_eq!(as_folded(&got), folded_map(&p));
    let resources = got["resources"].as_array().unwrap();
    let mut pids = Vec::new();
    for r in resources {
        let a = &r["attributes"];
        assert_eq!(a["host.name"], "testhost");
        assert_eq!(r["scope"], "offcputime");
        let pid = a["process.pid"].as_u64().unwrap();
        pids.push(pid);
        let [p] = &r["profiles"].as_array().unwrap()[..] else {
            panic!("{r}")
        };
        assert_eq!(p["sample_type"], "offcpu/nanoseconds");
        assert_eq!(p["time_unix_nano"], 1_700_000_000_000_000_000u64);
        assert_eq!(p["duration_nano"], 5_000_000_000u64);
        for s in p["samples"].as_array().unwrap() {
            // Threads 100 and 101 are process 100.
            let tid = s["attributes"]["thread.id"].as_u64().unwrap();
            assert!(tid == pid || (pid, tid) == (100, 101), "{s}");
            for f in s["frames"].as_array().unwrap() {
                match f["type"].as_str() {
                    Some("kernel") => {
                        assert_eq!(f["mapping"], "[kernel.kallsyms]");
                        assert!(f["address"].as_u64().unwrap() >= 0xffff_ffff_8100_0000);
                    }
                    Some("native") => {
                        let (path, id) = match f["mapping"].as_str().unwrap() {
                            "/usr/bin/app" => ("/usr/bin/app", "abcd0123"),
                            _ => ("/usr/lib/x86_64-linux-gnu/libc.so.6", "93ac61ec"),
                        };
                        assert_eq!(
                            (f["mapping"].as_str(), f["build_id"].as_str()),
                            (Some(path), Some(id))
                        );
                    }
                    // A lost part's marker: no file, no type.
                    None if f["name"].as_str().unwrap().starts_with("[Missed ") => {
                        assert!(f["mapping"].is_null(), "{f}")
                    }
                    other => panic!("frame type {other:?}: {f}"),
                }
            }
        }
    }
    pids.sort_unstable();
    let mut want: Vec<u64> = p.samples.iter().map(|s| u64::from(s.tgid)).collect();
    want.sort_unstable();
    want.dedup();
    assert_eq!(pids, want, "a resource per process");
    // Functions inlined at an address: the one inlined into first
    // (outermost first), both at that address.
    let frames: Vec<&serde_json::Value> = resources
        .iter()
        .flat_map(|r| r["profiles"][0]["samples"].as_array().unwrap())
        .flat_map(|s| s["frames"].as_array().unwrap())
        .collect();
    let at = frames
        .windows(2)
        .find(|w| w[1]["name"] == "sleep_once")
        .expect("the inlined frame");
    assert_eq!(at[0]["name"], "worker_sleep");
    assert_eq!(at[0]["address"], at[1]["address"]);
}

/// With `--states`, the state is the `thread.state` attribute: the folded
/// lines' state frame.
#[test]
fn otlp_states_as_attributes() {
    let Some(python) = otlp_python() else { return };
    let p = crate::states::synthetic_states();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("states.otlp");
    std::fs::write(&file, otlp_bytes(&p, &options(false))).unwrap();
    let got = read_otlp(&python, &[&file]).remove(0);
    let folded = folded_map(&p);
    assert!(folded.keys().any(|l| l.starts_with("app;[runqueue];")));
    assert_eq!(as_folded(&got), folded);
}

/// Requests written one after another (`-i` into one file) read as one
/// request: a profile per interval, each with its own time, over one
/// dictionary; an interval without samples still has its profile.
#[test]
fn otlp_stream_reads_as_one_request() {
    let Some(python) = otlp_python() else { return };
    let first = with_addresses();
    let mut second = crate::states::synthetic_states();
    second.objects = first.objects.clone();
    second.window = Some(Window {
        start_unix_ns: 1_700_000_005_000_000_000,
        duration_ns: 5_000_000_000,
    });
    let empty = Profile {
        window: Some(Window {
            start_unix_ns: 1_700_000_010_000_000_000,
            duration_ns: 1_000_000_000,
        }),
        ..Default::default()
    };
    let mut stream = otlp::Stream::default();
    let mut bytes = Vec::new();
    for p in [&first, &second, &empty] {
        stream
            .write(p, Shape::default(), &options(false), &mut bytes)
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stream.otlp");
    std::fs::write(&file, &bytes).unwrap();
    let got = read_otlp(&python, &[&file]).remove(0);
    let mut want = folded_map(&first);
    for (k, v) in folded_map(&second) {
        *want.entry(k).or_default() += v;
    }
    assert_eq!(as_folded(&got), want);
    let total = |p: &Profile| p.samples.iter().map(|s| s.total_ns).sum::<u64>();
    assert_eq!(profile_totals(&got), vec![total(&first), total(&second), 0]);
    // The empty interval: one resource, the machine's.
    let last = got["resources"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["profiles"][0]["duration_nano"], 1_000_000_000u64);
    assert!(last["attributes"].get("process.pid").is_none());
}

/// One run writing folded stacks and OTLP: the same stacks and totals,
/// the thread states as attributes, the workload's file with the build id
/// binutils reads, kernel frames in the kernel's mapping; with `-i` into
/// one file, one profile per interval, each the interval's time.
#[test]
fn e2e_otlp_and_folded_of_one_run() {
    if !require_root() {
        return;
    }
    let Some(python) = otlp_python() else { return };
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let folded_path = dir.path().join("out.folded");
    let otlp_path = dir.path().join("out.otlp");
    let w = Workload::start(&[]);
    let pid = w.pid.to_string();
    profile(&[
        "--states",
        "-p",
        &pid,
        "-o",
        folded_path.to_str().unwrap(),
        "-o",
        otlp_path.to_str().unwrap(),
        "2",
    ]);
    let folded = crate::formats::folded_file(&folded_path);
    assert!(
        folded.keys().any(|l| l.starts_with("wl-pipe;[sleep];")),
        "{folded:?}"
    );
    let got = read_otlp(&python, &[&otlp_path]).remove(0);
    assert_eq!(as_folded(&got), folded);
    let [r] = &got["resources"].as_array().unwrap()[..] else {
        panic!("one process traced: {got}")
    };
    let a = &r["attributes"];
    assert_eq!(a["process.pid"].as_u64(), Some(u64::from(w.pid)));
    assert_eq!(a["process.executable.name"], "blocker");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(a["host.name"], host.trim());
    let p = &r["profiles"][0];
    let secs = p["duration_nano"].as_u64().unwrap() as f64 / 1e9;
    assert!((1.99..2.1).contains(&secs), "{secs}");
    let frames: Vec<&serde_json::Value> = p["samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .collect();
    assert!(frames
        .iter()
        .any(|f| f["type"] == "kernel" && f["mapping"] == "[kernel.kallsyms]"));
    let exe = crate::util::blocker_path();
    if let Some(id) = crate::formats::build_id(&exe) {
        assert!(
            frames.iter().any(|f| f["type"] == "native"
                && f["mapping"] == exe.to_str().unwrap()
                && f["build_id"] == id
                && f["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("wl_nanosleep_thread"))),
            "no frame of {} with build id {id}",
            exe.display()
        );
    }

    // -i into one file: a profile per interval; the folded intervals,
    // separated by -T's time lines, have the same lines.
    let iv_folded = dir.path().join("iv.folded");
    let iv_otlp = dir.path().join("iv.otlp");
    let stuck = Workload::start(&["stuck"]);
    profile(&[
        "-T",
        "-i",
        "0.5",
        "-p",
        &stuck.pid.to_string(),
        "-o",
        iv_folded.to_str().unwrap(),
        "-o",
        iv_otlp.to_str().unwrap(),
        "1.6",
    ]);
    let text = std::fs::read_to_string(&iv_folded).unwrap();
    let mut intervals: Vec<BTreeMap<String, u64>> = Vec::new();
    for l in text.lines() {
        if crate::util::is_time_line(l) {
            intervals.push(BTreeMap::new());
        } else {
            let (stack, us) = l.rsplit_once(' ').unwrap();
            *intervals
                .last_mut()
                .unwrap()
                .entry(stack.to_string())
                .or_default() += us.parse::<u64>().unwrap();
        }
    }
    assert_eq!(intervals.len(), 4, "{text}");
    let got = read_otlp(&python, &[&iv_otlp]).remove(0);
    let profiles: Vec<&serde_json::Value> = got["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["profiles"].as_array().unwrap())
        .collect();
    assert_eq!(profiles.len(), 4, "a profile per interval");
    for (k, (p, want)) in profiles.iter().zip(&intervals).enumerate() {
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for (line, ns) in profile_lines(p) {
            *lines.entry(line).or_default() += ns;
        }
        let lines: BTreeMap<String, u64> = lines
            .into_iter()
            .map(|(l, ns)| (l, (ns + 500) / 1000))
            .collect();
        assert_eq!(&lines, want, "interval {}", k + 1);
        let len_ns = if k < 3 { 500_000_000 } else { 100_000_000 };
        assert!(
            p["duration_nano"].as_u64().unwrap().abs_diff(len_ns) < 1_000_000,
            "interval {}: {}",
            k + 1,
            p["duration_nano"]
        );
    }
}

/// `.otlp` means `--format otlp`; with `-i` one file takes every interval;
/// `--thread-ids` and `--pprof-sample-type` reach it; `--snapshot` refuses
/// it.
#[test]
fn otlp_by_name_and_flags() {
    use clap::Parser;
    use offcputime::cli::{Args, Format};
    let parse = |args: &[&str]| {
        Args::try_parse_from(std::iter::once("offcputime").chain(args.iter().copied()))
            .unwrap()
            .into_config()
    };
    assert!(matches!(
        parse(&["-o", "x.OTLP"]).unwrap().format,
        Format::Otlp(_)
    ));
    assert!(matches!(
        parse(&["-i", "1", "-o", "x.otlp"]).unwrap().format,
        Format::Otlp(_)
    ));
    let c = parse(&[
        "--format",
        "otlp",
        "--thread-ids",
        "--pprof-sample-type",
        "wallclock",
    ])
    .unwrap();
    let Format::Otlp(o) = c.format else {
        panic!("{:?}", c.format)
    };
    assert!(o.samples.thread_ids);
    assert_eq!(o.samples.sample_type.name(), "wallclock");
    assert_eq!(o.resource[0].0, "host.name");
    let err = parse(&["--snapshot", "-o", "x.otlp"]).unwrap_err();
    assert!(
        format!("{err:#}").contains("OTLP profiles are of time"),
        "{err:#}"
    );
}

/// The requests' bodies read by opentelemetry-proto, each checked to be
/// an OTLP/HTTP protobuf request at the profiles path.
fn read_received(python: &Path, dir: &Path, got: &[Request]) -> Vec<serde_json::Value> {
    let files: Vec<PathBuf> = got
        .iter()
        .enumerate()
        .map(|(k, req)| {
            assert_eq!(req.path, "/v1development/profiles");
            assert_eq!(req.content_type, "application/x-protobuf");
            let file = dir.join(format!("received-{k}.otlp"));
            std::fs::write(&file, &req.body).unwrap();
            file
        })
        .collect();
    let files: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
    if files.is_empty() {
        return Vec::new();
    }
    read_otlp(python, &files)
}

/// The threads of `blocker stuck`, blocked all along.
const STUCK: u64 = 4;

/// Each request's one profile: its start and the total of its samples,
/// which must be the stuck threads' whole interval.
fn check_stuck_intervals(requests: &[serde_json::Value]) -> Vec<u64> {
    requests
        .iter()
        .map(|r| {
            let [res] = &r["resources"].as_array().unwrap()[..] else {
                panic!("one process: {r}")
            };
            let p = &res["profiles"][0];
            let total: u64 = profile_lines(p).iter().map(|l| l.1).sum();
            let len = p["duration_nano"].as_u64().unwrap();
            assert!(
                total.abs_diff(STUCK * len) < 1000 * STUCK,
                "{total} ns in an interval of {len} ns: {STUCK} threads blocked all along"
            );
            p["time_unix_nano"].as_u64().unwrap()
        })
        .collect()
}

/// `--push-otlp` beside `--push`: every interval arrives at both, the OTLP
/// request at `/v1development/profiles` with `service.name` (`--app`),
/// `host.name` and the `--push-label`s as resource attributes, and the
/// stacks and totals of the file `-o` writes for that interval.
#[test]
fn push_otlp_sends_each_interval() {
    if !require_root() {
        return;
    }
    let Some(python) = otlp_python() else { return };
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let receiver = Server::start(TcpListener::bind("127.0.0.1:0").unwrap());
    let pyroscope = Server::start(TcpListener::bind("127.0.0.1:0").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("iv-{n}.otlp");
    let out = profile(&[
        "-v",
        "-i",
        "0.5",
        "-p",
        &stuck.pid.to_string(),
        "--push-otlp",
        &format!("http://127.0.0.1:{}/", receiver.port),
        "--push",
        &format!("http://127.0.0.1:{}", pyroscope.port),
        "--app",
        "testapp",
        "--push-label",
        "env=ci",
        "-o",
        files.to_str().unwrap(),
        "1.6",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bytes of OTLP) to http://127.0.0.1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bytes of pprof) to http://127.0.0.1"),
        "{stderr}"
    );
    assert_eq!(pyroscope.requests().len(), 4, "{stderr}");
    let got = receiver.requests();
    assert_eq!(got.len(), 4, "{stderr}");
    let requests = read_received(&python, dir.path(), &got);
    let starts = check_stuck_intervals(&requests);
    assert!(
        starts.windows(2).all(|w| w[0] < w[1]),
        "in order: {starts:?}"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for (k, r) in requests.iter().enumerate() {
        let a = &r["resources"][0]["attributes"];
        assert_eq!(a["service.name"], "testapp");
        assert_eq!(a["host.name"], host.trim());
        assert_eq!(a["env"], "ci");
        assert_eq!(a["process.pid"].as_u64(), Some(u64::from(stuck.pid)));
        let file = dir.path().join(format!("iv-{}.otlp", k + 1));
        let written = read_otlp(&python, &[&file]).remove(0);
        assert_eq!(as_folded(r), as_folded(&written), "interval {}", k + 1);
    }
}

/// A receiver down at first, then slow (1.2 s an answer), then quick:
/// tracing does not wait for it, and every interval is received or
/// counted on stderr as not pushed; none twice.
#[test]
fn push_otlp_receiver_down_then_slow() {
    if !require_root() {
        return;
    }
    let Some(python) = otlp_python() else { return };
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let pid = stuck.pid.to_string();
    let mut child = offcputime()
        .args([
            "-v",
            "-T",
            "-i",
            "0.3",
            "-f",
            "-p",
            &pid,
            "--push-otlp",
            &url,
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (first_tx, first) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut at = Vec::new();
        for line in BufReader::new(stdout).lines() {
            if is_time_line(&line.unwrap()) {
                at.push(Instant::now());
                let _ = first_tx.send(());
            }
        }
        at
    });
    // Up once the first interval's push has failed (and been retried).
    let _ = first.recv_timeout(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(600));
    let receiver = Server::slow(TcpListener::bind(("127.0.0.1", port)).unwrap(), |n| {
        if n < 3 {
            Duration::from_millis(1200)
        } else {
            Duration::ZERO
        }
    });
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{stderr}");
    let at = lines.join().unwrap();
    assert_eq!(at.len(), 10, "3 s in 0.3 s intervals: {stderr}");
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] < Duration::from_millis(1500),
            "an interval came {:?} after the one before: tracing waited for the push",
            w[1] - w[0]
        );
    }
    assert!(
        stderr.contains(&format!("pushing an interval to {url} failed")),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let requests = read_received(&python, dir.path(), &receiver.requests());
    let mut starts = check_stuck_intervals(&requests);
    let received = starts.len();
    starts.sort_unstable();
    starts.dedup();
    assert_eq!(starts.len(), received, "an interval received twice");
    if received < 10 {
        assert!(
            stderr.contains(&format!(
                "{} of 10 intervals could not be pushed to {url}",
                10 - received
            )),
            "{received} received: {stderr}"
        );
    } else {
        assert!(stderr.contains("pushed 10 intervals"), "{stderr}");
    }
    // The first interval, pushed while the receiver was down, arrives on
    // a retry (the sixth attempt is 7.75 s after the first), and the slow
    // answers leave time for the rest before the end's deadline.
    assert_eq!(received, 10, "{stderr}");
}

/// A receiver that takes a request and never answers: at the end (5 s
/// deadline) the interval still being sent is counted as not pushed with
/// the ones queued behind it, and the profiler exits in time.
#[test]
fn push_otlp_receiver_that_never_answers() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let receiver = Server::slow(listener, |_| Duration::from_secs(30));
    let started = Instant::now();
    let out = profile(&[
        "-T",
        "-i",
        "0.3",
        "-f",
        "-p",
        &stuck.pid.to_string(),
        "--push-otlp",
        &url,
        "1",
    ]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let printed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| is_time_line(l))
        .count();
    assert_eq!(printed, 4, "{stderr}");
    assert_eq!(receiver.requests().len(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{printed} of {printed} intervals could not be pushed to {url}"
        )),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(12), "the run took {took:?}");
}

/// `--push-otlp` needs `-i` and an http URL; `--app` and `--push-label`
/// name its resources; `--push-api` is `--push`'s; with `--push` both
/// are sent; `--snapshot` takes neither.
#[test]
fn push_otlp_flags() {
    use clap::Parser;
    use offcputime::cli::Args;
    use offcputime::push::PushApi;
    let parse = |args: &[&str]| {
        Args::try_parse_from(std::iter::once("offcputime").chain(args.iter().copied()))
            .unwrap()
            .into_config()
    };
    let err = |args: &[&str]| format!("{:#}", parse(args).unwrap_err());
    assert!(err(&["--push-otlp", "http://h:4318"]).contains("--push-otlp sends each interval"));
    assert!(err(&["-i", "1", "--push-otlp", "https://h"]).contains("--push-otlp https://h"));
    assert!(
        err(&["-i", "1", "--push-otlp", "http://h", "--push-api", "parca"])
            .contains("--push-api says how --push pushes")
    );
    assert!(err(&["--snapshot", "--push-otlp", "http://h"]).contains("--push-otlp is about"));
    let c = parse(&[
        "-i",
        "1",
        "--push-otlp",
        "http://h:4318",
        "--app",
        "web",
        "--push-label",
        "env=ci",
        "--thread-ids",
    ])
    .unwrap();
    let [o] = &c.push[..] else {
        panic!("{:?}", c.push)
    };
    assert_eq!((o.api, o.app.as_str()), (PushApi::Otlp, "web"));
    assert!(o.labels.contains(&("env".into(), "ci".into())));
    assert!(o.pprof.thread_ids);
    let c = parse(&["-i", "1", "--push-otlp", "http://h", "--push", "http://p"]).unwrap();
    let apis: Vec<PushApi> = c.push.iter().map(|o| o.api).collect();
    assert_eq!(apis, [PushApi::Pyroscope, PushApi::Otlp]);
}

/// A receiver that takes each request but answers that it rejected some
/// of its profiles (a partial success): said at the end, with its reason.
#[test]
fn push_otlp_partial_success_is_said() {
    use offcputime::output::otlp_proto::{
        ExportProfilesPartialSuccess, ExportProfilesServiceResponse,
    };
    use prost::Message;
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let answer = ExportProfilesServiceResponse {
        partial_success: Some(ExportProfilesPartialSuccess {
            rejected_profiles: 2,
            error_message: "profile too old".into(),
        }),
    };
    let receiver = Server::answering(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        |_| Duration::ZERO,
        answer.encode_to_vec(),
    );
    let url = format!("http://127.0.0.1:{}", receiver.port);
    let out = profile(&[
        "-i",
        "0.5",
        "-p",
        &stuck.pid.to_string(),
        "--push-otlp",
        &url,
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(receiver.requests().len(), 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{url} rejected 4 profiles of the intervals it took (last reason: profile too old)"
        )),
        "{stderr}"
    );
}
