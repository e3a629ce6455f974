//! Policies reach BPF by cgroup: BPF keys its `cgroup_policies` map by the
//! writer's cgroup v2 id (bpf_get_current_cgroup_id), which is the inode
//! number of the cgroup's directory in the v2 hierarchy.  The agent walks
//! that hierarchy, resolves each cgroup's policy and fills the map; it walks
//! again every second, so cgroups created later (a service starting) get
//! their policy without a restart.  Cgroups whose policy is the root's need
//! no entry: BPF falls back to wb_config.dflt.
//!
//! On hybrid hosts (v1 controllers, v2 mounted but empty, like this one)
//! every process sits in the v2 root: all of them get the root policy.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};

use crate::{
    abi::{wb_config, wb_policy},
    policies::PolicySet,
    power,
};

/// Cgroups walked at most (the BPF map's size).
const MAX_CGROUPS: usize = 16384;

pub struct CgroupPolicies {
    set: PolicySet,
    v2: Option<PathBuf>,
    config: Array<MapData, wb_config>,
    map: BpfHashMap<MapData, u64, wb_policy>,
    /// What the map holds.
    pushed: HashMap<u64, wb_policy>,
    on_battery: bool,
    power_dir: PathBuf,
}

impl CgroupPolicies {
    pub fn new(set: PolicySet, config: Array<MapData, wb_config>, map: BpfHashMap<MapData, u64, wb_policy>) -> Self {
        let v2 = v2_mount();
        match &v2 {
            Some(p) => tracing::info!(hierarchy = %p.display(), "cgroup v2 policies by cgroup id"),
            None => tracing::warn!("no cgroup v2 hierarchy mounted: every process gets the root policy"),
        }
        let mut me = Self {
            set,
            v2,
            config,
            map,
            pushed: HashMap::new(),
            on_battery: false,
            power_dir: power::POWER_SUPPLY.into(),
        };
        me.on_battery = power::on_battery(&me.power_dir);
        me.apply();
        me
    }

    pub fn set(&self) -> &PolicySet {
        &self.set
    }

    /// Where policies are matched, for `wbctl status`.
    pub fn describe(&self) -> String {
        match &self.v2 {
            None => "no cgroup v2 hierarchy: every process gets the root policy".into(),
            Some(p) => {
                let procs = std::fs::read_to_string(p.join("cgroup.procs")).unwrap_or_default().lines().count();
                let children =
                    std::fs::read_dir(p).map(|d| d.flatten().filter(|e| e.path().is_dir()).count()).unwrap_or(0);
                if children == 0 {
                    format!("{} (empty: hybrid host, all {procs} processes get the root policy)", p.display())
                } else {
                    format!(
                        "{} ({children} top-level cgroups; {} with a policy of their own)",
                        p.display(),
                        self.pushed.len()
                    )
                }
            }
        }
    }

    pub fn on_battery(&self) -> bool {
        self.on_battery
    }

    /// New policies (SIGHUP): in force for every cgroup from now on.
    pub fn replace(&mut self, set: PolicySet) {
        self.set = set;
        self.apply();
    }

    /// Power source and new cgroups; called every second.
    pub fn refresh(&mut self) {
        let on_battery = power::on_battery(&self.power_dir);
        if on_battery != self.on_battery {
            self.on_battery = on_battery;
            tracing::info!(on_battery, "power source changed");
        }
        self.apply();
    }

    fn apply(&mut self) {
        let root = self.set.root().to_bpf();
        // What the loader set (which syscalls sys_exit reports) stays.
        let Ok(mut cfg) = self.config.get(&0, 0) else { return };
        cfg.dflt = root;
        cfg.on_battery = self.on_battery as u32;
        if let Err(e) = self.config.set(0, cfg, 0) {
            tracing::warn!(error = %e, "cannot update the BPF configuration");
        }
        let Some(v2) = self.v2.clone() else { return };
        let mut want: HashMap<u64, (String, wb_policy)> = HashMap::new();
        let mut total = 0;
        walk(&v2, &v2, &mut |path, id| {
            total += 1;
            let p = self.set.resolve(path).to_bpf();
            if p != root {
                want.insert(id, (path.to_owned(), p));
            }
            total < MAX_CGROUPS
        });
        if total >= MAX_CGROUPS {
            tracing::warn!(max = MAX_CGROUPS, "too many cgroups: the rest get the root policy");
        }
        for id in self.pushed.keys().filter(|id| !want.contains_key(id)).copied().collect::<Vec<_>>() {
            let _ = self.map.remove(&id);
            self.pushed.remove(&id);
        }
        for (id, (path, p)) in want {
            if self.pushed.get(&id) == Some(&p) {
                continue;
            }
            match self.map.insert(id, p, 0) {
                Ok(()) => {
                    tracing::info!(cgroup = %path, id, mode = p.mode, "policy applied");
                    self.pushed.insert(id, p);
                }
                Err(e) => tracing::warn!(cgroup = %path, error = %e, "cannot apply policy"),
            }
        }
    }
}

/// Calls `f(cgroup path, id)` for `dir` and every cgroup below it, until
/// `f` returns false.
fn walk(root: &Path, dir: &Path, f: &mut dyn FnMut(&str, u64) -> bool) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else { return true };
    let rel = dir.strip_prefix(root).map(|p| format!("/{}", p.display())).unwrap_or_else(|_| "/".into());
    if !f(&rel, meta.ino()) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return true };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) && !walk(root, &e.path(), f) {
            return false;
        }
    }
    true
}

/// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on unified
/// hosts, /sys/fs/cgroup/unified on hybrid ones).
pub fn v2_mount() -> Option<PathBuf> {
    crate::sys::mounts().into_iter().find(|m| m.fstype == "cgroup2").map(|m| m.mount_point.into())
}
