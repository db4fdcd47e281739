//! `--push URL`: each interval of `-i`, as a pprof profile, sent to a
//! Pyroscope-compatible ingest endpoint (`POST /ingest?format=pprof`, the
//! profile in a multipart form with its sample type's configuration) or to
//! Parca (`--push-api parca`); `--push-otlp URL`: each interval as an OTLP
//! profiles request to an OTLP/HTTP receiver (`POST
//! /v1development/profiles`, protobuf). The APIs differ only in the
//! interval's payload and its request ([`PushApi`]); the queue, the
//! retries and the accounting are one.
//!
//! Sending never holds up tracing: intervals go into a bounded queue that a
//! thread of its own empties, retrying a failed send with backoff. When
//! the queue is full the oldest interval is given up. At the end what is
//! queued is sent within a deadline; what could not be sent (the interval
//! being sent at the deadline included) is counted and said on stderr.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::output::otlp::OtlpOptions;
use crate::output::Shape;
use crate::profile::Profile;

/// Intervals waiting to be sent, at most.
const QUEUE: usize = 32;
/// Attempts per interval, the first included.
const ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(8);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Where to send, from `--push URL` or `--push-otlp URL`
/// (`http://[user:password@]host[:port][/prefix]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    host: String,
    port: u16,
    /// Prepended to the API's path (`/ingest`), without a trailing slash.
    prefix: String,
    /// `user:password`, sent as HTTP basic authentication.
    credentials: Option<String>,
    /// The URL as given, without credentials: for messages.
    pub shown: String,
}

impl Endpoint {
    /// The URL of `flag` (for messages: `--push`).
    pub fn parse(flag: &str, url: &str) -> Result<Endpoint> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some(("https", _)) => bail!(
                "{flag} {url}: https is not supported; push to a local agent over http (Grafana \
                 Alloy, an OpenTelemetry Collector, which forward with TLS) or through a TLS proxy"
            ),
            _ => bail!("{flag} {url}: not an http:// URL"),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (credentials, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(percent_decode(c)), h),
            None => (None, authority),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .with_context(|| format!("{flag} {url}: bad IPv6 address"))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        if host.is_empty() {
            bail!("{flag} {url}: no host");
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .with_context(|| format!("{flag} {url}: bad port {p:?}"))?,
            None => 80,
        };
        if path.contains(['?', '#']) {
            bail!("{flag} {url}: the URL must not have a query or fragment");
        }
        let shown = match authority.rsplit_once('@') {
            Some((_, h)) => format!("http://{h}{path}"),
            None => url.to_string(),
        };
        Ok(Endpoint {
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
            credentials,
            shown,
        })
    }
}

/// The backend's API (`--push-api`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushApi {
    /// Pyroscope's `POST /ingest?format=pprof` (multipart).
    Pyroscope,
    /// Parca's `POST /profiles/writeraw` (its gRPC `WriteRaw` through the
    /// HTTP gateway, JSON).
    Parca,
    /// OTLP/HTTP's `POST /v1development/profiles` (`--push-otlp`), an
    /// `ExportProfilesServiceRequest` in protobuf.
    Otlp,
}

/// The path OTLP/HTTP receivers take profiles at.
pub const OTLP_PATH: &str = "/v1development/profiles";

impl PushApi {
    /// The flag that pushes with it.
    pub fn flag(self) -> &'static str {
        match self {
            PushApi::Pyroscope | PushApi::Parca => "--push",
            PushApi::Otlp => "--push-otlp",
        }
    }

    /// What its payload is, for messages.
    pub fn payload(self) -> &'static str {
        match self {
            PushApi::Pyroscope | PushApi::Parca => "pprof",
            PushApi::Otlp => "OTLP",
        }
    }
}

