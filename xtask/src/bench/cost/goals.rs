//! The goals watching is held to, printed after cost's parts.

use super::{CostSizes, Part, Run};
use crate::bench::{modes::Mode, report};

/// The goals watching is held to, next to the medians.
pub(super) fn goals(runs: &[Run], s: &CostSizes) -> String {
    let def = Mode::Default.name();
    let wb = Mode::Writebehindd(None).name();
    let med = |part: Part, mode: &str, metric: &str| report::median(runs, &part.group(s), mode, metric);
    let mut rows = vec![["goal", "kernel default", "writebehindd", "cost", "met"].map(String::from).to_vec()];
    let over = |part, metric, what: &str, limit: f64| {
        let (d, w) = (med(part, &def, metric), med(part, &wb, metric));
        let pct = d.zip(w).map(|(d, w)| (w / d - 1.0) * 100.0);
        vec![
            format!("{what}: <= +{limit} %"),
            d.map_or("-".into(), report::fmt),
            w.map_or("-".into(), report::fmt),
            pct.map_or("-".into(), |p| format!("{p:+.1} %")),
            verdict(pct.map(|p| p <= limit)),
        ]
    };
    rows.push(over(Part::PerCall, "tmpfs ns/write", "4 KiB write() to tmpfs, ns", 2.0));
    rows.push(over(Part::PerCall, "ext4 ns/write", "4 KiB write() to ext4, ns", 2.0));
    rows.push(over(Part::PerCall, "ext4 fresh ns/write", "4 KiB write() dirtying a page (ext4), ns", 2.0));
    rows.push(over(Part::PerCall, "getppid ns", "getppid(), ns", 1.0));
    rows.push(over(Part::PerCall, "find /usr s", "find /usr -xdev (cached), s", 1.0));
    let share = |part, metric, what: &str, limit: f64| {
        let v = med(part, &wb, metric);
        vec![
            format!("{what}: <= {limit} %"),
            String::new(),
            String::new(),
            v.map_or("-".into(), |v| format!("{v:.1} %")),
            verdict(v.map(|v| v <= limit)),
        ]
    };
    rows.push(share(Part::Copy, "agent %core per 100MiB/s", "one big file: agent % of a core per 100 MiB/s", 1.0));
    // The same goal on the whole machine, cp's start to synced: part of the
    // agent's CPU is writeback the kernel's flusher does without it.
    let (d, w) =
        (med(Part::Copy, &def, "all CPUs %core per 100MiB/s"), med(Part::Copy, &wb, "all CPUs %core per 100MiB/s"));
    rows.push(vec![
        "one big file + sync: all CPUs' extra, % of a core per 100 MiB/s: <= 1 %".into(),
        d.map_or("-".into(), |v| format!("{v:.2} %")),
        w.map_or("-".into(), |v| format!("{v:.2} %")),
        d.zip(w).map_or("-".into(), |(d, w)| format!("{:+.2} %", w - d)),
        verdict(d.zip(w).map(|(d, w)| w - d <= 1.0)),
    ]);
    rows.push(share(Part::Tar, "agent/tar CPU %", "tar x of small files: agent CPU / tar's CPU", 10.0));
    // The same goal counted on the whole machine, tar's start to synced:
    // the kernel's flusher does without the daemon what the agent does with it.
    let (d, w, t) =
        (med(Part::Tar, &def, "all CPUs s"), med(Part::Tar, &wb, "all CPUs s"), med(Part::Tar, &def, "tar CPU s"));
    let extra = d.zip(w).zip(t).map(|((d, w), t)| (w - d) / t * 100.0);
    rows.push(vec![
        "tar x + sync: all CPUs' extra / tar's CPU: <= 10 %".into(),
        d.map_or("-".into(), |v| format!("{v:.2} s")),
        w.map_or("-".into(), |v| format!("{v:.2} s")),
        extra.map_or("-".into(), |p| format!("{p:+.1} %")),
        verdict(extra.map(|p| p <= 10.0)),
    ]);
    let flood = Part::Flood.daemon_mode().name();
    let (rate, lost) = (med(Part::Flood, &flood, "peak events/s"), med(Part::Flood, &flood, "lost"));
    rows.push(vec![
        "closed files: nothing lost at 50,000/s".into(),
        med(Part::Flood, &def, "files/s").map_or("-".into(), |f| format!("{f:.0} files/s")),
        med(Part::Flood, &flood, "files/s").map_or("-".into(), |f| format!("{f:.0} files/s")),
        format!("{} events/s, {} lost", rate.map_or("-".into(), |r| format!("{r:.0}")), lost.unwrap_or(f64::NAN)),
        match (rate, lost) {
            (Some(r), Some(l)) if l > 0.0 => verdict(Some(false)) + if r < 50_000.0 { " (below 50k/s)" } else { "" },
            (Some(r), Some(_)) if r < 50_000.0 => "not reached".into(),
            (r, l) => verdict(r.zip(l).map(|_| true)),
        },
    ]);
    report::grid("cost: goals, medians", &rows)
}

fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "yes".into(),
        Some(false) => "MISSED".into(),
        None => "-".into(),
    }
}
