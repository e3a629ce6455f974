//! Reaching a file after its writer closed it.
//!
//! tar and cp close small files long before the agent reads the event, so
//! the writer's fd is gone.  BPF reports what names the inode for good —
//! inode number, i_generation and (btrfs) the subvolume root — and the agent
//! opens it with open_by_handle_at(2).  Why handles rather than fanotify
//! FAN_CLOSE_WRITE: they reach exactly the inode the writer wrote (a reused
//! inode has a new generation, so its old handle is stale: ESTALE), they
//! cost nothing for other processes' closes, and they work at process exit.
//!
//! How a filesystem lays out its handles is not guessed: for each mount the
//! agent asks name_to_handle_at(2) for the handle of the mount's root, and
//! uses a layout only if it decodes that handle back to the root's inode.

use std::{
    collections::HashMap,
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::{counters::ErrorKind, sys};

/// What BPF read at close: enough to build the file's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedFile {
    /// The filesystem's device as mountinfo lists it: finds the mount.
    pub sb_dev: u64,
    /// The device stat(2) reports: checked after opening.
    pub st_dev: u64,
    pub ino: u64,
    pub generation: u32,
    pub fs_root: u64,
}

/// Handle layouts of the filesystems writebehindd knows (include/linux/exportfs.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// FILEID_INO32_GEN (1): u32 ino, u32 generation — ext2/3/4, xfs inode32.
    Ino32Gen,
    /// XFS with 64-bit inode numbers (0x81): u64 ino, u32 generation.
    XfsIno64Gen,
    /// FILEID_BTRFS_WITHOUT_PARENT (0x4d): u64 objectid, u64 root, u32 generation.
    Btrfs,
}

impl Layout {
    fn of_type(handle_type: i32) -> Option<Self> {
        match handle_type {
            1 => Some(Self::Ino32Gen),
            0x81 => Some(Self::XfsIno64Gen),
            0x4d => Some(Self::Btrfs),
            _ => None,
        }
    }

    fn handle_type(self) -> i32 {
        match self {
            Self::Ino32Gen => 1,
            Self::XfsIno64Gen => 0x81,
            Self::Btrfs => 0x4d,
        }
    }

    fn encode(self, f: &ClosedFile) -> Option<Vec<u8>> {
        let mut b = Vec::with_capacity(20);
        match self {
            Self::Ino32Gen => b.extend_from_slice(&u32::try_from(f.ino).ok()?.to_ne_bytes()),
            Self::XfsIno64Gen => b.extend_from_slice(&f.ino.to_ne_bytes()),
            Self::Btrfs => {
                b.extend_from_slice(&f.ino.to_ne_bytes());
                b.extend_from_slice(&f.fs_root.to_ne_bytes());
            }
        }
        b.extend_from_slice(&f.generation.to_ne_bytes());
        Some(b)
    }

    /// The inode number in a handle of this layout, if the bytes fit it.
    fn decode_ino(self, bytes: &[u8]) -> Option<u64> {
        let (len, ino) = match self {
            Self::Ino32Gen => (8, u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?) as u64),
            Self::XfsIno64Gen => (12, u64::from_ne_bytes(bytes.get(..8)?.try_into().ok()?)),
            Self::Btrfs => (20, u64::from_ne_bytes(bytes.get(..8)?.try_into().ok()?)),
        };
        (bytes.len() == len).then_some(ino)
    }
}

struct Mount {
    path: String,
    layout: Layout,
    /// stat(2)'s device of the mount root when learned: a root opened later
    /// with another device means the path no longer leads to this mount.
    root_dev: u64,
    /// btrfs: every subvolume mounted here, for events that lack theirs
    /// (see `open`).
    subvols: Vec<Subvol>,
    /// Open only while a batch is being flushed: an fd held on a filesystem
    /// makes umount fail with EBUSY.
    root: Option<OwnedFd>,
}

/// A mounted btrfs subvolume: its root objectid and the device stat(2)
/// reports for its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Subvol {
    id: u64,
    st_dev: u64,
}

/// Mounts by superblock device, learned on first use; None when a filesystem cannot be
/// reached by handle (not mounted here, unknown layout): remembered, logged once.
#[derive(Default)]
pub struct Handles {
    mounts: HashMap<u64, Option<Mount>>,
}

const MAX_HANDLE_SZ: usize = 128;

