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

use crate::counters::{Counters, ErrorKind};

/// Start writeback of [start, end) of `file`; then, like Linus's loop, wait
/// for the span one window behind (`wait_behind`) to finish writeback, which
/// bounds what one stream keeps in flight without making the writer wait.
pub struct Flush {
    pub file: Arc<OwnedFd>,
    pub start: u64,
    pub end: u64,
    pub wait_behind: Option<(u64, u64)>,
}

pub struct Flushers {
    devices: HashMap<String, (mpsc::Sender<Flush>, JoinHandle<()>)>,
    counters: Arc<Counters>,
    /// Set at shutdown: submit what is queued, skip the waits.
    stopping: Arc<AtomicBool>,
}

impl Flushers {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self { devices: HashMap::new(), counters, stopping: Arc::new(AtomicBool::new(false)) }
    }

    pub fn submit(&mut self, bdi: &str, job: Flush) {
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
        let _ = tx.send(job);
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

fn run(rx: mpsc::Receiver<Flush>, counters: Arc<Counters>, stopping: Arc<AtomicBool>) {
    for job in rx {
        let fd = job.file.as_raw_fd();
        match crate::sys::sync_file_range(fd, job.start, job.end, libc::SYNC_FILE_RANGE_WRITE) {
            Ok(()) => {
                counters.add(&counters.spans_flushed, 1);
                counters.add(&counters.bytes_flushed, job.end - job.start);
            }
            Err(e) => {
                counters.error(ErrorKind::SyncFailed);
                tracing::debug!(error = %e, "sync_file_range(WRITE) failed");
                continue;
            }
        }
        if let Some((start, end)) = job.wait_behind.filter(|_| !stopping.load(Ordering::Relaxed)) {
            // WAIT_BEFORE only: waits for writeback already under way, never
            // starts WB_SYNC_ALL writeback (which hurt interactivity in 2012).
            let _ = crate::sys::sync_file_range(fd, start, end, libc::SYNC_FILE_RANGE_WAIT_BEFORE);
        }
    }
}
