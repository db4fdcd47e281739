//! pprof: a gzipped `profile.proto`, as `go tool pprof`, Grafana
//! Pyroscope and Parca read it.
//!
//! One sample type, `offcpu`/`nanoseconds` (the name Grafana Alloy gives
//! off-CPU profiles), or `wallclock`/`nanoseconds` (Parca's; the default
//! with `--on-cpu`, whose running time is in the same profile); values are
//! the time in nanoseconds, unrounded. Each sample has the labels
//! `comm` and `pid` (and `thread_id` if asked for, `thread` where the
//! thread's runtime names it: a JVM's Java thread name, and `state` with
//! `--states`: `sleep`, `io`, `blocked`, `stopped`, `runqueue`, the
//! state frame of the folded output as a label, and with `--on-cpu`
//! `running`, or `offcpu` for all the rest without `--states`; `waker` with `--wakers`,
//! the waker's name); its locations are the
//! stack, leaf first, as `-U`/`-K` shape it, a lost part being one frame
//! named by its marker (`[Missed User Stack]`) as in the folded output.
//! The thread's name is a label, not a frame. A block with no frame at
//! all (a kernel thread's, with `-U`) has one location, [`NO_FRAMES`]:
//! pprof's readers leave out samples without locations, and its time with
//! them.
//!
//! Each file frames are in is one mapping, with its path and build id;
//! kernel frames are in a `[kernel.kallsyms]` mapping. A user frame's
//! address is its offset in the file, the same in every process that maps
//! it, so a file's mapping starts at 0 with file offset 0; a kernel frame's
//! is the kernel address. Functions inlined at an address are lines of one
//! location, innermost first. Frames are named (`has_functions`): no
//! symbolization is needed to read the profile. The profile is dated by
//! the window traced (`time_nanos`, `duration_nanos`).

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::profile_proto as pb;
use super::Shape;
use crate::profile::{Frame, OffState, Origin, Profile, Sample};

/// The mapping kernel frames are in, as `perf` and Parca name it.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
pub const UNIT: &str = "nanoseconds";
/// The `state` label of off-CPU time with `--on-cpu` and without
/// `--states`.
pub const OFFCPU_STATE: &str = "offcpu";
/// The frame of a sample that has none.
pub const NO_FRAMES: &str = "[kernel thread]";

/// The name of the one sample type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SampleType {
    /// `offcpu`, as Grafana Alloy's off-CPU profiles.
    #[default]
    Offcpu,
    /// `wallclock`, as Parca's agent.
    Wallclock,
}

impl SampleType {
    pub fn name(self) -> &'static str {
        match self {
            SampleType::Offcpu => "offcpu",
            SampleType::Wallclock => "wallclock",
        }
    }
}

/// What the pprof flags choose.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PprofOptions {
    pub sample_type: SampleType,
    /// A `thread_id` label on each sample (else threads of a process with
    /// the same name and stack are one sample).
    pub thread_ids: bool,
    /// `--on-cpu`: every sample has a `state` label, `running` or (without
    /// `--states`) `offcpu`.
    pub on_cpu: bool,
}

/// A thread state as a label's value: `sleep`, `io`, ... (the frame
/// `-f` shows, without its brackets).
pub fn state_name(state: OffState) -> &'static str {
    state.frame().trim_start_matches('[').trim_end_matches(']')
}

