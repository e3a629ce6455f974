//! The second lever: the kernel's global dirty limits, for kernels without
//! the per-device `strict_limit` and `max_bytes` (before 6.2: Debian 11 and
//! 12's default kernels, Ubuntu 22.04, RHEL 9).
//!
//! What `mm/page-writeback.c` (5.10 to 6.1) makes of it:
//! - Without strictlimit no writer is throttled while the system's dirty and
//!   writeback pages stay below the freerun ceiling, (limit + background) / 2:
//!   a device's `max_ratio` alone changes nothing until then.  So the budget
//!   is set as `vm.dirty_bytes`, with `vm.dirty_background_bytes` at half of
//!   it, while at least one device needs pacing, and only then.
//! - A limit written below the dirty level of the moment sets pos_ratio to 0
//!   at once: every writer of every device then sleeps page by page until
//!   the backlog drains (2 GiB at 30 MiB/s: over a minute).  So the limit
//!   comes down in steps from just above the dirty level, each tick, and
//!   never below it.
//! - Writing `dirty_ratio` clears `dirty_bytes` and the reverse (the same
//!   for the background pair), and `dirty_bytes` cannot be 0: the journal
//!   keeps all four values and the restore writes the one of each pair that
//!   was in force.
//!
//! Journaled and restored like the per-device knobs: before each write, on
//! release, at exit, at the next start or by `writebehindd --restore`; a
//! value that no longer holds what the agent wrote was changed by the
//! administrator, and the lever is not used again in this run.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

pub const JOURNAL: &str = "/run/writebehindd/dirty-limits";
pub const PROC_VM: &str = "/proc/sys/vm";
pub const VMSTAT: &str = "/proc/vmstat";

const MIB: u64 = 1 << 20;
/// The smallest limit written.  Below a few MiB the kernel's per-CPU
/// ratelimits (32 pages per CPU and a sixteenth of the limit) stop bounding
/// what a burst dirties between two checks.
const FLOOR: u64 = 4 * MIB;
/// While stepping down, the limit is written at the dirty level plus
/// 1/ABOVE_DIRTY of it and half a MiB.  balance_dirty_pages() holds the
/// dirty level at its setpoint, 7/8 of the limit (with the background limit
/// at half), where pos_ratio is 1 and writers dirty as fast as the devices
/// write: a limit 1/8 above the level left them there, the backlog never
/// drained, and the limit stuck (a 384 MiB copy to 30 MiB/s peaked at 53
/// MiB and its sync took 0.67 s).  1/32 above puts the level at about 97 %
/// of the limit, where the cubic pos_ratio is about one half: every
/// writer runs at about half its device's speed while the backlog drains,
/// none sleeps page by page as at the limit itself.
const ABOVE_DIRTY: u64 = 32;
/// A new limit is written once it moved by 1/SLACK (and 64 pages).
const SLACK: u64 = 64;
/// Under this lever a device's budget is at least this many seconds of its
/// bandwidth (the policy's `dirty_seconds`, 0.1, where it is larger).  The
/// kernel's global control, unlike strictlimit's per-device one, did not
/// keep a fast disk busy on 0.1 s: a 1 GiB write (fsync included) to a
/// 400 MiB/s disk while a 30 MiB/s stick was paced ran at 281-284 MiB/s,
/// 342-340 with 0.3 s (363 on the per-device lever either way, 333 for the
/// kernel default).  It costs slow devices nothing: below ~80 MiB/s their
/// budget is their windows (four of at least 2 MiB), not their seconds.
pub const MIN_DIRTY_SECONDS: f64 = 0.3;

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

/// What `wbctl status` reports while the lever is in use.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GlobalLimits {
    /// vm.dirty_bytes as the agent set it.
    pub dirty_bytes: u64,
    /// vm.dirty_background_bytes as the agent set it.
    pub background_bytes: u64,
    /// What it put back when pacing ends ("dirty_ratio=20 dirty_background_ratio=10").
    pub original: String,
}

