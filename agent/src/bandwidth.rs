//! Per-device write bandwidth: what the windows and the pacing budget are
//! sized from: they are tied to the device's measured write bandwidth.
//!
//! Two sources.  The agent's own writeback: the flusher times each range
//! from submission to completion, counting only time the device was busy
//! with the agent's work, so idle periods do not dilute it.  And the
//! kernel's `avg_write_bandwidth` of the bdi, which BPF reads into every
//! event: it counts every writer of the device, which the agent's own
//! samples do not when others share it.  The kernel's estimate starts at
//! 100 MB/s for a device it never measured and moves towards the truth over
//! seconds (Khlebnikov: wrong for a freshly plugged slow stick), so it is
//! believed only once it has moved and the agent's samples had time to
//! confirm it; before any sample the agent slow-starts: a small estimate
//! that at most doubles per completed sample.

use std::time::{Duration, Instant};

/// The kernel's initial estimate (INIT_BW in mm/page-writeback.c: 100 MB/s).
pub const KERNEL_INIT_BW: u64 = 100 << 20;
/// Samples after which the kernel's estimate (smoothed over ~3 s) has had
/// time to converge and may raise the agent's.
const TRUST_KERNEL_AFTER: u32 = 8;
/// Weight of a new sample in the moving average.  The average is of bytes
/// and of seconds separately (a time-weighted rate): averaging rates would
/// let a few short, fast completions (ranges written in parallel with the
/// one before) inflate it.
const EWMA: f64 = 0.25;

#[derive(Debug, Clone)]
pub struct Estimator {
    /// Bytes per second, from the agent's own completions.
    own: Option<f64>,
    /// Their moving sums, bytes and seconds.
    sums: (f64, f64),
    samples: u32,
    slow_start: bool,
    /// Before any sample: the slow-start estimate.
    initial: f64,
    /// The kernel's estimate, once it has left its initial value.
    kernel: Option<f64>,
    /// The agent's FAST_EVIDENCE fastest samples (bytes per second),
    /// fastest first.
    fastest: [f64; FAST_EVIDENCE],
}

/// What a device has shown it can write is the slowest of this many of the
/// agent's fastest samples: no single one marks a disk fast.  A sample is
/// at least MIN_SAMPLE of busy time, and on a block device no more than
/// the device itself counted as written (Sampler::completed): a user
/// who punches out each window they write before the agent flushes it
/// makes ranges that "complete" at once, and raised a 30 MiB/s disk's
/// estimate to 60 MiB/s within three seconds (hardening's phantom windows).
const FAST_EVIDENCE: usize = 3;

impl Estimator {
    /// `initial` bytes per second until something is measured.
    pub fn new(initial: u64) -> Self {
        Self {
            own: None,
            sums: (0.0, 0.0),
            samples: 0,
            slow_start: true,
            initial: initial as f64,
            kernel: None,
            fastest: [0.0; FAST_EVIDENCE],
        }
    }

