//! The per-device lever's tests, and FakeSysfs, the fake bdi directory the
//! devices' tests use too.

use std::fs;

use super::{bdi::Values, journal::Knobs, *};

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
    pub(crate) fn get(&self, k: &str) -> String {
        fs::read_to_string(self.dir.join("7:0").join(k)).unwrap().trim().to_owned()
    }
    /// Whether the journal of paced bdis exists (nothing was ever paced
    /// if not).
    pub(crate) fn journaled(&self) -> bool {
        self.dir.join("journal").exists()
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
    let original = p.bdi.journal.get("7:0").unwrap().original.clone();
    p.bdi.journal.writing("7:0", &original).unwrap();
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
    assert!(p.bdi.journal.knobs.write("7:0", &original).is_err(), "the failure is still reported");
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

#[test]
fn the_journal_keeps_its_line_format() {
    let fs_ = FakeSysfs::new("format");
    let mut p = fs_.pacer();
    assert!(p.pace("7:0", 100 << 20).unwrap());
    // What an older daemon wrote and a newer one restores: bdi, the
    // original max_ratio_fine and strict_limit, then what the agent left.
    let journal = fs::read_to_string(fs_.dir.join("journal")).unwrap();
    assert_eq!(journal, "7:0\t1000000\t0\t1000000\t1\n");
    p.release("7:0");
}

#[test]
fn a_journal_that_cannot_be_written_writes_no_knob() {
    let fs_ = FakeSysfs::new("nojournal");
    fs::create_dir(fs_.dir.join("journal.tmp")).unwrap();
    let mut p = fs_.pacer();
    assert!(p.pace("7:0", 100 << 20).is_err());
    assert_eq!((fs_.get("strict_limit"), fs_.get("max_bytes")), ("0".into(), "1000000000".into()));
    assert!(!p.is_paced("7:0"));
}

#[test]
fn a_budget_is_capped_at_the_administrators_share_of_the_limit() {
    use super::bdi::capped;
    assert_eq!(capped(64 << 20, "10000", Some(1_000_000_000)), 10_000_000, "1 % of the limit");
    assert_eq!(capped(4 << 20, "10000", Some(1_000_000_000)), 4 << 20);
    assert_eq!(capped(64 << 20, "1000000", Some(1_000_000)), 64 << 20, "a ratio of 100 % caps nothing");
    assert_eq!(capped(64 << 20, "10000", None), 64 << 20, "no limit known");
    assert_eq!(capped(64 << 20, "", Some(1_000_000)), 64 << 20, "no ratio known");
}

/// A restore whose write fails (here strict_limit became a symlink, which
/// is never written through, to a file that reads what the agent wrote)
/// stays journaled: tried again while the daemon runs, kept for the next
/// start, and done once the knob can be written.  Dropped, the device's
/// strict_limit stayed set and the next start took it for the
/// administrator's.  A bdi that is gone is forgotten.
#[test]
fn a_restore_that_fails_stays_journaled_and_is_tried_again() {
    let fs_ = FakeSysfs::new("retry");
    fs_.add("7:1");
    let mut p = fs_.pacer();
    assert!(p.pace("7:0", 100 << 20).unwrap());
    assert!(p.pace("7:1", 100 << 20).unwrap());
    let knob = fs_.dir.join("7:0/strict_limit");
    let ours = fs_.dir.join("ours");
    fs::write(&ours, "1").unwrap();
    fs::remove_file(&knob).unwrap();
    std::os::unix::fs::symlink(&ours, &knob).unwrap();
    fs::remove_dir_all(fs_.dir.join("7:1")).unwrap();
    p.release("7:0");
    p.release("7:1");
    assert!(p.is_paced("7:0"), "a failed restore was forgotten");
    assert!(!p.is_paced("7:1"), "a bdi that is gone was kept");
    drop(p);
    assert!(fs_.journaled(), "the journal went with the failed restore");
    // The next start fails too, and keeps it.
    let mut p = fs_.pacer();
    assert!(fs_.journaled(), "the next start lost the failed restore");
    assert!(p.is_paced("7:0"));
    // Once the knob can be written, the next retry restores it.
    fs::remove_file(&knob).unwrap();
    fs::write(&knob, "1").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    p.tick();
    assert_eq!(fs_.get("strict_limit"), "0");
    assert!(!p.is_paced("7:0"));
    assert!(!fs_.journaled());
    // A failing restore whose knobs someone changes meanwhile is left: not
    // written over at the next try, and the device may be paced again.
    assert!(p.pace("7:0", 100 << 20).unwrap());
    fs::remove_file(&knob).unwrap();
    std::os::unix::fs::symlink(&ours, &knob).unwrap();
    p.release("7:0");
    assert!(p.is_paced("7:0"));
    fs_.set("max_ratio_fine", "500000");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    p.tick();
    assert_eq!(fs_.get("max_ratio_fine"), "500000", "the administrator's change was written over");
    assert!(!p.is_paced("7:0") && !p.stepped_aside("7:0"));
}
