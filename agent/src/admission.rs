//! What may wait for a device's thread: the flush memory, each device's
//! backlog, and one user's share of each.
//!
//! A device's thread may fall far behind, or hang in writeback for good (a
//! dead disk, a FUSE server that stopped answering) and drain nothing, and
//! users can make devices and writers without end (every FUSE mount is a
//! device).  Unbounded, what waits for such threads would let one user pin
//! gigabytes in the root daemon.  So what waits is counted where it is fed,
//! not where it drains: the bytes of all waiting flushes against
//! FLUSH_MEMORY, and each device's queued flushes against MAX_QUEUED.  Past
//! either bound the range is left to the kernel, counted as over_cap.  One
//! user takes at most half of what the others leave of either (`fits`, the
//! rule the stream table keeps too), so that no user, nor two together, can
//! take everyone else's write-behind away by filling it.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

/// What the flushes waiting anywhere in the agent (a writer's batch, the
/// files left to the kernel it remembers, a device's queue) may hold in
/// memory together.  Each device's queue (MAX_QUEUED) and each writer's files
/// (LEFT_FILES) are bounded, but every FUSE mount is a device, every process
/// a writer, and on exFAT a closed file's path takes up to 4 KiB: without
/// this one user could pin gigabytes in the root daemon.  32 MiB is a quarter
/// of a million flushes by handle, or `tar x` of 30,000 files with 150-byte
/// paths seven times over.
pub(crate) const FLUSH_MEMORY: usize = 32 << 20;

/// The bytes waiting flushes hold, in all and by user, against a limit:
/// one user's at most half of what the others leave, so that no user, nor
/// two together, can take everyone else's write-behind away by filling it.
#[derive(Debug, Clone)]
pub(crate) struct FlushMemory {
    used: Arc<Mutex<Shares>>,
    limit: usize,
}

impl FlushMemory {
    pub(crate) fn new(limit: usize) -> Self {
        Self { used: Arc::default(), limit }
    }

    pub(crate) fn used(&self) -> usize {
        self.used.lock().unwrap().all
    }

    /// Takes `bytes` for `user`, or None when that would pass the limit or
    /// the user's share of it.
    pub(crate) fn charge(&self, bytes: usize, user: u32) -> Option<Charge> {
        self.used.lock().unwrap().take(bytes, user, self.limit)?;
        Some(Charge { used: self.used.clone(), bytes, user })
    }
}

/// Whether `n` more fit for a user who holds `mine` of `limit` while the
/// other users hold `others`: one user takes at most half of what the
/// others leave of it.  A user alone gets half of it, a second a quarter,
/// and so on: some is always left for the next, as all that is held stays
/// below `limit` (below 2 nobody gets any: half of 1 is none).  A flat half
/// each let two users (a review's case: hung FUSE mounts of two accounts,
/// whose queues never drain) hold all of it, and every other user's files
/// went to the kernel.  The one rule for every share the agent keeps: flush
/// memory, each device's queue, the stream table.
pub(crate) fn fits(mine: usize, others: usize, n: usize, limit: usize) -> bool {
    mine.saturating_add(n) <= limit.saturating_sub(others) / 2
}

/// What is taken of a limit, in all and by user.
#[derive(Debug, Default)]
struct Shares {
    all: usize,
    by_user: HashMap<u32, usize>,
}

impl Shares {
    /// Takes `n` for `user`, if that user's share of `limit` has room (fits).
    fn take(&mut self, n: usize, user: u32, limit: usize) -> Option<()> {
        let mine = self.by_user.get(&user).copied().unwrap_or(0);
        if !fits(mine, self.all - mine, n, limit) {
            return None;
        }
        self.all += n;
        self.by_user.insert(user, mine + n);
        Some(())
    }

    fn give_back(&mut self, n: usize, user: u32) {
        self.all -= n;
        if let Some(mine) = self.by_user.get_mut(&user) {
            *mine -= n;
            if *mine == 0 {
                self.by_user.remove(&user);
            }
        }
    }
}

/// Bytes taken of a FlushMemory for one user, given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    used: Arc<Mutex<Shares>>,
    bytes: usize,
    user: u32,
}

impl Charge {
    /// The user they were taken for.
    pub(crate) fn user(&self) -> u32 {
        self.user
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.used.lock().unwrap().give_back(self.bytes, self.user);
    }
}