    /// `bytes` of the agent's writeback completed after `busy` of device time.
    /// Short samples are mostly latency; callers pool them (see `Sampler`).
    pub fn sample(&mut self, bytes: u64, busy: Duration) {
        let secs = busy.as_secs_f64();
        if bytes == 0 || secs <= 0.0 {
            return;
        }
        let rate = bytes as f64 / secs;
        if let Some(i) = self.fastest.iter().position(|&f| rate > f) {
            self.fastest[i..].rotate_right(1);
            self.fastest[i] = rate;
        }
        let prev = self.estimate() as f64;
        let was_slow = self.slow_start;
        self.own = Some(match self.own {
            // Slow start: one sample may at most double the estimate, so a
            // lucky fast completion (a cache in front of a slow stick)
            // cannot open the windows at once.  It ends with the first
            // sample that does not hit that cap.
            _ if self.slow_start => {
                self.slow_start = rate >= 2.0 * prev;
                rate.min(2.0 * prev)
            }
            _ => {
                self.sums.0 += EWMA * (bytes as f64 - self.sums.0);
                self.sums.1 += EWMA * (secs - self.sums.1);
                self.sums.0 / self.sums.1
            }
        });
        if was_slow {
            // Until it ends, the sums start from the capped estimate.
            let own = self.own.unwrap_or(rate);
            self.sums = (own * secs, secs);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// The kernel's avg_write_bandwidth for the device, in bytes per second.
    pub fn kernel(&mut self, bw: u64) {
        if bw != 0 && (bw != KERNEL_INIT_BW || self.kernel.is_some()) {
            self.kernel = Some(bw as f64);
        }
    }

    /// Bytes per second.
    pub fn estimate(&self) -> u64 {
        let est = match (self.own, self.kernel) {
            (Some(own), Some(k)) if self.samples >= TRUST_KERNEL_AFTER => own.max(k),
            (Some(own), _) => own,
            // Measured by the kernel before the agent wrote anything (the
            // daemon restarted, another writer used it): start from that.
            (None, Some(k)) => k,
            (None, None) => self.initial,
        };
        est as u64
    }

    /// What the device has shown it can write: the estimate, or the
    /// slowest of the agent's FAST_EVIDENCE fastest samples (each at least
    /// MIN_SAMPLE of busy time, which no cache in front of a slow stick
    /// sustains at a fast disk's rate) if that is more.  The estimate lags behind a fast disk:
    /// the kernel's stood at 0.25-1.1 GB/s for a raw device that writes 2.8
    /// after a 3.6 GiB copy, and slow start doubles it at most once a
    /// sample.  Whether a device is fast, and a fast one's cap, go by this.
    pub fn capacity(&self) -> u64 {
        (self.estimate() as f64).max(self.fastest[FAST_EVIDENCE - 1]) as u64
    }

    /// Whether the agent has timed writeback of its own here: the kernel's
    /// estimate of a fresh NFS mount starts near 90 MB/s, whatever the link.
    pub fn sampled(&self) -> bool {
        self.own.is_some()
    }
}

/// Pools completions into samples of at least MIN_SAMPLE of busy time and
/// MIN_SAMPLE_BYTES, and counts only time with something in flight.  On a
/// device that counts what it writes (a block device's stat), a sample is
/// no more than the device wrote while the agent had something in flight:
/// a range whose pages are gone before its writeback "completes" at once
/// (FAST_EVIDENCE says how a user made such ranges).
#[derive(Debug, Default)]
pub struct Sampler {
    bytes: u64,
    busy: Duration,
    /// What the device wrote while the agent was busy, pooled; None once a
    /// busy period was not counted (no counter, or its start unread).
    device: Option<u64>,
    counted: bool,
    /// The device's count when the busy period under way began.
    from: Option<u64>,
}

const MIN_SAMPLE: Duration = Duration::from_millis(200);
/// A sample holds at least this much: a few bytes' writeback times the
/// device's latency, not its bandwidth.  A user's trickle of one-byte
/// files, one closed a second, made a sample of 8 bytes in 220 ms on a
/// 30 MiB/s disk while the host was busy compiling: the estimate fell
/// from 46 MB/s to 36 B/s, and the disk, every writer of it, was capped
/// at a 4 KiB budget (hardening's trickle test).
const MIN_SAMPLE_BYTES: u64 = 256 << 10;

impl Sampler {
    /// A range went in flight with nothing else in flight: a busy period
    /// begins, the device having written `written` bytes so far (None: it
    /// does not count them).
    pub fn busy_from(&mut self, written: Option<u64>) {
        self.from = written;
    }

    /// A range of `bytes` completed after `busy` of device time (`idle`:
    /// nothing else is in flight now): a sample once enough has
    /// accumulated.  `written` reads the device's count, at the end of a
    /// busy period or of a sample.  Busy time that pooled less than
    /// MIN_SAMPLE_BYTES is dropped: a device slower than 1.3 MiB/s is left
    /// to the kernel's estimate.
    pub fn completed(
        &mut self,
        bytes: u64,
        busy: Duration,
        idle: bool,
        written: impl FnOnce() -> Option<u64>,
    ) -> Option<(u64, Duration)> {
        if self.bytes == 0 && self.busy.is_zero() {
            self.counted = true;
        }
        self.bytes += bytes;
        self.busy += busy;
        let boundary = self.busy >= MIN_SAMPLE;
        if idle || boundary {
            let now = written();
            match (self.from, now) {
                (Some(from), Some(now)) => *self.device.get_or_insert(0) += now.saturating_sub(from),
                _ => self.counted = false,
            }
            self.from = if idle { None } else { now };
        }
        if !boundary {
            return None;
        }
        let (agent, busy) = (std::mem::take(&mut self.bytes), std::mem::take(&mut self.busy));
        let device = self.device.take().filter(|_| std::mem::take(&mut self.counted));
        let bytes = device.map_or(agent, |d| agent.min(d));
        (bytes >= MIN_SAMPLE_BYTES).then_some((bytes, busy))
    }
}

/// Sizing rules from the policy, applied to a bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    pub window_seconds: f64,
    pub min_window: u64,
    pub max_window: u64,
    pub dirty_seconds: f64,
}

impl Sizing {
    /// The window for a device: `window_seconds` of its bandwidth, within
    /// [min_window, max_window], and never below one maximal request
    /// (smaller spans would only split the device's requests).
    pub fn window(&self, bw: u64, max_request: u64) -> u64 {
        let w = (bw as f64 * self.window_seconds) as u64;
        round_pages(w.clamp(self.min_window, self.max_window).max(max_request))
    }
}

/// Who writes to a device now.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Active {
    /// Files being streamed, and multi-file writers not streaming a file
    /// there (cp -r writing one big file is one writer, not two).
    pub writers: u64,
    /// Of those, the ones whose windows the agent flushes: not a multi-file
    /// writer of small files, whose closed files a paced device leaves to
    /// the kernel's flusher.
    pub windowed: u64,
}

