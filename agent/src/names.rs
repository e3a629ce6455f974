//! What a device is called where people read it: its kernel name and
//! mount points (`sdb1 /media/alice/STICK`, `loop0 /mnt/x`), a network
//! or FUSE mount's source (`127.0.0.1:/srv/nfs /mnt/nfs`).  Its number
//! (the bdi, `8:16`) says nothing to a reader and stays beside it for
//! scripts.  Read from /sys/dev/block and /proc/self/mountinfo only:
//! nothing under a mount is looked at.  `name` decides from what was read
//! (a pure function); `Names` reads it and keeps the names until the
//! mount table changes.

use std::{collections::HashMap, os::fd::AsRawFd};

use crate::sys::MountInfo;

/// Mount points named at most; further ones are counted (a container
/// host binds one filesystem into many places).
const MOUNT_POINTS: usize = 3;

/// One superblock seen on the device: its number ("major:minor", as
/// mountinfo writes it) and its kernel name when it is a block device
/// ("sdb1"; None for anonymous numbers: NFS, FUSE, btrfs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub dev: String,
    pub kernel: Option<String>,
}

/// The name of device `bdi` (its kernel name `kernel`, None when it is no
/// block device) whose superblocks `sbs` are known, among `mounts`: the
/// kernel name of the block device a filesystem is on, else its disk's,
/// else the mount's source (an NFS export, a FUSE server's source, btrfs's
/// `/dev/vda2` as `vda2`), then its mount points, those of the whole
/// filesystem first.  The bdi itself when nothing else is known.
pub fn name(bdi: &str, kernel: Option<&str>, sbs: &[Superblock], mounts: &[MountInfo]) -> String {
    let on_it = |m: &&MountInfo| sbs.iter().any(|s| s.dev == m.dev) || (sbs.is_empty() && m.dev == bdi);
    let mut mine: Vec<&MountInfo> = mounts.iter().filter(on_it).collect();
    // Mounts of the filesystem's root before bind mounts and subvolumes.
    mine.sort_by_key(|m| m.root != "/");
    let mounted: Vec<&Superblock> =
        sbs.iter().filter(|s| s.kernel.is_some() && mine.iter().any(|m| m.dev == s.dev)).collect();
    // Two partitions mounted: the disk is what they share.
    let one = match mounted.as_slice() {
        [one] => Some(*one),
        [] => sbs.iter().find(|s| s.kernel.is_some()),
        _ => None,
    };
    let head = one
        .and_then(|s| s.kernel.clone())
        .or_else(|| kernel.map(str::to_owned))
        .or_else(|| mine.first().map(|m| m.source.strip_prefix("/dev/").unwrap_or(&m.source).to_owned()))
        .filter(|h| !h.is_empty() && h != "none")
        .unwrap_or_else(|| bdi.to_owned());
    let mut points: Vec<&str> = Vec::new();
    for m in &mine {
        if !points.contains(&m.mount_point.as_str()) {
            points.push(&m.mount_point);
        }
    }
    let mut out = head;
    for p in points.iter().take(MOUNT_POINTS) {
        out.push(' ');
        out.push_str(p);
    }
    if points.len() > MOUNT_POINTS {
        out += &format!(" (+{} more)", points.len() - MOUNT_POINTS);
    }
    out
}

/// The kernel name of block device "major:minor" ("sdb1"), from its
/// uevent's DEVNAME, else the name of its /sys/dev/block link; None for
/// numbers that are no block device (NFS, FUSE, btrfs's own bdi).
pub fn kernel_name(dev: &str) -> Option<String> {
    if let Ok(uevent) = std::fs::read_to_string(format!("/sys/dev/block/{dev}/uevent"))
        && let Some(name) = devname(&uevent)
    {
        return Some(name);
    }
    let target = std::fs::read_link(format!("/sys/dev/block/{dev}")).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// DEVNAME of a uevent file ("DEVNAME=mapper/x" is kept whole).
fn devname(uevent: &str) -> Option<String> {
    uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).filter(|n| !n.is_empty()).map(str::to_owned)
}

