//! What each systemd unit's writers had done since the daemon started:
//! "did it do anything to my backup job last night?".  A writer's unit is
//! read from its cgroup path (`unit_of`); the table keeps at most
//! MAX_UNITS of them and folds the rest into OTHER, so a host with
//! thousands of containers keeps a bounded table (and bounded metrics).
//!
//! Observing streams (a policy's mode "observe") are not counted as
//! written behind here: nothing was written behind.  Their streams count
//! as started, in `streams_observed`, so a unit still shows.

use std::collections::HashMap;

use crate::status::UnitStatus;

pub mod metrics;

/// Units kept at most; later ones are folded into OTHER.
pub const MAX_UNITS: usize = 256;
/// What the units beyond MAX_UNITS are counted as.
pub const OTHER: &str = "other";
/// A writer in no unit (the root cgroup, or a cgroup no unit names).
pub const NONE: &str = "-";

/// The systemd unit a cgroup v2 path names: its innermost `.service` or
/// `.scope` component (`/user.slice/user-1000.slice/user@1000.service/
/// app.slice/app-foo-12.scope` is `app-foo-12.scope`, not the user
/// manager); NONE for "/" or a path naming none.  Components a container
/// runtime or a delegate made below a unit ("/system.slice/docker.service/
/// payload") leave the unit that holds them.
pub fn unit_of(cgroup: &str) -> &str {
    cgroup
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .find(|c| c.strip_suffix(".service").or_else(|| c.strip_suffix(".scope")).is_some_and(|stem| !stem.is_empty()))
        .unwrap_or(NONE)
}

/// The writer's cgroup from /proc/<pid>/cgroup's text: the v2 path ("0::"),
/// or on a hybrid host, where every process sits in the v2 root, the path
/// in systemd's own v1 hierarchy ("name=systemd"), which names its unit.
pub fn cgroup_in(proc_cgroup: &str) -> String {
    let line = |prefix: &str| {
        proc_cgroup.lines().find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            rest.strip_prefix(prefix)
        })
    };
    match (line(":"), line("name=systemd:")) {
        (Some(v2), _) if v2 != "/" => v2.to_owned(),
        (_, Some(v1)) if !v1.is_empty() => v1.to_owned(),
        (Some(v2), _) => v2.to_owned(),
        _ => "/".to_owned(),
    }
}

/// The cgroup of process `pid` (reading /proc only); "/" when it has gone.
pub fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map(|t| cgroup_in(&t)).unwrap_or_else(|_| "/".into())
}

/// Where `unit` is counted in a table holding `held` units of at most `cap`,
/// `known` if it holds `unit` already: itself, or OTHER once the table is full.
pub fn slot(unit: &str, known: bool, held: usize, cap: usize) -> &str {
    if known || held < cap.saturating_sub(1) || unit == OTHER { unit } else { OTHER }
}

/// Per-unit totals, by unit name.
#[derive(Debug, Default)]
pub struct Units {
    table: HashMap<String, UnitStatus>,
    cap: usize,
}

impl Units {
    pub fn new(cap: usize) -> Self {
        Self { table: HashMap::new(), cap: cap.max(2) }
    }

    /// The entry `unit` is counted in (OTHER beyond the cap; the cap keeps
    /// one place for OTHER itself).
    fn entry(&mut self, unit: &str) -> &mut UnitStatus {
        let known = self.table.contains_key(unit);
        let name = slot(unit, known, self.table.len(), self.cap).to_owned();
        self.table.entry(name.clone()).or_insert_with(|| UnitStatus { unit: name, ..Default::default() })
    }

    /// A stream started in `cgroup`'s unit (observing: nothing will be
    /// written behind).
    pub fn stream_started(&mut self, unit: &str, cgroup: &str, observing: bool) {
        let e = self.entry(unit);
        if observing {
            e.streams_observed += 1;
        } else {
            e.streams += 1;
        }
        // OTHER's writers are in many cgroups: it names none.
        if e.unit != OTHER && e.cgroup != cgroup {
            e.cgroup = cgroup.to_owned();
        }
    }

    /// Bytes of the unit's writers handed to writeback.
    pub fn written_behind(&mut self, unit: &str, bytes: u64) {
        self.entry(unit).written_behind_bytes += bytes;
    }

    /// A closed file of the unit's writers flushed.
    pub fn file_flushed(&mut self, unit: &str) {
        self.entry(unit).files_flushed += 1;
    }

    /// `secs` during which a device the unit streamed to was paced, and
    /// that device's dirty bytes then.
    pub fn paced(&mut self, unit: &str, secs: f64) {
        self.entry(unit).paced_secs += secs;
    }

    /// The dirty (and writeback) bytes of a device the unit streams to.
    pub fn dirty(&mut self, unit: &str, dirty: u64) {
        let e = self.entry(unit);
        e.peak_dirty_bytes = e.peak_dirty_bytes.max(dirty);
    }