#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl Handles {
    /// Opens the closed file read-only, if it is still the inode BPF saw.
    pub fn open(&mut self, f: &ClosedFile) -> Result<OwnedFd, ErrorKind> {
        // A mount learned earlier whose path now leads elsewhere (unmounted,
        // or mounted over) is learned again, once.
        if let Some(Some(m)) = self.mounts.get_mut(&f.sb_dev)
            && m.root.is_none()
        {
            match open_dir(&m.path).ok().filter(|r| sys::fstat(r.as_raw_fd()).is_ok_and(|st| st.st_dev == m.root_dev)) {
                Some(root) => m.root = Some(root),
                None => {
                    self.mounts.remove(&f.sb_dev);
                }
            }
        }
        let mount = self.mounts.entry(f.sb_dev).or_insert_with(|| learn(f.sb_dev));
        let Some(mount) = mount else {
            return Err(ErrorKind::NoHandle);
        };
        if mount.root.is_none() {
            mount.root = Some(open_dir(&mount.path).map_err(|_| ErrorKind::NoHandle)?);
        }
        let root = mount.root.as_ref().expect("opened above");
        // BPF reads the subvolume of a btrfs inode through btrfs_inode's
        // BTF, which kernels with btrfs as a module (Debian's) keep in the
        // module's BTF, out of CO-RE's reach: then fs_root is 0 and st_dev
        // is the superblock's.  Each mounted subvolume is tried in turn;
        // one holding no such inode answers ESTALE.  The check after
        // opening cannot tell the subvolumes apart here: an inode of the
        // same number and generation in another mounted subvolume (made
        // in the same transaction) would be flushed instead, early
        // writeback of someone's data, nothing worse.
        let guesses: Vec<ClosedFile> = match (mount.layout, f.fs_root) {
            (Layout::Btrfs, 0) => {
                mount.subvols.iter().map(|s| ClosedFile { fs_root: s.id, st_dev: s.st_dev, ..*f }).collect()
            }
            _ => vec![*f],
        };
        let mut err = ErrorKind::NoHandle;
        for g in &guesses {
            match open_handle(root, mount.layout, g) {
                Ok(file) => return Ok(file),
                Err(e) => err = e,
            }
        }
        Err(err)
    }

    /// Closes the mount roots opened for a batch.
    pub fn release(&mut self) {
        for m in self.mounts.values_mut().flatten() {
            m.root = None;
        }
    }
}

/// Opens `f` by handle through the mount whose root is `root`, and checks
/// it is the inode BPF saw.
fn open_handle(root: &OwnedFd, layout: Layout, f: &ClosedFile) -> Result<OwnedFd, ErrorKind> {
    let bytes = layout.encode(f).ok_or(ErrorKind::NoHandle)?;
    let mut h = FileHandle {
        handle_bytes: bytes.len() as u32,
        handle_type: layout.handle_type(),
        f_handle: [0; MAX_HANDLE_SZ],
    };
    h.f_handle[..bytes.len()].copy_from_slice(&bytes);
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = unsafe { libc::syscall(libc::SYS_open_by_handle_at, root.as_raw_fd(), &mut h as *mut FileHandle, flags) };
    if fd < 0 {
        return Err(match io::Error::last_os_error().raw_os_error() {
            Some(libc::ESTALE) | Some(libc::ENOENT) => ErrorKind::FileGone,
            Some(libc::EPERM) | Some(libc::EACCES) => ErrorKind::Permission,
            _ => ErrorKind::Other,
        });
    }
    let file = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let st = sys::fstat(file.as_raw_fd()).map_err(|_| ErrorKind::Other)?;
    if st.st_ino != f.ino || st.st_dev != f.st_dev || (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
        return Err(ErrorKind::IdentityMismatch);
    }
    Ok(file)
}

