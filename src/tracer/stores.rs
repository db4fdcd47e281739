//! What userspace writes into the program's maps while tracing: the
//! DWARF unwind tables and the processes of language runtimes.

use super::*;
use crate::raw::Image;
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
            // wording: not a count
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

/// A table the BPF program indexes as one array, kept in chunks of equal
/// size (mmapable array maps in an array of maps, see `offcputime.h`)
/// created as entries are written: its kernel memory follows the highest
/// entry written, not the most it could hold. Userspace writes it through
/// short-lived mappings of just the pages written, and does not keep it
/// mapped, so that it does not count as the profiler's resident memory
/// beyond a write or a read.
pub(super) struct ChunkedArray<T> {
    /// The array of chunks.
    outer: libbpf_rs::MapHandle,
    /// The chunks created, the first ones (the program's entries 0 up to
    /// `chunks.len() * per_chunk`)...
    chunks: Vec<libbpf_rs::MapHandle>,
    /// ... of which the first `in_outer` are in the array of chunks.
    in_outer: usize,
    per_chunk: usize,
    /// Entries it can hold at most (the chunks may hold a few more).
    pub(super) len: usize,
    what: &'static str,
    _item: std::marker::PhantomData<T>,
}

/// Bytes written through one mapping at most.
pub(super) const WINDOW_BYTES: usize = 1 << 20;

/// BPF_F_MMAPABLE: each chunk's flags, those of the BPF object's template.
const BPF_F_MMAPABLE: u32 = 1 << 10;

