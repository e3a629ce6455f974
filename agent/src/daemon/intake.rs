//! The daemon's loop, the intake: drains the ring buffer as it becomes
//! readable and feeds the stream table; once a second reaps streams of
//! exited writers, reports ring-buffer drops and walks the cgroups; builds
//! the status the control socket asks for; acts on reloads (SIGHUP or
//! `wbctl reload`).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::Signals;
use crate::{
    abi::{EventKind, wb_event, wb_stat},
    cgroups::CgroupPolicies,
    control::{Ask, Reload, Requests},
    counters::{Counters, ErrorKind},
    loader::Loaded,
    shares::Shares,
    status::Status,
    streams::StreamTable,
};

/// What the intake loop works on.  Fields drop in order: the programs
/// detach first.
pub(super) struct Intake {
    pub(super) loaded: Loaded,
    pub(super) table: StreamTable,
    pub(super) cgroups: CgroupPolicies,
    pub(super) shares: Shares,
    pub(super) counters: Arc<Counters>,
    /// Where the policies are read from again at a reload.
    pub(super) policy_dir: PathBuf,
    pub(super) policy_files: Vec<PathBuf>,
    /// --observe: every policy that acts observes, also after a reload.
    pub(super) observe: bool,
    /// What the control socket asks: status snapshots and reloads.
    pub(super) requests: Requests,
    /// The last snapshot, while it may serve requests again.
    pub(super) snapshot: Snapshot,
    /// The longest an event waited in the ring within the last whole
    /// second, in ns (the status's intake_lag_ms).
    pub(super) lag_last_second: u64,
    pub(super) started: Instant,
    /// The running kernel's release, read once.
    pub(super) kernel: String,
}

impl Intake {
    /// Runs until SIGTERM or SIGINT.  Each SIGHUP or `wbctl reload` reads
    /// the policies again; a broken file keeps the running ones.
    pub(super) async fn run(&mut self, events: RingBuf<MapData>, signals: Signals) -> Result<()> {
        let Signals { mut term, mut int, mut hup } = signals;
        // SAFETY: the ring buffer owns its fd and outlives the registration
        // (both live in this function's AsyncFd).
        let mut events = unsafe { AsyncFd::register(events) }.map_err(|e| e.into_parts().1)?;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut batch_tick = tokio::time::interval(crate::streams::BATCH_AGE);
        let mut drops_seen = 0;
        let mut backlog = Backlog::default();
        let shutdown = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        tokio::pin!(shutdown);
        loop {
            let mut behind = false;
            tokio::select! {
                guard = events.readable_mut() => {
                    let mut guard = guard?;
                    behind = drain(guard.get_inner_mut(), &mut self.table, SLICE_TIME, &mut backlog);
                    if !behind {
                        guard.clear_ready();
                    }
                }
                _ = batch_tick.tick() => {
                    // Closes that never crossed a window do not wake the
                    // agent (see wakeup() in bpf/emit.bpf.h): they are read here.
                    drain(events.get_mut(), &mut self.table, SLICE_TIME, &mut backlog);
                    self.table.tick(self.cgroups.on_battery());
                }
                Some(ask) = self.requests.snapshots.recv() => self.answer(ask),
                Some(Reload) = self.requests.reloads.recv() => self.reload(),
                _ = hup.recv() => self.reload(),
                _ = tick.tick() => {
                    self.cgroups.refresh();
                    self.lag_last_second = std::mem::take(&mut backlog).lag_max;
                    crate::sys::notify("WATCHDOG=1");
                    // A close still in the ring is not a close unseen.  (An
                    // agent short of CPU behind a flood may leave one there
                    // after this slice: that stream ends as closed unseen and
                    // its tail is left to the kernel.)
                    drain(events.get_mut(), &mut self.table, SLICE_TIME, &mut backlog);
                    self.table.reap();
                    self.shares.tick(self.loaded.stat(wb_stat::WB_STAT_USER_SHARE));
                    let drops = self.loaded.stat(wb_stat::WB_STAT_RB_DROPS);
                    if drops > drops_seen {
                        tracing::warn!(lost = drops - drops_seen, total = drops, "ring buffer full: events lost");
                        drops_seen = drops;
                    }
                }
                _ = &mut shutdown => {
                    // What was emitted before the signal is still acted on (a
                    // flood's endless supply is not).
                    for _ in 0..SHUTDOWN_SLICES {
                        if !drain(events.get_mut(), &mut self.table, Duration::MAX, &mut backlog) {
                            break;
                        }
                    }
                    return Ok(());
                }
            }
            if behind {
                // The other branches (ticks, signals, snapshots asked for) get their turn.
                tokio::task::yield_now().await;
            }
        }
    }

