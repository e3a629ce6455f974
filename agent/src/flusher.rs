//! One submitter thread per backing device.
//!
//! N threads submitting writeback to one disk seek it all over the place; one
//! submitter keeps locality.  Every flush for a device goes through its
//! thread, in fair rounds.  sync_file_range may block on a congested queue,
//! which is why it runs here and not on the async runtime.
//!
//! What a device has in flight is bounded, like Linus's loop: windows are
//! submitted in chunks of `in_flight_seconds` of bandwidth (policy), and after
//! each chunk the submitter waits for the one before.  Everything else on
//! the device queues behind what is in flight: an fsync there waits for it
//! twice on ext4 (its commit waits for allocated data, then its own writes
//! queue behind the rest).  Measured (bench copy, 100 MiB/s): fsync p50 48 ms
//! with Linus's 8 MiB chunks, 250-500 ms with whole 10-14 MiB windows in
//! flight two at a time.  The waits are timed: they are the agent's own
//! measurement of the device's write bandwidth.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
};

use std::time::{Duration, Instant};

use crate::{
    abi::RelPath,
    admission::{Backlog, Charge, FlushMemory, MAX_QUEUED},
    bandwidth::Sampler,
    counters::{Counters, ErrorKind},
    devices::DeviceShared,
    handles::{ClosedFile, Handles, Reached},
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
    fn closed(&self) -> ClosedFile {
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
    fn open(&self, counters: &Counters) -> Option<Arc<OwnedFd>> {
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
    /// already hold half of it (the caller leaves the file to the kernel).
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
    fn user(&self) -> u32 {
        self.flushes.first().map_or(0, Flush::user)
    }
}

/// A device's flusher thread, as the intake side sees it.
struct Queue {
    tx: mpsc::Sender<Batch>,
    handle: JoinHandle<()>,
    backlog: Arc<Backlog>,
    /// "Queue full" was logged (again once it has drained to half).
    full_logged: bool,
    /// When it was last given a batch.
    last: Instant,
    /// Its device's speed is a user's to set (DeviceShared::user_made).
    user_made: bool,
}

/// Counts `n` flushes left to the kernel as `kind`, and logs the first of
/// a run of them (`logged` is cleared where the run ends).
fn left_to_kernel(counters: &Counters, kind: ErrorKind, n: usize, logged: &mut bool, log: impl FnOnce()) {
    counters.errors_add(kind, n as u64);
    if !std::mem::replace(logged, true) {
        log();
    }
}

/// Threads for devices whose speed a user sets, at once.  A thread stuck in
/// the kernel on a stalled device (a FUSE server that stopped answering,
/// in the middle of a writeback the thread waits for) cannot be ended, and
/// every thread counts against the unit's TasksMax (64): a user stalling
/// one FUSE mount after another took every task the daemon had.  Beyond
/// this many, such devices' writeback is left to the kernel, counted as
/// no_thread; disks, sticks and the administrator's mounts are not held
/// back by it.
pub const USER_DEVICE_THREADS: usize = 8;

/// A device's thread is ended once it was given nothing for this long (and
/// has nothing queued), and started again at its next batch.  Every FUSE
/// mount is a device, and user namespaces let a user make any number of
/// them: a thread kept for each device ever written would let one user
/// make the daemon run out of tasks.
const THREAD_IDLE: Duration = Duration::from_secs(60);

pub struct Flushers {
    devices: HashMap<String, Queue>,
    counters: Arc<Counters>,
    /// Set at shutdown: submit what is queued, skip the waits.
    stopping: Arc<AtomicBool>,
    /// A failed thread start was logged (again once one starts).
    no_thread_logged: bool,
    /// USER_DEVICE_THREADS was reached and logged (again once below it).
    user_threads_logged: bool,
}

impl Flushers {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self {
            devices: HashMap::new(),
            counters,
            stopping: Arc::new(AtomicBool::new(false)),
            no_thread_logged: false,
            user_threads_logged: false,
        }
    }

    /// Queues a batch for the device's thread, or leaves it to the kernel:
    /// counted as over_cap when the device is MAX_QUEUED flushes behind, as
    /// no_thread when its thread cannot be started (the unit's TasksMax, a
    /// pids limit, no memory for a stack).
    pub fn submit(&mut self, bdi: &str, device: &Arc<DeviceShared>, batch: Batch) {
        let n = batch.flushes.len();
        if !self.devices.contains_key(bdi) {
            let user_threads = self.devices.values().filter(|q| q.user_made).count();
            if device.user_made() && user_threads >= USER_DEVICE_THREADS {
                return left_to_kernel(&self.counters, ErrorKind::NoThread, n, &mut self.user_threads_logged, || {
                    tracing::warn!(
                        bdi,
                        max = USER_DEVICE_THREADS,
                        "devices users made already have their flusher threads: this one's writeback is left to the kernel"
                    )
                });
            }
            self.user_threads_logged &= user_threads + 1 >= USER_DEVICE_THREADS;
            match self.start(bdi, device) {
                Ok(q) => {
                    self.devices.insert(bdi.to_owned(), q);
                    self.no_thread_logged = false;
                }
                Err(e) => {
                    return left_to_kernel(
                        &self.counters,
                        ErrorKind::NoThread,
                        n,
                        &mut self.no_thread_logged,
                        || tracing::warn!(bdi, error = %e, "cannot start a flusher thread: the device's writeback is left to the kernel"),
                    );
                }
            }
        }
        let q = self.devices.get_mut(bdi).expect("started above");
        q.last = Instant::now();
        if !q.backlog.try_add(n, batch.user()) {
            return left_to_kernel(&self.counters, ErrorKind::OverCap, n, &mut q.full_logged, || {
                tracing::warn!(
                    bdi,
                    max = MAX_QUEUED,
                    "flush queue full: the excess is left to the kernel until the device catches up"
                )
            });
        }
        if q.backlog.len() < MAX_QUEUED / 2 {
            q.full_logged = false;
        }
        // The thread only ends when its sender is dropped, so send cannot fail.
        let _ = q.tx.send(batch);
    }

    fn start(&self, bdi: &str, device: &Arc<DeviceShared>) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::channel();
        let backlog = Arc::new(Backlog::default());
        let mut submitter = Submitter::new(device.clone(), self.counters.clone(), self.stopping.clone());
        let drained = backlog.clone();
        let handle = thread::Builder::new().name(format!("flush-{bdi}")).spawn(move || submitter.run(rx, &drained))?;
        Ok(Queue { tx, handle, backlog, full_logged: false, last: Instant::now(), user_made: device.user_made() })
    }

    /// Whether the device has a flusher thread.
    pub fn has(&self, bdi: &str) -> bool {
        self.devices.contains_key(bdi)
    }

    /// Ends the threads of devices idle for THREAD_IDLE and waiting for
    /// work with nothing in flight: dropping the sender ends the thread.
    pub fn retire_idle(&mut self) {
        let now = Instant::now();
        self.devices.retain(|bdi, q| {
            let idle = now - q.last >= THREAD_IDLE && q.backlog.len() == 0 && q.backlog.parked();
            if idle {
                tracing::debug!(bdi, "flusher thread ended (idle)");
            }
            !idle
        });
    }

    /// Hands every queued span to writeback (without waiting for any) and
    /// stops the threads: starting writeback is quick, so this is prompt —
    /// except on a device that is hung (or very slow) in writeback, whose
    /// thread may sit in sync_file_range's wait.  Such a thread is waited for
    /// at most `within`, then left: the caller has put the bdi limits back
    /// already, and the process, though it cannot finish exiting while that
    /// thread sleeps uninterruptibly, has nothing left to do.
    pub fn shutdown(&mut self, within: std::time::Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + within;
        // Dropping each sender ends its thread once its queue is done.
        let threads: Vec<(String, JoinHandle<()>)> = self.devices.drain().map(|(bdi, q)| (bdi, q.handle)).collect();
        for (bdi, handle) in threads {
            while !handle.is_finished() && Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(10));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                tracing::warn!(
                    bdi,
                    secs = within.as_secs(),
                    "device still busy in writeback: not waiting for it any longer"
                );
            }
        }
    }
}

