//! What the BPF maps that grow with use take of the kernel's memory, by
//! the sizes of their elements: the kernel's BPF memory allocator (Linux
//! 6.1 on) serves each element from one of kmalloc's sizes, 8 bytes of its
//! own added. Hash tables' elements (the stacks, the counts) and task
//! storage (an element for each thread that blocks, in each of the
//! per-thread maps) are kept within a size each: a field added that takes
//! one past it doubles what every thread or stack costs, and fails here.
//! (`memlock` counts the elements at their size, and task storage not at
//! all: see scripts/bench-memory.)

use super::*;

/// A hash table's element: its header (struct htab_elem), the key and the
/// value, each 8-byte aligned.
const HASH_HEADER: usize = 48;
/// Task storage's element: the value starts 72 bytes in (struct
/// bpf_local_storage_elem: its data in a cache line of its own, after the
/// map's pointer).
const STORAGE_HEADER: usize = 72;

/// The size the allocator serves `bytes` from.
fn served(bytes: usize) -> usize {
    let with_own = bytes + 8;
    [16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192]
        .into_iter()
        .find(|&s| s >= with_own)
        .unwrap_or(usize::MAX)
}

/// The number a `#define` of offcputime.h gives.
fn defined(name: &str) -> usize {
    let header = include_str!("../bpf/offcputime.h");
    header
        .lines()
        .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no #define {name} in offcputime.h"))
}

#[test]
fn stacks_fit_their_tables_sizes() {
    let stack = |frames: usize| served(HASH_HEADER + 8 + frames * 8);
    assert_eq!(stack(defined("STACK_SHORT_DEPTH")), 256);
    assert_eq!(stack(defined("STACK_MID_DEPTH")), 512);
    assert_eq!(stack(MAX_STACK_DEPTH as usize), 2048);
    // One frame more in a class would take the next size.
    assert_eq!(stack(defined("STACK_SHORT_DEPTH") + 1), 512);
    assert_eq!(stack(defined("STACK_MID_DEPTH") + 1), 1024);
}

#[test]
fn counts_fit_their_sizes() {
    use std::mem::size_of;
    let count = |key: usize| served(HASH_HEADER + key + size_of::<types::offcpu_val>());
    // A count keyed by the thread and its stacks alone (the default), and
    // one keyed whole (--states, -i, --wakers, --on-cpu).
    assert_eq!(count(size_of::<types::offcpu_key_plain>()), 128);
    assert_eq!(count(size_of::<types::offcpu_key>()), 192);
}

#[test]
fn a_threads_storage_fits_its_sizes() {
    use std::mem::size_of;
    let storage = |value: usize| served(STORAGE_HEADER + value);
    // The stack cache's kept walks, each with the key of its slots'
    // places and the hash of what they held: the first with what tells
    // the ways apart, the second alone (a thread that blocks in one place
    // has only the first), the third and fourth together.
    assert_eq!(storage(size_of::<types::ucache_ways>()), 256);
    assert_eq!(storage(size_of::<types::ucache>()), 192);
    assert_eq!(storage(size_of::<types::ucache_pair>()), 256);
    // The thread's record with the kernel walk's first proof (the key of
    // its shape, its words as a hash) and what tells the two apart; the
    // second proof alone.
    assert_eq!(storage(size_of::<types::task_local>()), 256);
    assert_eq!(storage(size_of::<types::korc_way>()), 128);
}

#[test]
fn shapes_fit_their_sizes() {
    use std::mem::size_of;
    // The places of a walk's slots and of a kernel walk's words, kept
    // once for every thread that blocks under the same code path.
    let shape = |value: usize| served(HASH_HEADER + 8 + value);
    assert_eq!(shape(size_of::<types::ucache_shape>()), 512);
    assert_eq!(shape(size_of::<types::korc_shape>()), 512);
}