/// The block devices on disk `bdi` ("8:16"): the disk's partitions, by
/// number, from /sys/dev/block/<bdi>/*/dev.  Empty for any other bdi.
pub fn partitions(bdi: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/sys/dev/block/{bdi}")) else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| std::fs::read_to_string(e.path().join("dev")).ok())
        .map(|d| d.trim().to_owned())
        .collect()
}

/// The superblocks a bdi carries when no event said which: the disk
/// itself and its partitions, with their kernel names.
pub fn superblocks_of(bdi: &str) -> Vec<Superblock> {
    if !bdi.contains(':') {
        return Vec::new();
    }
    std::iter::once(bdi.to_owned())
        .chain(partitions(bdi))
        .map(|dev| Superblock { kernel: kernel_name(&dev), dev })
        .collect()
}

/// The mount table, read again only when it changed: poll() on an open
/// mountinfo (`sys::mount_table`'s) reports each change once (POLLPRI), without
/// reading it.
pub struct MountWatch {
    file: Option<std::fs::File>,
    mounts: Vec<MountInfo>,
}

impl Default for MountWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl MountWatch {
    pub fn new() -> Self {
        let file = std::fs::File::open(crate::sys::mount_table().path()).ok();
        Self { file, mounts: crate::sys::mounts() }
    }

    /// The mounts as of now; `true` with them when they changed since the
    /// last call (always without the watch's file).
    pub fn mounts(&mut self) -> (bool, &[MountInfo]) {
        let changed = match &self.file {
            Some(f) => {
                let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n != 0 && p.revents & (libc::POLLPRI | libc::POLLERR) != 0
            }
            None => true,
        };
        if changed {
            self.mounts = crate::sys::mounts();
        }
        (changed, &self.mounts)
    }
}

/// Names by bdi and superblocks, made once per device and again when
/// the mount table changes or a superblock is new to the device.
#[derive(Default)]
pub struct Names {
    watch: MountWatch,
    known: HashMap<(String, Vec<String>), String>,
    /// The table changed since `changed` last said so.
    changed: bool,
}

/// Names kept at most: past this many (each FUSE mount is a device, and
/// users make them) the cache is emptied and filled again.
const KEPT: usize = 4096;

impl Names {
    /// The name of `bdi` with superblocks `sb_devs` ("major:minor"; empty:
    /// the disk and its partitions).
    pub fn of(&mut self, bdi: &str, sb_devs: &[String]) -> String {
        self.look();
        if self.known.len() >= KEPT {
            self.known.clear();
        }
        let mut key = (bdi.to_owned(), sb_devs.to_vec());
        key.1.sort();
        if let Some(name) = self.known.get(&key) {
            return name.clone();
        }
        let sbs: Vec<Superblock> = if sb_devs.is_empty() {
            superblocks_of(bdi)
        } else {
            key.1.iter().map(|d| Superblock { dev: d.clone(), kernel: kernel_name(d) }).collect()
        };
        let name = name(bdi, kernel_name(bdi).as_deref(), &sbs, &self.watch.mounts);
        self.known.insert(key, name.clone());
        name
    }

    /// The mount table as last read.
    pub fn mounts(&self) -> &[MountInfo] {
        &self.watch.mounts
    }

    /// Whether the mount table changed since this last said so: the names
    /// given before may be out of date.
    pub fn changed(&mut self) -> bool {
        self.look();
        std::mem::take(&mut self.changed)
    }

