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
//!
//! Filesystems without file handles (exFAT: no export operations) answer
//! name_to_handle_at(2) with EOPNOTSUPP.  For them BPF sends the file's
//! path beneath the mount it was written through, and the agent looks it
//! up beneath each mount of that filesystem (sys::open_beneath): confined
//! to the mount, O_PATH, and checked against (st_dev, ino) before the
//! file is opened.

use std::{
    collections::HashMap,
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::{abi::RelPath, counters::ErrorKind, status::printable, sys};

/// What BPF read at close: enough to build the file's handle, or to look
/// it up by path where there are no handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedFile {
    /// The filesystem's device as mountinfo lists it: finds the mount.
    pub sb_dev: u64,
    /// The device stat(2) reports: checked after opening.
    pub st_dev: u64,
    pub ino: u64,
    pub generation: u32,
    pub fs_root: u64,
    /// s_magic: with sb_dev, which filesystem.  A stick swapped for another
    /// or formatted anew gets the same device number with another
    /// filesystem (measured in the guest: ntfs3 made where exFAT was
    /// inherited exFAT's "no handles", and none of its closed files was
    /// reached).
    pub fs_magic: u32,
    /// Beneath the mount it was written through; only on filesystems
    /// without file handles (WB_EV_CLOSE_PATH).
    pub path: Option<RelPath>,
}

/// How a closed file was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    ByHandle,
    ByPath,
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
            // ext2/3/4 decode a handle of generation 0 without checking it,
            // and a file's owner can set that (FS_IOC_SETVERSION): such a
            // handle would name whatever inode later takes the number.
            // Generations are random, so a file that has 0 by chance is one
            // in 2^32, left to the kernel.
            Self::Ino32Gen if f.generation == 0 => return None,
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

/// A filesystem as the agent reaches it.
struct Mount {
    /// None: no file handles (exFAT); files are looked up by path.
    layout: Option<Layout>,
    /// Where it is mounted: one mount for handles (any mount reaches every
    /// inode); every usable one for paths, which are relative to the mount
    /// the file was written through, and the agent cannot tell which.
    points: Vec<Point>,
    /// btrfs: every subvolume mounted here, for events that lack theirs
    /// (see `open`).
    subvols: Vec<Subvol>,
}

struct Point {
    path: String,
    /// stat(2)'s device of the mount root when learned: a root opened later
    /// with another device means the path no longer leads to this mount.
    root_dev: u64,
    /// Open only while a batch is being flushed: an fd held on a filesystem
    /// makes umount fail with EBUSY.
    root: Option<OwnedFd>,
}

impl Point {
    /// Opens the root for this batch; false when the path now leads elsewhere.
    fn open_root(&mut self) -> bool {
        if self.root.is_none() {
            self.root = open_dir(&self.path)
                .ok()
                .filter(|r| sys::fstat(r.as_raw_fd()).is_ok_and(|st| st.st_dev == self.root_dev));
        }
        self.root.is_some()
    }
}

/// A mounted btrfs subvolume: its root objectid and the device stat(2)
/// reports for its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Subvol {
    id: u64,
    st_dev: u64,
}

/// Mounts by superblock device and s_magic, learned on first use; None when a filesystem cannot be
/// reached by handle (not mounted here, unknown layout): remembered, logged once.
#[derive(Default)]
pub struct Handles {
    mounts: HashMap<(u64, u32), Option<Mount>>,
}

const MAX_HANDLE_SZ: usize = 128;

#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl Handles {
    /// Opens the closed file read-only, if it is still the inode BPF saw,
    /// and says how it was reached.
    pub fn open(&mut self, f: &ClosedFile) -> Result<(OwnedFd, Reached), ErrorKind> {
        // A mount learned earlier whose path now leads elsewhere (unmounted,
        // or mounted over) is learned again, once.
        let key = (f.sb_dev, f.fs_magic);
        if let Some(Some(m)) = self.mounts.get_mut(&key)
            && !m.points.iter_mut().all(Point::open_root)
        {
            self.mounts.remove(&key);
        }
        let mount = self.mounts.entry(key).or_insert_with(|| learn(f.sb_dev));
        let Some(mount) = mount else {
            return Err(ErrorKind::NoHandle);
        };
        if !mount.points.iter_mut().all(Point::open_root) {
            return Err(ErrorKind::NoHandle);
        }
        match mount.layout {
            Some(layout) => by_handle(mount, layout, f).map(|file| (file, Reached::ByHandle)),
            None => by_path(mount, f).map(|file| (file, Reached::ByPath)),
        }
    }

    /// Closes the mount roots opened for a batch.
    pub fn release(&mut self) {
        for p in self.mounts.values_mut().flatten().flat_map(|m| &mut m.points) {
            p.root = None;
        }
    }
}

