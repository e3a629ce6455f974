//! What each user holds of BPF's stream map.  BPF counts an owner's entries
//! (see current_owner in bpf/owner.bpf.h) at insert and delete, and gives
//! none beyond WB_USER_SHARE, half the map.  An LRU eviction is silent to
//! BPF, so a count errs high: a user whose entries were evicted could be
//! refused with room to spare.  So the counts are taken again from the map
//! itself: soon after a user is refused (at most every RECOUNT_EVERY), and
//! every RECOUNT_IDLE anyway, which also forgets owners that hold nothing
//! (BPF has room for WB_OWNERS_MAX).  At a recount a user at its share loses
//! its entries that crossed no window for IDLE (files its processes leak or
//! leave open and idle, or write slowly), as the shared LRU would have
//! evicted most of them first; an entry let go costs its writer at most one
//! window, as its next write starts over.
//!
//! What remains: a count written back is a snapshot, so entries a user
//! made during the walk (0.35 s) and the walk missed are not in it, until
//! the next recount.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        mpsc::{SyncSender, sync_channel},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};

use crate::abi::{WB_STREAMS_MAX, WB_TOUCH_SHIFT, WB_USER_SHARE, wb_file_stream};

/// BPF's `streams`, by struct file (or address_space) address.
pub type StreamMap = BpfHashMap<MapData, u64, wb_file_stream>;
/// BPF's `user_streams`: entries held, by owner.
pub type CountMap = BpfHashMap<MapData, u32, i64>;

/// At most this often while users are refused.  A recount walks the whole
/// map, two syscalls an entry: 32,770 entries took 0.35 s of the debug
/// build here, under the churn that filled them (hardening's churn test),
/// so it runs on a thread of its own.
const RECOUNT_EVERY: Duration = Duration::from_secs(10);
/// And this often in any case: usually a walk of a few open files.
const RECOUNT_IDLE: Duration = Duration::from_secs(60);
/// An over-share user's entry that crossed no window this long (BPF
/// stamps it then, not at every write) is let go at a recount.
const IDLE: Duration = Duration::from_secs(60);

/// The intake's side: pokes the recount thread, or recounts itself when
/// none could be started (the counts would otherwise err high for good).
pub struct Shares {
    poke: Option<SyncSender<u64>>,
    recounter: Arc<Mutex<Recounter>>,
}

impl Shares {
    pub fn start(streams: StreamMap, counts: CountMap) -> Self {
        let recounter = Arc::new(Mutex::new(Recounter {
            streams,
            counts,
            refused_seen: 0,
            // A refusal may be recounted at once.
            last: Instant::now().checked_sub(RECOUNT_EVERY).unwrap_or_else(Instant::now),
            logged: HashSet::new(),
        }));
        let (poke, wait) = sync_channel(1);
        let r = recounter.clone();
        let spawned = std::thread::Builder::new().name("wb-shares".into()).spawn(move || {
            while let Ok(refused) = wait.recv() {
                r.lock().unwrap().tick(refused, Instant::now());
            }
        });
        let poke = match spawned {
            Ok(_) => Some(poke),
            Err(e) => {
                tracing::warn!(error = %e, "no thread to recount users' shares of the stream map: recounted inline");
                None
            }
        };
        Self { poke, recounter }
    }

    /// Once a second, with BPF's count of refused entries
    /// (WB_STAT_USER_SHARE).
    pub fn tick(&self, refused: u64) {
        match &self.poke {
            Some(p) => {
                let _ = p.try_send(refused);
            }
            None => self.recounter.lock().unwrap().tick(refused, Instant::now()),
        }
    }
}

struct Recounter {
    streams: StreamMap,
    counts: CountMap,
    refused_seen: u64,
    last: Instant,
    logged: HashSet<u32>,
}

/// One entry as the walk saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    pub owner: u32,
    pub touched: u32,
    pub spans: u32,
}

/// What a recount found.
#[derive(Debug, Default, PartialEq)]
pub struct Recount {
    /// Entries held, by owner.
    pub held: HashMap<u32, i64>,
    /// Idle entries of owners at their share, to let go.
    pub idle: Vec<(u64, Seen)>,
}

