//! What a device's thread is given: flushes (a range of a target file,
//! charged to its writer's user in the flush memory), in batches by owner,
//! and a stream's file, opened on that thread and held.

use std::{
    os::fd::OwnedFd,
    sync::{Arc, Mutex, OnceLock},
};

use crate::{
    abi::RelPath,
    admission::{Charge, FlushMemory},
    counters::{Counters, ErrorKind},
    handles::ClosedFile,
    sys::FileId,
};

/// A stream's file.  Opened on the device's thread at its first flush, not
/// by the intake thread when the stream starts: an open can block (a FUSE
/// server that never answers, a dead NFS server), and the intake thread also
/// drains events, serves the socket and pings the watchdog.  Held, read-only,
/// until the stream ends and its last flush is done.
#[derive(Debug)]
pub struct StreamFile {
    pub pid: u32,
    pub fd: i32,
    /// Taken when the stream started: fences pid reuse, tells the writer's
    /// exit.  Dropped when the stream ends, so that flushes still queued
    /// (behind a hung device, say) hold no descriptor of an ended stream.
    pidfd: Mutex<Option<Arc<OwnedFd>>>,
    /// The inode the events were about: reached by handle if the writer's
    /// fd no longer names it (or never did: fd -1).
    pub closed: ClosedFile,
    /// Its path beneath its mount, from the close (filesystems without
    /// file handles): the close's flush may find the file not yet opened.
    path: OnceLock<RelPath>,
    file: OnceLock<Option<Arc<OwnedFd>>>,
    /// Its close may wait for a server (Backing::close_waits): closed on a
    /// closer thread (closer.rs).
    close_waits: bool,
}

impl StreamFile {
    pub fn new(pid: u32, fd: i32, pidfd: OwnedFd, closed: ClosedFile, close_waits: bool) -> Self {
        let pidfd = Mutex::new(Some(Arc::new(pidfd)));
        Self { pid, fd, pidfd, closed, path: OnceLock::new(), file: OnceLock::new(), close_waits }
    }

    /// The close reported the file's path: its flushes may go by path.
    pub fn set_path(&self, path: Option<RelPath>) {
        if let Some(path) = path {
            let _ = self.path.set(path);
        }
    }

    /// What reaches the inode once the writer's fd no longer does.
    pub(super) fn closed(&self) -> ClosedFile {
        ClosedFile { path: self.path.get().cloned(), ..self.closed.clone() }
    }

    /// True once the writer has exited (or the stream ended).
    pub fn writer_exited(&self) -> bool {
        self.pidfd.lock().unwrap().as_ref().is_none_or(|p| crate::sys::pidfd_exited(p))
    }

    /// The stream ended: its queued flushes go by handle from now on.
    pub fn end(&self) {
        self.pidfd.lock().unwrap().take();
    }

