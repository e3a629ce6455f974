//! The journal protocol both levers follow, written once.  The knobs are
//! the administrator's: before every write to them their values are
//! journaled under /run, and after it the knobs are read back; knobs that no
//! longer read what the agent wrote were changed by someone else (the lever
//! steps aside and leaves them); the values go back on release, at exit, and
//! at the next start from the journal a killed run left.  What differs
//! between the levers is their knob set (`Knobs`): its values, how they are
//! read and written, and the journal's line format.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// A set of the administrator's knobs that a lever writes, by key (a bdi's
/// name, or one key for the global limits).
pub(super) trait Knobs: Sized {
    /// What the knobs hold, as the kernel reports them.
    type Values: Clone;
    /// What tells, in what the knobs read, the agent's write from another's.
    type Mark: Clone + PartialEq;

    /// What `key`'s knobs hold now.
    fn read(&self, key: &str) -> Result<Self::Values>;
    /// Puts `values` back on `key`'s knobs.
    fn write(&self, key: &str, values: &Self::Values) -> Result<()>;
    /// The part of what the knobs read that says whose values they are.
    fn mark(values: &Self::Values) -> Self::Mark;
    /// `key`'s journal line, without its newline.
    fn line(key: &str, entry: &Entry<Self>) -> String;
    /// The entries in a journal's text.  What names none of the lever's
    /// values is logged (with the `journal` it came from) and left out:
    /// nothing else is ever written back.
    fn parse(text: &str, journal: &Path) -> Vec<(String, Entry<Self>)>;
    /// The journal could not be written (`err`) before restoring `key`:
    /// Ok to restore without it, or the error that stops the restore.
    fn unjournaled(key: &str, err: anyhow::Error) -> Result<()>;
}

/// One key's journaled values.
pub(super) struct Entry<K: Knobs> {
    /// The administrator's values, while the agent's are in force.
    pub(super) original: K::Values,
    /// What the knobs held after the agent's last write to them.  None
    /// while a write is under way (journaled as `*`): a kill then leaves
    /// them anywhere between the old values and the new, and a bdi's new
    /// ceiling is a ratio the kernel computes from max_bytes, unknown
    /// before the write — whatever they read is the agent's doing.  (The
    /// price: a change by hand between such a kill and the next start is
    /// undone; the kill had to land within one write for that.)
    pub(super) ours: Option<K::Mark>,
}

impl<K: Knobs> Clone for Entry<K> {
    fn clone(&self) -> Self {
        Self { original: self.original.clone(), ours: self.ours.clone() }
    }
}

impl<K: Knobs> Entry<K> {
    /// Whether knobs reading `now` still hold what the agent left there.
    pub(super) fn holds_ours(&self, now: &K::Values) -> bool {
        self.ours.as_ref().is_none_or(|ours| *ours == K::mark(now))
    }
}

/// How a restore went.
pub(super) enum Restore<V> {
    /// The administrator's values are back (or none were journaled).
    Done,
    /// The knobs read `now`, not what the agent wrote: someone else's.
    Changed(V),
    /// The knobs could not be read (a device gone).
    Unreadable(anyhow::Error),
    /// They, or the journal before them, could not be written; the entry
    /// stays, journaled as being written.
    Failed(anyhow::Error),
}

/// A lever's knob set and its journal: for each key the agent wrote, the
/// administrator's values and what the agent left.
pub(super) struct Journal<K: Knobs> {
    pub(super) knobs: K,
    path: PathBuf,
    entries: HashMap<String, Entry<K>>,
    /// The journal in place, held open so that replacing or removing it
    /// does not free it there and then (see `write_journal`).
    held: Option<fs::File>,
}

impl<K: Knobs> Journal<K> {
    /// Nothing journaled yet (`load` reads what a killed run left).
    pub(super) fn new(knobs: K, path: PathBuf) -> Self {
        Self { knobs, path, entries: HashMap::new(), held: None }
    }

