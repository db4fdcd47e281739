//! speedscope's JSON file format
//! (<https://www.speedscope.app/file-format-schema.json>): one `sampled`
//! profile per thread (or per process), frames shared by all of them.
//!
//! A sample is a stack, outermost frame first, as `-U`/`-K` shape it (a
//! lost part is one frame named by its marker, as in the folded output),
//! and its weight is the blocked time in microseconds, to the nanosecond
//! (`1500.25`). Identical stacks of a profile are one sample, hottest
//! first; profiles come hottest first too. A thread's profile is named
//! `comm (tid)` (its whole name in its runtime where it has one: a JVM's
//! Java thread name). With one profile per process, named `comm (pid)` after its
//! main thread (or, if that never blocked, its first thread seen), each
//! stack starts with its thread's name, as a folded line does; so with one
//! profile per container (`--per-container`), named `container ID` or `no
//! container`. With
//! `--states`, the thread state (`[sleep]`, ...) is the frame after the
//! thread's name, or the root, as in the folded output. Frames of a file
//! say which (`file`), kernel frames say `[kernel.kallsyms]`.

use std::collections::HashMap;
use std::io::{self, Write};

use super::pprof::KERNEL_MAPPING;
use super::Shape;
use crate::profile::{Frame, Origin, Part, Profile, Sample};

pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// What the speedscope flags choose.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpeedscopeOptions {
    /// One profile per process instead of one per thread.
    pub per_process: bool,
}

/// One profile being built: its name and its stacks' total times.
struct Built {
    name: String,
    /// Frame indices root first -> nanoseconds, in first-seen order.
    stacks: Vec<(Vec<usize>, u64)>,
    index: HashMap<Vec<usize>, usize>,
    total_ns: u64,
    /// The main thread's name was seen (per process).
    named_by_main: bool,
}

pub fn write(
    profile: &Profile,
    shape: Shape,
    opts: &SpeedscopeOptions,
    w: &mut dyn Write,
) -> io::Result<()> {
    // (name, file) -> index in `frames`.
    let mut frame_ids: HashMap<(String, Option<String>), usize> = HashMap::new();
    let mut frames: Vec<(String, Option<String>)> = Vec::new();
    let mut frame_id = |name: &str, file: Option<&str>| -> usize {
        let key = (name.to_string(), file.map(str::to_string));
        let next = frames.len();
        let id = *frame_ids.entry(key.clone()).or_insert(next);
        if id == next {
            frames.push(key);
        }
        id
    };
    let mut profiles = collect_profiles(profile, shape, opts, &mut frame_id);
    write_json(&frames, &mut profiles, w)
}

/// The profiles of `profile`'s samples, hottest first, their frames
/// numbered by `frame_id`.
fn collect_profiles(
    profile: &Profile,
    shape: Shape,
    opts: &SpeedscopeOptions,
    frame_id: &mut dyn FnMut(&str, Option<&str>) -> usize,
) -> Vec<Built> {
    let file_of = |f: &Frame| match f.origin {
        Origin::Unknown => None,
        Origin::Kernel => Some(KERNEL_MAPPING.to_string()),
        Origin::Object(i) => profile.objects.get(i as usize).map(|o| o.path.clone()),
        Origin::Runtime(_) => f.file.as_deref().map(str::to_string),
    };

    let mut profiles: Vec<Built> = Vec::new();
    let mut by_key: HashMap<(u32, u32, String), usize> = HashMap::new();
    for s in &profile.samples {
        if s.total_ns == 0 {
            continue;
        }
        let key = if shape.per_container {
            (0, 0, crate::shape::container_frame(s))
        } else if opts.per_process {
            (s.tgid, 0, String::new())
        } else {
            (s.tgid, s.pid, s.comm.clone())
        };
        let next = profiles.len();
        let at = *by_key.entry(key).or_insert(next);
        if at == next {
            profiles.push(Built {
                name: profile_name(s, shape, opts),
                stacks: Vec::new(),
                index: HashMap::new(),
                total_ns: 0,
                named_by_main: s.pid == s.tgid,
            });
        }
        let p = &mut profiles[at];
        if opts.per_process && !shape.per_container && !p.named_by_main && s.pid == s.tgid {
            p.name = profile_name(s, shape, opts);
            p.named_by_main = true;
        }
        let stack = sample_stack(s, shape, opts, frame_id, &file_of);
        let next = p.stacks.len();
        let i = *p.index.entry(stack.clone()).or_insert(next);
        if i == next {
            p.stacks.push((stack, 0));
        }
        p.stacks[i].1 += s.total_ns;
        p.total_ns += s.total_ns;
    }
    profiles.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    profiles
}

