//! User stacks as frames of files: live processes' through their
//! mappings, exited processes' stacks kept once each, CPython frames put in
//! place of the evaluation calls.

use super::{distinct_objects, Mapping, Registry, UserFrame};
use crate::process::maps::process_alive;
use crate::process::Proc;

/// The id a retired stack is kept under: the stack id mixed with its
/// process's start time, so that the stacks of two processes that had the
/// same pid are kept apart (a 64-bit hash either way).
fn retired_id(id: u64, start: u64) -> u64 {
    id ^ start.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// (stack id, tgid) -> index of its frames, for processes that exited.
#[derive(Default)]
pub(super) struct RetiredList {
    entries: Vec<(u64, u32, u32)>,
    sorted: bool,
}

impl RetiredList {
    fn push(&mut self, tgid: u32, id: u64, index: u32) {
        self.entries.push((id, tgid, index));
        self.sorted = false;
    }

    fn get(&mut self, tgid: u32, id: u64) -> Option<u32> {
        if !self.sorted {
            self.entries.sort_unstable();
            self.sorted = true;
        }
        let at = self
            .entries
            .binary_search_by(|&(i, t, _)| (i, t).cmp(&(id, tgid)))
            .ok()?;
        Some(self.entries[at].2)
    }
}

impl Registry {
    /// Process `tgid` has exited: its counted user `stacks` (stack id and
    /// addresses, innermost first) are kept as frames of objects, and its
    /// snapshot is let go. What is kept grows with the distinct stacks
    /// counted, not with the processes seen: the same stack of another
    /// process of the same program is stored once.
    pub fn retire(&mut self, p: Proc, stacks: &[(u64, Vec<u64>)]) {
        let tgid = p.tgid;
        let mappings = if self
            .snapshots
            .starts
            .get(&tgid)
            .is_none_or(|&s| s == p.start)
        {
            self.snapshots.starts.remove(&tgid);
            self.snapshots.inherited.remove(&tgid);
            self.snapshots.processes.remove(&tgid)
        } else {
            self.snapshots.superseded.remove(&p)
        };
        let Some(mappings) = mappings else {
            return;
        };
        self.drop_users(&distinct_objects(&mappings));
        // The parent's mappings, read only for a stack none of whose
        // addresses the process's own map (see `before_exec`).
        let parent_proc = self.snapshots.parents.remove(&p);
        let mut parent: Option<Vec<Mapping>> = None;
        for (id, addrs) in stacks {
            self.resolve_runtime(p, addrs);
            let unmapped = addrs
                .iter()
                .find(|&&a| a != crate::unwind_table::SIGNAL_FRAME)
                .is_some_and(|&a| matches!(user_frame(&mappings, a), UserFrame::Unmapped(_)));
            if unmapped && parent.is_none() {
                parent = Some(
                    parent_proc
                        .and_then(|pp| self.mappings_of(pp))
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            let m = Mappings {
                own: &mappings,
                parent: parent.as_deref().unwrap_or(&[]),
            };
            let mappings: &[Mapping] = if before_exec(&m, addrs) {
                m.parent
            } else {
                &mappings
            };
            // An address outside every mapping is `[unknown]` whatever
            // it is: kept as one, so that such stacks of different
            // processes are kept once too.
            let frames: std::rc::Rc<[UserFrame]> = stack_frames(mappings, &self.runtimes, p, addrs)
                .into_iter()
                .map(|f| match f {
                    UserFrame::Unmapped(_) => UserFrame::Unmapped(0),
                    f => f,
                })
                .collect();
            let next = self.retired.stacks.len() as u32;
            let index = *self.retired.ids.entry(frames.clone()).or_insert(next);
            if index == next {
                self.retired.stacks.push(frames);
            }
            self.retired
                .list
                .push(tgid, retired_id(*id, p.start), index);
        }
        for r in self.runtimes.iter_mut() {
            r.exited(p);
        }
    }

    /// The frames of user stack `id` of process `tgid` (its addresses
    /// `addrs`, innermost first): as kept when the process exited, or
    /// through its snapshot, taken again now if it is still running, for
    /// libraries loaded since.
    pub fn user_frames(&mut self, p: Proc, id: u64, addrs: &[u64]) -> Vec<UserFrame> {
        let words = self.runtimes.of_stack(addrs).is_some();
        if words {
            self.resolve_runtime(p, addrs);
        }
        // A runtime's process: its stacks without the runtime's frames
        // are placed too (the runtime counts those that show its
        // interpreter's frames in their place), but for those taken
        // before its exec, in its parent's address space.
        let seen = !words && self.runtime_seen(p);
        let mappings = match self.user_stack(p, id) {
            StackFrames::Kept(frames) => return frames.to_vec(),
            StackFrames::Mapped(m) if !words => {
                if before_exec(&m, addrs) {
                    return addrs.iter().filter_map(|&a| m.parent_frame(a)).collect();
                }
                if !seen {
                    return addrs.iter().map(|&a| m.frame(a)).collect();
                }
                m.own.to_vec()
            }
            StackFrames::Mapped(m) => m.own.to_vec(),
        };
        stack_frames(&mappings, &self.runtimes, p, addrs)
    }

    /// Reads what the runtime frames of `addrs` (a stack of process `p`)
    /// name that was not read yet (their notice was lost), while the
    /// process lives.
    fn resolve_runtime(&mut self, p: Proc, addrs: &[u64]) {
        if let Some(kind) = self.runtimes.of_stack(addrs) {
            self.runtimes.get_mut(kind).resolve(p, addrs);
        }
    }

    /// How the frames of user stack `id` of process `p` are found (see
    /// [`Registry::user_frames`]): kept, or an address at a time through
    /// the process's mappings, which are the same for every stack of the
    /// process.
    pub fn user_stack(&mut self, p: Proc, id: u64) -> StackFrames<'_> {
        let tgid = p.tgid;
        if let Some(i) = self.retired.list.get(tgid, retired_id(id, p.start)) {
            return StackFrames::Kept(&self.retired.stacks[i as usize]);
        }
        let mappings = if self
            .snapshots
            .starts
            .get(&tgid)
            .is_none_or(|&s| s == p.start)
        {
            if self.snapshots.refreshed.insert(tgid)
                && crate::process::start_ticks(tgid) == Some(p.start)
            {
                self.refresh_process(tgid, false);
            }
            self.snapshots.processes.get(&tgid)
        } else {
            // A process whose pid was taken by another.
            self.snapshots.superseded.get(&p)
        };
        let parent = self
            .snapshots
            .parents
            .get(&p)
            .and_then(|&pp| self.mappings_of(pp));
        StackFrames::Mapped(Mappings {
            own: mappings.map_or(&[][..], Vec::as_slice),
            parent: parent.map_or(&[][..], Vec::as_slice),
        })
    }

    /// The frames of addresses `addrs` of process `tgid` through its
    /// snapshot, taken again first if the process is still running (for
    /// libraries loaded since).
    pub fn frames_now(&mut self, tgid: u32, addrs: &[u64]) -> Vec<UserFrame> {
        if process_alive(tgid) {
            self.refresh_process(tgid, false);
        }
        let mappings = self
            .snapshots
            .processes
            .get(&tgid)
            .map_or(&[][..], Vec::as_slice);
        addrs.iter().map(|&a| user_frame(mappings, a)).collect()
    }
}

/// The frames of a user stack (see [`Registry::user_stack`]).
pub enum StackFrames<'a> {
    /// Kept when its process exited.
    Kept(&'a [UserFrame]),
    /// Through its process's mappings.
    Mapped(Mappings<'a>),
}

/// The executable mappings of a process, and its parent's.
#[derive(Clone, Copy)]
pub struct Mappings<'a> {
    own: &'a [Mapping],
    parent: &'a [Mapping],
}

impl Mappings<'_> {
    /// Whether any of the process's own mappings was read.
    pub fn any_read(&self) -> bool {
        !self.own.is_empty()
    }

    /// The frame of address `addr`.
    pub fn frame(&self, addr: u64) -> UserFrame {
        user_frame(self.own, addr)
    }

    /// The frame of address `addr` in the parent's address space, if it
    /// maps it.
    pub fn parent_frame(&self, addr: u64) -> Option<UserFrame> {
        match user_frame(self.parent, addr) {
            UserFrame::Unmapped(_) => None,
            f => Some(f),
        }
    }
}

/// Whether user stack `addrs` was taken in the parent's address space:
/// between a vfork (posix_spawn's clone) and the exec after it the child
/// runs in its parent's, and a stack it blocked in then (preempted, or
/// reading the new executable) has none of its addresses in the child's
/// own mappings, read after the exec, and all of them in its parent's.
/// The first address decides for nearly every stack, in one lookup.
pub fn before_exec(m: &Mappings<'_>, addrs: &[u64]) -> bool {
    let first = addrs
        .iter()
        .find(|&&a| a != crate::unwind_table::SIGNAL_FRAME);
    first.is_some_and(|&a| matches!(m.frame(a), UserFrame::Unmapped(_)))
        && !m.parent.is_empty()
        && addrs
            .iter()
            .all(|&a| matches!(m.frame(a), UserFrame::Unmapped(_)) && m.parent_frame(a).is_some())
}

/// The frames of stack `addrs` of process `p` through its mappings: its
/// native frames, with the frames of its runtime (if it has one) in their
/// places (what they name read before, see [`Registry::resolve_runtime`]).
fn stack_frames(
    mappings: &[Mapping],
    runtimes: &crate::runtime::Runtimes,
    p: Proc,
    addrs: &[u64],
) -> Vec<UserFrame> {
    use crate::runtime::Placed;
    let native: Vec<UserFrame> = addrs.iter().map(|&a| user_frame(mappings, a)).collect();
    // (A process that exited: its stacks are placed at the report too.)
    let Some(kind) = runtimes.of_stack(addrs).or_else(|| runtimes.seen_in(p)) else {
        return native;
    };
    let at: Vec<crate::runtime::NativeAt> = native
        .iter()
        .map(|f| match *f {
            UserFrame::File { object, offset } => Some((object, offset)),
            _ => None,
        })
        .collect();
    runtimes
        .get(kind)
        .place(p, addrs, &at)
        .into_iter()
        .map(|f| match f {
            Placed::Native(i) => native[i],
            Placed::Runtime(f) => UserFrame::Runtime(kind, f),
        })
        .collect()
}

/// `addr` as a frame of the mapping that holds it.
fn user_frame(mappings: &[Mapping], addr: u64) -> UserFrame {
    match mappings.iter().find(|m| addr >= m.start && addr < m.end) {
        Some(m) => UserFrame::File {
            object: m.object,
            offset: (addr - m.start).wrapping_add(m.file_offset),
        },
        None if addr == crate::unwind_table::SIGNAL_FRAME => UserFrame::Signal,
        None => UserFrame::Unmapped(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, object: u32) -> Mapping {
        Mapping {
            start,
            end,
            file_offset: 0,
            object,
        }
    }

    /// A worker's own mappings, read after its exec, and its parent's:
    /// the same files at other addresses.
    fn spaces() -> (Vec<Mapping>, Vec<Mapping>) {
        let own = vec![
            mapping(0x5600_0000, 0x5601_0000, 1),
            mapping(0x7f10_0000, 0x7f20_0000, 2),
        ];
        let parent = vec![
            mapping(0x5500_0000, 0x5501_0000, 1),
            mapping(0x7e10_0000, 0x7e20_0000, 2),
        ];
        (own, parent)
    }

    #[test]
    fn a_stack_from_between_vfork_and_exec_is_named_in_the_parents_space() {
        let (own, parent) = spaces();
        let m = Mappings {
            own: &own,
            parent: &parent,
        };
        // Blocked in posix_spawn's child, in the parent's libc, called
        // from the parent's executable.
        let before = [0x7e10_0040, 0x5500_0100];
        assert!(before_exec(&m, &before));
        assert_eq!(
            before.map(|a| m.parent_frame(a)),
            [
                Some(UserFrame::File {
                    object: 2,
                    offset: 0x40
                }),
                Some(UserFrame::File {
                    object: 1,
                    offset: 0x100
                })
            ]
        );
        // After the exec: its own.
        assert!(!before_exec(&m, &[0x7f10_0040, 0x5600_0100]));
        // An address of neither: not the parent's stack either (named
        // [unknown] as before, not guessed).
        assert!(!before_exec(&m, &[0x7e10_0040, 0x1234]));
        // Its own first address decides, whatever follows.
        assert!(!before_exec(&m, &[0x7f10_0040, 0x5500_0100]));
        // No parent known.
        let orphan = Mappings {
            own: &own,
            parent: &[],
        };
        assert!(!before_exec(&orphan, &before));
        assert!(!before_exec(&m, &[]));
    }
}
