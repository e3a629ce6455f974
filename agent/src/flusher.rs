//! One submitter thread per backing device.
//!
//! Seed 003: N threads submitting writeback to one disk seek it all over the
//! place; one submitter keeps locality.  Every flush for a device goes
//! through its thread, in arrival order.  sync_file_range may block on a
//! congested queue, which is why it runs here and not on the async runtime.

use std::{
    collections::{HashMap, VecDeque},
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
/// contiguously.  `owner` names the stream (or the multi-file writer) the
/// batch belongs to, for fair turns.
pub struct Batch {
    pub owner: u64,
    pub flushes: Vec<Flush>,
}

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

/// Batches waiting on one device, by owner.  Service goes in rounds (seed
/// 000): each round gives every owner with work one batch, owners in the
/// order their oldest batch arrived, so a flood of small files cannot starve
/// a big stream on the same device, nor the reverse.
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

fn run(rx: mpsc::Receiver<Batch>, counters: Arc<Counters>, stopping: Arc<AtomicBool>) {
    let mut handles = Handles::default();
    let mut rounds = Rounds::default();
    loop {
        // Block only when there is nothing to do; otherwise take what came.
        if rounds.is_empty() {
            match rx.recv() {
                Ok(b) => rounds.push(b),
                Err(_) => return,
            }
        }
        while let Ok(b) = rx.try_recv() {
            rounds.push(b);
        }
        for batch in rounds.round() {
            for job in batch.flushes {
                flush(job, &mut handles, &counters, &stopping);
            }
            handles.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(owner: u64, n: u64) -> Batch {
        let f = ClosedFile { sb_dev: 0, st_dev: 0, ino: n, generation: 0, fs_root: 0 };
        Batch { owner, flushes: vec![Flush { target: Target::Closed(f), start: 0, end: 1, wait_behind: None }] }
    }

    fn inos(v: Vec<Batch>) -> Vec<u64> {
        v.iter()
            .map(|b| match b.flushes[0].target {
                Target::Closed(f) => f.ino,
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