/// The labels of a sample, in this order.
fn labels(s: &Sample, opts: &PprofOptions) -> Vec<(&'static str, String)> {
    let mut l = vec![("comm", s.comm.clone()), ("pid", s.tgid.to_string())];
    if opts.thread_ids {
        l.push(("thread_id", s.pid.to_string()));
    }
    if let Some(name) = &s.thread {
        l.push(("thread", name.to_string()));
    }
    match s.state {
        Some(state) => l.push(("state", state_name(state).to_string())),
        None if opts.on_cpu => l.push(("state", OFFCPU_STATE.to_string())),
        None => {}
    }
    // --wakers: the waker's name (its command, or [interrupt], ...); its
    // stacks are not a call chain of the blocked thread's, so they are
    // left to the folded, report, SVG and speedscope outputs.
    // (--chains: the hops are frames of the stack.)
    if let Some(waker) = s.waker.as_ref().filter(|w| w.chain().is_none()) {
        l.push(("waker", waker.name().to_string()));
    }
    // Where the process is: its cgroup always (where read), its container
    // and pod where the cgroup path names them, so that a fleet backend
    // can cut profiles by workload.
    if let Some(c) = s.container.as_deref() {
        l.push(("cgroup", c.cgroup.clone()));
        if let Some(id) = &c.id {
            l.push(("container_id", id.clone()));
        }
        if let Some(runtime) = c.runtime {
            l.push(("container_runtime", runtime.to_string()));
        }
        if let Some(uid) = &c.pod_uid {
            l.push(("pod_uid", uid.clone()));
        }
    }
    l
}

/// The profile as a `profile.proto` message.
pub fn build(profile: &Profile, shape: Shape, opts: &PprofOptions) -> pb::Profile {
    let mut b = Builder::default();
    b.string("");
    let sample_type = pb::ValueType {
        r#type: b.string(opts.sample_type.name()),
        unit: b.string(UNIT),
    };
    b.out.default_sample_type = sample_type.r#type;
    b.out.period_type = Some(sample_type.clone());
    b.out.sample_type = vec![sample_type];
    if let Some(w) = profile.window {
        b.out.time_nanos = i64::try_from(w.start_unix_ns).unwrap_or(0);
        b.out.duration_nanos = i64::try_from(w.duration_ns).unwrap_or(0);
    }
    for s in &profile.samples {
        if s.total_ns == 0 {
            continue;
        }
        let mut stack = super::leaf_first(s, shape);
        if stack.is_empty() {
            stack.push(std::borrow::Cow::Owned(Frame::named(NO_FRAMES)));
        }
        let mut ids = Vec::with_capacity(stack.len());
        let mut group: Vec<&Frame> = Vec::new();
        for f in &stack {
            group.push(f);
            if !f.inlined {
                ids.push(b.location(profile, &group));
                group.clear();
            }
        }
        if !group.is_empty() {
            ids.push(b.location(profile, &group));
        }
        let label: Vec<(i64, i64)> = labels(s, opts)
            .into_iter()
            .map(|(k, v)| (b.string(k), b.string(&v)))
            .collect();
        let value = i64::try_from(s.total_ns).unwrap_or(i64::MAX);
        let next = b.out.sample.len();
        let at = *b
            .samples
            .entry((ids.clone(), label.clone()))
            .or_insert(next);
        if at == next {
            b.out.sample.push(pb::Sample {
                location_id: ids,
                value: vec![value],
                label: label
                    .into_iter()
                    .map(|(key, str)| pb::Label {
                        key,
                        str,
                        ..Default::default()
                    })
                    .collect(),
            });
        } else {
            let v = &mut b.out.sample[at].value[0];
            *v = v.saturating_add(value);
        }
    }
    b.kernel_mapping_last();
    b.out
}

