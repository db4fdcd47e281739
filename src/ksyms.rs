//! The kernel's function symbols from `/proc/kallsyms`, in little memory.
//!
//! Kernel frames are named from kallsyms alone, as blazesym would name them
//! with kallsyms as its only source, but blazesym keeps each of the 120,000
//! or so symbols of a distribution kernel as a boxed name in a vector of
//! enums: about 8 MB of heap, most of the profiler's baseline. This table
//! keeps the same names in under 3 MB:
//!
//! - the names in one buffer, each ended by a newline (which a line of
//!   kallsyms cannot hold), where a name that ends the one before it is not
//!   stored again: `foo` points into `__pfx_foo` (the padding symbol in
//!   front of each function of x86 kernels built with
//!   `CONFIG_PREFIX_SYMBOLS`, half of all symbols);
//! - a 4-byte offset into that buffer per symbol;
//! - a 4-byte address per symbol: its low half, the high half being kept
//!   once per run of symbols that share it (one run for all of x86-64's
//!   kernel and modules);
//! - module names once each, with the runs of symbols in each module.
//!
//! Only function symbols are kept (types `t`, `T`, `w`, `W`): stacks hold
//! code addresses. Otherwise the lookup is blazesym's: kallsyms has no
//! sizes, so an address resolves to the symbol with the greatest address at
//! or below it, however far past that symbol's end; where several symbols
//! share an address, the first in the file wins.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};

use anyhow::{Context, Result};

const KALLSYMS: &str = "/proc/kallsyms";

/// The symbol an address is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSym<'a> {
    pub name: &'a str,
    /// From the start of the symbol to the address.
    pub offset: u64,
    /// The module the symbol belongs to (`ext4`, `bpf` for BPF programs),
    /// or `None` for the kernel image.
    pub module: Option<&'a str>,
    /// Up to the next symbol of the same module (or of the kernel image),
    /// as kallsyms gives no sizes; `None` for the last one of its module.
    pub size: Option<u64>,
}

/// The kernel's function symbols, by address.
pub struct KernelSymbols {
    addrs: Addrs,
    /// Where each symbol's name starts in `names`.
    name_at: Vec<u32>,
    /// The names, each ended by a newline.
    names: String,
    /// Module names, each once.
    modules: Vec<Box<str>>,
    /// (first symbol, index into `modules`) of each run of symbols of the
    /// same module, or of the kernel image (`None`), in symbol order.
    module_runs: Vec<(u32, Option<u32>)>,
    /// kallsyms gave every address as zero.
    hidden: bool,
}

impl KernelSymbols {
    /// Reads `/proc/kallsyms`, in one pass.
    pub fn load() -> Result<KernelSymbols> {
        let file = File::open(KALLSYMS).with_context(|| format!("failed to open {KALLSYMS}"))?;
        KernelSymbols::parse(BufReader::new(file))
            .with_context(|| format!("failed to read {KALLSYMS}"))
    }

