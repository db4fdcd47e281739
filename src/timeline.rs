//! `--timeline FILE`: the blocks in time. A stage of its own beside the
//! profile, from the blocks' records ([`crate::records`]): their stacks
//! named as the profile's are, the blocks are written as a Perfetto trace
//! ([`perfetto`]): a track for each process and thread, a slice for each
//! block, an instant on the waker's track at each wake-up with an arrow (a
//! flow) to the block it ended.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::output::sink::Sink;
use crate::profile::{OffState, Origin, Part, Profile, Waker};
use crate::raw::{clock_ns, Proc};
use crate::records::{BlockKey, Named, Record};

pub mod perfetto;

use perfetto as pf;

/// Where the trace goes.
pub struct Timeline {
    path: PathBuf,
    /// The trace, opened before anything is measured.
    sink: Sink,
}

/// What was written, said on stderr.
pub struct Written {
    pub blocks: u64,
    pub samples: u64,
    pub bytes: u64,
    pub flows: u64,
    /// Distinct threads, stacks, states and wakers among the blocks.
    pub keys: usize,
}

impl Timeline {
    /// Opens `path` for the trace: a path that cannot be written fails
    /// now, before any measurement.
    pub fn open(path: &Path) -> Result<Timeline> {
        let sink = Sink::open(Some(path), None)?;
        Ok(Timeline {
            path: path.to_path_buf(),
            sink,
        })
    }

    /// A scratch file for the records: in the trace's directory, or in
    /// `$TMPDIR` where the trace goes to a device or a pipe.
    pub fn scratch(&self) -> Result<File> {
        match self.sink.scratch() {
            Some(file) => file,
            None => crate::records::scratch_in(&std::env::temp_dir()),
        }
        .with_context(|| {
            format!(
                "cannot make the scratch file of the timeline {}",
                self.path.display()
            )
        })
    }

    /// Writes the trace of the records in `named`, put in place when
    /// whole. `only`: where the records are every thread's blocks
    /// (`--chains`), those the filters keep that lasted at least this
    /// long (ns).
    pub fn write(self, named: &Named, only: Option<u64>) -> Result<Written> {
        let cannot = || format!("cannot write the timeline {}", self.path.display());
        let records = named.read().with_context(cannot)?;
        let keep =
            |r: &Record| !r.cut && only.is_none_or(|min| r.profiled && (r.sample || r.ns() >= min));
        let mut written = None;
        self.sink
            .write(|out| {
                let mut counter = Counting { out, bytes: 0 };
                let (blocks, samples, flows) =
                    Writer::new(&named.profile, &named.keys, &named.waker_procs).write(
                        &mut counter,
                        records.filter(|r| r.as_ref().map_or(true, keep)),
                    )?;
                written = Some(Written {
                    blocks,
                    samples,
                    bytes: counter.bytes,
                    flows,
                    keys: named.keys.len(),
                });
                Ok(())
            })
            .with_context(cannot)?;
        Ok(written.expect("written"))
    }
}

/// Counts the bytes written through it.
struct Counting<'a> {
    out: &'a mut dyn Write,
    bytes: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The one sequence of packets the trace is written in.
const SEQUENCE: u32 = 1;
/// The track of wake-ups from interrupts and softirqs (a thread's and a
/// process's are numbered from 1 up).
const INTERRUPTS_TRACK: u64 = u64::MAX - 1;

/// Turns the named blocks into packets.
struct Writer<'a> {
    profile: &'a Profile,
    keys: &'a [BlockKey],
    /// The process of each key's waker (a task's).
    waker_procs: &'a [Option<Proc>],
    /// Interned: names, categories, annotation names, functions, files,
    /// frames, stacks.
    strings: Interned<String>,
    categories: Interned<&'static str>,
    annotations: Interned<&'static str>,
    functions: Interned<String>,
    files: Interned<String>,
    frames: Interned<(u64, u64, u32)>,
    callstacks: Interned<Vec<u64>>,
    /// Tracks: processes and threads.
    processes: HashMap<Proc, (u64, String)>,
    threads: HashMap<(Proc, u32), (u64, String)>,
    next_track: u64,
    buf: Vec<u8>,
}

/// Values numbered from 1 in the order first met.
struct Interned<T> {
    ids: HashMap<T, u64>,
    list: Vec<T>,
}

impl<T: std::hash::Hash + Eq + Clone> Interned<T> {
    fn new() -> Interned<T> {
        Interned {
            ids: HashMap::new(),
            list: Vec::new(),
        }
    }

