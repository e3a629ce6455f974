//! Event intake: drains the ring buffer as it becomes readable and feeds the
//! stream table; once a second reaps streams of exited writers and reports
//! ring-buffer drops.

use std::{future::Future, time::Duration};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::{
    abi::{wb_event, wb_stat},
    cgroups::CgroupPolicies,
    counters::ErrorKind,
    loader::Loaded,
    policies::PolicySet,
    streams::StreamTable,
};

/// Runs until `shutdown`.  Each time `hup` fires (SIGHUP), `reload` reads
/// the policies again; None (a broken file) keeps the running ones.
pub async fn run(
    loaded: &Loaded,
    events: RingBuf<MapData>,
    table: &mut StreamTable,
    cgroups: &mut CgroupPolicies,
    hup: &mut tokio::signal::unix::Signal,
    reload: impl Fn() -> Option<PolicySet>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    // SAFETY: the ring buffer owns its fd and outlives the registration
    // (both live in this function's AsyncFd).
    let mut events = unsafe { AsyncFd::register(events) }.map_err(|e| e.into_parts().1)?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut batch_tick = tokio::time::interval(crate::streams::BATCH_AGE);
    let mut drops_seen = 0;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            guard = events.readable_mut() => {
                let mut guard = guard?;
                drain(guard.get_inner_mut(), table);
                guard.clear_ready();
            }
            _ = batch_tick.tick() => table.tick(cgroups.on_battery()),
            _ = hup.recv() => {
                if let Some(set) = reload() {
                    table.set_policy(set.root().clone());
                    cgroups.replace(set);
                    tracing::info!(policies = %cgroups.set().sources.join(", "), "policies reloaded");
                }
            }
            _ = tick.tick() => {
                cgroups.refresh();
                table.reap_exited();
                let drops = loaded.stat(wb_stat::WB_STAT_RB_DROPS);
                if drops > drops_seen {
                    tracing::warn!(lost = drops - drops_seen, total = drops, "ring buffer full: events lost");
                    drops_seen = drops;
                }
            }
            _ = &mut shutdown => {
                // What was emitted before the signal is still acted on.
                drain(events.get_mut(), table);
                return Ok(());
            }
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>, table: &mut StreamTable) {
    while let Some(item) = ring.next() {
        let decoded = wb_event::decode(&item);
        drop(item);
        match decoded {
            Some((kind, ev)) => table.handle(kind, &ev),
            None => table.error(ErrorKind::BadEvent),
        }
    }
}