    /// Reads kallsyms text: `ADDRESS TYPE NAME [MODULE]` lines. Lines that
    /// are not are skipped.
    pub fn parse(mut input: impl BufRead) -> Result<KernelSymbols> {
        let mut table = KernelSymbols {
            addrs: Addrs::default(),
            name_at: Vec::new(),
            names: String::new(),
            modules: Vec::new(),
            module_runs: Vec::new(),
            hidden: false,
        };
        let mut zeros = false;
        // The first symbol below the one before it, if any.
        let mut unsorted_from = None;
        // Where the last name stored starts.
        let mut last_name = 0;
        let mut line = Vec::new();
        loop {
            line.clear();
            if input.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            let Some(sym) = parse_line(&line) else {
                continue;
            };
            if !matches!(sym.kind, b't' | b'T' | b'w' | b'W') {
                continue;
            }
            // Without CAP_SYSLOG, or under kptr_restrict, every address
            // reads as zero.
            if sym.addr == 0 {
                zeros = true;
                continue;
            }
            // The name, or where the previous name ends with it.
            let last = table.names[last_name..].strip_suffix('\n');
            let name_at = if last.is_some_and(|last| last.ends_with(sym.name)) {
                table.names.len() - 1 - sym.name.len()
            } else {
                last_name = table.names.len();
                table.names.push_str(sym.name);
                table.names.push('\n');
                last_name
            };
            let len = table.name_at.len();
            let (Ok(name_at), Ok(_)) = (u32::try_from(name_at), u32::try_from(len)) else {
                break;
            };
            if unsorted_from.is_none() && len > 0 && sym.addr < table.addrs.get(len - 1) {
                unsorted_from = Some(len);
            }
            let module = sym.module.map(|m| table.module_index(m));
            table.push(sym.addr, name_at, module);
        }
        if let Some(from) = unsorted_from {
            table.sort(from);
        }
        table.hidden = zeros && table.name_at.is_empty();
        table.addrs.shrink_to_fit();
        table.name_at.shrink_to_fit();
        table.names.shrink_to_fit();
        Ok(table)
    }

    /// The index of module `name` in `modules`, added if new.
    fn module_index(&mut self, name: &str) -> u32 {
        // Symbols come module by module: the last one is the likely one.
        if let Some(i) = self.modules.iter().rposition(|m| &**m == name) {
            return i as u32;
        }
        self.modules.push(name.into());
        (self.modules.len() - 1) as u32
    }

    /// Adds a symbol at the end.
    fn push(&mut self, addr: u64, name_at: u32, module: Option<u32>) {
        let index = self.name_at.len() as u32;
        if self.module_runs.last().is_none_or(|&(_, m)| m != module) {
            self.module_runs.push((index, module));
        }
        self.addrs.push(addr);
        self.name_at.push(name_at);
    }

    /// Puts the symbols in address order, keeping the file's order among
    /// symbols at one address, when they are in order up to `from`. kallsyms
    /// lists the kernel image in order, then modules and BPF programs: only
    /// these, and the image's symbols above the lowest of them, are moved.
    fn sort(&mut self, from: usize) {
        let len = self.name_at.len();
        let lowest = (from..len).map(|i| self.addrs.get(i)).min();
        let mut keep = from;
        while keep > 0 && lowest.is_some_and(|l| self.addrs.get(keep - 1) > l) {
            keep -= 1;
        }
        let mut moved: Vec<(u64, u32, Option<u32>)> = (keep..len)
            .map(|i| (self.addrs.get(i), self.name_at[i], self.module_of(i)))
            .collect();
        moved.sort_by_key(|&(addr, _, _)| addr);
        self.addrs.truncate(keep);
        self.name_at.truncate(keep);
        while self
            .module_runs
            .last()
            .is_some_and(|&(first, _)| first as usize >= keep)
        {
            self.module_runs.pop();
        }
        for (addr, name_at, module) in moved {
            self.push(addr, name_at, module);
        }
    }

    /// The index into `modules` of symbol `i`'s module.
    fn module_of(&self, i: usize) -> Option<u32> {
        let run = self
            .module_runs
            .partition_point(|&(first, _)| first as usize <= i);
        self.module_runs.get(run.checked_sub(1)?)?.1
    }

    /// Whether kallsyms hid the addresses (all zero): then nothing
    /// resolves.
    pub fn addresses_hidden(&self) -> bool {
        self.hidden
    }

    /// The symbol `addr` is in: the one with the greatest address at or
    /// below it (the first in the file among several there). `None` below
    /// the first symbol.
    pub fn resolve(&self, addr: u64) -> Option<KernelSym<'_>> {
        let last = self.addrs.floor(addr)?;
        let start = self.addrs.get(last);
        // The first of the symbols at `start`.
        let i = start
            .checked_sub(1)
            .and_then(|below| self.addrs.floor(below))
            .map_or(0, |j| j + 1);
        let rest = self.names.get(*self.name_at.get(i)? as usize..)?;
        let next = last + 1;
        let size = (next < self.name_at.len() && self.module_of(next) == self.module_of(i))
            .then(|| self.addrs.get(next) - start);
        Some(KernelSym {
            size,
            name: rest.split('\n').next().unwrap_or(rest),
            offset: addr - start,
            module: self
                .module_of(i)
                .and_then(|m| self.modules.get(m as usize))
                .map(|m| &**m),
        })
    }

    /// The number of symbols kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.name_at.len()
    }
}