    fn id(&mut self, v: T) -> u64 {
        if let Some(&id) = self.ids.get(&v) {
            return id;
        }
        self.list.push(v.clone());
        let id = self.list.len() as u64;
        self.ids.insert(v, id);
        id
    }

    /// Each value with its id.
    fn each(&self) -> impl Iterator<Item = (u64, &T)> {
        self.list.iter().enumerate().map(|(i, v)| (i as u64 + 1, v))
    }
}

/// What a key's blocks are written with, found once.
struct Shown {
    track: u64,
    name: u64,
    category: u64,
    callstack: Option<u64>,
    state: &'static str,
    waker: String,
    waker_tid: Option<u32>,
    /// The waker's track and its stack, where its wake-ups are shown.
    waker_track: Option<u64>,
    waker_callstack: Option<u64>,
    waker_name: u64,
}

impl Shown {
    /// An event of type `kind` on the key's track, with its name,
    /// category and stack.
    fn event(&self, kind: i32) -> pf::TrackEvent {
        pf::TrackEvent {
            category_iids: vec![self.category],
            name_iid: Some(self.name),
            r#type: Some(kind),
            track_uuid: Some(self.track),
            callstack_iid: self.callstack,
            ..Default::default()
        }
    }
}

impl<'a> Writer<'a> {
    fn new(profile: &'a Profile, keys: &'a [BlockKey], waker_procs: &'a [Option<Proc>]) -> Self {
        Writer {
            profile,
            keys,
            waker_procs,
            strings: Interned::new(),
            categories: Interned::new(),
            annotations: Interned::new(),
            functions: Interned::new(),
            files: Interned::new(),
            frames: Interned::new(),
            callstacks: Interned::new(),
            processes: HashMap::new(),
            threads: HashMap::new(),
            next_track: 1,
            buf: Vec::new(),
        }
    }

    /// Writes the trace: the clocks, the tracks, what is interned, then a
    /// slice for each block of `records` (and an instant for each sample)
    /// and the wake-ups. Returns the blocks, samples and flows written.
    fn write(
        mut self,
        out: &mut dyn Write,
        records: impl Iterator<Item = io::Result<Record>>,
    ) -> io::Result<(u64, u64, u64)> {
        let shown: Vec<Shown> = (0..self.keys.len()).map(|i| self.shown(i)).collect();
        let offset = boottime_offset();
        self.packet(out, clock_snapshot())?;
        self.write_tracks(out)?;
        self.write_interned(out)?;
        let (state_name, waker_name, waker_tid_name, at_start_name, at_end_name) = (
            self.annotations.ids["state"],
            self.annotations.ids["waker"],
            self.annotations.ids["waker tid"],
            self.annotations.ids["under way at the start"],
            self.annotations.ids["under way at the end"],
        );
        let (mut blocks, mut samples, mut flows) = (0u64, 0u64, 0u64);
        for (flow, r) in (1..).zip(records) {
            let r = r?;
            let (from, to, waking, at_start, at_end) =
                (r.from, r.to, r.waking, r.at_start, r.at_end);
            let s = &shown[r.key as usize];
            if r.sample {
                // An on-CPU sample: an instant on the thread's track.
                self.event(out, from + offset, s.event(pf::TYPE_INSTANT))?;
                samples += 1;
                continue;
            }
            blocks += 1;
            let mut notes = vec![
                string_note(state_name, s.state),
                string_note(waker_name, &s.waker),
            ];
            if let Some(tid) = s.waker_tid {
                notes.push(pf::DebugAnnotation {
                    name_iid: Some(waker_tid_name),
                    uint_value: Some(tid.into()),
                    string_value: None,
                });
            }
            for (on, name) in [(at_start, at_start_name), (at_end, at_end_name)] {
                if on {
                    notes.push(string_note(name, "yes"));
                }
            }
            // The wake-up that ended the block: an instant on the waker's
            // track, and a flow from it to the block's end (which comes
            // after it; a block under way at the start may have been woken
            // before the window opened).
            let flow = match (s.waker_track, waking) {
                (Some(track), w) if w != 0 && !at_end => {
                    let at = w.min(to.saturating_sub(1));
                    self.event(
                        out,
                        at + offset,
                        pf::TrackEvent {
                            name_iid: Some(s.waker_name),
                            r#type: Some(pf::TYPE_INSTANT),
                            track_uuid: Some(track),
                            flow_ids: vec![flow],
                            callstack_iid: s.waker_callstack,
                            ..Default::default()
                        },
                    )?;
                    flows += 1;
                    Some(flow)
                }
                _ => None,
            };
            self.event(
                out,
                from + offset,
                pf::TrackEvent {
                    debug_annotations: notes,
                    ..s.event(pf::TYPE_SLICE_BEGIN)
                },
            )?;
            self.event(
                out,
                to + offset,
                pf::TrackEvent {
                    r#type: Some(pf::TYPE_SLICE_END),
                    track_uuid: Some(s.track),
                    terminating_flow_ids: flow.into_iter().collect(),
                    ..Default::default()
                },
            )?;
        }
        Ok((blocks, samples, flows))
    }

