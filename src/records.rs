//! The blocks one by one, a stage of its own beside the counts: the BPF
//! program sends a record of each block as it ends ([`RawBlock`]:
//! `--timeline`'s of at least `--timeline-min`, `--chains`' of every
//! thread). They are kept here as they come, in a scratch file beside the
//! output: memory holds one entry for each distinct thread, stacks, state
//! and waker (a [`BlockKey`]), not one for each block. At the end the keys'
//! stacks are named as the profile's are ([`Records::name`]), and the
//! blocks read back in the order they came ([`Named::read`]) by the
//! timeline and the chains.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use crate::profile::{FrameSource, NameSource, OffState, Origin, Part, Profile, Sample};
use crate::raw::{Proc, RawBlock, RawEntry, RawProfile, StackRef, WakerRef};

/// What makes blocks alike but for their times: each distinct one is
/// named once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub tgid: u32,
    pub start: u64,
    pub pid: u32,
    pub comm: String,
    pub user: StackRef,
    pub kernel: StackRef,
    pub state: Option<OffState>,
    pub waker: Option<WakerRef>,
}

/// One block (or `--on-cpu` sample) as it came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its [`BlockKey`], by number ([`Named::keys`]).
    pub key: u32,
    /// CLOCK_MONOTONIC ns: [from, to), inside the window.
    pub from: u64,
    pub to: u64,
    /// When the wake-up that ended it began; 0 where none was seen.
    pub waking: u64,
    /// Under way at the window's start, at its end.
    pub at_start: bool,
    pub at_end: bool,
    /// An on-CPU sample at `from`, not a block.
    pub sample: bool,
    /// Kept by the filters (see [`RawBlock::profiled`]).
    pub profiled: bool,
    /// Sent at an interval's end, under way (see [`RawBlock::cut`]).
    pub cut: bool,
}

/// A record in the scratch file: its key's number, its times, its flags.
const SPOOLED_BYTES: usize = 4 + 8 + 8 + 8 + 1;

impl Record {
    fn to_bytes(self) -> [u8; SPOOLED_BYTES] {
        let mut rec = [0u8; SPOOLED_BYTES];
        rec[..4].copy_from_slice(&self.key.to_le_bytes());
        rec[4..12].copy_from_slice(&self.from.to_le_bytes());
        rec[12..20].copy_from_slice(&self.to.to_le_bytes());
        rec[20..28].copy_from_slice(&self.waking.to_le_bytes());
        rec[28] = u8::from(self.at_start)
            | u8::from(self.at_end) << 1
            | u8::from(self.sample) << 2
            | u8::from(self.profiled) << 3
            | u8::from(self.cut) << 4;
        rec
    }

    fn of_bytes(rec: &[u8; SPOOLED_BYTES]) -> Record {
        let word = |at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().expect("8 bytes"));
        Record {
            key: u32::from_le_bytes(rec[..4].try_into().expect("4 bytes")),
            from: word(4),
            to: word(12),
            waking: word(20),
            at_start: rec[28] & 1 != 0,
            at_end: rec[28] & 2 != 0,
            sample: rec[28] & 4 != 0,
            profiled: rec[28] & 8 != 0,
            cut: rec[28] & 16 != 0,
        }
    }

    /// How long the block was seen, inside the window.
    pub fn ns(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }
}

/// The records of a trace under way.
pub struct Records {
    spool: BufWriter<File>,
    /// The first error writing the scratch file: whatever reads the
    /// records fails with it at the end (the profile of counts is written
    /// all the same).
    spool_error: Option<io::Error>,
    keys: HashMap<BlockKey, u32>,
    key_list: Vec<BlockKey>,
    /// Records kept: blocks and samples.
    records: u64,
    samples: u64,
}

impl Records {
    /// Records kept in `scratch`, a file of their own, read and written.
    pub fn new(scratch: File) -> Records {
        Records {
            spool: BufWriter::with_capacity(1 << 16, scratch),
            spool_error: None,
            keys: HashMap::new(),
            key_list: Vec::new(),
            records: 0,
            samples: 0,
        }
    }