/// A kernel symbol as the kernel prints one for an address (`%pS`, through
/// a BPF program: [`crate::tracer`]'s `name_kernel_addresses`), owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintedSym {
    pub name: String,
    /// From the start of the symbol to the address.
    pub offset: u64,
    /// The symbol's size as kallsyms has it (up to the next symbol).
    pub size: u64,
    /// The module (`ext4`), `bpf` for a BPF program or trampoline, `None`
    /// for the kernel image, as [`KernelSym`]'s.
    pub module: Option<String>,
}

impl PrintedSym {
    /// Reads `name+0xoffset/0xsize`, then ` [module]` for a module's
    /// symbol (` [module buildid]` with a build id). `None` where the
    /// kernel printed the address itself (`0x...`: no symbol covers it) or
    /// anything else.
    pub fn parse(text: &str) -> Option<PrintedSym> {
        let (sym, module) = match text.strip_suffix(']') {
            Some(rest) => {
                let (sym, module) = rest.rsplit_once(" [")?;
                let module = module.split(' ').next()?;
                if module.is_empty() {
                    return None;
                }
                (sym, Some(module.to_string()))
            }
            None => (text, None),
        };
        let (name, place) = sym.rsplit_once("+0x")?;
        let (offset, size) = place.split_once("/0x")?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let offset = u64::from_str_radix(offset, 16).ok()?;
        let size = u64::from_str_radix(size, 16).ok()?;
        let module = module.or_else(|| is_bpf_symbol(name).then(|| "bpf".to_string()));
        Some(PrintedSym {
            name: name.to_string(),
            offset,
            size,
            module,
        })
    }
}

/// Whether `name` is one kallsyms puts in its `[bpf]` module: a program
/// (`bpf_prog_TAG` or `bpf_prog_TAG_NAME`, the tag 16 hex digits) or a
/// trampoline (`bpf_trampoline_KEY`). Kernel functions such as
/// `bpf_prog_load` are not.
fn is_bpf_symbol(name: &str) -> bool {
    if let Some(rest) = name.strip_prefix("bpf_prog_") {
        let tag = rest.get(..16).unwrap_or("");
        return tag.len() == 16
            && tag.bytes().all(|b| b.is_ascii_hexdigit())
            && matches!(rest.as_bytes().get(16), None | Some(b'_'));
    }
    name.strip_prefix("bpf_trampoline_")
        .is_some_and(|key| !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()))
}

/// A kallsyms line's fields.
/// Where interrupts enter the kernel and where softirqs are run, as
/// address ranges: a wake-up from a stack that went through either is not
/// the current task's doing (`--wakers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterruptEntries {
    /// x86-64's hardware interrupt stubs (`asm_common_interrupt`,
    /// `asm_spurious_interrupt`, `asm_sysvec_*`), which the kernel lays
    /// out together; (0, 0) if they are not found together, apart from
    /// the exception stubs (a page fault runs in its task's context).
    pub irq: (u64, u64),
    /// `handle_softirqs` (`__do_softirq` before 6.3); (0, 0) if absent.
    pub softirq: (u64, u64),
}

impl InterruptEntries {
    /// From `/proc/kallsyms`; all (0, 0) where the addresses are hidden.
    pub fn load() -> Result<InterruptEntries> {
        let file = File::open(KALLSYMS).with_context(|| format!("failed to open {KALLSYMS}"))?;
        InterruptEntries::parse(BufReader::new(file))
            .with_context(|| format!("failed to read {KALLSYMS}"))
    }