/// What is sent with each interval.
#[derive(Clone, Debug)]
pub struct PushOptions {
    pub endpoint: Endpoint,
    pub api: PushApi,
    /// The application's name in the backend (`--app`).
    pub app: String,
    /// Labels: `host` and those of `--push-label` (OTLP: resource
    /// attributes, `host` as `host.name`).
    pub labels: Vec<(String, String)>,
    /// The pprof profile's options (`--pprof-sample-type`, `--thread-ids`).
    pub pprof: crate::output::pprof::PprofOptions,
}

impl PushOptions {
    /// An interval's payload: a gzipped pprof profile, or an OTLP request
    /// whose resources have `host.name`, `service.name` (the app) and the
    /// labels.
    pub fn payload(&self, profile: &Profile, shape: Shape) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        match self.api {
            PushApi::Pyroscope | PushApi::Parca => {
                crate::output::pprof::write(profile, shape, &self.pprof, &mut out)
                    .context("failed to build the pprof profile to push")?
            }
            PushApi::Otlp => {
                let mut resource = vec![("service.name".to_string(), self.app.clone())];
                resource.extend(self.labels.iter().map(|(k, v)| match k.as_str() {
                    "host" => ("host.name".to_string(), v.clone()),
                    _ => (k.clone(), v.clone()),
                }));
                let opts = OtlpOptions {
                    samples: self.pprof.clone(),
                    resource,
                };
                crate::output::otlp::write(profile, shape, &opts, &mut out)
                    .context("failed to build the OTLP request to push")?
            }
        }
        Ok(out)
    }

    /// The ingest query of an interval from `from` to `until` (Unix
    /// seconds).
    fn query(&self, from: u64, until: u64) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let name = format!(
            "{}.{}{{{}}}",
            self.app,
            self.pprof.sample_type.name(),
            labels.join(",")
        );
        format!(
            "{}/ingest?name={}&from={from}&until={until}&format=pprof&spyName=offcputime",
            self.endpoint.prefix,
            percent_encode(&name)
        )
    }

    /// Parca's `WriteRaw` request in JSON: one series, labelled
    /// `__name__=APP` and the labels, with the interval's profile.
    fn parca_body(&self, profile: &[u8]) -> String {
        let mut labels = vec![format!(
            "{{\"name\":\"__name__\",\"value\":\"{}\"}}",
            json_escape(&self.app)
        )];
        labels.extend(self.labels.iter().map(|(k, v)| {
            format!(
                "{{\"name\":\"{}\",\"value\":\"{}\"}}",
                json_escape(k),
                json_escape(v)
            )
        }));
        format!(
            "{{\"series\":[{{\"labels\":{{\"labels\":[{}]}},\"samples\":[{{\"rawProfile\":\"{}\"}}]}}],\
             \"normalized\":false}}",
            labels.join(","),
            base64(profile)
        )
    }

    /// The request of one interval: path and query, content type, body.
    fn request(&self, item: &Item) -> (String, String, Vec<u8>) {
        match self.api {
            PushApi::Otlp => {
                // The receiver's base URL, or the whole URL of its path.
                let prefix = &self.endpoint.prefix;
                let path = if prefix.ends_with(OTLP_PATH) {
                    prefix.clone()
                } else {
                    format!("{prefix}{OTLP_PATH}")
                };
                (
                    path,
                    "application/x-protobuf".to_string(),
                    item.profile.clone(),
                )
            }
            PushApi::Parca => (
                format!("{}/profiles/writeraw", self.endpoint.prefix),
                "application/json".to_string(),
                self.parca_body(&item.profile).into_bytes(),
            ),
            PushApi::Pyroscope => {
                let boundary = format!(
                    "offcputime-{:016x}",
                    item.from ^ (item.profile.len() as u64) << 20
                );
                let mut body = Vec::with_capacity(item.profile.len() + 512);
                let mut part = |name: &str, file: &str, ctype: &str, data: &[u8]| {
                    body.extend_from_slice(
                        format!(
                            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                             filename=\"{file}\"\r\nContent-Type: {ctype}\r\n\r\n"
                        )
                        .as_bytes(),
                    );
                    body.extend_from_slice(data);
                    body.extend_from_slice(b"\r\n");
                };
                part(
                    "profile",
                    "profile.pb.gz",
                    "application/octet-stream",
                    &item.profile,
                );
                part(
                    "sample_type_config",
                    "sample_type_config.json",
                    "application/json",
                    self.sample_type_config().as_bytes(),
                );
                body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
                (
                    self.query(item.from, item.until),
                    format!("multipart/form-data; boundary={boundary}"),
                    body,
                )
            }
        }
    }

    /// The sample type's configuration for the backend: time summed in
    /// nanoseconds, not sampled.
    fn sample_type_config(&self) -> String {
        format!(
            "{{\"{t}\":{{\"units\":\"nanoseconds\",\"aggregation\":\"sum\",\
             \"display-name\":\"{t}_nanoseconds\",\"sampled\":false}}}}",
            t = self.pprof.sample_type.name()
        )
    }
}

