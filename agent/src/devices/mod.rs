//! Per-device state: each backing device's bandwidth estimate, the window
//! derived from it (pushed to BPF, where the in-kernel trigger uses it), and
//! whether the device is being paced.  Owned by the intake task; the part a
//! flusher thread needs (`DeviceShared`, shared.rs) is shared with it.  This
//! file holds the table of devices (`Devices`): what events note, the ticks
//! that size windows and pace, forgetting idle devices, and status.  Each
//! device's record is device.rs; a tick's decision, a pure function, is
//! decide.rs (tick_one gathers its inputs and applies it); writing BPF's
//! map is push.rs; what is read of the system once per device, probe.rs.

mod bound;
mod decide;
#[cfg(test)]
mod decide_tests;
mod device;
mod owners;
mod probe;
mod push;
mod shared;
mod table;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};

pub use self::{decide::SMALL_FILES, shared::DeviceShared};
use self::{
    decide::{Action, Askers, Figures, Inputs, PacerView, Pushed, ReleaseWhy},
    device::Device,
    probe::{compress_grain, kernel_name, max_request, mount_of, sb_dev_name},
};
use crate::{
    abi::{wb_device, wb_event},
    backing::Backing,
    bandwidth::{self, Active, Estimator, Sizing},
    pacing::Pacer,
    policy::{Mode, OnBattery, Policy},
    status::printable,
};

/// A device with no event for this long, not paced, is forgotten (its record,
/// and its entries in BPF's `devices` map); a user's sooner (bound.rs,
/// USER_IDLE): every FUSE mount is a device, and user namespaces let a user
/// make any number of them.  Seen again, it starts from the kernel's
/// bandwidth estimate.
const DEVICE_IDLE: Duration = Duration::from_secs(600);

/// What BPF sizes windows from: the `devices` map, by sb_dev.
pub type DeviceMap = BpfHashMap<MapData, u32, wb_device>;

pub struct Devices {
    /// The root policy: its sizing and device-wide keys.
    policy: Policy,
    map: Option<DeviceMap>,
    pacer: Pacer,
    devs: HashMap<String, Device>,
    on_battery: bool,
    /// The global lever is left to the administrator's values while a
    /// device it must not pace is written (`yield_global`).
    yielding_global: bool,
    /// Failed inserts into `map`, for their warning.
    map_failures: push::Failures,
    page_size: u64,
    /// Whether the root policy's leave_devices lists a (bdi, sb_dev): the
    /// names read once, kept until the policy changes (LEFT_KEPT at most).
    left: HashMap<(String, u32), bool>,
    /// Devices the agent started pacing, and that it would have started
    /// pacing for observing writers (counters pacing_started, would_pace).
    pacing_started: u64,
    would_pace: u64,
    /// The whole daemon observes (PolicySet::observes; the root policy's
    /// mode may be off under --observe).
    observing: bool,
    /// Devices' names, read again when the mount table changes.
    names: crate::names::Names,
    /// Layered devices' owners, looked up off this thread.
    owners: owners::OwnerLookups,
    /// Users' devices refused a record (bound.rs), and since when: asked
    /// again after SHED_RECHECK, not at each event (SHED_KEPT at most).
    shed: HashMap<String, Instant>,
    /// Users' devices refused a record (counter devices_shed_user).
    devices_shed_user: u64,
}

/// How long a user's device refused a record stays refused before its
/// next event asks again (reading the mount table).
const SHED_RECHECK: Duration = Duration::from_secs(2);
/// Entries of `Devices::shed`: past this many it is emptied.
const SHED_KEPT: usize = 4096;

/// A lever as status and the journal name it ("bdi", "global"; "" for
/// none).
fn lever_name(lever: Option<crate::pacing::Lever>) -> &'static str {
    match lever {
        Some(crate::pacing::Lever::Global) => "global",
        Some(_) => "bdi",
        None => "",
    }
}

/// Entries of `Devices::left`: past this many (each FUSE mount is a
/// device) it is emptied and filled again.
const LEFT_KEPT: usize = 4096;

impl Devices {
    pub fn new(policy: Policy, map: Option<DeviceMap>, pacer: Pacer) -> Self {
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        Self {
            policy,
            map,
            pacer,
            devs: HashMap::new(),
            on_battery: false,
            yielding_global: false,
            map_failures: push::Failures::default(),
            page_size,
            left: HashMap::new(),
            pacing_started: 0,
            would_pace: 0,
            observing: false,
            names: crate::names::Names::default(),
            owners: owners::OwnerLookups::default(),
            shed: HashMap::new(),
            devices_shed_user: 0,
        }
    }