pub struct Global {
    vm: PathBuf,
    vmstat: PathBuf,
    journal: PathBuf,
    page_size: u64,
    /// Paced devices and their budgets.
    budgets: HashMap<String, u64>,
    /// Devices that stopped answering (`stall`), and the dirty and
    /// writeback bytes they hold.
    stuck: HashMap<String, u64>,
    /// The administrator's values, while the agent's are in force.
    original: Option<Limits>,
    /// The (dirty_bytes, dirty_background_bytes) the agent last wrote; None
    /// while a write is under way (journaled as `*`).
    ours: Option<(u64, u64)>,
    /// The limit in force, 0 when the administrator's are.
    limit: u64,
    /// The threshold the kernel enforced when the agent took the lever
    /// (vmstat's nr_dirty_threshold: the ratio's share of memory, or the
    /// bytes): no limit the agent writes is above it.  A budget grows with
    /// each writer of a paced device, and a few hundred streams on a user's
    /// own FUSE mount asked for more than the machine's memory.
    ceiling: u64,
    /// The administrator changed a value while the agent's were in force.
    hands_off: bool,
    /// The administrator's values as the agent last found them, and every
    /// dirty_bytes and dirty_background_bytes it wrote in this run: what a
    /// tool that saved the sysctls while the lever held and writes them
    /// back later (tuned, laptop-mode-tools, `sysctl -p` of a saved file)
    /// leaves behind (see `undo_written_back`).
    seen_original: Option<Limits>,
    written: std::collections::BTreeSet<u64>,
    /// A previous run's values were found journaled at start.
    recovered: bool,
}

impl Global {
    pub fn new() -> Self {
        Self::with_paths(PROC_VM.into(), VMSTAT.into(), JOURNAL.into())
    }

    /// With `vm` standing for /proc/sys/vm and `vmstat` for /proc/vmstat;
    /// recovers what a killed run left.
    pub fn with_paths(vm: PathBuf, vmstat: PathBuf, journal: PathBuf) -> Self {
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let mut me = Self {
            vm,
            vmstat,
            journal,
            page_size,
            budgets: HashMap::new(),
            stuck: HashMap::new(),
            original: None,
            ours: None,
            limit: 0,
            ceiling: u64::MAX,
            hands_off: false,
            seen_original: None,
            written: Default::default(),
            recovered: false,
        };
        me.recover();
        me
    }

    /// Whether the lever can be used: the knobs exist and nobody changed
    /// them under the agent in this run.
    pub fn available(&self) -> bool {
        !self.hands_off && self.vm.join("dirty_bytes").exists()
    }

    pub fn stepped_aside(&self) -> bool {
        self.hands_off
    }

    pub fn is_paced(&self, bdi: &str) -> bool {
        self.budgets.contains_key(bdi) || self.stuck.contains_key(bdi)
    }

    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// The limits in force while the agent's are.
    pub fn status(&self) -> Option<GlobalLimits> {
        let (o, (dirty_bytes, background_bytes)) = (self.original.as_ref()?, self.ours?);
        Some(GlobalLimits { dirty_bytes, background_bytes, original: o.describe() })
    }

    /// Paces `bdi` within `budget` bytes, with the other paced devices'
    /// budgets.  False when the agent stepped aside.
    pub fn pace(&mut self, bdi: &str, budget: u64) -> Result<bool> {
        if self.hands_off {
            return Ok(false);
        }
        let first = self.budgets.is_empty();
        self.stuck.remove(bdi);
        self.budgets.insert(bdi.to_owned(), budget);
        let applied = self.apply();
        if applied.is_err() || self.hands_off {
            self.budgets.remove(bdi);
        }
        applied?;
        if first && !self.hands_off {
            tracing::info!(
                bdi,
                budget,
                limit = self.limit,
                "pacing on: global vm.dirty_bytes (no per-device strict_limit)"
            );
        }
        Ok(!self.hands_off)
    }

    /// `bdi` needs no pacing any more; the last one puts the
    /// administrator's values back.
    pub fn release(&mut self, bdi: &str) {
        let stuck = self.stuck.remove(bdi).is_some();
        if self.budgets.remove(bdi).is_none() && !stuck {
            return;
        }
        self.reapply(bdi);
    }

    /// `bdi` stopped answering (a silent NFS server, a FUSE server that
    /// hangs) with `held` bytes dirty or under writeback.  Those cannot
    /// drain, and the kernel counts them against the global limit like any
    /// others: kept inside it, they took the other devices' room, and a 128
    /// MiB write + fsync to a disk beside a silent NFS mount took 22.7 s on
    /// 6.1 (2.1 s on 6.12's per-device lever).  Its writers cannot dirty
    /// more, so pacing them holds nothing back: the device gives up its
    /// budget, and its pages are added on top of the others' budgets, or
    /// the administrator's values come back if no other device is paced.
    /// `pace` takes it back once it answers.  Called again while it is
    /// stalled, only what it holds is updated: `tick` applies it.
    pub fn stall(&mut self, bdi: &str, held: u64) {
        if let Some(h) = self.stuck.get_mut(bdi) {
            *h = held;
            return;
        }
        if self.budgets.remove(bdi).is_none() {
            return;
        }
        self.stuck.insert(bdi.to_owned(), held);
        tracing::info!(bdi, held, "stalled: its budget given up, its pages no longer limit the other devices");
        self.reapply(bdi);
    }

