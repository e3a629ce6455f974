//! Writing BPF's `devices` map: a device's entry inserted for each of its
//! superblocks (through a closure, so that the step is tested without BPF),
//! recorded as what BPF was told only once every insert took, and a failed
//! insert warned about at most once every WARN_EVERY, with how many failed.

use std::{
    fmt::Display,
    time::{Duration, Instant},
};

use super::decide::Pushed;

/// A failing map is warned about at most this often: a tick retries every
/// 100 ms.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(60);

/// Failed inserts into BPF's `devices` map, and when they were last warned
/// about.
#[derive(Debug, Default)]
pub(super) struct Failures {
    unwarned: u64,
    warned: Option<Instant>,
}

impl Failures {
    /// One more failure at `now`: how many failed since the last warning
    /// (this one too), when one is due.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.unwarned += 1;
        if self.warned.is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY) {
            return None;
        }
        self.warned = Some(now);
        Some(std::mem::take(&mut self.unwarned))
    }

    /// A failed insert of `bdi`'s entry: `pushed` forgets what BPF was
    /// told, so that the next tick pushes again whatever moved; warned
    /// about when due.
    pub fn note(&mut self, pushed: &mut Option<Pushed>, bdi: &str, error: &dyn Display, now: Instant) {
        *pushed = None;
        if let Some(failed) = self.failed(now) {
            tracing::warn!(bdi, error = %error, failed, "cannot update BPF's devices map: tried again at the next tick");
        }
    }
}

/// Inserts a device's entry for each of `sbs` through `insert` (each one is
/// tried); `pushed` becomes `next` once all took, None when one failed.
/// Whether all took.
pub(super) fn push<E: Display>(
    pushed: &mut Option<Pushed>,
    next: Pushed,
    sbs: impl IntoIterator<Item = u32>,
    mut insert: impl FnMut(u32) -> Result<(), E>,
    failures: &mut Failures,
    bdi: &str,
    now: Instant,
) -> bool {
    let mut first = Ok(());
    for sb in sbs {
        if let Err(e) = insert(sb)
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    match first {
        Ok(()) => {
            *pushed = Some(next);
            true
        }
        Err(e) => {
            failures.note(pushed, bdi, &e, now);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::decide;

    #[test]
    fn a_failed_insert_is_not_recorded_as_pushed_and_the_next_tick_tries_again() {
        let now = Instant::now();
        let mut failures = Failures::default();
        let told = Pushed { bw: 100 << 20, batch: false, floor: 1 << 20, pool: 100 << 20 };
        let mut pushed = Some(told);
        let batched = Pushed { batch: true, ..told };
        let next = decide::push(pushed, batched).expect("batching changed");
        let mut tried = Vec::new();
        let failing = |sb: u32| {
            tried.push(sb);
            if sb == 2 { Err("map full") } else { Ok(()) }
        };
        assert!(!push(&mut pushed, next, [1, 2, 3], failing, &mut failures, "7:0", now));
        assert_eq!(tried, [1, 2, 3], "every superblock tried");
        assert_eq!(pushed, None, "not recorded");
        // The next tick, nothing moved: pushed again all the same.
        let again = decide::push(pushed, batched).expect("BPF's entry not known");
        assert_eq!(again, next);
        assert!(push(&mut pushed, again, [1, 2, 3], |_| Ok::<_, &str>(()), &mut failures, "7:0", now));
        assert_eq!(pushed, Some(next));
        assert_eq!(decide::push(pushed, batched), None, "then not again");
    }

    #[test]
    fn failed_inserts_are_warned_about_once_every_warn_every_with_their_count() {
        let t = Instant::now();
        let mut f = Failures::default();
        assert_eq!(f.failed(t), Some(1), "the first at once");
        assert_eq!(f.failed(t + Duration::from_secs(1)), None);
        assert_eq!(f.failed(t + WARN_EVERY - Duration::from_millis(1)), None);
        assert_eq!(f.failed(t + WARN_EVERY), Some(3), "then with all since");
        assert_eq!(f.failed(t + WARN_EVERY + Duration::from_secs(1)), None);
    }
}