    fn reload(&mut self) {
        match super::load_policies(&self.policy_dir, &self.policy_files, self.observe) {
            Ok(set) => {
                self.table.set_policy(set.root().clone(), set.observes());
                self.cgroups.replace(set);
                tracing::info!(policies = %self.cgroups.set().sources.join(", "), "policies reloaded");
                self.requests.policies.send_replace(Arc::new(self.cgroups.set().clone()));
                self.snapshot = Snapshot::default();
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "policy reload rejected; the running policy stays"),
        }
    }

    /// Answers `ask` and every request waiting behind it, with one snapshot.
    fn answer(&mut self, ask: Ask) {
        let mut asks = vec![ask];
        while let Ok(ask) = self.requests.snapshots.try_recv() {
            asks.push(ask);
        }
        let mut snapshot = std::mem::take(&mut self.snapshot);
        snapshot.answer(asks, Instant::now(), || self.status());
        self.snapshot = snapshot;
    }

    /// What the control socket reports, as of now.
    fn status(&self) -> Status {
        let (loaded, table, cgroups) = (&self.loaded, &self.table, &self.cgroups);
        let (streams, devices) = table.status();
        let mut counters = self.counters.snapshot();
        for stat in wb_stat::ALL {
            counters.insert(stat.name().into(), loaded.stat(stat));
        }
        counters.insert("flush_memory_bytes".into(), table.flush_memory() as u64);
        counters.insert("intake_lag_ms".into(), self.lag_last_second / 1_000_000);
        counters.insert("journal_dropped".into(), crate::journal::DROPPED.load(std::sync::atomic::Ordering::Relaxed));
        counters.extend(table.pace_counts().map(|(k, v)| (k.to_owned(), v)));
        Status {
            version: env!("CARGO_PKG_VERSION").into(),
            mode: if cgroups.set().observes() { "observe" } else { "act" }.into(),
            backend: loaded.backend.clone(),
            kernel: self.kernel.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            policy_sources: cgroups.set().sources.clone(),
            cgroups: cgroups.describe(),
            on_battery: cgroups.on_battery(),
            devices,
            global_limits: table.global_limits(),
            streams,
            counters,
            units: table.units(),
        }
    }
}

/// A snapshot serves the requests that come this soon after it was built:
/// building one reads /proc/<pid>/cgroup of every stream (up to
/// --max-streams of them), which clients asking in a loop would otherwise
/// have the intake do back to back.  Well under the second that status
/// was refreshed at when it was built whether asked for or not.
const SNAPSHOT_REUSE: Duration = Duration::from_millis(100);

/// The last status snapshot and when it was built.
#[derive(Default)]
pub(super) struct Snapshot {
    built: Option<(Instant, Arc<Status>)>,
}

impl Snapshot {
    /// Answers `asks` (every request waiting) with one snapshot, built by
    /// `build` unless the last one is fresh: however many clients ask, at
    /// most one is built per SNAPSHOT_REUSE.
    fn answer(&mut self, asks: Vec<Ask>, now: Instant, build: impl FnOnce() -> Status) {
        let status = self.fresh(now).unwrap_or_else(|| {
            let s = Arc::new(build());
            self.built = Some((now, s.clone()));
            s
        });
        for ask in asks {
            let _ = ask.send(status.clone());
        }
    }

    /// The snapshot, if it may still serve a request at `now`.
    fn fresh(&self, now: Instant) -> Option<Arc<Status>> {
        let (at, s) = self.built.as_ref()?;
        (now.saturating_duration_since(*at) < SNAPSHOT_REUSE).then(|| s.clone())
    }
}

