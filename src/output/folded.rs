//! Folded stacks, as bcc's `offcputime -f` writes them and `flamegraph.pl`
//! reads them: `comm;user frames;[-;]kernel frames value`, outermost frame
//! first, one line per distinct stack, the value in microseconds. With
//! `--states`, the thread state is a frame of its own after the command:
//! `comm;[sleep];user frames;...`. With `--wakers`, bcc `offwaketime`'s
//! shape: `...;kernel frames;--;waker kernel frames;[-;]waker user frames;
//! waker` with the waker's frames innermost first and its command last.

use std::io::{self, Write};
use std::sync::Arc;

use super::Shape;
use crate::profile::{ns_to_us, Frame, Part, Profile, Sample};

pub use crate::shape::{MISSED_KERNEL, MISSED_USER};

/// A frame name as it can stand in a folded line: `;` separates frames.
pub(crate) fn clean(name: &str) -> String {
    name.replace(';', ":")
}

/// Appends `name` to `text` as [`clean`] writes it.
fn push_clean(text: &mut String, name: &str) {
    if name.contains(';') {
        text.push_str(&clean(name));
    } else {
        text.push_str(name);
    }
}

/// Suffix that marks a kernel frame for flame-graph palettes (as perf's
/// `stackcollapse` writes it); inferno shows the name without it.
pub const KERNEL_ANNOTATION: &str = "_[k]";

/// Suffix that marks a frame of the waker's part (`--wakers`); inferno
/// shows the name without it.
pub const WAKER_ANNOTATION: &str = "_[w]";

/// Suffixes that mark the frames of an on-CPU part (`--on-cpu`), user and
/// kernel, so that the flame graph colours them hot; inferno shows the
/// names without them.
pub const HOT_USER_ANNOTATION: &str = "_[j]";
pub const HOT_KERNEL_ANNOTATION: &str = "_[i]";

/// Between the blocked thread's stacks and its waker's (bcc's
/// `offwaketime`).
pub const WAKER_SEPARATOR: &str = "--";

/// How a part's frames are written: the order and the annotation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Run {
    /// The thread's user frames: outermost first.
    User,
    /// The thread's kernel frames: outermost first, annotated.
    Kernel,
    /// The waker's frames: innermost first, annotated.
    Waker,
    /// A running thread's user and kernel frames (`--on-cpu`), as User
    /// and Kernel, annotated hot where annotated.
    HotUser,
    HotKernel,
}

impl Run {
    /// The suffix of each frame's name where frames are annotated.
    fn annotation(self) -> &'static str {
        match self {
            Run::User => "",
            Run::Kernel => KERNEL_ANNOTATION,
            Run::Waker => WAKER_ANNOTATION,
            Run::HotUser => HOT_USER_ANNOTATION,
            Run::HotKernel => HOT_KERNEL_ANNOTATION,
        }
    }
}

/// The folded text of each part that samples share, made once (a profile
/// of many stacks has far fewer kernel parts, each in many samples).
/// Keyed by the address of the part's frames, which the profile keeps. A
/// part of one sample only (most user parts there) is written straight
/// into its line.
#[derive(Default)]
struct PartTexts {
    runs: ahash::AHashMap<(usize, Run), Option<String>>,
    /// How many samples have each part, where more than one.
    shared: ahash::AHashMap<usize, u32>,
    names: Names,
}

/// The address of a part's frames: the same for every sample that has
/// the part.
fn part_key(f: &Arc<[Frame]>) -> usize {
    Arc::as_ptr(f) as *const Frame as usize
}

/// The text of each frame as a folded line has it ([`clean`]), found
/// once: a large profile has many times more frames than distinct ones
/// (frames are shared, see [`Frame`]). Each found by the frame's address,
/// in a table of the last ones found before a hash map.
struct Names {
    text: String,
    recent: Box<[(usize, usize, usize)]>,
    found: ahash::AHashMap<usize, (usize, usize)>,
}

impl Default for Names {
    fn default() -> Names {
        Names {
            text: String::new(),
            // No frame is at address 0.
            recent: vec![(0, 0, 0); Names::SLOTS].into_boxed_slice(),
            found: ahash::AHashMap::new(),
        }
    }
}

impl Names {
    const SLOTS: usize = 1024;

