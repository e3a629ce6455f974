//! The mount tables: this process's or, in a container sharing the
//! host's PID namespace, init's (`mount_table`), parsed from mountinfo.

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountInfo {
    /// "major:minor"
    pub dev: String,
    /// The directory of the filesystem mounted there ("/" unless a bind mount).
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    /// What was mounted: a device, or a network filesystem's
    /// "server:/export".
    pub source: String,
    /// The superblock's options ("rw,compress=zstd:1,space_cache=v2,...").
    pub options: String,
}

/// The machine's mounts (fields 3, 4 and 5, and the filesystem type,
/// source and superblock options after the " - " separator): this
/// process's mount table, or in a container init's (`mount_table`).
pub fn mounts() -> Vec<MountInfo> {
    read_mounts(mount_table().path())
}

/// The mounts this process's own namespace holds, whatever the machine's:
/// where a path the daemon opens itself is looked up (the cgroup tree).
pub fn own_mounts() -> Vec<MountInfo> {
    mounts_in(MountTable::Own)
}

pub fn mounts_in(table: MountTable) -> Vec<MountInfo> {
    read_mounts(table.path())
}

fn read_mounts(path: &str) -> Vec<MountInfo> {
    let Ok(info) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    info.lines().filter_map(mount_info).collect()
}

/// Whose mount table says what is mounted on the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountTable {
    /// This process's: on the host, and under the unit's PrivateMounts (a
    /// copy of init's namespace, the same root).
    Own,
    /// Init's, /proc/1/mountinfo: in a container sharing the host's PID
    /// namespace (a DaemonSet's hostPID).  The container's own table holds
    /// its image's root and volumes, none of the host's filesystems: every
    /// host device would be another namespace's mount, and a user's.
    Init,
}

impl MountTable {
    pub fn path(self) -> &'static str {
        match self {
            Self::Own => "/proc/self/mountinfo",
            Self::Init => "/proc/1/mountinfo",
        }
    }

    /// From the two mount namespaces' ids (None where unreadable: reading
    /// /proc/1/ns/mnt needs ptrace access to init) and the superblock of
    /// each table's root ("major:minor"; None for init where its table is
    /// unreadable).  Init's table only where the daemon's root is not
    /// init's: a container's image, not a unit's copy of the host.  A
    /// mount in a namespace of a user's is in neither table, so it stays
    /// `Backing::Unlisted` either way.
    pub fn decide(own_ns: Option<u64>, init_ns: Option<u64>, own_root: Option<&str>, init_root: Option<&str>) -> Self {
        if own_ns.is_some() && own_ns == init_ns {
            return Self::Own;
        }
        match (own_root, init_root) {
            (Some(own), Some(init)) if own != init => Self::Init,
            _ => Self::Own,
        }
    }

    /// A mount point of this table as a path this process can open: init's
    /// through init's root.
    pub fn reachable(self, mount_point: &str) -> String {
        match self {
            Self::Own => mount_point.to_owned(),
            Self::Init => format!("/proc/1/root{mount_point}").trim_end_matches('/').to_owned(),
        }
    }
}

/// The table `mounts` reads, decided once: a process's root does not move.
pub fn mount_table() -> MountTable {
    static TABLE: std::sync::OnceLock<MountTable> = std::sync::OnceLock::new();
    *TABLE.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let ns = |p: &str| std::fs::metadata(p).ok().map(|m| m.ino());
        let root = |p: &str| {
            // The last mount on "/" is the one in view.
            read_mounts(p).into_iter().rev().find(|m| m.mount_point == "/").map(|m| m.dev)
        };
        let (own_ns, init_ns) = (ns("/proc/self/ns/mnt"), ns("/proc/1/ns/mnt"));
        let (own_root, init_root) = (root(MountTable::Own.path()), root(MountTable::Init.path()));
        let table = MountTable::decide(own_ns, init_ns, own_root.as_deref(), init_root.as_deref());
        if table == MountTable::Init {
            tracing::info!(
                "in a container: the host's filesystems are read from init's mount table, /proc/1/mountinfo"
            );
        }
        table
    })
}

