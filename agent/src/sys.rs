//! Thin, safe wrappers over the syscalls the agent needs; the mount
//! tables in `mounts`.

mod mounts;
pub use mounts::*;

use std::{
    ffi::{CStr, CString},
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use crate::counters::ErrorKind;

/// The identity of a file as fstat(2) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// What a failed lookup or open of a file means for the agent: the file
/// is gone (ESTALE: a handle to an inode since freed), or access was refused.
pub fn error_kind(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESTALE) => ErrorKind::FileGone,
        Some(libc::EPERM) | Some(libc::EACCES) => ErrorKind::Permission,
        _ => ErrorKind::Other,
    }
}

/// What a failed pidfd_open means for the agent.
pub fn pidfd_error(e: io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ESRCH) => ErrorKind::ProcessGone,
        _ => error_kind(&e),
    }
}

/// True once the process behind pidfd has exited (its pidfd polls readable).
pub fn pidfd_exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Whether process `pid` still exists (a zombie does, until reaped).
pub fn process_exists(pid: u32) -> bool {
    // Signal 0 checks only: EPERM means it exists and is not ours.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    alive || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Opens, read-only, the file that process `pid` has open as `fd`, and
/// returns it only if it is the regular file `expect`.  Nothing else is
/// opened, not even for a moment.
///
/// The writer decides what its fd names between the event and this call: it
/// can dup2 an O_PATH descriptor of anything it can look up there — a device
/// node whose open has side effects, a FIFO, a file on a FUSE or network
/// mount whose open never returns.  So the file is first reached with
/// O_PATH, which calls no driver's or filesystem's open (no IN_OPEN either),
/// and identified by statx(AT_STATX_DONT_SYNC), which reads the inode in
/// memory and asks no FUSE server or NFS server.  Only then is that O_PATH
/// descriptor, which names the checked inode whatever the writer does now,
/// reopened for reading through /proc/self/fd.
///
/// Why not keep the writer's own `struct file` (pidfd_getfd)?  A duplicate
/// keeps the writer's writable open alive after the writer closes it: its
/// flock stays held, its offset is shared, and execve of the file fails with
/// ETXTBSY until the duplicate is closed — even a few microseconds of holding
/// it races with "write, close, exec".  The pidfd, taken before and checked
/// after, fences pid reuse.
pub fn open_writer_file(pid: u32, fd: i32, pidfd: &OwnedFd, expect: FileId) -> Result<OwnedFd, ErrorKind> {
    let path = CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(error_kind(&io::Error::last_os_error()));
    }
    let handle = unsafe { OwnedFd::from_raw_fd(raw) };
    if pidfd_exited(pidfd) {
        return Err(ErrorKind::ProcessGone);
    }
    reopen_checked(&handle, expect)
}

