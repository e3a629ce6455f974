//! Files whose close may wait for a server, closed away from the intake
//! thread.
//!
//! NFS 4's last close of a file sends the server a CLOSE (an OPEN_DOWNGRADE
//! while its writer keeps it open) and waits for the answer; FUSE's every
//! close writes the inode's dirty pages, then sends a FLUSH and waits for
//! the reply, which a user's own server may never send.  A stream's file
//! is opened on its device's thread, but the stream ends on the intake
//! thread, which also drains events, serves the socket and pings the
//! watchdog (10 s): such a file that thread would close goes to a closer
//! thread instead.  Measured: a stop while an NFS server was silent
//! waited in that CLOSE until systemd's SIGKILL (22.5 s); with the closer,
//! 4.5 s.

use std::{
    os::fd::OwnedFd,
    sync::{Arc, Mutex, mpsc},
};

/// Closer threads at most.  A device's files go to the one its device
/// number picks: a server that never answers holds the closes of the
/// devices that share its thread, not all of them, and a user's many FUSE
/// mounts start no more threads than this (the unit's TasksMax).
const CLOSERS: usize = 4;

static SLOTS: Mutex<[Option<mpsc::Sender<Arc<OwnedFd>>>; CLOSERS]> = Mutex::new([const { None }; CLOSERS]);

/// Drops `fd`, a file of device `dev`, on a closer thread, started at its
/// first file (inline if it cannot be; tried again at the next).
pub fn close_elsewhere(dev: u64, fd: Arc<OwnedFd>) {
    let i = (dev % CLOSERS as u64) as usize;
    let mut slots = SLOTS.lock().unwrap();
    if slots[i].is_none() {
        let (tx, rx) = mpsc::channel::<Arc<OwnedFd>>();
        match std::thread::Builder::new().name(format!("wb-close-{i}")).spawn(move || rx.into_iter().for_each(drop)) {
            Ok(_) => slots[i] = Some(tx),
            Err(e) => tracing::warn!(error = %e, "no thread to close a file on: closed where its stream ends"),
        }
    }
    let unsent = match &slots[i] {
        Some(tx) => tx.send(fd).err().map(|e| e.0),
        None => Some(fd),
    };
    drop(slots);
    drop(unsent);
}
