//! Unit tests of the kallsyms readers, over made-up kallsyms texts.

use super::*;

fn table(text: &[u8]) -> KernelSymbols {
    KernelSymbols::parse(text).unwrap()
}

fn at(t: &KernelSymbols, addr: u64) -> Option<(&str, u64, Option<&str>)> {
    t.resolve(addr).map(|s| (s.name, s.offset, s.module))
}

#[test]
fn finds_finish_task_switch_as_renamed() {
    let find = |text: &[u8]| finish_task_switch_in(text).unwrap();
    let renamed = b"ffffffff81000000 t finish_task_switch.cold
ffffffff81000010 t finish_task_switch\t[mod]
ffffffff81000020 d finish_task_switch.data
ffffffff81000030 t finish_task_switch.isra.0
ffffffff81000040 t finish_task_switch.part.1
";
    assert_eq!(find(renamed).as_deref(), Some("finish_task_switch.isra.0"));
    let plain = b"0000000000000000 t finish_task_switch.isra.0
0000000000000000 T finish_task_switch
";
    assert_eq!(find(plain).as_deref(), Some("finish_task_switch"));
    assert_eq!(find(b"ffffffff81000000 T schedule\n"), None);
}

#[test]
fn keeps_function_symbols_in_address_order() {
    let t = table(
        b"ffffffff81000000 T srso_alias_untrain_ret
ffffffff81000000 T _stext
ffffffff81000010 t __pfx_foo
ffffffff81000020 t foo
ffffffff81000040 D some_data
ffffffff81000048 R some_rodata
ffffffff81000030 T bar
ffffffff81000060 W weak_upper
ffffffff81000070 w weak_lower
ffffffffc0000100 t fuse_exit\t[fuse]
ffffffffc0000000 t fuse_init\t[fuse]
ffffffffa0001000 t bpf_prog_0123456789abcdef_prog\t[bpf]
ffff800000001000 T other_half
",
    );
    assert_eq!(t.len(), 11);
    assert!(!t.addresses_hidden());
    assert_eq!(at(&t, 0xffff800000000fff), None, "below the first");
    assert_eq!(at(&t, 0xffff800000001002), Some(("other_half", 2, None)));
    // Between runs of high halves: the last symbol of the lower one.
    assert_eq!(
        at(&t, 0xffff800100000000),
        Some(("other_half", 0xfffff000, None))
    );
    assert_eq!(
        at(&t, 0xffffffff80ffffff),
        Some(("other_half", 0x7fff80ffefff, None))
    );
    // The first in the file of the symbols at one address.
    assert_eq!(
        at(&t, 0xffffffff81000000),
        Some(("srso_alias_untrain_ret", 0, None))
    );
    assert_eq!(at(&t, 0xffffffff81000015), Some(("__pfx_foo", 5, None)));
    assert_eq!(at(&t, 0xffffffff81000024), Some(("foo", 4, None)));
    // Data symbols are not kept, and the input need not be sorted.
    assert_eq!(at(&t, 0xffffffff81000044), Some(("bar", 0x14, None)));
    assert_eq!(at(&t, 0xffffffff81000061), Some(("weak_upper", 1, None)));
    assert_eq!(at(&t, 0xffffffff81000070), Some(("weak_lower", 0, None)));
    assert_eq!(
        at(&t, 0xffffffffa0001008),
        Some(("bpf_prog_0123456789abcdef_prog", 8, Some("bpf")))
    );
    assert_eq!(
        at(&t, 0xffffffffc0000010),
        Some(("fuse_init", 0x10, Some("fuse")))
    );
    // No sizes: past the last symbol is still in it.
    assert_eq!(
        at(&t, 0xffffffffffffffff),
        Some(("fuse_exit", 0x3ffffeff, Some("fuse")))
    );
    // Between the image and a module: the image's last symbol.
    assert_eq!(
        at(&t, 0xffffffff9fffffff),
        Some(("weak_lower", 0x1effff8f, None))
    );
    assert_eq!(t.modules.len(), 2);
}

#[test]
fn symbols_out_of_order_are_moved_in_file_order() {
    let t = table(
        b"ffffffff81000000 T a
ffffffff81000100 T b
ffffffff81000200 T c
ffffffffc0000100 t m2\t[m]
ffffffffc0000000 t m1\t[m]
ffffffff81000180 t bpf_prog_1\t[bpf]
ffffffff81000100 t b_too
",
    );
    let order: Vec<_> = (0..t.len())
        .map(|i| at(&t, t.addrs.get(i) + 1).unwrap())
        .collect();
    assert_eq!(
        order,
        [
            ("a", 1, None),
            ("b", 1, None),
            ("b", 1, None),
            ("bpf_prog_1", 1, Some("bpf")),
            ("c", 1, None),
            ("m1", 1, Some("m")),
            ("m2", 1, Some("m")),
        ]
    );
}

