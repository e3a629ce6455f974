//! The global lever's tests, on FakeVm: a fake /proc/sys/vm and /proc/vmstat.

use std::fs;

use super::*;

/// A fake /proc/sys/vm and /proc/vmstat.
struct FakeVm {
    dir: PathBuf,
}

impl FakeVm {
    fn new(name: &str, dirty_bytes: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("wb-global-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("vm")).unwrap();
        let me = Self { dir };
        let ratio = if dirty_bytes == 0 { 20 } else { 0 };
        for (k, v) in [("dirty_bytes", dirty_bytes), ("dirty_ratio", ratio)] {
            me.set(k, v);
        }
        me.set("dirty_background_bytes", 0);
        me.set("dirty_background_ratio", 10);
        me.dirty(0);
        me
    }
    fn set(&self, k: &str, v: u64) {
        fs::write(self.dir.join("vm").join(k), v.to_string()).unwrap();
    }
    fn get(&self, k: &str) -> u64 {
        fs::read_to_string(self.dir.join("vm").join(k)).unwrap().trim().parse().unwrap()
    }
    /// The system's dirty + writeback level.
    fn dirty(&self, bytes: u64) {
        let pages = bytes / 4096;
        fs::write(self.dir.join("vmstat"), format!("nr_free_pages 1\nnr_dirty {pages}\nnr_writeback 0\n")).unwrap();
    }
    /// The dirty level and the kernel's threshold, as vmstat reports it.
    fn dirty_below(&self, bytes: u64, threshold: u64) {
        let (pages, limit) = (bytes / 4096, threshold / 4096);
        let text = format!("nr_dirty {pages}\nnr_writeback 0\nnr_dirty_threshold {limit}\n");
        fs::write(self.dir.join("vmstat"), text).unwrap();
    }
    fn journal(&self) -> PathBuf {
        self.dir.join("journal")
    }
    fn global(&self) -> Global {
        Global::with_paths(self.dir.join("vm"), self.dir.join("vmstat"), self.journal())
    }
}

impl Drop for FakeVm {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn paces_within_the_budgets_and_restores_ratio_mode() {
    let vm = FakeVm::new("ratio", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    assert_eq!((vm.get("dirty_bytes"), vm.get("dirty_background_bytes")), (8 * MIB, 4 * MIB));
    assert!(g.pace("8:32", 12 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 20 * MIB, "two devices: the sum of their budgets");
    assert!(vm.journal().exists());
    g.release("8:16");
    assert_eq!(vm.get("dirty_bytes"), 12 * MIB);
    g.release("8:32");
    assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (20, 10), "ratio mode back");
    assert!(!vm.journal().exists());
    assert!(g.status().is_none());
}

#[test]
fn a_stalled_device_gives_up_its_budget_and_its_pages_are_added() {
    let vm = FakeVm::new("stall", 0);
    let mut g = vm.global();
    assert!(g.pace("0:50", 16 * MIB).unwrap());
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 24 * MIB);
    // The mount holds 40 MiB that cannot drain: the disk keeps its 8
    // MiB of room above them.
    g.stall("0:50", 40 * MIB);
    assert_eq!(vm.get("dirty_bytes"), 48 * MIB);
    assert!(g.is_paced("0:50"), "released only when it is");
    // What it holds grows: the next tick applies it.
    g.stall("0:50", 48 * MIB);
    g.tick();
    assert_eq!(vm.get("dirty_bytes"), 56 * MIB);
    // The disk done, the mount alone: the administrator's values.
    g.release("8:16");
    assert_eq!(vm.get("dirty_ratio"), 20);
    assert!(g.status().is_none());
    // It answers again: paced on its budget.
    assert!(g.pace("0:50", 16 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 16 * MIB);
    g.release("0:50");
    assert_eq!(vm.get("dirty_ratio"), 20);
    assert!(!g.is_paced("0:50"));
}

#[test]
fn bytes_mode_is_restored_as_bytes() {
    let vm = FakeVm::new("bytes", 48 * MIB);
    vm.set("dirty_background_bytes", 16 * MIB);
    vm.set("dirty_background_ratio", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 8 * MIB);
    g.release_all();
    assert_eq!((vm.get("dirty_bytes"), vm.get("dirty_background_bytes")), (48 * MIB, 16 * MIB));
}

#[test]
fn an_administrators_lower_limit_is_left_alone() {
    let vm = FakeVm::new("lower", 4 * MIB);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 4 * MIB);
    assert!(!vm.journal().exists(), "nothing written, nothing journaled");
}

#[test]
fn steps_down_from_the_dirty_level_never_below_it() {
    let vm = FakeVm::new("steps", 0);
    vm.dirty(1024 * MIB);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    let first = vm.get("dirty_bytes");
    assert!(first > 1024 * MIB && first < 1200 * MIB, "just above the dirty level: {first}");
    // Nothing drained: the limit stays.
    g.tick();
    assert_eq!(vm.get("dirty_bytes"), first);
    vm.dirty(512 * MIB);
    g.tick();
    let second = vm.get("dirty_bytes");
    assert!(second > 512 * MIB && second < 600 * MIB, "follows the dirty level down: {second}");
    // The level rising again (another writer) does not raise it.
    vm.dirty(900 * MIB);
    g.tick();
    assert_eq!(vm.get("dirty_bytes"), second);
    vm.dirty(0);
    g.tick();
    assert_eq!(vm.get("dirty_bytes"), 8 * MIB, "down to the budget once drained");
}

#[test]
fn a_killed_run_is_undone_by_the_next_from_either_mode() {
    for (name, bytes) in [("kill-ratio", 0), ("kill-bytes", 64 * MIB)] {
        let vm = FakeVm::new(name, bytes);
        let mut g = vm.global();
        assert!(g.pace("8:16", 8 * MIB).unwrap());
        std::mem::forget(g);
        assert_eq!(vm.get("dirty_bytes"), 8 * MIB);
        let g = vm.global();
        assert!(g.recovered());
        if bytes == 0 {
            assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (20, 10));
        } else {
            assert_eq!(vm.get("dirty_bytes"), bytes);
        }
        assert!(!vm.journal().exists());
    }
}

#[test]
fn killed_mid_write_the_next_run_restores() {
    let vm = FakeVm::new("midwrite", 0);
    fs::write(vm.journal(), "0\t20\t0\t10\t*\t*\n").unwrap();
    vm.set("dirty_background_bytes", 3 * MIB);
    let _g = vm.global();
    assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (20, 10));
}

