//! Every bdi's writeback state, for the metrics: devices the daemon never
//! paced or streamed included.  Read when scraped, off the intake thread,
//! from /sys/class/bdi (the bdis), /sys/kernel/debug/bdi/*/stats (dirty,
//! writeback, written, when debugfs is mounted and visible: the unit's
//! sandbox may hide it) and a block device's /sys/dev/block/*/stat
//! (sectors written).  Nothing under a mount is looked at.

use std::path::Path;

use crate::status::DeviceStatus;

/// Bdis listed at most (each FUSE mount is one, and users make them).
const MAX_BDIS: usize = 1024;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BdiState {
    /// As in /sys/class/bdi ("8:16", "btrfs-1").
    pub bdi: String,
    pub name: String,
    pub dirty: Option<u64>,
    pub writeback: Option<u64>,
    pub written: Option<u64>,
}

/// What debugfs's stats file of a bdi says: (dirty, writeback, written)
/// bytes, from lines such as "BdiWriteback:   120 kB".
pub fn debugfs_stats(text: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some(kb * 1024)
        })
    };
    (field("BdiReclaimable"), field("BdiWriteback"), field("BdiWritten"))
}

/// Sectors written (the 7th field) of /sys/block/*/stat, in bytes.
pub fn block_stat_written(text: &str) -> Option<u64> {
    text.split_whitespace().nth(6)?.parse::<u64>().ok().map(|s| s * 512)
}

/// Every bdi now, named (the daemon's `known` devices by the names it
/// gave them, which know their superblocks).
pub fn read(known: &[DeviceStatus]) -> Vec<BdiState> {
    let Ok(dir) = std::fs::read_dir("/sys/class/bdi") else { return Vec::new() };
    let mut bdis: Vec<String> = dir.flatten().filter_map(|e| e.file_name().into_string().ok()).take(MAX_BDIS).collect();
    bdis.sort();
    let debugfs = Path::new("/sys/kernel/debug/bdi");
    let mounts = crate::sys::mounts();
    bdis.into_iter()
        .map(|bdi| {
            let daemon = known.iter().find(|d| d.bdi == bdi);
            let name = match daemon {
                Some(d) if !d.name.is_empty() => d.name.clone(),
                _ => {
                    let sbs = crate::names::superblocks_of(&bdi);
                    crate::names::name(&bdi, crate::names::kernel_name(&bdi).as_deref(), &sbs, &mounts)
                }
            };
            let (mut dirty, writeback, mut written) = match std::fs::read_to_string(debugfs.join(&bdi).join("stats")) {
                Ok(text) => debugfs_stats(&text),
                Err(_) => (None, None, None),
            };
            if dirty.is_none() {
                dirty = daemon.map(|d| d.dirty);
            }
            if written.is_none() && bdi.contains(':') {
                written = std::fs::read_to_string(format!("/sys/dev/block/{bdi}/stat"))
                    .ok()
                    .and_then(|t| block_stat_written(&t));
            }
            BdiState { bdi, name, dirty, writeback, written }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debugfs_stats_are_read_in_bytes() {
        let text = "BdiWriteback:              120 kB\nBdiReclaimable:            4096 kB\nBdiDirtyThresh:  0 kB\n\
                    DirtyThresh:            1228800 kB\nBdiDirtied:            3145728 kB\nBdiWritten:            \
                    3141632 kB\nBdiWriteBandwidth:       102400 kBps\nb_dirty:                     1\n";
        assert_eq!(debugfs_stats(text), (Some(4096 * 1024), Some(120 * 1024), Some(3141632 * 1024)));
        assert_eq!(debugfs_stats("garbage"), (None, None, None));
    }

    #[test]
    fn a_block_devices_stat_gives_bytes_written() {
        let stat = "    4207        0   250312     1394    51234     8817  7864320    99120        0    41040   100514";
        assert_eq!(block_stat_written(stat), Some(7864320 * 512));
        assert_eq!(block_stat_written("1 2 3"), None);
    }

    #[test]
    fn every_bdi_is_listed_with_a_name() {
        let all = read(&[]);
        if std::path::Path::new("/sys/class/bdi").exists() {
            assert!(!all.is_empty());
        }
        assert!(all.iter().all(|b| !b.name.is_empty()), "{all:?}");
    }
}