    /// Whether the whole daemon observes (start, reload).
    pub fn set_observing(&mut self, observing: bool) {
        self.observing = observing;
    }

    /// The whole daemon observes (its root policy's mode, which --observe
    /// sets): no device is paced, whoever writes.
    fn observes_all(&self) -> bool {
        self.observing || self.policy.mode == Mode::Observe
    }

    /// Devices it started pacing, devices it would have (observing
    /// writers'), and users' devices refused a record (bound.rs), by
    /// counter name.
    pub fn pace_counts(&self) -> [(&'static str, u64); 3] {
        [
            ("pacing_started", self.pacing_started),
            ("would_pace", self.would_pace),
            ("devices_shed_user", self.devices_shed_user),
        ]
    }

    /// New root policy (reloaded): windows and budgets follow at the next tick.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.left.clear();
    }

    /// Whether the root policy leaves the event's device to the kernel
    /// (leave_devices): its disk (the bdi) or the node or filesystem's own
    /// device (sb_dev), by kernel name or number.  Said once per device.
    pub fn left_by_policy(&mut self, ev: &wb_event) -> bool {
        if self.policy.leave_devices.0.is_empty() {
            return false;
        }
        let key = (ev.bdi(), ev.sb_dev);
        if let Some(&left) = self.left.get(&key) {
            return left;
        }
        let sb_dev = sb_dev_name(ev.sb_dev);
        let names = [kernel_name(&key.0), kernel_name(&sb_dev)];
        let mut ids: Vec<&str> = vec![key.0.as_str(), sb_dev.as_str()];
        ids.extend(names.iter().flatten().map(String::as_str));
        let left = self.policy.leave_devices.lists(&ids);
        if left {
            tracing::info!(bdi = key.0, dev = sb_dev, names = ?ids, "left to the kernel: the policy's leave_devices lists it");
        }
        if self.left.len() >= LEFT_KEPT {
            self.left.clear();
        }
        self.left.insert(key, left);
        left
    }

    /// After this long without a window, a stream no longer counts as
    /// writing (the root policy's `quiet`).
    pub fn quiet(&self) -> Duration {
        self.policy.quiet.0
    }

    /// The sizing in force (None: fixed windows).
    fn sizing(&self) -> Option<Sizing> {
        self.policy.sizing(self.on_battery)
    }

    fn initial_window(&self) -> u64 {
        self.policy.initial_window()
    }