    fn packet(&mut self, out: &mut dyn Write, mut p: pf::TracePacket) -> io::Result<()> {
        p.trusted_packet_sequence_id = Some(SEQUENCE);
        pf::write_packet(out, &p, &mut self.buf)
    }

    fn event(&mut self, out: &mut dyn Write, ts: u64, e: pf::TrackEvent) -> io::Result<()> {
        self.packet(
            out,
            pf::TracePacket {
                timestamp: Some(ts),
                track_event: Some(e),
                sequence_flags: Some(pf::SEQ_NEEDS_INCREMENTAL_STATE),
                ..Default::default()
            },
        )
    }

    /// How key `i`'s blocks are shown: their track, name, state, stacks
    /// and waker.
    fn shown(&mut self, i: usize) -> Shown {
        let (k, s) = (&self.keys[i], &self.profile.samples[i]);
        let p = Proc {
            tgid: k.tgid,
            start: k.start,
        };
        let track = self.thread_track(p, k.pid, s.thread_name());
        let name = crate::records::block_name(s, &self.profile.objects);
        let name = self.strings.id(name);
        let state = state_name(k.state);
        let category = self.categories.id(state);
        let callstack = self.callstack(&s.user, &s.kernel);
        let (mut waker, mut waker_tid, mut waker_track, mut waker_callstack) =
            (String::new(), None, None, None);
        match &s.waker {
            Some(Waker::Task {
                comm,
                pid,
                user,
                kernel,
            }) => {
                waker = format!("{comm} ({pid})");
                waker_tid = Some(*pid);
                if let Some(wp) = self.waker_procs[i] {
                    waker_track = Some(self.thread_track(wp, *pid, comm));
                }
                waker_callstack = self.callstack(user, kernel);
            }
            Some(w @ (Waker::Interrupt { kernel } | Waker::Softirq { kernel })) => {
                waker = w.name().to_string();
                waker_track = Some(INTERRUPTS_TRACK);
                waker_callstack = self.callstack(&Part::Absent, kernel);
            }
            Some(w) => waker = w.name().to_string(),
            None => {}
        }
        let waker_name = self.strings.id(format!("wakes {} ({})", k.comm, k.pid));
        Shown {
            track,
            name,
            category,
            callstack,
            state,
            waker,
            waker_tid,
            waker_track,
            waker_callstack,
            waker_name,
        }
    }

    /// The track of thread `tid` of process `p` (made once, named by the
    /// first name it is met with).
    fn thread_track(&mut self, p: Proc, tid: u32, name: &str) -> u64 {
        if !self.processes.contains_key(&p) {
            let track = self.next_track;
            self.next_track += 1;
            self.processes.insert(p, (track, process_name(p.tgid)));
        }
        if tid == p.tgid {
            // The process's main thread names it where /proc cannot.
            if let Some((_, pname)) = self.processes.get_mut(&p) {
                if pname.is_empty() {
                    *pname = name.to_string();
                }
            }
        }
        let next = &mut self.next_track;
        self.threads
            .entry((p, tid))
            .or_insert_with(|| {
                let track = *next;
                *next += 1;
                (track, name.to_string())
            })
            .0
    }

    /// The interned stack of `user` and `kernel` (innermost first each):
    /// the outermost frame first, the user frames before the kernel's;
    /// None where neither has frames.
    fn callstack(&mut self, user: &Part, kernel: &Part) -> Option<u64> {
        let mut ids = Vec::new();
        for (part, missed) in [
            (user, crate::shape::MISSED_USER),
            (kernel, crate::shape::MISSED_KERNEL),
        ] {
            match part {
                Part::Frames(frames) => {
                    for f in frames.iter().rev() {
                        let function = self.functions.id(f.name.to_string());
                        let (file, line) = match (f.origin, &f.file) {
                            (Origin::Runtime(_), Some(file)) => (
                                self.files.id(file.to_string()),
                                u32::try_from(f.addr).unwrap_or(0),
                            ),
                            _ => (0, 0),
                        };
                        ids.push(self.frames.id((function, file, line)));
                    }
                }
                Part::Missed => {
                    let function = self.functions.id(missed.to_string());
                    ids.push(self.frames.id((function, 0, 0)));
                }
                Part::Absent => {}
            }
        }
        (!ids.is_empty()).then(|| self.callstacks.id(ids))
    }

