//! Pacing writers faster than their device.
//!
//! BPF cannot make a writer sleep; the kernel can.  A bdi's `max_bytes`
//! (6.2+) caps the dirty data the device may hold, and `strict_limit` makes
//! balance_dirty_pages() apply that cap even while the system as a whole is
//! far below its limits — the kernel's own IO-less throttle then paces every
//! dirtier of that device to its write bandwidth.  The agent sets them only
//! while streaming writers are active on the device.  Where a kernel has no
//! such knobs (before 6.2), the second lever is the global limit (`global`),
//! chosen by feature, not by version.
//!
//! These are the administrator's settings.  Their values are journaled
//! under /run before every write to a knob and put back when pacing ends,
//! when the daemon stops, and, after a crash, when it starts again (or by
//! `writebehindd --restore`).  A knob that no longer holds what the agent
//! wrote was changed by someone else: the agent steps aside for that device
//! (and neither restores nor touches it).

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

pub mod global;
pub use global::{Global, GlobalLimits};

pub const JOURNAL: &str = "/run/writebehindd/paced-bdis";
pub const SYSFS_BDI: &str = "/sys/class/bdi";

/// The two knobs' values as the kernel reports them.  The ceiling is kept as
/// `max_ratio_fine` (parts per million of the dirty limit): `max_bytes` reads
/// back as a share of a limit that moves with free memory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Values {
    max_ratio_fine: String,
    strict_limit: String,
}

#[derive(Debug, Clone)]
struct Entry {
    original: Values,
    /// What the knobs held after the agent's last write to them.  None
    /// while a write is under way (journaled as `*`): a kill then leaves
    /// them anywhere between the old values and the new, and the new
    /// ceiling is a ratio the kernel computes from max_bytes, unknown
    /// before the write — whatever they read is the agent's doing.  (The
    /// price: a change by hand between such a kill and the next start is
    /// undone; the kill had to land within one write for that.)
    ours: Option<Values>,
}

impl Entry {
    /// Whether knobs reading `now` still hold what the agent left there.
    fn holds_ours(&self, now: &Values) -> bool {
        self.ours.as_ref().is_none_or(|ours| ours == now)
    }
}

/// Which lever paces a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lever {
    /// The bdi's own knobs where the kernel has them, else the global limit.
    Auto,
    /// The bdi's strict_limit and max_bytes only.
    Bdi,
    /// The global vm.dirty_bytes only (what kernels before 6.2 get; on a
    /// newer one, to test it).
    Global,
}

impl std::str::FromStr for Lever {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "bdi" => Ok(Self::Bdi),
            "global" => Ok(Self::Global),
            _ => Err(format!("pacing lever {s:?}: auto, bdi or global")),
        }
    }
}

pub struct Pacer {
    choice: Lever,
    global: Global,
    root: PathBuf,
    journal: PathBuf,
    paced: HashMap<String, Entry>,
    /// Devices whose knobs someone else changed while we paced them.
    hands_off: HashSet<String>,
    /// Devices a previous run had journaled, found at start.
    recovered: usize,
    /// Inside recover(): stepping aside is not for the whole run.
    recovering: bool,
    /// The kernel's lack of the knobs was logged.
    unavailable_logged: bool,
}

impl Pacer {
    /// A pacer for the real sysfs, after putting back what a previous run
    /// of the daemon left set (it crashed or was killed); `writebehindd
    /// --restore` is this alone.  One process at a time: the caller holds
    /// the daemon's instance lock.
    pub fn new(choice: Lever) -> Self {
        Self::with_paths(SYSFS_BDI.into(), JOURNAL.into(), Global::new(), choice)
    }

    pub fn with_paths(root: PathBuf, journal: PathBuf, global: Global, choice: Lever) -> Self {
        let mut me = Self {
            choice,
            global,
            root,
            journal,
            paced: HashMap::new(),
            hands_off: HashSet::new(),
            recovered: 0,
            recovering: false,
            unavailable_logged: false,
        };
        me.recover();
        me
    }

    /// The lever for this device, if any: the bdi's own knobs where it has
    /// them (a bdi keeps them), else the global limit.
    pub fn lever(&self, bdi: &str) -> Option<Lever> {
        let knobs = self.knob(bdi, "max_bytes").exists() && self.knob(bdi, "strict_limit").exists();
        match self.choice {
            Lever::Auto | Lever::Bdi if knobs => Some(Lever::Bdi),
            Lever::Auto | Lever::Global if self.global.available() => Some(Lever::Global),
            _ => None,
        }
    }