/// Flushes queued on one device at most (a flush is ~64 bytes, a held
/// file's queued spans keep one fd open): beyond it, new batches are left
/// to the kernel, counted as over_cap.  A device this far behind gains
/// nothing from more queued writeback.
pub(crate) const MAX_QUEUED: usize = 65_536;

/// Flushes handed to a device's thread and not yet submitted, in all and
/// by user (one user's at most half of what the others leave).  Counted where they are
/// fed, not where they are drained: a thread hung in writeback (a dead
/// disk) drains nothing, and its channel would otherwise grow without
/// bound.  One feeder (the intake thread) adds; the device's thread takes
/// away.
#[derive(Default)]
pub(crate) struct Backlog(Mutex<Shares>, AtomicBool);

impl Backlog {
    /// Takes room for `n` more flushes of `user`, if there is room.
    pub(crate) fn try_add(&self, n: usize, user: u32) -> bool {
        self.0.lock().unwrap().take(n, user, MAX_QUEUED).is_some()
    }

    /// `n` flushes of `user` were submitted.
    pub(crate) fn done(&self, n: usize, user: u32) {
        self.0.lock().unwrap().give_back(n, user);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().all
    }

    /// Set by the device's thread while it waits for work with nothing in
    /// flight: only then may it be retired.  A thread stuck in writeback (a
    /// stalled device) is not, or each minute would leave one more of them.
    pub(crate) fn park(&self, parked: bool) {
        self.1.store(parked, Ordering::Relaxed);
    }

    pub(crate) fn parked(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_half_of_what_the_others_leave() {
        let limit = 1024;
        assert!(fits(0, 0, 512, limit), "a user alone gets half");
        assert!(!fits(0, 0, 513, limit));
        assert!(fits(511, 0, 1, limit) && !fits(512, 0, 1, limit), "one at a time, the same half");
        assert!(fits(0, 512, 256, limit), "a second a quarter of the whole");
        assert!(!fits(0, 512, 257, limit));
        assert!(fits(0, 768, 128, limit) && !fits(0, 768, 129, limit), "a third an eighth");
        assert!(fits(0, 0, 0, limit) && fits(0, limit, 0, limit), "nothing always fits");
        assert!(!fits(0, limit, 1, limit) && !fits(0, usize::MAX, 1, limit), "others past the limit leave none");
        assert!(!fits(usize::MAX, 0, 1, usize::MAX), "no overflow");
    }

    #[test]
    fn small_limits_leave_some_for_the_next() {
        assert!(!fits(0, 0, 1, 0), "limit 0: none");
        assert!(!fits(0, 0, 1, 1), "limit 1: half of it is none");
        assert!(fits(0, 0, 1, 2) && !fits(1, 0, 1, 2), "limit 2: one, for one user");
        assert!(!fits(0, 1, 1, 2), "and none for a second");
        assert!(fits(0, 1, 1, 3) && !fits(0, 2, 1, 3), "limit 3: one each for two users");
    }

    /// Users taking one at a time, in turn or each as much as it can before
    /// the next, as the rule lets them: however many, and whatever the
    /// limit, they never hold all of it.
    #[test]
    fn users_together_never_take_everything() {
        for limit in 0..200 {
            for users in 1..8 {
                for in_turn in [true, false] {
                    let mut held = vec![0usize; users];
                    let mut took = true;
                    while took {
                        took = false;
                        for u in 0..users {
                            while fits(held[u], held.iter().sum::<usize>() - held[u], 1, limit) {
                                held[u] += 1;
                                took = true;
                                if in_turn {
                                    break;
                                }
                            }
                        }
                    }
                    let all: usize = held.iter().sum();
                    assert!(all < limit.max(1), "limit {limit}: {held:?} hold all of it");
                }
            }
        }
    }

    #[test]
    fn the_backlog_is_bounded_where_it_is_fed() {
        let b = Backlog::default();
        let half = MAX_QUEUED / 2;
        assert!(b.try_add(half - 1, 1));
        assert!(!b.try_add(2, 1), "past one user's half");
        assert!(b.try_add(1, 1));
        assert!(!b.try_add(half / 2 + 1, 2), "past half of what the first leaves");
        assert!(b.try_add(half / 2, 2), "a second user's quarter is there");
        assert!(b.try_add(half / 4, 3), "and a third's eighth");
        assert!(!b.try_add(half / 8 + 1, 4), "past a fourth's sixteenth");
        // Only what the device's thread submitted makes room again.
        b.done(half / 2, 1);
        assert!(b.try_add(half / 8 + 1, 4));
    }
}
