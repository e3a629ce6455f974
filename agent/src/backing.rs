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
//!
//! Whose data a block device holds is decided through its layers (a loop
//! device's backing file, the devices a dm or md device is built from, a
//! partition's disk: owner.rs), and that lookup walks a path that a user
//! may have chosen: it is made on a thread of its own (devices::owners),
//! and until it answers the device is `Layered`, a user's.

pub mod owner;

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
    /// A network filesystem whose server a user picked: autofs mounts the
    /// exports of any host a user names under a `-hosts` map (`ls
    /// /net/myhost` mounts myhost's), so the user sets its speed.
    UserNetwork,
    /// A FUSE filesystem; `user`: the uid of whoever runs its server (0
    /// for one root mounted: ntfs-3g from udisks, a system sshfs).
    Fuse { user: u32 },
    /// A loop device over a file of this uid's (udisks sets one up for a
    /// user's disk image), or a device built on one (dm-crypt, fuseblk);
    /// owner::UNKNOWN where the file's owner could not be told.
    UserLoop { user: u32 },
    /// A filesystem this daemon's mount table does not list: mounted in a
    /// mount namespace of someone else's (a user's `unshare -rm` FUSE).
    Unlisted,
    /// Built on other block devices (a loop device, dm, md, or fuseblk on
    /// one of them) whose owners are still being looked up (owner.rs):
    /// a user's until known.  `fuse`: a FUSE server root runs (ntfs-3g
    /// from udisks) serves it, which it stays where all below is root's.
    Layered { fuse: bool },
}

impl Backing {
    /// Of the superblock `sb_dev` ("major:minor", as mountinfo lists it) on
    /// bdi `bdi`, among `mounts`; `layered` tells a block device built on
    /// others (owner::layered).  Where it says `Layered`, the block device
    /// to look up (`owner::owner`) is the second.
    pub fn of(bdi: &str, sb_dev: &str, mounts: &[MountInfo], layered: impl Fn(&str) -> bool) -> (Self, Option<String>) {
        let Some(m) = mounts.iter().find(|m| m.dev == sb_dev) else {
            return (Self::Unlisted, None);
        };
        if m.fstype == "fuse" || m.fstype == "fuseblk" || m.fstype.starts_with("fuse.") {
            // user_id is the server's uid as fusermount3 (setuid) or root
            // wrote it; a user cannot make it 0 in this namespace.
            let user = m.options.split(',').find_map(|o| o.strip_prefix("user_id=")?.parse().ok());
            // fuseblk's superblock is its block device's: root's server
            // (ntfs-3g, which udisks runs for a user's NTFS image too)
            // serves whatever is under it.
            if user == Some(0) && m.fstype == "fuseblk" && layered(sb_dev) {
                return (Self::Layered { fuse: true }, Some(sb_dev.to_owned()));
            }
            return (Self::Fuse { user: user.unwrap_or(u32::MAX) }, None);
        }
        if NETWORK.contains(&m.fstype.as_str()) && hosts_map_under(&m.mount_point, mounts) {
            return (Self::UserNetwork, None);
        }
        if SMB.contains(&m.fstype.as_str()) {
            return (Self::Smb, None);
        }
        if NETWORK.contains(&m.fstype.as_str()) {
            return (Self::Network, None);
        }
        Self::of_block_device(bdi, layered)
    }

    /// Of a block device (its bdi `bdi`, a disk's), written through its node
    /// or under a filesystem: no superblock to look up, only whether other
    /// block devices, and so perhaps a user's file, are under it.
    pub fn of_block_device(bdi: &str, layered: impl Fn(&str) -> bool) -> (Self, Option<String>) {
        if layered(bdi) { (Self::Layered { fuse: false }, Some(bdi.to_owned())) } else { (Self::Disk, None) }
    }

    /// What a `Layered` device is once the owner of what is under it is
    /// known (owner::owner: 0 where all of it is root's).
    pub fn resolved(self, owner: u32) -> Self {
        match self {
            Self::Layered { .. } if owner != 0 => Self::UserLoop { user: owner },
            Self::Layered { fuse: true } => Self::Fuse { user: 0 },
            Self::Layered { fuse: false } => Self::Disk,
            other => other,
        }
    }

    /// Whether a user, not the administrator, sets the device's speed.
    pub fn user_made(self) -> bool {
        match self {
            Self::Disk | Self::Network | Self::Smb => false,
            Self::Fuse { user } => user != 0,
            Self::UserLoop { .. } | Self::Unlisted | Self::Layered { .. } | Self::UserNetwork => true,
        }
    }

