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
//!
//! Unprivileged users create cgroups too (systemd delegates a subtree to
//! each): walk.rs says how the walk stays cheap however many they make, and
//! why their cgroups can never take the entries of root's (services').

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};

use crate::{
    abi::{WB_CGROUPS_MAX, wb_config, wb_policy},
    policies::PolicySet,
    power,
};

mod walk;

/// Cgroups walked at most (the BPF map's size).
const MAX_CGROUPS: usize = WB_CGROUPS_MAX as usize;

/// Cgroups walked at most in one delegated subtree, after all root-owned
/// ones.  A desktop user's systemd has a few hundred (apps, services,
/// rootless containers).  Measured (debug build, a user with 20,100
/// cgroups all matched by `/user.slice/**`): walking 2,048 of them takes
/// 18 ms, then they rest 1.8 s (walk.rs): 1% of a core.  The walk before
/// re-read 16,384 cgroups every second, 54% of a core, and never reached
/// /system.slice.
const PER_DELEGATION: usize = 2048;

pub struct CgroupPolicies {
    set: PolicySet,
    v2: Option<PathBuf>,
    config: Array<MapData, wb_config>,
    map: BpfHashMap<MapData, u64, wb_policy>,
    /// What the map holds.
    pushed: HashMap<u64, wb_policy>,
    walker: walk::Walker,
    /// Delegated subtrees a walk cut short, and whether the whole budget
    /// ran out: logged the first time only (a user making and removing
    /// cgroups around the cap would otherwise log at will).
    capped: HashSet<String>,
    full: bool,
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
            walker: walk::Walker::default(),
            capped: HashSet::new(),
            full: false,
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
        self.walker.wake();
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
        let t = std::time::Instant::now();
        let walked = self.walker.walk(&v2, &self.set, MAX_CGROUPS, PER_DELEGATION);
        tracing::debug!(
            walked = walked.walked,
            listed = walked.listed,
            found = walked.found.len(),
            us = t.elapsed().as_micros() as u64,
            "cgroups walked"
        );
        self.log_caps(&walked);
        let want: HashMap<u64, &walk::Found> = walked.found.iter().map(|f| (f.id, f)).collect();
        // Stale entries leave first: the map never holds more than one
        // walk's worth, so the root-owned cgroups found first always fit.
        for id in self.pushed.keys().filter(|id| !want.contains_key(id)).copied().collect::<Vec<_>>() {
            let _ = self.map.remove(&id);
            self.pushed.remove(&id);
        }
        for f in &walked.found {
            if self.pushed.get(&f.id) == Some(&f.policy) {
                continue;
            }
            match self.map.insert(f.id, f.policy, 0) {
                Ok(()) => {
                    // A user's cgroups come and go as they like: one line
                    // each would let them flood the journal.
                    if f.delegated {
                        tracing::debug!(cgroup = ?f.path, id = f.id, mode = f.policy.mode, "policy applied");
                    } else {
                        tracing::info!(cgroup = %f.path, id = f.id, mode = f.policy.mode, "policy applied");
                    }
                    self.pushed.insert(f.id, f.policy);
                }
                Err(e) => tracing::warn!(cgroup = ?f.path, error = %e, "cannot apply policy"),
            }
        }
    }

    /// Logs a cap the first time it bites, not every second it does.
    fn log_caps(&mut self, walked: &walk::Outcome) {
        for path in &walked.capped {
            if self.capped.insert(path.clone()) {
                tracing::warn!(
                    delegation = ?path,
                    max = PER_DELEGATION,
                    "too many cgroups in a delegated subtree: the rest get the root policy"
                );
            }
        }
        if walked.full && !self.full {
            tracing::warn!(max = MAX_CGROUPS, "too many cgroups: delegated subtrees walked last get the root policy");
            self.full = true;
        }
    }
}

/// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on unified
/// hosts, /sys/fs/cgroup/unified on hybrid ones).
pub fn v2_mount() -> Option<PathBuf> {
    crate::sys::own_mounts().into_iter().find(|m| m.fstype == "cgroup2").map(|m| m.mount_point.into())
}