/// A label from `--push-label KEY=VALUE`: names as Prometheus allows them,
/// values without the characters that delimit labels in the app's name.
pub fn parse_label(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("--push-label {s:?}: not KEY=VALUE"))?;
    let name_ok = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !name_ok {
        bail!(
            "--push-label {s:?}: a label name is letters, digits and _, not starting with a digit"
        );
    }
    if v.is_empty() || v.contains(['{', '}', ',', '=', '"']) || v.chars().any(char::is_control) {
        bail!("--push-label {s:?}: a label value must be non-empty, without {{ }} , = or quotes");
    }
    Ok((k.to_string(), v.to_string()))
}

/// An application name for `--app`: what the backend accepts in a name.
pub fn check_app(app: &str) -> Result<()> {
    let ok = !app.is_empty()
        && app
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if !ok {
        bail!("--app {app:?}: letters, digits, _ - . and / only");
    }
    Ok(())
}

/// One interval to send.
struct Item {
    from: u64,
    until: u64,
    profile: Vec<u8>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Item>,
    /// Stop when the queue is empty, or at this instant.
    closing: Option<Instant>,
    /// An interval is taken from the queue and neither sent nor given up
    /// yet.
    sending: bool,
    stats: PushStats,
}

/// What became of the intervals.
#[derive(Clone, Debug, Default)]
pub struct PushStats {
    pub sent: u64,
    /// Given up after every attempt, or at the deadline at the end (one
    /// still being sent then included).
    pub failed: u64,
    /// Given up unsent because the queue was full.
    pub dropped: u64,
    pub bytes: u64,
    pub last_error: Option<String>,
    /// OTLP: profiles the receiver said it rejected in intervals it took
    /// (a partial success), and the last reason it gave.
    pub rejected_profiles: u64,
    pub rejection: Option<String>,
}

/// The queue and the thread that empties it.
pub struct Pusher {
    shared: Arc<(Mutex<State>, Condvar)>,
    worker: Option<JoinHandle<()>>,
    options: Arc<PushOptions>,
}

impl Pusher {
    pub fn start(options: PushOptions) -> Result<Pusher> {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let options = Arc::new(options);
        let worker = {
            let shared = shared.clone();
            let options = options.clone();
            std::thread::Builder::new()
                .name("push".into())
                .spawn(move || work(&shared, &options))
                .context("failed to start the push thread")?
        };
        Ok(Pusher {
            shared,
            worker: Some(worker),
            options,
        })
    }

    /// Queues an interval (`from`..`until`, Unix ns) and its payload (see
    /// [`PushOptions::payload`]); never waits.
    pub fn push(&self, from_unix_ns: u64, until_unix_ns: u64, profile: Vec<u8>) {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        if st.queue.len() >= QUEUE {
            st.queue.pop_front();
            st.stats.dropped += 1;
        }
        st.queue.push_back(Item {
            from: from_unix_ns / 1_000_000_000,
            until: until_unix_ns.div_ceil(1_000_000_000),
            profile,
        });
        cv.notify_all();
    }

