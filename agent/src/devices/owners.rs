//! The owner lookups of layered devices (backing::owner).  The intake
//! thread, which drains events, answers `wbctl` and pings the watchdog,
//! touches no filesystem: it asks sysfs, and the dentry cache for a loop
//! device's backing path (owner::walk_cached), which settles a device
//! with no loop device under it (dm over a disk: a LUKS or LVM root), and
//! one over a file whose path is cached, at once.  Otherwise the path is
//! walked on a thread of its own: a user
//! may have made that path cross a FUSE server of theirs that never answers
//! a LOOKUP (measured: `wbctl status` got no answer for as long as the
//! server held it, when the walk was the intake thread's).  Until its
//! lookup answers, a device is `Backing::Layered`, a user's: it drives no
//! lever.

use std::{
    collections::VecDeque,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use super::DeviceShared;
use crate::{
    backing::{Backing, owner},
    status::printable,
};

/// How long the intake thread waits for a walk's answer: one through
/// root's own directories answers in well under this, and the device is
/// then classed before its first window's pacing decision (a slow stick
/// is capped at its writer's first window).  A walk that does not answer
/// costs this once.
const ANSWER_WITHIN: Duration = Duration::from_millis(5);

/// Walks under way at once.  One that never returns holds its thread (and
/// a task of the unit's TasksMax) for good; beyond this many, lookups wait
/// in `queued` for one to end.
pub(super) const LOOKUPS: usize = 4;

/// Lookups waiting for a thread, at most; past that a layered device
/// counts as a user's until its superblock is seen anew.
const QUEUED: usize = 256;

/// One device's lookup: what is under block device `dev`, for the device
/// `shared` (bdi `bdi`, shown as `name`), its `generation`th lookup.
struct Lookup {
    bdi: String,
    name: String,
    dev: String,
    shared: Arc<DeviceShared>,
    generation: u64,
}

#[derive(Default)]
pub(super) struct OwnerLookups {
    running: Arc<AtomicUsize>,
    queued: VecDeque<Lookup>,
    /// A full queue was logged (again once it has room).
    full_logged: bool,
}

impl OwnerLookups {
    /// Looks up the owner of what is under block device `dev` for the
    /// device `shared` (bdi `bdi`, shown as `name`), whose backing says
    /// `Layered` until then: from sysfs at once where that tells, else on a
    /// thread of its own.
    pub(super) fn start(&mut self, bdi: &str, name: &str, dev: String, shared: &Arc<DeviceShared>) {
        let generation = shared.lookup.fetch_add(1, Relaxed) + 1;
        let lookup = Lookup { bdi: bdi.into(), name: name.into(), dev, shared: shared.clone(), generation };
        match owner::owner(Path::new("/sys"), &lookup.dev, &owner::walk_cached) {
            Some(owner) => lookup.answer(owner),
            None if self.running.load(Relaxed) < LOOKUPS => {
                tracing::debug!(bdi, "what is under the device is walked on a thread");
                self.spawn(lookup)
            }
            None if self.queued.len() < QUEUED => self.queued.push_back(lookup),
            None => {
                if !std::mem::replace(&mut self.full_logged, true) {
                    tracing::warn!(
                        bdi,
                        "owner lookups of layered devices do not return: this device counts as a user's"
                    );
                }
            }
        }
    }

    /// Starts waiting lookups as threads end (every device tick).
    pub(super) fn tick(&mut self) {
        while self.running.load(Relaxed) < LOOKUPS {
            let Some(lookup) = self.queued.pop_front() else { break };
            self.full_logged = false;
            self.spawn(lookup);
        }
    }

    fn spawn(&mut self, lookup: Lookup) {
        self.running.fetch_add(1, Relaxed);
        let running = self.running.clone();
        let bdi = lookup.bdi.clone();
        let (answered, answer) = std::sync::mpsc::channel();
        let started = std::thread::Builder::new().name("wb-owner".into()).stack_size(256 << 10).spawn(move || {
            let owner = owner::owner(Path::new("/sys"), &lookup.dev, &owner::walk).unwrap_or(owner::UNKNOWN);
            lookup.answer(owner);
            let _ = answered.send(());
            running.fetch_sub(1, Relaxed);
        });
        match started {
            Ok(_) => {
                let _ = answer.recv_timeout(ANSWER_WITHIN);
            }
            Err(e) => {
                self.running.fetch_sub(1, Relaxed);
                tracing::warn!(bdi, error = %e, "cannot start an owner lookup: this device counts as a user's");
            }
        }
    }
}

impl Lookup {
    /// Resolves the device's backing from `owner`, if it is still the one
    /// this lookup was started for (a later superblock or mount may have
    /// started another, or said more), and says so.
    fn answer(&self, owner: u32) {
        let backing = {
            let mut b = self.shared.backing.lock().unwrap();
            if self.shared.lookup.load(Relaxed) != self.generation || !matches!(*b, Backing::Layered { .. }) {
                return;
            }
            *b = b.resolved(owner);
            *b
        };
        if backing.user_made() {
            tracing::info!(
                bdi = %self.bdi,
                name = %printable(&self.name),
                backing = %backing.describe(),
                "a user sets this device's speed: it paces nobody unless the root policy says pace_user_devices"
            );
        } else {
            tracing::debug!(bdi = %self.bdi, backing = %backing.describe(), "all under the device is root's");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup answers only for the device's latest, and only while the
    /// device is still layered: an older one (a loop number's previous
    /// image, root's) must not undo what the newer one found.
    #[test]
    fn only_the_latest_lookup_answers() {
        let shared = Arc::new(DeviceShared::for_tests());
        *shared.backing.lock().unwrap() = Backing::Layered { fuse: false };
        let lookup = |generation| Lookup {
            bdi: "7:0".into(),
            name: "loop0".into(),
            dev: "7:0".into(),
            shared: shared.clone(),
            generation,
        };
        shared.lookup.store(2, Relaxed);
        lookup(1).answer(0);
        assert_eq!(shared.backing(), Backing::Layered { fuse: false }, "an older lookup answered");
        lookup(2).answer(1000);
        assert_eq!(shared.backing(), Backing::UserLoop { user: 1000 });
        lookup(2).answer(0);
        assert_eq!(shared.backing(), Backing::UserLoop { user: 1000 }, "a class found is not found again");
    }
}
