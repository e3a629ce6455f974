//! The decision of one device's tick, a pure function of what it reads
//! (`Inputs`): the device's state, the root policy's figures, its writers,
//! what the pacer knows of it and the clock.  It says what chunk and window
//! the device gets, whether it is fast, and what to tell the pacer
//! (`Action`: keep, cap, release or stall); once the pacer has answered,
//! `batch_closes` and `push` say what BPF's entry for it becomes.  The
//! rules' constants, and the measurements behind them, are here;
//! Devices::tick_one gathers the inputs and does the writes.

use std::time::{Duration, Instant};

use crate::{
    backing::Backing,
    bandwidth::{self, Active, Sizing},
};

/// A device stays paced this long after its last writer that counted
/// (`busy`), so that a writer between two files is not released and
/// re-throttled.
pub(super) const LINGER: Duration = Duration::from_secs(2);
/// A network filesystem's budget is at least this many seconds of its
/// bandwidth: there dirty + writeback also holds what was written UNSTABLE
/// and not yet committed.  A 512 MiB cp over NFS on an emulated Wi-Fi link
/// (26 MiB/s) took 1.17-1.18x the kernel default's time to `sync` done on a
/// cap of 8.5 MiB (two windows), its peak 14-17 MiB: the writer also waited
/// for COMMITs' round trips.  Half a second stays within the 2 s of the
/// link that peak dirty may be; under its own limit four windows of
/// NETWORK_WINDOW_SECONDS make one writer's budget a second (peak 26-30
/// MiB at 26 MiB/s).
pub(super) const NETWORK_DIRTY_SECONDS: f64 = 0.5;
/// A network filesystem's windows and chunks are at least this many seconds
/// of its measured bandwidth where it has a dirty limit of its own (6.2+).
/// Each sync_file_range on NFS ends with a COMMIT of the file, which the
/// server turns into an fsync: a 512 MiB cp over the emulated Wi-Fi link on
/// 6.12 took 0.97-1.06x the default's time to `sync` done with 102-120
/// COMMITs, against 1.01-1.08x and 416 in 2 MiB windows.  Not yet under
/// the global limit (6.1), where what is in flight counts against the limit
/// every writer shares: with the floor there the Wi-Fi copy took 0.90-1.16x
/// (gigabit 1.00x), without it 0.90-1.18x (1.13x), one guest run each, too
/// close to decide.  An SMB copy crawled in both runs, so the floor was not
/// its cause (Backing::global_lever says what was).
pub(super) const NETWORK_WINDOW_SECONDS: f64 = 0.25;
/// A fast device is paced once its dirty and writeback pages pass this many
/// budgets of one writer, or a writer of small files (SMALL_FILES) counts.
/// Before that its writeback keeps up with what is dirtied, and a cap would
/// only slow the writer: on a 2.8 GB/s device a cap of 0.1 s held `cp -r`
/// of 3.6 GiB at about 1.5 GB/s in balance_dirty_pages (1.09x the kernel
/// default's time to `sync` done on ext4, 1.13x on xfs), where the agent's
/// windows alone kept it at 381 MiB dirty, about one budget.  Nor does a
/// writer's rate decide it: `cp` from the page cache fills a 2.8 GB/s
/// device's windows at more than four times its speed for a moment, and a
/// cap at that moment cost xfs's copy 1.18x the default's time to `sync`
/// done, against 0.77-0.96x without it.
pub const OUTRUN: u64 = 2;
/// Only a device at least this fast (Estimator::capacity) waits for its
/// writeback to fall behind; a slower one is capped at a counted writer's
/// first window, as before.
/// There a memory-speed writer (1 GB/s on this VM) outruns the device
/// anyway and waiting only lets its first burst grow, and a writer slower
/// than the device but above a sixteenth of it stays paced: the guests'
/// service checks pace 6-16 MiB/s writers of their disk, and a systest
/// run without this bound on 6.1 found none of them paced.
const FAST_DEVICE: u64 = 1 << 30;
/// A writer whose closed files average less than this is paced at once
/// too: under the cap the kernel's flusher writes small files in bulk,
/// where the agent would flush each (`tar x` of 30,000 files of 1-148 KiB
/// beside a 1 GiB dd on btrfs, device not capped: 8.38 s to `sync` done
/// against 6.77 s capped, the system's CPU 12.5 s against 9.9).
pub const SMALL_FILES: u64 = 1 << 20;
/// The budget is rewritten only when it moved by more than this fraction.
const BUDGET_SLACK: f64 = 0.1;
/// A device's writers within their burst allowances hold at most this many
/// seconds of its bandwidth (at least one root-policy burst) before every
/// writer of it streams (BPF's pool_spent), and while it holds more, it is
/// paced.  A quarter of what pacing holds it to (bandwidth::
/// DEVICE_SECONDS): the writers' first burst passes the cap by 80-290 MiB
/// at 100 MiB/s.  A hundred dd of 8 MiB each, each within its 16 MiB
/// burst, held 792 MiB on a 100 MiB/s device unseen; with a pool of a
/// second, 204-262 MiB, of half a second 159-211.
pub(super) const POOL_SECONDS: f64 = crate::abi::WB_POOL_MS as f64 / 1000.0;