impl Active {
    /// One more writer; `windowed`: the agent flushes its windows.
    pub fn add(&mut self, windowed: bool) {
        self.writers += 1;
        self.windowed += windowed as u64;
    }
}

/// Pacing is for writers that would outrun their device: one counts only
/// while it dirties at least 1/MEANINGFUL of the device's bandwidth.  A
/// slower one holds little dirty (its closed files and windows are flushed
/// behind it anyway), and pacing for it throttles every other writer of the
/// device.  Counting every close kept a device paced at no cost to the one
/// who did it: a 16 MiB burst, then a 1-byte file closed each second, held
/// `strict_limit` for as long as the closes went on.
pub const MEANINGFUL: f64 = 16.0;

/// Whether `bytes` dirtied every `per` is worth pacing a device of `bw` for.
pub fn meaningful(bytes: u64, per: Duration, bw: u64) -> bool {
    bytes as f64 * MEANINGFUL >= bw as f64 * per.as_secs_f64()
}

/// A multi-file writer's recent rate, from the bytes of the files it closed:
/// a sum that decays by e every RATE_TAU, over RATE_TAU.  2 s smooths a
/// writer that closes a file every second or two, and forgets a burst
/// within a few seconds.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    bytes: f64,
    at: Instant,
}

const RATE_TAU: f64 = 2.0;

impl Rate {
    pub fn new(now: Instant) -> Self {
        Self { bytes: 0.0, at: now }
    }

    pub fn add(&mut self, bytes: u64, now: Instant) {
        self.bytes = self.decayed(now) + bytes as f64;
        self.at = now;
    }

    fn decayed(&self, now: Instant) -> f64 {
        self.bytes * (-(now.saturating_duration_since(self.at)).as_secs_f64() / RATE_TAU).exp()
    }

    /// Whether it is worth pacing a device of `bw` for, now.
    pub fn meaningful(&self, now: Instant, bw: u64) -> bool {
        meaningful(self.decayed(now) as u64, Duration::from_secs_f64(RATE_TAU), bw)
    }
}

/// What a device holds, whoever writes to it: at most this many seconds of
/// its bandwidth, unless the policy's own dirty seconds say more.  Room per
/// writer (below) grew with their number: 30 dd held 759 MiB on a 100 MiB/s
/// disk, which a `sync` then waited 7 s for.
pub const DEVICE_SECONDS: f64 = 2.0;