    /// Records what an event says about its device; returns the device.
    pub fn note(&mut self, ev: &wb_event) -> Arc<DeviceShared> {
        let bdi = ev.bdi();
        let window = self.initial_window();
        let initial_bw = (self.policy.min_window.0 as f64 / self.policy.window_seconds) as u64;
        let in_flight = self.policy.in_flight_seconds;
        // Read once for a superblock not seen before (its grain, its
        // backing), and not at all for the events after.
        let new_sb = self.devs.get(&bdi).is_none_or(|d| !d.sb_devs.contains(&ev.sb_dev));
        let new_node = ev.block_device() && self.devs.get(&bdi).is_none_or(|d| !d.nodes.contains_key(&ev.sb_dev));
        let (mounts, sb_dev) =
            if new_sb || new_node { (crate::sys::mounts(), sb_dev_name(ev.sb_dev)) } else { Default::default() };
        let dev = self.devs.entry(bdi.clone()).or_insert_with(|| {
            let grain = compress_grain(&sb_dev, &mounts);
            let max_request = max_request(&bdi).max(grain);
            tracing::debug!(bdi, max_request, grain, "new device");
            if grain != 0 {
                tracing::info!(
                    bdi,
                    grain,
                    "btrfs compresses here: windows are whole extents, so that it keeps compressing"
                );
            }
            Device {
                name: String::new(),
                paced_since: None,
                paced_before: Duration::ZERO,
                shared: Arc::new(DeviceShared {
                    est: Mutex::new(Estimator::new(initial_bw)),
                    window: AtomicU64::new(window),
                    chunk: AtomicU64::new(bandwidth::chunk(initial_bw, in_flight, max_request)),
                    grain,
                    backing: Mutex::new(Backing::Disk),
                    lookup: AtomicU64::new(0),
                    waiting: Mutex::new(None),
                    stat: Some(std::path::PathBuf::from(format!("/sys/dev/block/{bdi}/stat"))).filter(|p| p.exists()),
                }),
                sb_devs: HashSet::new(),
                mounted_as: HashMap::new(),
                nodes: HashMap::new(),
                max_request,
                knobs: self.pacer.available(&bdi),
                own_limit: self.pacer.lever(&bdi) == Some(crate::pacing::Lever::Bdi),
                export: None,
                pushed: Some(Pushed::default()),
                last_busy: None,
                last_small_files: None,
                fast: false,
                capped_slow: false,
                dirty: 0,
                budget: 0,
                would: 0,
                last_acting: true,
                last_event: Instant::now(),
                dirtied: None,
            }
        });
        dev.last_event = Instant::now();
        if new_node {
            dev.nodes.insert(ev.sb_dev, mounts.iter().any(|m| m.dev == sb_dev));
        }
        if new_sb {
            let mut sbs = dev.sb_names();
            sbs.push(sb_dev.clone());
            sbs.dedup();
            dev.name = self.names.of(&bdi, &sbs);
        }
        dev.shared.est.lock().unwrap().kernel(ev.bdi_bw_pages * self.page_size);
        dev.dirty = (ev.bdi_dirty_pages as i64).max(0) as u64 * self.page_size;
        if dev.sb_devs.insert(ev.sb_dev) {
            // A node's superblock too: a filesystem mounted on the device
            // later changes what it reads, and is then looked at anew.
            dev.mounted_as.insert(ev.sb_dev, mount_of(&sb_dev, &mounts));
            // Each superblock of the device is looked at once: one a user
            // made (a FUSE mount on a shared anonymous bdi cannot be, but
            // a loop device may carry several) makes the whole bdi theirs.
            let layered = |dev: &str| crate::backing::owner::layered(std::path::Path::new("/sys"), dev);
            let (backing, look_up) = if ev.block_device() {
                Backing::of_block_device(&bdi, layered)
            } else {
                Backing::of(&bdi, &sb_dev, &mounts, layered)
            };
            // A layered device already looked up is not looked up again for
            // each of its superblocks (its partitions' filesystems).
            let known = look_up.is_some() && dev.sb_devs.len() > 1 && !dev.shared.user_made();
            if !known && (backing.user_made() || dev.sb_devs.len() == 1) {
                // A layered device's is said by its lookup, once it knows.
                if look_up.is_none() && backing.user_made() && !dev.shared.user_made() {
                    tracing::info!(
                        bdi,
                        name = %printable(&dev.name),
                        backing = %backing.describe(),
                        "a user sets this device's speed: it paces nobody unless the root policy says pace_user_devices"
                    );
                }
                *dev.shared.backing.lock().unwrap() = backing;
                if let Some(under) = look_up {
                    self.owners.start(&bdi, &dev.name, under, &dev.shared);
                }
                if backing.network() {
                    dev.export = mounts.iter().find(|m| m.dev == sb_dev).map(|m| m.source.clone());
                }
                if !backing.global_lever() && !dev.own_limit {
                    tracing::info!(
                        bdi,
                        name = %printable(&dev.name),
                        backing = %backing.describe(),
                        "no dirty limit of its own: windows only, the global limit stays the administrator's"
                    );
                }
            }
            if let Some(m) = &mut self.map {
                // What the others were told, or before the first tick, no
                // pool yet.
                let bw = dev.shared.bandwidth();
                let told = dev.pushed.unwrap_or_default();
                let entry = dev.entry(Pushed { bw, floor: dev.floor(bw), ..told }, self.page_size);
                if let Err(e) = m.insert(ev.sb_dev, entry, 0) {
                    self.map_failures.note(&mut dev.pushed, &bdi, &e, Instant::now());
                }
            }
        }
        dev.shared.clone()
    }

