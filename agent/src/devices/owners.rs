//! The owner lookups of layered devices (backing::owner), each on a thread
//! of its own.  The intake thread, which drains events, answers `wbctl` and
//! pings the watchdog, touches no filesystem; a lookup walks a loop
//! device's backing path, which a user may have made cross a FUSE server
//! of theirs that never answers a LOOKUP (measured: `wbctl status` got no
//! answer for as long as the server held it, when the walk was the intake
//! thread's).  Until its lookup answers, a device is `Backing::Layered`, a
//! user's: it drives no lever.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
};

use super::DeviceShared;
use crate::{
    backing::{Backing, owner},
    status::printable,
};

/// How long the intake thread waits for a lookup's answer: one that walks
/// only root's sysfs and a path in memory answers in well under this, and
/// the device is then classed before its first window's pacing decision
/// (a slow stick is capped at its writer's first window).  A lookup that
/// does not answer costs this once.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_millis(5);

/// Lookups under way at once.  One that never returns holds its thread (and
/// a task of the unit's TasksMax) for good; beyond this many, a layered
/// device stays a user's until the daemon's next start.
pub(super) const LOOKUPS: usize = 4;

#[derive(Default)]
pub(super) struct OwnerLookups {
    running: Arc<AtomicUsize>,
    /// LOOKUPS was reached and logged (again once below it).
    full_logged: bool,
}

impl OwnerLookups {
    /// Looks up the owner of what is under block device `dev` for the
    /// device `shared` (bdi `bdi`, shown as `name`), whose backing says
    /// `Layered` until then.
    pub(super) fn start(&mut self, bdi: &str, name: &str, dev: String, shared: &Arc<DeviceShared>) {
        if self.running.load(Relaxed) >= LOOKUPS {
            if !std::mem::replace(&mut self.full_logged, true) {
                tracing::warn!(
                    bdi,
                    max = LOOKUPS,
                    "owner lookups of layered devices do not return: this device counts as a user's"
                );
            }
            return;
        }
        self.full_logged = false;
        self.running.fetch_add(1, Relaxed);
        let (running, shared) = (self.running.clone(), shared.clone());
        let (answered, answer) = std::sync::mpsc::channel();
        let (bdi_, name) = (bdi.to_owned(), name.to_owned());
        let started = std::thread::Builder::new().name("wb-owner".into()).stack_size(256 << 10).spawn(move || {
            let owner = owner::owner(Path::new("/sys"), &dev, &owner::walk);
            let backing = {
                let mut b = shared.backing.lock().unwrap();
                // Only what this lookup was started for: a later superblock
                // of the device may have said more.
                if matches!(*b, Backing::Layered { .. }) {
                    *b = b.resolved(owner);
                }
                *b
            };
            let _ = answered.send(());
            if backing.user_made() {
                tracing::info!(
                    bdi = %bdi_,
                    name = %printable(&name),
                    backing = %backing.describe(),
                    "a user sets this device's speed: it paces nobody unless the root policy says pace_user_devices"
                );
            } else {
                tracing::debug!(bdi = %bdi_, backing = %backing.describe(), "all under the device is root's");
            }
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