/// The dirty budget for pacing: `dirty_seconds` of bandwidth, but room for
/// every windowed writer's open window plus what is in flight (two windows
/// when none is: the kernel's flusher starts at half the cap), and while
/// writers share the device, `stream_dirty` for each; the room, not
/// `dirty_seconds`, at most DEVICE_SECONDS.  Why `stream_dirty`: under
/// pacing the kernel's flusher writes most of the data (it starts at half
/// the cap, the writers are throttled only above three quarters), one
/// file's dirty pages after another's, and on ext4 and btrfs a file's
/// extents are as long as what is written of it at once.
pub fn dirty_budget(bw: u64, dirty_seconds: f64, stream_dirty: u64, window: u64, active: Active) -> u64 {
    let by_time = (bw as f64 * dirty_seconds) as u64;
    let windows = if active.windowed > 0 { 2 * active.windowed + 2 } else { 2 };
    let by_windows = window.saturating_mul(windows);
    let streams = active.writers;
    let by_streams = if streams >= 2 { stream_dirty.saturating_mul(streams) } else { 0 };
    let bound = (bw as f64 * DEVICE_SECONDS) as u64;
    round_pages(by_time.max(by_windows.max(by_streams).min(bound)))
}

/// The flusher's chunk (see flusher.rs): `seconds` of bandwidth, at least
/// one maximal request (and 1 MiB), in whole pages.
pub fn chunk(bw: u64, seconds: f64, max_request: u64) -> u64 {
    round_pages(((bw as f64 * seconds) as u64).max(max_request).max(1 << 20))
}