/// Opens read-only the file that the O_PATH descriptor `handle` names, if
/// it is the regular file `expect`; nothing else is ever opened.  The
/// identity is read from the inode in memory (see `open_writer_file`),
/// and the reopen through /proc/self/fd opens that very inode, whatever
/// has happened to its path since.
pub fn reopen_checked(handle: &OwnedFd, expect: FileId) -> Result<OwnedFd, ErrorKind> {
    let id = cached_identity(handle.as_raw_fd()).map_err(|e| {
        tracing::debug!(error = %e, "statx of an O_PATH descriptor");
        ErrorKind::Other
    })?;
    if id != (expect, libc::S_IFREG) {
        tracing::debug!(?id, ?expect, "not the file the event was about");
        return Err(ErrorKind::IdentityMismatch);
    }
    let reopen = CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd())).unwrap();
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    let raw = unsafe { libc::open(reopen.as_ptr(), flags) };
    if raw < 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "reopening an O_PATH descriptor");
        return Err(ErrorKind::Other);
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Opens read-only the regular file `expect` at `rel` beneath the
/// directory `root` (a mount's root), for filesystems without file
/// handles.  The path came from BPF, read at close: the file may have been
/// renamed since and something else put there — a symlink out of the
/// mount, a FIFO, a device node, another user's file.  So the path is
/// walked one plain name at a time ("", "." and ".." refused), each step
/// O_PATH|O_NOFOLLOW (no filesystem's or driver's open is called, no
/// symlink followed: one on the way fails O_DIRECTORY, the last one is the
/// link itself, refused as not a regular file), and a directory on another
/// device (a FUSE mount on a directory of the stick) ends the walk before
/// anything is looked up in it.  Then `reopen_checked`.
///
/// Not openat2(RESOLVE_BENEATH): under Debian 12's systemd 252 the unit's
/// system-call filter answers it with ENOSYS, named in the filter or not
/// (measured in the guest: 0 of 16 closed files on exFAT reached).
///
/// `root_dev` is the root's device, as the caller checked it when it
/// opened the root (not asked again per file).
pub fn open_beneath(root: &OwnedFd, root_dev: u64, rel: &CStr, expect: FileId) -> Result<OwnedFd, ErrorKind> {
    let Some((last, dirs)) = plain_names(rel.to_bytes()) else {
        tracing::debug!(path = ?rel, "not a plain relative path");
        return Err(ErrorKind::Other);
    };
    let mut dir: Option<OwnedFd> = None;
    for name in dirs {
        let next = path_at(dir.as_ref().unwrap_or(root), name, libc::O_DIRECTORY)?;
        if cached_identity(next.as_raw_fd()).map_err(|e| error_kind(&e))?.0.dev != root_dev {
            tracing::debug!(path = ?rel, "a mount point on the way");
            return Err(ErrorKind::Other);
        }
        dir = Some(next);
    }
    reopen_checked(&path_at(dir.as_ref().unwrap_or(root), last, 0)?, expect)
}

/// The names of a relative path, the last apart; None if one is "", "."
/// or "..".
fn plain_names(rel: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let mut names: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    if names.iter().any(|n| n.is_empty() || *n == b"." || *n == b"..") {
        return None;
    }
    let last = names.pop()?;
    Some((last, names))
}

/// What `rel` names beneath the directory `root`, reached as open_beneath
/// walks (one plain name at a time, O_PATH|O_NOFOLLOW: no symlink followed,
/// no filesystem's or driver's open called), except that mount points are
/// crossed.  The last name is opened as itself, a symlink included.
pub fn walk_plain(root: &OwnedFd, rel: &[u8]) -> Option<OwnedFd> {
    let (last, dirs) = plain_names(rel)?;
    let mut dir: Option<OwnedFd> = None;
    for name in dirs {
        dir = Some(path_at(dir.as_ref().unwrap_or(root), name, libc::O_DIRECTORY).ok()?);
    }
    path_at(dir.as_ref().unwrap_or(root), last, 0).ok()
}

/// What `rel` names beneath the directory `root`, as `walk_plain` would
/// find it, from the dentry cache alone: openat2 with RESOLVE_CACHED (5.12
/// and later) asks no filesystem and triggers no automount, so a thread
/// that must never wait may ask it.  No symlink nor magic link is followed
/// (the last name is opened as itself, O_PATH|O_NOFOLLOW).  Err(None): not
/// all of the path is cached, or openat2 is refused (Debian 12's systemd
/// 252 answers ENOSYS in the unit, see open_beneath): it is to be walked.
/// Err(Some): what the cache says for sure (no such name, a symlink).
pub fn open_cached(root: &OwnedFd, rel: &[u8]) -> Result<OwnedFd, Option<io::Error>> {
    /// struct open_how (libc's is not to be built outside it).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    if plain_names(rel).is_none() {
        return Err(Some(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let path = CString::new(rel).map_err(|_| Some(io::Error::from_raw_os_error(libc::EINVAL)))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_CACHED,
    };
    let raw = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)).then_some(e));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}

