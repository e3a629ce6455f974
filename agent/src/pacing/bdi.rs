//! The per-device lever: a bdi's strict_limit and max_bytes (its ceiling
//! read back as max_ratio_fine), written, journaled in
//! /run/writebehindd/paced-bdis and put back by the journal protocol
//! (`journal`).

use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::journal::{Entry, Journal, Knobs, Restore, write_knob};

/// The two knobs' values as the kernel reports them.  The ceiling is kept as
/// `max_ratio_fine` (parts per million of the dirty limit): `max_bytes` reads
/// back as a share of a limit that moves with free memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Values {
    pub(super) max_ratio_fine: String,
    pub(super) strict_limit: String,
}

/// The bdis' knobs, under /sys/class/bdi or a stand-in.
pub(super) struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    fn knob(&self, bdi: &str, name: &str) -> PathBuf {
        self.root.join(bdi).join(name)
    }

    /// Whether there is a bdi `bdi`.
    fn exists(&self, bdi: &str) -> bool {
        self.root.join(bdi).exists()
    }

    /// Whether the kernel gives `bdi` both knobs (6.2+).
    fn has_knobs(&self, bdi: &str) -> bool {
        self.knob(bdi, "max_bytes").exists() && self.knob(bdi, "strict_limit").exists()
    }

    fn write_cap(&self, bdi: &str, budget: u64, original: &Values) -> Result<()> {
        if write_knob(&self.knob(bdi, "max_bytes"), &budget.to_string()).is_err() {
            // The kernel refuses a max_bytes above the system's dirty limit
            // (EINVAL; the limit falls as memory fills, and 1,000 streams
            // ask for 32 GiB at stream_dirty each): the largest cap it has
            // is the administrator's own.
            write_knob(&self.knob(bdi, "max_ratio_fine"), &original.max_ratio_fine)?;
        }
        write_knob(&self.knob(bdi, "strict_limit"), "1")
    }
}

impl Knobs for Sysfs {
    type Values = Values;
    /// Both values, as the knobs read after the agent's write.
    type Mark = Values;

    fn read(&self, bdi: &str) -> Result<Values> {
        let r = |n: &str| -> Result<String> {
            let p = self.knob(bdi, n);
            Ok(fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_owned())
        };
        Ok(Values { max_ratio_fine: r("max_ratio_fine")?, strict_limit: r("strict_limit")? })
    }

    fn write(&self, bdi: &str, v: &Values) -> Result<()> {
        // The ceiling first: the strict limit alone against a lowered
        // ceiling would throttle the device's writers below what the
        // administrator set.  strict_limit goes back even if the ceiling
        // could not: left set, it throttles the device at the cap.
        let ceiling = write_knob(&self.knob(bdi, "max_ratio_fine"), &v.max_ratio_fine);
        write_knob(&self.knob(bdi, "strict_limit"), &v.strict_limit)?;
        ceiling
    }

    fn mark(v: &Values) -> Values {
        v.clone()
    }

    /// `bdi`, the original max_ratio_fine and strict_limit, then what the
    /// agent left (`*\t*` while writing), tab-separated.
    fn line(bdi: &str, e: &Entry<Self>) -> String {
        let o = &e.original;
        let (w_ratio, w_strict) = e.ours.as_ref().map_or(("*", "*"), |w| (&w.max_ratio_fine, &w.strict_limit));
        format!("{bdi}\t{}\t{}\t{w_ratio}\t{w_strict}", o.max_ratio_fine, o.strict_limit)
    }