#[test]
fn steps_aside_when_the_administrator_changes_a_limit() {
    let vm = FakeVm::new("admin", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    vm.set("dirty_bytes", 100 * MIB);
    vm.dirty(50 * MIB);
    g.tick();
    assert_eq!(vm.get("dirty_bytes"), 100 * MIB);
    assert!(!g.pace("8:16", 8 * MIB).unwrap(), "not used again in this run");
    g.release_all();
    assert_eq!(vm.get("dirty_bytes"), 100 * MIB, "not restored over the administrator");
    assert!(!vm.journal().exists());
}

#[test]
fn no_limit_is_written_above_the_kernels_threshold() {
    let vm = FakeVm::new("ceiling", 0);
    vm.dirty_below(0, 40 * MIB);
    let mut g = vm.global();
    assert!(g.pace("0:50", 64 * MIB).unwrap());
    assert_eq!(vm.get("dirty_ratio"), 20, "a budget above the threshold lowers nothing");
    assert!(!vm.journal().exists());
    g.release("0:50");
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 8 * MIB);
    assert!(g.pace("0:50", 64 * MIB).unwrap());
    assert_eq!(vm.get("dirty_bytes"), 40 * MIB, "the sum, 72 MiB, held at the threshold");
    g.release("0:50");
    assert_eq!(vm.get("dirty_bytes"), 8 * MIB);
    g.release_all();
    assert_eq!(vm.get("dirty_ratio"), 20);
}

#[test]
fn a_journal_of_an_administrators_ratio_of_zero_is_restored() {
    let vm = FakeVm::new("zero", 8 * MIB);
    vm.set("dirty_background_bytes", 4 * MIB);
    vm.set("dirty_background_ratio", 0);
    fs::write(vm.journal(), format!("0\t0\t0\t10\t{}\t{}\n", 8 * MIB, 4 * MIB)).unwrap();
    let g = vm.global();
    assert!(g.recovered());
    assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (0, 10));
    assert!(!vm.journal().exists());
}

/// Ticks at once and once what it read has settled (UNDO_SETTLE).
fn settle(g: &mut Global) {
    let t = std::time::Instant::now();
    g.tick_at(t);
    g.tick_at(t + UNDO_SETTLE);
}