/// Writes the profile, gzipped.
pub fn write(
    profile: &Profile,
    shape: Shape,
    opts: &PprofOptions,
    w: &mut dyn Write,
) -> io::Result<()> {
    let bytes = build(profile, shape, opts).encode_to_vec();
    let mut gz = GzEncoder::new(w, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?.flush()
}

/// A sample's locations and its labels (string indices).
type SampleKey = (Vec<u64>, Vec<(i64, i64)>);

#[derive(Default)]
struct Builder {
    out: pb::Profile,
    strings: HashMap<String, i64>,
    /// By name and source file (a Python function's).
    functions: HashMap<(String, Option<std::sync::Arc<str>>), u64>,
    /// (origin, address, names innermost first) -> location id.
    locations: HashMap<(Origin, u64, Vec<std::sync::Arc<str>>), u64>,
    /// Index in `out.mapping` by origin (kernel, or a file).
    mappings: HashMap<Origin, usize>,
    /// (locations, labels) -> index in `out.sample`.
    samples: HashMap<SampleKey, usize>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// The function of a frame: by name, and a Python function's with its
    /// source file.
    fn function(&mut self, name: &str, file: Option<&std::sync::Arc<str>>) -> u64 {
        let key = (name.to_string(), file.cloned());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.out.function.len() as u64 + 1;
        let n = self.string(name);
        let filename = file.map_or(0, |f| self.string(f));
        self.out.function.push(pb::Function {
            id,
            name: n,
            system_name: n,
            filename,
            ..Default::default()
        });
        self.functions.insert(key, id);
        id
    }

    /// The mapping of an origin, created the first time; 0 for none.
    fn mapping(&mut self, profile: &Profile, origin: Origin, addr: u64) -> u64 {
        let (name, build_id) = match origin {
            Origin::Unknown | Origin::Runtime(_) => return 0,
            Origin::Kernel => (KERNEL_MAPPING, &[][..]),
            Origin::Object(i) => match profile.objects.get(i as usize) {
                Some(o) => (o.path.as_str(), o.build_id.as_slice()),
                None => return 0,
            },
        };
        let at = match self.mappings.get(&origin) {
            Some(&at) => at,
            None => {
                let filename = self.string(name);
                let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
                let build_id = self.string(&hex);
                let at = self.out.mapping.len();
                self.out.mapping.push(pb::Mapping {
                    id: at as u64 + 1,
                    // A file's addresses are offsets in it.
                    memory_start: if origin == Origin::Kernel { addr } else { 0 },
                    memory_limit: addr.saturating_add(1),
                    file_offset: 0,
                    filename,
                    build_id,
                    has_functions: true,
                    ..Default::default()
                });
                self.mappings.insert(origin, at);
                at
            }
        };
        let m = &mut self.out.mapping[at];
        if origin == Origin::Kernel {
            m.memory_start = m.memory_start.min(addr);
        }
        m.memory_limit = m.memory_limit.max(addr.saturating_add(1));
        m.id
    }

    /// Moves the kernel's mapping after the files': tools take the first
    /// mapping for the main program.
    fn kernel_mapping_last(&mut self) {
        let Some(&at) = self.mappings.get(&Origin::Kernel) else {
            return;
        };
        let kernel = self.out.mapping.remove(at);
        self.out.mapping.push(kernel);
        let old_id = at as u64 + 1;
        let new_id = self.out.mapping.len() as u64;
        for (i, m) in self.out.mapping.iter_mut().enumerate() {
            m.id = i as u64 + 1;
        }
        for l in &mut self.out.location {
            l.mapping_id = match l.mapping_id {
                0 => 0,
                id if id == old_id => new_id,
                id if id > old_id => id - 1,
                id => id,
            };
        }
    }

    /// The location of the frames of one address (functions inlined
    /// there first), created the first time.
    fn location(&mut self, profile: &Profile, frames: &[&Frame]) -> u64 {
        let outer = frames[frames.len() - 1];
        let key = (
            outer.origin,
            outer.addr,
            frames.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
        );
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let mapping_id = self.mapping(profile, outer.origin, outer.addr);
        if frames.len() > 1 && mapping_id != 0 {
            self.out.mapping[mapping_id as usize - 1].has_inline_frames = true;
        }
        let line = frames
            .iter()
            .map(|f| pb::Line {
                function_id: self.function(&f.name, f.file.as_ref()),
                // A runtime frame's line.
                line: if matches!(f.origin, Origin::Runtime(_)) {
                    f.addr as i64
                } else {
                    0
                },
                ..Default::default()
            })
            .collect();
        let id = self.out.location.len() as u64 + 1;
        self.out.location.push(pb::Location {
            id,
            mapping_id,
            address: if matches!(outer.origin, Origin::Runtime(_)) {
                0
            } else {
                outer.addr
            },
            line,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }
}