    fn parse(text: &str, journal: &Path) -> Vec<(String, Entry<Self>)> {
        let mut entries = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let [bdi, o_ratio, o_strict, w_ratio, w_strict] = f[..] else {
                tracing::warn!(line = ?line, journal = %journal.display(), "ignoring a malformed journal line");
                continue;
            };
            // Only root writes the journal, but --restore runs as root
            // outside the unit's sandbox (the package's prerm): it writes
            // numbers, to a bdi's own knobs, nothing else.
            let number = |v: &str| v.parse::<u64>().is_ok();
            let written = |v: &str| v == "*" || number(v);
            if !bdi_name(bdi) || !number(o_ratio) || !number(o_strict) || !written(w_ratio) || !written(w_strict) {
                tracing::warn!(line = ?line, journal = %journal.display(), "ignoring a journal line that names no bdi's values");
                continue;
            }
            let v = |r: &str, s: &str| Values { max_ratio_fine: r.into(), strict_limit: s.into() };
            let ours = (w_ratio, w_strict) != ("*", "*");
            let e = Entry { original: v(o_ratio, o_strict), ours: ours.then(|| v(w_ratio, w_strict)) };
            entries.push((bdi.to_owned(), e));
        }
        entries
    }

    /// Without a journal, restoring still beats leaving them.
    fn unjournaled(bdi: &str, err: anyhow::Error) -> Result<()> {
        tracing::warn!(bdi, error = %format!("{err:#}"), "restoring bdi limits without a journal");
        Ok(())
    }
}

/// The per-device lever's bdis: those it paces (journaled), and those it
/// stepped aside for.
pub(super) struct Bdi {
    pub(super) journal: Journal<Sysfs>,
    /// Devices whose knobs someone else changed while we paced them.
    hands_off: HashSet<String>,
    /// Devices a previous run had journaled, found at start.
    recovered: usize,
    /// Inside recover(): stepping aside is not for the whole run.
    recovering: bool,
    /// Journaled bdis whose restore failed (`release`), tried again.
    failing: HashSet<String>,
    /// When `retry` last tried them.
    retried: Option<std::time::Instant>,
}