/// `f` opened by handle through the mount's first point.
fn by_handle(mount: &Mount, layout: Layout, f: &ClosedFile) -> Result<OwnedFd, ErrorKind> {
    let root = mount.points[0].root.as_ref().expect("opened by the caller");
    // BPF reads the subvolume of a btrfs inode through btrfs_inode's
    // BTF, which kernels with btrfs as a module (Debian's) keep in the
    // module's BTF, out of CO-RE's reach: then fs_root is 0 and st_dev
    // is the superblock's.  Each mounted subvolume is tried in turn;
    // one holding no such inode answers ESTALE.  The check after
    // opening cannot tell the subvolumes apart here: an inode of the
    // same number and generation in another mounted subvolume (made
    // in the same transaction) would be flushed instead, early
    // writeback of someone's data, nothing worse.
    let guesses: Vec<ClosedFile> = match (layout, f.fs_root) {
        (Layout::Btrfs, 0) => {
            mount.subvols.iter().map(|s| ClosedFile { fs_root: s.id, st_dev: s.st_dev, ..f.clone() }).collect()
        }
        _ => vec![f.clone()],
    };
    let mut err = ErrorKind::NoHandle;
    for g in &guesses {
        match open_handle(root, layout, g) {
            Ok(file) => return Ok(file),
            Err(e) => err = e,
        }
    }
    Err(err)
}

/// `f` looked up by its path beneath each mount of its filesystem in turn:
/// the path is relative to the mount it was written through (a bind mount
/// of a directory, say), and a lookup beneath another mount finds nothing
/// or another file, which the identity check refuses.  Without a path
/// (deeper than BPF sends, an unreadable name) it cannot be reached.
fn by_path(mount: &Mount, f: &ClosedFile) -> Result<OwnedFd, ErrorKind> {
    let rel = f.path.as_ref().ok_or(ErrorKind::NoHandle)?;
    let expect = sys::FileId { dev: f.st_dev, ino: f.ino };
    let mut err = ErrorKind::NoHandle;
    for (root, root_dev) in mount.points.iter().filter_map(|p| Some((p.root.as_ref()?, p.root_dev))) {
        match sys::open_beneath(root, root_dev, rel, expect) {
            Ok(file) => return Ok(file),
            Err(e) => err = e,
        }
    }
    Err(err)
}

/// Opens `f` by handle through the mount whose root is `root`: O_PATH
/// first, which calls no filesystem's or driver's open, and read-only only
/// if that is the regular file BPF saw (a FIFO or device node that took
/// the inode's place is never opened).
fn open_handle(root: &OwnedFd, layout: Layout, f: &ClosedFile) -> Result<OwnedFd, ErrorKind> {
    let bytes = layout.encode(f).ok_or(ErrorKind::NoHandle)?;
    let mut h = FileHandle {
        handle_bytes: bytes.len() as u32,
        handle_type: layout.handle_type(),
        f_handle: [0; MAX_HANDLE_SZ],
    };
    h.f_handle[..bytes.len()].copy_from_slice(&bytes);
    let flags = libc::O_PATH | libc::O_CLOEXEC;
    let fd = unsafe { libc::syscall(libc::SYS_open_by_handle_at, root.as_raw_fd(), &mut h as *mut FileHandle, flags) };
    if fd < 0 {
        return Err(sys::error_kind(&io::Error::last_os_error()));
    }
    let handle = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    sys::reopen_checked(&handle, sys::FileId { dev: f.st_dev, ino: f.ino })
}