    /// Keeps `blocks` (as read from the program, in any order).
    pub fn add(&mut self, blocks: Vec<RawBlock>) {
        for b in blocks {
            let key = BlockKey {
                tgid: b.tgid,
                start: b.start,
                pid: b.pid,
                comm: b.comm,
                user: b.user_stack,
                kernel: b.kernel_stack,
                state: b.state,
                waker: b.waker,
            };
            let n = match self.keys.get(&key) {
                Some(&n) => n,
                None => {
                    let n = self.key_list.len() as u32;
                    self.key_list.push(key.clone());
                    self.keys.insert(key, n);
                    n
                }
            };
            let rec = Record {
                key: n,
                from: b.from_ns,
                to: b.to_ns,
                waking: b.waking_ns.unwrap_or(0),
                at_start: b.at_start,
                at_end: b.at_end,
                sample: b.sample,
                profiled: b.profiled,
                cut: b.cut,
            };
            if self.spool_error.is_none() {
                if let Err(e) = self.spool.write_all(&rec.to_bytes()) {
                    self.spool_error = Some(e);
                }
            }
            self.records += 1;
            self.samples += u64::from(b.sample);
        }
    }

    /// The stacks and wakers the blocks name, to be read with the counts'.
    pub fn wanted(&self) -> (Vec<u64>, Vec<u64>) {
        let (mut stacks, mut wakers) = (Vec::new(), Vec::new());
        for k in &self.key_list {
            for s in [k.user, k.kernel] {
                if let StackRef::Id(id) = s {
                    stacks.push(id);
                }
            }
            if let Some(WakerRef::Id(id)) = k.waker {
                wakers.push(id);
            }
        }
        (stacks, wakers)
    }

    /// Names the keys' stacks with `source` and `names`, as the profile is
    /// built (`raw` holds the stacks and wakers read; its entries are left
    /// as they were; `complete` does to the keys what the profile's
    /// entries have done to them before they are built).
    pub fn name<F: FrameSource, N: NameSource<F>>(
        mut self,
        raw: &mut RawProfile,
        source: &mut F,
        names: &N,
        kernel_first_is_ip: bool,
        complete: impl Fn(&mut RawProfile),
    ) -> io::Result<Named> {
        if let Some(e) = self.spool_error.take() {
            return Err(e);
        }
        let entries: Vec<RawEntry> = self.key_list.iter().map(entry_of).collect();
        let counted = std::mem::replace(&mut raw.entries, entries);
        complete(raw);
        let profile = crate::profile::build_each(raw, source, names, kernel_first_is_ip);
        let waker_procs = self
            .key_list
            .iter()
            .map(|k| match k.waker {
                Some(WakerRef::Id(id)) => {
                    raw.wakers.get(&id).filter(|w| w.pid != 0).map(|w| Proc {
                        tgid: w.tgid,
                        start: w.start,
                    })
                }
                _ => None,
            })
            .collect();
        let waker_devs = self
            .key_list
            .iter()
            .map(|k| match k.waker {
                Some(WakerRef::Id(id)) => raw.wakers.get(&id).map_or(0, |w| w.dev),
                _ => 0,
            })
            .collect();
        raw.entries = counted;
        let spool = self.spool.into_inner().map_err(|e| e.into_error())?;
        Ok(Named {
            profile,
            keys: self.key_list,
            waker_procs,
            waker_devs,
            spool,
            records: self.records,
            samples: self.samples,
        })
    }
}

/// The records with their keys named.
pub struct Named {
    /// One sample for each key, in the keys' order (its time 0).
    pub profile: Profile,
    pub keys: Vec<BlockKey>,
    /// The process of each key's waker (a task's).
    pub waker_procs: Vec<Option<Proc>>,
    /// The disk of each key's waker, where it was an interrupt that
    /// completed a block I/O request (see [`crate::raw::RawWaker::dev`]).
    pub waker_devs: Vec<u32>,
    spool: File,
    /// Records kept: blocks and samples.
    pub records: u64,
    pub samples: u64,
}

