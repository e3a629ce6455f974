//! What each user holds of BPF's stream map (#25, class 5).  BPF counts an
//! owner's entries (its uid, or the uid that made its user namespace) at
//! insert and delete, and gives none beyond WB_USER_SHARE, half the map.
//! An LRU eviction is silent to BPF, so a count only ever errs high: a user
//! whose entries were evicted could be refused with room to spare.  So
//! once a user is refused, the counts are taken again from the map itself,
//! at most every RECOUNT_EVERY; and that user's entries written to longer
//! than IDLE ago (files its process leaks or leaves open and idle) are let
//! go, as the shared LRU would have evicted them first.  An entry let go
//! costs its writer at most one window: the next write starts over.

use std::{
    collections::{HashMap, HashSet},
    sync::mpsc::{SyncSender, sync_channel},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};

use crate::abi::{WB_STREAMS_MAX, WB_USER_SHARE, wb_file_stream};

/// BPF's `streams`, by struct file (or address_space) address.
pub type StreamMap = BpfHashMap<MapData, u64, wb_file_stream>;
/// BPF's `user_streams`: entries held, by owner.
pub type CountMap = BpfHashMap<MapData, u32, i64>;

/// At most this often, and only while users are refused.  A recount
/// walks the whole map, two syscalls an entry: 32,770 entries took
/// 0.35 s of the debug build here, under the churn that filled them
/// (hardening's churn test), so it runs on a thread of its own.
const RECOUNT_EVERY: Duration = Duration::from_secs(10);
/// An over-share user's entry untouched this long is let go at a recount.
const IDLE: Duration = Duration::from_secs(60);
/// file_stream.touched counts 2^30 ns.
const TOUCH_SHIFT: u32 = 30;

/// The intake's side: pokes the recount thread.
pub struct Shares {
    poke: Option<SyncSender<u64>>,
}

impl Shares {
    /// Starts the recount thread.  Without it (no thread could start) the
    /// counts are BPF's alone: they may err high for a user LRU eviction
    /// took entries from, until that user's files are closed.
    pub fn start(streams: StreamMap, counts: CountMap) -> Self {
        let (poke, wait) = sync_channel(1);
        let mut r = Recounter { streams, counts, refused_seen: 0, last: None, logged: HashSet::new() };
        let spawned = std::thread::Builder::new().name("wb-shares".into()).spawn(move || {
            while let Ok(refused) = wait.recv() {
                r.tick(refused, Instant::now());
            }
        });
        match spawned {
            Ok(_) => Self { poke: Some(poke) },
            Err(e) => {
                tracing::warn!(error = %e, "no thread to recount users' shares of the stream map");
                Self { poke: None }
            }
        }
    }

    /// Once a second, with BPF's count of refused entries
    /// (WB_STAT_USER_SHARE); never waits for a recount.
    pub fn tick(&self, refused: u64) {
        if let Some(p) = &self.poke {
            let _ = p.try_send(refused);
        }
    }
}

struct Recounter {
    streams: StreamMap,
    counts: CountMap,
    refused_seen: u64,
    last: Option<Instant>,
    logged: HashSet<u32>,
}

/// What a recount found.
#[derive(Debug, Default, PartialEq)]
pub struct Recount {
    /// Entries held, by owner.
    pub held: HashMap<u32, i64>,
    /// Keys of idle entries of owners at their share, to let go.
    pub idle: Vec<(u64, u32)>,
}

impl Recounter {
    fn tick(&mut self, refused: u64, now: Instant) {
        if refused == self.refused_seen || self.last.is_some_and(|t| now - t < RECOUNT_EVERY) {
            return;
        }
        self.refused_seen = refused;
        self.last = Some(now);
        let started = Instant::now();
        let entries = self.entries();
        let walked = entries.len();
        let mut found = recount(entries, touch_now());
        for (key, owner) in &found.idle {
            if self.streams.remove(key).is_ok() {
                *found.held.entry(*owner).or_default() -= 1;
            }
        }
        self.write(&found.held);
        for (&owner, &n) in &found.held {
            if n >= i64::from(WB_USER_SHARE) && self.logged.insert(owner) {
                tracing::warn!(
                    owner,
                    entries = n,
                    share = WB_USER_SHARE,
                    "a user holds its share of BPF's stream map: its new files are left to the kernel"
                );
            }
        }
        tracing::debug!(walked, let_go = found.idle.len(), took = ?started.elapsed(), "stream map recounted");
    }

    /// Every entry's key, owner and last write, each key once (an entry
    /// deleted under the walk makes the kernel start it over).
    fn entries(&self) -> HashMap<u64, (u32, u32)> {
        let mut seen = HashMap::new();
        for (key, s) in self.streams.iter().take(2 * WB_STREAMS_MAX as usize).flatten() {
            seen.insert(key, (s.owner, s.touched));
        }
        seen
    }

    /// The counts BPF goes by, replaced (a write racing BPF's own count
    /// is off by what changed meanwhile, until the next recount).
    fn write(&mut self, held: &HashMap<u32, i64>) {
        let stale: Vec<u32> = self.counts.keys().flatten().filter(|o| !held.contains_key(o)).collect();
        for owner in stale {
            let _ = self.counts.remove(&owner);
        }
        for (owner, n) in held {
            let _ = self.counts.insert(owner, n, 0);
        }
    }
}

/// The counts by owner, and the entries to let go: those of owners at
/// their share untouched for IDLE.  `now` in wb_file_stream.touched's units.
pub fn recount(entries: HashMap<u64, (u32, u32)>, now: u32) -> Recount {
    let mut held: HashMap<u32, i64> = HashMap::new();
    for (owner, _) in entries.values() {
        *held.entry(*owner).or_default() += 1;
    }
    let idle_units = (IDLE.as_nanos() >> TOUCH_SHIFT) as u32;
    let idle = entries
        .iter()
        .filter(|(_, (owner, touched))| {
            held[owner] >= i64::from(WB_USER_SHARE) && now.wrapping_sub(*touched) > idle_units
        })
        .map(|(key, (owner, _))| (*key, *owner))
        .collect();
    Recount { held, idle }
}

/// Now in wb_file_stream.touched's units.
fn touch_now() -> u32 {
    (crate::sys::monotonic_ns() >> TOUCH_SHIFT) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_over_share_owner_s_idle_entries_are_let_go() {
        let share = WB_USER_SHARE as u64;
        let idle = (IDLE.as_nanos() >> TOUCH_SHIFT) as u32;
        let now = 10_000;
        let mut entries = HashMap::new();
        // Owner 1000 at its share, a tenth of it idle; owner 0's all idle.
        for k in 0..share {
            let touched = if k % 10 == 0 { now - idle - 1 } else { now };
            entries.insert(k, (1000, touched));
        }
        entries.insert(share, (0, now - idle - 1));
        let found = recount(entries, now);
        assert_eq!(found.held[&1000], share as i64);
        assert_eq!(found.held[&0], 1);
        assert_eq!(found.idle.len() as u64, share.div_ceil(10));
        assert!(found.idle.iter().all(|(_, owner)| *owner == 1000));
    }

    #[test]
    fn the_clock_wraps_without_letting_a_fresh_entry_go() {
        let mut entries = HashMap::new();
        for k in 0..WB_USER_SHARE as u64 {
            entries.insert(k, (7, u32::MAX));
        }
        assert!(recount(entries, 3).idle.is_empty());
    }
}