    fn write_tracks(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let mut processes: Vec<(Proc, (u64, String))> = self
            .processes
            .iter()
            .map(|(p, t)| (*p, t.clone()))
            .collect();
        processes.sort_by_key(|(_, (track, _))| *track);
        for (p, (track, name)) in processes {
            self.packet(
                out,
                track_packet(pf::TrackDescriptor {
                    uuid: Some(track),
                    process: Some(pf::ProcessDescriptor {
                        pid: Some(p.tgid as i32),
                        process_name: (!name.is_empty()).then_some(name),
                    }),
                    ..Default::default()
                }),
            )?;
        }
        let mut threads: Vec<((Proc, u32), (u64, String))> =
            self.threads.iter().map(|(t, v)| (*t, v.clone())).collect();
        threads.sort_by_key(|(_, (track, _))| *track);
        for ((p, tid), (track, name)) in threads {
            self.packet(
                out,
                track_packet(pf::TrackDescriptor {
                    uuid: Some(track),
                    parent_uuid: self.processes.get(&p).map(|(t, _)| *t),
                    thread: Some(pf::ThreadDescriptor {
                        pid: Some(p.tgid as i32),
                        tid: Some(tid.into()),
                        thread_name: Some(name),
                    }),
                    ..Default::default()
                }),
            )?;
        }
        self.packet(
            out,
            track_packet(pf::TrackDescriptor {
                uuid: Some(INTERRUPTS_TRACK),
                name: Some("wake-ups from interrupts".into()),
                ..Default::default()
            }),
        )
    }

    fn write_interned(&mut self, out: &mut dyn Write) -> io::Result<()> {
        for name in [
            "state",
            "waker",
            "waker tid",
            "under way at the start",
            "under way at the end",
        ] {
            self.annotations.id(name);
        }
        let interned = pf::InternedData {
            event_categories: (self.categories.each())
                .map(|(iid, n)| pf::EventCategory {
                    iid: Some(iid),
                    name: Some(n.to_string()),
                })
                .collect(),
            event_names: (self.strings.each())
                .map(|(iid, n)| pf::EventName {
                    iid: Some(iid),
                    name: Some(n.clone()),
                })
                .collect(),
            debug_annotation_names: (self.annotations.each())
                .map(|(iid, n)| pf::DebugAnnotationName {
                    iid: Some(iid),
                    name: Some(n.to_string()),
                })
                .collect(),
            function_names: interned_strings(&self.functions),
            source_paths: interned_strings(&self.files),
            frames: (self.frames.each())
                .map(|(iid, &(function, file, line))| pf::Frame {
                    iid: Some(iid),
                    function_name_id: Some(function),
                    source_path_iid: (file != 0).then_some(file),
                    line_number: (line != 0).then_some(line),
                })
                .collect(),
            callstacks: (self.callstacks.each())
                .map(|(iid, frames)| pf::Callstack {
                    iid: Some(iid),
                    frame_ids: frames.clone(),
                })
                .collect(),
        };
        self.packet(
            out,
            pf::TracePacket {
                interned_data: Some(interned),
                sequence_flags: Some(pf::SEQ_INCREMENTAL_STATE_CLEARED),
                first_packet_on_sequence: Some(true),
                ..Default::default()
            },
        )
    }
}

fn track_packet(d: pf::TrackDescriptor) -> pf::TracePacket {
    pf::TracePacket {
        track_descriptor: Some(d),
        ..Default::default()
    }
}

fn interned_strings(s: &Interned<String>) -> Vec<pf::InternedString> {
    s.each()
        .map(|(iid, v)| pf::InternedString {
            iid: Some(iid),
            str: Some(v.as_bytes().to_vec()),
        })
        .collect()
}

fn string_note(name: u64, value: &str) -> pf::DebugAnnotation {
    pf::DebugAnnotation {
        name_iid: Some(name),
        uint_value: None,
        string_value: Some(value.to_string()),
    }
}

/// The state a block is shown in (its category).
fn state_name(state: Option<OffState>) -> &'static str {
    match state {
        Some(OffState::Sleep) => "sleep",
        Some(OffState::Io) => "io",
        Some(OffState::Blocked) => "blocked",
        Some(OffState::RunQueue) => "runqueue",
        Some(OffState::Stopped) => "stopped",
        Some(OffState::Running) => "running",
        None => "off-cpu",
    }
}

