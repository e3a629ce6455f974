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
//! administrator, and the lever is not used again in this run.  The
//! protocol is `journal`'s; the knobs, their values and the journal's line
//! are in `limits`.  Here: `Global`, which sums the budgets and steps the
//! limit down to them.

use std::{collections::HashMap, path::PathBuf};

use anyhow::Result;

mod limits;

use super::journal::{Journal, Knobs, Restore};
use limits::{KEY, Vm, threshold_pages};
pub use limits::{Limits, dirty_pages};

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
    /// The limits' knobs, and while the agent's are in force, the
    /// administrator's values journaled.
    journal: Journal<Vm>,
    vmstat: PathBuf,
    page_size: u64,
    /// Paced devices and their budgets.
    budgets: HashMap<String, u64>,
    /// Devices that stopped answering (`stall`), and the dirty and
    /// writeback bytes they hold.
    stuck: HashMap<String, u64>,
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
    /// pair of dirty_bytes and dirty_background_bytes it wrote in this run:
    /// what a tool that saved the sysctls while the lever held and writes
    /// them back later (tuned, laptop-mode-tools, `sysctl -p` of a saved
    /// file) leaves behind (see `undo_written_back`).  Pairs, not values:
    /// an administrator who later sets `vm.dirty_bytes` to a round figure
    /// the agent once wrote (8 MiB, its floor) had it undone.
    seen_original: Option<Limits>,
    written: std::collections::BTreeSet<(u64, u64)>,
    /// Limits to undo, and since when they have read so (UNDO_SETTLE).
    to_undo: Option<(Limits, std::time::Instant)>,
    /// A previous run's values were found journaled at start.
    recovered: bool,
    /// When a failed restore was last tried again, and whether that was
    /// said.
    retried: Option<std::time::Instant>,
    retried_logged: bool,
}