impl Named {
    /// The records, from the first, in the order they came.
    pub fn read(&self) -> io::Result<Reader> {
        let mut file = self.spool.try_clone()?;
        file.rewind()?;
        Ok(Reader {
            from: BufReader::with_capacity(1 << 16, file),
            left: self.records,
            keys: self.keys.len(),
        })
    }
}

/// The records of a scratch file, one by one.
pub struct Reader {
    from: BufReader<File>,
    left: u64,
    keys: usize,
}

impl Iterator for Reader {
    type Item = io::Result<Record>;

    fn next(&mut self) -> Option<io::Result<Record>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let mut rec = [0u8; SPOOLED_BYTES];
        if let Err(e) = self.from.read_exact(&mut rec) {
            self.left = 0;
            return Some(Err(e));
        }
        let r = Record::of_bytes(&rec);
        if r.key as usize >= self.keys {
            self.left = 0;
            return Some(Err(io::Error::other(
                "a record of the scratch file names no key",
            )));
        }
        Some(Ok(r))
    }
}

/// A scratch file in `dir`, unnamed where the file system allows it, else
/// named and removed at once.
pub fn scratch_in(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)
    {
        Ok(f) => Ok(f),
        Err(_) => {
            let path = dir.join(format!(".offcputime-records-{}", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        }
    }
}

/// A block key as a count entry, so that the profile's builder names it.
fn entry_of(k: &BlockKey) -> RawEntry {
    RawEntry {
        tgid: k.tgid,
        start: k.start,
        pid: k.pid,
        comm: k.comm.clone(),
        user_stack: k.user,
        kernel_stack: k.kernel,
        state: k.state,
        waker: k.waker,
        interval: 0,
        span: 1,
        total_ns: 0,
        count: 1,
    }
}

/// What a block is named by: the innermost frame of the program's own
/// code (a runtime's frame: Python, Java, JavaScript; else one of a file
/// that is not a system library), else its innermost user frame, else its
/// innermost kernel frame outside the scheduler, else the thread's name.
pub fn block_name(s: &Sample, objects: &[crate::profile::ObjectInfo]) -> String {
    let frames = |p: &Part| match p {
        Part::Frames(f) => f.to_vec(),
        _ => Vec::new(),
    };
    let user = frames(&s.user);
    let known = |f: &&crate::profile::Frame| !f.name.starts_with('[');
    let runtime = user
        .iter()
        .filter(known)
        .find(|f| matches!(f.origin, Origin::Runtime(_)));
    let own = || {
        user.iter().filter(known).find(|f| match f.origin {
            Origin::Object(i) => objects
                .get(i as usize)
                .is_some_and(|o| !is_system_library(&o.path)),
            _ => false,
        })
    };
    if let Some(f) = runtime.or_else(own).or_else(|| user.iter().find(known)) {
        return f.name.to_string();
    }
    let kernel = frames(&s.kernel);
    if let Some(f) = kernel
        .iter()
        .filter(known)
        .find(|f| !is_scheduler_frame(&f.name))
    {
        return f.name.to_string();
    }
    s.thread_name().to_string()
}

/// Whether `path` is a library of the system's (its C library, loader,
/// C++ runtime...), not the program's own code.
pub(crate) fn is_system_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let in_lib = [
        "/lib/",
        "/lib64/",
        "/usr/lib/",
        "/usr/lib64/",
        "/usr/local/lib/",
    ]
    .iter()
    .any(|d| path.starts_with(d));
    (in_lib && name.starts_with("lib")) || name.starts_with("ld-linux") || name == "[vdso]"
}

/// A kernel frame of the scheduler's or of the wait itself: not what a
/// block is named by.
fn is_scheduler_frame(name: &str) -> bool {
    name.contains("schedule")
        || name.starts_with("__switch_to")
        || name.starts_with("finish_task_switch")
        || name.starts_with("__traceiter")
        || name.starts_with("bpf_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let r = Record {
            key: 7,
            from: 1 << 40,
            to: (1 << 40) + 5,
            waking: (1 << 40) + 3,
            at_start: false,
            at_end: true,
            sample: false,
            profiled: true,
            cut: true,
        };
        assert_eq!(Record::of_bytes(&r.to_bytes()), r);
        assert_eq!(r.ns(), 5);
    }
}