/// Events handled at most per drain.  This task also answers `wbctl`, runs
/// the ticks (pacing, batches, the watchdog's ping) and takes signals: a
/// flood of closes faster than the agent handles them never lets the ring
/// empty, and a drain until empty never returned — `wbctl` went silent and
/// systemd's watchdog killed a daemon that was only busy.
/// Between slices every other branch gets its turn, so the watchdog now
/// hears from a busy daemon and only a stuck one goes quiet.  The ring
/// itself bounds the backlog: 1 MiB, of which closes may fill half before
/// BPF sheds them, about 3,000 events, so a span waits behind at most that.
const SLICE: usize = 4096;
/// And a slice ends once this long has passed, looked at every CLOCK_EVERY
/// events.  An agent short of CPU (a CPUQuota=, a loaded machine) took up
/// to 2.6 s for 4,096 events when held to 5 % of a CPU under a flood
/// (hardening's flood test: the debug build), and the watchdog's ping and
/// `wbctl` waited for it; ended by time, a slice keeps their wait near the
/// tick's second.
const SLICE_TIME: Duration = Duration::from_millis(20);
const CLOCK_EVERY: usize = 256;
/// At most this many slices when stopping, each of up to SLICE events.
const SHUTDOWN_SLICES: usize = 16;
/// A close that waited this long in the ring finds an agent behind a
/// flood.  Handling it costs the intake's slice and then the device's
/// flusher an open by handle and a sync_file_range; shed, it costs a
/// decode, and the spans behind it wait that much less.  Far above the
/// normal wait: closes that wake nobody wait for the batch tick (100 ms).
const SHED_AGE: Duration = Duration::from_millis(500);

/// What the drain saw since the last second's tick.
#[derive(Default)]
struct Backlog {
    /// The longest an event waited in the ring, in ns: what a stream's
    /// window waits behind a flood.
    lag_max: u64,
}

/// Handles up to SLICE events, until `time` has passed; true if the ring
/// still holds more.  A close that waited SHED_AGE or longer, of a file the
/// agent does not hold, is shed: left to the kernel, counted.
fn drain(ring: &mut RingBuf<MapData>, table: &mut StreamTable, time: Duration, backlog: &mut Backlog) -> bool {
    let started = Instant::now();
    for n in 1..=SLICE {
        if n % CLOCK_EVERY == 0 && started.elapsed() >= time {
            return true;
        }
        let Some(item) = ring.next() else { return false };
        let decoded = wb_event::decode_any(&item);
        drop(item);
        let Some((kind, ev, path)) = decoded else {
            table.error(ErrorKind::BadEvent);
            continue;
        };
        let waited = crate::sys::monotonic_ns().saturating_sub(ev.ts_ns);
        backlog.lag_max = backlog.lag_max.max(waited);
        if kind == EventKind::Close && waited >= SHED_AGE.as_nanos() as u64 && table.shed_late(&ev) {
            continue;
        }
        table.handle(kind, &ev, path);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_serves_requests_while_it_is_fresh() {
        let t0 = Instant::now();
        assert!(Snapshot::default().fresh(t0).is_none(), "none built yet");
        let s = Snapshot { built: Some((t0, Arc::new(Status::default()))) };
        assert!(s.fresh(t0).is_some());
        assert!(s.fresh(t0 + SNAPSHOT_REUSE / 2).is_some());
        assert!(s.fresh(t0 + SNAPSHOT_REUSE).is_none());
    }

    #[test]
    fn one_snapshot_answers_every_request_waiting() {
        let (asks, answers): (Vec<_>, Vec<_>) = (0..4).map(|_| tokio::sync::oneshot::channel()).unzip();
        let (mut snapshot, mut built, t0) = (Snapshot::default(), 0, Instant::now());
        let mut build = || {
            built += 1;
            Status { uptime_s: built as f64, ..Default::default() }
        };
        snapshot.answer(asks, t0, &mut build);
        let got: Vec<f64> = answers.into_iter().map(|mut a| a.try_recv().unwrap().uptime_s).collect();
        assert_eq!(got, [1.0; 4]);
        // Soon after, the same snapshot; once it is stale, a new one.
        for (at, uptime) in [(t0 + SNAPSHOT_REUSE / 2, 1.0), (t0 + SNAPSHOT_REUSE, 2.0)] {
            let (ask, mut answer) = tokio::sync::oneshot::channel();
            snapshot.answer(vec![ask], at, &mut build);
            assert_eq!(answer.try_recv().unwrap().uptime_s, uptime);
        }
    }
}
