//! OTLP profiles: an `ExportProfilesServiceRequest` of OpenTelemetry's
//! profiles signal (`v1development`, protobuf), as an OTLP/HTTP receiver
//! takes it at `/v1development/profiles` (Grafana Pyroscope, the
//! OpenTelemetry Collector).
//!
//! A resource per process, with the attributes the semantic conventions
//! name: those every resource has (`host.name`, and when pushed
//! `service.name` and the `--push-label`s), `process.pid`,
//! `process.executable.name` (the command of the process's main thread,
//! where that thread is in the profile), and where the cgroup path names
//! them `container.id`, `container.runtime.name` and `k8s.pod.uid`. Each
//! resource has one profile of the window (an interval of `-i`): one sample
//! type, `offcpu`/`nanoseconds` (or `wallclock`, as pprof's), values in
//! nanoseconds unrounded. A window without any sample has one resource with
//! the common attributes only and an empty profile, so that every interval
//! has its profile.
//!
//! Samples have the attributes `thread.name` (the runtime's name of the
//! thread where it has one, else its command), `thread.id` with
//! `--thread-ids`, and `thread.state` with `--states` (`sleep`, `io`,
//! `blocked`, `runqueue`, `stopped`: the folded output's state frame;
//! with `--on-cpu` `running`, or `offcpu` without `--states`). Stacks are
//! leaf first, as `-U`/`-K` shape them, a lost part being one location
//! named by its marker, as in pprof. Locations carry
//! `profile.frame.type`: `kernel`, `native`, or the runtime's (`cpython`,
//! `jvm`); functions inlined at an address are lines of one location,
//! innermost first; a Python or Java frame's line is its line.
//!
//! Mappings as in pprof: a file's frames are at their offsets in the file,
//! so its mapping starts at 0, file offset 0, and spans every offset; its
//! build id, where the file has one, is the mapping's
//! `process.executable.build_id.gnu` (hex). Kernel frames are at kernel
//! addresses, in the `[kernel.kallsyms]` mapping (the upper half of the
//! address space).
//!
//! [`Stream`] writes requests one after another whose dictionaries only add
//! to each other (each request's dictionary holds the entries that are new
//! in it, at the indices they would have in one dictionary): protobuf
//! merges concatenated messages, appending repeated fields, so a file of
//! such requests reads as one request with one profile per interval.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::sync::Arc;

use prost::Message;

use super::otlp_proto as pb;
use super::pprof::{state_name, PprofOptions, KERNEL_MAPPING, NO_FRAMES, OFFCPU_STATE, UNIT};
use super::Shape;
use crate::profile::{Frame, Origin, Profile, Sample};

/// The instrumentation scope's name.
pub const SCOPE: &str = "offcputime";
/// The lowest kernel address: the kernel's mapping starts there.
const KERNEL_START: u64 = 0x8000_0000_0000_0000;

/// What the OTLP output writes besides the profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtlpOptions {
    /// The sample type's name, `thread.id` on samples, `--on-cpu`'s states
    /// (as pprof's flags set them).
    pub samples: PprofOptions,
    /// Attributes of every resource: `host.name`, ...
    pub resource: Vec<(String, String)>,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Value {
    Str(String),
    Int(i64),
}

impl Value {
    fn any(&self) -> pb::AnyValue {
        use pb::any_value::Value as V;
        pb::AnyValue {
            value: Some(match self {
                Value::Str(s) => V::StringValue(s.clone()),
                Value::Int(i) => V::IntValue(*i),
            }),
        }
    }
}

fn key_value(key: &str, value: Value) -> pb::KeyValue {
    pb::KeyValue {
        key: key.to_string(),
        value: Some(value.any()),
    }
}

/// What a location is, whatever profile its frames came from.
type LocationKey = (
    i32,
    u64,
    Option<&'static str>,
    Vec<(Arc<str>, Option<Arc<str>>)>,
);