/// A sample's stack as frame numbers, root first.
fn sample_stack(
    s: &Sample,
    shape: Shape,
    opts: &SpeedscopeOptions,
    frame_id: &mut dyn FnMut(&str, Option<&str>) -> usize,
    file_of: &dyn Fn(&Frame) -> Option<String>,
) -> Vec<usize> {
    let mut stack: Vec<usize> = Vec::new();
    if opts.per_process || shape.per_container {
        stack.push(frame_id(&s.comm, None));
    }
    // As in the folded output: the state first (`--states`).
    if let Some(state) = s.state {
        stack.push(frame_id(state.frame(), None));
    }
    for f in super::leaf_first(s, shape).iter().rev() {
        stack.push(frame_id(f.text(), file_of(f).as_deref()));
    }
    // As in the folded output: `--`, then the waker's frames innermost
    // first and its name (`--wakers`).
    // (--chains: the hops are among the frames above.)
    if let Some(waker) = s.waker.as_ref().filter(|w| w.chain().is_none()) {
        stack.push(frame_id(super::folded::WAKER_SEPARATOR, None));
        let (user, kernel) = waker.parts();
        let parts = [
            (kernel, shape.mode.kernel(), super::folded::MISSED_KERNEL),
            (user, shape.mode.user(), super::folded::MISSED_USER),
        ];
        for (part, wanted, missed) in parts {
            match part {
                Part::Frames(frames) if wanted => {
                    for f in frames.iter() {
                        stack.push(frame_id(f.text(), file_of(f).as_deref()));
                    }
                }
                Part::Missed if wanted => stack.push(frame_id(missed, None)),
                _ => {}
            }
        }
        stack.push(frame_id(waker.name(), None));
    }
    stack
}

/// The file: the shared frames, then each profile's samples and weights.
fn write_json(
    frames: &[(String, Option<String>)],
    profiles: &mut [Built],
    w: &mut dyn Write,
) -> io::Result<()> {
    write!(
        w,
        "{{\"$schema\":{},\"shared\":{{\"frames\":[",
        json(SCHEMA)
    )?;
    for (i, (name, file)) in frames.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        write!(w, "{sep}\n{{\"name\":{}", json(name))?;
        if let Some(file) = file {
            write!(w, ",\"file\":{}", json(file))?;
        }
        write!(w, "}}")?;
    }
    write!(w, "]}},\"profiles\":[")?;
    for (i, p) in profiles.iter_mut().enumerate() {
        p.stacks
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let sep = if i > 0 { "," } else { "" };
        write!(
            w,
            "{sep}\n{{\"type\":\"sampled\",\"name\":{},\"unit\":\"microseconds\",\
             \"startValue\":0,\"endValue\":{},\"samples\":[",
            json(&p.name),
            us(p.total_ns)
        )?;
        for (j, (stack, _)) in p.stacks.iter().enumerate() {
            let sep = if j > 0 { "," } else { "" };
            let ids: Vec<String> = stack.iter().map(usize::to_string).collect();
            write!(w, "{sep}[{}]", ids.join(","))?;
        }
        write!(w, "],\"weights\":[")?;
        for (j, (_, ns)) in p.stacks.iter().enumerate() {
            let sep = if j > 0 { "," } else { "" };
            write!(w, "{sep}{}", us(*ns))?;
        }
        write!(w, "]}}")?;
    }
    writeln!(
        w,
        "],\"name\":\"Off-CPU time\",\"activeProfileIndex\":0,\"exporter\":\"offcputime {}\"}}",
        env!("CARGO_PKG_VERSION")
    )
}

fn profile_name(s: &Sample, shape: Shape, opts: &SpeedscopeOptions) -> String {
    if shape.per_container {
        let frame = crate::shape::container_frame(s);
        frame
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    } else if opts.per_process {
        format!("{} ({})", s.comm, s.tgid)
    } else {
        format!("{} ({})", s.thread_name(), s.pid)
    }
}

/// Nanoseconds as microseconds, exactly: `1500`, `1500.25`.
fn us(ns: u64) -> String {
    let (whole, frac) = (ns / 1000, ns % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}")
            .trim_end_matches('0')
            .to_string()
    }
}

/// A JSON string.
fn json(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_are_exact() {
        assert_eq!(us(0), "0");
        assert_eq!(us(1_500_000), "1500");
        assert_eq!(us(1_500_250), "1500.25");
        assert_eq!(us(1), "0.001");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(json("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }
}
