//! What [`super::build`] needs of the rest of the program: where user
//! frames come from ([`FrameSource`], the processes' mappings, what was
//! kept of those that exited) and where names come from ([`NameSource`],
//! the kernel's and the files' symbols), as two traits, so that the
//! builder can be run on made-up frames and names.

use std::collections::HashMap;
use std::sync::Arc;

use crate::process::registry::{Mappings, StackFrames};
use crate::process::{ObjectInfo, Proc, Registry};
use crate::runtime::Kind;
use crate::symbolize::{AddrKind, Named, Symbolizer, UserFrame};

use super::Container;

/// Names of frames by address (kernel) or by frame (user), each address
/// possibly several frames: functions inlined there, innermost first.
pub type Names<K> = HashMap<K, Vec<Named>>;

/// How the frames of one user stack are found (see
/// [`FrameSource::user_stack`]).
pub enum UserStack<'a, M> {
    /// Kept when its process exited.
    Kept(&'a [UserFrame]),
    /// An address at a time, through its process's mappings, which are
    /// the same for every stack of the process.
    Mapped(M),
}

/// The frame of an address through one process's mappings.
pub trait MappedFrames {
    /// The frame of address `addr`.
    fn frame(&self, addr: u64) -> UserFrame;

    /// Whether stack `addrs` was taken in the parent's address space
    /// (between a vfork and an exec; see
    /// [`crate::process::registry::before_exec`]).
    fn before_exec(&self, _addrs: &[u64]) -> bool {
        false
    }

    /// The frame of address `addr` in the parent's address space.
    fn parent_frame(&self, _addr: u64) -> Option<UserFrame> {
        None
    }

    /// Whether any mapping of the process was read: without, its frames
    /// are `[unknown]` for a reason said apart (no right to read it, or it
    /// exited before it could be).
    fn any_read(&self) -> bool {
        true
    }
}

/// Where the user frames of a profile, and what is known of their files,
/// come from.
pub trait FrameSource {
    /// A process's mappings, as [`UserStack::Mapped`] holds them.
    type Mappings<'a>: MappedFrames
    where
        Self: 'a;

    /// Whether stack `addrs` of process `p` is placed by a language
    /// runtime (see [`crate::runtime`]): it has the runtime's frames, or
    /// its process runs one (which counts its stacks that show its
    /// interpreter's frames in their place).
    fn runtime_places(&self, p: Proc, addrs: &[u64]) -> bool;

    /// The frames of user stack `id` of process `p` (its addresses
    /// `addrs`, innermost first, some of them a runtime's frames): its
    /// native frames with its runtime's frames in their places.
    fn runtime_frames(&mut self, p: Proc, id: u64, addrs: &[u64]) -> Vec<UserFrame>;

    /// How the frames of user stack `id` of process `p` are found.
    fn user_stack(&mut self, p: Proc, id: u64) -> UserStack<'_, Self::Mappings<'_>>;

    /// The path and build id of object `object`.
    fn object_info(&self, object: u32) -> ObjectInfo;

    /// Where the frame of runtime `kind` at `at` of code `code` is: its
    /// line (0 where unknown) and its source file; None for code that is
    /// not known.
    fn runtime_place(&self, kind: Kind, code: u32, at: u32) -> Option<(u64, &str)>;

    /// Whether any process has a perf map (JIT code named by its runtime).
    fn has_perf_maps(&self) -> bool;

    /// Whether process `p` has a perf map.
    fn has_perf_map(&self, p: Proc) -> bool;

    /// The cgroup and container of process `p`, where they can be read.
    fn container(&mut self, p: Proc) -> Option<Arc<Container>>;

    /// Reads the names the runtimes give their threads, of those not
    /// named yet (before a profile is made of them).
    fn read_thread_names(&mut self) {}

    /// Thread `tid` of process `p`'s name in its runtime, where it has
    /// one.
    fn thread_name(&self, _p: Proc, _tid: u32) -> Option<Arc<str>> {
        None
    }
}