/// A request's dictionary, made as entries are asked for; [`take`]
/// gives the entries made since it was last called.
///
/// [`take`]: Dictionary::take
#[derive(Default)]
struct Dictionary {
    /// The entries not taken yet.
    out: pb::ProfilesDictionary,
    /// Entries of each table made so far, taken or not: the next index.
    strings: i32,
    attributes: i32,
    mappings: i32,
    functions: i32,
    locations: i32,
    stacks: i32,
    string_index: HashMap<String, i32>,
    attribute_index: HashMap<(String, Value), i32>,
    /// By file path and build id (`None`: the kernel).
    mapping_index: HashMap<Option<(String, Vec<u8>)>, i32>,
    function_index: HashMap<(Arc<str>, Option<Arc<str>>), i32>,
    location_index: HashMap<LocationKey, i32>,
    stack_index: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    /// The zero values every table starts with.
    fn start(&mut self) {
        self.out.mapping_table.push(Default::default());
        self.out.location_table.push(Default::default());
        self.out.function_table.push(Default::default());
        // As trace.proto's zero ids: 16 and 8 bytes of zeros.
        self.out.link_table.push(pb::Link {
            trace_id: vec![0; 16],
            span_id: vec![0; 8],
        });
        self.out.string_table.push(String::new());
        self.out.attribute_table.push(Default::default());
        self.out.stack_table.push(Default::default());
        self.strings = 1;
        self.attributes = 1;
        self.mappings = 1;
        self.functions = 1;
        self.locations = 1;
        self.stacks = 1;
        self.string_index.insert(String::new(), 0);
    }

    fn take(&mut self) -> pb::ProfilesDictionary {
        std::mem::take(&mut self.out)
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = self.strings;
        self.strings += 1;
        self.out.string_table.push(s.to_string());
        self.string_index.insert(s.to_string(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let k = (key.to_string(), value);
        if let Some(&i) = self.attribute_index.get(&k) {
            return i;
        }
        let key_strindex = self.string(key);
        let i = self.attributes;
        self.attributes += 1;
        self.out.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex,
            value: Some(k.1.any()),
            unit_strindex: 0,
        });
        self.attribute_index.insert(k, i);
        i
    }

    /// The mapping of a frame's origin; 0 for none.
    fn mapping(&mut self, profile: &Profile, origin: Origin) -> i32 {
        let key = match origin {
            Origin::Unknown | Origin::Runtime(_) => return 0,
            Origin::Kernel => None,
            Origin::Object(i) => match profile.objects.get(i as usize) {
                Some(o) => Some((o.path.clone(), o.build_id.clone())),
                None => return 0,
            },
        };
        if let Some(&i) = self.mapping_index.get(&key) {
            return i;
        }
        let mapping = match &key {
            None => pb::Mapping {
                memory_start: KERNEL_START,
                memory_limit: u64::MAX,
                filename_strindex: self.string(KERNEL_MAPPING),
                ..Default::default()
            },
            Some((path, build_id)) => {
                let mut attribute_indices = Vec::new();
                if !build_id.is_empty() {
                    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
                    attribute_indices
                        .push(self.attribute("process.executable.build_id.gnu", Value::Str(hex)));
                }
                pb::Mapping {
                    memory_start: 0,
                    memory_limit: u64::MAX,
                    file_offset: 0,
                    filename_strindex: self.string(path),
                    attribute_indices,
                }
            }
        };
        let i = self.mappings;
        self.mappings += 1;
        self.out.mapping_table.push(mapping);
        self.mapping_index.insert(key, i);
        i
    }