    /// The writer's file, opened at the first call; None when the writer had
    /// moved on by then, or the stream has ended (the caller reaches the
    /// inode by handle).  Not opening is the normal case when a writer closes
    /// files faster than the device takes them (cp -r): only a refusal is
    /// counted as an error.
    pub(super) fn open(&self, counters: &Counters) -> Option<Arc<OwnedFd>> {
        self.file
            .get_or_init(|| {
                // The lock only to clone: the open may take long (a FUSE server).
                let pidfd = self.pidfd.lock().unwrap().clone()?;
                let expect = FileId { dev: self.closed.st_dev, ino: self.closed.ino };
                crate::sys::open_writer_file(self.pid, self.fd, &pidfd, expect)
                    .inspect_err(|&kind| {
                        if matches!(kind, ErrorKind::Permission | ErrorKind::Other) {
                            counters.error(kind);
                        }
                        tracing::debug!(pid = self.pid, fd = self.fd, error = kind.name(), "stream file not opened");
                    })
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    }
}

impl Drop for StreamFile {
    fn drop(&mut self) {
        if self.close_waits
            && let Some(Some(file)) = self.file.take()
        {
            crate::closer::close_elsewhere(self.closed.st_dev, file);
        }
    }
}

/// The file a flush acts on.
#[derive(Debug)]
pub enum Target {
    /// A stream's file: opened (read-only) at its first flush, then held.
    Held(Arc<StreamFile>),
    /// A file its writer already closed: opened by handle (or path) when flushed.
    Closed(ClosedFile),
    /// A window of a file no descriptor reaches (pages dirtied through a
    /// mapping or io_uring): opened like a closed file, not counted as one.
    Window(ClosedFile),
}

/// Start writeback of [start, end) of a file.
#[derive(Debug)]
pub struct Flush {
    pub target: Target,
    pub start: u64,
    pub end: u64,
    /// Its share of FLUSH_MEMORY, given back when it is dropped.
    charge: Charge,
}

impl Flush {
    /// A flush for `user` (the writer's owner), or None when the flushes
    /// waiting in the agent already hold FLUSH_MEMORY, or that user's
    /// already hold their share of it, half of what the other users leave
    /// (admission::fits); the caller leaves the file to the kernel.
    pub(crate) fn new(target: Target, start: u64, end: u64, user: u32, memory: &FlushMemory) -> Option<Self> {
        let path = match &target {
            Target::Closed(f) | Target::Window(f) => f.path.as_ref().map_or(0, |p| p.to_bytes_with_nul().len() + 16),
            Target::Held(_) => 0,
        };
        let charge = memory.charge(std::mem::size_of::<Flush>() + path, user)?;
        Some(Self { target, start, end, charge })
    }

    /// Whose writer it is for.
    pub fn user(&self) -> u32 {
        self.charge.user()
    }
}

/// Flushes submitted back to back, in order: a batch of closed files is
/// written in the order it was written, so delayed allocation lays it out
/// contiguously.  `owner` names the stream (or the multi-file writer) the
/// batch belongs to, for fair turns.
#[derive(Debug)]
pub struct Batch {
    pub owner: u64,
    pub flushes: Vec<Flush>,
}

impl Batch {
    /// The user its flushes are for (one writer's: the same for all).
    pub(super) fn user(&self) -> u32 {
        self.flushes.first().map_or(0, Flush::user)
    }
}

#[cfg(test)]
impl Flush {
    pub(super) fn target_file(self) -> ClosedFile {
        match self.target {
            Target::Closed(f) | Target::Window(f) => f,
            Target::Held(s) => s.closed.clone(),
        }
    }
}

/// A batch of one closed file, for user `owner`.
#[cfg(test)]
pub(super) fn batch(owner: u64, n: u64) -> Batch {
    let f = ClosedFile { sb_dev: 0, st_dev: 0, ino: n, generation: 0, fs_root: 0, fs_magic: 0, path: None };
    let memory = FlushMemory::new(usize::MAX);
    Batch { owner, flushes: vec![Flush::new(Target::Closed(f), 0, 1, owner as u32, &memory).unwrap()] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_memory_is_bounded_by_user_and_given_back() {
        let memory = FlushMemory::new(8 * std::mem::size_of::<Flush>());
        let flush = |user| Flush::new(Target::Closed(batch(1, 1).flushes.remove(0).target_file()), 0, 1, user, &memory);
        let mine: Vec<Flush> = (0..4).map(|_| flush(1).expect("within my half")).collect();
        assert!(flush(1).is_none(), "past one user's half");
        let theirs: Vec<Flush> = (0..2).map(|_| flush(2).expect("half of what the first leaves")).collect();
        assert!(flush(2).is_none(), "past a second user's quarter");
        let third = flush(3).expect("a third user still gets some");
        assert!(flush(4).is_none(), "past the limit");
        drop((mine, theirs, third));
        assert_eq!(memory.used(), 0, "dropped flushes give their bytes back");
        assert!(flush(1).is_some());
    }
}
