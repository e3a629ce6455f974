//! cost's parts with 1,000 streams: on the bench's device, and spread over
//! devices of their own.

use std::{
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Result;
use wb_tests::{LoopDevice, Mounted};

use super::{Agent, CostSizes, STREAMS_POLICY, agent_metrics};
use crate::bench::{
    modes::Mode,
    scenarios::{self, Ctx, Metrics},
};

/// The bench's many-writer scenario with 1,000 writers, each a stream: with
/// the daemon, its slowest `status` answer while they write too (the goal
/// is at 1,000 streams).
pub(super) fn streams(ctx: &Ctx, s: &CostSizes, agent: Option<&Agent>) -> Result<Metrics> {
    let mode = if agent.is_some() { Mode::Writebehindd(Some(STREAMS_POLICY)) } else { Mode::Default };
    let asks = agent.map(|a| (a.pid, a.socket.as_path()));
    let mut m = scenarios::many(ctx, mode, s.streams, s.stream_mib, asks)?;
    agent_metrics(agent, &mut m)?;
    Ok(m)
}

/// What each writer of the `devices` part writes, at CostSizes::
/// spread_kib_s (16 s at the full bench's 256 KiB/s), so that all of them
/// stream at once (from their first MiB, STREAMS_POLICY) whatever the
/// devices' speed.  Not slower: the agent hears of a stream at each
/// window (1 MiB), and one quiet for 5 s is not listed; at 128 KiB/s
/// 652-789 of the 1,000 were at once.
pub(super) const SPREAD_MIB: u64 = 4;

/// The streams spread over devices of their own (the memory figure:
/// 1,000 streams on 32 devices): the agent's peak RSS, how many streams
/// its status listed at once, and its slowest `status` answer.  The devices
/// are uncapped ext4 loop devices, made for each run.
pub(super) fn devices(s: &CostSizes, agent: Option<&Agent>) -> Result<Metrics> {
    let per_device = s.streams.div_ceil(s.devices) as u64 * SPREAD_MIB;
    let fss = (0..s.devices)
        .map(|_| Mounted::new(LoopDevice::new(per_device * 3 / 2 + 64)?, "ext4"))
        .collect::<Result<Vec<_>>>()?;
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let (writers, seen) = std::thread::scope(|sc| {
        let poller = agent.map(|a| {
            sc.spawn(|| {
                let mut most = 0;
                let count = |data: &serde_json::Value| most = most.max(data["streams"].as_array().map_or(0, Vec::len));
                let slowest = scenarios::slowest_status(&a.socket, &stop, Duration::from_millis(500), count);
                slowest.map(|ms| (most, ms))
            })
        });
        // One shell per device starts its writers: 1,000 spawned one by one
        // from here took longer than each one streams.
        let writers = fss
            .iter()
            .enumerate()
            .map(|(d, fs)| {
                let n = (s.streams as usize + fss.len() - 1 - d) / fss.len();
                let (rate, dir) = (s.spread_kib_s, fs.path("").display().to_string());
                let script = format!(
                    "for i in $(seq {n}); do (head -c {SPREAD_MIB}M /dev/zero | pv -qL {rate}k > {dir}/w$i) & done; \
                     fail=0; for p in $(jobs -p); do wait $p || fail=1; done; exit $fail"
                );
                let mut cmd = Command::new("bash");
                cmd.arg("-c").arg(script);
                scenarios::spawn(cmd)
            })
            .collect::<Result<Vec<_>>>()
            .and_then(|children| children.into_iter().try_for_each(|c| scenarios::wait(c, "a writer")));
        stop.store(true, Ordering::Relaxed);
        (writers, poller.map(|p| p.join().expect("streams poller")))
    });
    writers?;
    let mut m = vec![("writers s", t.elapsed().as_secs_f64())];
    if let Some((most, slowest)) = seen.transpose()? {
        m.extend([("streams at once", most as f64), ("status ms", slowest)]);
    }
    agent_metrics(agent, &mut m)?;
    Ok(m)
}
