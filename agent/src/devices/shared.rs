//! What a device's flusher thread and the intake task share (`DeviceShared`):
//! its bandwidth estimate, window and chunk, grain and backing, and whether
//! its flusher thread is stalled in one call (`Waiting`, STALLED).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use crate::{backing::Backing, bandwidth::Estimator};

/// What a device's flusher thread and the intake task share.
pub struct DeviceShared {
    pub(super) est: Mutex<Estimator>,
    pub(super) window: AtomicU64,
    pub(super) chunk: AtomicU64,
    /// Spans end at multiples of it (0: anywhere; see compress_grain).
    pub(super) grain: u64,
    /// What backs it: a device whose speed a user sets drives no lever
    /// unless the root policy says `pace_user_devices`, and its flusher
    /// thread counts among the few such devices may have (flusher.rs,
    /// USER_DEVICE_THREADS); a network filesystem's flusher thread never
    /// waits where a silent server would hold it uninterruptibly.
    pub(super) backing: Mutex<Backing>,
    /// How many owner lookups were started for it (devices::owners): only
    /// the latest one's answer is taken.
    pub(super) lookup: AtomicU64,
    /// Since when its flusher thread has been in one call that may block
    /// (an open, starting writeback, waiting for it); None between calls.
    pub(super) waiting: Mutex<Option<Instant>>,
    /// Its count of bytes written (/sys/dev/block/<bdi>/stat), where it is
    /// a block device.
    pub(super) stat: Option<std::path::PathBuf>,
}

/// A device whose flusher thread has been in one call this long is shown
/// as stalled (`wbctl status`): its server or its disk does not answer.  A
/// call covers one chunk (`in_flight_seconds` of the device's bandwidth, at
/// least 1 MiB: 0.1 s of a 10 MiB/s stick; on a network filesystem under
/// its own limit 0.25 s of the link), or opens one file.
pub(super) const STALLED: Duration = Duration::from_secs(5);

/// The flusher thread is in a call that may block, until this is dropped.
pub struct Waiting(Arc<DeviceShared>);

impl Drop for Waiting {
    fn drop(&mut self) {
        *self.0.waiting.lock().unwrap() = None;
    }
}

impl DeviceShared {
    /// A device never measured, for unit tests of its users.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self {
            est: Mutex::new(Estimator::new(100 << 20)),
            window: AtomicU64::new(1 << 20),
            chunk: AtomicU64::new(1 << 20),
            grain: 0,
            backing: Mutex::new(Backing::Disk),
            lookup: AtomicU64::new(0),
            waiting: Mutex::new(None),
            stat: None,
        }
    }

    /// Marks its flusher thread as in a call that may block, until the
    /// guard is dropped.
    pub fn waiting(self: &Arc<Self>) -> Waiting {
        *self.waiting.lock().unwrap() = Some(Instant::now());
        Waiting(self.clone())
    }

    /// How long its flusher thread has been in one call, once that is
    /// STALLED or longer.
    pub fn stalled(&self) -> Option<Duration> {
        self.waiting.lock().unwrap().map(|t| t.elapsed()).filter(|d| *d >= STALLED)
    }

    pub fn backing(&self) -> Backing {
        *self.backing.lock().unwrap()
    }

    /// Whether a user sets the device's speed (their FUSE server, a loop
    /// device over their file, a mount in their namespace).
    pub fn user_made(&self) -> bool {
        self.backing().user_made()
    }

    /// Whether a network filesystem is behind the device (NFS, SMB).
    pub fn network(&self) -> bool {
        self.backing().network()
    }

    /// Whether a span ending at `end` is flushed: on a device with a grain
    /// only at a multiple of it.  The first span can end elsewhere, sized
    /// before BPF knew the grain: the next one takes it in (flush_start).
    pub fn flushes_span_to(&self, end: u64) -> bool {
        self.grain == 0 || end.is_multiple_of(self.grain)
    }

    /// Where a flush from `start` begins: on a device with a grain at the
    /// multiple below, so that what btrfs writes back begins there too (its
    /// range starts at the first dirty page asked for).
    pub fn flush_start(&self, start: u64) -> u64 {
        start.checked_div(self.grain).map_or(start, |q| q * self.grain)
    }

    pub fn window(&self) -> u64 {
        self.window.load(Relaxed)
    }

    /// What the flusher submits at a time, and so keeps in flight.
    pub fn chunk(&self) -> u64 {
        self.chunk.load(Relaxed)
    }

    /// The bytes the device has written since it appeared, where it counts
    /// them (a block device).
    pub fn written(&self) -> Option<u64> {
        crate::bdis::block_stat_written(&std::fs::read_to_string(self.stat.as_ref()?).ok()?)
    }

    /// The flusher measured `bytes` written in `busy` of device time.
    pub fn sample(&self, bytes: u64, busy: Duration) {
        self.est.lock().unwrap().sample(bytes, busy);
    }

    /// Bytes per second.
    pub fn bandwidth(&self) -> u64 {
        self.est.lock().unwrap().estimate()
    }

    /// The estimate and what it has shown it can write (Estimator::
    /// capacity), bytes per second, read together.
    pub fn rates(&self) -> (u64, u64) {
        let est = self.est.lock().unwrap();
        (est.estimate(), est.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flusher_thread_in_one_call_for_5_s_shows_its_device_stalled() {
        let d = Arc::new(DeviceShared::for_tests());
        let waiting = d.waiting();
        assert_eq!(d.stalled(), None, "a call just begun");
        *d.waiting.lock().unwrap() = Instant::now().checked_sub(STALLED + Duration::from_secs(1));
        assert!(d.stalled().is_some_and(|t| t > STALLED), "in one call for 6 s");
        drop(waiting);
        assert_eq!(d.stalled(), None, "the call returned");
    }
}
