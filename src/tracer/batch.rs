//! Reading a whole hash map in a few system calls.
//!
//! The report reads the table of counts and the stacks it refers to once
//! the hooks are detached: with many entries, one `get_next_key` and one
//! lookup per entry was a large share of the report's time (see
//! BENCHMARKS.md, report time). `BPF_MAP_LOOKUP_BATCH`
//! (5.6) copies thousands of entries a call. Only for maps nothing writes
//! any more: a batch walks the buckets in order, and an entry added behind
//! it while it runs is not seen (why the scans during tracing go key by
//! key).

use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{bail, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::MapCore;

/// Entries a first batch asks for; the kernel may need more room for a
/// bucket holding many, and says so (ENOSPC with nothing copied).
const FIRST_BATCH: u32 = 4096;
/// About how many bytes of values a batch asks for (see [`for_each_entry`]).
const BATCH_BYTES: usize = 256 * 1024;
/// Room that is never needed: a bucket longer than that is a broken map.
const MOST_BATCH: u32 = 1 << 20;

/// What a batched read needs of a map: plain values, so that a read can
/// run on another thread while the map object stays where it is.
#[derive(Clone, Copy)]
pub struct Table<'fd> {
    fd: BorrowedFd<'fd>,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
}

impl<'fd> Table<'fd> {
    pub fn of<M: MapCore + ?Sized>(map: &'fd M) -> Table<'fd> {
        Table {
            fd: map.as_fd(),
            key_size: map.key_size() as usize,
            value_size: map.value_size() as usize,
            max_entries: map.max_entries(),
        }
    }
}

/// Calls `f` with every key and value of the hash map `map`. Returns
/// [`Outcome::Unsupported`], having called nothing, where the kernel has
/// no batched lookup for the map, so the caller can go key by key.
pub fn for_each_entry(map: Table<'_>, mut f: impl FnMut(&[u8], &[u8])) -> Result<Outcome> {
    let key_size = map.key_size;
    let value_size = map.value_size;
    let fd = map.fd.as_raw_fd();
    let opts = libbpf_sys::bpf_map_batch_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    // Values of a few hundred kilobytes a batch, which the caller then
    // reads while they are still in the cache (4096 stacks were 4 MB).
    let fit = (BATCH_BYTES / value_size.max(1)).max(64) as u32;
    let mut room = FIRST_BATCH.min(fit).min(map.max_entries.max(1));
    let mut keys = vec![0u8; room as usize * key_size];
    let mut values = vec![0u8; room as usize * value_size];
    // The position of a hash map's batch is a bucket number (u32); room
    // for a key as well, whatever the map.
    let token = key_size.max(8);
    let mut in_batch = vec![0u8; token];
    let mut out_batch = vec![0u8; token];
    let mut first = true;
    loop {
        let mut count = room;
        // SAFETY: the buffers hold `room` keys and values of the map's
        // sizes and a position of `token` bytes; `count` says how many.
        let ret = unsafe {
            libbpf_sys::bpf_map_lookup_batch(
                fd,
                if first {
                    std::ptr::null_mut()
                } else {
                    in_batch.as_mut_ptr().cast()
                },
                out_batch.as_mut_ptr().cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        let errno = if ret < 0 { -ret } else { 0 };
        match errno {
            0 | libc::ENOENT => {}
            libc::ENOSPC if count == 0 && room < MOST_BATCH => {
                room *= 2;
                keys.resize(room as usize * key_size, 0);
                values.resize(room as usize * value_size, 0);
                continue;
            }
            // 524: the kernel's ENOTSUPP.
            libc::EINVAL | libc::EOPNOTSUPP | 524 if first => {
                return Ok(Outcome::Unsupported);
            }
            e => bail!(
                "batched lookup of a map failed: {}",
                std::io::Error::from_raw_os_error(e)
            ),
        }
        let count = (count as usize).min(room as usize);
        for i in 0..count {
            f(
                &keys[i * key_size..][..key_size],
                &values[i * value_size..][..value_size],
            );
        }
        if errno == libc::ENOENT {
            return Ok(Outcome::Read);
        }
        first = false;
        std::mem::swap(&mut in_batch, &mut out_batch);
    }
}

/// How [`for_each_entry`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every entry was given.
    Read,
    /// The kernel has no batched lookup for this map; nothing was given.
    Unsupported,
}