fn open_dir(path: &str) -> io::Result<OwnedFd> {
    let cpath = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Finds where sb_dev is mounted and which handle layout its filesystem
/// uses, if any.
fn learn(sb_dev: u64) -> Option<Mount> {
    let dev = format!("{}:{}", libc::major(sb_dev), libc::minor(sb_dev));
    let mounts = mounts_of(&dev);
    if mounts.is_empty() {
        tracing::warn!(%dev, "filesystem not mounted in the daemon's namespace: closed files there are left to the kernel");
        return None;
    }
    let mut learned: Option<Mount> = None;
    for info in mounts {
        let Some(p) = probe(&info.mount_point, sb_dev) else { continue };
        if p.layout.is_none() {
            tracing::info!(
                "no file handles on {} at {}: closed files reached by path",
                printable(&info.fstype),
                printable(&info.mount_point)
            );
        }
        match &mut learned {
            None => {
                learned =
                    Some(Mount { layout: p.layout, points: vec![p.point], subvols: p.subvol.into_iter().collect() })
            }
            Some(m) if m.layout.is_none() && p.layout.is_none() => m.points.push(p.point),
            Some(m) => m.subvols.extend(p.subvol.filter(|s| !m.subvols.contains(s))),
        }
        // A handle reaches every inode through one mount; btrfs needs every
        // mounted subvolume, paths every mount.
        if learned.as_ref().is_some_and(|m| m.layout.is_some_and(|l| l != Layout::Btrfs)) {
            break;
        }
    }
    let m = learned?;
    if let Some(layout) = m.layout {
        let subvols: Vec<u64> = m.subvols.iter().map(|s| s.id).collect();
        tracing::info!(mount = %printable(&m.points[0].path), ?layout, ?subvols, "closed files on this filesystem are reached by file handle");
    }
    Some(m)
}

/// What probing one mount found.
struct Probe {
    /// None: the filesystem has no file handles (EOPNOTSUPP).
    layout: Option<Layout>,
    point: Point,
    /// btrfs: the subvolume mounted there.
    subvol: Option<Subvol>,
}

/// The handle layout of the filesystem `sb_dev` mounted at `path` (or that
/// it has none), its root's device and (btrfs) subvolume; None, logged, if
/// it cannot be used.
fn probe(path: &str, sb_dev: u64) -> Option<Probe> {
    let root = match open_dir(path) {
        Ok(root) => root,
        Err(e) => {
            tracing::warn!(mount = %printable(path), error = %e, "cannot open mount root: closed files there are left to the kernel");
            return None;
        }
    };
    let root_st = sys::fstat(root.as_raw_fd()).ok()?;
    let handle = root_handle(&root);
    let layout = match &handle {
        Ok(h) => Some(
            Layout::of_type(h.handle_type)
                .filter(|l| l.decode_ino(&h.f_handle[..h.handle_bytes as usize]) == Some(root_st.st_ino))
                .or_else(|| {
                    tracing::warn!(mount = %printable(path), handle_type = h.handle_type, "unknown file handle layout: closed files there are left to the kernel");
                    None
                })?,
        ),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => None,
        Err(e) => {
            tracing::warn!(mount = %printable(path), error = %e, "no file handle for the mount root: closed files there are left to the kernel");
            return None;
        }
    };
    // A path mounted over (ProtectHome=tmpfs) leads to another filesystem,
    // through which this one's handles would open nothing.  btrfs reports
    // a device per subvolume: its type has to do.
    let same = match layout {
        Some(Layout::Btrfs) => {
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::fstatfs(root.as_raw_fd(), &mut fs) };
            r == 0 && fs.f_type == libc::BTRFS_SUPER_MAGIC
        }
        _ => root_st.st_dev == sb_dev,
    };
    if !same {
        tracing::info!(mount = %printable(path), "another filesystem is mounted over this mount point");
        return None;
    }
    let subvol = (layout == Some(Layout::Btrfs))
        .then(|| handle.ok()?.f_handle[8..16].try_into().ok().map(u64::from_ne_bytes))
        .flatten()
        .map(|id| Subvol { id, st_dev: root_st.st_dev });
    Some(Probe { layout, point: Point { path: path.to_owned(), root_dev: root_st.st_dev, root: None }, subvol })
}

