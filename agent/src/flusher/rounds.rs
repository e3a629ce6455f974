//! Fair turns on one device: each round serves every owner with work one
//! batch, so that no owner's flood starves another's.

use std::collections::{HashMap, VecDeque};

use super::Batch;

/// Batches waiting on one device, by owner.  Service goes in rounds: each
/// round gives every owner with work one batch, owners in the order their
/// oldest batch arrived, so a flood of small files cannot starve a big stream
/// on the same device, nor the reverse.
#[derive(Default)]
pub(super) struct Rounds {
    queues: HashMap<u64, VecDeque<Batch>>,
    /// Owners with work, oldest first.
    order: VecDeque<u64>,
}

impl Rounds {
    pub(super) fn push(&mut self, b: Batch) {
        let q = self.queues.entry(b.owner).or_default();
        if q.is_empty() {
            self.order.push_back(b.owner);
        }
        q.push_back(b);
    }

    /// One batch from each owner with work.
    pub(super) fn round(&mut self) -> Vec<Batch> {
        let owners: Vec<u64> = self.order.drain(..).collect();
        let mut out = Vec::with_capacity(owners.len());
        for owner in owners {
            let q = self.queues.get_mut(&owner).expect("ordered owners have queues");
            out.push(q.pop_front().expect("ordered owners have work"));
            if q.is_empty() {
                self.queues.remove(&owner);
            } else {
                self.order.push_back(owner);
            }
        }
        out
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flusher::{Target, job::batch};

    fn inos(v: Vec<Batch>) -> Vec<u64> {
        v.iter()
            .map(|b| match &b.flushes[0].target {
                Target::Closed(f) | Target::Window(f) => f.ino,
                Target::Held(_) => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn every_owner_gets_a_turn_each_round() {
        let mut r = Rounds::default();
        // A flood of small-file batches from owner 1 queued before owner 2's span.
        for i in 0..5 {
            r.push(batch(1, 10 + i));
        }
        r.push(batch(2, 20));
        r.push(batch(2, 21));
        assert_eq!(inos(r.round()), vec![10, 20]);
        r.push(batch(3, 30));
        assert_eq!(inos(r.round()), vec![11, 21, 30]);
        assert_eq!(inos(r.round()), vec![12]);
        assert_eq!(inos(r.round()), vec![13]);
        assert_eq!(inos(r.round()), vec![14]);
        assert!(r.is_empty());
    }
}