pub fn round_pages(b: u64) -> u64 {
    b.div_ceil(4096) * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_fast_disk_shows_its_capacity_before_slow_start_lets_the_estimate_reach_it() {
        let mut e = Estimator::new(2 * MIB);
        e.kernel(250 << 20);
        e.sample(560 * MIB, Duration::from_millis(200));
        assert_eq!(e.estimate(), 500 << 20, "slow start: twice the kernel's estimate");
        assert_eq!(e.capacity(), 500 << 20, "one sample is no evidence");
        e.sample(600 * MIB, Duration::from_millis(200));
        e.sample(580 * MIB, Duration::from_millis(200));
        assert_eq!(e.capacity(), 2800 * MIB, "the slowest of three in 200 ms of busy time each");
        e.sample(100 * MIB, Duration::from_millis(200));
        assert_eq!(e.capacity(), 2800 * MIB, "a slow sample later takes nothing away");
        let mut stick = Estimator::new(2 * MIB);
        for _ in 0..FAST_EVIDENCE {
            stick.sample(30 * MIB, Duration::from_secs(1));
        }
        assert_eq!(stick.capacity(), 30 * MIB, "a stick shows no more than it is");
    }

    #[test]
    fn a_burst_is_forgotten_and_a_trickle_never_counts() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut r = Rate::new(t0);
        r.add(16 * MIB, t0);
        assert!(r.meaningful(at(0.1), 30 * MIB), "16 MiB at once is 8 MiB/s for a while");
        assert!(!r.meaningful(at(6.0), 30 * MIB), "and forgotten within seconds");
        for i in 0..30 {
            r.add(1, at(7.0 + i as f64));
        }
        assert!(!r.meaningful(at(37.0), 30 * MIB), "a byte a second is nothing");
    }

    #[test]
    fn a_writer_closing_a_file_every_second_counts_between_closes() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut r = Rate::new(t0);
        // 4 MiB a second to a 30 MiB/s device: well above 1/16 of it.
        for i in 0..10 {
            r.add(4 * MIB, at(i as f64));
        }
        assert!(r.meaningful(at(9.99), 30 * MIB));
        assert!(meaningful(8 * MIB, Duration::from_secs(8), 10 * MIB), "1 MiB/s to a 10 MiB/s stick");
        assert!(!meaningful(8 * MIB, Duration::from_secs(8), 100 * MIB), "but not to a 100 MiB/s disk");
    }

    #[test]
    fn slow_start_doubles_at_most_per_sample() {
        let mut e = Estimator::new(4 * MIB);
        assert_eq!(e.estimate(), 4 * MIB);
        // The device really does 100 MiB/s: the estimate climbs 8, 16, 32,
        // 64, then takes the first sample below the cap as it is.
        for want in [8, 16, 32, 64, 100] {
            e.sample(100 * MIB, Duration::from_secs(1));
            assert_eq!(e.estimate(), want * MIB);
        }
        // After slow start, one odd sample moves it only part of the way.
        e.sample(20 * MIB, Duration::from_secs(1));
        assert_eq!(e.estimate(), 80 * MIB);
        e.sample(100 * MIB, Duration::from_secs(1));
        assert_eq!(e.estimate(), 85 * MIB);
    }

    #[test]
    fn fast_short_completions_do_not_inflate_the_rate() {
        let mut e = Estimator::new(100 * MIB);
        e.sample(100 * MIB, Duration::from_secs(1)); // ends slow start at 100
        // The device does 100 MiB/s; completions come in a long one and a
        // short one (written in parallel with it): 90 MiB in 0.9 s, 10 MiB
        // in 0.1 s.  The mean of their rates would be 100 for each pair
        // anyway; with 90 MiB/0.5 s and 10 MiB/0.5 s (180 and 20), the
        // mean of rates stays 100, and so must the time-weighted rate.
        for _ in 0..50 {
            e.sample(90 * MIB, Duration::from_millis(500));
            e.sample(10 * MIB, Duration::from_millis(500));
        }
        let est = e.estimate() as f64 / MIB as f64;
        assert!((85.0..=115.0).contains(&est), "{est}");
        // Short and fast, long and slow: rates 200 and 50 (mean 125), time-weighted 80.
        for _ in 0..50 {
            e.sample(20 * MIB, Duration::from_millis(100));
            e.sample(50 * MIB, Duration::from_secs(1));
        }
        let est = e.estimate() as f64 / MIB as f64;
        assert!(est < 100.0, "{est}");
    }

    #[test]
    fn kernel_initial_value_is_not_believed() {
        let mut e = Estimator::new(4 * MIB);
        e.kernel(KERNEL_INIT_BW);
        assert_eq!(e.estimate(), 4 * MIB);
        assert!(!e.sampled());
        // Once it moved, it is a prior for a device the agent never timed.
        e.kernel(80 * MIB);
        assert_eq!(e.estimate(), 80 * MIB);
        // ...and from then on even its initial value is a real measurement.
        e.kernel(KERNEL_INIT_BW);
        assert_eq!(e.estimate(), KERNEL_INIT_BW);
    }

    #[test]
    fn slow_stick_is_not_overestimated_while_the_kernel_converges() {
        // A 30 MiB/s stick; the kernel's estimate drifts down from 100 MB/s.
        let mut e = Estimator::new(4 * MIB);
        for k in [95, 90, 80] {
            e.kernel(k * MIB);
            e.sample(30 * MIB, Duration::from_secs(1));
        }
        assert!(e.estimate() <= 30 * MIB, "{}", e.estimate() / MIB);
    }

    #[test]
    fn shared_device_uses_the_kernel_once_converged() {
        // Another writer takes half the device: the agent's own completions
        // see 50 MiB/s, the kernel's estimate counts both: 100 MiB/s.
        let mut e = Estimator::new(4 * MIB);
        for _ in 0..TRUST_KERNEL_AFTER + 10 {
            e.kernel(100 * MIB + 1);
            e.sample(50 * MIB, Duration::from_secs(1));
        }
        assert_eq!(e.estimate(), 100 * MIB + 1);
    }

    #[test]
    fn idle_time_is_not_a_sample() {
        let mut s = Sampler::default();
        assert_eq!(s.completed(MIB, Duration::from_millis(10), false, || None), None);
        assert_eq!(
            s.completed(4 * MIB, Duration::from_millis(190), false, || None),
            Some((5 * MIB, Duration::from_millis(200)))
        );
        assert_eq!(s.completed(MIB, Duration::ZERO, false, || None), None);
    }

    /// A range whose pages were punched out before its writeback counts
    /// the bytes it names, in no time: the device's own count says what
    /// was written.
    #[test]
    fn a_sample_is_no_more_than_the_device_counted_while_busy() {
        let mut s = Sampler::default();
        s.busy_from(Some(1000 * MIB));
        assert_eq!(s.completed(6 * MIB, Duration::from_millis(190), false, || panic!("not read mid-sample")), None);
        // 500 MiB of phantom ranges in 10 ms; the device wrote 6 MiB.
        let sample = s.completed(500 * MIB, Duration::from_millis(10), false, || Some(1006 * MIB));
        assert_eq!(sample, Some((6 * MIB, Duration::from_millis(200))));
        // Idle between busy periods: what others wrote then is not counted.
        assert_eq!(s.completed(2 * MIB, Duration::from_millis(100), true, || Some(1008 * MIB)), None);
        s.busy_from(Some(1500 * MIB));
        let sample = s.completed(3 * MIB, Duration::from_millis(100), true, || Some(1503 * MIB));
        assert_eq!(sample, Some((5 * MIB, Duration::from_millis(200))));
        // No counter (btrfs's own bdi, a network filesystem): as before.
        s.busy_from(None);
        let sample = s.completed(300 * MIB, Duration::from_millis(200), true, || None);
        assert_eq!(sample, Some((300 * MIB, Duration::from_millis(200))));
    }

    /// One-byte files' writeback is latency: no sample, however long it
    /// goes on, and at most MIN_SAMPLE of it pooled into the next real one.
    #[test]
    fn a_trickle_of_tiny_writes_is_no_sample() {
        let mut s = Sampler::default();
        for _ in 0..100 {
            assert_eq!(s.completed(1, Duration::from_millis(28), false, || None), None);
        }
        // At most MIN_SAMPLE of latency pooled before the next real one.
        let sample = (0..8).find_map(|_| s.completed(MIB, Duration::from_millis(30), false, || None));
        let (bytes, busy) = sample.expect("a real sample");
        assert!(bytes as f64 / busy.as_secs_f64() > 4.0 * MIB as f64, "{bytes} bytes in {busy:?}");
    }

    #[test]
    fn windows_follow_bandwidth_within_bounds() {
        let z = Sizing { window_seconds: 0.5, min_window: 2 * MIB, max_window: 64 * MIB, dirty_seconds: 1.0 };
        assert_eq!(z.window(100 * MIB, 0), 50 * MIB);
        assert_eq!(z.window(30 * MIB, 0), 15 * MIB);
        assert_eq!(z.window(MIB, 0), 2 * MIB);
        assert_eq!(z.window(2000 * MIB, 0), 64 * MIB);
        // Never below one maximal request of the device.
        assert_eq!(z.window(MIB, 4 * MIB), 4 * MIB);
        // Page aligned.
        assert_eq!(z.window(3 * MIB + 7, 0) % 4096, 0);
    }

    fn streams(n: u64) -> Active {
        Active { writers: n, windowed: n }
    }

    #[test]
    fn budget_leaves_room_for_every_stream() {
        assert_eq!(dirty_budget(100 * MIB, 1.0, 0, 8 * MIB, streams(1)), 100 * MIB);
        assert_eq!(dirty_budget(100 * MIB, 0.1, 0, MIB, streams(30)), MIB * 62);
    }

    #[test]
    fn budget_is_bounded_by_the_device_whoever_writes() {
        // 30 and 1,000 writers at 32 MiB each: 2 s of the device.
        assert_eq!(dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, streams(30)), 200 * MIB);
        assert_eq!(dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, streams(1000)), 200 * MIB);
        // Unless the policy's own dirty seconds say more.
        assert_eq!(dirty_budget(100 * MIB, 3.0, 32 * MIB, 3 * MIB, streams(30)), 300 * MIB);
    }

    #[test]
    fn budget_gives_shared_devices_room_per_stream() {
        // One stream (cp -r writes one file at a time): no share; ten: 32 MiB each.
        assert_eq!(dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, streams(1)), 12 * MIB);
        assert_eq!(dirty_budget(200 * MIB, 0.1, 32 * MIB, 3 * MIB, streams(10)), 320 * MIB);
    }

    #[test]
    fn budget_keeps_no_window_room_for_files_left_to_the_kernel() {
        // tar x alone: dirty_seconds, at least two windows.
        let tar = Active { writers: 1, windowed: 0 };
        assert_eq!(dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, tar), 10 * MIB);
        assert_eq!(dirty_budget(30 * MIB, 0.1, 32 * MIB, 2 * MIB, tar), 4 * MIB);
        // Beside a stream, each still has its share.
        let both = Active { writers: 2, windowed: 1 };
        assert_eq!(dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, both), 64 * MIB);
    }
}
