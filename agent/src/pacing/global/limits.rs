//! The global lever's knobs: the four dirty limits (`Limits`) as
//! /proc/sys/vm has them, read, written and journaled (one line in
//! /run/writebehindd/dirty-limits), and what /proc/vmstat says of the dirty
//! level and the threshold in force.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::super::journal::{Entry, Knobs, write_knob};

/// The journal's one key: the global limits are one set of values (the
/// line names none).
pub(super) const KEY: &str = "vm";

/// The four values, as the kernel reports them: in each pair the one that
/// is not 0 is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub dirty_bytes: u64,
    pub dirty_ratio: u64,
    pub background_bytes: u64,
    pub background_ratio: u64,
}

impl Limits {
    fn to_line(&self) -> String {
        format!("{}\t{}\t{}\t{}", self.dirty_bytes, self.dirty_ratio, self.background_bytes, self.background_ratio)
    }

    /// As `wbctl status` shows them: "dirty_ratio=20 dirty_background_ratio=10".
    pub fn describe(&self) -> String {
        let one = |bytes: u64, ratio: u64, name: &str| {
            if bytes != 0 { format!("{name}_bytes={bytes}") } else { format!("{name}_ratio={ratio}") }
        };
        format!(
            "{} {}",
            one(self.dirty_bytes, self.dirty_ratio, "dirty"),
            one(self.background_bytes, self.background_ratio, "dirty_background")
        )
    }
}

/// The limits' knobs in /proc/sys/vm, or a stand-in.
pub(super) struct Vm {
    dir: PathBuf,
}

impl Vm {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Whether the kernel has the knobs.
    pub(super) fn exists(&self) -> bool {
        self.dir.join("dirty_bytes").exists()
    }

    /// The agent's limit: `dirty` bytes, and `background` bytes for the
    /// background pair, written first.
    pub(super) fn set_bytes(&self, dirty: u64, background: u64) -> Result<()> {
        write_value(&self.dir, "dirty_background_bytes", background)
            .and_then(|()| write_value(&self.dir, "dirty_bytes", dirty))
    }
}

impl Knobs for Vm {
    type Values = Limits;
    /// (dirty_bytes, dirty_background_bytes): what the agent writes.
    type Mark = (u64, u64);

    fn read(&self, _: &str) -> Result<Limits> {
        let r = |n: &str| -> Result<u64> {
            let p = self.dir.join(n);
            let s = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            s.trim().parse().with_context(|| format!("{}: {s:?} is not a number", p.display()))
        };
        Ok(Limits {
            dirty_bytes: r("dirty_bytes")?,
            dirty_ratio: r("dirty_ratio")?,
            background_bytes: r("dirty_background_bytes")?,
            background_ratio: r("dirty_background_ratio")?,
        })
    }

    /// Puts `l` back: in each pair, the value that was in force (writing it
    /// clears the other).  The background pair first, as when lowering.
    fn write(&self, _: &str, l: &Limits) -> Result<()> {
        if l.background_bytes != 0 {
            write_value(&self.dir, "dirty_background_bytes", l.background_bytes)?;
        } else {
            write_value(&self.dir, "dirty_background_ratio", l.background_ratio)?;
        }
        if l.dirty_bytes != 0 {
            write_value(&self.dir, "dirty_bytes", l.dirty_bytes)
        } else {
            write_value(&self.dir, "dirty_ratio", l.dirty_ratio)
        }
    }

    fn mark(l: &Limits) -> (u64, u64) {
        (l.dirty_bytes, l.background_bytes)
    }

    /// The four original values, then what the agent wrote (`*\t*` while
    /// writing), tab-separated.
    fn line(_: &str, e: &Entry<Self>) -> String {
        let ours = e.ours.map_or_else(|| "*\t*".to_owned(), |(d, b)| format!("{d}\t{b}"));
        format!("{}\t{ours}", e.original.to_line())
    }

    fn parse(text: &str, journal: &Path) -> Vec<(String, Entry<Self>)> {
        match parse_journal(text) {
            Ok((original, ours)) => vec![(KEY.to_owned(), Entry { original, ours })],
            Err(e) => {
                tracing::warn!(journal = %journal.display(), error = %format!("{e:#}"), "ignoring the journal");
                Vec::new()
            }
        }
    }

    /// No restore without a journal: the values stay journaled as the
    /// agent's, for the next try.
    fn unjournaled(_: &str, err: anyhow::Error) -> Result<()> {
        Err(err)
    }
}

/// A journal line: the four original values, then what the agent wrote
/// (`*\t*` while writing).  Numbers only: nothing else is ever written back.
fn parse_journal(text: &str) -> Result<(Limits, Option<(u64, u64)>)> {
    let f: Vec<&str> = text.trim_end_matches('\n').split('\t').collect();
    let [d, r, bd, br, wd, wb] = f[..] else {
        bail!("expected 6 fields, found {}", f.len());
    };
    let n = |s: &str| s.parse::<u64>().with_context(|| format!("{s:?} is not a number"));
    let original =
        Limits { dirty_bytes: n(d)?, dirty_ratio: n(r)?, background_bytes: n(bd)?, background_ratio: n(br)? };
    // Ratios of 0 are the kernel's too (an administrator's vm.dirty_ratio =
    // 0): refusing them left the agent's values in force with the journal
    // deleted.
    if original.dirty_ratio > 100 || original.background_ratio > 100 {
        bail!("not a kernel's dirty limits: {}", original.to_line());
    }
    let ours = if (wd, wb) == ("*", "*") { None } else { Some((n(wd)?, n(wb)?)) };
    Ok((original, ours))
}

fn write_value(vm: &Path, name: &str, value: u64) -> Result<()> {
    write_knob(&vm.join(name), &value.to_string())
}

/// The system's dirty and writeback pages, as balance_dirty_pages() counts
/// them, from `vmstat` (/proc/vmstat).
pub fn dirty_pages(vmstat: &Path) -> Result<u64> {
    let text = fs::read_to_string(vmstat).with_context(|| format!("reading {}", vmstat.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| *k == "nr_dirty" || *k == "nr_writeback")
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum())
}

/// vmstat's nr_dirty_threshold: the global limit balance_dirty_pages()
/// works to now, in pages.
pub(super) fn threshold_pages(vmstat: &Path) -> Option<u64> {
    let text = fs::read_to_string(vmstat).ok()?;
    text.lines().find_map(|l| l.strip_prefix("nr_dirty_threshold ")?.trim().parse().ok())
}