/// A directory opened O_PATH (nothing of it read).
pub fn open_dir(path: &CStr) -> io::Result<OwnedFd> {
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `name` in `dir`, opened O_PATH|O_NOFOLLOW (plus `flags`).
fn path_at(dir: &OwnedFd, name: &[u8], flags: i32) -> Result<OwnedFd, ErrorKind> {
    let cname = CString::new(name).map_err(|_| ErrorKind::Other)?;
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC | flags;
    let raw = unsafe { libc::openat(dir.as_raw_fd(), cname.as_ptr(), flags) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        tracing::debug!(name = ?cname, error = %e, "not found beneath the mount");
        return Err(error_kind(&e));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// (dev, ino) and file type of an open file, from the inode in memory:
/// AT_STATX_DONT_SYNC keeps FUSE and network filesystems from being asked.
pub fn cached_identity(fd: RawFd) -> io::Result<(FileId, libc::mode_t)> {
    cached_statx(fd, c"", libc::AT_EMPTY_PATH)
}

/// (dev, ino) and file type of what `path` beneath `dirfd` names (or `dirfd`
/// itself, with AT_EMPTY_PATH), read from the inode in memory.
fn cached_statx(dirfd: RawFd, path: &CStr, flags: i32) -> io::Result<(FileId, libc::mode_t)> {
    let stx = statx_in_memory(dirfd, path, flags, libc::STATX_TYPE | libc::STATX_INO)?;
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    Ok((FileId { dev, ino: stx.stx_ino }, stx.stx_mode as libc::mode_t & libc::S_IFMT))
}

/// Owner, file type and (a device node's) device number of an open file,
/// from the inode in memory (AT_STATX_DONT_SYNC: no FUSE or NFS server is
/// asked).
pub fn cached_owner_type(fd: RawFd) -> io::Result<(u32, libc::mode_t, u64)> {
    let stx = statx_in_memory(fd, c"", libc::AT_EMPTY_PATH, libc::STATX_TYPE | libc::STATX_UID)?;
    let rdev = libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
    Ok((stx.stx_uid, stx.stx_mode as libc::mode_t & libc::S_IFMT, rdev))
}

/// statx(2) with AT_STATX_DONT_SYNC: the fields in `mask` as the inode in
/// memory has them, which no FUSE or network filesystem is asked for.
fn statx_in_memory(dirfd: RawFd, path: &CStr, flags: i32, mask: u32) -> io::Result<libc::statx> {
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    if unsafe { libc::statx(dirfd, path.as_ptr(), flags | libc::AT_STATX_DONT_SYNC, mask, &mut stx) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stx)
}

/// Pages of [start, end) of an open file under writeback, from cachestat(2)
/// (Linux 6.5; syscall 451 on every architecture): it reads the page cache
/// and asks no server.  None where the kernel has no cachestat or refuses it
/// (a seccomp filter that predates it answers EPERM).
pub fn under_writeback(fd: RawFd, start: u64, end: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: start, len: end.saturating_sub(start).max(1) };
    // struct cachestat: nr_cache, nr_dirty, nr_writeback, nr_evicted,
    // nr_recently_evicted.
    let mut stat = [0u64; 5];
    // SAFETY: both are the kernel's layout and outlive the call.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, fd, &range as *const Range, stat.as_mut_ptr(), 0) };
    (r == 0).then_some(stat[2])
}

/// Files waiting for `close_aside`'s thread at most; past them, a file is
/// closed where it is given up, as without the thread.
const CLOSE_QUEUE: usize = 64;

/// Closes `file` on a thread of its own: the last close of a file already
/// unlinked or replaced frees it, which on a disk waits for its writeback
/// (pacing's journal, write_journal).
pub fn close_aside(file: std::fs::File) {
    use std::sync::{
        OnceLock,
        mpsc::{SyncSender, sync_channel},
    };
    static CLOSER: OnceLock<Option<SyncSender<std::fs::File>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = sync_channel::<std::fs::File>(CLOSE_QUEUE);
        std::thread::Builder::new().name("wb-close".into()).spawn(move || rx.into_iter().for_each(drop)).ok()?;
        Some(tx)
    });
    if let Some(tx) = closer {
        // Full or gone: the file comes back in the error, closed here.
        let _ = tx.try_send(file);
    }
}