    /// Every unit, most bytes written behind first.
    pub fn status(&self) -> Vec<UnitStatus> {
        let mut v: Vec<UnitStatus> = self.table.values().cloned().collect();
        sort(&mut v);
        v
    }
}

/// Most bytes written behind first, then by name.
pub fn sort(v: &mut [UnitStatus]) {
    v.sort_by(|a, b| b.written_behind_bytes.cmp(&a.written_behind_bytes).then_with(|| a.unit.cmp(&b.unit)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_from_real_cgroup_paths() {
        assert_eq!(unit_of("/system.slice/backup.service"), "backup.service");
        assert_eq!(
            unit_of("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-foo-1234.scope"),
            "app-gnome-foo-1234.scope"
        );
        assert_eq!(unit_of("/user.slice/user-1000.slice/user@1000.service/init.scope"), "init.scope");
        assert_eq!(unit_of("/user.slice/user-1000.slice/session-3.scope"), "session-3.scope");
        assert_eq!(unit_of("/system.slice/docker-0123abcd.scope"), "docker-0123abcd.scope");
        assert_eq!(unit_of("/system.slice/docker.service/payload"), "docker.service");
        assert_eq!(unit_of("/system.slice/containerd.service/kubepods/pod1/abc"), "containerd.service");
        assert_eq!(unit_of("/"), NONE);
        assert_eq!(unit_of(""), NONE);
        assert_eq!(unit_of("/system.slice"), NONE);
        assert_eq!(unit_of("/wb-test-1-x"), NONE);
        // A bare suffix names nothing.
        assert_eq!(unit_of("/a/.service"), NONE);
    }

    #[test]
    fn the_cgroup_is_v2s_or_on_hybrid_hosts_systemds() {
        let unified = "0::/system.slice/backup.service\n";
        assert_eq!(cgroup_in(unified), "/system.slice/backup.service");
        // Hybrid: v2 mounted but empty, systemd's hierarchy names the unit.
        let hybrid = "12:pids:/system.slice/backup.service\n1:name=systemd:/system.slice/backup.service\n0::/\n";
        assert_eq!(cgroup_in(hybrid), "/system.slice/backup.service");
        // Hybrid with a cgroup made in the v2 hierarchy: that one.
        let moved = "1:name=systemd:/user.slice\n0::/wb-test-1-backup.service\n";
        assert_eq!(cgroup_in(moved), "/wb-test-1-backup.service");
        assert_eq!(cgroup_in("9:name=systemd:/\n0::/\n"), "/");
        assert_eq!(cgroup_in(""), "/");
        // A v1 controller's path is not systemd's.
        assert_eq!(cgroup_in("4:memory:/x.service\n0::/\n"), "/");
    }

    #[test]
    fn accounting_adds_per_unit() {
        let mut u = Units::new(MAX_UNITS);
        u.stream_started("backup.service", "/system.slice/backup.service", false);
        u.stream_started("backup.service", "/system.slice/backup.service", false);
        u.stream_started("watch.service", "/system.slice/watch.service", true);
        u.written_behind("backup.service", 100);
        u.written_behind("backup.service", 50);
        u.file_flushed("backup.service");
        u.paced("backup.service", 1.5);
        u.dirty("backup.service", 10);
        u.dirty("backup.service", 30);
        u.dirty("backup.service", 20);
        let s = u.status();
        assert_eq!(s[0].unit, "backup.service");
        assert_eq!(
            (s[0].streams, s[0].written_behind_bytes, s[0].files_flushed, s[0].peak_dirty_bytes),
            (2, 150, 1, 30)
        );
        assert_eq!(s[0].paced_secs, 1.5);
        assert_eq!(s[0].cgroup, "/system.slice/backup.service");
        assert_eq!((s[1].unit.as_str(), s[1].streams, s[1].streams_observed), ("watch.service", 0, 1));
    }

    #[test]
    fn units_beyond_the_cap_fold_into_other() {
        assert_eq!(slot("a.service", false, 0, 4), "a.service");
        assert_eq!(slot("a.service", false, 3, 4), OTHER);
        assert_eq!(slot("a.service", true, 4, 4), "a.service");
        let mut u = Units::new(4);
        for i in 0..1000 {
            let unit = format!("docker-{i}.scope");
            u.stream_started(&unit, &format!("/system.slice/{unit}"), false);
            u.written_behind(&unit, 1);
        }
        let s = u.status();
        assert_eq!(s.len(), 4, "{s:?}");
        let other = s.iter().find(|x| x.unit == OTHER).unwrap();
        assert_eq!((other.streams, other.written_behind_bytes), (997, 997));
        // The first units keep counting as themselves.
        u.written_behind("docker-0.scope", 5);
        assert_eq!(u.status().iter().find(|x| x.unit == "docker-0.scope").unwrap().written_behind_bytes, 6);
        // OTHER's cgroup is no one unit's.
        assert_eq!(other.cgroup, "");
    }
}