    /// From kallsyms text (the kernel image's symbols only).
    pub fn parse(mut input: impl BufRead) -> Result<InterruptEntries> {
        let mut text: Vec<u64> = Vec::new();
        let mut irq: Vec<u64> = Vec::new();
        let mut exceptions: Vec<u64> = Vec::new();
        let (mut handle_softirqs, mut do_softirq) = (None, None);
        each_symbol(&mut input, |sym| {
            if sym.module.is_some() || sym.addr == 0 || !matches!(sym.kind, b't' | b'T') {
                return;
            }
            text.push(sym.addr);
            match sym.name {
                "asm_common_interrupt" | "asm_spurious_interrupt" => irq.push(sym.addr),
                n if n.starts_with("asm_sysvec_") => irq.push(sym.addr),
                n if n.starts_with("asm_exc_") => exceptions.push(sym.addr),
                "handle_softirqs" => handle_softirqs = Some(sym.addr),
                "__do_softirq" => do_softirq = Some(sym.addr),
                _ => {}
            }
        })?;
        text.sort_unstable();
        text.dedup();
        // A function ends where the next symbol starts.
        let end_of = |addr: u64| text.get(text.partition_point(|&a| a <= addr)).copied();
        let mut out = InterruptEntries::default();
        if let (Some(&lo), Some(&last)) = (irq.iter().min(), irq.iter().max()) {
            if let Some(hi) = end_of(last) {
                if !exceptions.iter().any(|&e| lo <= e && e < hi) {
                    out.irq = (lo, hi);
                }
            }
        }
        if let Some(start) = handle_softirqs.or(do_softirq) {
            if let Some(end) = end_of(start) {
                out.softirq = (start, end);
            }
        }
        Ok(out)
    }
}

/// Kernel stacks in pairs: one walked whole, and the kernel's own walk of
/// the same task (frames innermost first).
pub type StackPairs = Vec<(Vec<u64>, Vec<u64>)>;

/// Where the kernel keeps its ORC unwind tables and the text they cover,
/// for walking the kernel stacks of tasks not running (src/bpf/kstack.h):
/// from `/proc/kallsyms`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelOrc {
    /// `__start_orc_unwind_ip`: each entry's address, as an `s32` offset
    /// from its own slot; `__start_orc_unwind`: the 6-byte entries.
    pub ip_table: u64,
    pub entry_table: u64,
    pub entries: u32,
    /// `_stext`..`_etext`.
    pub text: (u64, u64),
    /// `.sched.text` and `.spinlock.text`, which the kernel's walk of a
    /// task not running leaves out.
    pub sched_text: (u64, u64),
    pub lock_text: (u64, u64),
    /// `ret_from_fork`, `ret_from_fork_asm` (6.6 and later): where a new
    /// task's saved frame returns to.
    pub ret_from_fork: (u64, u64),
    /// `return_to_handler` (function-graph tracing) and the kretprobe or
    /// rethook trampoline: return addresses replaced by them.
    pub ret_trampolines: (u64, u64),
    /// The modules loaded now, whose own tables the walk reads: where
    /// each one's text begins and its `struct module` (`__this_module`),
    /// by text address ascending (see [`KernelOrc::with_modules`]).
    pub modules: Vec<(u64, u64)>,
    /// `__this_module` of each module kallsyms lists, by name.
    this_module: HashMap<String, u64>,
}

/// `/proc/modules`: the modules loaded and where their text begins.
const PROC_MODULES: &str = "/proc/modules";

/// `/proc/modules` text; empty for a kernel without modules (which has no
/// such file).
fn proc_modules() -> String {
    String::from_utf8_lossy(&std::fs::read(PROC_MODULES).unwrap_or_default()).into_owned()
}

impl KernelOrc {
    /// From `/proc/kallsyms`; None where the kernel has no ORC tables, or
    /// the addresses are hidden.
    pub fn load() -> Option<KernelOrc> {
        let file = File::open(KALLSYMS).ok()?;
        let orc = KernelOrc::parse(BufReader::new(file)).ok().flatten()?;
        Some(orc.with_modules(&proc_modules()))
    }

