//! Which devices hold a record: a device is admitted at its first event
//! unless its user is at their bound (bound.rs), and forgotten once idle,
//! its BPF entry with it.

use std::time::Instant;

use super::*;

impl Devices {
    /// Whether the event's device has a record, or gets one (bound.rs): a
    /// user's device beyond their bound does not, and its writers are left
    /// to the kernel.  Asked before `note`, at each event; for a device not
    /// known, the mount table is read (as `note` reads it).
    pub fn admits(&mut self, ev: &wb_event) -> bool {
        let bdi = ev.bdi();
        if self.devs.contains_key(&bdi) {
            return true;
        }
        let now = Instant::now();
        if self.shed.get(&bdi).is_some_and(|t| now.saturating_duration_since(*t) < SHED_RECHECK) {
            return false;
        }
        let layered = |dev: &str| crate::backing::owner::layered(std::path::Path::new("/sys"), dev);
        let (backing, look_up) = if ev.block_device() {
            Backing::of_block_device(&bdi, layered)
        } else {
            Backing::of(&bdi, &sb_dev_name(ev.sb_dev), &crate::sys::mounts(), layered)
        };
        // A layered device's owner as far as sysfs and the dentry cache
        // tell (owners.rs; no filesystem asked): root's loop device over a
        // cached file, or dm over a disk, is the administrator's at once.
        let cached = || {
            crate::backing::owner::owner(std::path::Path::new("/sys"), &look_up?, &crate::backing::owner::walk_cached)
        };
        let backing = cached().map_or(backing, |uid| backing.resolved(uid));
        let holder = bound::Holder::of(backing);
        let pacer = &self.pacer;
        let held: Vec<bound::Held> = self
            .devs
            .iter()
            .map(|(bdi, d)| bound::Held {
                bdi,
                holder: bound::Holder::of(d.shared.backing()),
                last_event: d.last_event,
                // A flusher thread or an owner lookup holds the shared part.
                idle_ok: d.budget == 0 && !pacer.is_paced(bdi) && Arc::strong_count(&d.shared) == 1,
            })
            .collect();
        match bound::room(holder, &held, now) {
            bound::Room::Admit => {}
            bound::Room::Evict(old) => {
                let old = old.to_owned();
                tracing::debug!(bdi = old, new = bdi, ?holder, "device forgotten for another of its user's");
                self.forget(&old);
            }
            bound::Room::Shed => {
                if self.shed.len() >= SHED_KEPT {
                    self.shed.clear();
                }
                if self.shed.insert(bdi.clone(), now).is_none() {
                    self.devices_shed_user += 1;
                    tracing::debug!(bdi, ?holder, "a user's device beyond their bound: left to the kernel");
                }
                return false;
            }
        }
        self.shed.remove(&bdi);
        true
    }

    /// Forgets devices no event named for DEVICE_IDLE (a user's: USER_IDLE,
    /// bound.rs), unless paced or `in_use` (a flusher thread still holds
    /// the record: one stuck in a hung device's writeback keeps feeding its
    /// bandwidth samples, which a new record would not see).
    pub fn forget_idle(&mut self, now: Instant, in_use: impl Fn(&str) -> bool) {
        let pacer = &self.pacer;
        let idle: Vec<String> = self
            .devs
            .iter()
            .filter(|(bdi, d)| {
                let after = bound::Holder::of(d.shared.backing()).idle(DEVICE_IDLE);
                now.saturating_duration_since(d.last_event) >= after
                    && d.budget == 0
                    && !pacer.is_paced(bdi)
                    && !in_use(bdi)
            })
            .map(|(bdi, _)| bdi.clone())
            .collect();
        for bdi in idle {
            self.forget(&bdi);
            tracing::debug!(bdi, "device forgotten (idle)");
        }
        self.shed.retain(|_, t| now.saturating_duration_since(*t) < SHED_RECHECK);
    }

    /// Forgets the device's record and its entries in BPF's map.
    fn forget(&mut self, bdi: &str) {
        let Some(d) = self.devs.remove(bdi) else { return };
        if let Some(m) = &mut self.map {
            // A superblock number another device has taken since (an
            // anonymous one, freed at an unmount and given to the next
            // FUSE or btrfs mount) is that device's entry now.
            for sb in d.sb_devs.iter().filter(|sb| !self.devs.values().any(|o| o.sb_devs.contains(sb))) {
                let _ = m.remove(sb);
            }
        }
    }
}