    fn look(&mut self) {
        if self.watch.mounts().0 {
            self.known.clear();
            self.changed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts(text: &str) -> Vec<MountInfo> {
        text.lines().filter_map(crate::sys::mount_info).collect()
    }

    fn sb(dev: &str, kernel: Option<&str>) -> Superblock {
        Superblock { dev: dev.into(), kernel: kernel.map(str::to_owned) }
    }

    const TABLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
60 27 8:17 / /media/alice/MY\\040STICK rw,nosuid,nodev - vfat /dev/sdb1 rw,uid=1000
61 27 7:0 / /mnt/x rw,relatime - ext4 /dev/loop0 rw
62 27 7:0 /data /srv/data rw,relatime - ext4 /dev/loop0 rw
63 27 7:0 / /mnt/again rw,relatime - ext4 /dev/loop0 rw
64 27 0:46 / /mnt/nfs rw,relatime - nfs4 127.0.0.1:/srv/nfs rw,vers=4.2
65 27 0:50 / /home/alice/remote rw,nosuid,nodev - fuse.sshfs alice@host:/home rw,user_id=1000
66 27 0:45 /@home /home rw,relatime - btrfs /dev/vda2 rw,subvol=/@home
67 27 0:45 /@ /srv/root rw,relatime - btrfs /dev/vda2 rw,subvol=/@
68 27 0:45 /@home/x /srv/x rw,relatime - btrfs /dev/vda2 rw,subvol=/@home
69 27 0:45 /@home/y /srv/y rw,relatime - btrfs /dev/vda2 rw,subvol=/@home
";

    #[test]
    fn a_partition_is_named_by_its_kernel_name_and_mount_point() {
        let m = mounts(TABLE);
        let name = name("8:16", Some("sdb"), &[sb("8:17", Some("sdb1"))], &m);
        assert_eq!(name, "sdb1 /media/alice/MY STICK", "\\040 is a space");
    }

    #[test]
    fn bind_mounts_come_after_the_filesystems_root() {
        let m = mounts(TABLE);
        let name = name("7:0", Some("loop0"), &[sb("7:0", Some("loop0"))], &m);
        assert_eq!(name, "loop0 /mnt/x /mnt/again /srv/data");
    }

    #[test]
    fn network_and_fuse_mounts_are_named_by_their_source() {
        let m = mounts(TABLE);
        assert_eq!(name("0:46", None, &[sb("0:46", None)], &m), "127.0.0.1:/srv/nfs /mnt/nfs");
        assert_eq!(name("0:50", None, &[sb("0:50", None)], &m), "alice@host:/home /home/alice/remote");
    }

    #[test]
    fn btrfs_subvolumes_on_an_anonymous_number_name_their_device() {
        let m = mounts(TABLE);
        // Its bdi (btrfs-1, or 0:45 on older kernels) has no /sys/dev/block entry.
        assert_eq!(name("btrfs-1", None, &[sb("0:45", None)], &m), "vda2 /home /srv/root /srv/x (+1 more)");
    }

    #[test]
    fn what_is_not_mounted_keeps_a_kernel_name_or_its_number() {
        let m = mounts(TABLE);
        // A disk written through its node.
        assert_eq!(name("8:32", Some("sdc"), &[sb("8:32", Some("sdc"))], &m), "sdc");
        // Nothing known of it at all.
        assert_eq!(name("0:99", None, &[sb("0:99", None)], &m), "0:99");
        // No superblock said: the bdi's own mounts.
        assert_eq!(name("254:0", Some("vda"), &[], &m), "vda /");
        // Two partitions of one disk mounted: the disk's name.
        let two = mounts("80 27 8:49 / /a rw - ext4 /dev/sdd1 rw\n81 27 8:50 / /b rw - ext4 /dev/sdd2 rw\n");
        assert_eq!(name("8:48", Some("sdd"), &[sb("8:49", Some("sdd1")), sb("8:50", Some("sdd2"))], &two), "sdd /a /b");
    }

    #[test]
    fn names_a_user_chose_are_kept_verbatim_for_escaping_where_printed() {
        let m = mounts("70 27 0:51 / /mnt/a\\012b rw - fuse.evil \x1b[2J rw,user_id=1000\n");
        let n = name("0:51", None, &[sb("0:51", None)], &m);
        assert_eq!(n, "\x1b[2J /mnt/a\nb");
        assert_eq!(crate::status::printable(&n), "\\x1b[2J /mnt/a\\nb");
    }

    #[test]
    fn a_uevent_names_the_device() {
        assert_eq!(devname("MAJOR=8\nMINOR=17\nDEVNAME=sdb1\nDEVTYPE=partition\n").as_deref(), Some("sdb1"));
        assert_eq!(devname("MAJOR=0\n"), None);
    }

    #[test]
    fn the_watch_has_the_table() {
        // Other tests may mount meanwhile: only that the table is there.
        let mut w = MountWatch::new();
        let (_, m) = w.mounts();
        assert!(m.iter().any(|m| m.mount_point == "/"));
    }
}
