//! The agent's table of active streams: which file each streaming writer is
//! filling, the read-only handle the agent holds on it, and its totals.
//! Owned by the intake task alone, so it needs no lock.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::Arc,
    time::Instant,
};

use crate::{
    abi::{EventKind, wb_event},
    counters::{Counters, ErrorKind},
    flusher::{Flush, Flushers},
    sys::{self, FileId},
};

/// A stream is one process writing one file through one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StreamKey {
    tgid: u32,
    fd: i32,
    file: FileId,
}

struct Stream {
    file: Arc<OwnedFd>,
    pidfd: OwnedFd,
    comm: String,
    bdi: String,
    started: Instant,
    bytes: u64,
    spans: u64,
    /// The last span handed to writeback: the next span waits for it.
    last_span: Option<(u64, u64)>,
}

pub struct StreamTable {
    streams: HashMap<StreamKey, Stream>,
    flushers: Flushers,
    counters: Arc<Counters>,
}

impl StreamTable {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self { streams: HashMap::new(), flushers: Flushers::new(counters.clone()), counters }
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    pub fn handle(&mut self, kind: EventKind, ev: &wb_event) {
        self.counters.add(&self.counters.events, 1);
        let key = StreamKey {
            tgid: ev.tgid,
            fd: ev.fd,
            file: FileId { dev: ev.st_dev(), ino: ev.ino },
        };
        match kind {
            EventKind::Span => self.span(key, ev),
            EventKind::Close => self.close(key, ev),
        }
    }

    fn span(&mut self, key: StreamKey, ev: &wb_event) {
        if !self.streams.contains_key(&key) {
            match sys::open_writer_file(key.tgid, key.fd, key.file) {
                Ok((file, pidfd)) => {
                    let stream = Stream {
                        file: Arc::new(file),
                        pidfd,
                        comm: ev.comm(),
                        bdi: ev.bdi(),
                        started: Instant::now(),
                        bytes: 0,
                        spans: 0,
                        last_span: None,
                    };
                    tracing::info!(
                        pid = key.tgid, comm = %stream.comm, fd = key.fd, ino = key.file.ino,
                        bdi = %stream.bdi, "stream started"
                    );
                    self.counters.add(&self.counters.streams_started, 1);
                    self.streams.insert(key, stream);
                }
                Err(kind) => {
                    self.counters.error(kind);
                    tracing::debug!(pid = key.tgid, fd = key.fd, error = kind.name(), "span skipped");
                    return;
                }
            }
        }
        let s = self.streams.get_mut(&key).expect("inserted above");
        s.bytes += ev.end - ev.start;
        s.spans += 1;
        let wait_behind = s.last_span.replace((ev.start, ev.end));
        let job = Flush { file: s.file.clone(), start: ev.start, end: ev.end, wait_behind };
        self.flushers.submit(&s.bdi, job);
    }

    /// The writer closed the file: hand its tail to writeback and let go of it.
    fn close(&mut self, key: StreamKey, ev: &wb_event) {
        let Some(s) = self.streams.remove(&key) else { return };
        let tail = ev.end - ev.start;
        let job = Flush { file: s.file.clone(), start: ev.start, end: ev.end, wait_behind: None };
        self.flushers.submit(&s.bdi, job);
        self.ended(key, s, tail, "closed");
    }

    /// Drops streams whose writer exited without the agent seeing a close
    /// (a lost event): holding their files would pin the inode and the mount.
    pub fn reap_exited(&mut self) {
        let gone: Vec<StreamKey> =
            self.streams.iter().filter(|(_, s)| sys::pidfd_exited(&s.pidfd)).map(|(k, _)| *k).collect();
        for key in gone {
            let s = self.streams.remove(&key).expect("listed above");
            self.ended(key, s, 0, "writer exited");
        }
    }

    fn ended(&self, key: StreamKey, s: Stream, tail: u64, why: &str) {
        let secs = s.started.elapsed().as_secs_f64();
        tracing::info!(
            pid = key.tgid, comm = %s.comm, fd = key.fd, ino = key.file.ino, bdi = %s.bdi,
            bytes = s.bytes + tail, spans = s.spans, secs = format!("{secs:.1}"),
            "stream ended ({why})"
        );
    }

    /// Ends every stream (daemon shutdown) after queued spans are submitted.
    pub fn shutdown(&mut self) {
        self.flushers.shutdown();
        for (key, s) in std::mem::take(&mut self.streams) {
            self.ended(key, s, 0, "daemon stopping");
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Errors of kind `kind` are counted by the caller (ring-buffer decode).
    pub fn error(&self, kind: ErrorKind) {
        self.counters.error(kind);
    }
}
