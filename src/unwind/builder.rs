//! The threads that build objects' tables from their files' call-frame
//! information, and the unwinder's requests to them and the tables it takes
//! in (or keeps until there is room).

use std::fs::File;
use std::time::{Duration, Instant};

use super::{Processes, Unplaced, Unwinder, GRACE};
use crate::elf::{load_segments, Segment};
use crate::unwind_table;

/// A table asked of the builder: for whom, to report a failure once.
#[derive(Clone, Debug)]
pub(super) struct Requested {
    pub(super) tgid: u32,
    pub(super) object: u32,
    pub(super) name: String,
    /// The object's first build (not a retry for want of room).
    pub(super) first: bool,
}

/// The rows and the file's loadable segments; None: no call-frame
/// information; Err: why it could not be read.
type BuiltTable = std::result::Result<Option<(Vec<unwind_table::Row>, Vec<Segment>)>, String>;

/// A table built by the builder thread.
struct Built {
    object: u32,
    table: BuiltTable,
    took: Duration,
}

/// How many threads build tables: two, where there are two CPUs, so that
/// one large library (seconds to build) does not hold up the others at
/// start-up, when every process alive waits for its tables.
const BUILDERS: usize = 2;

/// The threads that turn files' call-frame information into rows, so that
/// a large library holds up neither the reading of events nor the tables
/// of files already built.
pub(super) struct Builder {
    jobs: Option<std::sync::mpsc::Sender<(u32, File)>>,
    done: std::sync::mpsc::Receiver<Built>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Builder {
    pub(super) fn start() -> Builder {
        let (jobs, todo) = std::sync::mpsc::channel::<(u32, File)>();
        let todo = std::sync::Arc::new(std::sync::Mutex::new(todo));
        let (tell, done) = std::sync::mpsc::channel();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads: Vec<_> = (0..BUILDERS.min(cpus))
            .filter_map(|_| {
                let todo = todo.clone();
                let tell = tell.clone();
                std::thread::Builder::new()
                    .name("unwind-tables".into())
                    .spawn(move || {
                        crate::priority::below_loader();
                        loop {
                            // The lock is held only while waiting for a job.
                            let job = match todo.lock() {
                                Ok(rx) => rx.recv(),
                                Err(_) => break,
                            };
                            let Ok((object, file)) = job else {
                                break;
                            };
                            crate::priority::settle();
                            let began = Instant::now();
                            // A file that makes the parser panic is one
                            // without a table, not the end of the run.
                            let table = std::panic::catch_unwind(|| build_table(&file))
                                .unwrap_or_else(|_| {
                                    Err("its call-frame information could not be parsed".into())
                                });
                            drop(file);
                            let built = Built {
                                object,
                                table,
                                took: began.elapsed(),
                            };
                            if tell.send(built).is_err() {
                                break;
                            }
                            crate::give_back_freed_memory();
                        }
                        crate::priority::helper_ends();
                    })
                    .ok()
            })
            .collect();
        Builder {
            jobs: (!threads.is_empty()).then_some(jobs),
            done,
            threads,
        }
    }

    fn send(&self, object: u32, file: File) -> std::result::Result<(), ()> {
        match &self.jobs {
            Some(j) => j.send((object, file)).map_err(|_| ()),
            None => Err(()),
        }
    }

    fn try_recv(&self) -> Option<Built> {
        self.done.try_recv().ok()
    }

    fn recv_timeout(&self, d: Duration) -> Option<Built> {
        self.done.recv_timeout(d).ok()
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        // No more jobs: each thread ends after the one it is on.
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The rows of a file, and its segments.
fn build_table(file: &File) -> BuiltTable {
    let Some(segments) = load_segments(file) else {
        return Ok(None);
    };
    match unwind_table::build(file) {
        Ok(Some((rows, _))) => Ok(Some((rows, segments))),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("{e:#}")),
    }
}

impl Unwinder {
    /// Whether `object` has no table yet, or had no room for it and may
    /// have now.
    pub(super) fn needs_build(&self, object: u32, keep: &[u32]) -> bool {
        match self.objects.get(&object) {
            None => true,
            Some(e) => e.wants_rows.is_some_and(|n| self.room(keep) >= n),
        }
    }

    /// Asks the builder thread for the table of `object`; an object with
    /// no file to read is settled at once (no table).
    pub(super) fn request(&mut self, procs: &dyn Processes, tgid: u32, object: u32) {
        let file = procs.object_file(object).and_then(|f| f.try_clone().ok());
        let Some(file) = file else {
            self.settle(object, None, None, true);
            return;
        };
        let first = !self.objects.contains_key(&object);
        self.building.insert(
            object,
            Requested {
                tgid,
                object,
                name: procs.object_name(object).to_string(),
                first,
            },
        );
        if self.builder.send(object, file).is_err() {
            // The builder is gone: no more tables.
            self.building.remove(&object);
            self.settle(object, None, None, first);
        }
    }

    /// Takes in the tables built since the last call, and gives their
    /// tables to the processes that waited for them. Returns whether
    /// tables are still being built.
    pub fn poll(&mut self, procs: &dyn Processes) -> bool {
        if self.store.is_none() {
            return true;
        }
        self.reclaim();
        self.retry_lacking(procs);
        let mut built = Vec::new();
        while let Some(b) = self.builder.try_recv() {
            built.push(b);
        }
        let placed = self.place_unplaced();
        if placed && built.is_empty() {
            let ready: Vec<u32> = self.waiting.iter().copied().collect();
            for tgid in ready {
                self.note_process(procs, tgid);
            }
        }
        self.take_in(procs, built);
        !self.building.is_empty()
    }

    /// Takes in built tables and gives them to the processes that waited.
    fn take_in(&mut self, procs: &dyn Processes, built: Vec<Built>) {
        if built.is_empty() {
            return;
        }
        // Room for all of them at once, where they will go (see
        // TableStore::reserve_rows); what does not fit is placed as
        // before, one at a time.
        let max = super::tables::MAX_OBJECT_ROWS;
        let lens: Vec<usize> = built
            .iter()
            .filter(|b| self.building.contains_key(&b.object))
            .filter_map(|b| match &b.table {
                Ok(Some((rows, _))) if rows.len() <= max => Some(rows.len()),
                _ => None,
            })
            .collect();
        let end = self.rows.end_after(&lens);
        if end > 0 {
            // Failing, each table grows it as it is written.
            let _ = self.store().reserve_rows(end);
        }
        for b in built {
            self.take_built(b);
        }
        crate::give_back_freed_memory();
        let ready: Vec<u32> = self.waiting.iter().copied().collect();
        for tgid in ready {
            self.note_process(procs, tgid);
        }
    }

    /// Waits until every table asked for is built and given to its
    /// processes (before tracing starts), or `limit` has passed.
    pub fn finish(&mut self, procs: &dyn Processes, limit: Duration) {
        if self.store.is_none() {
            return;
        }
        let until = Instant::now() + limit;
        while self.poll(procs) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut built: Vec<Built> = self
                .builder
                .recv_timeout(left.min(Duration::from_millis(50)))
                .into_iter()
                .collect();
            // And those done meanwhile: placed together.
            while let Some(b) = self.builder.try_recv() {
                built.push(b);
            }
            self.take_in(procs, built);
        }
    }

    fn take_built(&mut self, built: Built) {
        self.stats.build_ms += built.took.as_secs_f64() * 1e3;
        let Some(req) = self.building.remove(&built.object) else {
            return;
        };
        match built.table {
            Ok(None) => self.settle(built.object, None, None, req.first),
            Err(why) => {
                if req.first {
                    self.refuse(req.tgid, &req.name, why);
                }
                self.settle(built.object, None, None, false);
            }
            Ok(Some((rows, segments))) => match self.place(&req, rows, segments) {
                Ok((table, wants)) => self.settle(built.object, table, wants, false),
                Err((rows, segments)) => self.wait_for_room(built.object, req, rows, segments),
            },
        }
    }

    /// Keeps built rows until the idle objects whose file entries were
    /// just removed can give their room ([`GRACE`] from now).
    fn wait_for_room(
        &mut self,
        object: u32,
        req: Requested,
        rows: Vec<unwind_table::Row>,
        segments: Vec<Segment>,
    ) {
        self.building.insert(object, req.clone());
        self.unplaced.push(Unplaced {
            since: Instant::now(),
            object,
            req,
            rows,
            segments,
        });
    }

    /// Places the rows that waited for room long enough: whether any was
    /// settled.
    fn place_unplaced(&mut self) -> bool {
        let now = Instant::now();
        let (due, wait): (Vec<Unplaced>, Vec<Unplaced>) = std::mem::take(&mut self.unplaced)
            .into_iter()
            .partition(|u| now.duration_since(u.since) >= GRACE);
        self.unplaced = wait;
        let placed = !due.is_empty();
        for u in due {
            self.building.remove(&u.object);
            match self.place(&u.req, u.rows, u.segments) {
                Ok((table, wants)) => self.settle(u.object, table, wants, false),
                Err((rows, segments)) => self.wait_for_room(u.object, u.req, rows, segments),
            }
        }
        placed
    }
}