#[test]
fn limits_a_tool_writes_back_are_undone() {
    let vm = FakeVm::new("tool", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    // What `sysctl -a` saw while the lever held.
    let saved = [("dirty_bytes", 8 * MIB), ("dirty_ratio", 0), ("dirty_background_bytes", 4 * MIB)];
    g.release_all();
    vm.set("dirty_bytes", 0);
    vm.set("dirty_background_bytes", 0);
    assert_eq!(vm.get("dirty_ratio"), 20);
    for (k, v) in saved {
        vm.set(k, v);
    }
    vm.set("dirty_background_ratio", 0);
    settle(&mut g);
    assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (20, 10), "the saved bytes undone");
    // Only the ratio written back: a threshold of 0.
    vm.set("dirty_bytes", 0);
    vm.set("dirty_ratio", 0);
    settle(&mut g);
    assert_eq!(vm.get("dirty_ratio"), 20, "a threshold of 0 undone");
    // The administrator's own values since are theirs.
    vm.set("dirty_ratio", 30);
    settle(&mut g);
    assert_eq!(vm.get("dirty_ratio"), 30);
    // Theirs too where one equals a value the agent once wrote: 8 MiB
    // of dirty_bytes, the background ratio as it was.
    vm.set("dirty_bytes", 8 * MIB);
    vm.set("dirty_ratio", 0);
    settle(&mut g);
    assert_eq!((vm.get("dirty_bytes"), vm.get("dirty_ratio")), (8 * MIB, 0), "the administrator's sysctl undone");
}

/// `sysctl -w` of each value in turn, the agent looking in between: the
/// background ratio written back zeroes the background bytes (a threshold
/// of 0) a moment before dirty_bytes is written.  What the tool leaves is
/// undone whole, not the step on the way.
#[test]
fn limits_a_tool_is_still_writing_back_are_judged_once_settled() {
    let vm = FakeVm::new("tool-midway", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    g.release_all();
    vm.set("dirty_bytes", 0);
    vm.set("dirty_background_bytes", 0);
    let t = std::time::Instant::now();
    vm.set("dirty_background_bytes", 4 * MIB);
    vm.set("dirty_background_ratio", 0);
    g.tick_at(t);
    g.tick_at(t + UNDO_SETTLE / 5);
    assert_eq!(vm.get("dirty_background_ratio"), 0, "a step on the way: nothing done yet");
    vm.set("dirty_bytes", 8 * MIB);
    vm.set("dirty_ratio", 0);
    g.tick_at(t + UNDO_SETTLE / 2);
    g.tick_at(t + UNDO_SETTLE * 3 / 2);
    assert_eq!((vm.get("dirty_ratio"), vm.get("dirty_background_ratio")), (20, 10), "what the tool left, undone whole");
}

#[test]
fn a_malformed_journal_writes_nothing() {
    for line in ["../../etc\t20\t0\t10\t1\t1\n", "0\t20\t0\t10\n", "0\t101\t0\t10\t1\t1\n", "1 ; rm\t20\t0\t10\t*\t*\n"]
    {
        let vm = FakeVm::new("malformed", 0);
        vm.set("dirty_bytes", 5 * MIB);
        fs::write(vm.journal(), line).unwrap();
        let g = vm.global();
        assert!(!g.recovered(), "{line:?}");
        assert_eq!(vm.get("dirty_bytes"), 5 * MIB, "{line:?}");
        assert!(!vm.journal().exists());
    }
}

#[test]
fn the_journal_keeps_its_line_format() {
    let vm = FakeVm::new("format", 0);
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).unwrap());
    // What an older daemon wrote and a newer one restores: the four
    // original values, then the dirty_bytes and dirty_background_bytes the
    // agent left.
    let journal = fs::read_to_string(vm.journal()).unwrap();
    assert_eq!(journal, format!("0\t20\t0\t10\t{}\t{}\n", 8 * MIB, 4 * MIB));
    g.release_all();
}

#[test]
fn a_journal_that_cannot_be_written_writes_no_limit() {
    let vm = FakeVm::new("nojournal", 0);
    fs::create_dir(vm.journal().with_extension("tmp")).unwrap();
    let mut g = vm.global();
    assert!(g.pace("8:16", 8 * MIB).is_err());
    assert_eq!((vm.get("dirty_bytes"), vm.get("dirty_ratio")), (0, 20));
    assert!(g.status().is_none());
    g.release_all();
    assert_eq!((vm.get("dirty_bytes"), vm.get("dirty_ratio")), (0, 20));
}
