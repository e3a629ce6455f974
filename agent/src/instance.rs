//! One daemon at a time.  The bdi knobs a daemon paces with, and the journal
//! of the administrator's values beside this lock, are global: a second
//! instance would put back knobs the first is pacing with (its start-up
//! recovery) and attach a second set of programs.  A daemon holds an
//! exclusive flock on /run/writebehindd/lock for its whole life, and
//! `--restore` takes it before touching anything.
//!
//! The kernel drops the lock when the holder's file table goes, which is when
//! its last thread exits.  A killed daemon whose flusher thread sits in D
//! state (`sync_file_range` on a stalled device: a FUSE-backed loop device
//! that stopped answering, a dying stick) cannot finish exiting, and held the
//! lock for as long as the device stayed stalled: `--restore` and every
//! restart were refused, and the device kept `strict_limit`.  Such a holder
//! runs no more user code, so a claim takes over from it: a fresh lock file,
//! locked, is renamed over the old one.  Every claim checks and writes under
//! a second lock (`lock.swap`, held for microseconds), so a takeover and a
//! claim that finds the holder just gone cannot both win.  (Part of the
//! daemon binary, not the library: only it runs this.)

use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::Path,
};

use anyhow::{Context, Result};

use writebehindd::sys::private_file;

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
    /// Takes the lock, or over from a killed holder that cannot exit; fails
    /// with `Running` if a live process holds it.
    pub fn claim(path: &Path) -> Result<Self> {
        // Each retry follows a takeover by another claim; a few suffice.
        for _ in 0..4 {
            // Not truncated on open: until we hold the lock, the pid in it
            // is the running instance's.
            let mut file = private_file(path, OpenOptions::new().read(true).write(true).create(true).truncate(false))
                .with_context(|| format!("opening {}", path.display()))?;
            let _swap = lock_swap(path)?;
            if lock(&file).with_context(|| format!("locking {}", path.display()))? {
                if !names(path, &file)? {
                    continue; // replaced by a takeover since we opened it
                }
                // For the message below, shown to an instance started by mistake.
                file.set_len(0)?;
                writeln!(file, "{}", std::process::id())?;
                return Ok(Self { _lock: file });
            }
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim().to_owned();
            match pid.parse::<i32>().ok().filter(|&p| dying(p)) {
                Some(p) => match take_over(path, &file)? {
                    Some(me) => {
                        eprintln!(
                            "writebehindd: pid {p} was killed but cannot exit (a thread of it waits in the \
                             kernel, on a stalled device); taking {} over from it",
                            path.display()
                        );
                        return Ok(me);
                    }
                    None => continue,
                },
                None => return Err(Running { lock: path.display().to_string(), pid }.into()),
            }
        }
        Err(Running { lock: path.display().to_string(), pid: String::new() }.into())
    }
}

/// An exclusive flock without waiting: true if taken, false if held.
fn lock(file: &File) -> std::io::Result<bool> {
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(err),
    }
}

/// Whether `path` still names the open `file`.
fn names(path: &Path, file: &File) -> Result<bool> {
    let (a, b) = (fs::metadata(path), file.metadata()?);
    Ok(a.is_ok_and(|a| (a.dev(), a.ino()) == (b.dev(), b.ino())))
}

/// The lock every claim holds while it checks and writes: waited for up to
/// two seconds (a claimant stopped while holding it must not hang the rest).
fn lock_swap(path: &Path) -> Result<File> {
    let swap_path = path.with_extension("swap");
    let swap = private_file(&swap_path, OpenOptions::new().write(true).create(true).truncate(false))
        .with_context(|| format!("opening {}", swap_path.display()))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !lock(&swap).with_context(|| format!("locking {}", swap_path.display()))? {
        anyhow::ensure!(std::time::Instant::now() < deadline, "{} stays locked by another claim", swap_path.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(swap)
}

/// A new lock file, locked and with our pid, renamed over `path`, which
/// names `held`, the dying holder's.  None if another claim took over first.
/// Called with the swap lock held.
fn take_over(path: &Path, held: &File) -> Result<Option<Instance>> {
    if !names(path, held)? {
        return Ok(None);
    }
    let fresh = path.with_extension("new");
    let _ = fs::remove_file(&fresh);
    let mut file = private_file(&fresh, OpenOptions::new().read(true).write(true).create_new(true))
        .with_context(|| format!("creating {}", fresh.display()))?;
    anyhow::ensure!(lock(&file)?, "{} is locked by another process", fresh.display());
    writeln!(file, "{}", std::process::id())?;
    fs::rename(&fresh, path).with_context(|| format!("renaming {} over {}", fresh.display(), path.display()))?;
    Ok(Some(Instance { _lock: file }))
}

/// Killed, but not gone: its main thread has exited (a zombie leader while
/// other threads remain) or one of its threads has SIGKILL pending (set on
/// every thread of a killed process until it acts on it, which a thread in
/// D state cannot).  Such a process runs no more user code.
fn dying(pid: i32) -> bool {
    let zombie = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false);
    zombie || sigkill_pending(pid)
}

fn sigkill_pending(pid: i32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|t| {
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        status
            .lines()
            .filter_map(|l| l.strip_prefix("SigPnd:").or_else(|| l.strip_prefix("ShdPnd:")))
            .any(|mask| u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & (1 << (libc::SIGKILL - 1)) != 0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_holder_is_not_dying_and_a_gone_one_is_not_either() {
        assert!(!dying(std::process::id() as i32));
        assert!(!dying(i32::MAX));
    }

    #[test]
    fn a_second_claim_is_refused_naming_the_holder() {
        let dir = std::env::temp_dir().join(format!("wb-instance-{}", std::process::id()));
        let path = dir.join("lock");
        let first = Instance::claim(&path).unwrap();
        let err = Instance::claim(&path).err().unwrap();
        assert!(err.is::<Running>(), "{err:#}");
        assert!(err.to_string().contains(&std::process::id().to_string()), "{err}");
        drop(first);
        Instance::claim(&path).unwrap();
        let _ = fs::remove_dir_all(&dir);
    }
}
