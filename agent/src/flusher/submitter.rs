//! A device's thread: starts writeback of each batch it is given, in chunks,
//! and waits for what is in flight.
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
    collections::{HashSet, VecDeque},
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use super::{Batch, Target, job::Home, rounds::Rounds};
use crate::{
    admission::Backlog,
    bandwidth::Sampler,
    counters::{Counters, ErrorKind},
    devices::DeviceShared,
    handles::{ClosedFile, Handles, Reached},
};

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

pub(super) struct Submitter {
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
    /// Streams' files this thread opened, sent back to be closed here
    /// (job::Home), and how many it holds.
    closes: (mpsc::Sender<Arc<OwnedFd>>, mpsc::Receiver<Arc<OwnedFd>>),
    held: Arc<AtomicUsize>,
    /// This thread, once it runs.
    home: Option<Home>,
}

/// How often a device's thread waiting for work closes the files sent
/// home meanwhile.  Idle threads with no file end after THREAD_IDLE.
const CLOSE_POLL: Duration = Duration::from_millis(200);

impl Submitter {
    pub(super) fn new(
        device: Arc<DeviceShared>,
        counters: Arc<Counters>,
        stopping: Arc<AtomicBool>,
        held: Arc<AtomicUsize>,
    ) -> Self {
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
            closes: mpsc::channel(),
            held,
            home: None,
        }
    }

    pub(super) fn run(&mut self, rx: mpsc::Receiver<Batch>, backlog: &Backlog) {
        self.home = Some(Home::here(self.closes.0.clone(), self.held.clone()));
        let mut rounds = Rounds::default();
        loop {
            self.close_sent_home();
            if rounds.is_empty() {
                // Nothing queued: let what is in flight finish (a sample,
                // and no file held while idle), then sleep until work comes.
                self.wait_until(0);
                backlog.park(true);
                let next = loop {
                    match rx.recv_timeout(CLOSE_POLL) {
                        Ok(b) => break Some(b),
                        Err(mpsc::RecvTimeoutError::Timeout) => self.close_sent_home(),
                        Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                    }
                };
                backlog.park(false);
                match next {
                    Some(b) => rounds.push(b),
                    None => return self.close_sent_home(),
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

    /// Closes the streams' files sent back here.
    fn close_sent_home(&mut self) {
        let home = self.home.as_ref().expect("set as the thread runs");
        for file in self.closes.1.try_iter() {
            drop(file);
            home.closed();
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
                Target::Held(stream) => {
                    let home = self.home.as_ref().expect("set as the thread runs");
                    stream.open(&self.counters, home).or_else(|| self.reach(&stream.closed(), true))
                }
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
                if self.in_flight.is_empty() && pending == 0 {
                    // Before the first byte of a busy period is written.
                    self.sampler.busy_from(self.device.written());
                }
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
            let (idle, device) = (self.in_flight.is_empty(), &self.device);
            if let Some((bytes, busy)) = self.sampler.completed(f.bytes, done - busy_from, idle, || device.written()) {
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