/// The root policy's figures a device's tick reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct Figures {
    /// The root policy paces, and is not turned off on battery now.
    pub pacing: bool,
    pub pace_user_devices: bool,
    /// The sizing in force (None: fixed windows of `fixed_window`).
    pub sizing: Option<Sizing>,
    pub fixed_window: u64,
    pub in_flight_seconds: f64,
    pub stream_dirty: u64,
    /// One process's burst allowance.
    pub burst: u64,
}

/// What the device's record, and the part it shares with its flusher
/// thread, hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeviceView {
    /// Its estimate and what it has shown it can write (Estimator::
    /// capacity), bytes per second.
    pub bw: u64,
    pub capacity: u64,
    /// The agent has timed it (Estimator::sampled).
    pub sampled: bool,
    pub backing: Backing,
    /// Paced through a dirty limit of its own (the bdi lever).
    pub own_limit: bool,
    /// One maximal request of the device.
    pub max_request: u64,
    /// Its capacity has reached FAST_DEVICE once.
    pub fast: bool,
    /// Capped before it was known to be fast.
    pub capped_slow: bool,
    /// Dirty + writeback bytes at its latest event, and when that was.
    pub dirty: u64,
    pub last_event: Instant,
    /// The dirty cap the agent set, 0 when not pacing.
    pub budget: u64,
    /// When a writer last counted for pacing, and one of small files.
    pub last_busy: Option<Instant>,
    pub last_small_files: Option<Instant>,
    /// Its flusher thread has been in one call for STALLED or longer.
    pub stalled: bool,
}

/// What the pacer knows of the device.
#[derive(Debug, Clone, Copy)]
pub(super) struct PacerView {
    /// The policy's dirty seconds as the device's lever needs them
    /// (Pacer::dirty_seconds).
    pub dirty_seconds: f64,
    /// It gave up its budget under the global lever (Pacer::stall).
    pub is_stalled: bool,
    pub is_paced: bool,
}

/// Everything a device's tick decides from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Inputs {
    pub now: Instant,
    pub figures: Figures,
    /// The global limit is left to the administrator (Devices::yield_global).
    pub yield_global: bool,
    /// Who writes to the device now.
    pub active: Active,
    pub device: DeviceView,
    pub pacer: PacerView,
}

/// What a device's tick does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Decision {
    /// What its flusher submits at a time, and the root policy's window.
    pub chunk: u64,
    pub window: u64,
    /// The smallest window and chunk worth a sync_file_range (BPF's too).
    pub floor: u64,
    /// The record's new `fast`.
    pub fast: bool,
    /// The device may be paced now (batch_closes).
    pub pacing: bool,
    /// The device's burst pool, bytes (BPF's wb_device.pool_pages).
    pub pool: u64,
    pub action: Action,
}