impl Recounter {
    fn tick(&mut self, refused: u64, now: Instant) {
        let since = now - self.last;
        if !(refused != self.refused_seen && since >= RECOUNT_EVERY || since >= RECOUNT_IDLE) {
            return;
        }
        self.refused_seen = refused;
        self.last = now;
        let started = Instant::now();
        let Some(entries) = self.entries() else {
            tracing::debug!("stream map walk cut short: counts left as they are");
            return;
        };
        let walked = entries.len();
        let mut found = recount(entries, touch_now());
        let mut let_go = 0;
        for (key, seen) in &found.idle {
            if self.still(*key, seen) && self.streams.remove(key).is_ok() {
                *found.held.entry(seen.owner).or_default() -= 1;
                let_go += 1;
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
        tracing::debug!(walked, let_go, took = ?started.elapsed(), "stream map recounted");
    }

    /// Every entry, each key once (an entry deleted under the walk makes
    /// the kernel start it over); None if the walk failed or went on past
    /// twice the map's size: counts from it could be too low.
    fn entries(&self) -> Option<HashMap<u64, Seen>> {
        let mut seen = HashMap::new();
        let limit = 2 * WB_STREAMS_MAX as usize;
        for (n, item) in self.streams.iter().enumerate() {
            if n >= limit {
                return None;
            }
            let (key, s) = item.ok()?;
            seen.insert(key, Seen { owner: s.owner, touched: s.touched, spans: s.spans });
        }
        Some(seen)
    }

    /// Whether the entry at `key` is still the one the walk saw: its
    /// struct file may since have been freed and reused by another writer.
    fn still(&self, key: u64, seen: &Seen) -> bool {
        self.streams.get(&key, 0).is_ok_and(|s| s.owner == seen.owner && s.touched == seen.touched && s.spans == 0)
    }

    /// The counts BPF goes by, replaced; owners holding nothing forgotten.
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
/// their share untouched for IDLE, and not held by the agent (spans: it
/// holds the file, and the writer's close must still reach it).  `now` in
/// wb_file_stream.touched's units.
pub fn recount(entries: HashMap<u64, Seen>, now: u32) -> Recount {
    let mut held: HashMap<u32, i64> = HashMap::new();
    for seen in entries.values() {
        *held.entry(seen.owner).or_default() += 1;
    }
    let idle_units = (IDLE.as_nanos() >> WB_TOUCH_SHIFT) as u32;
    let idle = entries
        .into_iter()
        .filter(|(_, s)| {
            held[&s.owner] >= i64::from(WB_USER_SHARE) && s.spans == 0 && now.wrapping_sub(s.touched) > idle_units
        })
        .collect();
    Recount { held, idle }
}

/// Now in wb_file_stream.touched's units.
fn touch_now() -> u32 {
    (crate::sys::monotonic_ns() >> WB_TOUCH_SHIFT) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(owner: u32, touched: u32, spans: u32) -> Seen {
        Seen { owner, touched, spans }
    }

    #[test]
    fn only_an_over_share_owner_s_idle_unheld_entries_are_let_go() {
        let share = WB_USER_SHARE as u64;
        let idle = (IDLE.as_nanos() >> WB_TOUCH_SHIFT) as u32;
        let now = 10_000;
        let mut entries = HashMap::new();
        // Owner 1000 at its share, a tenth of it idle (one of those held
        // by the agent); owner 0's all idle.
        for k in 0..share {
            let touched = if k % 10 == 0 { now - idle - 1 } else { now };
            entries.insert(k, seen(1000, touched, (k == 0) as u32));
        }
        entries.insert(share, seen(0, now - idle - 1, 0));
        let found = recount(entries, now);
        assert_eq!(found.held[&1000], share as i64);
        assert_eq!(found.held[&0], 1);
        assert_eq!(found.idle.len() as u64, share.div_ceil(10) - 1);
        assert!(found.idle.iter().all(|(k, s)| s.owner == 1000 && *k != 0));
    }

    #[test]
    fn the_clock_wraps_without_letting_a_fresh_entry_go() {
        let mut entries = HashMap::new();
        for k in 0..WB_USER_SHARE as u64 {
            entries.insert(k, seen(7, u32::MAX, 0));
        }
        assert!(recount(entries, 3).idle.is_empty());
    }
}
