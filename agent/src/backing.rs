//! What backs a device, and so whether its writers may steer the dirty
//! limits.  Pacing lowers a limit that other writers share: the bdi's own
//! (its every writer) or, on kernels before 6.2, `vm.dirty_bytes` (every
//! writer of every disk).  A device whose speed a user sets — their own
//! FUSE server, a loop device over their own image file, a mount made in a
//! namespace of theirs — would let that user hold the system's limit at a
//! few MiB for as long as they keep writing.  Such devices get windows like
//! any other, but drive no lever unless the root policy opts them in
//! (`pace_user_devices`).  Disks and sticks, and network and FUSE mounts
//! root made, pace as before: a desktop user's copy to a stick udisks
//! mounted is the feature, not the attack.

use crate::sys::MountInfo;

/// Filesystems whose bdi is a network link (and a server), not a disk.
const NETWORK: [&str; 8] = ["nfs", "nfs4", "cifs", "smb3", "ceph", "9p", "afs", "glusterfs"];
/// SMB's: cifs puts a file's pages under writeback in writes of its own
/// size (up to 4 MiB), several at once, whatever span the agent asks for.
const SMB: [&str; 2] = ["cifs", "smb3"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// A block device: a disk, a stick, a loop device over root's file.
    Disk,
    /// A network filesystem the administrator mounted.
    Network,
    /// An SMB share the administrator mounted (a network filesystem).
    Smb,
    /// A FUSE filesystem; `user`: the uid of whoever runs its server (0
    /// for one root mounted: ntfs-3g from udisks, a system sshfs).
    Fuse { user: u32 },
    /// A loop device over a file of this uid's (udisks sets one up for a
    /// user's disk image).
    UserLoop { user: u32 },
    /// A filesystem this daemon's mount table does not list: mounted in a
    /// mount namespace of someone else's (a user's `unshare -rm` FUSE).
    Unlisted,
}

impl Backing {
    /// Of the superblock `sb_dev` ("major:minor", as mountinfo lists it) on
    /// bdi `bdi`, among `mounts`.
    pub fn of(bdi: &str, sb_dev: &str, mounts: &[MountInfo]) -> Self {
        let Some(m) = mounts.iter().find(|m| m.dev == sb_dev) else {
            return Self::Unlisted;
        };
        if m.fstype == "fuse" || m.fstype == "fuseblk" || m.fstype.starts_with("fuse.") {
            // user_id is the server's uid as fusermount3 (setuid) or root
            // wrote it; a user cannot make it 0 in this namespace.
            let user = m.options.split(',').find_map(|o| o.strip_prefix("user_id=")?.parse().ok());
            return Self::Fuse { user: user.unwrap_or(u32::MAX) };
        }
        if SMB.contains(&m.fstype.as_str()) {
            return Self::Smb;
        }
        if NETWORK.contains(&m.fstype.as_str()) {
            return Self::Network;
        }
        match loop_owner(bdi) {
            Some(user) if user != 0 => Self::UserLoop { user },
            _ => Self::Disk,
        }
    }

    /// Of a block device written through its node (its disk's bdi `bdi`):
    /// no superblock to look up, only whether a user's file backs it.
    pub fn of_block_device(bdi: &str) -> Self {
        match loop_owner(bdi) {
            Some(user) if user != 0 => Self::UserLoop { user },
            _ => Self::Disk,
        }
    }

    /// Whether a user, not the administrator, sets the device's speed.
    pub fn user_made(self) -> bool {
        match self {
            Self::Disk | Self::Network | Self::Smb => false,
            Self::Fuse { user } => user != 0,
            Self::UserLoop { .. } | Self::Unlisted => true,
        }
    }

    /// Whether a network filesystem is behind it (NFS, SMB, ...).
    pub fn network(self) -> bool {
        matches!(self, Self::Network | Self::Smb)
    }

    /// Whether pacing it through the global limit (kernels before 6.2)
    /// holds it back rather than every writer of the machine.  Not SMB's:
    /// what cifs keeps under writeback is its own (SMB above), and a limit
    /// never written below the dirty level sits just above it.  On 6.1 a
    /// 512 MiB cp held 15 MiB in writeback against a budget of 8 MiB, with
    /// `vm.dirty_bytes` at 16.2 MiB; smbd, serving the share from the same
    /// machine, was throttled at that limit and wrote its disk at 0.4
    /// MiB/s: the copy took 149 s against the kernel default's 21.  An SMB
    /// share gets windows there, and the administrator's limits.
    pub fn global_lever(self) -> bool {
        self != Self::Smb
    }

    /// As `wbctl status` shows it.
    pub fn describe(self) -> String {
        match self {
            Self::Disk => "disk".into(),
            Self::Network => "network".into(),
            Self::Smb => "network (smb)".into(),
            Self::Fuse { user: 0 } => "fuse (root's)".into(),
            Self::Fuse { user } => format!("fuse (uid {user}'s)"),
            Self::UserLoop { user } => format!("loop (uid {user}'s file)"),
            Self::Unlisted => "another namespace's mount".into(),
        }
    }
}

/// The owner of a loop device's backing file; None for any other device.
fn loop_owner(bdi: &str) -> Option<u32> {
    let file = std::fs::read_to_string(format!("/sys/dev/block/{bdi}/loop/backing_file")).ok()?;
    let file = std::path::Path::new(file.trim_end_matches('\n'));
    // The path as whoever set the device up saw it: the unit's PrivateTmp
    // hides the host's /tmp and /var/tmp from the daemon, and a disk image
    // there is looked up through init's root instead.
    let host = std::path::Path::new("/proc/1/root").join(file.strip_prefix("/").unwrap_or(file));
    let owner = crate::sys::cached_owner(&host).or_else(|_| crate::sys::cached_owner(file));
    // A backing file deleted or out of reach is nobody's in particular:
    // the user who could have set it up is not known, so it counts as one.
    Some(owner.unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(dev: &str, fstype: &str, options: &str) -> MountInfo {
        MountInfo {
            dev: dev.into(),
            root: "/".into(),
            mount_point: "/mnt".into(),
            fstype: fstype.into(),
            source: "none".into(),
            options: options.into(),
        }
    }

    #[test]
    fn users_set_the_speed_of_their_fuse_mounts_and_unlisted_ones() {
        let mounts = [
            mount("0:50", "fuse.sshfs", "rw,user_id=1000,group_id=1000"),
            mount("0:51", "fuseblk", "rw,user_id=0,group_id=0,allow_other"),
            mount("0:52", "nfs4", "rw,vers=4.2"),
            mount("0:53", "cifs", "rw,vers=3.1.1"),
            mount("8:1", "ext4", "rw"),
        ];
        let of = |sb| Backing::of("none", sb, &mounts);
        assert_eq!(of("0:50"), Backing::Fuse { user: 1000 });
        assert!(of("0:50").user_made());
        assert_eq!(of("0:51"), Backing::Fuse { user: 0 });
        assert!(!of("0:51").user_made(), "ntfs-3g on a stick udisks mounted");
        assert_eq!(of("0:52"), Backing::Network);
        assert!(!of("0:52").user_made());
        assert!(of("0:52").network() && of("0:52").global_lever());
        assert_eq!(of("0:53"), Backing::Smb);
        assert!(of("0:53").network() && !of("0:53").global_lever() && !of("0:53").user_made());
        assert_eq!(of("8:1"), Backing::Disk);
        assert!(!of("8:1").user_made());
        assert_eq!(of("0:99"), Backing::Unlisted);
        assert!(of("0:99").user_made());
    }
}