    /// Whether `bdi` gave up its budget (`stall`) and has not been paced
    /// since.
    pub fn is_stalled(&self, bdi: &str) -> bool {
        self.stuck.contains_key(bdi)
    }

    /// After a device left the budgets: the others' limit, or the
    /// administrator's values if none is left.
    fn reapply(&mut self, bdi: &str) {
        let done = if self.budgets.is_empty() { self.restore() } else { self.apply() };
        if let Err(e) = done {
            tracing::warn!(bdi, error = %format!("{e:#}"), "global dirty limits");
        }
    }

    pub fn release_all(&mut self) {
        self.budgets.clear();
        self.stuck.clear();
        if let Err(e) = self.restore() {
            tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits");
        }
    }

    /// Brings the limit a step closer to the paced devices' budgets (every
    /// device tick).
    pub fn tick(&mut self) {
        if self.original.is_none() {
            self.undo_written_back();
        }
        if self.budgets.is_empty() || self.hands_off {
            return;
        }
        if let Err(e) = self.apply() {
            tracing::warn!(error = %format!("{e:#}"), "global dirty limits");
        }
    }

    /// The limit wanted now: the budgets' sum and what stalled devices
    /// hold, but never below the dirty level of the moment (see the
    /// module's comment), and never above the threshold the kernel enforced
    /// before (`ceiling`).
    fn wanted(&self) -> Result<u64> {
        let target = (self.budgets.values().sum::<u64>() + self.stuck.values().sum::<u64>()).max(FLOOR);
        let dirty = self.dirty()?;
        let above = dirty + dirty / ABOVE_DIRTY + MIB / 2;
        let from = if self.limit == 0 { u64::MAX } else { self.limit };
        let want = target.max(above.min(from)).div_ceil(self.page_size) * self.page_size;
        Ok(want.min(self.ceiling))
    }

    /// The system's dirty threshold in force now, in bytes (vmstat's
    /// nr_dirty_threshold), if the kernel says.
    pub fn kernel_threshold(&self) -> Option<u64> {
        threshold_pages(&self.vmstat).map(|p| p * self.page_size)
    }

    /// The kernel's own threshold now, in bytes: what the administrator's
    /// values come to (`dirty_bytes`, or `dirty_ratio` of the memory that
    /// can be dirtied).  Their bytes where vmstat does not say.
    fn threshold(&self, now: &Limits) -> u64 {
        match (self.kernel_threshold(), now.dirty_bytes) {
            (Some(bytes), _) => bytes,
            (None, 0) => u64::MAX,
            (None, bytes) => bytes,
        }
    }

    /// While the administrator's values are in force: puts them back if
    /// the limits hold what the agent wrote in this run, or a threshold of
    /// 0 where the administrator had none.  While the lever holds,
    /// `dirty_ratio` reads 0 (the kernel zeroes a pair's other half), so a
    /// tool that saved the sysctls then and writes them back later leaves
    /// the agent's few MiB in force for good, or, writing the ratio alone,
    /// a threshold of 0: every write then waits for writeback, worse than
    /// the kernel's default.
    fn undo_written_back(&mut self) {
        let Some(original) = self.seen_original.clone() else { return };
        let Ok(now) = self.read() else { return };
        // In each pair the bytes are in force where the ratio reads 0.
        let ours = |bytes: u64, ratio: u64| ratio == 0 && bytes != 0 && self.written.contains(&bytes);
        let zero =
            |l: &Limits| (l.dirty_bytes, l.dirty_ratio) == (0, 0) || (l.background_bytes, l.background_ratio) == (0, 0);
        if !(ours(now.dirty_bytes, now.dirty_ratio)
            || ours(now.background_bytes, now.background_ratio)
            || (zero(&now) && !zero(&original)))
        {
            return;
        }
        tracing::warn!(
            now = %now.describe(), restoring = %original.describe(),
            "the global dirty limits hold what this daemon wrote while pacing, though it paces nothing now \
             (a tool that saves and restores sysctls wrote them back): putting the administrator's values back"
        );
        if let Err(e) = write_limits(&self.vm, &original) {
            tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits");
            self.seen_original = None; // not every tick
        }
    }