    pub(super) fn get(&self, key: &str) -> Option<&Entry<K>> {
        self.entries.get(key)
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    pub(super) fn keys(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// At start: takes in the entries a previous run journaled (it crashed
    /// or was killed), to be restored by the lever.  False if there is no
    /// journal.
    pub(super) fn load(&mut self) -> bool {
        let Ok(text) = fs::read_to_string(&self.path) else {
            return false;
        };
        // Every entry first: each release rewrites the journal with the
        // entries still to do, so a recovery killed midway loses none.
        self.entries.extend(K::parse(&text, &self.path));
        true
    }

    /// The journal `load` read is done with: rewritten with the entries
    /// still to restore (a restore that failed), removed if none.  Removed
    /// whole, a failed restore's values were lost, and the next start took
    /// the agent's for the administrator's.
    pub(super) fn end_recovery(&mut self) {
        if let Err(e) = self.save() {
            tracing::warn!(error = %format!("{e:#}"), journal = %self.path.display(), "could not rewrite the journal");
        }
    }

    /// Writes `key`'s knobs with `write`, `original` journaled as the
    /// values to put back; then reads them back.  Returns what they hold,
    /// and how the write and the journal after it went.  If the journal
    /// before the write fails, nothing was written and that is the error.
    pub(super) fn set(
        &mut self,
        key: &str,
        original: &K::Values,
        write: impl FnOnce(&K) -> Result<()>,
    ) -> Result<(K::Values, Result<()>)> {
        // Journal first, before every write and not only the first one: a
        // kill between a re-pace's writes must not lose the administrator's
        // values either.
        self.writing(key, original)?;
        let wrote = write(&self.knobs);
        // Succeeded or not, what the knobs hold now is the agent's doing:
        // release compares against it (keeping the entry of an earlier
        // value here made a refused re-pace look like the administrator's
        // hand, and strict_limit stayed set).
        let now = self.knobs.read(key)?;
        let ours = Some(K::mark(&now));
        self.entries.insert(key.to_owned(), Entry { original: original.clone(), ours });
        let saved = self.save();
        Ok((now, saved.and(wrote)))
    }

    /// Puts `key`'s original values back, if its knobs still hold what the
    /// agent wrote.  The entry stays: `forget` drops it.
    pub(super) fn restore(&mut self, key: &str) -> Restore<K::Values> {
        let Some(e) = self.entries.get(key).cloned() else {
            return Restore::Done;
        };
        let now = match self.knobs.read(key) {
            Ok(now) => now,
            Err(err) => return Restore::Unreadable(err),
        };
        if !e.holds_ours(&now) {
            return Restore::Changed(now);
        }
        // Restoring is a write too: killed in it, the knobs hold neither
        // the agent's values nor the original.
        if let Err(err) = self.writing(key, &e.original)
            && let Err(err) = K::unjournaled(key, err)
        {
            return Restore::Failed(err);
        }
        match self.knobs.write(key, &e.original) {
            Ok(()) => Restore::Done,
            Err(err) => {
                // What the knobs hold now is the agent's doing, as after
                // `set`: kept as its mark, so that a change by someone
                // else (or a new device on the number) is still told
                // from it at the next try.
                if let Ok(now) = self.knobs.read(key) {
                    self.entries.insert(key.to_owned(), Entry { original: e.original, ours: Some(K::mark(&now)) });
                    let _ = self.save();
                }
                Restore::Failed(err)
            }
        }
    }

    /// Drops `key`'s entry (restored, or someone else's now).
    pub(super) fn forget(&mut self, key: &str) -> Result<()> {
        self.entries.remove(key);
        self.save()
    }

    /// Journals that the agent is about to write `key`'s knobs.  If that
    /// fails nothing changed, and the caller must not write.
    pub(super) fn writing(&mut self, key: &str, original: &K::Values) -> Result<()> {
        let before = self.entries.insert(key.to_owned(), Entry { original: original.clone(), ours: None });
        let saved = self.save();
        if saved.is_err() {
            match before {
                Some(e) => self.entries.insert(key.to_owned(), e),
                None => self.entries.remove(key),
            };
        }
        saved
    }

    fn save(&mut self) -> Result<()> {
        if self.entries.is_empty() {
            let _ = fs::remove_file(&self.path);
            if let Some(f) = self.held.take() {
                crate::sys::close_aside(f);
            }
            return Ok(());
        }
        let mut text = String::new();
        for (key, e) in &self.entries {
            text += &K::line(key, e);
            text.push('\n');
        }
        let file = write_journal(&self.path, &text)?;
        if let Some(old) = self.held.replace(file) {
            crate::sys::close_aside(old);
        }
        Ok(())
    }
}

/// Written aside and renamed into place: a kill leaves the old journal or
/// the new one, never a part.  No fsync: a power loss takes the knobs'
/// values with it too.  Returns the new journal, open: the caller holds it
/// until the next replaces it, and then closes it aside.  Where /run is on
/// a disk (a container's overlay, this project's CI machine: ext4 mounted
/// with discard), the rename that dropped the last reference to the old
/// journal freed it there and then, waiting for its writeback and a
/// discard: 0.3-0.5 s each, 9.4 s of the intake's 12 with 1,000 writers
/// on 32 paced devices, and `wbctl` waited 4-13 s.
fn write_journal(journal: &Path, text: &str) -> Result<fs::File> {
    use std::io::Write;
    let tmp = journal.with_extension("tmp");
    let file = crate::sys::private_file(&tmp, fs::OpenOptions::new().write(true).create(true).truncate(true))
        .and_then(|mut f| f.write_all(text.as_bytes()).map(|()| f))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, journal).with_context(|| format!("writing {}", journal.display()))?;
    Ok(file)
}

/// Writes one knob, never through a symlink (`sys::write_setting`).
pub(super) fn write_knob(path: &Path, value: &str) -> Result<()> {
    crate::sys::write_setting(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}