    /// A writer that counts for pacing (bandwidth::meaningful) wrote to
    /// the device: paced from now, not from the next tick, once its dirty
    /// pages show that it does not keep up (OUTRUN), since a writer faster
    /// than the device piles up ~100 MiB per 100 ms tick.  Other
    /// events (a trickle of closes) neither start nor prolong pacing.
    /// `small_files`: the writer's files are small (SMALL_FILES), paced at
    /// once whatever its dirty pages say yet.  `acting`: the writer's
    /// policy acts (an observing writer's need is a "would", decide::
    /// observed).
    pub fn busy(&mut self, bdi: &str, small_files: bool, acting: bool) {
        let Some(dev) = self.devs.get_mut(bdi) else { return };
        let now = Instant::now();
        dev.last_busy = Some(now);
        if small_files {
            dev.last_small_files = Some(now);
        }
        let capped = dev.budget != 0 || (!acting && dev.would != 0);
        if !capped && self.policy.pacing {
            self.update_yield();
            self.tick_one(bdi, Active { writers: 1, windowed: 1 }, acting);
        }
    }

    /// What people know the device by, as the journal writes it (escaped;
    /// the bdi for a device not known).
    pub fn name(&self, bdi: &str) -> String {
        self.devs.get(bdi).map_or_else(|| bdi.to_owned(), |d| printable(&d.name))
    }

    /// A device an event was noted for, unless forgotten since (idle).
    pub fn device(&self, bdi: &str) -> Option<Arc<DeviceShared>> {
        self.devs.get(bdi).map(|d| d.shared.clone())
    }

    /// Whether the block device `sb_dev` (on disk `bdi`) had a filesystem
    /// mounted when it was first written through its node: its writes are
    /// then that filesystem's business.
    pub fn mounted_node(&self, bdi: &str, sb_dev: u32) -> bool {
        self.devs.get(bdi).is_some_and(|d| d.nodes.get(&sb_dev).copied().unwrap_or(false))
    }

    /// The device's bandwidth estimate (0 for a device never seen).
    pub fn bandwidth(&self, bdi: &str) -> u64 {
        self.devs.get(bdi).map_or(0, |d| d.shared.bandwidth())
    }

    /// The device's window (the configured one for a device never seen).
    pub fn window(&self, bdi: &str) -> u64 {
        self.devs.get(bdi).map_or_else(|| self.initial_window(), |d| d.shared.window())
    }

    /// The dirty cap the agent holds on the device now; 0 when not pacing.
    pub fn budget(&self, bdi: &str) -> u64 {
        self.devs.get(bdi).map_or(0, |d| d.budget)
    }

    /// The cap it would hold for observing writers; 0 when it would not.
    pub fn would_budget(&self, bdi: &str) -> u64 {
        self.devs.get(bdi).map_or(0, |d| d.would)
    }

    /// Adds what a writer dirtied to its device's rate; whether all of the
    /// device's writers together now dirty at a meaningful rate
    /// (Device::dirtied; false for a device not known).
    pub fn dirtied(&mut self, bdi: &str, bytes: u64, now: Instant) -> bool {
        self.devs.get_mut(bdi).is_some_and(|d| d.dirtied(bytes, now))
    }

    /// The devices whose writers together dirty at a meaningful rate at
    /// `now`.
    pub fn dirtying(&self, now: Instant) -> HashSet<&str> {
        self.devs.iter().filter(|(_, d)| d.dirtying(now)).map(|(bdi, _)| bdi.as_str()).collect()
    }

    /// Resizes windows from the latest estimates and paces the devices with
    /// active streaming writers (`acting`: the devices where one of them
    /// acts; the others' need is reported, decide::observed).
    pub fn tick(&mut self, active: &HashMap<String, Active>, acting: &HashSet<String>, on_battery: bool) {
        self.on_battery = on_battery;
        if self.names.changed() {
            for (bdi, d) in &mut self.devs {
                if d.forget_remounted(self.names.mounts()) {
                    tracing::debug!(bdi, "a superblock's mount changed: its backing is looked at again");
                }
                d.name = self.names.of(bdi, &d.sb_names());
            }
        }
        self.update_yield();
        let bdis: Vec<String> = self.devs.keys().cloned().collect();
        for bdi in bdis {
            let a = active.get(&bdi).copied().unwrap_or_default();
            self.tick_one(&bdi, a, acting.contains(&bdi));
        }
        self.pacer.tick();
        self.owners.tick();
    }