impl<T: Copy> ChunkedArray<T> {
    /// The table of `chunks` chunks of `per_chunk` entries at most, its
    /// array of chunks made here (for the BPF object to use in place of
    /// its own, see [`ChunkedArray::share`]), with its first chunk, which
    /// is the chunks' template, not yet in it.
    /// `name`: the BPF object's map it stands for (libbpf names a map that
    /// reuses another after that one).
    pub(super) fn create(
        name: &str,
        entries: u32,
        per_chunk: u32,
        what: &'static str,
    ) -> Result<ChunkedArray<T>> {
        let chunks = entries.div_ceil(per_chunk.max(1));
        let per_chunk = per_chunk as usize;
        let bytes = per_chunk * std::mem::size_of::<T>();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        if per_chunk == 0 || !bytes.is_multiple_of(page) {
            bail!("the {what} table's chunks are not whole pages");
        }
        let first = Self::new_chunk(per_chunk, what)?;
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
            inner_map_fd: {
                use std::os::fd::{AsFd, AsRawFd};
                first.as_fd().as_raw_fd() as u32
            },
            ..Default::default()
        };
        let outer = libbpf_rs::MapHandle::create(
            libbpf_rs::MapType::ArrayOfMaps,
            Some(name),
            4,
            4,
            chunks.max(1),
            &opts,
        )
        .with_context(|| format!("failed to make the {what} table"))?;
        Ok(ChunkedArray {
            len: entries as usize,
            outer,
            chunks: vec![first],
            in_outer: 0,
            per_chunk,
            what,
            _item: std::marker::PhantomData,
        })
    }

    /// Has the BPF object use this table as its map `map` (before it is
    /// loaded).
    pub(super) fn share(&self, map: &mut libbpf_rs::OpenMapMut<'_>) -> Result<()> {
        use std::os::fd::AsFd;
        map.set_max_entries(self.outer.max_entries())
            .and_then(|()| map.reuse_fd(self.outer.as_fd()))
            .with_context(|| format!("failed to give the BPF object the {} table", self.what))
    }

    fn new_chunk(per_chunk: usize, what: &str) -> Result<libbpf_rs::MapHandle> {
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: BPF_F_MMAPABLE,
            ..Default::default()
        };
        libbpf_rs::MapHandle::create(
            libbpf_rs::MapType::Array,
            Some("unwind_chunk"),
            4,
            std::mem::size_of::<T>() as u32,
            per_chunk as u32,
            &opts,
        )
        .with_context(|| format!("failed to make room in the {what} table"))
    }

    fn chunk_bytes(&self) -> usize {
        self.per_chunk * std::mem::size_of::<T>()
    }

    /// Bytes of kernel memory of the chunks created.
    pub(super) fn allocated_bytes(&self) -> usize {
        self.chunks.len() * self.chunk_bytes()
    }

    /// Has the chunks up to the one that holds entry `last` in the table
    /// (the first ones: they are always added in order). Each addition to
    /// an array of maps waits for the BPF programs running to finish (an
    /// RCU grace period, milliseconds on a busy machine): chunks are added
    /// together, a quarter of those there at least.
    pub(super) fn grow_to(&mut self, last: usize) -> Result<()> {
        let want = last / self.per_chunk + 1;
        if want <= self.in_outer {
            return Ok(());
        }
        let most = self.len.div_ceil(self.per_chunk);
        let want = want
            .max(self.in_outer + self.in_outer.div_ceil(4))
            .min(most);
        while self.chunks.len() < want {
            let chunk = Self::new_chunk(self.per_chunk, self.what)?;
            self.chunks.push(chunk);
        }
        let (mut keys, mut fds) = (Vec::new(), Vec::new());
        for (i, chunk) in self
            .chunks
            .iter()
            .enumerate()
            .take(want)
            .skip(self.in_outer)
        {
            use std::os::fd::{AsFd, AsRawFd};
            keys.extend_from_slice(&(i as u32).to_ne_bytes());
            fds.extend_from_slice(&(chunk.as_fd().as_raw_fd() as u32).to_ne_bytes());
        }
        let n = (want - self.in_outer) as u32;
        let added = self
            .outer
            .update_batch(&keys, &fds, n, MapFlags::ANY, MapFlags::ANY)
            .or_else(|_| {
                // Kernels without batches for arrays of maps: one by one.
                keys.chunks(4)
                    .zip(fds.chunks(4))
                    .try_for_each(|(k, v)| self.outer.update(k, v, MapFlags::ANY))
            });
        added.with_context(|| format!("failed to add room to the {} table", self.what))?;
        self.in_outer = want;
        Ok(())
    }

    /// Calls `f` with the entries of the chunks created, mapped for
    /// reading one after the other for the call alone (the pages it reads
    /// are resident only meanwhile).
    pub(super) fn read<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        use std::os::fd::{AsFd, AsRawFd};
        let chunk_bytes = self.chunk_bytes();
        let chunks = &self.chunks[..self.in_outer];
        let bytes = chunks.len() * chunk_bytes;
        if bytes == 0 {
            return Ok(f(&[]));
        }
        // SAFETY: a private reservation of address space, no memory,
        // replaced chunk by chunk below and unmapped at the end.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("failed to map the {} table", self.what));
        }
        for (i, chunk) in chunks.iter().enumerate() {
            // SAFETY: a shared read-only mapping of the chunk's data (whole
            // pages), in place of its part of the reservation made above.
            let at = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(i * chunk_bytes).cast(),
                    chunk_bytes,
                    libc::PROT_READ,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    chunk.as_fd().as_raw_fd(),
                    0,
                )
            };
            if at == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                // SAFETY: the reservation made above, not borrowed.
                unsafe { libc::munmap(base, bytes) };
                return Err(e).with_context(|| format!("failed to map the {} table", self.what));
            }
        }
        // SAFETY: the mapping holds the chunks' entries back to back, each
        // of T (plain old data, any bytes a valid value); userspace writes
        // them only through `write`, never while this borrow lives (both
        // take the store), and the BPF program only reads them.
        let items =
            unsafe { std::slice::from_raw_parts(base.cast::<T>(), chunks.len() * self.per_chunk) };
        let r = f(items);
        // SAFETY: the mappings made above, no longer borrowed.
        unsafe { libc::munmap(base, bytes) };
        Ok(r)
    }

    /// Writes `items` from entry `start` on, creating the chunks they
    /// fall in.
    pub(super) fn write(&mut self, start: usize, items: &[T]) -> Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        let size = std::mem::size_of::<T>();
        let end = start
            .checked_add(items.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| anyhow!("write past the end of a table"))?;
        if items.is_empty() {
            return Ok(());
        }
        self.grow_to(end - 1)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let per_window = (WINDOW_BYTES / size).max(1);
        let mut at = start;
        while at < end {
            let (chunk, within) = (at / self.per_chunk, at % self.per_chunk);
            let n = per_window.min(end - at).min(self.per_chunk - within);
            let part = &items[at - start..at - start + n];
            let begin = within * size;
            let offset = begin / page * page;
            let bytes = (begin + std::mem::size_of_val(part) - offset).div_ceil(page) * page;
            // SAFETY: a shared mapping of whole pages inside the chunk's
            // data (entries of T are packed: their size is a multiple of
            // 8, and a chunk is whole pages), unmapped below before
            // anything else can use it.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.chunks[chunk].as_fd().as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("failed to map the {} table", self.what));
            }
            // SAFETY: `part` fits in the mapping from `begin - offset`;
            // the BPF program only reads the table.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    part.as_ptr(),
                    ptr.cast::<u8>().add(begin - offset).cast::<T>(),
                    part.len(),
                );
                libc::munmap(ptr, bytes);
            }
            at += n;
        }
        Ok(())
    }
}