    /// From symbols looked up by name, where the kernel can (a BPF
    /// program's `bpf_kallsyms_lookup_name`, Linux 5.16): `lookup` is
    /// given names (those of [`KernelOrc::NAMES`], then `MODULE:__this_module`
    /// for each module of `/proc/modules`) and gives each one's address
    /// (None: not found), or None for all where addresses are hidden. The
    /// same as [`KernelOrc::load`], without reading `/proc/kallsyms` (the
    /// kernel takes about 50 ms to write it).
    pub fn looked_up<E>(
        lookup: impl FnOnce(&[String]) -> Result<Option<Vec<Option<u64>>>, E>,
    ) -> Result<Option<KernelOrc>, E> {
        let proc_modules = proc_modules();
        let modules: Vec<&str> = proc_modules
            .lines()
            .filter_map(|l| l.split_ascii_whitespace().next())
            .collect();
        let names: Vec<String> = KernelOrc::NAMES
            .iter()
            .map(|n| n.to_string())
            .chain(modules.iter().map(|m| format!("{m}:__this_module")))
            .collect();
        let Some(addrs) = lookup(&names)? else {
            return Ok(None);
        };
        let at = |i: usize| addrs.get(i).copied().flatten().filter(|&a| a != 0);
        let mut found: HashMap<&'static str, u64> = KernelOrc::NAMES
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((*n, at(i)?)))
            .collect();
        // A name the kernel image lacks is looked up in the modules too:
        // the code addresses that may be absent count only in the image's
        // text (kallsyms is read for the image's alone).
        if let (Some(&lo), Some(&hi)) = (found.get("_stext"), found.get("_etext")) {
            found.retain(|name, addr| {
                !KernelOrc::MAYBE_ABSENT.contains(name) || (lo <= *addr && *addr < hi)
            });
        }
        let this_module: HashMap<String, u64> = modules
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((m.to_string(), at(KernelOrc::NAMES.len() + i)?)))
            .collect();
        Ok(KernelOrc::from_symbols(&found, this_module).map(|o| o.with_modules(&proc_modules)))
    }

    /// With the modules of `proc_modules` (`/proc/modules` text: `NAME
    /// SIZE REFS DEPS STATE ADDRESS`) that are live, have their text's
    /// address shown and a `__this_module` in kallsyms.  The BPF program
    /// reads each one's struct module again at each look, and uses it only
    /// while it still says this text and that it is live.
    pub fn with_modules(mut self, proc_modules: &str) -> KernelOrc {
        let mut modules: Vec<(u64, u64)> = proc_modules
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_ascii_whitespace().collect();
                let (name, state, addr) = (f.first()?, f.get(4)?, f.get(5)?);
                let text = u64::from_str_radix(addr.strip_prefix("0x")?, 16).ok()?;
                let at = *self.this_module.get(*name)?;
                (*state == "Live" && text != 0 && at != 0).then_some((text, at))
            })
            .collect();
        modules.sort_unstable();
        modules.dedup_by_key(|m| m.0);
        self.modules = modules;
        self
    }

    /// Those of [`KernelOrc::NAMES`] that a kernel may not have (by
    /// version, or configuration).
    const MAYBE_ABSENT: [&'static str; 4] = [
        "ret_from_fork_asm",
        "return_to_handler",
        "kretprobe_trampoline",
        "arch_rethook_trampoline",
    ];

    /// The kernel image's symbols the walk needs.
    pub const NAMES: [&'static str; 15] = [
        "__start_orc_unwind_ip",
        "__stop_orc_unwind_ip",
        "__start_orc_unwind",
        "__stop_orc_unwind",
        "_stext",
        "_etext",
        "__sched_text_start",
        "__sched_text_end",
        "__lock_text_start",
        "__lock_text_end",
        "ret_from_fork",
        "ret_from_fork_asm",
        "return_to_handler",
        "kretprobe_trampoline",
        "arch_rethook_trampoline",
    ];

    /// From kallsyms text.
    pub fn parse(mut input: impl BufRead) -> Result<Option<KernelOrc>> {
        let mut found: HashMap<&'static str, u64> = HashMap::new();
        let mut this_module = HashMap::new();
        each_symbol(&mut input, |sym| match sym.module {
            None if sym.addr != 0 => {
                if let Some(name) = KernelOrc::NAMES.iter().find(|n| **n == sym.name) {
                    found.entry(name).or_insert(sym.addr);
                }
            }
            Some(module) if sym.addr != 0 && sym.name == "__this_module" => {
                this_module.insert(module.to_string(), sym.addr);
            }
            _ => {}
        })?;
        Ok(KernelOrc::from_symbols(&found, this_module))
    }

    /// From the addresses of [`KernelOrc::NAMES`] found and each module's
    /// `__this_module`; None where the kernel has no ORC tables (or they
    /// are not as the walk reads them).
    fn from_symbols(
        found: &HashMap<&'static str, u64>,
        this_module: HashMap<String, u64>,
    ) -> Option<KernelOrc> {
        let at = |name: &str| found.get(name).copied();
        let (Some(ip_start), Some(ip_stop), Some(entry_start), Some(entry_stop)) = (
            at("__start_orc_unwind_ip"),
            at("__stop_orc_unwind_ip"),
            at("__start_orc_unwind"),
            at("__stop_orc_unwind"),
        ) else {
            return None;
        };
        let entries = ip_stop.saturating_sub(ip_start) / 4;
        // Both tables must say the same number of entries.
        if entries == 0
            || (ip_stop - ip_start) % 4 != 0
            || entry_stop.checked_sub(entry_start) != Some(entries * 6)
        {
            return None;
        }
        let pair = |a: &str, b: &str| match (at(a), at(b)) {
            (Some(x), Some(y)) if x < y => Some((x, y)),
            _ => None,
        };
        let (Some(text), Some(sched_text), Some(lock_text), Some(fork)) = (
            pair("_stext", "_etext"),
            pair("__sched_text_start", "__sched_text_end"),
            pair("__lock_text_start", "__lock_text_end"),
            at("ret_from_fork"),
        ) else {
            return None;
        };
        Some(KernelOrc {
            ip_table: ip_start,
            entry_table: entry_start,
            entries: u32::try_from(entries).unwrap_or(0),
            text,
            sched_text,
            lock_text,
            ret_from_fork: (fork, at("ret_from_fork_asm").unwrap_or(0)),
            ret_trampolines: (
                at("return_to_handler").unwrap_or(0),
                at("arch_rethook_trampoline")
                    .or(at("kretprobe_trampoline"))
                    .unwrap_or(0),
            ),
            modules: Vec::new(),
            this_module,
        })
    }
}

