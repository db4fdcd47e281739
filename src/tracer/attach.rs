//! The program attached: the wake-up and fork hooks, the switch hook, and
//! `--on-cpu`'s sampler on every CPU's `cpu-clock` event.

use super::*;

/// Attaches the wake-up and fork hooks the plan has, then the switch hook
/// (`kprobe_symbol`: the kprobe's, resolved before the load): the links,
/// and the switch hook attached.
pub(super) fn attach_hooks(
    skel: &OffcputimeSkel<'_>,
    plan: &Plan,
    hook: Hook,
    kprobe_symbol: Option<String>,
) -> Result<(Vec<Link>, AttachedHook)> {
    // The wake-up hook first: no wake-up of a block the switch hook
    // sees may be missed.
    let mut links = Vec::new();
    for (role, name) in [
        (Role::Wakeup, "sched_wakeup"),
        (Role::Waking, "sched_waking"),
        (Role::Fork, "sched_process_fork"),
        (Role::DiskDone, "block_rq_complete"),
    ] {
        if let Some(p) = plan.program(role) {
            let prog = program_of(skel, p)?;
            let link = match p.attach {
                Attach::TpBtf => prog.attach(),
                Attach::RawTp(tp) => prog.attach_raw_tracepoint(tp),
                other => bail!("{}: attached as {other:?}, not a tracepoint", p.name),
            };
            links.push(link.with_context(|| format!("failed to attach the {name} hook"))?);
        }
    }
    // The hook only notes switches until the start iterator, run next,
    // has claimed the blocks under way and opened the window.
    let switch = plan
        .program(Role::Switch)
        .ok_or_else(|| anyhow!("no switch program for {hook:?}"))?;
    let prog = program_of(skel, switch)?;
    let (link, attached) = match switch.attach {
        Attach::TpBtf => (
            prog.attach()
                .context("failed to attach tp_btf/sched_switch")?,
            AttachedHook::TpBtf,
        ),
        Attach::RawTp(tp) => (
            prog.attach_raw_tracepoint(tp)
                .context("failed to attach raw_tp/sched_switch")?,
            AttachedHook::RawTp,
        ),
        Attach::Kprobe => {
            let symbol = kprobe_symbol.expect("resolved above");
            let link = prog.attach_kprobe(false, &symbol).with_context(|| {
                let hint = if std::path::Path::new(KPROBE_PMU).exists() {
                    ""
                } else {
                    " (this kernel has no kprobe support, CONFIG_KPROBES)"
                };
                format!("failed to attach kprobe to {symbol}{hint}")
            })?;
            (link, AttachedHook::Kprobe { symbol })
        }
        other => bail!("{}: attached as {other:?}", switch.name),
    };
    links.push(link);
    Ok((links, attached))
}

/// `--on-cpu`: the sampler attached to each CPU's `cpu-clock` event (its
/// links added to `links`), the periods dithered.
pub(super) fn attach_on_cpu(
    skel: &OffcputimeSkel<'_>,
    opts: &TracerOptions,
    plan: &Plan,
    links: &mut Vec<Link>,
) -> Result<Option<cpuclock::Dither>> {
    // --on-cpu: the samples begin before the window opens (and those
    // before it are left out), so that none of it goes unsampled.
    // libbpf's link closes the event's descriptor: the link owns it
    // once attached (those not attached yet are closed here).
    Ok(match (opts.on_cpu_hz, plan.program(Role::OnCpu)) {
        (Some(hz), Some(p)) => {
            let sampler = program_of(skel, p)?;
            let mut attached = Vec::new();
            for fd in cpuclock::open(hz)? {
                use std::os::fd::AsRawFd;
                let link = sampler
                    .attach_perf_event(fd.as_raw_fd())
                    .context("failed to attach the on-CPU sampler to cpu-clock")?;
                attached.push(std::os::fd::IntoRawFd::into_raw_fd(fd));
                links.push(link);
            }
            Some(cpuclock::Dither::start(attached, hz)?)
        }
        _ => None,
    })
}
