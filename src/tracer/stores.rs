//! What userspace writes into the program's maps while tracing: the
//! DWARF unwind tables and the processes of language runtimes.

use super::*;
use crate::runtime::ProcEntry;

/// Where userspace tells the program of the processes of language runtimes
/// (see `runtime.h`): each runtime's map of its processes' entries (its
/// [`crate::runtime::Spec::procs_map`]), and the bit of each such process.
pub struct RuntimeStore {
    /// The runtimes' maps of processes, in [`crate::runtime::RUNTIMES`]'
    /// order (None for a runtime the BPF program does not walk).
    pub(super) procs: Vec<Option<libbpf_rs::MapHandle>>,
    /// A bit per pid of the processes in the runtimes' maps (see
    /// `rt_pids`).
    pub(super) pids: libbpf_rs::MapHandle,
    /// Whether any entry was written (`rt_any`, alone in its section:
    /// until then no process pays for a lookup).
    pub(super) any: libbpf_rs::MapHandle,
    pub(super) any_set: std::cell::Cell<bool>,
}

impl RuntimeStore {
    pub(super) fn new(skel: &OffcputimeSkel<'_>) -> Result<RuntimeStore> {
        use libbpf_rs::skel::Skel;
        let open = |m: &libbpf_rs::Map| {
            libbpf_rs::MapHandle::try_from(m).context("failed to open the runtimes' process maps")
        };
        let procs = crate::runtime::RUNTIMES
            .iter()
            .map(|spec| {
                let Some(name) = spec.procs_map else {
                    return Ok(None);
                };
                let map = skel
                    .object()
                    .maps()
                    .find(|m| m.name() == name)
                    .with_context(|| format!("no map {name} in the BPF object"))?;
                open(&map).map(Some)
            })
            .collect::<Result<_>>()?;
        Ok(RuntimeStore {
            procs,
            pids: open(&skel.maps.rt_pids)?,
            any: open(&skel.maps.data_runtimes)?,
            any_set: std::cell::Cell::new(false),
        })
    }

    /// Tells the program where the runtime of process `tgid`, in address
    /// space `mm` (0: claimed by the first walk), keeps its threads'
    /// frames.
    pub fn set(&self, tgid: u32, mm: u64, entry: &ProcEntry) -> Result<()> {
        let noted = || format!("failed to note the runtime of process {tgid}");
        let Some(map) = &self.procs[entry.kind as usize] else {
            bail!("no map of {} processes", entry.kind.spec().label);
        };
        map.update(&tgid.to_ne_bytes(), &entry.for_space(mm), MapFlags::ANY)
            .with_context(noted)?;
        self.set_pid(tgid, true).with_context(noted)?;
        if !self.any_set.get() {
            self.any
                .update(&0u32.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                .context("failed to note the first process of a runtime")?;
            self.any_set.set(true);
        }
        Ok(())
    }

    /// Process `tgid` has exited, or runs another program now.
    pub fn remove(&self, tgid: u32) {
        let _ = self.set_pid(tgid, false);
        for map in self.procs.iter().flatten() {
            let _ = map.delete(&tgid.to_ne_bytes());
        }
    }

    /// Sets or clears the bit of pid `tgid` (pid_max is at most 2^22:
    /// every pid has one). A fork setting a bit of the same word meanwhile
    /// could be undone: that child's stacks would then have the
    /// runtime's native frames, and be counted and said as such.
    pub(super) fn set_pid(&self, tgid: u32, on: bool) -> Result<()> {
        let word = tgid >> 6;
        let Some(old) = self.pids.lookup(&word.to_ne_bytes(), MapFlags::ANY)? else {
            return Ok(());
        };
        let old = u64::from_ne_bytes(old.as_slice().try_into().unwrap_or([0; 8]));
        let bit = 1u64 << (tgid & 63);
        let new = if on { old | bit } else { old & !bit };
        if new != old {
            self.pids
                .update(&word.to_ne_bytes(), &new.to_ne_bytes(), MapFlags::ANY)?;
        }
        Ok(())
    }
}

/// An mmapable BPF array map that userspace writes through short-lived
/// mappings of just the pages written: the table lives in kernel memory
/// (its size fixed at load, see `-v`), and is not kept mapped, so that it
/// does not count as the profiler's resident memory beyond a write.
pub(super) struct WindowedArray<T> {
    pub(super) map: libbpf_rs::MapHandle,
    pub(super) len: usize,
    pub(super) _item: std::marker::PhantomData<T>,
}

/// Bytes written through one mapping at most.
pub(super) const WINDOW_BYTES: usize = 1 << 20;

impl<T: Copy> WindowedArray<T> {
    pub(super) fn new(map: &libbpf_rs::Map<'_>, what: &str) -> Result<WindowedArray<T>> {
        Ok(WindowedArray {
            map: libbpf_rs::MapHandle::try_from(map)
                .with_context(|| format!("failed to open the {what} table"))?,
            len: map.max_entries() as usize,
            _item: std::marker::PhantomData,
        })
    }

