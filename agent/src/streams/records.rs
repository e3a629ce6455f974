//! What the stream table keeps of each stream and writer: the stream's
//! key and record, a writer's closed files waiting to go out together or
//! left to the kernel, and a multi-file writer's totals.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use super::IDLE_MAX;
use crate::{
    abi::{RelPath, wb_event},
    bandwidth::{self, Rate},
    flusher::{Batch, Flush, StreamFile},
    handles::ClosedFile,
    sys::FileId,
};

/// A stream is one process writing one file.  Not keyed by descriptor: the
/// fentry backend reports closes after the fd left the table (fd -1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct StreamKey {
    pub(super) tgid: u32,
    pub(super) file: FileId,
}

pub(super) struct Stream {
    /// Unique among this daemon's streams: its turn in the flusher's rounds.
    pub(super) id: u64,
    pub(super) file: Arc<StreamFile>,
    /// The writer's descriptor at its latest window (it may dup and close).
    pub(super) fd: i32,
    /// The owner whose share of the streams it takes (BPF's current_owner:
    /// the writer's real uid, or whoever made its user namespace).
    pub(super) user: u32,
    pub(super) comm: String,
    /// Its writer's cgroup at its start, and the systemd unit that names.
    pub(super) cgroup: String,
    pub(super) unit: String,
    pub(super) bdi: String,
    pub(super) started: Instant,
    pub(super) bytes: u64,
    pub(super) spans: u64,
    pub(super) last_span: Instant,
    /// Between its latest two windows: a slow stream is not idle sooner.
    pub(super) gap: Duration,
    /// Its latest window's bytes: written in `gap`, its rate.
    pub(super) last_bytes: u64,
    /// Its writer's policy observes: its windows and close are counted as
    /// would-be writeback, its file never opened.
    pub(super) observe: bool,
}

impl Stream {
    /// Whether it still counts as writing: it had a window within `quiet`,
    /// or within twice its own pace for a slow stream (up to IDLE_MAX), so
    /// that slow downloads do not flap the device's pacing at every window.
    pub(super) fn writing(&self, now: Instant, quiet: Duration) -> bool {
        now - self.last_span < quiet.max((2 * self.gap).min(IDLE_MAX))
    }

    /// Whether it counts for pacing its device (of bandwidth `bw`): still
    /// writing, at a meaningful rate (its first window always is), or on a
    /// device all of whose writers together dirty at one.
    pub(super) fn counts(&self, now: Instant, quiet: Duration, bw: u64, device_busy: bool) -> bool {
        self.writing(now, quiet) && (device_busy || bandwidth::meaningful(self.last_bytes, self.gap, bw))
    }
}

/// Closed files of one writer waiting to be submitted together.
pub(super) struct Pending {
    pub(super) batch: Batch,
    pub(super) bytes: u64,
    pub(super) since: Instant,
}

/// The latest closed files of one writer left to the kernel's flusher on a
/// paced device, up to the device's budget: all that can still be dirty.
/// Flushed when the writer ends: once the device is released its pages are
/// below every threshold, and the kernel would leave them for
/// dirty_expire (30 s) — a stick would look done long before it is.
#[derive(Default)]
pub(super) struct Left {
    pub(super) flushes: VecDeque<Flush>,
    pub(super) bytes: u64,
}

impl Left {
    pub(super) fn batch(self, pid: u32) -> Batch {
        Batch { owner: pid as u64, flushes: self.flushes.into() }
    }
}

/// A process whose closed files are being flushed (tar x, cp -r, rsync), or
/// whose windows are reached by handle (mmap stores, io_uring): `files`
/// counts both.
pub(super) struct Writer {
    pub(super) comm: String,
    /// Its cgroup at its first event, and the systemd unit that names.
    pub(super) cgroup: String,
    pub(super) unit: String,
    pub(super) bdi: String,
    pub(super) files: u64,
    pub(super) bytes: u64,
    pub(super) started: Instant,
    pub(super) last: Instant,
    /// What its closed files (and windows reached by handle) add up to
    /// lately: it counts for pacing only while that is meaningful.
    pub(super) rate: Rate,
    /// Some of its files are reached by handle a window at a time (mmap,
    /// io_uring): those windows are the agent's to flush, and need room in
    /// the device's budget.
    pub(super) windowed: bool,
    /// It writes a block device through its node: nothing of it is
    /// reached, its device is paced (StreamTable::block_device).
    pub(super) block_device: bool,
    /// Its policy observes (as of its first event): what it would have
    /// done is counted, and its device's pacing is a would.
    pub(super) observe: bool,
}

impl Writer {
    pub(super) fn new(
        comm: String,
        (cgroup, unit): (String, String),
        bdi: String,
        now: Instant,
        block_device: bool,
        observe: bool,
    ) -> Self {
        Self {
            comm,
            cgroup,
            unit,
            bdi,
            files: 0,
            bytes: 0,
            started: now,
            last: now,
            rate: Rate::new(now),
            windowed: false,
            block_device,
            observe,
        }
    }

    /// Its next file (or, for a block device, its next window) of `bytes`.
    pub(super) fn add(&mut self, bytes: u64, now: Instant) {
        self.files += 1;
        self.bytes += bytes;
        self.last = now;
        self.rate.add(bytes, now);
    }

    /// Whether it ended, its process `pid` gone or nothing from it for
    /// `idle`: then logged as ended.
    pub(super) fn ended(&self, pid: u32, now: Instant, idle: Duration) -> bool {
        let why = if !crate::sys::process_exists(pid) {
            "exited"
        } else if now - self.last >= idle {
            "idle"
        } else {
            return false;
        };
        let (comm, secs) =
            (crate::status::printable(&self.comm), format!("{:.1}", (self.last - self.started).as_secs_f64()));
        // A block device's writer has no files: its spans are windows.
        if self.block_device {
            tracing::info!(pid, %comm, windows = self.files, bytes = self.bytes, secs, why, "{} writer ended", self.kind());
        } else {
            tracing::info!(pid, %comm, files = self.files, bytes = self.bytes, secs, why, "{} writer ended", self.kind());
        }
        true
    }

    /// What `wbctl streams` and the journal call it.
    pub(super) fn kind(&self) -> &'static str {
        if self.block_device { "block-device" } else { "multi-file" }
    }
}

/// What names the event's inode for good, to open it by handle (or, on a
/// filesystem without handles, by the path a close reported).
pub(super) fn closed_file(key: StreamKey, ev: &wb_event, path: Option<RelPath>) -> ClosedFile {
    ClosedFile {
        sb_dev: crate::abi::kernel_dev_to_user(ev.sb_dev),
        st_dev: key.file.dev,
        ino: key.file.ino,
        generation: ev.generation,
        fs_root: ev.fs_root,
        fs_magic: ev.fs_magic,
        path,
    }
}
