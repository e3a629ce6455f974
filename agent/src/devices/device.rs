//! One device's record in the table (`Device`): its superblocks, what was
//! read of it once (its maximal request, its knobs and lever), what BPF was
//! last told, its writers' latest times, whether it is fast and how it is
//! capped, and what its writers dirtied lately together (its rate).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use super::{
    decide::{self, DeviceView, Pushed},
    shared::DeviceShared,
};
use crate::{abi::wb_device, bandwidth::Rate};

pub(super) struct Device {
    /// What people know it by (names.rs): kept until its superblocks or
    /// the mount table change.
    pub(super) name: String,
    /// Since when it is paced (a budget set), and how long it was before.
    pub(super) paced_since: Option<Instant>,
    pub(super) paced_before: std::time::Duration,
    pub(super) shared: Arc<DeviceShared>,
    /// Superblocks on this device (btrfs: one bdi, several may appear).
    pub(super) sb_devs: HashSet<u32>,
    /// Each filesystem superblock's mount as it was when its backing was
    /// found (probe::mount_of): one whose mount is no longer that is looked
    /// at again at its next event.  An unmount frees an anonymous number
    /// for the next mount, a user's FUSE mount too, which took root's
    /// FUSE mount's class with it.
    pub(super) mounted_as: HashMap<u32, String>,
    /// Block devices on it written through their node, and whether a
    /// filesystem was mounted on them when first seen so (left to that
    /// filesystem's writers).  Apart from `sb_devs`: a filesystem on the
    /// device has the device's own number, and its files may come first.
    pub(super) nodes: HashMap<u32, bool>,
    /// One maximal request of the device, the floor of its window (and
    /// of its chunk); at least the grain.
    pub(super) max_request: u64,
    /// The kernel has the bdi's pacing knobs (read once: a bdi keeps them).
    pub(super) knobs: bool,
    /// Paced through a dirty limit of its own (the bdi lever), not the
    /// global one every writer shares.
    pub(super) own_limit: bool,
    /// A network filesystem's "server:/export" (its mount's source), shown
    /// beside the backing: its bdi's name (0:NN) says nothing of it.
    pub(super) export: Option<String>,
    /// What BPF was last told (wb_device); None when an insert failed
    /// since, and its entries are not known.
    pub(super) pushed: Option<Pushed>,
    /// When a writer last counted for pacing (`busy`).
    pub(super) last_busy: Option<Instant>,
    /// When a writer of small files (SMALL_FILES) last counted.
    pub(super) last_small_files: Option<Instant>,
    /// Its capacity (Estimator::capacity) has reached FAST_DEVICE once: it
    /// is fast, whatever a moment's contention makes of the estimate later.
    pub(super) fast: bool,
    /// Capped before it was known to be fast: released once it is.
    pub(super) capped_slow: bool,
    /// Dirty + writeback bytes of the device at its latest event.
    pub(super) dirty: u64,
    /// The dirty cap the agent set, 0 when not pacing.
    pub(super) budget: u64,
    /// The cap it would set, were its writers not observing (decide::
    /// observed), 0 when it would not pace: reported, never written.
    pub(super) would: u64,
    /// Whether the latest writer that counted for pacing acted.
    pub(super) last_acting: bool,
    /// When an event last named it.
    pub(super) last_event: Instant,
    /// What its writers dirtied lately, together (None until one did).
    pub(super) dirtied: Option<Rate>,
}

impl Device {
    /// Its superblocks as mountinfo writes them.
    pub(super) fn sb_names(&self) -> Vec<String> {
        self.sb_devs.iter().map(|&sb| super::probe::sb_dev_name(sb)).collect()
    }

    /// Forgets its superblocks whose mount in `mounts` is no longer the one
    /// their backing was found from (`mounted_as`); true if one was.
    pub(super) fn forget_remounted(&mut self, mounts: &[crate::sys::MountInfo]) -> bool {
        let gone: Vec<u32> = self
            .mounted_as
            .iter()
            .filter(|(sb, was)| super::probe::mount_of(&super::probe::sb_dev_name(**sb), mounts) != **was)
            .map(|(sb, _)| *sb)
            .collect();
        for sb in &gone {
            self.sb_devs.remove(sb);
            self.mounted_as.remove(sb);
        }
        !gone.is_empty()
    }

    /// Notes whether it is paced now; the time it was paced, in all.
    pub(super) fn paced(&mut self, now: Instant) -> std::time::Duration {
        match (self.budget > 0, self.paced_since) {
            (true, None) => self.paced_since = Some(now),
            (false, Some(since)) => {
                self.paced_before += now.saturating_duration_since(since);
                self.paced_since = None;
            }
            _ => {}
        }
        self.paced_before + self.paced_since.map_or(Default::default(), |s| now.saturating_duration_since(s))
    }

    /// The lever that paces it, as read when it was first seen (`knobs`:
    /// some lever can; `own_limit`: its own).
    pub(super) fn lever(&self) -> Option<crate::pacing::Lever> {
        use crate::pacing::Lever;
        match (self.knobs, self.own_limit) {
            (_, true) => Some(Lever::Bdi),
            (true, false) => Some(Lever::Global),
            (false, false) => None,
        }
    }

    /// What BPF knows of the device (for each of its superblocks), told
    /// `p` (its pool in pages of `page_size`).
    pub(super) fn entry(&self, p: Pushed, page_size: u64) -> wb_device {
        wb_device {
            bw: p.bw,
            floor: p.floor,
            batch_closes: p.batch as u64,
            grain: self.shared.grain,
            pool_pages: p.pool / page_size.max(1),
        }
    }

    /// The smallest window and chunk worth a sync_file_range at bw
    /// (decide::floor).
    pub(super) fn floor(&self, bw: u64) -> u64 {
        decide::floor(
            self.max_request,
            self.own_limit && self.shared.network() && self.shared.est.lock().unwrap().sampled(),
            bw,
        )
    }

    /// What a tick decides from, of the device; `observed`: of its
    /// "would" cap, not of the cap in force.
    pub(super) fn view(&self, observed: bool) -> DeviceView {
        let (bw, capacity) = self.shared.rates();
        DeviceView {
            bw,
            capacity,
            sampled: self.shared.est.lock().unwrap().sampled(),
            backing: self.shared.backing(),
            own_limit: self.own_limit,
            max_request: self.max_request,
            fast: self.fast,
            capped_slow: self.capped_slow,
            dirty: self.dirty,
            last_event: self.last_event,
            budget: if observed { self.would } else { self.budget },
            last_busy: self.last_busy,
            last_small_files: self.last_small_files,
            stalled: self.shared.stalled().is_some(),
        }
    }

    /// Adds what a writer dirtied to the device's rate; whether all of its
    /// writers together now dirty at a meaningful rate.  Each may be below
    /// it (twenty downloads to a stick, each at a twentieth of it) and
    /// still outrun the device together.
    pub(super) fn dirtied(&mut self, bytes: u64, now: Instant) -> bool {
        let bw = self.shared.bandwidth();
        let r = self.dirtied.get_or_insert_with(|| Rate::new(now));
        r.add(bytes, now);
        r.meaningful(now, bw)
    }

    /// Whether its writers together dirty at a meaningful rate at `now`.
    pub(super) fn dirtying(&self, now: Instant) -> bool {
        self.dirtied.is_some_and(|r| r.meaningful(now, self.shared.bandwidth()))
    }
}
