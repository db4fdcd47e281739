//! `--push URL`: each interval sent to a Pyroscope-compatible ingest
//! endpoint, here a server on the loopback address in the test that keeps
//! what arrives; decoded with `go tool pprof`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::formats::{go, top_total_ns};
use crate::util::*;

/// One request as the server got it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) path: String,
    pub(crate) query: BTreeMap<String, String>,
    pub(crate) content_type: String,
    /// Multipart parts by name (a JSON body whole as `json`).
    pub(crate) parts: BTreeMap<String, Vec<u8>>,
    pub(crate) body: Vec<u8>,
}

/// An ingest endpoint on 127.0.0.1 that answers 200 to every request and
/// keeps it.
pub(crate) struct Server {
    got: Arc<Mutex<Vec<Request>>>,
    pub(crate) port: u16,
}

impl Server {
    pub(crate) fn start(listener: TcpListener) -> Server {
        Server::slow(listener, |_| Duration::ZERO)
    }

    /// A server that answers the `n`th request (from 0) `delay(n)` after
    /// it came, each connection on a thread of its own.
    pub(crate) fn slow(
        listener: TcpListener,
        delay: impl Fn(usize) -> Duration + Send + 'static,
    ) -> Server {
        Server::answering(listener, delay, Vec::new())
    }

