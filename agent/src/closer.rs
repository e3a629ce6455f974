//! Network filesystems' files, closed away from the intake thread.
//!
//! The last close of a file opened on NFS 4 sends the server a CLOSE (an
//! OPEN_DOWNGRADE while its writer keeps it open) and waits for the answer,
//! so a server that does not answer holds whoever closes.  A stream's file
//! is opened on its device's thread, but the stream ends on the intake
//! thread, which also drains events, serves the socket and pings the
//! watchdog: a network file that thread would close goes to this one.

use std::{
    os::fd::OwnedFd,
    sync::{Arc, OnceLock, mpsc},
};

static CLOSER: OnceLock<Option<mpsc::Sender<Arc<OwnedFd>>>> = OnceLock::new();

/// Drops `fd` on the closer thread, started at the first call (inline if
/// it cannot be).
pub fn close_elsewhere(fd: Arc<OwnedFd>) {
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Arc<OwnedFd>>();
        match std::thread::Builder::new().name("wb-close".into()).spawn(move || rx.into_iter().for_each(drop)) {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "no thread to close network files on: closed where their streams end");
                None
            }
        }
    });
    match closer {
        Some(tx) => {
            let _ = tx.send(fd);
        }
        None => drop(fd),
    }
}