#[test]
fn names_are_stored_once() {
    let t = table(
        b"ffffffff81000010 t __pfx_foo
ffffffff81000020 t foo
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
",
    );
    assert_eq!(t.names, "__pfx_foo\nftrace_trampoline\n");
    assert_eq!(at(&t, 0xffffffff81000020), Some(("foo", 0, None)));
    assert_eq!(
        at(&t, 0xffffffffc0201001),
        Some(("ftrace_trampoline", 1, Some("__builtin__ftrace")))
    );
    assert_eq!(t.modules.len(), 1);
}

#[test]
fn malformed_lines_are_skipped() {
    let mut text = b"ffffffff81000000 T first
garbage
ffffffff81000010
ffffffff81000010 T
zzzzzzzz81000010 T bad_hex
+fffffff81000010 T signed
1ffffffff81000010 T too_wide
ffffffff81000010 TT two_letters
ffffffff81000010 t too many fields
ffffffff81000010 t bad_module\tfuse
ffffffff81000010 t bad_module2\t[fuse

   
ffffffff81000020 T last"
        .to_vec();
    text.extend_from_slice(b"\nffffffff81000010 t bad_utf8_\xff\n");
    let t = table(&text);
    assert_eq!(t.len(), 2);
    assert_eq!(at(&t, 0xffffffff8100001f), Some(("first", 0x1f, None)));
    assert_eq!(at(&t, 0xffffffff81000021), Some(("last", 1, None)));
}

#[test]
fn zero_addresses_are_hidden_addresses() {
    let t = table(
        b"0000000000000000 T _stext
0000000000000000 t foo
0000000000000000 t fuse_init\t[fuse]
",
    );
    assert!(t.addresses_hidden());
    assert_eq!(t.len(), 0);
    assert_eq!(at(&t, 0), None);
    assert_eq!(at(&t, 0xffffffff81000000), None);
    // An empty file hides nothing; it has nothing.
    let t = table(b"");
    assert!(!t.addresses_hidden());
    assert_eq!(at(&t, 0xffffffff81000000), None);
}

/// Against blazesym, as it named kernel frames before (kallsyms only),
/// on this machine's kernel: symbol starts and a few addresses into
/// some 1500 functions of the kernel image (module symbols come and go
/// with BPF programs).
#[test]
#[allow(clippy::field_reassign_with_default)]
fn resolves_like_blazesym_on_this_kernel() {
    use blazesym::symbolize::source::{Kernel, Source};
    use blazesym::symbolize::{Input, Symbolized, Symbolizer};

    let t = KernelSymbols::load().unwrap();
    if t.addresses_hidden() || t.len() == 0 {
        let why = "/proc/kallsyms gives no addresses (run as root)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        println!("skipped: {why}");
        return;
    }
    // Every symbol, of any type: blazesym keeps data symbols too, so
    // addresses stay below the next symbol of any type.
    let text = std::fs::read_to_string(KALLSYMS).unwrap();
    let mut all: Vec<Line<'_>> = text
        .lines()
        .filter_map(|l| parse_line(l.as_bytes()))
        .filter(|s| s.addr != 0)
        .collect();
    all.sort_by_key(|s| s.addr);
    let mut names_at: HashMap<u64, Vec<(&str, bool)>> = HashMap::new();
    for s in &all {
        let function = matches!(s.kind, b't' | b'T' | b'w' | b'W');
        names_at.entry(s.addr).or_default().push((s.name, function));
    }
    let mut starts: Vec<u64> = names_at.keys().copied().collect();
    starts.sort_unstable();
    let image: Vec<u64> = starts
        .iter()
        .copied()
        .filter(|a| names_at[a].iter().any(|&(_, f)| f))
        .filter(|&a| t.resolve(a).is_some_and(|s| s.module.is_none()))
        .collect();
    let step = (image.len() / 1500).max(1);
    let mut addrs = Vec::new();
    for &start in image.iter().step_by(step) {
        let next = starts[starts.partition_point(|&a| a <= start)..]
            .first()
            .copied()
            .unwrap_or(u64::MAX);
        for off in [0, 1, 5, 0x13, 0x40] {
            if start + off < next {
                addrs.push(start + off);
            }
        }
    }
    assert!(addrs.len() > 3000, "{} addresses", addrs.len());

    let mut kernel = Kernel::default();
    kernel.vmlinux = blazesym::MaybeDefault::None;
    kernel.debug_syms = false;
    let blazesym = Symbolizer::new();
    let theirs = blazesym
        .symbolize(&Source::Kernel(kernel), Input::AbsAddr(&addrs))
        .unwrap();
    for (&addr, theirs) in addrs.iter().zip(theirs) {
        let Symbolized::Sym(theirs) = theirs else {
            panic!("{addr:#x}: blazesym found nothing");
        };
        let ours = t.resolve(addr).unwrap();
        assert_eq!(ours.offset, theirs.offset as u64, "{addr:#x}: {ours:?}");
        let there = &names_at[&(addr - ours.offset)];
        assert!(
            there.iter().any(|&(n, _)| n == ours.name)
                && there.iter().any(|&(n, _)| n == theirs.name),
            "{addr:#x}: {} against blazesym's {}",
            ours.name,
            theirs.name
        );
        // Both take the first in the file where only functions are;
        // except that blazesym, past the lowest address of all, takes
        // the last there (its backward scan for the first stops short
        // at the start of its table).
        if there.iter().all(|&(_, f)| f) && (addr - ours.offset != starts[0] || ours.offset == 0) {
            assert_eq!(ours.name, theirs.name, "{addr:#x}");
        }
    }
    println!("{} addresses named as blazesym names them", addrs.len());
}

#[test]
fn interrupt_entries() {
    let text = b"ffffffff81000c60 T asm_exc_page_fault
ffffffff81000d10 T asm_exc_double_fault
ffffffff81000d40 T asm_common_interrupt
ffffffff81000d80 T asm_spurious_interrupt
ffffffff81000df0 T asm_sysvec_apic_timer_interrupt
ffffffff81000f50 T asm_sysvec_kvm_asyncpf_interrupt
ffffffff81000f70 T __irqentry_text_end
ffffffff81360020 t handle_softirqs
ffffffff81360300 t __irq_exit_rcu
ffffffff82202160 T __do_softirq
ffffffff82202170 T __do_softirq_end
ffffffffc0201000 t asm_sysvec_fake\t[mod]
";
    let e = InterruptEntries::parse(&text[..]).unwrap();
    assert_eq!(e.irq, (0xffffffff81000d40, 0xffffffff81000f70));
    assert_eq!(e.softirq, (0xffffffff81360020, 0xffffffff81360300));
    // An exception stub among them: no range (a page fault is the
    // task's own).
    let mixed = b"ffffffff81000d40 T asm_common_interrupt
ffffffff81000d50 T asm_exc_page_fault
ffffffff81000df0 T asm_sysvec_apic_timer_interrupt
ffffffff81000e10 T next
";
    assert_eq!(InterruptEntries::parse(&mixed[..]).unwrap().irq, (0, 0));
    // Hidden addresses: nothing.
    let hidden = b"0000000000000000 T asm_common_interrupt
0000000000000000 t handle_softirqs
";
    assert_eq!(
        InterruptEntries::parse(&hidden[..]).unwrap(),
        InterruptEntries::default()
    );
    // The machine's own, where kallsyms shows addresses.
    if let Ok(e) = InterruptEntries::load() {
        if e.irq != (0, 0) {
            assert!(e.irq.0 < e.irq.1 && e.irq.1 - e.irq.0 < 1 << 16, "{e:?}");
        }
    }
}

const ORC_KALLSYMS: &[u8] = b"\
ffffffff81000000 T _stext
ffffffff81001000 t __schedule
ffffffff81001000 T __sched_text_start
ffffffff81002000 T __sched_text_end
ffffffff81002000 T __lock_text_start
ffffffff81003000 T __lock_text_end
ffffffff81004000 T ret_from_fork
ffffffff82000000 T _etext
ffffffff83000000 R __start_orc_unwind_ip
ffffffff83000010 R __stop_orc_unwind_ip
ffffffff83000010 R __start_orc_unwind
ffffffff83000028 R __stop_orc_unwind
ffffffffc0000000 t ext4_read\t[ext4]
ffffffffc0010000 d __this_module\t[ext4]
ffffffffc0110000 d __this_module\t[tun]
ffffffffc0210000 d __this_module\t[gone]
";

#[test]
fn orc_tables_from_kallsyms() {
    let orc = KernelOrc::parse(ORC_KALLSYMS).unwrap().expect("found");
    assert_eq!(orc.ip_table, 0xffffffff83000000);
    assert_eq!(orc.entry_table, 0xffffffff83000010);
    assert_eq!(orc.entries, 4);
    assert_eq!(orc.text, (0xffffffff81000000, 0xffffffff82000000));
    assert_eq!(orc.ret_from_fork, (0xffffffff81004000, 0));
    assert_eq!(orc.ret_trampolines, (0, 0));
    // Tables whose sizes disagree (4 addresses, 3 entries) are not used.
    let bad = String::from_utf8_lossy(ORC_KALLSYMS).replace(
        "ffffffff83000028 R __stop_orc_unwind",
        "ffffffff83000022 R __stop_orc_unwind",
    );
    assert_eq!(KernelOrc::parse(bad.as_bytes()).unwrap(), None);
    // Hidden addresses (all zero): none.
    let hidden = String::from_utf8_lossy(ORC_KALLSYMS)
        .lines()
        .map(|l| format!("0000000000000000{}\n", &l[16..]))
        .collect::<String>();
    assert_eq!(KernelOrc::parse(hidden.as_bytes()).unwrap(), None);
}

#[test]
fn modules_whose_tables_the_walk_reads() {
    let orc = KernelOrc::parse(ORC_KALLSYMS).unwrap().expect("found");
    let orc = orc.with_modules(
        "tun 65536 0 - Live 0xffffffffc0100000\n\
         ext4 1024000 1 - Live 0xffffffffc0000000\n\
         gone 4096 0 - Unloading 0xffffffffc0200000\n\
         hidden 4096 0 - Live 0x0000000000000000\n\
         nosym 4096 0 - Live 0xffffffffc0300000\n\
         bad line\n",
    );
    // Live, shown, and named in kallsyms; by text address.
    assert_eq!(
        orc.modules,
        [
            (0xffffffffc0000000, 0xffffffffc0010000),
            (0xffffffffc0100000, 0xffffffffc0110000)
        ]
    );
    // A kernel without modules.
    let none = KernelOrc::parse(ORC_KALLSYMS)
        .unwrap()
        .unwrap()
        .with_modules("");
    assert!(none.modules.is_empty());
}

#[test]
fn a_whole_stack_agrees_with_the_kernels_walk_without_scheduler_frames() {
    let orc = KernelOrc::parse(ORC_KALLSYMS).unwrap().unwrap();
    let sched = 0xffffffff81001010;
    let lock = 0xffffffff81002010;
    let (a, b) = (0xffffffff81500000, 0xffffffff81600000);
    assert!(orc.left_out(sched) && orc.left_out(lock) && !orc.left_out(a));
    assert!(orc.agrees(&[sched, sched + 8, a, lock, b], &[a, b]));
    assert!(orc.agrees(&[a, b], &[a, b]));
    assert!(!orc.agrees(&[sched, a], &[a, b]));
    assert!(!orc.agrees(&[sched, b, a], &[a, b]));
    assert!(!orc.agrees(&[sched, a, b], &[sched, a, b]));
}

#[test]
fn symbols_as_the_kernel_prints_them() {
    let p = |t: &str| PrintedSym::parse(t);
    assert_eq!(
        p("schedule+0x5a/0xd0"),
        Some(PrintedSym {
            name: "schedule".into(),
            offset: 0x5a,
            size: 0xd0,
            module: None
        })
    );
    let m = p("ext4_file_read_iter+0x1f/0x1c0 [ext4]").unwrap();
    assert_eq!(
        (m.name.as_str(), m.module.as_deref()),
        ("ext4_file_read_iter", Some("ext4"))
    );
    // With a build id (`%pSb`), the module alone.
    let b = p("nvme_poll+0x4/0x10 [nvme 0123abcd]").unwrap();
    assert_eq!(b.module.as_deref(), Some("nvme"));
    // Names with dots, and a `+` of their own before the offset.
    assert_eq!(p("foo.cold+0x0/0x20").unwrap().name, "foo.cold");
    // BPF programs and trampolines go in `[bpf]`, as kallsyms has them;
    // kernel functions about BPF do not.
    let prog = p("bpf_prog_0123456789abcdef_sched_switch+0x10/0x200").unwrap();
    assert_eq!(prog.module.as_deref(), Some("bpf"));
    assert_eq!(
        p("bpf_prog_0123456789abcdef+0x0/0x8")
            .unwrap()
            .module
            .as_deref(),
        Some("bpf")
    );
    assert_eq!(
        p("bpf_trampoline_6442+0x3/0x100")
            .unwrap()
            .module
            .as_deref(),
        Some("bpf")
    );
    assert_eq!(p("bpf_prog_load+0x10/0x900").unwrap().module, None);
    assert_eq!(
        p("bpf_prog_0123456789abcdefg+0x0/0x8").unwrap().module,
        None
    );
    // No symbol: the address itself. Anything else: nothing.
    for bad in [
        "0xffffffffc0001234",
        "",
        "schedule",
        "+0x1/0x2",
        "a+0x1",
        "a+0xzz/0x2",
        "a+0x1/0x2 []",
        "a+0x1/0x2 [m",
    ] {
        assert_eq!(p(bad), None, "{bad:?}");
    }
}