    fn function(&mut self, name: &Arc<str>, file: Option<&Arc<str>>) -> i32 {
        let key = (name.clone(), file.cloned());
        if let Some(&i) = self.function_index.get(&key) {
            return i;
        }
        let name_strindex = self.string(name);
        let filename_strindex = file.map_or(0, |f| self.string(f));
        let i = self.functions;
        self.functions += 1;
        self.out.function_table.push(pb::Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line: 0,
        });
        self.function_index.insert(key, i);
        i
    }

    /// The location of the frames of one address, functions inlined there
    /// first.
    fn location(&mut self, profile: &Profile, frames: &[&Frame]) -> i32 {
        let outer = frames[frames.len() - 1];
        let runtime = matches!(outer.origin, Origin::Runtime(_));
        let frame_type = frame_type(outer.origin);
        let mapping_index = self.mapping(profile, outer.origin);
        let key = (
            mapping_index,
            outer.addr,
            frame_type,
            frames
                .iter()
                .map(|f| (f.name.clone(), f.file.clone()))
                .collect::<Vec<_>>(),
        );
        if let Some(&i) = self.location_index.get(&key) {
            return i;
        }
        let lines = frames
            .iter()
            .map(|f| pb::Line {
                function_index: self.function(&f.name, f.file.as_ref()),
                // A runtime frame's "address" is its line.
                line: if runtime { f.addr as i64 } else { 0 },
                column: 0,
            })
            .collect();
        let attribute_indices = frame_type
            .map(|t| self.attribute("profile.frame.type", Value::Str(t.to_string())))
            .into_iter()
            .collect();
        let i = self.locations;
        self.locations += 1;
        self.out.location_table.push(pb::Location {
            mapping_index,
            address: if runtime { 0 } else { outer.addr },
            lines,
            attribute_indices,
        });
        self.location_index.insert(key, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stack_index.get(&locations) {
            return i;
        }
        let i = self.stacks;
        self.stacks += 1;
        self.out.stack_table.push(pb::Stack {
            location_indices: locations.clone(),
        });
        self.stack_index.insert(locations, i);
        i
    }
}

/// A frame's `profile.frame.type`; None for a frame of no known origin
/// (a marker, a user frame outside every mapping).
pub fn frame_type(origin: Origin) -> Option<&'static str> {
    match origin {
        Origin::Kernel => Some("kernel"),
        Origin::Object(_) => Some("native"),
        Origin::Runtime(kind) => Some(kind.spec().otel_frame_type),
        Origin::Unknown => None,
    }
}

/// Requests that follow one another in one file or stream (see the
/// module's documentation); the first has the dictionary's zero values.
#[derive(Default)]
pub struct Stream {
    dictionary: Dictionary,
    started: bool,
}

impl Stream {
    /// The request of one profile: a resource per process, each with the
    /// profile of its samples.
    pub fn request(
        &mut self,
        profile: &Profile,
        shape: Shape,
        opts: &OtlpOptions,
    ) -> pb::ExportProfilesServiceRequest {
        if !self.started {
            self.dictionary.start();
            self.started = true;
        }
        let d = &mut self.dictionary;
        let sample_type = pb::ValueType {
            type_strindex: d.string(opts.samples.sample_type.name()),
            unit_strindex: d.string(UNIT),
        };
        let (time_unix_nano, duration_nano) = profile
            .window
            .map_or((0, 0), |w| (w.start_unix_ns, w.duration_ns));
        let empty_profile = || pb::Profile {
            sample_type: Some(sample_type.clone()),
            time_unix_nano,
            duration_nano,
            ..Default::default()
        };
        let mut processes: BTreeMap<u32, Vec<&Sample>> = BTreeMap::new();
        for s in profile.samples.iter().filter(|s| s.total_ns > 0) {
            processes.entry(s.tgid).or_default().push(s);
        }
        let mut resource_profiles = Vec::new();
        for (tgid, samples) in &processes {
            let mut out = empty_profile();
            // (stack, attributes) -> index in `out.samples`.
            let mut merged: HashMap<(i32, Vec<i32>), usize> = HashMap::new();
            for s in samples {
                let stack_index = sample_stack(d, profile, s, shape);
                let attribute_indices = sample_attributes(d, s, &opts.samples);
                let value = i64::try_from(s.total_ns).unwrap_or(i64::MAX);
                let next = out.samples.len();
                let at = *merged
                    .entry((stack_index, attribute_indices.clone()))
                    .or_insert(next);
                if at == next {
                    out.samples.push(pb::Sample {
                        stack_index,
                        attribute_indices,
                        values: vec![value],
                        ..Default::default()
                    });
                } else {
                    let v = &mut out.samples[at].values[0];
                    *v = v.saturating_add(value);
                }
            }
            resource_profiles.push(resource_profile(
                process_attributes(opts, *tgid, samples),
                out,
            ));
        }
        if resource_profiles.is_empty() {
            resource_profiles.push(resource_profile(common_attributes(opts), empty_profile()));
        }
        pb::ExportProfilesServiceRequest {
            resource_profiles,
            dictionary: Some(self.dictionary.take()),
        }
    }