    /// The text of frame `f`.
    fn of(&mut self, f: &Frame) -> &str {
        let key = f.identity();
        let slot = ((key >> 4) ^ (key >> 14)) % Self::SLOTS;
        let (at, start, end) = self.recent[slot];
        if at == key {
            return &self.text[start..end];
        }
        let text = &mut self.text;
        let (start, end) = *self.found.entry(key).or_insert_with(|| {
            let start = text.len();
            push_clean(text, f.text());
            (start, text.len())
        });
        self.recent[slot] = (key, start, end);
        &self.text[start..end]
    }
}

/// Appends the frames `f` as `run` writes them (`;` between them) to
/// `text`, each followed by `suffix`. A frame whose text is empty is
/// written as nothing, and no `;` comes before the first frame that is
/// not.
fn append_frames(names: &mut Names, text: &mut String, f: &[Frame], run: Run, suffix: &str) {
    let start = text.len();
    let mut add = |n: &Frame| {
        if text.len() > start {
            text.push(';');
        }
        text.push_str(names.of(n));
        if !suffix.is_empty() {
            text.push_str(suffix);
        }
    };
    match run {
        Run::Waker => {
            for n in f {
                add(n);
            }
        }
        _ => {
            for n in f.iter().rev() {
                add(n);
            }
        }
    }
}

impl PartTexts {
    /// Appends the frames of `part` to `line` as `run` writes them.
    fn push(&mut self, line: &mut String, part: &Part, run: Run, annotate: bool) {
        let suffix = if annotate { run.annotation() } else { "" };
        match part {
            Part::Absent => {}
            Part::Missed => {
                let marker = match run {
                    Run::User | Run::HotUser => MISSED_USER,
                    _ => MISSED_KERNEL,
                };
                push(line, &format!("{}{suffix}", clean(marker)));
            }
            Part::Frames(f) => {
                let key = part_key(f);
                if !self.shared.contains_key(&key) {
                    let start = line.len();
                    line.push(';');
                    append_frames(&mut self.names, line, f, run, suffix);
                    if line.len() == start + 1 {
                        line.truncate(start);
                    }
                    return;
                }
                let names = &mut self.names;
                let text = self.runs.entry((key, run)).or_insert_with(|| {
                    let mut text = String::new();
                    append_frames(names, &mut text, f, run, suffix);
                    (!text.is_empty()).then_some(text)
                });
                if let Some(text) = text {
                    push(line, text);
                }
            }
        }
    }

    /// Notes which parts the samples share (see [`PartTexts`]).
    fn count(&mut self, samples: &[Sample]) {
        let mut seen: ahash::AHashMap<usize, u32> = ahash::AHashMap::with_capacity(samples.len());
        let mut note = |p: &Part| {
            if let Part::Frames(f) = p {
                *seen.entry(part_key(f)).or_default() += 1;
            }
        };
        for s in samples {
            note(&s.user);
            note(&s.kernel);
            if let Some(w) = &s.waker {
                let (u, k) = w.parts();
                note(u);
                note(k);
            }
        }
        seen.retain(|_, n| *n > 1);
        self.shared = seen;
    }