impl KernelOrc {
    /// Whether `ip` is a frame the kernel's walk of a task not running
    /// leaves out (`in_sched_functions`: .sched.text and .spinlock.text).
    pub fn left_out(&self, ip: u64) -> bool {
        let within = |(lo, hi): (u64, u64)| lo <= ip && ip < hi;
        within(self.sched_text) || within(self.lock_text)
    }

    /// Whether stack `whole` is `helper`, the kernel's walk of the same
    /// task, with the frames that walk leaves out.
    pub fn agrees(&self, whole: &[u64], helper: &[u64]) -> bool {
        whole
            .iter()
            .copied()
            .filter(|&ip| !self.left_out(ip))
            .eq(helper.iter().copied())
    }
}

/// The name under which `finish_task_switch` is in `/proc/kallsyms` (the
/// compiler may have renamed it: `finish_task_switch.isra.0`), for the
/// kprobe hook.
pub fn finish_task_switch() -> Result<String> {
    let file = File::open(KALLSYMS).with_context(|| format!("failed to open {KALLSYMS}"))?;
    finish_task_switch_in(BufReader::new(file))
        .with_context(|| format!("failed to read {KALLSYMS}"))?
        .ok_or_else(|| anyhow::anyhow!("finish_task_switch not found in {KALLSYMS}"))
}