    /// Whether a network filesystem is behind it (NFS, SMB, ...).
    pub fn network(self) -> bool {
        matches!(self, Self::Network | Self::Smb | Self::UserNetwork)
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
            Self::UserNetwork => "network (a server a user picked: autofs -hosts)".into(),
            Self::Fuse { user: 0 } => "fuse (root's)".into(),
            Self::Fuse { user } => format!("fuse (uid {user}'s)"),
            Self::UserLoop { user: owner::UNKNOWN } => "loop (a file whose owner is not known)".into(),
            Self::UserLoop { user } => format!("loop (uid {user}'s file)"),
            Self::Unlisted => "another namespace's mount".into(),
            Self::Layered { .. } => "layered (what is under it being looked up)".into(),
        }
    }
}

/// Whether `mount_point` lies beneath an autofs mount of the `-hosts`
/// map (mountinfo's source is the map's name), where whoever names a
/// host mounts its exports.
fn hosts_map_under(mount_point: &str, mounts: &[MountInfo]) -> bool {
    mounts.iter().any(|a| {
        a.fstype == "autofs"
            && a.source == "-hosts"
            && mount_point.strip_prefix(a.mount_point.as_str()).is_some_and(|rest| rest.starts_with('/'))
    })
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
        let of = |sb| Backing::of("none", sb, &mounts, |_| false).0;
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

    /// A device built on others is a user's until what is under it is
    /// known; ntfs-3g from udisks over a loop device stays root's FUSE
    /// only where the loop device's file is root's.
    #[test]
    fn a_layered_device_is_a_users_until_its_owner_is_known() {
        let mounts = [
            mount("7:3", "ext4", "rw"),
            mount("7:4", "fuseblk", "rw,user_id=0,group_id=0,allow_other"),
            mount("8:1", "fuseblk", "rw,user_id=0,group_id=0,allow_other"),
        ];
        let loops = |dev: &str| dev.starts_with("7:");
        let (b, look) = Backing::of("7:3", "7:3", &mounts, loops);
        assert_eq!((b, look.as_deref()), (Backing::Layered { fuse: false }, Some("7:3")));
        assert!(b.user_made());
        assert_eq!(b.resolved(0), Backing::Disk);
        assert_eq!(b.resolved(1000), Backing::UserLoop { user: 1000 });
        let (b, look) = Backing::of("0:60-fuseblk", "7:4", &mounts, loops);
        assert_eq!((b, look.as_deref()), (Backing::Layered { fuse: true }, Some("7:4")));
        assert_eq!(b.resolved(0), Backing::Fuse { user: 0 });
        assert!(b.resolved(1000).user_made());
        assert_eq!(Backing::of("0:61-fuseblk", "8:1", &mounts, loops), (Backing::Fuse { user: 0 }, None));
        assert_eq!(Backing::of_block_device("8:0", loops), (Backing::Disk, None));
        assert_eq!(Backing::Disk.resolved(1000), Backing::Disk, "only a layered device is resolved");
    }

    /// autofs's `-hosts` map mounts whatever host a user names: its NFS
    /// mounts are a user's.  The same server mounted by the administrator
    /// elsewhere, or under another map, stays the administrator's.
    #[test]
    fn a_network_mount_under_an_autofs_hosts_map_is_a_users() {
        let at = |dev: &str, fstype: &str, source: &str, point: &str| MountInfo {
            mount_point: point.into(),
            source: source.into(),
            ..mount(dev, fstype, "rw")
        };
        let mounts = [
            at("0:40", "autofs", "-hosts", "/net"),
            at("0:41", "autofs", "-hosts", "/net/evil.example"),
            at("0:42", "nfs4", "evil.example:/srv", "/net/evil.example/srv"),
            at("0:43", "nfs4", "files:/home", "/home"),
            at("0:44", "autofs", "/etc/auto.misc", "/misc"),
            at("0:45", "nfs", "files:/data", "/misc/data"),
            at("0:46", "nfs4", "files:/x", "/network"),
        ];
        let of = |sb| Backing::of("none", sb, &mounts, |_| false).0;
        assert_eq!(of("0:42"), Backing::UserNetwork);
        assert!(of("0:42").user_made() && of("0:42").network());
        assert_eq!(of("0:43"), Backing::Network, "the administrator's own mount");
        assert_eq!(of("0:45"), Backing::Network, "a map the administrator wrote");
        assert_eq!(of("0:46"), Backing::Network, "/network is not beneath /net");
    }
}