/// Limits to undo are undone once they have read the same for this long:
/// a tool writes the four sysctls one after another, and what it leaves
/// is judged, not a step on the way.  A check between `sysctl -w` of
/// dirty_background_ratio (which zeroes the background bytes) and of
/// dirty_bytes put back the background alone, and the pair that then
/// stood was no longer one the agent wrote: its 9.3 MiB stayed.
const UNDO_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// How often a restore that failed is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Global {
    pub fn new() -> Self {
        Self::with_paths(PROC_VM.into(), VMSTAT.into(), JOURNAL.into())
    }

    /// With `vm` standing for /proc/sys/vm and `vmstat` for /proc/vmstat;
    /// recovers what a killed run left.
    pub fn with_paths(vm: PathBuf, vmstat: PathBuf, journal: PathBuf) -> Self {
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let mut me = Self {
            journal: Journal::new(Vm::new(vm), journal),
            vmstat,
            page_size,
            budgets: HashMap::new(),
            stuck: HashMap::new(),
            limit: 0,
            ceiling: u64::MAX,
            hands_off: false,
            seen_original: None,
            written: Default::default(),
            recovered: false,
            retried: None,
            retried_logged: false,
            to_undo: None,
        };
        me.recover();
        me
    }

    /// Whether the lever can be used: the knobs exist and nobody changed
    /// them under the agent in this run.
    pub fn available(&self) -> bool {
        !self.hands_off && self.journal.knobs.exists()
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
        let e = self.journal.get(KEY)?;
        let (dirty_bytes, background_bytes) = e.ours?;
        Some(GlobalLimits { dirty_bytes, background_bytes, original: e.original.describe() })
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
        self.tick_at(std::time::Instant::now());
    }

    pub(super) fn tick_at(&mut self, at: std::time::Instant) {
        if !self.journal.contains(KEY) {
            self.undo_written_back(at);
        } else if self.budgets.is_empty() && !self.hands_off {
            self.retry_restore();
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
    fn undo_written_back(&mut self, at: std::time::Instant) {
        let Some(original) = self.seen_original.clone() else { return };
        let Ok(now) = self.journal.knobs.read(KEY) else { return };
        // In each pair the bytes are in force where the ratio reads 0; both
        // as the agent wrote them together.
        let ours = |l: &Limits| {
            l.dirty_ratio == 0 && l.background_ratio == 0 && self.written.contains(&(l.dirty_bytes, l.background_bytes))
        };
        let zero =
            |l: &Limits| (l.dirty_bytes, l.dirty_ratio) == (0, 0) || (l.background_bytes, l.background_ratio) == (0, 0);
        if !(ours(&now) || (zero(&now) && !zero(&original))) {
            self.to_undo = None;
            return;
        }
        match &self.to_undo {
            Some((seen, since)) if *seen == now && at.saturating_duration_since(*since) >= UNDO_SETTLE => {}
            Some((seen, _)) if *seen == now => return,
            _ => return self.to_undo = Some((now, at)),
        }
        self.to_undo = None;
        tracing::warn!(
            now = %now.describe(), restoring = %original.describe(),
            "the global dirty limits hold what this daemon wrote while pacing, though it paces nothing now \
             (a tool that saves and restores sysctls wrote them back): putting the administrator's values back"
        );
        if let Err(e) = self.journal.knobs.write(KEY, &original) {
            tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits");
            self.seen_original = None; // not every tick
        }
    }

    fn apply(&mut self) -> Result<()> {
        let now = self.journal.knobs.read(KEY)?;
        let original = match self.journal.get(KEY) {
            Some(e) if !e.holds_ours(&now) => {
                let o = e.original.clone();
                return self.step_aside(&now, &o);
            }
            Some(e) => e.original.clone(),
            None => {
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
        let background = (want / 2).max(2 * self.page_size);
        let (after, done) = self.journal.set(KEY, &original, |vm| vm.set_bytes(want, background))?;
        self.written.insert((after.dirty_bytes, after.background_bytes));
        self.limit = want;
        done
    }

    /// A restore that failed, tried again once a second (its entry stays
    /// journaled meanwhile, for the next start too); said once.
    fn retry_restore(&mut self) {
        let now = std::time::Instant::now();
        if self.retried.is_some_and(|t| now.duration_since(t) < RETRY) {
            return;
        }
        self.retried = Some(now);
        match self.restore() {
            Ok(()) => (self.retried, self.retried_logged) = (None, false),
            Err(e) if self.retried_logged => tracing::debug!(error = %format!("{e:#}"), "global dirty limits"),
            Err(e) => {
                self.retried_logged = true;
                tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits: tried again every second");
            }
        }
    }

    /// Puts the administrator's values back, if they still hold the agent's.
    fn restore(&mut self) -> Result<()> {
        let Some(original) = self.journal.get(KEY).map(|e| e.original.clone()) else {
            return Ok(());
        };
        match self.journal.restore(KEY) {
            Restore::Done => {}
            Restore::Changed(now) => return self.step_aside(&now, &original),
            Restore::Unreadable(e) | Restore::Failed(e) => return Err(e),
        }
        tracing::info!(limits = %original.describe(), "pacing off: global dirty limits restored");
        self.limit = 0;
        self.journal.forget(KEY)
    }

    fn step_aside(&mut self, now: &Limits, original: &Limits) -> Result<()> {
        tracing::warn!(
            now = %now.describe(), would_restore = %original.describe(),
            "global dirty limits changed by someone else: not pacing through them any more, and leaving them as they are"
        );
        self.hands_off = true;
        self.limit = 0;
        self.budgets.clear();
        self.stuck.clear();
        self.journal.forget(KEY)
    }

    /// Restores what a killed run journaled, where the values still hold
    /// what it wrote.
    fn recover(&mut self) {
        if !self.journal.load() {
            return;
        }
        if let Some(e) = self.journal.get(KEY).cloned() {
            self.recovered = true;
            self.seen_original = Some(e.original);
            self.written.extend(e.ours.iter().copied());
            tracing::info!("restoring global dirty limits left set by a previous run");
            if let Err(e) = self.restore() {
                tracing::warn!(error = %format!("{e:#}"), "could not restore the global dirty limits");
            }
        }
        // A change by hand since is the administrator's: this run may use
        // the lever again, journaling the values as they are now.
        self.hands_off = false;
        self.journal.end_recovery();
    }

    fn dirty(&self) -> Result<u64> {
        Ok(dirty_pages(&self.vmstat)? * self.page_size)
    }
}

impl Default for Global {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