/// From kallsyms text: the kernel image's function `finish_task_switch`,
/// else its first renamed copy that is not a cold part.
fn finish_task_switch_in(mut input: impl BufRead) -> Result<Option<String>> {
    let mut best = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(best);
        }
        let Some(sym) = parse_line(&line) else {
            continue;
        };
        if sym.module.is_some() || !matches!(sym.kind, b't' | b'T') {
            continue;
        }
        if sym.name == "finish_task_switch" {
            return Ok(Some(sym.name.to_string()));
        }
        if best.is_none()
            && sym.name.starts_with("finish_task_switch.")
            && !sym.name.ends_with(".cold")
        {
            best = Some(sym.name.to_string());
        }
    }
}

struct Line<'a> {
    addr: u64,
    kind: u8,
    name: &'a str,
    module: Option<&'a str>,
}

/// `ffffffff81000000 T _stext` or `ffffffffc0201000 t fuse_init\t[fuse]`,
/// or `None` if the line is not of that form.
/// Calls `f` with each well-formed line of kallsyms text `input`.
fn each_symbol(input: &mut impl BufRead, mut f: impl FnMut(Line<'_>)) -> std::io::Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if let Some(sym) = parse_line(&line) {
            f(sym);
        }
    }
}

fn parse_line(line: &[u8]) -> Option<Line<'_>> {
    let mut fields = std::str::from_utf8(line).ok()?.split_ascii_whitespace();
    let (addr, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
    let module = match fields.next() {
        Some(m) => Some(m.strip_prefix('[')?.strip_suffix(']')?),
        None => None,
    };
    if fields.next().is_some()
        || kind.len() != 1
        || addr.len() > 16
        || !addr.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    Some(Line {
        addr: u64::from_str_radix(addr, 16).ok()?,
        kind: kind.as_bytes()[0],
        name,
        module,
    })
}

/// Addresses in 4 bytes each: their low halves, and the high half once per
/// run of addresses that share it.
#[derive(Default)]
struct Addrs {
    low: Vec<u32>,
    /// (first index, high half) of each run.
    high: Vec<(u32, u32)>,
}

impl Addrs {
    fn push(&mut self, addr: u64) {
        let high = (addr >> 32) as u32;
        if self.high.last().is_none_or(|&(_, h)| h != high) {
            self.high.push((self.low.len() as u32, high));
        }
        self.low.push(addr as u32);
    }

    /// The `i`th address; `i` must be in range.
    fn get(&self, i: usize) -> u64 {
        let run = self.high.partition_point(|&(first, _)| first as usize <= i);
        let high = run.checked_sub(1).map_or(0, |r| self.high[r].1);
        (u64::from(high) << 32) | u64::from(self.low[i])
    }

    /// The index of the last of the greatest addresses at or below `addr`,
    /// the addresses being in ascending order.
    fn floor(&self, addr: u64) -> Option<usize> {
        let high = (addr >> 32) as u32;
        let run = self
            .high
            .partition_point(|&(_, h)| h <= high)
            .checked_sub(1)?;
        let (first, h) = self.high[run];
        let first = first as usize;
        let end = self
            .high
            .get(run + 1)
            .map_or(self.low.len(), |&(next, _)| next as usize);
        let past = if h < high {
            end
        } else {
            first + self.low[first..end].partition_point(|&low| low <= addr as u32)
        };
        past.checked_sub(1)
    }

    fn truncate(&mut self, len: usize) {
        self.low.truncate(len);
        while self
            .high
            .last()
            .is_some_and(|&(first, _)| first as usize >= len)
        {
            self.high.pop();
        }
    }

    fn shrink_to_fit(&mut self) {
        self.low.shrink_to_fit();
        self.high.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests;