    /// Appends the folded stack of one sample, without the count, to
    /// `line`. With `annotate`, kernel frames end in [`KERNEL_ANNOTATION`]
    /// and the waker's in [`WAKER_ANNOTATION`].
    fn line(&mut self, line: &mut String, sample: &Sample, shape: Shape, annotate: bool) {
        if shape.per_container {
            push_clean(line, &crate::shape::container_frame(sample));
            line.push(';');
        }
        push_clean(line, &sample.comm);
        if let Some(state) = sample.state {
            push(line, state.frame());
        }
        let (user, kernel) = if sample.state == Some(crate::profile::OffState::Running) {
            (Run::HotUser, Run::HotKernel)
        } else {
            (Run::User, Run::Kernel)
        };
        if shape.mode.user() {
            self.push(line, &sample.user, user, annotate);
        }
        if shape.mode.kernel() {
            let both =
                matches!(sample.user, Part::Frames(_)) && matches!(sample.kernel, Part::Frames(_));
            if shape.delimited && shape.mode.user() && both {
                push(line, "-");
            }
            self.push(line, &sample.kernel, kernel, annotate);
        }
        // --chains: the hops, outermost first (as the flame graph
        // stacks them).
        if let Some(Part::Frames(chain)) = sample.waker.as_ref().and_then(|w| w.chain()) {
            for f in chain.iter().rev() {
                line.push(';');
                push_clean(line, f.text());
                if annotate && f.origin == crate::profile::Origin::Kernel {
                    line.push_str(KERNEL_ANNOTATION);
                }
            }
            return;
        }
        // The waker, as bcc's offwaketime folds it: its kernel frames,
        // then its user frames, innermost first, and its name last.
        if let Some(waker) = &sample.waker {
            push(line, WAKER_SEPARATOR);
            let (user, kernel) = waker.parts();
            if shape.mode.kernel() {
                self.push(line, kernel, Run::Waker, annotate);
            }
            if shape.mode.user() {
                let both = matches!(user, Part::Frames(_)) && matches!(kernel, Part::Frames(_));
                if shape.delimited && shape.mode.kernel() && both {
                    push(line, "-");
                }
                // The waker's missed user stack keeps its own marker.
                match user {
                    Part::Missed => {
                        let marker = if annotate {
                            format!("{}{WAKER_ANNOTATION}", clean(MISSED_USER))
                        } else {
                            clean(MISSED_USER)
                        };
                        push(line, &marker);
                    }
                    _ => self.push(line, user, Run::Waker, annotate),
                }
            }
            let name = if annotate {
                format!("{}{WAKER_ANNOTATION}", clean(waker.name()))
            } else {
                clean(waker.name())
            };
            push(line, &name);
        }
    }
}

/// Appends one frame (or a run of them) to a folded line.
fn push(line: &mut String, frames: &str) {
    line.push(';');
    line.push_str(frames);
}

/// Distinct folded stacks with their total time in microseconds, hottest
/// first (ties by stack text). Stacks that round to 0 us are left out: this
/// is what `-f` prints and what `--svg` draws.
pub fn lines(profile: &Profile, shape: Shape, annotate: bool) -> Vec<(String, u64)> {
    let folded = Folded::of(profile, shape, annotate);
    folded
        .lines()
        .map(|(stack, us)| (stack.to_string(), us))
        .collect()
}

/// The distinct folded stacks of a profile, their text in one buffer: a
/// string each was an allocation, growth and free per line, over text as
/// long as all the stacks' frames (see BENCHMARKS.md, report time).
struct Folded {
    /// Every distinct line, one after the other, without separators.
    text: String,
    /// Each line's place in `text` and its time in microseconds, in the
    /// order of [`lines`].
    lines: Vec<(usize, usize, u64)>,
}

impl Folded {
    fn of(profile: &Profile, shape: Shape, annotate: bool) -> Folded {
        let mut part_texts = PartTexts::default();
        part_texts.count(&profile.samples);
        let mut text = String::new();
        // (start, end, total ns) of each distinct line, found by the hash
        // of its text: `heads` has the last line with each hash, `next`
        // chains the others.
        let mut found: Vec<(usize, usize, u64)> = Vec::with_capacity(profile.samples.len());
        let mut next: Vec<u32> = Vec::with_capacity(profile.samples.len());
        let mut heads: ahash::AHashMap<u64, u32> =
            ahash::AHashMap::with_capacity(profile.samples.len());
        let hasher = ahash::RandomState::new();
        const END: u32 = u32::MAX;
        for s in &profile.samples {
            let start = text.len();
            part_texts.line(&mut text, s, shape, annotate);
            let line = &text[start..];
            let hash = hasher.hash_one(line);
            let head = heads.get(&hash).copied().unwrap_or(END);
            let mut n = head;
            while n != END {
                let (a, b, _) = found[n as usize];
                if &text[a..b] == line {
                    break;
                }
                n = next[n as usize];
            }
            if n == END {
                heads.insert(hash, found.len() as u32);
                found.push((start, text.len(), s.total_ns));
                next.push(head);
            } else {
                // Seen before: only its time is added.
                found[n as usize].2 += s.total_ns;
                text.truncate(start);
            }
        }
        drop((heads, next));
        let mut lines: Vec<(usize, usize, u64)> = found
            .into_iter()
            .map(|(a, b, ns)| (a, b, ns_to_us(ns)))
            .filter(|&(_, _, us)| us > 0)
            .collect();
        // Stacks are distinct: an unstable sort gives one order.
        lines.sort_unstable_by(|x, y| {
            y.2.cmp(&x.2)
                .then_with(|| text[x.0..x.1].cmp(&text[y.0..y.1]))
        });
        Folded { text, lines }
    }

