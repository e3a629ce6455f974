//! One daemon at a time.  The bdi knobs a daemon paces with, and the journal
//! of the administrator's values beside this lock, are global: a second
//! instance would put back knobs the first is pacing with (its start-up
//! recovery) and attach a second set of programs.  A daemon holds an
//! exclusive flock on /run/writebehindd/lock for its whole life, and
//! `--restore` takes it before touching anything; the kernel drops it when
//! the holder exits, however it exits, so a killed daemon never leaves it
//! held.  (Part of the daemon binary, not the library: only it runs this.)

use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    os::fd::AsRawFd,
    path::Path,
};

use anyhow::{Context, Result};

pub const LOCK: &str = "/run/writebehindd/lock";

/// Why a claim was refused: another process holds the lock.
#[derive(Debug)]
pub struct Running {
    lock: String,
    /// As that process wrote it into the lock file; empty if it had not yet.
    pid: String,
}

impl std::fmt::Display for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self.pid.as_str() {
            "" => write!(f, "writebehindd is already running (it holds {})", self.lock),
            pid => write!(f, "writebehindd is already running as pid {pid} (it holds {})", self.lock),
        }
    }
}

impl std::error::Error for Running {}

/// This process's claim on the knobs and the journal; released on exit.
pub struct Instance {
    _lock: File,
}

impl Instance {
    /// Takes the lock; fails with `Running` if another process holds it.
    pub fn claim(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // Not truncated on open: until we hold the lock, the pid in it is
        // the running instance's.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err).with_context(|| format!("locking {}", path.display()));
            }
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            return Err(Running { lock: path.display().to_string(), pid: pid.trim().to_owned() }.into());
        }
        // For the message above, shown to an instance started by mistake.
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self { _lock: file })
    }
}