    /// A slow server (see [`Server::slow`]) whose every 200 has `body`.
    pub(crate) fn answering(
        listener: TcpListener,
        delay: impl Fn(usize) -> Duration + Send + 'static,
        body: Vec<u8>,
    ) -> Server {
        let body = Arc::new(body);
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let keep = got.clone();
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                let Ok(mut conn) = conn else { continue };
                let (keep, wait, body) = (keep.clone(), delay(n), body.clone());
                std::thread::spawn(move || {
                    if let Some(req) = read_request(&mut conn) {
                        keep.lock().unwrap().push(req);
                        std::thread::sleep(wait);
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = conn.write_all(head.as_bytes());
                        let _ = conn.write_all(&body);
                    }
                });
            }
        });
        Server { got, port }
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("percent escape"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn read_request(conn: &mut std::net::TcpStream) -> Option<Request> {
    let mut r = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let target = line.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    let mut boundary = String::new();
    let mut content_type = String::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        match k.to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().ok()?,
            "content-type" => {
                content_type = v.trim().to_string();
                boundary = v.split("boundary=").nth(1).unwrap_or("").trim().to_string()
            }
            _ => {}
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let query = q
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), unescape(v)))
        .collect();
    // multipart/form-data: parts between "--boundary" lines; JSON whole.
    let mut parts = BTreeMap::new();
    if content_type == "application/json" {
        parts.insert("json".to_string(), body.clone());
    }
    if boundary.is_empty() {
        return Some(Request {
            path: path.to_string(),
            query,
            content_type,
            parts,
            body,
        });
    }
    let sep = format!("--{boundary}").into_bytes();
    let mut rest = &body[..];
    while let Some(at) = find(rest, &sep) {
        rest = &rest[at + sep.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&rest[..head_end]).to_string();
        let name = head.split("name=\"").nth(1)?.split('"').next()?.to_string();
        let data_start = head_end + 4;
        let data_end = data_start + find(&rest[data_start..], &sep)? - 2;
        parts.insert(name, rest[data_start..data_end].to_vec());
        rest = &rest[data_end..];
    }
    Some(Request {
        path: path.to_string(),
        query,
        content_type,
        parts,
        body,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

const STUCK: usize = 4;

/// Every interval arrives, named and dated, with the very profile `-o`
/// writes for it, and `go tool pprof` reads in it each interval's time.
#[test]
fn push_sends_each_interval() {
    if !require_root() {
        return;
    }
    let Some(go) = go() else { return };
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let server = Server::start(TcpListener::bind("127.0.0.1:0").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("iv-{n}.pb.gz");
    let url = format!("http://127.0.0.1:{}/base", server.port);
    let pid = stuck.pid.to_string();
    let out = profile(&[
        "-v",
        "-i",
        "0.5",
        "-p",
        &pid,
        "--push",
        &url,
        "--app",
        "testapp",
        "--push-label",
        "env=ci",
        "-o",
        files.to_str().unwrap(),
        "1.6",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pushed 4 intervals"), "{stderr}");
    let got = server.requests();
    assert_eq!(got.len(), 4, "{stderr}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut last_until = 0;
    for (k, req) in got.iter().enumerate() {
        assert_eq!(req.path, "/base/ingest");
        assert_eq!(req.query["format"], "pprof");
        assert_eq!(
            req.query["name"],
            format!("testapp.offcpu{{host={},env=ci}}", host.trim())
        );
        let from: u64 = req.query["from"].parse().unwrap();
        let until: u64 = req.query["until"].parse().unwrap();
        assert!(from < until && until <= from + 2, "{from}..{until}");
        assert!(from + 1 >= last_until, "intervals in order");
        last_until = until;
        let config = String::from_utf8(req.parts["sample_type_config"].clone()).unwrap();
        assert!(
            config.contains("\"offcpu\"") && config.contains("nanoseconds"),
            "{config}"
        );
        // The same bytes as the file of that interval: the same profile.
        let file = dir.path().join(format!("iv-{}.pb.gz", k + 1));
        assert_eq!(
            req.parts["profile"],
            std::fs::read(&file).unwrap(),
            "interval {k}: the pushed profile is not the one written"
        );
        let pushed = dir.path().join(format!("pushed-{k}.pb.gz"));
        std::fs::write(&pushed, &req.parts["profile"]).unwrap();
        let len_ns = if k < 3 { 500_000_000 } else { 100_000_000 };
        let total = top_total_ns(&go, &pushed);
        let want = STUCK as u64 * len_ns;
        assert!(
            total.abs_diff(want) < 1000 * STUCK as u64,
            "interval {k}: go tool pprof says {total} ns, {STUCK} threads blocked all along \
             make {want}"
        );
    }
}

/// With the server down at first and back later: tracing does not wait
/// for it (every interval is printed on time), what failed is retried,
/// and every interval is either received or counted as not pushed.
#[test]
fn push_survives_a_server_that_is_down() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let pid = stuck.pid.to_string();
    let started = Instant::now();
    let mut child = offcputime()
        .args([
            "-v", "-T", "-i", "0.3", "-f", "-p", &pid, "--push", &url, "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // When each interval's time line came out; the first one told.
    let (first_tx, first) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut at = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if is_time_line(&line) {
                at.push(Instant::now());
                let _ = first_tx.send(());
            }
        }
        at
    });
    // The server comes up once the first interval has been written and
    // its push tried (and retried once) against nothing: however long the
    // start-up took (over a second on a loaded machine).
    let _ = first.recv_timeout(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(600));
    let server = Server::start(TcpListener::bind(("127.0.0.1", port)).unwrap());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{stderr}");
    let at = lines.join().unwrap();
    assert_eq!(at.len(), 10, "3 s in 0.3 s intervals: {stderr}");
    // Waiting for a send would hold an interval up by the retries' backoff
    // (0.25 + 0.5 + 1 + 2 + 4 s for one interval the server never gets).
    // Allowed: the symbolization of the first interval (about 1 s in a
    // debug build).
    for w in at.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap < Duration::from_millis(1500),
            "an interval came {gap:?} after the one before: tracing waited for the push"
        );
    }
    let spread = at[9] - at[0];
    assert!(
        spread < Duration::from_millis(2700 + 1500),
        "the 10 intervals came over {spread:?}: tracing waited for the push"
    );
    assert!(
        stderr.contains(&format!("pushing an interval to {url} failed")),
        "{stderr}"
    );
    let received = server.requests().len();
    if received < 10 {
        assert!(
            stderr.contains(&format!(
                "{} of 10 intervals could not be pushed",
                10 - received
            )),
            "{received} received: {stderr}"
        );
    } else {
        assert!(stderr.contains("pushed 10 intervals"), "{stderr}");
    }
    assert!(
        received >= 5,
        "only {received} intervals arrived once the server was up"
    );
    eprintln!(
        "{received} of 10 intervals received; the run took {:?}",
        started.elapsed()
    );
}

/// Ctrl-C (SIGINT) writes the partial last interval and sends it with
/// what is queued before exiting: every interval printed is received; with
/// no server, the profiler still exits within the deadline (5 s) and counts
/// every interval as not pushed.
#[test]
fn ctrl_c_sends_what_is_queued() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let pid = stuck.pid.to_string();
    for server_up in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = if server_up {
            Some(Server::start(listener))
        } else {
            drop(listener);
            None
        };
        let url = format!("http://127.0.0.1:{port}");
        let mut stopped = Instant::now();
        let (out, _, _) = profile_during(
            &["-T", "-i", "0.4", "-f", "-p", &pid, "--push", &url],
            |child| {
                std::thread::sleep(Duration::from_millis(1000));
                stopped = Instant::now();
                // SAFETY: signals the profiler, our child.
                unsafe { libc::kill(child as i32, libc::SIGINT) };
            },
        );
        let took = stopped.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let printed = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| is_time_line(l))
            .count();
        assert!(printed >= 3, "{printed} intervals printed: {stderr}");
        match &server {
            Some(s) => {
                assert_eq!(s.requests().len(), printed, "{stderr}");
                assert!(
                    stderr.contains(&format!("pushed {printed} intervals")),
                    "{stderr}"
                );
            }
            None => {
                assert!(
                    stderr.contains(&format!(
                        "{printed} of {printed} intervals could not be pushed"
                    )),
                    "{stderr}"
                );
                assert!(
                    took < Duration::from_secs(7),
                    "exited {took:?} after Ctrl-C"
                );
            }
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for chunk in s.trim_end_matches('=').as_bytes().chunks(4) {
        let mut v = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            v |= (value(c) as u32) << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((v >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// `--push-api parca`: Parca's WriteRaw through its HTTP gateway, one
/// series per interval labelled `__name__=APP`, host and `--push-label`,
/// holding the very profile `-o` writes.
#[test]
fn push_to_parca() {
    if !require_root() {
        return;
    }
    let _g = serial();
    let stuck = Workload::start(&["stuck"]);
    let server = Server::start(TcpListener::bind("127.0.0.1:0").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("iv-{n}.pb.gz");
    let url = format!("http://127.0.0.1:{}", server.port);
    let pid = stuck.pid.to_string();
    let out = profile(&[
        "-v",
        "-i",
        "0.5",
        "-p",
        &pid,
        "--push",
        &url,
        "--push-api",
        "parca",
        "--app",
        "web",
        "--push-label",
        "env=ci",
        "--pprof-sample-type",
        "wallclock",
        "-o",
        files.to_str().unwrap(),
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let got = server.requests();
    assert_eq!(got.len(), 2, "{stderr}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for (k, req) in got.iter().enumerate() {
        assert_eq!(req.path, "/profiles/writeraw");
        let v: serde_json::Value = serde_json::from_slice(&req.parts["json"]).unwrap();
        let series = &v["series"][0];
        let labels: BTreeMap<String, String> = series["labels"]["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["name"].as_str().unwrap().to_string(),
                    l["value"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(labels["__name__"], "web");
        assert_eq!(labels["env"], "ci");
        assert_eq!(labels["host"], host.trim());
        assert_eq!(v["normalized"], false);
        let raw = base64_decode(series["samples"][0]["rawProfile"].as_str().unwrap());
        let file = dir.path().join(format!("iv-{}.pb.gz", k + 1));
        assert_eq!(raw, std::fs::read(&file).unwrap(), "interval {k}");
    }
}