    /// How many seconds of the device's bandwidth its budget should be, for
    /// a policy that asks for `dirty_seconds`: the global lever needs more
    /// on a fast device (global::MIN_DIRTY_SECONDS).
    pub fn dirty_seconds(&self, bdi: &str, dirty_seconds: f64) -> f64 {
        match self.lever(bdi) {
            Some(Lever::Global) => dirty_seconds.max(global::MIN_DIRTY_SECONDS),
            _ => dirty_seconds,
        }
    }

    /// Whether the device can be paced at all.
    pub fn available(&self, bdi: &str) -> bool {
        self.lever(bdi).is_some()
    }

    /// How many sets of values a previous run had left journaled (restored
    /// at start unless changed by hand since): each bdi, and the global
    /// limits.
    pub fn recovered(&self) -> usize {
        self.recovered + self.global.recovered() as usize
    }

    /// Someone else changed the device's knobs: it is not paced again.
    pub fn stepped_aside(&self, bdi: &str) -> bool {
        self.hands_off.contains(bdi) || (self.global.stepped_aside() && self.lever(bdi).is_none())
    }

    pub fn is_paced(&self, bdi: &str) -> bool {
        self.paced.contains_key(bdi) || self.global.is_paced(bdi)
    }

    /// How a paced device is paced ("bdi" or "global"), for status.
    pub fn lever_of(&self, bdi: &str) -> &'static str {
        if self.paced.contains_key(bdi) {
            "bdi"
        } else if self.global.is_paced(bdi) {
            "global"
        } else {
            ""
        }
    }

    /// The global limits in force, while the agent's are.
    pub fn global_status(&self) -> Option<GlobalLimits> {
        self.global.status()
    }

    /// Every device tick: the global limit steps down towards the budgets.
    pub fn tick(&mut self) {
        self.global.tick();
    }

    /// Caps `bdi` at `budget` dirty bytes, strictly.  Returns false if the
    /// agent stepped aside for this device.
    pub fn pace(&mut self, bdi: &str, budget: u64) -> Result<bool> {
        match self.lever(bdi) {
            Some(Lever::Bdi) => {}
            Some(_) => return self.global.pace(bdi, budget),
            None => {
                if !std::mem::replace(&mut self.unavailable_logged, true) {
                    tracing::warn!(
                        bdi,
                        "no per-device strict_limit/max_bytes and no global dirty limits to use: devices are not paced"
                    );
                }
                return Ok(false);
            }
        }
        if self.hands_off.contains(bdi) {
            return Ok(false);
        }
        let now = self.read(bdi)?;
        let first = !self.paced.contains_key(bdi);
        let original = match self.paced.get(bdi) {
            Some(e) if !e.holds_ours(&now) => {
                self.step_aside(bdi, &now);
                return Ok(false);
            }
            Some(e) => e.original.clone(),
            None => now,
        };
        // Never above the cap the administrator's ratio gave the device (a
        // FUSE bdi's is 1 % of the system's limit): with a few streams a
        // budget is more, and pacing raised it.
        let budget = match (original.max_ratio_fine.parse::<u64>(), self.global.kernel_threshold()) {
            (Ok(ppm), Some(limit)) if ppm < 1_000_000 => budget.min((limit as u128 * ppm as u128 / 1_000_000) as u64),
            _ => budget,
        };
        // Journal first, before every write and not only the first one: a
        // kill between a re-pace's writes must not lose the administrator's
        // values either.
        self.journal_writing(bdi, &original)?;
        let wrote = self.write_cap(bdi, budget, &original);
        // Succeeded or not, what the knobs hold now is the agent's doing:
        // release compares against it (keeping the entry of an earlier
        // value here made a refused re-pace look like the administrator's
        // hand, and strict_limit stayed set).
        let ours = self.read(bdi)?;
        self.paced.insert(bdi.to_owned(), Entry { original, ours: Some(ours) });
        self.save_journal()?;
        wrote?;
        if first {
            tracing::info!(bdi, budget, "pacing on: bdi strict_limit with max_bytes");
        }
        Ok(true)
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

    /// Journals that the agent is about to write `bdi`'s knobs.  If that
    /// fails nothing changed, and the caller must not write.
    fn journal_writing(&mut self, bdi: &str, original: &Values) -> Result<()> {
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

    /// `bdi` stopped answering with `held` bytes dirty or under writeback.
    /// Under the global lever it gives up its budget (`Global::stall`); its
    /// own knobs hold its pages to itself, and stay as they are.
    pub fn stall(&mut self, bdi: &str, held: u64) {
        self.global.stall(bdi, held);
    }

    /// Whether `bdi` gave up its budget (`stall`): to be paced again once
    /// it answers.
    pub fn is_stalled(&self, bdi: &str) -> bool {
        self.global.is_stalled(bdi)
    }

    /// Puts the administrator's values back on `bdi`.
    pub fn release(&mut self, bdi: &str) {
        self.global.release(bdi);
        let Some(e) = self.paced.get(bdi).cloned() else {
            return;
        };
        match self.read(bdi) {
            Ok(now) if e.holds_ours(&now) => {
                // Restoring is two writes too: killed between them, the
                // knobs hold neither the agent's values nor the original.
                // Without a journal, restoring still beats leaving them.
                if let Err(err) = self.journal_writing(bdi, &e.original) {
                    tracing::warn!(bdi, error = %format!("{err:#}"), "restoring bdi limits without a journal");
                }
                if let Err(err) = self.write(bdi, &e.original) {
                    tracing::warn!(bdi, error = %format!("{err:#}"), "could not restore bdi limits");
                } else {
                    tracing::info!(bdi, "pacing off: bdi limits restored");
                }
            }
            Ok(now) => self.step_aside(bdi, &now),
            Err(err) => {
                tracing::warn!(bdi, error = %format!("{err:#}"), "bdi gone before its limits were restored")
            }
        }
        self.paced.remove(bdi);
        let _ = self.save_journal();
    }

    /// Releases every device (daemon stopping).
    pub fn release_all(&mut self) {
        let bdis: Vec<String> = self.paced.keys().cloned().collect();
        for bdi in bdis {
            self.release(&bdi);
        }
        self.global.release_all();
    }

    fn step_aside(&mut self, bdi: &str, now: &Values) {
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
    fn recover(&mut self) {
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

    fn save_journal(&self) -> Result<()> {
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

    fn knob(&self, bdi: &str, name: &str) -> PathBuf {
        self.root.join(bdi).join(name)
    }

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
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new(Lever::Auto)
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

/// Written aside and renamed into place: a kill leaves the old journal or
/// the new one, never a part.  No fsync: /run is tmpfs, and a power loss
/// takes the knobs' values with it too.
fn write_journal(journal: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = journal.with_extension("tmp");
    crate::sys::private_file(&tmp, fs::OpenOptions::new().write(true).create(true).truncate(true))
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, journal).with_context(|| format!("writing {}", journal.display()))
}

fn write_knob(path: &Path, value: &str) -> Result<()> {
    crate::sys::write_setting(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake bdi directory: writing max_bytes sets max_ratio_fine the way
    /// the kernel does (a share of the dirty limit, here 1e9 bytes).
    pub(crate) struct FakeSysfs {
        dir: PathBuf,
    }

    impl FakeSysfs {
        pub(crate) fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("wb-pacing-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("7:0")).unwrap();
            let me = Self { dir };
            me.set("max_ratio_fine", "1000000");
            me.set("strict_limit", "0");
            me.set("max_bytes", "1000000000");
            me
        }
        /// Another bdi, its knobs as 7:0's were at the start.
        pub(crate) fn add(&self, bdi: &str) {
            fs::create_dir_all(self.dir.join(bdi)).unwrap();
            for k in ["max_ratio_fine", "strict_limit", "max_bytes"] {
                fs::copy(self.dir.join("7:0").join(k), self.dir.join(bdi).join(k)).unwrap();
            }
        }
        fn set(&self, k: &str, v: &str) {
            fs::write(self.dir.join("7:0").join(k), v).unwrap();
        }
        fn get(&self, k: &str) -> String {
            fs::read_to_string(self.dir.join("7:0").join(k)).unwrap().trim().to_owned()
        }
        /// What the kernel would do after a write to max_bytes.
        fn settle(&self) {
            let bytes: u64 = self.get("max_bytes").parse().unwrap();
            self.set("max_ratio_fine", &(bytes / 1000).to_string());
        }
        pub(crate) fn pacer(&self) -> Pacer {
            let global = Global::with_paths(self.dir.join("vm"), self.dir.join("vmstat"), self.dir.join("global"));
            Pacer::with_paths(self.dir.clone(), self.dir.join("journal"), global, Lever::Auto)
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn paces_then_restores() {
        let fs_ = FakeSysfs::new("restore");
        let mut p = fs_.pacer();
        assert!(p.pace("7:0", 100 << 20).unwrap());
        assert_eq!(fs_.get("strict_limit"), "1");
        assert_eq!(fs_.get("max_bytes"), (100u64 << 20).to_string());
        assert!(fs_.dir.join("journal").exists());
        p.release("7:0");
        assert_eq!(fs_.get("strict_limit"), "0");
        assert_eq!(fs_.get("max_ratio_fine"), "1000000");
        assert!(!fs_.dir.join("journal").exists());
    }

    #[test]
    fn a_crashed_run_is_undone_by_the_next() {
        let fs_ = FakeSysfs::new("crash");
        let mut p = fs_.pacer();
        p.pace("7:0", 100 << 20).unwrap();
        std::mem::forget(p); // killed: no release
        assert_eq!(fs_.get("strict_limit"), "1");
        let _p = fs_.pacer();
        assert_eq!(fs_.get("strict_limit"), "0");
        assert_eq!(fs_.get("max_ratio_fine"), "1000000");
    }

    #[test]
    fn killed_mid_write_the_next_run_restores_whatever_the_knobs_read() {
        let fs_ = FakeSysfs::new("midwrite");
        let mut p = fs_.pacer();
        assert!(p.pace("7:0", 100 << 20).unwrap());
        fs_.settle();
        // Killed in a re-pace, after its journal entry and one knob write:
        // the knobs hold neither the first pace's values nor the original.
        let original = p.paced["7:0"].original.clone();
        p.journal_writing("7:0", &original).unwrap();
        fs_.set("max_ratio_fine", "1925");
        std::mem::forget(p);
        let p = fs_.pacer();
        assert_eq!(p.recovered(), 1);
        assert_eq!((fs_.get("max_ratio_fine"), fs_.get("strict_limit")), ("1000000".into(), "0".into()));
        assert!(!fs_.dir.join("journal").exists());
    }

    #[test]
    fn a_stale_entry_does_not_keep_a_device_unpaced() {
        let fs_ = FakeSysfs::new("stale");
        // A killed run's entry for a device whose knobs were put back by
        // other means since (or a loop device number used again).
        fs::write(fs_.dir.join("journal"), "7:0\t1000000\t0\t104857\t1\n").unwrap();
        let mut p = fs_.pacer();
        assert_eq!(fs_.get("strict_limit"), "0");
        assert!(p.pace("7:0", 100 << 20).unwrap(), "this run paces the device");
        p.release("7:0");
        assert_eq!(fs_.get("strict_limit"), "0");
    }

    #[test]
    fn steps_aside_when_the_admin_changed_a_knob() {
        let fs_ = FakeSysfs::new("admin");
        let mut p = fs_.pacer();
        p.pace("7:0", 100 << 20).unwrap();
        fs_.settle();
        // The admin's hand: the daemon must notice, stop, and leave it.
        fs_.set("max_ratio_fine", "500000");
        assert!(!p.pace("7:0", 50 << 20).unwrap());
        assert_eq!(fs_.get("max_ratio_fine"), "500000");
        p.release_all();
        assert_eq!(fs_.get("max_ratio_fine"), "500000");
        assert_eq!(fs_.get("strict_limit"), "1");
        assert!(!fs_.dir.join("journal").exists());
    }

    #[test]
    fn a_refused_budget_caps_at_the_administrators_ratio_and_is_still_restored() {
        let fs_ = FakeSysfs::new("refused");
        let mut p = fs_.pacer();
        assert!(p.pace("7:0", 100 << 20).unwrap());
        assert!(p.pace("7:0", 200 << 20).unwrap());
        // The kernel refusing max_bytes (EINVAL above the dirty limit):
        // here, writing it fails because it is a directory.
        fs::remove_file(fs_.dir.join("7:0/max_bytes")).unwrap();
        fs::create_dir(fs_.dir.join("7:0/max_bytes")).unwrap();
        assert!(p.pace("7:0", 4 << 30).unwrap());
        assert_eq!(fs_.get("max_ratio_fine"), "1000000");
        assert_eq!(fs_.get("strict_limit"), "1");
        p.release("7:0");
        assert_eq!(fs_.get("strict_limit"), "0");
        assert!(!fs_.dir.join("journal").exists());
    }

    /// A FUSE bdi's cap is 1 % of the system's limit (max_ratio_fine
    /// 10000): no budget raises it, whether the kernel takes its max_bytes
    /// or refuses it.
    #[test]
    fn a_budget_never_raises_the_administrators_cap() {
        let fs_ = FakeSysfs::new("cap");
        fs_.set("max_ratio_fine", "10000");
        fs::write(fs_.dir.join("vmstat"), "nr_dirty 0\nnr_writeback 0\nnr_dirty_threshold 244140\n").unwrap();
        let limit = 244140u64 * 4096;
        let mut p = fs_.pacer();
        assert!(p.pace("7:0", 64 << 20).unwrap());
        assert_eq!(fs_.get("max_bytes"), (limit / 100).to_string(), "64 MiB held at 1 % of the limit");
        assert!(p.pace("7:0", 4 << 20).unwrap());
        assert_eq!(fs_.get("max_bytes"), (4u64 << 20).to_string(), "lowering is pacing");
        fs::remove_file(fs_.dir.join("7:0/max_bytes")).unwrap();
        fs::create_dir(fs_.dir.join("7:0/max_bytes")).unwrap();
        assert!(p.pace("7:0", 4 << 30).unwrap());
        assert_eq!(fs_.get("max_ratio_fine"), "10000", "a refused max_bytes falls back to the administrator's cap");
        p.release("7:0");
        assert_eq!(fs_.get("max_ratio_fine"), "10000");
        assert_eq!(fs_.get("strict_limit"), "0");
    }

    #[test]
    fn a_journal_line_naming_no_bdi_writes_nothing() {
        let fs_ = FakeSysfs::new("escape");
        // What a line could make --restore write: a directory outside the
        // bdi root, and a value that is not a number.
        fs::create_dir_all(fs_.dir.join("outside")).unwrap();
        fs::write(fs_.dir.join("outside/strict_limit"), "1").unwrap();
        fs::write(fs_.dir.join("outside/max_ratio_fine"), "1").unwrap();
        let root = fs_.dir.join("root");
        fs::create_dir_all(root.join("7:0")).unwrap();
        let journal = fs_.dir.join("journal");
        for line in ["../outside\t1000000\t0\t1\t1\n", "/tmp\t1000000\t0\t1\t1\n", "7:0\t1000000\t0; reboot\t1\t1\n"] {
            fs::write(&journal, line).unwrap();
            fs::write(root.join("7:0/strict_limit"), "1").unwrap();
            fs::write(root.join("7:0/max_ratio_fine"), "1").unwrap();
            let global = Global::with_paths(fs_.dir.join("vm"), fs_.dir.join("vmstat"), fs_.dir.join("global"));
            let p = Pacer::with_paths(root.clone(), journal.clone(), global, Lever::Auto);
            assert_eq!(p.recovered(), 0, "{line:?}");
            assert_eq!(fs::read_to_string(fs_.dir.join("outside/strict_limit")).unwrap(), "1", "{line:?}");
            assert_eq!(fs::read_to_string(root.join("7:0/strict_limit")).unwrap(), "1", "{line:?}");
        }
    }

    #[test]
    fn a_knob_replaced_by_a_symlink_is_not_written_through() {
        let fs_ = FakeSysfs::new("symlink");
        let mut p = fs_.pacer();
        assert!(p.pace("7:0", 100 << 20).unwrap());
        std::mem::forget(p); // killed: the journal stays
        let outside = fs_.dir.join("outside");
        fs::write(&outside, "1").unwrap();
        let knob = fs_.dir.join("7:0/strict_limit");
        fs::remove_file(&knob).unwrap();
        std::os::unix::fs::symlink(&outside, &knob).unwrap();
        let _p = fs_.pacer();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "1", "restored through a symlink");
    }

    #[test]
    fn strict_limit_is_restored_even_if_the_ceiling_is_not() {
        let fs_ = FakeSysfs::new("ceiling");
        let p = fs_.pacer();
        fs_.set("strict_limit", "1");
        // The ceiling's write fails (here: it became a directory).
        fs::remove_file(fs_.dir.join("7:0/max_ratio_fine")).unwrap();
        fs::create_dir(fs_.dir.join("7:0/max_ratio_fine")).unwrap();
        let original = Values { max_ratio_fine: "1000000".into(), strict_limit: "0".into() };
        assert!(p.write("7:0", &original).is_err(), "the failure is still reported");
        assert_eq!(fs_.get("strict_limit"), "0");
    }

    #[test]
    fn no_knobs_no_pacing() {
        let fs_ = FakeSysfs::new("old");
        fs::remove_file(fs_.dir.join("7:0/max_bytes")).unwrap();
        let mut p = fs_.pacer();
        assert!(!p.pace("7:0", 1 << 20).unwrap());
        assert_eq!(fs_.get("strict_limit"), "0");
    }
}
