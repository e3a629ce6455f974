//! A device's flusher thread: the flushes it is given, the threads (one per
//! backing device), the fair rounds it serves owners in, and the submitter
//! that starts writeback and waits for it.
//!
//! N threads submitting writeback to one disk seek it all over the place; one
//! submitter keeps locality.  Every flush for a device goes through its
//! thread, in fair rounds.  sync_file_range may block on a congested queue,
//! which is why it runs here and not on the async runtime.
//!
//! Rooms: `job` (what a flush is: a stream's file, a target, a batch),
//! `pool` (the threads, one per device, started and retired), `rounds`
//! (every owner's turn on a device), `submitter` (a device's thread:
//! writeback started in chunks, and waited for).

mod job;
mod pool;
mod rounds;
mod submitter;

pub use job::{Batch, Flush, StreamFile, Target};
pub use pool::Flushers;