/// name_to_handle_at(2) of a mount's root.
fn root_handle(root: &OwnedFd) -> io::Result<FileHandle> {
    let mut h = FileHandle { handle_bytes: MAX_HANDLE_SZ as u32, handle_type: 0, f_handle: [0; MAX_HANDLE_SZ] };
    let mut mount_id = 0;
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            root.as_raw_fd(),
            c"".as_ptr(),
            &mut h as *mut FileHandle,
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(h)
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
/// A path, on a filesystem without handles, is tried beneath each.
/// In a container (`sys::MountTable::Init`), the mounts of its own
/// namespace first (a volume of the host's), then init's, reached through
/// /proc/1/root.
fn mounts_of(dev: &str) -> Vec<sys::MountInfo> {
    let of = |table: sys::MountTable| {
        let mut mounts: Vec<_> = sys::mounts_in(table).into_iter().filter(|m| m.dev == dev).collect();
        mounts.sort_by_key(|m| m.root != "/");
        for m in &mut mounts {
            m.mount_point = table.reachable(&m.mount_point);
        }
        mounts
    };
    let mut mounts = of(sys::MountTable::Own);
    if sys::mount_table() == sys::MountTable::Init {
        mounts.extend(of(sys::MountTable::Init));
    }
    mounts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip() {
        let f = ClosedFile { sb_dev: 0, st_dev: 0, ino: 4242, generation: 7, fs_root: 5, fs_magic: 0, path: None };
        for l in [Layout::Ino32Gen, Layout::XfsIno64Gen, Layout::Btrfs] {
            let b = l.encode(&f).unwrap();
            assert_eq!(l.decode_ino(&b), Some(4242), "{l:?}");
            assert_eq!(Layout::of_type(l.handle_type()), Some(l));
        }
        // A 64-bit inode number has no 32-bit handle.
        assert!(Layout::Ino32Gen.encode(&ClosedFile { ino: 1 << 40, ..f.clone() }).is_none());
    }

    /// A filesystem without handles is tried beneath each of its mounts:
    /// here two directories standing for them, the file beneath the second.
    #[test]
    fn by_path_tries_each_mount() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("wb-by-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/d")).unwrap();
        std::fs::create_dir_all(dir.join("b/d")).unwrap();
        std::fs::write(dir.join("a/d/f"), b"another file of that name").unwrap();
        std::fs::write(dir.join("b/d/f"), b"the one").unwrap();
        let m = std::fs::metadata(dir.join("b/d/f")).unwrap();
        let point = |p: &str| Point { path: dir.join(p).to_string_lossy().into_owned(), root_dev: m.dev(), root: None };
        let mut mount = Mount { layout: None, points: vec![point("a"), point("b")], subvols: Vec::new() };
        assert!(mount.points.iter_mut().all(Point::open_root));
        let path = Some(RelPath::from(c"d/f"));
        let f = ClosedFile { sb_dev: 0, st_dev: m.dev(), ino: m.ino(), generation: 0, fs_root: 0, fs_magic: 0, path };
        let got = std::fs::File::from(by_path(&mount, &f).expect("beneath b")).metadata().unwrap();
        assert_eq!(got.ino(), m.ino());
        // No path (too deep for BPF): unreachable, counted as no_handle.
        assert_eq!(by_path(&mount, &ClosedFile { path: None, ..f.clone() }).unwrap_err(), ErrorKind::NoHandle);
        // Gone beneath every mount.
        std::fs::remove_file(dir.join("b/d/f")).unwrap();
        assert_eq!(by_path(&mount, &f).unwrap_err(), ErrorKind::FileGone);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_the_root_mount() {
        // Whatever / is mounted from, mountinfo names it.
        let st = std::fs::metadata("/").unwrap();
        use std::os::unix::fs::MetadataExt;
        let dev = format!("{}:{}", libc::major(st.dev()), libc::minor(st.dev()));
        assert_eq!(mounts_of(&dev).first().map(|m| m.mount_point.as_str()), Some("/"));
    }
}
