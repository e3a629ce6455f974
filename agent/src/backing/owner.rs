//! Whose data a block device holds, through its layers: a loop device's
//! backing file (or the block device it is over), the devices a dm or md
//! device is built from (its `slaves`), a partition's disk.  A user's disk
//! image, attached to a loop device by udisks, unlocked with dm-crypt and
//! mounted with ntfs-3g, hides behind three layers that each look like
//! root's.
//!
//! A loop device's backing file is known to sysfs only as a path, which the
//! kernel renders when asked: the file's name now, "<name> (deleted)" once
//! it is removed, and a path of another namespace (or a detached mount) for
//! a file opened there.  A user who owns the file can make that string name
//! anything: remove their image and put a symlink to `/etc/passwd` by the
//! deleted name.  So the path is walked one plain name at a time, never
//! through a symlink, and a deleted file's name is not looked up at all.
//! What is left: a path that names, beneath init's root, another file with
//! no symlink on the way (a user's image opened in a mount
//! namespace of their own, where the same path is theirs); sysfs has no
//! inode number to check it against.
//!
//! The walk may wait on any filesystem it crosses (a FUSE server that does
//! not answer a LOOKUP, an automount): it runs on a thread of its own
//! (devices::owners), never on the intake's, which asks sysfs alone and
//! is done where no loop device is under the device (dm over a disk: a
//! LUKS or LVM root).

use std::{
    fs,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

/// Layers followed (loop over loop over dm ...) before the device counts
/// as a user's.
const DEPTH: u32 = 8;
/// The owner of what could not be told (a deleted or unreachable backing
/// file, a symlink on its path, too many layers): a user's, none in
/// particular.
pub const UNKNOWN: u32 = u32::MAX;

/// What a loop device's backing path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A regular file of this uid's.
    File { uid: u32 },
    /// A block device ("major:minor"): a loop device over another.
    Block { dev: String },
    /// Nothing that can be told: a symlink, a deleted file, no such path.
    Other,
    /// Not looked up: what the intake thread's walk says (it walks no
    /// path), for `owner` to say that the answer needs one.
    NotWalked,
}

/// The sysfs directory of block device `dev` ("major:minor"); for a
/// partition, its disk's.
pub(crate) fn disk_dir(sysfs: &Path, dev: &str) -> PathBuf {
    let dir = sysfs.join("dev/block").join(dev);
    if dir.join("partition").exists() { dir.join("..") } else { dir }
}

/// Whether block device `dev` is built on others: a loop device, or one
/// with slaves (dm, md).  Reads sysfs only, so any thread may ask.
pub fn layered(sysfs: &Path, dev: &str) -> bool {
    let dir = disk_dir(sysfs, dev);
    dir.join("loop").exists() || fs::read_dir(dir.join("slaves")).is_ok_and(|mut d| d.next().is_some())
}

/// The owner that counts for what block device `dev` holds: 0 where all
/// under it is root's files and real hardware, else the uid of a user's
/// file under it (UNKNOWN where it could not be told).  `walk` says what a
/// loop device's backing path names (`walk` below, on the running system);
/// where it answers `NotWalked`, None: the answer needs a walk.
pub fn owner(sysfs: &Path, dev: &str, walk: &impl Fn(&str) -> Found) -> Option<u32> {
    owner_at(sysfs, dev, walk, 0)
}

fn owner_at(sysfs: &Path, dev: &str, walk: &impl Fn(&str) -> Found, depth: u32) -> Option<u32> {
    if depth >= DEPTH {
        return Some(UNKNOWN);
    }
    let dir = disk_dir(sysfs, dev);
    if dir.join("loop").exists() {
        // A path the kernel would not render (longer than a page: a user
        // can attach an image from that deep), or a device detached
        // meanwhile, is nobody's in particular.
        let path = fs::read_to_string(dir.join("loop/backing_file")).unwrap_or_default();
        let path = path.strip_suffix('\n').unwrap_or(&path);
        if path.is_empty() {
            return Some(UNKNOWN);
        }
        return match walk(path) {
            Found::File { uid } => Some(uid),
            Found::Block { dev } => owner_at(sysfs, &dev, walk, depth + 1),
            Found::Other => Some(UNKNOWN),
            Found::NotWalked => None,
        };
    }
    let slaves = match fs::read_dir(dir.join("slaves")) {
        Ok(slaves) => slaves,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(0),
        Err(_) => return Some(UNKNOWN),
    };
    let mut owner = 0;
    for slave in slaves {
        let under = match slave.and_then(|s| fs::read_to_string(s.path().join("dev"))) {
            Ok(dev) => owner_at(sysfs, dev.trim(), walk, depth + 1),
            Err(_) => Some(UNKNOWN),
        };
        match under {
            Some(0) => {}
            Some(user) => return Some(user),
            None => owner = UNKNOWN,
        }
    }
    // A slave whose answer needs a walk, and no user's found without one.
    if owner == UNKNOWN { None } else { Some(0) }
}

