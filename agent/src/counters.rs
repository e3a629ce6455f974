//! What the agent counts.  Shared by the intake task and the flusher threads;
//! plain relaxed atomics, read as a snapshot for logs and (later) wbctl.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why an event led to no flush, or a flush failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The writer exited before the agent could reach its file.
    ProcessGone,
    /// The descriptor was closed before the agent could reach it.
    FileGone,
    /// The descriptor now names another inode: the agent did nothing.
    IdentityMismatch,
    /// The kernel refused access to the writer's file.
    Permission,
    /// sync_file_range failed (EIO, device gone, ...).
    SyncFailed,
    /// A closed file on a filesystem the agent cannot reach by handle.
    NoHandle,
    /// A record from the ring buffer that does not decode.
    BadEvent,
    /// A cap was reached (files held, flushes queued): the excess is left
    /// to the kernel's own writeback.
    OverCap,
    /// No thread could be started for a device (TasksMax, pids.max, memory):
    /// its flushes are left to the kernel until one can.
    NoThread,
    Other,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 10] = [
        Self::ProcessGone,
        Self::FileGone,
        Self::IdentityMismatch,
        Self::Permission,
        Self::SyncFailed,
        Self::NoHandle,
        Self::BadEvent,
        Self::OverCap,
        Self::NoThread,
        Self::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::ProcessGone => "process_gone",
            Self::FileGone => "file_gone",
            Self::IdentityMismatch => "identity_mismatch",
            Self::Permission => "permission",
            Self::SyncFailed => "sync_failed",
            Self::NoHandle => "no_handle",
            Self::BadEvent => "bad_event",
            Self::OverCap => "over_cap",
            Self::NoThread => "no_thread",
            Self::Other => "other",
        }
    }
}

#[derive(Default)]
pub struct Counters {
    pub events: AtomicU64,
    pub streams_started: AtomicU64,
    pub spans_flushed: AtomicU64,
    pub bytes_flushed: AtomicU64,
    /// Files flushed after their writer closed them (reached by handle or path).
    pub closed_files_flushed: AtomicU64,
    /// Of those, the ones looked up by path (filesystems without file handles).
    pub closed_files_by_path: AtomicU64,
    /// Closed files left to the kernel's flusher: their device was paced.
    pub closed_files_left: AtomicU64,
    /// Closes that waited in the ring for half a second or more (an agent
    /// behind a flood), of files it did not hold: left to the kernel.
    pub closes_shed_late: AtomicU64,
    /// Events of devices the policy's leave_devices lists: left alone.
    pub left_by_policy: AtomicU64,
    /// What observing writers' events would have had the agent do (policy
    /// mode "observe", streams/would.rs): streams started (no file held),
    /// windows and closed files' tails handed to writeback, their bytes,
    /// and closed files left to a paced device's kernel flusher.
    pub would_streams_started: AtomicU64,
    pub would_windows: AtomicU64,
    pub would_close_files: AtomicU64,
    pub would_write_bytes: AtomicU64,
    pub would_closed_files_left: AtomicU64,
    /// Control socket clients refused for lack of a slot: their user held
    /// its share (a subordinate uid counting as its owner).
    pub control_refused: AtomicU64,
    /// Metrics listener connections refused for lack of a slot: their user
    /// or host held its share.
    pub metrics_refused: AtomicU64,
    errors: [AtomicU64; ErrorKind::ALL.len()],
}

impl Counters {
    pub fn add(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors_add(kind, 1);
    }

    pub fn errors_add(&self, kind: ErrorKind, n: u64) {
        self.errors[kind as usize].fetch_add(n, Relaxed);
    }

    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        ErrorKind::ALL.iter().map(|&k| (k.name(), self.errors[k as usize].load(Relaxed))).collect()
    }

    /// Every counter by name, errors as error_<kind>.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        let mut m: std::collections::BTreeMap<String, u64> = [
            ("events", &self.events),
            ("streams_started", &self.streams_started),
            ("spans_flushed", &self.spans_flushed),
            ("bytes_flushed", &self.bytes_flushed),
            ("closed_files_flushed", &self.closed_files_flushed),
            ("closed_files_by_path", &self.closed_files_by_path),
            ("closed_files_left", &self.closed_files_left),
            ("closes_shed_late", &self.closes_shed_late),
            ("events_left_by_policy", &self.left_by_policy),
            ("would_streams_started", &self.would_streams_started),
            ("would_windows", &self.would_windows),
            ("would_close_files", &self.would_close_files),
            ("would_write_bytes", &self.would_write_bytes),
            ("would_closed_files_left", &self.would_closed_files_left),
            ("control_refused", &self.control_refused),
            ("metrics_refused", &self.metrics_refused),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.load(Relaxed)))
        .collect();
        m.extend(self.errors().into_iter().map(|(k, v)| (format!("error_{k}"), v)));
        m
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}