    /// Whether a device the global limit must not pace (Backing::
    /// global_lever) and without a limit of its own is being written, or
    /// still holds what was written: until its last writer's pages could
    /// have drained at its bandwidth, or while its flusher thread is
    /// stalled (a silent server: its pages stay).  Then no device is paced
    /// through the global limit: one low enough to pace any device holds
    /// every writer, and it fills with that device's pages.  On 6.1, with
    /// the SMB share itself unpaced, the 512 MiB cp still took 35.8 s
    /// against the default's 20.5 (216 pauses in balance_dirty_pages, 19 s)
    /// while another device was paced through the global limit.
    fn yield_global(&self) -> bool {
        let now = Instant::now();
        self.devs.values().filter(|d| !d.own_limit && !d.shared.backing().global_lever()).any(|d| {
            decide::not_drained(d.dirty, d.shared.bandwidth(), d.last_busy, now) || d.shared.stalled().is_some()
        })
    }

    /// Decides `yield_global` for every device of this tick (or of a
    /// writer that just counted), and logs when it changes.
    fn update_yield(&mut self) {
        let yielding = self.policy.pacing && self.yield_global();
        if yielding == self.yielding_global {
            return;
        }
        self.yielding_global = yielding;
        if yielding {
            tracing::info!(
                "an SMB share is written without a dirty limit of its own: the global limit is the administrator's until it is done"
            );
        } else {
            tracing::info!("no SMB share written any more: the global limit paces again");
        }
    }

    /// Whether the device has a record (an event named it lately).
    pub fn knows(&self, bdi: &str) -> bool {
        self.devs.contains_key(bdi)
    }

    /// Sizes the device's window and chunk and paces it (or not), as
    /// decide::decide says, and brings BPF's entry for it up to date.
    /// `acting`: a writer that counts there acts.  Where only observing
    /// writers ask (decide::observed), what the pacer would be told is
    /// kept as the device's "would" cap and nothing is written.
    fn tick_one(&mut self, bdi: &str, active: Active, acting: bool) {
        let observes_all = self.observes_all();
        let Some(dev) = self.devs.get_mut(bdi) else {
            return;
        };
        let (budget, would, last_acting) = (dev.budget, dev.would, dev.last_acting);
        let observed =
            decide::observed(Askers { observes_all, writers: active.writers, acting, budget, would, last_acting });
        if active.writers > 0 {
            dev.last_acting = acting;
        }
        if observed && budget != 0 {
            tracing::info!(bdi, "only observing writers need the cap: released, reported as would pace");
            self.pacer.release(bdi);
            dev.budget = 0;
        }
        if !observed {
            dev.would = 0;
        }
        let Some(inputs) = self.inputs(bdi, active, Instant::now(), observed) else {
            return;
        };
        let decision = decide::decide(&inputs);
        let bw = inputs.device.bw;
        let Some(dev) = self.devs.get_mut(bdi) else {
            return;
        };
        // Every line logged meanwhile (the pacer's "pacing on" too) names it.
        let _named = tracing::info_span!("device", name = %printable(&dev.name)).entered();
        dev.fast = decision.fast;
        dev.shared.chunk.store(decision.chunk, Relaxed);
        dev.shared.window.store(decision.window, Relaxed);
        if observed {
            match decision.action {
                Action::Keep | Action::Stall { .. } => {}
                Action::Release { .. } => {
                    if std::mem::take(&mut dev.would) != 0 {
                        tracing::info!(bdi, "would stop pacing the device (observing)");
                    }
                }
                Action::Cap { budget, capped_slow, .. } => {
                    if dev.would == 0 {
                        self.would_pace += 1;
                        let lever = lever_name(self.pacer.lever(bdi));
                        tracing::info!(bdi, bw, dirty = dev.dirty, budget, lever, "would cap the device (observing)");
                    }
                    (dev.would, dev.capped_slow) = (budget, capped_slow);
                }
            }
        }
        let action = if observed { Action::Keep } else { decision.action };
        match action {
            Action::Keep => {}
            Action::Stall { held } => self.pacer.stall(bdi, held),
            Action::Release { why: ReleaseWhy::Fast } => {
                tracing::info!(bdi, bw, "the device is fast: uncapped until its writeback falls behind");
                self.pacer.release(bdi);
                (dev.budget, dev.capped_slow) = (0, false);
            }
            Action::Release { why: ReleaseWhy::Unpaced } => {
                self.pacer.release(bdi);
                dev.budget = 0;
            }
            Action::Cap { budget, why, capped_slow } => {
                if let Some(why) = why {
                    tracing::info!(bdi, bw, dirty = dev.dirty, budget, why, "capping the device");
                }
                dev.capped_slow = capped_slow;
                let was = dev.budget;
                dev.budget = match self.pacer.pace(bdi, budget) {
                    Ok(true) => budget,
                    Ok(false) => 0,
                    Err(e) => {
                        tracing::warn!(bdi, error = %format!("{e:#}"), "cannot pace device");
                        0
                    }
                };
                if was == 0 && dev.budget != 0 {
                    self.pacing_started += 1;
                }
            }
        }
        dev.paced(inputs.now);
        let batch = decide::batch_closes(dev.budget, decision.pacing, dev.knobs, || self.pacer.stepped_aside(bdi));
        let next = Pushed { bw, batch, floor: decision.floor, pool: decision.pool };
        if let Some(next) = decide::push(dev.pushed, next)
            && let Some(m) = &mut self.map
        {
            let entry = dev.entry(next, self.page_size);
            let insert = |sb| m.insert(sb, entry, 0);
            let sbs = dev.sb_devs.iter().copied();
            if push::push(&mut dev.pushed, next, sbs, insert, &mut self.map_failures, bdi, inputs.now) {
                let window = decision.window;
                tracing::debug!(bdi, bw, window, batch, "device updated for BPF");
            }
        }
    }