/// What `path`, a loop device's backing file as sysfs names it, is on the
/// running system, looked up beneath init's root (the unit's PrivateTmp
/// hides the host's /tmp and /var/tmp from the daemon, and a disk image
/// there is found through init's root), or the daemon's where that cannot
/// be opened.
pub fn walk(path: &str) -> Found {
    beneath_init(|root| walk_from(root, path))
}

/// `walk` from the dentry cache alone (sys::open_cached), which the intake
/// thread may ask: `NotWalked` where the path is not all cached (or the
/// kernel refuses), and it is to be walked on a thread.  A loop device just
/// attached over a file has it cached: the device is classed at its first
/// event, before its first pacing decision: a hundred writers within their
/// bursts held 781-952 MiB in 3 of 6 runs while a thread walked it (the
/// thread waits for a core behind them), 212-538 MiB in nine runs from the
/// cache, as with the statx this replaced (221-444 MiB in six).
pub fn walk_cached(path: &str) -> Found {
    beneath_init(|root| walk_cached_from(root, path))
}

fn beneath_init(walk: impl FnOnce(&OwnedFd) -> Found) -> Found {
    match crate::sys::open_dir(c"/proc/1/root").or_else(|_| crate::sys::open_dir(c"/")) {
        Ok(root) => walk(&root),
        Err(_) => Found::Other,
    }
}

/// The path beneath the root, "" where it is not to be looked up at all:
/// not absolute, or the kernel's own mark of a removed file, which is also
/// a name a user may give another file (or a symlink) in the image's place.
fn relative(path: &str) -> &str {
    if path.ends_with(" (deleted)") { "" } else { path.strip_prefix('/').unwrap_or("") }
}

/// `walk` beneath the directory `root`.
pub fn walk_from(root: &OwnedFd, path: &str) -> Found {
    match crate::sys::walk_plain(root, relative(path).as_bytes()) {
        Some(fd) => kind(&fd),
        None => Found::Other,
    }
}

/// `walk_cached` beneath the directory `root`.
pub fn walk_cached_from(root: &OwnedFd, path: &str) -> Found {
    match crate::sys::open_cached(root, relative(path).as_bytes()) {
        Ok(fd) => kind(&fd),
        Err(Some(_)) => Found::Other,
        Err(None) => Found::NotWalked,
    }
}

