//! One submitter thread per backing device.
//!
//! Seed 003: N threads submitting writeback to one disk seek it all over the
//! place; one submitter keeps locality.  Every flush for a device goes
//! through its thread, in arrival order.  sync_file_range may block on a
//! congested queue, which is why it runs here and not on the async runtime.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
};

use crate::{
    counters::{Counters, ErrorKind},
    handles::{ClosedFile, Handles},
};

/// The file a flush acts on.
pub enum Target {
    /// A stream's file, held open (read-only) by the agent.
    Held(Arc<OwnedFd>),
    /// A file its writer already closed: opened by handle when flushed.
    Closed(ClosedFile),
}

/// Start writeback of [start, end) of a file; for held streams, then wait
/// like Linus's loop for the span one window behind (`wait_behind`), which
/// bounds what one stream keeps in flight without making the writer wait.
pub struct Flush {
    pub target: Target,
    pub start: u64,
    pub end: u64,
    pub wait_behind: Option<(u64, u64)>,
}

/// Flushes submitted back to back, in order: a batch of closed files is
/// written in the order it was written, so delayed allocation lays it out
/// contiguously.
pub type Batch = Vec<Flush>;

pub struct Flushers {
    devices: HashMap<String, (mpsc::Sender<Batch>, JoinHandle<()>)>,
    counters: Arc<Counters>,
    /// Set at shutdown: submit what is queued, skip the waits.
    stopping: Arc<AtomicBool>,
}

impl Flushers {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self { devices: HashMap::new(), counters, stopping: Arc::new(AtomicBool::new(false)) }
    }

    pub fn submit(&mut self, bdi: &str, batch: Batch) {
        let (tx, _) = self.devices.entry(bdi.to_owned()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel();
            let (counters, stopping) = (self.counters.clone(), self.stopping.clone());
            let handle = thread::Builder::new()
                .name(format!("flush-{bdi}"))
                .spawn(move || run(rx, counters, stopping))
                .expect("cannot spawn flusher thread");
            (tx, handle)
        });
        // The thread only ends when its sender is dropped, so send cannot fail.
        let _ = tx.send(batch);
    }

    /// Hands every queued span to writeback (without waiting for any) and
    /// stops the threads: starting writeback is quick, so this is prompt.
    pub fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        for (_, (tx, handle)) in self.devices.drain() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

fn run(rx: mpsc::Receiver<Batch>, counters: Arc<Counters>, stopping: Arc<AtomicBool>) {
    let mut handles = Handles::default();
    for batch in rx {
        for job in batch {
            flush(job, &mut handles, &counters, &stopping);
        }
        handles.release();
    }
}

fn flush(job: Flush, handles: &mut Handles, counters: &Counters, stopping: &AtomicBool) {
    let opened;
    let fd = match &job.target {
        Target::Held(file) => file.as_raw_fd(),
        Target::Closed(closed) => match handles.open(closed) {
            Ok(file) => {
                opened = file;
                opened.as_raw_fd()
            }
            Err(kind) => return counters.error(kind),
        },
    };
    if let Err(e) = crate::sys::sync_file_range(fd, job.start, job.end, libc::SYNC_FILE_RANGE_WRITE) {
        counters.error(ErrorKind::SyncFailed);
        tracing::debug!(error = %e, "sync_file_range(WRITE) failed");
        return;
    }
    counters.add(&counters.spans_flushed, 1);
    counters.add(&counters.bytes_flushed, job.end - job.start);
    if matches!(job.target, Target::Closed(_)) {
        counters.add(&counters.closed_files_flushed, 1);
    }
    if let Some((start, end)) = job.wait_behind.filter(|_| !stopping.load(Ordering::Relaxed)) {
        // WAIT_BEFORE only: waits for writeback already under way, never
        // starts WB_SYNC_ALL writeback (which hurt interactivity in 2012).
        let _ = crate::sys::sync_file_range(fd, start, end, libc::SYNC_FILE_RANGE_WAIT_BEFORE);
    }
}