    /// Writes the request of one profile (see [`Stream::request`]).
    pub fn write(
        &mut self,
        profile: &Profile,
        shape: Shape,
        opts: &OtlpOptions,
        w: &mut dyn Write,
    ) -> io::Result<()> {
        w.write_all(&self.request(profile, shape, opts).encode_to_vec())
    }
}

/// The request of one profile, whole.
pub fn build(
    profile: &Profile,
    shape: Shape,
    opts: &OtlpOptions,
) -> pb::ExportProfilesServiceRequest {
    Stream::default().request(profile, shape, opts)
}

/// Writes the request of one profile, whole.
pub fn write(
    profile: &Profile,
    shape: Shape,
    opts: &OtlpOptions,
    w: &mut dyn Write,
) -> io::Result<()> {
    Stream::default().write(profile, shape, opts, w)
}

fn resource_profile(attributes: Vec<pb::KeyValue>, profile: pb::Profile) -> pb::ResourceProfiles {
    pb::ResourceProfiles {
        resource: Some(pb::Resource {
            attributes,
            dropped_attributes_count: 0,
        }),
        scope_profiles: vec![pb::ScopeProfiles {
            scope: Some(pb::InstrumentationScope {
                name: SCOPE.to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
            profiles: vec![profile],
            schema_url: String::new(),
        }],
        schema_url: String::new(),
    }
}

fn common_attributes(opts: &OtlpOptions) -> Vec<pb::KeyValue> {
    opts.resource
        .iter()
        .map(|(k, v)| key_value(k, Value::Str(v.clone())))
        .collect()
}

/// A process's resource attributes (see the module's documentation).
fn process_attributes(opts: &OtlpOptions, tgid: u32, samples: &[&Sample]) -> Vec<pb::KeyValue> {
    let mut a = common_attributes(opts);
    a.push(key_value("process.pid", Value::Int(i64::from(tgid))));
    if let Some(main) = samples.iter().find(|s| s.pid == s.tgid) {
        a.push(key_value(
            "process.executable.name",
            Value::Str(main.comm.clone()),
        ));
    }
    if let Some(c) = samples.iter().find_map(|s| s.container.as_deref()) {
        if let Some(id) = &c.id {
            a.push(key_value("container.id", Value::Str(id.clone())));
        }
        if let Some(runtime) = c.runtime {
            a.push(key_value(
                "container.runtime.name",
                Value::Str(runtime.to_string()),
            ));
        }
        if let Some(uid) = &c.pod_uid {
            a.push(key_value("k8s.pod.uid", Value::Str(uid.clone())));
        }
    }
    a
}

/// A sample's attributes (see the module's documentation), in this order.
fn sample_attributes(d: &mut Dictionary, s: &Sample, opts: &PprofOptions) -> Vec<i32> {
    let mut a = vec![d.attribute("thread.name", Value::Str(s.thread_name().to_string()))];
    if opts.thread_ids {
        a.push(d.attribute("thread.id", Value::Int(i64::from(s.pid))));
    }
    let state = match s.state {
        Some(state) => Some(state_name(state)),
        None if opts.on_cpu => Some(OFFCPU_STATE),
        None => None,
    };
    if let Some(state) = state {
        a.push(d.attribute("thread.state", Value::Str(state.to_string())));
    }
    a
}

/// A sample's stack, leaf first: a location per address.
fn sample_stack(d: &mut Dictionary, profile: &Profile, s: &Sample, shape: Shape) -> i32 {
    let mut frames = super::leaf_first(s, shape);
    if frames.is_empty() {
        frames.push(std::borrow::Cow::Owned(Frame::named(NO_FRAMES)));
    }
    let mut locations = Vec::with_capacity(frames.len());
    let mut group: Vec<&Frame> = Vec::new();
    for f in &frames {
        group.push(f);
        if !f.inlined {
            locations.push(d.location(profile, &group));
            group.clear();
        }
    }
    if !group.is_empty() {
        locations.push(d.location(profile, &group));
    }
    d.stack(locations)
}