/// A process's name, as `/proc` has it now ("" where it is gone).
fn process_name(tgid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{tgid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// BOOTTIME less CLOCK_MONOTONIC now: what turns the program's times into
/// the trace's clock.
fn boottime_offset() -> u64 {
    let (boot, mono) = (
        clock_ns(libc::CLOCK_BOOTTIME),
        clock_ns(libc::CLOCK_MONOTONIC),
    );
    boot.saturating_sub(mono)
}

/// The clocks at one moment: the trace's (BOOTTIME), the program's and
/// the wall clock, which the UI shows times in.
fn clock_snapshot() -> pf::TracePacket {
    let clock = |id, clock| pf::Clock {
        clock_id: Some(id),
        timestamp: Some(clock_ns(clock)),
    };
    pf::TracePacket {
        clock_snapshot: Some(pf::ClockSnapshot {
            clocks: vec![
                clock(pf::CLOCK_BOOTTIME, libc::CLOCK_BOOTTIME),
                clock(pf::CLOCK_MONOTONIC, libc::CLOCK_MONOTONIC),
                clock(pf::CLOCK_REALTIME, libc::CLOCK_REALTIME),
            ],
            primary_trace_clock: Some(pf::CLOCK_BOOTTIME as i32),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, FrameInfo, ObjectInfo, Sample};

    fn frame(name: &str, origin: Origin) -> Frame {
        Frame::new(FrameInfo {
            origin,
            ..FrameInfo::named(name)
        })
    }

    fn sample(user: Vec<Frame>, kernel: Vec<Frame>) -> Sample {
        let part = |f: Vec<Frame>| {
            if f.is_empty() {
                Part::Absent
            } else {
                Part::Frames(f.into())
            }
        };
        Sample {
            comm: "worker".into(),
            tgid: 1,
            pid: 2,
            thread: None,
            user: part(user),
            kernel: part(kernel),
            state: None,
            waker: None,
            container: None,
            total_ns: 0,
            count: 1,
        }
    }

    fn objects() -> Vec<ObjectInfo> {
        ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/srv/app/bin/server"]
            .iter()
            .map(|p| ObjectInfo {
                path: p.to_string(),
                build_id: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_block_is_named_by_its_innermost_frame_of_the_program() {
        let (libc, app) = (Origin::Object(0), Origin::Object(1));
        let kernel = vec![
            frame("__schedule", Origin::Kernel),
            frame("schedule", Origin::Kernel),
            frame("do_nanosleep", Origin::Kernel),
        ];
        // Past the C library's frames to the program's own.
        let s = sample(
            vec![
                frame("__clock_nanosleep", libc),
                frame("wait_for_work", app),
                frame("main", app),
            ],
            kernel.clone(),
        );
        assert_eq!(crate::records::block_name(&s, &objects()), "wait_for_work");
        // A runtime's frame first, even outside the program's file.
        let python = Origin::Runtime(crate::runtime::Kind::Python);
        let s = sample(
            vec![
                frame("__clock_nanosleep", libc),
                frame("[unknown]", Origin::Unknown),
                frame("time_sleep", app),
                frame("poll_queue", python),
            ],
            Vec::new(),
        );
        assert_eq!(crate::records::block_name(&s, &objects()), "poll_queue");
        // Only the system's code: its innermost frame.
        let s = sample(vec![frame("__clock_nanosleep", libc)], Vec::new());
        assert_eq!(
            crate::records::block_name(&s, &objects()),
            "__clock_nanosleep"
        );
        // A kernel thread: its first frame outside the scheduler.
        let s = sample(Vec::new(), kernel);
        assert_eq!(crate::records::block_name(&s, &objects()), "do_nanosleep");
        // Nothing: the thread's name.
        assert_eq!(
            crate::records::block_name(&sample(Vec::new(), Vec::new()), &objects()),
            "worker"
        );
    }

    #[test]
    fn system_libraries_are_told_from_programs() {
        assert!(crate::records::is_system_library(
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        ));
        assert!(crate::records::is_system_library(
            "/lib64/ld-linux-x86-64.so.2"
        ));
        assert!(!crate::records::is_system_library("/usr/bin/python3.11"));
        assert!(!crate::records::is_system_library("/opt/app/lib/libapp.so"));
        assert!(!crate::records::is_system_library(
            "/home/u/target/release/examples/chain"
        ));
    }
}