    /// What the device's tick decides from (None for a device not known);
    /// `observed`: for its "would" cap, as if the pacer had set it.
    fn inputs(&self, bdi: &str, active: Active, now: Instant, observed: bool) -> Option<Inputs> {
        let dev = self.devs.get(bdi)?;
        let sizing = self.sizing();
        let figures = Figures {
            pacing: self.policy.pacing && !(self.on_battery && self.policy.on_battery == OnBattery::Off),
            pace_user_devices: self.policy.pace_user_devices,
            sizing,
            fixed_window: self.initial_window(),
            in_flight_seconds: self.policy.in_flight_seconds,
            stream_dirty: self.policy.stream_dirty.0,
            burst: self.policy.burst.0,
        };
        let pacer = PacerView {
            // The lever as read when the device was first seen (a bdi keeps
            // its knobs), not stat()ed again at every tick.
            dirty_seconds: Pacer::dirty_seconds(
                dev.lever(),
                sizing.map_or(self.policy.dirty_seconds, |z| z.dirty_seconds),
            ),
            is_stalled: !observed && self.pacer.is_stalled(bdi),
            is_paced: if observed { dev.would != 0 } else { self.pacer.is_paced(bdi) },
        };
        Some(Inputs { now, figures, yield_global: self.yielding_global, active, device: dev.view(observed), pacer })
    }

    /// Whether device `bdi` is paced now (for real), and its dirty +
    /// writeback bytes at its last event; None for a device not known.
    pub fn paced_dirty(&self, bdi: &str) -> Option<(bool, u64)> {
        self.devs.get(bdi).map(|d| (d.budget != 0, d.dirty))
    }

    /// For `wbctl devices`.
    pub fn status(&self) -> Vec<crate::status::DeviceStatus> {
        let now = Instant::now();
        let mut v: Vec<_> = self
            .devs
            .iter()
            .map(|(bdi, d)| crate::status::DeviceStatus {
                bdi: bdi.clone(),
                name: d.name.clone(),
                paced_secs: d.paced_before.as_secs_f64()
                    + d.paced_since.map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64()),
                bandwidth: d.shared.bandwidth(),
                window: d.shared.window(),
                chunk: d.shared.chunk(),
                dirty: d.dirty,
                paced_budget: d.budget,
                stalled_secs: d.shared.stalled().map_or(0.0, |d| d.as_secs_f64()),
                lever: self.pacer.lever_of(bdi).into(),
                would_budget: d.would,
                would_lever: if d.would != 0 { lever_name(self.pacer.lever(bdi)).into() } else { String::new() },
                backing: match &d.export {
                    Some(export) => format!("{} {export}", d.shared.backing().describe()),
                    None => d.shared.backing().describe(),
                },
            })
            .collect();
        v.sort_by(|a, b| a.bdi.cmp(&b.bdi));
        v
    }

    /// The global dirty limits in force while the agent paces through them.
    pub fn global_limits(&self) -> Option<crate::pacing::GlobalLimits> {
        self.pacer.global_status()
    }

    /// Puts every bdi limit the agent changed back (daemon stopping).
    pub fn shutdown(&mut self) {
        self.pacer.release_all();
    }
}

#[cfg(test)]
mod tests;