fn open_dir(path: &str) -> io::Result<OwnedFd> {
    let cpath = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Finds where sb_dev is mounted and which handle layout its filesystem uses.
fn learn(sb_dev: u64) -> Option<Mount> {
    let dev = format!("{}:{}", libc::major(sb_dev), libc::minor(sb_dev));
    let paths = mount_points(&dev);
    if paths.is_empty() {
        tracing::warn!(%dev, "filesystem not mounted in the daemon's namespace: closed files there are left to the kernel");
        return None;
    }
    let mut learned: Option<Mount> = None;
    for path in paths {
        let Some((layout, root_dev, subvol)) = probe(&path, sb_dev) else { continue };
        match &mut learned {
            None => learned = Some(Mount { path, layout, root_dev, subvols: subvol.into_iter().collect(), root: None }),
            Some(m) => m.subvols.extend(subvol.filter(|s| !m.subvols.contains(s))),
        }
        // Other filesystems need one mount; btrfs, every mounted subvolume.
        if layout != Layout::Btrfs {
            break;
        }
    }
    let m = learned?;
    let subvols: Vec<u64> = m.subvols.iter().map(|s| s.id).collect();
    tracing::info!(mount = %m.path, layout = ?m.layout, ?subvols, "closed files on this filesystem are reached by file handle");
    Some(m)
}

/// The handle layout of the filesystem `sb_dev` mounted at `path`, its
/// root's device and (btrfs) subvolume; None, logged, if it cannot be used.
fn probe(path: &str, sb_dev: u64) -> Option<(Layout, u64, Option<Subvol>)> {
    let root = match open_dir(path) {
        Ok(root) => root,
        Err(e) => {
            tracing::warn!(mount = %path, error = %e, "cannot open mount root: closed files there are left to the kernel");
            return None;
        }
    };
    let mut h = FileHandle { handle_bytes: MAX_HANDLE_SZ as u32, handle_type: 0, f_handle: [0; MAX_HANDLE_SZ] };
    let mut mount_id = 0;
    let empty = CString::new("").unwrap();
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            root.as_raw_fd(),
            empty.as_ptr(),
            &mut h as *mut FileHandle,
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    let root_st = sys::fstat(root.as_raw_fd()).ok()?;
    let layout = (r == 0)
        .then(|| Layout::of_type(h.handle_type))
        .flatten()
        .filter(|l| l.decode_ino(&h.f_handle[..h.handle_bytes as usize]) == Some(root_st.st_ino));
    let Some(layout) = layout else {
        tracing::warn!(mount = %path, handle_type = h.handle_type, "unknown file handle layout: closed files there are left to the kernel");
        return None;
    };
    // A path mounted over (ProtectHome=tmpfs) leads to another filesystem,
    // through which this one's handles would open nothing.  btrfs reports
    // a device per subvolume: its type has to do.
    let same = match layout {
        Layout::Btrfs => {
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::fstatfs(root.as_raw_fd(), &mut fs) };
            r == 0 && fs.f_type == libc::BTRFS_SUPER_MAGIC
        }
        _ => root_st.st_dev == sb_dev,
    };
    if !same {
        tracing::info!(mount = %path, "another filesystem is mounted over this mount point");
        return None;
    }
    let subvol = (layout == Layout::Btrfs)
        .then(|| h.f_handle[8..16].try_into().ok().map(u64::from_ne_bytes))
        .flatten()
        .map(|id| Subvol { id, st_dev: root_st.st_dev });
    Some((layout, root_st.st_dev, subvol))
}

/// Where the filesystem with device "major:minor" is mounted, a mount of
/// its root first.  Mounts of a subdirectory or (btrfs) of a subvolume
/// serve too: a handle names an inode of the whole filesystem, and with
/// CAP_DAC_READ_SEARCH open_by_handle_at(2) opens it through any mount of
/// it, inside the mount's subtree or not (the subtree check applies to
/// callers without the capability).  Fedora, openSUSE and Ubuntu mount
/// btrfs only as subvolumes (subvol=root, subvol=@home).  The open is
/// read-only and checked against (st_dev, ino), so reaching a file outside
/// the mounted subtree shows the daemon nothing it could not open anyway.
fn mount_points(dev: &str) -> Vec<String> {
    let mut mounts: Vec<_> = crate::sys::mounts().into_iter().filter(|m| m.dev == dev).collect();
    mounts.sort_by_key(|m| m.root != "/");
    mounts.into_iter().map(|m| m.mount_point).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip() {
        let f = ClosedFile { sb_dev: 0, st_dev: 0, ino: 4242, generation: 7, fs_root: 5 };
        for l in [Layout::Ino32Gen, Layout::XfsIno64Gen, Layout::Btrfs] {
            let b = l.encode(&f).unwrap();
            assert_eq!(l.decode_ino(&b), Some(4242), "{l:?}");
            assert_eq!(Layout::of_type(l.handle_type()), Some(l));
        }
        // A 64-bit inode number has no 32-bit handle.
        assert!(Layout::Ino32Gen.encode(&ClosedFile { ino: 1 << 40, ..f }).is_none());
    }

    #[test]
    fn finds_the_root_mount() {
        // Whatever / is mounted from, mountinfo names it.
        let st = std::fs::metadata("/").unwrap();
        use std::os::unix::fs::MetadataExt;
        let dev = format!("{}:{}", libc::major(st.dev()), libc::minor(st.dev()));
        assert_eq!(mount_points(&dev).first().map(String::as_str), Some("/"));
    }
}
