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

use anyhow::{Context, Result, bail};

pub const LOCK: &str = "/run/writebehindd/lock";

/// This process's claim on the knobs and the journal; released on exit.
pub struct Instance {
    _lock: File,
}

impl Instance {
    /// Takes the lock, or fails naming the process that holds it.
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
            let who = match pid.trim() {
                "" => String::new(),
                pid => format!(" as pid {pid}"),
            };
            bail!("writebehindd is already running{who} (it holds {})", path.display());
        }
        // For the message above, shown to an instance started by mistake.
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self { _lock: file })
    }
}