/// How often a restore that failed is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Bdi {
    /// The lever on the bdis under `root`, after putting back what a
    /// previous run left journaled in `journal`.
    pub(super) fn new(root: PathBuf, journal: PathBuf) -> Self {
        let mut me = Self {
            journal: Journal::new(Sysfs { root }, journal),
            hands_off: HashSet::new(),
            recovered: 0,
            recovering: false,
            failing: HashSet::new(),
            retried: None,
        };
        me.recover();
        me
    }

    pub(super) fn has_knobs(&self, bdi: &str) -> bool {
        self.journal.knobs.has_knobs(bdi)
    }

    pub(super) fn recovered(&self) -> usize {
        self.recovered
    }

    pub(super) fn stepped_aside(&self, bdi: &str) -> bool {
        self.hands_off.contains(bdi)
    }

    pub(super) fn is_paced(&self, bdi: &str) -> bool {
        self.journal.contains(bdi)
    }

    /// The devices it paces.
    pub(super) fn paced(&self) -> Vec<String> {
        self.journal.keys()
    }

    /// Caps `bdi` at `budget` dirty bytes, strictly, and never above the
    /// administrator's own cap of the system's dirty `threshold`.  Returns
    /// false if the agent stepped aside for this device.
    pub(super) fn pace(&mut self, bdi: &str, budget: u64, threshold: impl FnOnce() -> Option<u64>) -> Result<bool> {
        if self.hands_off.contains(bdi) {
            return Ok(false);
        }
        // Paced again: its restore is for when this pacing ends.
        self.failing.remove(bdi);
        let now = self.journal.knobs.read(bdi)?;
        let first = !self.journal.contains(bdi);
        let original = match self.journal.get(bdi) {
            Some(e) if !e.holds_ours(&now) => {
                self.step_aside(bdi, &now);
                return Ok(false);
            }
            Some(e) => e.original.clone(),
            None => now,
        };
        let budget = capped(budget, &original.max_ratio_fine, threshold());
        let (_, done) = self.journal.set(bdi, &original, |sysfs| sysfs.write_cap(bdi, budget, &original))?;
        done?;
        if first {
            tracing::info!(bdi, budget, "pacing on: bdi strict_limit with max_bytes");
        }
        Ok(true)
    }

    /// Puts the administrator's values back on `bdi`.  Where that fails
    /// and the bdi is still there, its entry stays journaled and `retry`
    /// tries again: dropped, its strict_limit and max_bytes stayed set and
    /// the next start took them for the administrator's.
    pub(super) fn release(&mut self, bdi: &str) {
        // Tried again by `retry`, at its pace, not at every device tick.
        if !self.failing.contains(bdi) {
            self.restore(bdi);
        }
    }

    fn restore(&mut self, bdi: &str) {
        if !self.journal.contains(bdi) {
            return;
        }
        let failed = match self.journal.restore(bdi) {
            Restore::Done => {
                tracing::info!(bdi, "pacing off: bdi limits restored");
                None
            }
            // A restore tried again finds the knobs changed: by hand, or a
            // new device on the number.  Neither is to be restored onto,
            // and neither makes this device's lever step aside.
            Restore::Changed(now) if self.failing.remove(bdi) => {
                tracing::warn!(
                    bdi, max_ratio_fine = %now.max_ratio_fine, strict_limit = %now.strict_limit,
                    "bdi limits changed since a restore failed: leaving them as they are"
                );
                let _ = self.journal.forget(bdi);
                return;
            }
            Restore::Changed(now) => {
                self.step_aside(bdi, &now);
                return;
            }
            // No such bdi any more: a device number used again later
            // starts from a new device's knobs.
            Restore::Unreadable(err) if !self.journal.knobs.exists(bdi) => {
                tracing::warn!(bdi, error = %format!("{err:#}"), "bdi gone before its limits were restored");
                None
            }
            Restore::Unreadable(err) | Restore::Failed(err) => Some(err),
        };
        match failed {
            None => {
                self.failing.remove(bdi);
                let _ = self.journal.forget(bdi);
            }
            Some(err) => {
                if self.failing.insert(bdi.to_owned()) {
                    tracing::warn!(
                        bdi,
                        error = %format!("{err:#}"),
                        "could not restore bdi limits: kept in the journal, tried again every second"
                    );
                }
            }
        }
    }

    /// Tries again, once a second, each restore that failed (`release`).
    pub(super) fn retry(&mut self) {
        let now = std::time::Instant::now();
        if self.failing.is_empty() || self.retried.is_some_and(|t| now.duration_since(t) < RETRY) {
            return;
        }
        self.retried = Some(now);
        for bdi in self.failing.clone() {
            self.restore(&bdi);
        }
    }

    fn step_aside(&mut self, bdi: &str, now: &Values) {
        // At start-up (recover) the device may be paced again later, from
        // the values it has now; while running it is not.
        let then = if self.recovering { "" } else { "not pacing this device any more, and " };
        tracing::warn!(
            bdi, max_ratio_fine = %now.max_ratio_fine, strict_limit = %now.strict_limit,
            "bdi limits changed by someone else: {then}leaving them as they are"
        );
        self.hands_off.insert(bdi.to_owned());
        let _ = self.journal.forget(bdi);
    }

    /// Restores what a previous run journaled, where the knobs still hold
    /// what that run wrote.
    fn recover(&mut self) {
        if !self.journal.load() {
            return;
        }
        let bdis = self.journal.keys();
        self.recovered = bdis.len();
        self.recovering = true;
        for bdi in bdis {
            tracing::info!(bdi, "restoring bdi limits left set by a previous run");
            self.release(&bdi);
        }
        self.recovering = false;
        // A device changed by hand since is the administrator's again: this
        // run may pace it, journaling its values as they are now (a stale
        // entry for a loop device number used again must not keep it
        // unpaced either).
        self.hands_off.clear();
        // What could not be restored stays journaled for the next try.
        self.journal.end_recovery();
    }
}

/// `budget`, never above the cap the administrator's ratio
/// (`max_ratio_fine`, parts per million) gives the device of the system's
/// dirty `limit`, where both are known.  A FUSE bdi's is 1 % of the
/// system's limit: with a few streams a budget is more, and pacing raised
/// it.
pub(super) fn capped(budget: u64, max_ratio_fine: &str, limit: Option<u64>) -> u64 {
    match (max_ratio_fine.parse::<u64>(), limit) {
        (Ok(ppm), Some(limit)) if ppm < 1_000_000 => budget.min((limit as u128 * ppm as u128 / 1_000_000) as u64),
        _ => budget,
    }
}

/// A bdi's name as sysfs has it ("8:16", "btrfs-1"): one plain name, never
/// a path.
fn bdi_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_.".contains(&b))
}