/// Batches waiting on one device, by owner.  Service goes in rounds: each
/// round gives every owner with work one batch, owners in the order their
/// oldest batch arrived, so a flood of small files cannot starve a big stream
/// on the same device, nor the reverse.
#[derive(Default)]
struct Rounds {
    queues: HashMap<u64, VecDeque<Batch>>,
    /// Owners with work, oldest first.
    order: VecDeque<u64>,
}

impl Rounds {
    fn push(&mut self, b: Batch) {
        let q = self.queues.entry(b.owner).or_default();
        if q.is_empty() {
            self.order.push_back(b.owner);
        }
        q.push_back(b);
    }

    /// One batch from each owner with work.
    fn round(&mut self) -> Vec<Batch> {
        let owners: Vec<u64> = self.order.drain(..).collect();
        let mut out = Vec::with_capacity(owners.len());
        for owner in owners {
            let q = self.queues.get_mut(&owner).expect("ordered owners have queues");
            out.push(q.pop_front().expect("ordered owners have work"));
            if q.is_empty() {
                self.queues.remove(&owner);
            } else {
                self.order.push_back(owner);
            }
        }
        out
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// A file kept open until its range is written, and what it stands for.
struct InFlight {
    file: Arc<OwnedFd>,
    start: u64,
    end: u64,
    /// Bytes the wait covers: a run of closed files is waited for through
    /// its last file (written in order, it finishes about last).
    bytes: u64,
    submitted: Instant,
}

struct Submitter {
    device: Arc<DeviceShared>,
    counters: Arc<Counters>,
    stopping: Arc<AtomicBool>,
    handles: Handles,
    in_flight: VecDeque<InFlight>,
    in_flight_bytes: u64,
    /// When the last waited range completed: busy time starts after it.
    last_done: Option<Instant>,
    sampler: Sampler,
    /// Files whose writeback failed (EIO, device gone): logged once, then
    /// left alone; by (st_dev, st_ino).
    failed: HashSet<(u64, u64)>,
}

impl Submitter {
    fn new(device: Arc<DeviceShared>, counters: Arc<Counters>, stopping: Arc<AtomicBool>) -> Self {
        Self {
            device,
            counters,
            stopping,
            handles: Handles::default(),
            in_flight: VecDeque::new(),
            in_flight_bytes: 0,
            last_done: None,
            sampler: Sampler::default(),
            failed: HashSet::new(),
        }
    }

    fn run(&mut self, rx: mpsc::Receiver<Batch>, backlog: &Backlog) {
        let mut rounds = Rounds::default();
        loop {
            if rounds.is_empty() {
                // Nothing queued: let what is in flight finish (a sample,
                // and no file held while idle), then sleep until work comes.
                self.wait_until(0);
                backlog.park(true);
                let next = rx.recv();
                backlog.park(false);
                match next {
                    Ok(b) => rounds.push(b),
                    Err(_) => return,
                }
            }
            while let Ok(b) = rx.try_recv() {
                rounds.push(b);
            }
            for batch in rounds.round() {
                let (n, user) = (batch.flushes.len(), batch.user());
                self.submit(batch);
                self.handles.release();
                backlog.done(n, user);
            }
        }
    }

    /// Starts writeback of a batch, in order, one chunk at a time: after
    /// each chunk, wait until only that chunk is in flight.  The whole
    /// batch (a stream's window, a run of closed files) is submitted before
    /// any other owner's, so delayed allocation lays it out in one piece
    /// however small the chunks.
    fn submit(&mut self, batch: Batch) {
        let chunk = self.device.chunk();
        // Taken before WRITE: on a congested queue it blocks while the
        // device works through much of the range, and that is busy time.
        let mut since = Instant::now();
        let mut pending: u64 = 0;
        let mut last = None;
        for job in batch.flushes {
            // A stopping daemon starts no more writeback on a network
            // filesystem: on a silent server's mount each WRITE call waits
            // for the congestion to ease.  A disk's queued batches are
            // still written: what was emitted before the stop is acted on
            // (a 128 MiB dd stopped right after had 2 of its 8 spans
            // dropped otherwise).
            if self.device.network() && self.stopping.load(Ordering::Relaxed) {
                break;
            }
            // Each call that may block is marked, so that a device whose
            // server or disk stops answering shows as stalled.
            let waiting = self.device.waiting();
            let file = match &job.target {
                Target::Held(stream) => stream.open(&self.counters).or_else(|| self.reach(&stream.closed(), true)),
                Target::Closed(closed) => self.reach(closed, true),
                Target::Window(file) => self.reach(file, false),
            };
            drop(waiting);
            let Some(file) = file else { continue };
            let id = || crate::sys::cached_identity(file.as_raw_fd()).map(|(f, _)| (f.dev, f.ino)).unwrap_or_default();
            if !self.failed.is_empty() && self.failed.contains(&id()) {
                continue;
            }
            let mut at = job.start;
            while at < job.end {
                let to = job.end.min(at + chunk);
                let waiting = self.device.waiting();
                let started = crate::sys::sync_file_range(file.as_raw_fd(), at, to, libc::SYNC_FILE_RANGE_WRITE);
                drop(waiting);
                if let Err(e) = started {
                    self.counters.error(ErrorKind::SyncFailed);
                    let (dev, ino) = id();
                    if self.failed.len() >= 4096 {
                        self.failed.clear();
                    }
                    if self.failed.insert((dev, ino)) {
                        tracing::warn!(
                            dev = %format!("{}:{}", libc::major(dev), libc::minor(dev)), ino, error = %e,
                            "writeback failed: this file is left to the kernel from now on"
                        );
                    }
                    break;
                }
                self.counters.add(&self.counters.bytes_flushed, to - at);
                pending += to - at;
                last = Some((file.clone(), at, to));
                if pending >= chunk {
                    self.in_flight(last.take().expect("just set"), pending, since);
                    pending = 0;
                    self.wait_until(chunk);
                    since = Instant::now();
                }
                at = to;
            }
            self.counters.add(&self.counters.spans_flushed, 1);
        }
        if let Some(last) = last {
            self.in_flight(last, pending, since);
            self.wait_until(chunk);
        }
    }

    /// A closed file (or a stream's file its writer moved away from),
    /// opened by handle, or by path where there are no handles.
    fn reach(&mut self, closed: &ClosedFile, count: bool) -> Option<Arc<OwnedFd>> {
        match self.handles.open(closed) {
            Ok((file, how)) => {
                if count {
                    self.counters.add(&self.counters.closed_files_flushed, 1);
                }
                if how == Reached::ByPath {
                    self.counters.add(&self.counters.closed_files_by_path, 1);
                }
                Some(Arc::new(file))
            }
            Err(kind) => {
                self.counters.error(kind);
                tracing::debug!(
                    ino = closed.ino,
                    generation = closed.generation,
                    fs_root = closed.fs_root,
                    error = kind.name(),
                    "closed file not reached"
                );
                None
            }
        }
    }

    fn in_flight(&mut self, (file, start, end): (Arc<OwnedFd>, u64, u64), bytes: u64, submitted: Instant) {
        self.in_flight.push_back(InFlight { file, start, end, bytes, submitted });
        self.in_flight_bytes += bytes;
    }

    /// Waits, oldest first, until at most `bound` bytes are in flight.
    /// WAIT_BEFORE only waits for writeback already under way; it never
    /// starts WB_SYNC_ALL writeback (which hurt interactivity in 2012).
    fn wait_until(&mut self, bound: u64) {
        while self.in_flight_bytes > bound {
            let f = self.in_flight.pop_front().expect("bytes in flight have entries");
            self.in_flight_bytes -= f.bytes;
            if self.stopping.load(Ordering::Relaxed) {
                continue;
            }
            let waiting = self.device.waiting();
            let polled = if self.device.network() { self.poll_written(&f) } else { None };
            let written = polled.unwrap_or_else(|| {
                crate::sys::sync_file_range(f.file.as_raw_fd(), f.start, f.end, libc::SYNC_FILE_RANGE_WAIT_BEFORE)
                    .is_ok()
            });
            drop(waiting);
            if !written {
                continue;
            }
            let done = Instant::now();
            let busy_from = self.last_done.map_or(f.submitted, |t| t.max(f.submitted));
            self.last_done = Some(done);
            if let Some((bytes, busy)) = self.sampler.completed(f.bytes, done - busy_from) {
                self.device.sample(bytes, busy);
            }
        }
    }

    /// Waits for a range of a network filesystem's file by polling the page
    /// cache (cachestat): Some(false) when the daemon stops first, None
    /// where cachestat is missing or refused (the caller waits with
    /// WAIT_BEFORE).  WAIT_BEFORE sleeps uninterruptibly in
    /// folio_wait_writeback while the server is silent: with a hard NFS
    /// mount dropped for 60 s, `systemctl stop` timed out on 6.1 and 6.12
    /// and the process lived on until the server answered.
    fn poll_written(&self, f: &InFlight) -> Option<bool> {
        let mut pause = POLL_FIRST;
        while crate::sys::under_writeback(f.file.as_raw_fd(), f.start, f.end)? > 0 {
            if self.stopping.load(Ordering::Relaxed) {
                return Some(false);
            }
            thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
        Some(true)
    }
}

/// Polling a network file's writeback: from 1 ms, doubling to 4 ms.  A
/// chunk takes 35-40 ms at the 26 MiB/s an emulated Wi-Fi link carried, so
/// the completion is seen within a tenth of it (what the bandwidth sampler
/// counts as busy), for at most 250 cachestat calls a second.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(4);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::FLUSH_MEMORY;

    impl Flush {
        fn target_file(self) -> ClosedFile {
            match self.target {
                Target::Closed(f) | Target::Window(f) => f,
                Target::Held(s) => s.closed.clone(),
            }
        }
    }

    /// A batch of one closed file, for user `owner`.
    fn batch(owner: u64, n: u64) -> Batch {
        let f = ClosedFile { sb_dev: 0, st_dev: 0, ino: n, generation: 0, fs_root: 0, fs_magic: 0, path: None };
        let memory = FlushMemory::new(usize::MAX);
        Batch { owner, flushes: vec![Flush::new(Target::Closed(f), 0, 1, owner as u32, &memory).unwrap()] }
    }

    fn inos(v: Vec<Batch>) -> Vec<u64> {
        v.iter()
            .map(|b| match &b.flushes[0].target {
                Target::Closed(f) | Target::Window(f) => f.ino,
                Target::Held(_) => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn every_owner_gets_a_turn_each_round() {
        let mut r = Rounds::default();
        // A flood of small-file batches from owner 1 queued before owner 2's span.
        for i in 0..5 {
            r.push(batch(1, 10 + i));
        }
        r.push(batch(2, 20));
        r.push(batch(2, 21));
        assert_eq!(inos(r.round()), vec![10, 20]);
        r.push(batch(3, 30));
        assert_eq!(inos(r.round()), vec![11, 21, 30]);
        assert_eq!(inos(r.round()), vec![12]);
        assert_eq!(inos(r.round()), vec![13]);
        assert_eq!(inos(r.round()), vec![14]);
        assert!(r.is_empty());
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

    /// Closed files with 4 KiB paths (exFAT) on many devices whose threads
    /// never drain: what they hold together stays within FLUSH_MEMORY,
    /// where each device's MAX_QUEUED alone would let 8 devices hold 2 GiB.
    #[test]
    fn paths_queued_on_many_hung_devices_stay_within_flush_memory() {
        let counters = Arc::new(Counters::default());
        let mut f = Flushers::new(counters.clone());
        let memory = FlushMemory::new(FLUSH_MEMORY);
        let dev = Arc::new(DeviceShared::for_tests());
        let path: RelPath = std::ffi::CString::new(vec![b'a'; 4095]).unwrap().into();
        let (mut queued, mut refused) = (0u64, 0u64);
        for d in 0..8 {
            let (tx, rx) = mpsc::channel();
            std::mem::forget(rx);
            let backlog = Arc::new(Backlog::default());
            let q = Queue {
                tx,
                handle: thread::spawn(|| ()),
                backlog,
                full_logged: false,
                last: Instant::now(),
                user_made: false,
            };
            f.devices.insert(format!("hung{d}"), q);
            for i in 0..MAX_QUEUED as u64 {
                let file = ClosedFile { path: Some(path.clone()), ..batch(1, i).flushes.remove(0).target_file() };
                match Flush::new(Target::Closed(file), 0, 1, d, &memory) {
                    Some(job) => {
                        f.submit(&format!("hung{d}"), &dev, Batch { owner: d as u64, flushes: vec![job] });
                        queued += 1;
                    }
                    None => refused += 1,
                }
            }
        }
        assert!(memory.used() <= FLUSH_MEMORY, "{} bytes held", memory.used());
        assert!(queued > 7000 && refused > 500_000, "queued {queued}, refused {refused}");
    }

    /// A device whose thread never drains (hung in writeback) takes
    /// at most half of MAX_QUEUED flushes from one user, a quarter from a
    /// second: the rest are counted, not queued.
    #[test]
    fn a_hung_device_queues_at_most_max_queued() {
        let counters = Arc::new(Counters::default());
        let mut f = Flushers::new(counters.clone());
        let (tx, _rx) = mpsc::channel();
        let handle = thread::spawn(|| ());
        let backlog = Arc::new(Backlog::default());
        f.devices.insert(
            "hung".into(),
            Queue { tx, handle, backlog: backlog.clone(), full_logged: false, last: Instant::now(), user_made: false },
        );
        let dev = Arc::new(DeviceShared::for_tests());
        for i in 0..(MAX_QUEUED as u64 + 100) {
            f.submit("hung", &dev, batch(1, i));
        }
        assert_eq!(backlog.len(), MAX_QUEUED / 2, "one user's half");
        for i in 0..(MAX_QUEUED as u64 / 2) {
            f.submit("hung", &dev, batch(2, i));
        }
        assert_eq!(backlog.len(), MAX_QUEUED / 2 + MAX_QUEUED / 4, "and a second user's quarter");
        let over = counters.errors().into_iter().find(|e| e.0 == "over_cap").unwrap().1;
        assert_eq!(over, MAX_QUEUED as u64 / 2 + 100 + MAX_QUEUED as u64 / 4);
    }
}