/// What the pacer is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Action {
    /// Nothing: the budget stays as it is.
    Keep,
    /// Cap the device at `budget` (Pacer::pace).  `why`: it was not capped,
    /// and the log line says why it is now; `capped_slow`: the record's new
    /// `capped_slow`.
    Cap { budget: u64, why: Option<&'static str>, capped_slow: bool },
    /// Put the administrator's values back (Pacer::release).
    Release { why: ReleaseWhy },
    /// Capped, its flusher thread stalled: it holds `held` bytes
    /// (Pacer::stall).
    Stall { held: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReleaseWhy {
    /// Capped while thought slow, since shown fast, and its writeback
    /// keeps up: logged, and no longer `capped_slow`.
    Fast,
    /// Not to be paced now (no writer counts, pacing is off, or the
    /// device's lever is not to be used), but paced.
    Unpaced,
}

/// The smallest window and chunk worth a sync_file_range at bw: one
/// maximal request; on a network filesystem with a limit of its own, once
/// the agent has timed it (`network_timed`: a link is not assumed fast),
/// NETWORK_WINDOW_SECONDS.
pub(super) fn floor(max_request: u64, network_timed: bool, bw: u64) -> u64 {
    if network_timed {
        max_request.max(bandwidth::round_pages((bw as f64 * NETWORK_WINDOW_SECONDS) as u64))
    } else {
        max_request
    }
}

/// Whether `t` is less than LINGER before `now`.
fn within_linger(t: Option<Instant>, now: Instant) -> bool {
    t.is_some_and(|t| now.saturating_duration_since(t) < LINGER)
}

/// One device's tick.
pub(super) fn decide(i: &Inputs) -> Decision {
    let (f, d, p) = (&i.figures, &i.device, &i.pacer);
    let mut pacing = f.pacing;
    pacing &= f.pace_user_devices || !d.backing.user_made();
    pacing &= d.own_limit || (d.backing.global_lever() && !i.yield_global);
    let fast = d.fast || d.capacity >= FAST_DEVICE;
    let floor = floor(d.max_request, d.own_limit && d.backing.network() && d.sampled, d.bw);
    let chunk = bandwidth::chunk(d.bw, f.in_flight_seconds, floor);
    // BPF sizes each writer's window from bw with its own policy; the
    // root policy's window here sizes batches and the dirty budget.
    let window = f.sizing.map_or(f.fixed_window, |z| z.window(d.bw, floor));
    // Sized by what it has shown it can write (never below its estimate).
    let pool = pool(d.capacity, f.burst);
    // What the device holds, whoever wrote it: while it holds more than
    // its pool, as its latest event said, it is paced with no writer
    // counting, until what that event counted could have drained.  A
    // thousand dd of 2 MiB each, each gone within a second, let pacing end
    // four times while the device held 0.2-0.9 GB (1.1-1.2 GB at its
    // peak): the cap held the writers in balance_dirty_pages, where they
    // send no event, for longer than LINGER.
    let crowded = d.dirty > pool && not_drained(d.dirty, d.capacity, Some(d.last_event), i.now);
    let busy = i.active.writers > 0 || within_linger(d.last_busy, i.now) || crowded;
    let action = if pacing && d.budget != 0 && d.stalled {
        // Its writers wait for it whatever the cap; what it holds is
        // counted for the others' sake (at least the budget: `dirty` is
        // from its last event, and a stalled device sends few).
        Action::Stall { held: d.dirty.max(d.budget) }
    } else if pacing && busy {
        budget_action(i, fast, window)
    } else if d.budget != 0 || p.is_paced {
        Action::Release { why: ReleaseWhy::Unpaced }
    } else {
        Action::Keep
    };
    Decision { chunk, window, floor, fast, pacing, pool, action }
}

/// The burst pool of a device that writes `bw`: POOL_SECONDS of it, at
/// least one process's `burst`.
pub(super) fn pool(bw: u64, burst: u64) -> u64 {
    bandwidth::round_pages(((bw as f64 * POOL_SECONDS) as u64).max(burst))
}

/// What a device to be paced, with a writer that counts (or one LINGER
/// ago), is told.
fn budget_action(i: &Inputs, fast: bool, window: u64) -> Action {
    let (f, d, p) = (&i.figures, &i.device, &i.pacer);
    // Between two writers (LINGER) the budget stays as it was:
    // nobody needs a new one (and a stick pulled mid-copy is gone).
    let lingering = i.active.writers == 0 && d.budget != 0;
    let mut dirty_seconds = p.dirty_seconds;
    if d.backing.network() {
        dirty_seconds = dirty_seconds.max(NETWORK_DIRTY_SECONDS);
    }
    // A fast device's cap is from what it has shown it can write
    // (its estimate lags behind: a cap from the estimate held the
    // raw device's 3.6 GiB copy to 1.13x the default's time to
    // `sync` done on xfs, against 0.77x); the estimate's, tighter,
    // while small files come, which the kernel writes best in bulk
    // (`tar x` beside a dd: 89 MiB dirty at most and 0.97x the
    // default's time, against 231 MiB and 1.04x).
    let small = within_linger(d.last_small_files, i.now);
    let sized_by = if fast && !small { d.capacity } else { d.bw };
    let budget = bandwidth::dirty_budget(sized_by, dirty_seconds, f.stream_dirty, window, i.active);
    let moved = (budget as f64 - d.budget as f64).abs() > BUDGET_SLACK * d.budget as f64;
    // One writer's budget, not all of them: ten streams' windows
    // add up to gigabytes on a fast device.
    let one =
        bandwidth::dirty_budget(sized_by, dirty_seconds, f.stream_dirty, window, Active { writers: 1, windowed: 1 });
    let keeps_up = fast && !small && d.dirty <= OUTRUN * one;
    if keeps_up && d.budget != 0 && d.capped_slow {
        // Capped on a first estimate under FAST_DEVICE (the kernel's
        // for a device it had measured only lightly: xfs's raw device
        // started at 0.25 GB/s where it writes 2.8) that the agent's
        // own writeback has since shown fast: a fast device's rule
        // from now on.
        Action::Release { why: ReleaseWhy::Fast }
    } else if keeps_up && d.budget == 0 {
        // Not paced (yet): the next event or tick looks again.
        Action::Keep
    } else if d.budget == 0 {
        let why = match () {
            _ if !fast => "under 1 GiB/s: capped at a writer's first window",
            _ if small => "a writer of small files",
            _ => "its writeback fell behind",
        };
        Action::Cap { budget, why: Some(why), capped_slow: !fast }
    } else if p.is_stalled || (moved && !lingering) {
        Action::Cap { budget, why: None, capped_slow: d.capped_slow }
    } else {
        Action::Keep
    }
}

/// Who asks a device's tick for pacing, for `observed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Askers {
    /// The whole daemon observes (its root policy, or --observe).
    pub observes_all: bool,
    /// Writers that count for pacing now, and whether one of them acts
    /// (its policy is not "observe").
    pub writers: u64,
    pub acting: bool,
    /// The cap in force, and the one only reported ("would pace").
    pub budget: u64,
    pub would: u64,
    /// Whether the latest writer that counted there acted.
    pub last_acting: bool,
}

/// Whether the device's tick only reports what it would do with the pacer
/// (a "would" cap, no knob written) rather than doing it.  A device is
/// paced for real only while some acting writer needs it; one that only
/// observing writers need is reported as "would pace".  With no writer
/// counting (LINGER, or a crowded device), whichever is in force goes on;
/// with neither, a cap goes the way of the latest writer that counted.
pub(super) fn observed(a: Askers) -> bool {
    if a.observes_all {
        true
    } else if a.writers > 0 {
        !a.acting
    } else if a.budget != 0 {
        false
    } else if a.would != 0 {
        true
    } else {
        !a.last_acting
    }
}

/// Whether BPF may batch the device's closes: paced, or never to be, no
/// close needs the agent at once.  Read after the pacer was told: its
/// answer sets the budget, and may step aside (`stepped_aside`, asked last).
pub(super) fn batch_closes(budget: u64, pacing: bool, knobs: bool, stepped_aside: impl FnOnce() -> bool) -> bool {
    budget != 0 || !pacing || !knobs || stepped_aside()
}

/// What BPF was last told of a device (wb_device's bw, batch_closes,
/// floor, pool_pages in bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Pushed {
    pub bw: u64,
    pub batch: bool,
    pub floor: u64,
    pub pool: u64,
}

/// What BPF is to be told (`next`), if what it was told (`pushed`; None:
/// not known, an insert failed) is out of date: the bandwidth or the pool
/// moved by more than a twentieth, or batching or the floor changed.
pub(super) fn push(pushed: Option<Pushed>, next: Pushed) -> Option<Pushed> {
    let moved = |now: u64, was: u64| now.abs_diff(was) * 20 > was;
    let stale = pushed.is_none_or(|p| {
        moved(next.bw, p.bw) || moved(next.pool, p.pool) || next.batch != p.batch || next.floor != p.floor
    });
    stale.then_some(next)
}

/// Whether what a device's last writer (at `last_busy`) left could still
/// be there at `now`: until LINGER and its `dirty` bytes' time at `bw`
/// have passed (Devices::yield_global).
pub(super) fn not_drained(dirty: u64, bw: u64, last_busy: Option<Instant>, now: Instant) -> bool {
    let drained = LINGER + Duration::from_secs_f64(dirty as f64 / bw.max(1) as f64);
    last_busy.is_some_and(|t| now.saturating_duration_since(t) < drained)
}