    /// Sends what is queued, until `deadline` at most, and says what became
    /// of the intervals.
    pub fn finish(mut self, deadline: Duration) -> PushStats {
        let (lock, cv) = &*self.shared;
        let end = Instant::now() + deadline;
        lock.lock().unwrap_or_else(|e| e.into_inner()).closing = Some(end);
        cv.notify_all();
        if let Some(w) = self.worker.take() {
            // The thread gives up at the deadline, give or take a connect
            // or write timeout under way; it is not waited for longer.
            while !w.is_finished() && Instant::now() < end + Duration::from_millis(500) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if w.is_finished() {
                let _ = w.join();
            }
        }
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        let unsent = st.queue.len() as u64;
        st.queue.clear();
        st.stats.failed += unsent;
        // The thread did not finish: the interval it was sending may or may
        // not arrive, and is not counted as sent.
        if st.sending {
            st.sending = false;
            st.stats.failed += 1;
            st.stats
                .last_error
                .get_or_insert_with(|| "still sending at the deadline".to_string());
        }
        st.stats.clone()
    }

    pub fn endpoint(&self) -> &str {
        &self.options.endpoint.shown
    }

    pub fn api(&self) -> PushApi {
        self.options.api
    }
}

/// The push thread: each interval in turn, with retries.
fn work(shared: &(Mutex<State>, Condvar), options: &PushOptions) {
    let (lock, cv) = shared;
    let mut told = false;
    loop {
        let item = {
            let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(item) = st.queue.pop_front() {
                    st.sending = true;
                    break item;
                }
                if st.closing.is_some() {
                    return;
                }
                st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match send(options, &item) {
                Ok(rejected) => {
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if st.sending {
                        st.sending = false;
                        st.stats.sent += 1;
                        st.stats.bytes += item.profile.len() as u64;
                    }
                    if let Some((count, why)) = rejected {
                        st.stats.rejected_profiles += count;
                        st.stats.rejection = Some(why);
                    }
                    break;
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    if !told {
                        eprintln!(
                            "offcputime: pushing an interval to {} failed ({msg}); retrying \
                             with backoff, tracing goes on",
                            options.endpoint.shown
                        );
                        told = true;
                    }
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    st.stats.last_error = Some(msg);
                    let give_up = attempt >= ATTEMPTS
                        || st
                            .closing
                            .is_some_and(|end| Instant::now() + backoff >= end);
                    if give_up {
                        if st.sending {
                            st.sending = false;
                            st.stats.failed += 1;
                        }
                        break;
                    }
                    // Wait out the backoff, woken early only to give up at
                    // the end's deadline.
                    let until = Instant::now() + backoff;
                    while Instant::now() < until {
                        if st.closing.is_some_and(|end| Instant::now() >= end) {
                            break;
                        }
                        let left = until.saturating_duration_since(Instant::now());
                        st = cv
                            .wait_timeout(st, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    attempt += 1;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// One POST of one interval; Ok on a 2xx answer, with what an OTLP
/// receiver said it rejected of it (how many profiles, and why).
fn send(options: &PushOptions, item: &Item) -> Result<Option<(u64, String)>> {
    let ep = &options.endpoint;
    let addr = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", ep.host))?
        .next()
        .ok_or_else(|| anyhow!("cannot resolve {}", ep.host))?;
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let (target, content_type, body) = options.request(item);
    let host = if ep.host.contains(':') {
        format!("[{}]:{}", ep.host, ep.port)
    } else {
        format!("{}:{}", ep.host, ep.port)
    };
    let mut head = format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: offcputime/{}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    if let Some(c) = &ep.credentials {
        head.push_str(&format!(
            "Authorization: Basic {}\r\n",
            base64(c.as_bytes())
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&body)?;
    stream.flush()?;
    let mut reader = BufReader::new(stream.take(64 * 1024));
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .context("no answer from the server")?;
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP answer: {:?}", status.trim_end()))?;
    // The headers, then the body.
    let mut length = None;
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 2 {
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<u64>().ok();
            }
        }
        line.clear();
    }
    if (200..300).contains(&code) {
        if options.api != PushApi::Otlp || length.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let mut body = Vec::new();
        let _ = reader.take(length.unwrap_or(0)).read_to_end(&mut body);
        return Ok(partial_success(&body));
    }
    let mut said = String::new();
    let _ = reader.take(300).read_to_string(&mut said);
    let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
    bail!("HTTP {code}: {said}")
}

/// What an OTLP receiver's answer says it rejected: how many profiles and
/// why; None when it took everything (or said nothing readable).
fn partial_success(body: &[u8]) -> Option<(u64, String)> {
    use prost::Message;
    let answer = crate::output::otlp_proto::ExportProfilesServiceResponse::decode(body).ok()?;
    let p = answer.partial_success?;
    (p.rejected_profiles > 0).then(|| {
        let why = match p.error_message.trim() {
            "" => "no reason given".to_string(),
            m => m.to_string(),
        };
        (p.rejected_profiles as u64, why)
    })
}

fn json_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.len();
        let v = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= n {
                out.push(T[(v >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let e = Endpoint::parse("--push", "http://u:p%40ss@example.org:4040/pyro/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("example.org", 4040, "/pyro")
        );
        assert_eq!(e.credentials.as_deref(), Some("u:p@ss"));
        assert_eq!(e.shown, "http://example.org:4040/pyro/");
        let e = Endpoint::parse("--push", "http://[::1]:9").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9));
        assert_eq!(Endpoint::parse("--push", "http://h").unwrap().port, 80);
        for bad in [
            "https://h",
            "h:4040",
            "http://:80",
            "http://h:0",
            "http://h:x",
            "http://h/?a",
        ] {
            assert!(Endpoint::parse("--push", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_encodings() {
        let o = PushOptions {
            endpoint: Endpoint::parse("--push", "http://h:1").unwrap(),
            app: "web".into(),
            labels: vec![("host".into(), "m1".into()), ("env".into(), "prod".into())],
            pprof: Default::default(),
            api: PushApi::Pyroscope,
        };
        assert_eq!(
            o.query(10, 20),
            "/ingest?name=web.offcpu%7Bhost%3Dm1%2Cenv%3Dprod%7D&from=10&until=20&format=pprof&spyName=offcputime"
        );
        let parca = PushOptions {
            api: PushApi::Parca,
            ..o.clone()
        };
        assert_eq!(
            parca.parca_body(b"pb"),
            "{\"series\":[{\"labels\":{\"labels\":[{\"name\":\"__name__\",\"value\":\"web\"},\
             {\"name\":\"host\",\"value\":\"m1\"},{\"name\":\"env\",\"value\":\"prod\"}]},\
             \"samples\":[{\"rawProfile\":\"cGI=\"}]}],\"normalized\":false}"
        );
        // OTLP: the receiver's base URL, or its whole URL.
        for (url, path) in [
            ("http://h:4318", "/v1development/profiles"),
            ("http://h:4040/pyro/", "/pyro/v1development/profiles"),
            (
                "http://h:4318/v1development/profiles",
                "/v1development/profiles",
            ),
        ] {
            let otlp = PushOptions {
                api: PushApi::Otlp,
                endpoint: Endpoint::parse("--push-otlp", url).unwrap(),
                ..o.clone()
            };
            let item = Item {
                from: 1,
                until: 2,
                profile: b"pb".to_vec(),
            };
            assert_eq!(
                otlp.request(&item),
                (
                    path.to_string(),
                    "application/x-protobuf".to_string(),
                    b"pb".to_vec()
                )
            );
        }
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"ab"), "YWI=");
        assert!(parse_label("env=prod").is_ok());
        assert!(parse_label("1x=a").is_err());
        assert!(parse_label("x=a,b").is_err());
        assert!(check_app("my-app.web").is_ok());
        assert!(check_app("a b").is_err());
    }
}
