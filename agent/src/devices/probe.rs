//! What is read of the system once per device or superblock: btrfs's
//! compression grain (from the mount options), the device's maximal request
//! (sysfs), a superblock's dev_t as mountinfo writes it, and a block
//! device's kernel name.

/// btrfs compresses a range in 128 KiB pieces from its start, and a piece
/// that saves less than a block marks the whole file incompressible
/// (compress_file_range).  Its writeback of a compressed file also runs on
/// to the end of the dirty range, up to one extent (128 MiB): a flush right
/// behind a writer ends where the writer is, in a short piece, and one of
/// them soon fails.  Measured (3 GiB tar of /usr, compress=zstd:1, 100 MiB/s):
/// 3 MiB windows made the copy incompressible, 3110 MiB written instead
/// of the default's 1729, 31.2 s instead of 20; the kernel's own strict_limit
/// at 16 MiB does the same.  Spans of whole extents, from a multiple of one,
/// keep every piece whole: 1732 MiB, 17.5 s, at most 461 MiB dirty.
/// `compress-force` never marks a file, so it needs no grain.
const BTRFS_EXTENT: u64 = 128 << 20;

/// The grain of the superblock `sb_dev` ("major:minor", as `mounts` list
/// it): BTRFS_EXTENT where btrfs compresses files as it decides (mounted
/// with `compress`), else 0.
/// Read when the device is first seen: a remount with other options
/// takes effect at the daemon's next start.
pub(super) fn compress_grain(sb_dev: &str, mounts: &[crate::sys::MountInfo]) -> u64 {
    mounts.iter().find(|m| m.dev == sb_dev).map_or(0, |m| grain_for(&m.fstype, &m.options))
}

/// A kernel dev_t as mountinfo writes it ("major:minor").
pub(super) fn sb_dev_name(sb_dev: u32) -> String {
    let dev = crate::abi::kernel_dev_to_user(sb_dev);
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// What tells superblock `sb_dev`'s mount in `mounts` from another one
/// given its number later: its type, source and FUSE server's uid ("" where
/// none lists it, as for a mount in another namespace), and the block
/// device's disk sequence number (diskseq, 5.15+: a new one at each attach
/// of a loop device, whatever the image).  Not its other options: a
/// remount with another `commit=` is the same filesystem.
pub(super) fn mount_of(sb_dev: &str, mounts: &[crate::sys::MountInfo]) -> String {
    let diskseq =
        std::fs::read_to_string(crate::backing::owner::disk_dir(std::path::Path::new("/sys"), sb_dev).join("diskseq"))
            .unwrap_or_default();
    let mount = mounts.iter().find(|m| m.dev == sb_dev).map_or_else(String::new, |m| {
        let user = m.options.split(',').find(|o| o.starts_with("user_id=")).unwrap_or("");
        format!("{} {} {user}", m.fstype, m.source)
    });
    format!("{mount} {}", diskseq.trim())
}

pub(super) fn grain_for(fstype: &str, options: &str) -> u64 {
    let compress = options.split(',').any(|o| o == "compress" || o.starts_with("compress="));
    if fstype == "btrfs" && compress { BTRFS_EXTENT } else { 0 }
}

/// /sys/dev/block/<maj:min>/queue/max_sectors_kb in bytes; 0 for devices
/// that are not block devices (btrfs's own bdi, network filesystems).
pub(super) fn max_request(bdi: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/dev/block/{bdi}/queue/max_sectors_kb"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The kernel name of block device "major:minor" ("sdb1"), from the
/// /sys/dev/block link (sysfs: no filesystem a user controls); None for
/// numbers that are no block device (NFS, FUSE, btrfs's own bdi).
pub(super) fn kernel_name(dev: &str) -> Option<String> {
    let target = std::fs::read_link(format!("/sys/dev/block/{dev}")).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_btrfs_compressing_by_its_own_judgement_has_a_grain() {
        assert_eq!(grain_for("btrfs", "rw,relatime,compress=zstd:1,ssd,space_cache=v2"), BTRFS_EXTENT);
        assert_eq!(grain_for("btrfs", "rw,compress,subvol=/home"), BTRFS_EXTENT);
        assert_eq!(grain_for("btrfs", "rw,compress-force=zstd:3"), 0);
        assert_eq!(grain_for("btrfs", "rw,relatime,ssd,space_cache=v2"), 0);
        assert_eq!(grain_for("ext4", "rw,compress=zstd"), 0);
    }
}