/// The BPF program's DWARF unwind tables (see `offcputime.h`): rows and
/// mappings written in place, processes pointed at their mappings.  It
/// outlives the tracer's maps safely: the map handles hold their own
/// references.
pub struct UnwindStore {
    pub(super) rows: ChunkedArray<types::unwind_row>,
    pub(super) mappings: ChunkedArray<types::unwind_mapping>,
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

/// The rows and the mappings of the DWARF unwind tables, made before the
/// BPF object loads (which then uses them as its own): their first chunks
/// are added while it loads (see [`UnwindArrays::first_room`]).
pub(super) struct UnwindArrays {
    rows: ChunkedArray<types::unwind_row>,
    mappings: ChunkedArray<types::unwind_mapping>,
}

/// Rows for which there is room from the start: those of a few processes
/// (an idle machine's, about 130,000).
const ROWS_AT_START: usize = 2 * types::unwind_chunks::UNWIND_ROWS_PER_CHUNK.0 as usize;

impl UnwindArrays {
    /// Arrays for `cap`, shared with the open object `open`.
    pub(super) fn new(
        open: &mut crate::bpf::OpenOffcputimeSkel<'_>,
        cap: UnwindCapacity,
    ) -> Result<UnwindArrays> {
        const UNWIND_ROWS_PER_CHUNK: types::unwind_chunks =
            types::unwind_chunks::UNWIND_ROWS_PER_CHUNK;
        const UNWIND_MAPS_PER_CHUNK: types::unwind_chunks =
            types::unwind_chunks::UNWIND_MAPS_PER_CHUNK;
        let rows = ChunkedArray::create(
            "unwind_rows",
            cap.rows,
            UNWIND_ROWS_PER_CHUNK.0,
            "unwind rows",
        )?;
        let mappings = ChunkedArray::create(
            "unwind_maps",
            cap.mappings,
            UNWIND_MAPS_PER_CHUNK.0,
            "unwind mappings",
        )?;
        rows.share(&mut open.maps.unwind_rows)?;
        mappings.share(&mut open.maps.unwind_maps)?;
        Ok(UnwindArrays { rows, mappings })
    }

    /// Adds the first chunks, while the program loads: each addition waits
    /// for a grace period.
    pub(super) fn first_room(&mut self) -> Result<()> {
        self.rows.grow_to(ROWS_AT_START - 1)?;
        self.mappings.grow_to(0)
    }
}

impl UnwindStore {
    pub(super) fn new(skel: &OffcputimeSkel<'_>, arrays: UnwindArrays) -> Result<UnwindStore> {
        Ok(UnwindStore {
            rows: arrays.rows,
            mappings: arrays.mappings,
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

    fn allocated_bytes(&self) -> usize {
        self.rows.allocated_bytes() + self.mappings.allocated_bytes()
    }

    fn write_rows(&mut self, start: usize, rows: &[types::unwind_row]) -> Result<()> {
        self.rows.write(start, rows)
    }

    fn reserve_rows(&mut self, end: usize) -> Result<()> {
        match end {
            0 => Ok(()),
            end => self.rows.grow_to(end.min(self.rows.len).saturating_sub(1)),
        }
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
        image: Image,
    ) -> Result<()> {
        let proc = types::unwind_proc {
            map_start: start,
            map_count: count,
            mm: space.mm,
            exec_vm: space.exec_vm,
            gen: self.next_gen,
            // Not cold before it has had the chance to block.
            used: monotonic_ns(),
            start_code: image.start_code,
            start_stack: image.start_stack,
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