/// What an O_PATH descriptor names.
fn kind(fd: &OwnedFd) -> Found {
    match crate::sys::cached_owner_type(fd.as_raw_fd()) {
        Ok((uid, libc::S_IFREG, _)) => Found::File { uid },
        Ok((_, libc::S_IFBLK, rdev)) => Found::Block { dev: format!("{}:{}", libc::major(rdev), libc::minor(rdev)) },
        _ => Found::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A sysfs tree of block devices: (dev, its path under devices/,
    /// backing file or None, slaves' devs).
    fn sysfs(name: &str, devices: &[(&str, &str, Option<&str>, &[&str])]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("wb-owner-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("dev/block")).unwrap();
        for (dev, path, backing, slaves) in devices {
            let dir = root.join("devices").join(path);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("dev"), format!("{dev}\n")).unwrap();
            if path.contains('/') {
                fs::write(dir.join("partition"), "1\n").unwrap();
            }
            if let Some(file) = backing {
                fs::create_dir_all(dir.join("loop")).unwrap();
                fs::write(dir.join("loop/backing_file"), format!("{file}\n")).unwrap();
            }
            for slave in *slaves {
                let (_, spath, _, _) = devices.iter().find(|d| d.0 == *slave).unwrap();
                fs::create_dir_all(dir.join("slaves")).unwrap();
                symlink(root.join("devices").join(spath), dir.join("slaves").join(spath.replace('/', "_"))).unwrap();
            }
            symlink(Path::new("../..").join("devices").join(path), root.join("dev/block").join(dev)).unwrap();
        }
        root
    }

    #[test]
    fn the_owner_is_found_through_every_layer() {
        let root = sysfs(
            "layers",
            &[
                ("8:0", "sda", None, &[]),
                ("8:1", "sda/sda1", None, &[]),
                ("7:0", "loop0", Some("/var/lib/images/root.img"), &[]),
                ("7:1", "loop1", Some("/home/alice/disk.img"), &[]),
                ("7:2", "loop2", Some("/dev/loop1"), &[]),
                ("259:0", "loop1/loop1p1", None, &[]),
                ("254:0", "dm-0", None, &["7:1"]),
                ("254:1", "dm-1", None, &["8:1"]),
                ("254:2", "dm-2", None, &["254:0"]),
                ("7:3", "loop3", Some("/home/alice/gone.img (deleted)"), &[]),
            ],
        );
        let walk = |path: &str| match path {
            "/var/lib/images/root.img" => Found::File { uid: 0 },
            "/home/alice/disk.img" => Found::File { uid: 1000 },
            "/dev/loop1" => Found::Block { dev: "7:1".into() },
            _ => Found::Other,
        };
        let of = |dev| owner(&root, dev, &walk).unwrap();
        assert_eq!(of("8:0"), 0, "a disk");
        assert_eq!(of("8:1"), 0, "its partition");
        assert_eq!(of("7:0"), 0, "a loop device over root's image");
        assert_eq!(of("7:1"), 1000, "over alice's");
        assert_eq!(of("7:2"), 1000, "a loop device over alice's loop device");
        assert_eq!(of("259:0"), 1000, "a partition of alice's loop device");
        assert_eq!(of("254:0"), 1000, "dm-crypt over alice's loop device");
        assert_eq!(of("254:1"), 0, "dm over a disk's partition");
        assert_eq!(of("254:2"), 1000, "dm over dm over alice's loop device");
        assert_eq!(of("7:3"), UNKNOWN, "a deleted file is nobody's in particular");
        assert!(layered(&root, "7:0") && layered(&root, "259:0") && layered(&root, "254:1"));
        // Without a walk: what sysfs alone tells, and None where a loop
        // device's path is to be walked.
        let sysfs_only = |dev| owner(&root, dev, &|_: &str| Found::NotWalked);
        assert_eq!(sysfs_only("254:1"), Some(0), "dm over a disk's partition needs no walk");
        assert_eq!(sysfs_only("8:0"), Some(0));
        assert_eq!(sysfs_only("254:0"), None, "dm over a loop device");
        assert_eq!(sysfs_only("7:3"), None);
        // A loop device whose path sysfs would not render (too long).
        fs::write(root.join("devices/loop0/loop/backing_file"), "").unwrap();
        assert_eq!(of("7:0"), UNKNOWN, "an empty backing_file is nobody's in particular");
        fs::remove_file(root.join("devices/loop0/loop/backing_file")).unwrap();
        assert_eq!(of("7:0"), UNKNOWN, "an unreadable backing_file too");
        assert!(!layered(&root, "8:0") && !layered(&root, "8:1") && !layered(&root, "0:50"));
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_loop_over_itself_ends() {
        let root = sysfs("cycle", &[("7:5", "loop5", Some("/dev/loop5"), &[])]);
        assert_eq!(owner(&root, "7:5", &|_: &str| Found::Block { dev: "7:5".into() }), Some(UNKNOWN));
        let _ = fs::remove_dir_all(&root);
    }

    /// The walk follows no symlink, and takes no deleted file's name.
    #[test]
    fn the_backing_path_is_walked_without_symlinks() {
        let dir = std::env::temp_dir().join(format!("wb-walk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("images")).unwrap();
        fs::write(dir.join("images/disk.img"), b"x").unwrap();
        symlink("/etc/passwd", dir.join("images/old.img (deleted)")).unwrap();
        symlink("/etc/passwd", dir.join("images/link.img")).unwrap();
        symlink("/etc", dir.join("etc-link")).unwrap();
        let root = crate::sys::open_dir(&std::ffi::CString::new(dir.to_str().unwrap()).unwrap()).unwrap();
        let uid = unsafe { libc::geteuid() };
        assert_eq!(walk_from(&root, "/images/disk.img"), Found::File { uid });
        assert_eq!(walk_from(&root, "/images/old.img (deleted)"), Found::Other);
        assert_eq!(walk_from(&root, "/images/link.img"), Found::Other);
        assert_eq!(walk_from(&root, "/etc-link/passwd"), Found::Other);
        assert_eq!(walk_from(&root, "/images/../images/disk.img"), Found::Other);
        assert_eq!(walk_from(&root, "images/disk.img"), Found::Other);
        assert_eq!(walk_from(&root, "/images/none.img"), Found::Other);
        // From the cache alone: the same answers where the path is cached
        // (it was just walked), and never another.
        for path in
            ["/images/disk.img", "/images/old.img (deleted)", "/images/link.img", "/etc-link/passwd", "images/disk.img"]
        {
            let cached = walk_cached_from(&root, path);
            assert!(cached == walk_from(&root, path) || cached == Found::NotWalked, "{path}: {cached:?}");
        }
        assert_eq!(walk_cached_from(&root, "/images/disk.img"), Found::File { uid }, "a cached path is walked at once");
        let _ = fs::remove_dir_all(&dir);
    }
}
