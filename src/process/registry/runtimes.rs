//! The language runtimes of processes, as the registry keeps them (see
//! [`crate::runtime`]): which objects hold a runtime, the BPF program's
//! entry for each process that maps one, the code their frames name.

use super::Registry;
use crate::process::Proc;
use crate::runtime::{FrameName, Kind, ProcEntry, Runtime};

impl Registry {
    /// A walk of process `p`'s frames of runtime `kind` met code `code`
    /// with `tag` (and `at`): what it names is read now, while the
    /// process runs.
    pub fn note_runtime_code(&mut self, kind: Kind, p: Proc, code: u64, tag: u32, at: u64) {
        self.runtimes.get_mut(kind).note_code(p, code, tag, at);
    }

    /// The name of a [`UserFrame::Runtime`] frame's code.
    ///
    /// [`UserFrame::Runtime`]: super::UserFrame::Runtime
    pub fn runtime_name(&self, kind: Kind, code: u32, at: u32) -> Option<FrameName<'_>> {
        self.runtimes.get(kind).name(code, at)
    }

    /// Whether stack `addrs` has frames of a runtime.
    pub fn has_runtime_frames(&self, addrs: &[u64]) -> bool {
        self.runtimes.of_stack(addrs).is_some()
    }

    /// Each runtime keeps its call machinery between two of its frames
    /// (`--python-glue`), or hides it.
    pub fn keep_call_glue(&mut self, keep: bool) {
        for r in self.runtimes.iter_mut() {
            r.keep_call_glue(keep);
        }
    }

    /// Whether process `p` was found to run a runtime (running or exited).
    pub fn runtime_seen(&self, p: Proc) -> bool {
        self.runtimes.seen_in(p).is_some()
    }

    /// The runtime process `p` runs, if its frames are read.
    pub fn runtime_of(&self, p: Proc) -> Option<Kind> {
        self.runtimes.of_process(p)
    }

    /// Each runtime's last work before the end (see [`Runtime::settle`]).
    pub fn settle_runtimes(&mut self) {
        for r in self.runtimes.iter_mut() {
            r.settle();
        }
    }

    /// Whether process `tgid`'s code without tables (generated code) may
    /// be walked through frame pointers: not where it maps a runtime whose
    /// generated code keeps none (see
    /// [`crate::runtime::Spec::jit_without_frame_pointers`]).
    pub fn jit_keeps_frame_pointers(&self, tgid: u32) -> bool {
        let Some(mappings) = self.snapshots.processes.get(&tgid) else {
            return true;
        };
        !mappings.iter().any(|m| {
            let name = &self.files.objects[m.object as usize].name;
            crate::runtime::RUNTIMES
                .iter()
                .any(|s| s.jit_without_frame_pointers.contains(&name.as_str()))
        })
    }

    /// Each runtime reads its threads' names not read yet (see
    /// [`Runtime::read_threads`]).
    pub fn read_runtime_threads(&mut self) {
        for r in self.runtimes.iter_mut() {
            r.read_threads();
        }
    }

    /// Thread `tid` of process `p`'s name in its runtime, where it has one
    /// (a JVM's Java thread name).
    pub fn runtime_thread_name(&self, p: Proc, tid: u32) -> Option<std::sync::Arc<str>> {
        self.runtimes.thread_name(p, tid)
    }

    /// The runtimes' processes not ready yet (see [`Runtime::pending`]).
    pub fn runtimes_pending(&self) -> Vec<Proc> {
        self.runtimes.iter().flat_map(|r| r.pending()).collect()
    }

    /// What the runtimes walked must know of this moment to step over a
    /// stack of process `p` copied now (see [`Runtime::copy_mark`]).
    pub fn copy_mark(&self, p: Proc) -> Option<u64> {
        self.walked().find_map(|r| r.copy_mark(p))
    }

    /// Process `p`'s runtime was told to the BPF program before the
    /// window opened: where the hooks load with the runtimes' walkers,
    /// every walk of it has its runtime's frames, the start iterator's
    /// too.
    pub fn note_runtime_at_start(&mut self, p: Proc) {
        self.runtimes_at_start.insert(p);
    }

    /// Whether process `tgid` runs a runtime whose copied stacks are
    /// walked with its frames (see
    /// [`crate::runtime::Spec::copies_carry_frames`]).
    pub fn copies_carry_runtime_frames(&self, tgid: u32) -> bool {
        self.snapshots.starts.get(&tgid).is_some_and(|&start| {
            self.runtime_of(Proc { tgid, start })
                .is_some_and(|kind| kind.spec().copies_carry_frames)
        })
    }

    /// Whether a runtime whose copied stacks are walked with its frames
    /// has a process seen but not ready yet (a JVM starting: see
    /// [`Registry::runtimes_pending`]).
    pub fn frames_carrying_runtime_pending(&self) -> bool {
        self.runtimes
            .iter()
            .any(|r| r.kind().spec().copies_carry_frames && !r.pending().is_empty())
    }

    /// Forgets every mark of [`Registry::note_runtime_at_start`].
    pub fn forget_runtimes_at_start(&mut self) {
        self.runtimes_at_start.clear();
    }

    /// Whether process `p`'s runtime was told to the BPF program before
    /// the window opened (once: the mark is taken).
    pub fn take_runtime_at_start(&mut self, p: Proc) -> bool {
        self.runtimes_at_start.remove(&p)
    }

    /// The runtimes whose frames the BPF program walks (`on`): those
    /// whose frames the walks of copied stacks follow too.
    pub fn walk_runtimes(&mut self, on: &dyn Fn(Kind) -> bool) {
        self.walked_runtimes = crate::runtime::RUNTIMES
            .iter()
            .map(|s| s.kind)
            .filter(|&k| on(k))
            .collect();
    }

    fn walked(&self) -> impl Iterator<Item = &dyn Runtime> {
        self.runtimes
            .iter()
            .filter(|r| self.walked_runtimes.contains(&r.kind()))
    }

    /// Whether every runtime walked can step over copied stacks of process
    /// `p` now (see [`Runtime::copy_ready`]): not where it maps such a
    /// runtime whose generated code keeps no frame pointers and that
    /// runtime has not looked at it yet.
    pub fn copy_ready(&self, p: Proc) -> bool {
        let unseen_jit = self.walked().any(|r| {
            !r.seen(p)
                && !r.kind().spec().jit_without_frame_pointers.is_empty()
                && self.maps_any(p.tgid, r.kind().spec().jit_without_frame_pointers)
        });
        !unseen_jit && self.walked().all(|r| r.copy_ready(p))
    }

    /// Whether process `tgid` maps an object named one of `names`.
    fn maps_any(&self, tgid: u32, names: &[&str]) -> bool {
        self.snapshots.processes.get(&tgid).is_some_and(|mappings| {
            mappings
                .iter()
                .any(|m| names.contains(&self.files.objects[m.object as usize].name.as_str()))
        })
    }

    /// A runtime's step over a copied stack of process `p` (see
    /// [`Runtime::step_copy`]).
    pub fn step_copy(
        &self,
        p: Proc,
        mark: Option<u64>,
        at: crate::runtime::CopyAt,
        read: &dyn Fn(u64) -> Option<u64>,
    ) -> crate::runtime::CopyStep {
        for r in self.walked() {
            let step = r.step_copy(p, mark, at, read);
            if step != crate::runtime::CopyStep::NotMine {
                return step;
            }
        }
        crate::runtime::CopyStep::NotMine
    }

    /// Every runtime, for what it says at the end.
    pub fn runtimes(&self) -> impl Iterator<Item = &dyn Runtime> {
        self.runtimes.iter()
    }

    /// Looks for a runtime among the objects process `p` maps (noted
    /// first): the BPF program's entry for it (its address space left to
    /// the caller), if it has one whose frames can be read.
    pub fn note_runtime(&mut self, p: Proc) -> Option<ProcEntry> {
        let mappings = self.snapshots.processes.get(&p.tgid)?;
        let candidates: Vec<(u32, u64, u64)> = mappings
            .iter()
            .map(|m| (m.object, m.start, m.file_offset))
            .collect();
        for (object, start, file_offset) in candidates {
            let o = &self.files.objects[object as usize];
            let (name, handle) = (&o.name, o.handle.as_ref());
            for r in self.runtimes.iter_mut() {
                if r.object(object, name, handle) {
                    // The lowest mapping of the object: the first found,
                    // as the maps list them by address.
                    return r.note_process(p, object, start, file_offset);
                }
            }
        }
        // None (any more: an exec into another program).
        for r in self.runtimes.iter_mut() {
            r.exited(p);
        }
        None
    }
}