    /// Calls `f` with the whole array, mapped for reading for the call
    /// alone (the pages it reads are resident only meanwhile).
    pub(super) fn read<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        use std::os::fd::{AsFd, AsRawFd};
        let bytes = self.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(f(&[]));
        }
        // SAFETY: a shared read-only mapping of the array's data, whose
        // size is a whole number of elements, unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                self.map.as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("failed to map an unwind table");
        }
        // SAFETY: the mapping holds `len` elements of T (plain old data,
        // any bytes a valid value); userspace writes the array only
        // through `write`, never while this borrow lives (both take the
        // store), and the BPF program only reads it.
        let items = unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), self.len) };
        let r = f(items);
        // SAFETY: the mapping made above, no longer borrowed.
        unsafe { libc::munmap(ptr, bytes) };
        Ok(r)
    }

    /// Writes `items` from element `start` on.
    pub(super) fn write(&self, start: usize, items: &[T]) -> Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        let size = std::mem::size_of::<T>();
        let end = start
            .checked_add(items.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| anyhow!("write past the end of a table"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let per_window = (WINDOW_BYTES / size).max(1);
        let mut at = start;
        while at < end {
            let chunk = &items[at - start..(at - start + per_window).min(end - start)];
            let begin = at * size;
            let offset = begin / page * page;
            let bytes = (begin + std::mem::size_of_val(chunk) - offset).div_ceil(page) * page;
            // SAFETY: a shared mapping of whole pages inside the array's
            // data (elements of T are packed: their size is a multiple of
            // 8), unmapped below before anything else can use it.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.map.as_fd().as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error())
                    .context("failed to map an unwind table");
            }
            // SAFETY: `chunk` fits in the mapping from `begin - offset`;
            // the BPF program only reads the table.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    ptr.cast::<u8>().add(begin - offset).cast::<T>(),
                    chunk.len(),
                );
                libc::munmap(ptr, bytes);
            }
            at += chunk.len();
        }
        Ok(())
    }
}

/// The BPF program's DWARF unwind tables (see `offcputime.h`): rows and
/// mappings written in place, processes pointed at their mappings.  It
/// outlives the tracer's maps safely: the map handles hold their own
/// references.
pub struct UnwindStore {
    pub(super) rows: WindowedArray<types::unwind_row>,
    pub(super) mappings: WindowedArray<types::unwind_mapping>,
    pub(super) procs: libbpf_rs::MapHandle,
    pub(super) files: libbpf_rs::MapHandle,
    /// Changed after an entry of `files` is removed or rewritten (see
    /// `unwind_files_gen`).
    pub(super) files_gen: libbpf_rs::MapHandle,
    pub(super) files_gen_now: u64,
    pub(super) files_written: std::collections::HashSet<(u64, u64)>,
    /// The generation of the next process tables written.
    pub(super) next_gen: u64,
}