/// Where the names of frames come from, for the frames of a
/// [`FrameSource`] `F`.
pub trait NameSource<F: ?Sized> {
    /// Names of kernel addresses.
    fn kernel_names(&self, addrs: &[(u64, AddrKind)]) -> Names<(u64, AddrKind)>;

    /// Names of user frames of `from`.
    fn user_names(
        &self,
        from: &F,
        frames: &[(UserFrame, AddrKind)],
    ) -> Names<(UserFrame, AddrKind)>;

    /// The name of JIT-compiled code at `addr` (frame `frame`) in
    /// process `p`, from its runtime's perf map; None where it has none.
    fn jit_name(
        &self,
        from: &F,
        p: Proc,
        frame: UserFrame,
        addr: u64,
        kind: AddrKind,
    ) -> Option<Named>;

    /// Whether frames show their address first (`--addresses`).
    fn addresses(&self) -> bool;
}

/// A process's frames through its snapshot's mappings.
impl MappedFrames for Mappings<'_> {
    fn frame(&self, addr: u64) -> UserFrame {
        Mappings::frame(self, addr)
    }

    fn before_exec(&self, addrs: &[u64]) -> bool {
        crate::process::registry::before_exec(self, addrs)
    }

    fn parent_frame(&self, addr: u64) -> Option<UserFrame> {
        Mappings::parent_frame(self, addr)
    }

    fn any_read(&self) -> bool {
        Mappings::any_read(self)
    }
}

/// The frames of the processes the registry follows.
impl FrameSource for Registry {
    type Mappings<'a> = Mappings<'a>;

    fn runtime_places(&self, p: Proc, addrs: &[u64]) -> bool {
        self.has_runtime_frames(addrs) || self.runtime_seen(p)
    }

    fn runtime_frames(&mut self, p: Proc, id: u64, addrs: &[u64]) -> Vec<UserFrame> {
        self.user_frames(p, id, addrs)
    }

    fn user_stack(&mut self, p: Proc, id: u64) -> UserStack<'_, Mappings<'_>> {
        match Registry::user_stack(self, p, id) {
            StackFrames::Kept(frames) => UserStack::Kept(frames),
            StackFrames::Mapped(mappings) => UserStack::Mapped(mappings),
        }
    }

    fn object_info(&self, object: u32) -> ObjectInfo {
        Registry::object_info(self, object)
    }

    fn runtime_place(&self, kind: Kind, code: u32, at: u32) -> Option<(u64, &str)> {
        let n = self.runtime_name(kind, code, at)?;
        Some((n.line.map_or(0, u64::from), n.file))
    }

    fn has_perf_maps(&self) -> bool {
        Registry::has_perf_maps(self)
    }

    fn has_perf_map(&self, p: Proc) -> bool {
        self.perf_map(p).is_some()
    }

    fn container(&mut self, p: Proc) -> Option<Arc<Container>> {
        Registry::container(self, p)
    }

    fn read_thread_names(&mut self) {
        self.read_runtime_threads();
    }

    fn thread_name(&self, p: Proc, tid: u32) -> Option<Arc<str>> {
        self.runtime_thread_name(p, tid)
    }
}

/// Names from kallsyms, the files' symbols and the runtimes' perf maps.
impl NameSource<Registry> for Symbolizer {
    fn kernel_names(&self, addrs: &[(u64, AddrKind)]) -> Names<(u64, AddrKind)> {
        self.kernel(addrs)
    }

    fn user_names(
        &self,
        from: &Registry,
        frames: &[(UserFrame, AddrKind)],
    ) -> Names<(UserFrame, AddrKind)> {
        Symbolizer::user_names(self, from, frames)
    }

    fn jit_name(
        &self,
        from: &Registry,
        p: Proc,
        frame: UserFrame,
        addr: u64,
        kind: AddrKind,
    ) -> Option<Named> {
        Symbolizer::jit_name(self, from, p, frame, addr, kind)
    }

    fn addresses(&self) -> bool {
        self.options().addresses
    }
}
