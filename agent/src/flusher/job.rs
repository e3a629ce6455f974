//! What a device's thread is given: flushes (a range of a target file,
//! charged to its writer's user in the flush memory), in batches by owner,
//! and a stream's file, opened on that thread, held, and closed there.

use std::{
    os::fd::OwnedFd,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    thread::{self, ThreadId},
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
    /// The file, and the thread that opened it, which alone closes it.
    file: OnceLock<Option<(Arc<OwnedFd>, Home)>>,
}

/// The device thread a stream's file was opened on: it alone closes the
/// file.  A last close can wait for a long time or for ever: for a server
/// (NFS's CLOSE; FUSE's FLUSH, which a user's own server may withhold), or
/// for the pages of an unlinked file.  On its own device's thread it holds
/// that device's work and no other device's, and never the thread that
/// drains events, answers wbctl and pings the watchdog.  Nor does it let
/// descriptors pile up: that thread opens no file while it waits, so a
/// stuck close holds at most the files of its device already open.
/// Closer threads shared by device number (four, with queues without a
/// bound) let one FUSE server's withheld FLUSH hold every later close of
/// every device that shared its thread.
#[derive(Debug, Clone)]
pub(super) struct Home {
    closes: mpsc::Sender<Arc<OwnedFd>>,
    /// Files opened on it and not yet closed: a thread holding one is not
    /// retired, so that its closes always have a thread.
    held: Arc<AtomicUsize>,
    thread: ThreadId,
}

impl Home {
    /// The calling thread, as the home of the files it opens.
    pub(super) fn here(closes: mpsc::Sender<Arc<OwnedFd>>, held: Arc<AtomicUsize>) -> Self {
        Self { closes, held, thread: thread::current().id() }
    }

    /// Closes `file` here if this is its home, or sends it home.
    fn close(self, file: Arc<OwnedFd>) {
        if thread::current().id() == self.thread {
            drop(file);
            self.closed();
        } else if let Err(unsent) = self.closes.send(file) {
            // Its thread has ended: only at shutdown, or after a panic (a
            // thread is retired only once it holds no file).  Closing it
            // here could wait on this thread; the process's exit closes it.
            std::mem::forget(unsent.0);
            self.closed();
        }
    }

    /// A file it opened was closed (by the home thread, or left to exit).
    pub(super) fn closed(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

impl StreamFile {
    pub fn new(pid: u32, fd: i32, pidfd: OwnedFd, closed: ClosedFile) -> Self {
        let pidfd = Mutex::new(Some(Arc::new(pidfd)));
        Self { pid, fd, pidfd, closed, path: OnceLock::new(), file: OnceLock::new() }
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
    /// counted as an error.  `home` is the calling device thread, which
    /// will close it.
    pub(super) fn open(&self, counters: &Counters, home: &Home) -> Option<Arc<OwnedFd>> {
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
                    .map(|file| {
                        home.held.fetch_add(1, Ordering::Relaxed);
                        (Arc::new(file), home.clone())
                    })
            })
            .as_ref()
            .map(|(file, _)| file.clone())
    }
}

impl Drop for StreamFile {
    fn drop(&mut self) {
        if let Some(Some((file, home))) = self.file.take() {
            home.close(file);
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

    /// A file is closed by its home thread: sent there from any other
    /// thread, dropped at once on its own; once that thread is gone it is
    /// left to the process's exit, never closed by the sender.
    #[test]
    fn a_file_goes_home_to_be_closed() {
        let (tx, rx) = mpsc::channel();
        let held = Arc::new(AtomicUsize::new(3));
        let home = Home::here(tx, held.clone());
        let file = || Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let elsewhere = home.clone();
        let sent = file();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&*sent);
        thread::spawn(move || elsewhere.close(sent)).join().unwrap();
        let arrived = rx.try_recv().expect("sent home");
        assert_eq!(std::os::fd::AsRawFd::as_raw_fd(&*arrived), raw, "still open, the same descriptor");
        assert_eq!(held.load(Ordering::Relaxed), 3, "held until the home thread closes it");
        drop(arrived);
        home.closed();
        home.clone().close(file());
        assert_eq!(held.load(Ordering::Relaxed), 1, "closed at once at home");
        assert!(rx.try_recv().is_err());
        drop(rx);
        let orphan = home.clone();
        thread::spawn(move || orphan.close(file())).join().unwrap();
        assert_eq!(held.load(Ordering::Relaxed), 0, "its home gone: not held, left to exit");
    }

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