    fn apply(&mut self) -> Result<()> {
        let now = self.read()?;
        let original = match (&self.original, self.ours) {
            (Some(o), Some(ours)) if (now.dirty_bytes, now.background_bytes) != ours => {
                let o = o.clone();
                return self.step_aside(&now, &o);
            }
            (Some(o), _) => o.clone(),
            (None, _) => {
                self.ceiling = self.threshold(&now);
                now.clone()
            }
        };
        let want = self.wanted()?;
        if self.limit != 0 && want.abs_diff(self.limit) < (self.limit / SLACK).max(64 * self.page_size) {
            return Ok(());
        }
        if self.limit == 0 && want >= self.ceiling {
            // The kernel's threshold is already as low: nothing to lower.
            return Ok(());
        }
        self.seen_original = Some(original.clone());
        self.original = Some(original);
        self.ours = None;
        self.save_journal()?;
        let background = (want / 2).max(2 * self.page_size);
        let wrote = write_value(&self.vm, "dirty_background_bytes", background)
            .and_then(|()| write_value(&self.vm, "dirty_bytes", want));
        let after = self.read()?;
        self.ours = Some((after.dirty_bytes, after.background_bytes));
        self.written.extend([after.dirty_bytes, after.background_bytes]);
        self.limit = want;
        self.save_journal()?;
        wrote
    }

    /// Puts the administrator's values back, if they still hold the agent's.
    fn restore(&mut self) -> Result<()> {
        let Some(original) = self.original.clone() else {
            return Ok(());
        };
        let now = self.read()?;
        if let Some(ours) = self.ours
            && (now.dirty_bytes, now.background_bytes) != ours
        {
            return self.step_aside(&now, &original);
        }
        self.ours = None;
        self.save_journal()?;
        write_limits(&self.vm, &original)?;
        tracing::info!(limits = %original.describe(), "pacing off: global dirty limits restored");
        self.original = None;
        self.limit = 0;
        self.save_journal()
    }

    fn step_aside(&mut self, now: &Limits, original: &Limits) -> Result<()> {
        tracing::warn!(
            now = %now.describe(), would_restore = %original.describe(),
            "global dirty limits changed by someone else: not pacing through them any more, and leaving them as they are"
        );
        self.hands_off = true;
        self.original = None;
        self.ours = None;
        self.limit = 0;
        self.budgets.clear();
        self.stuck.clear();
        self.save_journal()
    }

    /// Restores what a killed run journaled, where the values still hold
    /// what it wrote.
    fn recover(&mut self) {
        let Ok(text) = fs::read_to_string(&self.journal) else {
            return;
        };
        match parse_journal(&text) {
            Ok((original, ours)) => {
                self.recovered = true;
                self.seen_original = Some(original.clone());
                self.written.extend(ours.iter().flat_map(|&(d, b)| [d, b]));
                self.original = Some(original);
                self.ours = ours;
                tracing::info!("restoring global dirty limits left set by a previous run");
                if let Err(e) = self.restore() {
                    tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits");
                }
            }
            Err(e) => {
                tracing::warn!(journal = %self.journal.display(), error = %format!("{e:#}"), "ignoring the journal")
            }
        }
        // A change by hand since is the administrator's: this run may use
        // the lever again, journaling the values as they are now.
        self.hands_off = false;
        let _ = fs::remove_file(&self.journal);
    }

    fn save_journal(&self) -> Result<()> {
        let Some(o) = &self.original else {
            let _ = fs::remove_file(&self.journal);
            return Ok(());
        };
        let ours = self.ours.map_or_else(|| "*\t*".to_owned(), |(d, b)| format!("{d}\t{b}"));
        let text = format!("{}\t{ours}\n", o.to_line());
        super::journal::write_journal(&self.journal, &text)
    }

    fn dirty(&self) -> Result<u64> {
        Ok(dirty_pages(&self.vmstat)? * self.page_size)
    }

    fn read(&self) -> Result<Limits> {
        let r = |n: &str| -> Result<u64> {
            let p = self.vm.join(n);
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
}

impl Default for Global {
    fn default() -> Self {
        Self::new()
    }
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
fn threshold_pages(vmstat: &Path) -> Option<u64> {
    let text = fs::read_to_string(vmstat).ok()?;
    text.lines().find_map(|l| l.strip_prefix("nr_dirty_threshold ")?.trim().parse().ok())
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

/// Puts `l` back: in each pair, the value that was in force (writing it
/// clears the other).  The background pair first, as when lowering.
fn write_limits(vm: &Path, l: &Limits) -> Result<()> {
    if l.background_bytes != 0 {
        write_value(vm, "dirty_background_bytes", l.background_bytes)?;
    } else {
        write_value(vm, "dirty_background_ratio", l.background_ratio)?;
    }
    if l.dirty_bytes != 0 {
        write_value(vm, "dirty_bytes", l.dirty_bytes)
    } else {
        write_value(vm, "dirty_ratio", l.dirty_ratio)
    }
}

fn write_value(vm: &Path, name: &str, value: u64) -> Result<()> {
    let p = vm.join(name);
    crate::sys::write_setting(&p, &value.to_string()).with_context(|| format!("writing {value} to {}", p.display()))
}

#[cfg(test)]
mod tests;