/// Opens (or creates) one of the daemon's own files under /run, readable
/// and writable by root alone whatever the umask: a foreground run or a
/// `--restore` by hand under umask 022 made a world-readable lock, which
/// any user could open and `flock`, refusing every start and every
/// restore.  Its directory is made root's (0755) too: one that others
/// could write (umask 0) would let them swap a journal for a symlink.
pub fn private_file(path: &Path, opts: &mut std::fs::OpenOptions) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
        let meta = std::fs::symlink_metadata(dir)?;
        if meta.permissions().mode() & 0o022 != 0
            && std::os::unix::fs::MetadataExt::uid(&meta) == unsafe { libc::geteuid() }
        {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    let file = opts.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Whether process `pid` still has the file `id` open as `fd`: a statx of
/// /proc/<pid>/fd/<fd>, which procfs resolves to the open file itself, read
/// from the inode in memory (AT_STATX_DONT_SYNC, as in cached_identity;
/// no open intent, so no filesystem revalidates it).  Not from
/// /proc/<pid>/fdinfo/<fd>: the kernel formats every lock the writer holds
/// on the file into it, however little of it is read, and a user holding
/// byte-range locks on a streamed file made each of these once-a-second
/// checks cost the intake thread that much.  None when it
/// cannot tell (no access).
pub fn fd_still_names(pid: u32, fd: i32, id: FileId) -> Option<bool> {
    let path = CString::new(format!("/proc/{pid}/fd/{fd}")).ok()?;
    match cached_statx(libc::AT_FDCWD, &path, 0) {
        Ok((now, _)) => Some(now == id),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => Some(false),
        Err(_) => None,
    }
}

/// Writes `value` to an existing setting (a sysfs or procfs file): never
/// creates a file, and never follows a symlink in its place, whatever a
/// journal line named.
pub fn write_setting(path: &Path, value: &str) -> io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .write_all(value.as_bytes())
}

/// sync_file_range(2) on [start, end).
pub fn sync_file_range(fd: RawFd, start: u64, end: u64, flags: libc::c_uint) -> io::Result<()> {
    let len = end.saturating_sub(start);
    if len == 0 {
        return Ok(());
    }
    let r = unsafe { libc::sync_file_range(fd, start as i64, len as i64, flags) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// CLOCK_MONOTONIC in ns: bpf_ktime_get_ns()'s clock (wb_event.ts_ns,
/// wb_file_stream.touched).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET
/// ("READY=1", "WATCHDOG=1", "STOPPING=1").  Nothing when not under systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let _ = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), path)
    };
}

