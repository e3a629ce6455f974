//! What the stream table reports: its streams and writers for `wbctl
//! streams`, the per-unit totals (and their accounting at each tick), and
//! what it passes on of its devices.

use std::{collections::HashSet, time::Instant};

use super::StreamTable;

impl StreamTable {
    /// Per-unit totals, most bytes written behind first.
    pub fn units(&self) -> Vec<crate::status::UnitStatus> {
        self.units.status()
    }

    /// Each unit with a stream or writer acting on a device: the time since
    /// the last tick while that device was paced, and its dirty bytes.
    pub(super) fn account_units(&mut self, now: Instant) {
        let since = now.saturating_duration_since(std::mem::replace(&mut self.units_ticked, now)).as_secs_f64();
        let streams = self.streams.values().filter(|s| !s.observe).map(|s| (&s.unit, &s.bdi));
        let writers =
            self.writers.values().chain(self.nodes.values()).filter(|w| !w.observe).map(|w| (&w.unit, &w.bdi));
        let pairs: HashSet<(&String, &String)> = streams.chain(writers).collect();
        for (unit, bdi) in pairs {
            let Some((paced, dirty)) = self.devices.paced_dirty(bdi) else { continue };
            if paced {
                self.units.paced(unit, since);
            }
            self.units.dirty(unit, dirty);
        }
    }

    /// Active streams and multi-file writers, for `wbctl streams`.
    pub fn status(&self) -> (Vec<crate::status::StreamStatus>, Vec<crate::status::DeviceStatus>) {
        use crate::status::StreamStatus;
        let mut v: Vec<StreamStatus> = self
            .streams
            .iter()
            .map(|(k, s)| StreamStatus {
                pid: k.tgid,
                comm: s.comm.clone(),
                cgroup: s.cgroup.clone(),
                unit: s.unit.clone(),
                kind: "file".into(),
                bdi: s.bdi.clone(),
                files: 1,
                bytes_flushed: s.bytes,
                secs: s.started.elapsed().as_secs_f64(),
            })
            .chain(self.writers.iter().chain(self.nodes.iter().map(|((pid, _), w)| (pid, w))).map(|(pid, w)| {
                StreamStatus {
                    pid: *pid,
                    comm: w.comm.clone(),
                    cgroup: w.cgroup.clone(),
                    unit: w.unit.clone(),
                    kind: w.kind().into(),
                    bdi: w.bdi.clone(),
                    files: w.files,
                    bytes_flushed: w.bytes,
                    secs: w.started.elapsed().as_secs_f64(),
                }
            }))
            .collect();
        v.sort_by_key(|s| s.pid);
        (v, self.devices.status())
    }

    /// Devices paced, and devices that would have been for observing
    /// writers, by counter name (Devices::pace_counts).
    pub fn pace_counts(&self) -> [(&'static str, u64); 3] {
        self.devices.pace_counts()
    }

    /// The global dirty limits in force while pacing sets them.
    pub fn global_limits(&self) -> Option<crate::pacing::GlobalLimits> {
        self.devices.global_limits()
    }
}
