//! Pacing writers faster than their device.
//!
//! BPF cannot make a writer sleep; the kernel can.  A bdi's `max_bytes`
//! (6.2+) caps the dirty data the device may hold, and `strict_limit` makes
//! balance_dirty_pages() apply that cap even while the system as a whole is
//! far below its limits — the kernel's own IO-less throttle then paces every
//! dirtier of that device to its write bandwidth.  The agent sets them only
//! while streaming writers are active on the device.  Where a kernel has no
//! such knobs (before 6.2), the second lever is the global limit (`global`),
//! chosen by feature, not by version.
//!
//! These are the administrator's settings.  Their values are journaled
//! under /run before every write to a knob and put back when pacing ends,
//! when the daemon stops, and, after a crash, when it starts again (or by
//! `writebehindd --restore`).  A knob that no longer holds what the agent
//! wrote was changed by someone else: the agent steps aside for that device
//! (and neither restores nor touches it).
//!
//! Here: `Lever` and `Pacer`, which paces each device by one lever or the
//! other.  The per-device lever is in `bdi`, the global one in `global`,
//! and the journal protocol both follow in `journal`.

use std::path::PathBuf;

use anyhow::Result;

mod bdi;
pub mod global;
mod journal;

use bdi::Bdi;
pub use global::{Global, GlobalLimits};

pub const JOURNAL: &str = "/run/writebehindd/paced-bdis";
pub const SYSFS_BDI: &str = "/sys/class/bdi";

/// Which lever paces a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lever {
    /// The bdi's own knobs where the kernel has them, else the global limit.
    Auto,
    /// The bdi's strict_limit and max_bytes only.
    Bdi,
    /// The global vm.dirty_bytes only (what kernels before 6.2 get; on a
    /// newer one, to test it).
    Global,
}

pub struct Pacer {
    choice: Lever,
    global: Global,
    bdi: Bdi,
    /// The kernel's lack of the knobs was logged.
    unavailable_logged: bool,
}

impl Pacer {
    /// A pacer for the real sysfs, after putting back what a previous run
    /// of the daemon left set (it crashed or was killed); `writebehindd
    /// --restore` is this alone.  One process at a time: the caller holds
    /// the daemon's instance lock.
    pub fn new(choice: Lever) -> Self {
        Self::with_paths(SYSFS_BDI.into(), JOURNAL.into(), Global::new(), choice)
    }

    pub fn with_paths(root: PathBuf, journal: PathBuf, global: Global, choice: Lever) -> Self {
        Self { choice, global, bdi: Bdi::new(root, journal), unavailable_logged: false }
    }

    /// The lever for this device, if any: the bdi's own knobs where it has
    /// them (a bdi keeps them), else the global limit.
    pub fn lever(&self, bdi: &str) -> Option<Lever> {
        let knobs = self.bdi.has_knobs(bdi);
        match self.choice {
            Lever::Auto | Lever::Bdi if knobs => Some(Lever::Bdi),
            Lever::Auto | Lever::Global if self.global.available() => Some(Lever::Global),
            _ => None,
        }
    }

    /// How many seconds of the device's bandwidth its budget should be, for
    /// a policy that asks for `dirty_seconds`, on the device's `lever`: the
    /// global lever needs more on a fast device (global::MIN_DIRTY_SECONDS).
    pub fn dirty_seconds(lever: Option<Lever>, dirty_seconds: f64) -> f64 {
        match lever {
            Some(Lever::Global) => dirty_seconds.max(global::MIN_DIRTY_SECONDS),
            _ => dirty_seconds,
        }
    }

    /// Whether the device can be paced at all.
    pub fn available(&self, bdi: &str) -> bool {
        self.lever(bdi).is_some()
    }

    /// How many sets of values a previous run had left journaled (restored
    /// at start unless changed by hand since): each bdi, and the global
    /// limits.
    pub fn recovered(&self) -> usize {
        self.bdi.recovered() + self.global.recovered() as usize
    }

    /// Someone else changed the device's knobs: it is not paced again.
    pub fn stepped_aside(&self, bdi: &str) -> bool {
        self.bdi.stepped_aside(bdi) || (self.global.stepped_aside() && self.lever(bdi).is_none())
    }

    pub fn is_paced(&self, bdi: &str) -> bool {
        self.bdi.is_paced(bdi) || self.global.is_paced(bdi)
    }

    /// How a paced device is paced ("bdi" or "global"), for status.
    pub fn lever_of(&self, bdi: &str) -> &'static str {
        if self.bdi.is_paced(bdi) {
            "bdi"
        } else if self.global.is_paced(bdi) {
            "global"
        } else {
            ""
        }
    }

    /// The global limits in force, while the agent's are.
    pub fn global_status(&self) -> Option<GlobalLimits> {
        self.global.status()
    }

    /// Every device tick: the global limit steps down towards the budgets,
    /// and restores that failed are tried again.
    pub fn tick(&mut self) {
        self.global.tick();
        self.bdi.retry();
    }

    /// Caps `bdi` at `budget` dirty bytes, strictly.  Returns false if the
    /// agent stepped aside for this device.
    pub fn pace(&mut self, bdi: &str, budget: u64) -> Result<bool> {
        match self.lever(bdi) {
            Some(Lever::Bdi) => self.bdi.pace(bdi, budget, || self.global.kernel_threshold()),
            Some(_) => self.global.pace(bdi, budget),
            None => {
                if !std::mem::replace(&mut self.unavailable_logged, true) {
                    tracing::warn!(
                        bdi,
                        "no per-device strict_limit/max_bytes and no global dirty limits to use: devices are not paced"
                    );
                }
                Ok(false)
            }
        }
    }

    /// `bdi` stopped answering with `held` bytes dirty or under writeback.
    /// Under the global lever it gives up its budget (`Global::stall`); its
    /// own knobs hold its pages to itself, and stay as they are.
    pub fn stall(&mut self, bdi: &str, held: u64) {
        self.global.stall(bdi, held);
    }

    /// Whether `bdi` gave up its budget (`stall`): to be paced again once
    /// it answers.
    pub fn is_stalled(&self, bdi: &str) -> bool {
        self.global.is_stalled(bdi)
    }

    /// Puts the administrator's values back on `bdi`.
    pub fn release(&mut self, bdi: &str) {
        self.global.release(bdi);
        self.bdi.release(bdi);
    }

    /// Releases every device (daemon stopping).
    pub fn release_all(&mut self) {
        for bdi in self.bdi.paced() {
            self.release(&bdi);
        }
        self.global.release_all();
    }
}

#[cfg(test)]
pub(crate) mod tests;
