//! The per-device lever's knobs: a bdi's strict_limit and max_bytes, read
//! as max_ratio_fine, journaled before every write and put back.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

use super::{
    Pacer,
    journal::{write_journal, write_knob},
};

/// The two knobs' values as the kernel reports them.  The ceiling is kept as
/// `max_ratio_fine` (parts per million of the dirty limit): `max_bytes` reads
/// back as a share of a limit that moves with free memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Values {
    pub(super) max_ratio_fine: String,
    pub(super) strict_limit: String,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) original: Values,
    /// What the knobs held after the agent's last write to them.  None
    /// while a write is under way (journaled as `*`): a kill then leaves
    /// them anywhere between the old values and the new, and the new
    /// ceiling is a ratio the kernel computes from max_bytes, unknown
    /// before the write — whatever they read is the agent's doing.  (The
    /// price: a change by hand between such a kill and the next start is
    /// undone; the kill had to land within one write for that.)
    pub(super) ours: Option<Values>,
}

impl Entry {
    /// Whether knobs reading `now` still hold what the agent left there.
    pub(super) fn holds_ours(&self, now: &Values) -> bool {
        self.ours.as_ref().is_none_or(|ours| ours == now)
    }
}

impl Pacer {
    pub(super) fn write_cap(&self, bdi: &str, budget: u64, original: &Values) -> Result<()> {
        if write_knob(&self.knob(bdi, "max_bytes"), &budget.to_string()).is_err() {
            // The kernel refuses a max_bytes above the system's dirty limit
            // (EINVAL; the limit falls as memory fills, and 1,000 streams
            // ask for 32 GiB at stream_dirty each): the largest cap it has
            // is the administrator's own.
            write_knob(&self.knob(bdi, "max_ratio_fine"), &original.max_ratio_fine)?;
        }
        write_knob(&self.knob(bdi, "strict_limit"), "1")
    }

    /// Journals that the agent is about to write `bdi`'s knobs.  If that
    /// fails nothing changed, and the caller must not write.
    pub(super) fn journal_writing(&mut self, bdi: &str, original: &Values) -> Result<()> {
        let before = self.paced.insert(bdi.to_owned(), Entry { original: original.clone(), ours: None });
        let saved = self.save_journal();
        if saved.is_err() {
            match before {
                Some(e) => self.paced.insert(bdi.to_owned(), e),
                None => self.paced.remove(bdi),
            };
        }
        saved
    }

    pub(super) fn step_aside(&mut self, bdi: &str, now: &Values) {
        // At start-up (recover) the device may be paced again later, from
        // the values it has now; while running it is not.
        let then = if self.recovering { "" } else { "not pacing this device any more, and " };
        tracing::warn!(
            bdi, max_ratio_fine = %now.max_ratio_fine, strict_limit = %now.strict_limit,
            "bdi limits changed by someone else: {then}leaving them as they are"
        );
        self.paced.remove(bdi);
        self.hands_off.insert(bdi.to_owned());
        let _ = self.save_journal();
    }

    /// Restores what a previous run journaled, where the knobs still hold
    /// what that run wrote.
    pub(super) fn recover(&mut self) {
        let Ok(text) = fs::read_to_string(&self.journal) else {
            return;
        };
        // Every entry first: each release rewrites the journal with the
        // entries still to do, so a recovery killed midway loses none.
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let [bdi, o_ratio, o_strict, w_ratio, w_strict] = f[..] else {
                tracing::warn!(line = ?line, journal = %self.journal.display(), "ignoring a malformed journal line");
                continue;
            };
            // Only root writes the journal, but --restore runs as root
            // outside the unit's sandbox (the package's prerm): it writes
            // numbers, to a bdi's own knobs, nothing else.
            let number = |v: &str| v.parse::<u64>().is_ok();
            let written = |v: &str| v == "*" || number(v);
            if !bdi_name(bdi) || !number(o_ratio) || !number(o_strict) || !written(w_ratio) || !written(w_strict) {
                tracing::warn!(line = ?line, journal = %self.journal.display(), "ignoring a journal line that names no bdi's values");
                continue;
            }
            let v = |r: &str, s: &str| Values { max_ratio_fine: r.into(), strict_limit: s.into() };
            let ours = (w_ratio, w_strict) != ("*", "*");
            let e = Entry { original: v(o_ratio, o_strict), ours: ours.then(|| v(w_ratio, w_strict)) };
            self.paced.insert(bdi.to_owned(), e);
        }
        self.recovered = self.paced.len();
        let bdis: Vec<String> = self.paced.keys().cloned().collect();
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
        let _ = fs::remove_file(&self.journal);
    }

    pub(super) fn save_journal(&self) -> Result<()> {
        if self.paced.is_empty() {
            let _ = fs::remove_file(&self.journal);
            return Ok(());
        }
        let mut text = String::new();
        for (bdi, e) in &self.paced {
            let o = &e.original;
            let (w_ratio, w_strict) = e.ours.as_ref().map_or(("*", "*"), |w| (&w.max_ratio_fine, &w.strict_limit));
            text += &format!("{bdi}\t{}\t{}\t{w_ratio}\t{w_strict}\n", o.max_ratio_fine, o.strict_limit);
        }
        write_journal(&self.journal, &text)
    }

    pub(super) fn knob(&self, bdi: &str, name: &str) -> PathBuf {
        self.root.join(bdi).join(name)
    }

    pub(super) fn read(&self, bdi: &str) -> Result<Values> {
        let r = |n: &str| -> Result<String> {
            let p = self.knob(bdi, n);
            Ok(fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_owned())
        };
        Ok(Values { max_ratio_fine: r("max_ratio_fine")?, strict_limit: r("strict_limit")? })
    }

    pub(super) fn write(&self, bdi: &str, v: &Values) -> Result<()> {
        // The ceiling first: the strict limit alone against a lowered
        // ceiling would throttle the device's writers below what the
        // administrator set.  strict_limit goes back even if the ceiling
        // could not: left set, it throttles the device at the cap.
        let ceiling = write_knob(&self.knob(bdi, "max_ratio_fine"), &v.max_ratio_fine);
        write_knob(&self.knob(bdi, "strict_limit"), &v.strict_limit)?;
        ceiling
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