    /// The lines, as [`lines`] gives them.
    fn lines(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.lines.iter().map(|&(a, b, us)| (&self.text[a..b], us))
    }
}

pub fn write(profile: &Profile, shape: Shape, w: &mut dyn Write) -> io::Result<()> {
    let folded = Folded::of(profile, shape, false);
    // Written a block at a time: three calls a line through `dyn Write`
    // (and the formatting of the count) were a tenth of the report.
    let mut block: Vec<u8> = Vec::with_capacity(BLOCK + 4096);
    let mut digits = [0u8; 20];
    for (stack, us) in folded.lines() {
        block.extend_from_slice(stack.as_bytes());
        block.push(b' ');
        block.extend_from_slice(decimal(us, &mut digits));
        block.push(b'\n');
        if block.len() >= BLOCK {
            w.write_all(&block)?;
            block.clear();
        }
    }
    w.write_all(&block)
}

/// How much [`write`] gathers before it writes.
const BLOCK: usize = 256 * 1024;

/// `n` in decimal, in `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_every_width() {
        let mut buf = [0u8; 20];
        for n in [0, 1, 9, 10, 99, 100, 12345, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    fn sample(comm: &str, user: &[&str], kernel: &[&str], ns: u64) -> Sample {
        let part = |names: &[&str]| {
            Part::Frames(
                names
                    .iter()
                    .map(|&n| Frame::named(n))
                    .collect::<Vec<_>>()
                    .into(),
            )
        };
        Sample {
            comm: comm.to_string(),
            tgid: 1,
            pid: 1,
            thread: None,
            user: part(user),
            kernel: part(kernel),
            state: None,
            waker: None,
            container: None,
            total_ns: ns,
            count: 1,
        }
    }

    fn folded(samples: Vec<Sample>) -> String {
        let profile = Profile {
            samples,
            ..Profile::default()
        };
        let mut out = Vec::new();
        write(&profile, Shape::default(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_alike_in_text_are_one_whatever_their_parts() {
        // Frames innermost first: the user part `b;a` then the kernel's
        // `c`, and the user part `a` then the kernel's `c;b`, are both
        // `x;a;b;c`; the times add up before rounding.
        let out = folded(vec![
            sample("x", &["b", "a"], &["c"], 1_400),
            sample("x", &["a"], &["c", "b"], 1_400),
            sample("x", &["a"], &["c"], 2_000),
        ]);
        assert_eq!(out, "x;a;b;c 3\nx;a;c 2\n");
    }

    #[test]
    fn a_part_in_many_samples_reads_as_in_one() {
        // Frames without a name write nothing and no `;` before the
        // first that has one, whether the part is in one sample or many.
        let shared = sample("y", &["b", ""], &["k2", "", "k1"], 0);
        let mut again = shared.clone();
        again.comm = "z".to_string();
        again.total_ns = 5_000;
        let mut once = shared.clone();
        once.total_ns = 7_000;
        let lone = sample("w", &["b", ""], &["k2", "", "k1"], 9_000);
        let out = folded(vec![once, again, lone]);
        assert_eq!(out, "w;b;k1;;k2 9\ny;b;k1;;k2 7\nz;b;k1;;k2 5\n");
    }

    #[test]
    fn a_name_with_a_semicolon_is_cleaned_in_any_part() {
        let shared = sample("v", &["b;c", "a"], &["k;1"], 0);
        let mut once = shared.clone();
        once.total_ns = 3_000;
        let mut again = shared.clone();
        again.comm = "u;x".to_string();
        again.total_ns = 2_000;
        let lone = sample("t", &["", "b;c", "a"], &["k;1", ""], 1_000);
        let out = folded(vec![once, again, lone]);
        assert_eq!(out, "v;a;b:c;k:1 3\nu:x;a;b:c;k:1 2\nt;a;b:c;;k:1 1\n");
    }
}