pub(crate) fn mount_info(line: &str) -> Option<MountInfo> {
    let (pre, post) = line.split_once(" - ")?;
    let mut f = pre.split(' ').skip(2);
    let (dev, root, mnt) = (f.next()?, f.next()?, f.next()?);
    let mut p = post.split(' ');
    let fstype = p.next()?.to_owned();
    let source = p.next().map(unescape).unwrap_or_default();
    Some(MountInfo {
        dev: dev.to_owned(),
        root: unescape(root),
        mount_point: unescape(mnt),
        fstype,
        source,
        options: p.next().map(unescape).unwrap_or_default(),
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescapes() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn mountinfo_line_has_type_and_superblock_options() {
        let m = mount_info(
            "41 29 0:45 / /home rw,relatime shared:20 - btrfs /dev/vda2 rw,compress=zstd:1,ssd,subvol=/home",
        )
        .unwrap();
        assert_eq!((m.dev.as_str(), m.mount_point.as_str(), m.fstype.as_str()), ("0:45", "/home", "btrfs"));
        assert_eq!(m.options, "rw,compress=zstd:1,ssd,subvol=/home");
        assert_eq!(m.source, "/dev/vda2");
        let nfs = mount_info(
            "60 29 0:46 / /mnt/nfs rw,relatime shared:30 - nfs4 127.0.0.1:/srv/nfs rw,vers=4.2,rsize=262144",
        )
        .unwrap();
        assert_eq!((nfs.source.as_str(), nfs.options.as_str()), ("127.0.0.1:/srv/nfs", "rw,vers=4.2,rsize=262144"));
    }

    /// A container with hostPID reads init's table; the host, a unit's
    /// PrivateMounts and a container without hostPID (its PID 1 its own)
    /// read their own.
    #[test]
    fn the_host_mounts_are_init_s_only_in_a_container() {
        use MountTable::*;
        // On the host: one namespace.
        assert_eq!(MountTable::decide(Some(7), Some(7), Some("254:0"), Some("254:0")), Own);
        // Under systemd's PrivateMounts: a namespace of its own, init's root.
        assert_eq!(MountTable::decide(Some(8), Some(7), Some("254:0"), Some("254:0")), Own);
        // A container with hostPID: its overlay root, the host's disk in init's.
        assert_eq!(MountTable::decide(Some(9), Some(7), Some("0:45"), Some("254:0")), Init);
        // The same where /proc/1/ns/mnt is out of reach (no ptrace access).
        assert_eq!(MountTable::decide(Some(9), None, Some("0:45"), Some("254:0")), Init);
        assert_eq!(MountTable::decide(Some(8), None, Some("254:0"), Some("254:0")), Own);
        // Init's table unreadable: the own one, as before.
        assert_eq!(MountTable::decide(Some(9), None, Some("0:45"), None), Own);
        // A container without hostPID: PID 1 is in its own namespace.
        assert_eq!(MountTable::decide(Some(9), Some(9), Some("0:45"), Some("0:45")), Own);
        assert_eq!(Init.reachable("/"), "/proc/1/root");
        assert_eq!(Init.reachable("/mnt/wb"), "/proc/1/root/mnt/wb");
        assert_eq!(Own.reachable("/mnt/wb"), "/mnt/wb");
    }

    /// With the two tables: a FUSE mount a user made in a namespace of
    /// theirs is in neither, so it is unlisted whichever is read; a host
    /// disk is unlisted in a container's own table and a disk in init's.
    #[test]
    fn a_host_disk_is_a_disk_from_a_container_and_a_user_s_namespace_mount_stays_unlisted() {
        use crate::backing::Backing;
        let init: Vec<MountInfo> =
            ["27 1 254:0 / / rw,relatime - ext4 /dev/vda rw", "40 27 8:3 / /mnt/wb rw,relatime - ext4 /dev/sda3 rw"]
                .iter()
                .filter_map(|l| mount_info(l))
                .collect();
        let container: Vec<MountInfo> = [
            "600 500 0:45 / / rw,relatime - overlay overlay rw,lowerdir=/l",
            "601 600 0:46 / /proc rw,nosuid - proc proc rw",
        ]
        .iter()
        .filter_map(|l| mount_info(l))
        .collect();
        let root = |t: &[MountInfo]| t.iter().rev().find(|m| m.mount_point == "/").map(|m| m.dev.clone());
        let table = MountTable::decide(Some(9), None, root(&container).as_deref(), root(&init).as_deref());
        assert_eq!(table, MountTable::Init);
        let read = if table == MountTable::Init { &init } else { &container };
        let of = |dev, table| Backing::of(dev, dev, table, |_| false).0;
        assert_eq!(of("8:3", read), Backing::Disk);
        assert_eq!(of("8:3", &container), Backing::Unlisted, "what the container's own table said");
        // The user's FUSE superblock (0:77) is in neither table.
        assert_eq!(of("0:77", read), Backing::Unlisted);
        assert!(of("0:77", read).user_made());
    }

    #[test]
    fn mountinfo_has_the_root() {
        assert!(mounts().iter().any(|m| m.mount_point == "/" && !m.fstype.is_empty()));
    }
}