impl UnwindStore {
    pub(super) fn new(skel: &OffcputimeSkel<'_>) -> Result<UnwindStore> {
        Ok(UnwindStore {
            rows: WindowedArray::new(&skel.maps.unwind_rows, "unwind rows")?,
            mappings: WindowedArray::new(&skel.maps.unwind_maps, "unwind mappings")?,
            procs: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_procs)
                .context("failed to open the unwind processes map")?,
            files: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_files)
                .context("failed to open the unwind files map")?,
            files_gen: libbpf_rs::MapHandle::try_from(&skel.maps.unwind_files_gen)
                .context("failed to open the unwind files generation")?,
            files_gen_now: 0,
            files_written: Default::default(),
            next_gen: 1,
        })
    }
}

impl UnwindStore {
    /// After an entry of the files was removed or rewritten: walks kept
    /// in the stack cache that went through the old one are walked again.
    pub(super) fn next_files_gen(&mut self) {
        self.files_gen_now += 1;
        // Failing, the cache could prove walks through entries gone:
        // remove every file entry then.
        if self
            .files_gen
            .update(
                &0u32.to_ne_bytes(),
                &self.files_gen_now.to_ne_bytes(),
                MapFlags::ANY,
            )
            .is_err()
        {
            for (dev, ino) in std::mem::take(&mut self.files_written) {
                let key = types::unwind_file_key { dev, ino };
                // SAFETY: plain old data.
                let _ = self.files.delete(unsafe { plain::as_bytes(&key) });
            }
        }
    }
}

impl crate::unwind::TableStore for UnwindStore {
    fn row_capacity(&self) -> usize {
        self.rows.len
    }

    fn mapping_capacity(&self) -> usize {
        self.mappings.len
    }

    fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()> {
        self.rows.write(start, rows)
    }

    fn write_mappings(&mut self, start: usize, mappings: &[types::unwind_mapping]) -> Result<()> {
        self.mappings.write(start, mappings)
    }

    fn set_process(
        &mut self,
        tgid: u32,
        start: u32,
        count: u32,
        space: AddressSpace,
    ) -> Result<()> {
        let proc = types::unwind_proc {
            map_start: start,
            map_count: count,
            mm: space.mm,
            exec_vm: space.exec_vm,
            gen: self.next_gen,
            // Not cold before it has had the chance to block.
            used: monotonic_ns(),
        };
        self.next_gen += 1;
        // SAFETY: unwind_proc is plain old data.
        let value = unsafe { plain::as_bytes(&proc) };
        self.procs
            .update(&tgid.to_ne_bytes(), value, MapFlags::ANY)
            .with_context(|| format!("failed to store the unwind tables of process {tgid}"))
    }

    fn remove_process(&mut self, tgid: u32) {
        // Not there (never stored) is fine.
        let _ = self.procs.delete(&tgid.to_ne_bytes());
    }

    fn set_file(&mut self, key: &types::unwind_file_key, file: &types::unwind_file) -> Result<()> {
        // SAFETY: both are plain old data.
        let (k, v) = unsafe { (plain::as_bytes(key), plain::as_bytes(file)) };
        self.files
            .update(k, v, MapFlags::ANY)
            .context("failed to store the unwind tables of a file")?;
        if !self.files_written.insert((key.dev, key.ino)) {
            self.next_files_gen();
        }
        Ok(())
    }

    fn remove_file(&mut self, key: &types::unwind_file_key) {
        // SAFETY: plain old data.
        let _ = self.files.delete(unsafe { plain::as_bytes(key) });
        if self.files_written.remove(&(key.dev, key.ino)) {
            self.next_files_gen();
        }
    }

    fn read(
        &self,
        f: &mut dyn FnMut(&[types::unwind_row], &[types::unwind_mapping]),
    ) -> Result<()> {
        self.rows
            .read(|rows| self.mappings.read(|mappings| f(rows, mappings)))?
    }

    fn last_used(&self, tgid: u32) -> Option<u64> {
        let bytes = self
            .procs
            .lookup(&tgid.to_ne_bytes(), MapFlags::ANY)
            .ok()
            .flatten()?;
        let mut proc = types::unwind_proc::default();
        plain::copy_from_bytes(&mut proc, &bytes).ok()?;
        Some(proc.used)
    }
}