/// Raises the soft RLIMIT_NOFILE to `want` (within the hard limit): the
/// agent holds a file and a pidfd per stream.  Returns the soft limit now
/// in force.
pub fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    if r.rlim_cur < want {
        let new = libc::rlimit { rlim_cur: want.min(r.rlim_max), rlim_max: r.rlim_max };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return new.rlim_cur;
        }
    }
    r.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range whose writeback has completed reads 0 pages under writeback
    /// (on kernels without cachestat, None: the flusher waits as before).
    #[test]
    fn cachestat_reads_a_written_range_as_done() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("wb-cachestat-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        let fd = f.as_raw_fd();
        let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        sync_file_range(fd, 0, 1 << 20, all).unwrap();
        let seen = under_writeback(fd, 0, 1 << 20);
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(seen, Some(0) | None), "{seen:?}");
    }

    /// A directory standing for a mount's root, its fd, and a path outside it.
    struct Tree {
        dir: std::path::PathBuf,
        root: OwnedFd,
    }

    impl Tree {
        fn new(name: &str) -> Tree {
            let dir = std::env::temp_dir().join(format!("wb-beneath-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("mnt/sub")).unwrap();
            std::fs::write(dir.join("mnt/sub/f"), b"tail").unwrap();
            std::fs::write(dir.join("outside"), b"not beneath").unwrap();
            let root = std::fs::File::open(dir.join("mnt")).unwrap().into();
            Tree { dir, root }
        }

        fn path(&self, rel: &str) -> std::path::PathBuf {
            self.dir.join("mnt").join(rel)
        }

        fn id(&self, rel: &str) -> FileId {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::symlink_metadata(self.path(rel)).unwrap();
            FileId { dev: m.dev(), ino: m.ino() }
        }

        fn open(&self, rel: &str, expect: FileId) -> Result<OwnedFd, ErrorKind> {
            let root_dev = fstat(self.root.as_raw_fd()).unwrap().st_dev;
            open_beneath(&self.root, root_dev, &CString::new(rel).unwrap(), expect)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn opens_the_regular_file_beneath_read_only() {
        let t = Tree::new("regular");
        let fd = t.open("sub/f", t.id("sub/f")).expect("the file itself");
        let mut f = std::fs::File::from(fd);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut f, &mut got).unwrap();
        assert_eq!(got, "tail");
        assert!(std::io::Write::write(&mut f, b"x").is_err(), "opened writable");
    }

    #[test]
    fn refuses_what_is_not_that_file_beneath() {
        let t = Tree::new("refused");
        let f = t.id("sub/f");
        // A symlink to the very file, last or on the way: not followed.
        std::os::unix::fs::symlink("sub/f", t.path("link")).unwrap();
        std::os::unix::fs::symlink("sub", t.path("dirlink")).unwrap();
        assert_eq!(t.open("link", f).unwrap_err(), ErrorKind::IdentityMismatch);
        assert_eq!(t.open("link", t.id("link")).unwrap_err(), ErrorKind::IdentityMismatch, "a link is no file");
        assert!(t.open("dirlink/f", f).is_err());
        // Out of the mount: by "..", by an absolute path.
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(t.dir.join("outside")).unwrap();
        let outside = FileId { dev: m.dev(), ino: m.ino() };
        assert!(t.open("../outside", outside).is_err());
        assert!(t.open("sub/../../outside", outside).is_err());
        assert!(t.open(&t.dir.join("outside").to_string_lossy(), outside).is_err());
        // Renamed over by another inode since the close.
        std::fs::write(t.path("sub/g"), b"someone else's").unwrap();
        std::fs::rename(t.path("sub/g"), t.path("sub/f")).unwrap();
        assert_eq!(t.open("sub/f", f).unwrap_err(), ErrorKind::IdentityMismatch);
        assert_eq!(t.open("sub/gone", f).unwrap_err(), ErrorKind::FileGone);
    }

    /// A FIFO put where the file was is looked up, never opened: a writer
    /// blocked opening it stays blocked (any open for reading, even
    /// O_NONBLOCK, would let it through; a blocking O_RDONLY would hang).
    #[test]
    fn a_fifo_is_never_opened() {
        let t = Tree::new("fifo");
        let fifo = CString::new(t.path("fifo").into_os_string().into_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let path = t.path("fifo");
        let writer = std::thread::spawn(move || std::fs::OpenOptions::new().write(true).open(path));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!writer.is_finished(), "the writer's open should wait for a reader");
        assert_eq!(t.open("fifo", t.id("fifo")).unwrap_err(), ErrorKind::IdentityMismatch);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!writer.is_finished(), "the FIFO was opened for reading");
        // Let the writer go.
        let reader = unsafe { libc::open(fifo.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert!(reader >= 0);
        writer.join().unwrap().unwrap();
        unsafe { libc::close(reader) };
    }

    #[test]
    fn an_fd_is_known_by_the_file_it_names() {
        let t = Tree::new("fdnames");
        std::fs::write(t.path("a"), b"a").unwrap();
        let f = std::fs::File::open(t.path("a")).unwrap();
        let (me, fd) = (std::process::id(), f.as_raw_fd());
        assert_eq!(fd_still_names(me, fd, t.id("a")), Some(true));
        std::fs::write(t.path("b"), b"b").unwrap();
        assert_eq!(fd_still_names(me, fd, t.id("b")), Some(false), "another file");
        drop(f);
        assert_eq!(fd_still_names(me, fd, t.id("a")), Some(false), "closed");
    }

    #[test]
    fn errno_kinds() {
        let kind = |e| error_kind(&io::Error::from_raw_os_error(e));
        assert_eq!(kind(libc::ENOENT), ErrorKind::FileGone);
        assert_eq!(kind(libc::ESTALE), ErrorKind::FileGone);
        assert_eq!(kind(libc::EACCES), ErrorKind::Permission);
        assert_eq!(kind(libc::EXDEV), ErrorKind::Other);
        assert_eq!(pidfd_error(io::Error::from_raw_os_error(libc::ESRCH)), ErrorKind::ProcessGone);
        assert_eq!(pidfd_error(io::Error::from_raw_os_error(libc::EPERM)), ErrorKind::Permission);
    }
}
