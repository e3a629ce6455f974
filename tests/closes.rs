//! The daemon's last close of a writer's file happens on that file's
//! device's own thread: a close that never returns (a FUSE server that
//! withholds FLUSH, a silent NFS server's CLOSE) holds that device's files
//! and no other device's.

use std::{
    os::unix::fs::MetadataExt,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use wb_tests::*;

const POLICY: &str = "window = \"1MiB\"\nburst = \"1MiB\"\n";

/// The daemon's descriptors of files under `dir`.
fn held_under(pid: u32, dir: &Path) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return vec![] };
    fds.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|p| p.starts_with(dir))
        .map(|p| p.display().to_string())
        .collect()
}

/// Whether a thread of `pid` waits for a FUSE server's answer.
fn waits_for_fuse(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.contains("request_wait_answer")))
}

/// tmpfs mounts that hold anonymous device numbers (FUSE's come from the
/// same allocator, lowest free first) until the next one free is congruent
/// to `minor` modulo 4; unmounted when dropped.
struct Spacers(Vec<Scratch>);

impl Spacers {
    fn until_congruent(minor: u32) -> Result<Self> {
        let mut me = Self(Vec::new());
        for i in 0..8 {
            let dir = Scratch::new(&format!("spacer{i}"))?;
            run(Command::new("mount").args(["-t", "tmpfs", "none"]).arg(&dir.0))?;
            if nix_minor(std::fs::metadata(&dir.0)?.dev()) % 4 == minor % 4 {
                // Its number freed: the next mount takes it.
                run(Command::new("umount").arg(&dir.0))?;
                return Ok(me);
            }
            me.0.push(dir);
        }
        bail!("no anonymous device number congruent to {minor} modulo 4 in 8 mounts")
    }
}

impl Drop for Spacers {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = Command::new("umount").arg(&dir.0).status();
        }
    }
}

fn nix_minor(dev: u64) -> u32 {
    ((dev & 0xff) | ((dev >> 12) & 0xffff_ff00)) as u32
}

/// The minor of the mount at `dir`, from mountinfo (a FUSE mount whose
/// server has exited answers no stat).
fn mount_minor(dir: &Path) -> Result<u32> {
    let dev = mountinfo_dev(dir)?;
    let minor = dev.split_once(':').map(|(_, m)| m.parse()).transpose()?;
    minor.ok_or_else(|| anyhow::anyhow!("{dev}: no minor"))
}

/// A FUSE server that never answers the daemon's FLUSH holds the daemon's
/// close of its file for ever.  The closes of a second FUSE mount, whose
/// device number is congruent to the first's modulo 4 (they shared one of
/// four closer threads), must not wait behind it: its file is closed once
/// its stream ends, and the daemon holds no descriptor of it.
#[test]
fn a_close_that_never_returns_holds_no_other_devices_files() -> Result<()> {
    require_root();
    let daemon = Daemon::start_with_policy(POLICY)?;
    let mut stuck = RootFuse::spawn(FUSE_NOFLUSH, &["32"])?;
    await_line(&mut stuck.server, "done")?;
    let minor = mount_minor(stuck.dir())?;
    wait_until("the daemon's close waiting for the FUSE server", Duration::from_secs(10), || {
        Ok(waits_for_fuse(daemon.pid()))
    })?;

    let spacers = Spacers::until_congruent(minor)?;
    let mut other = RootFuse::spawn(FUSE_SLOW, &["100", "32"])?;
    await_line(&mut other.server, "done")?;
    let other_minor = mount_minor(other.dir())?;
    drop(spacers);
    anyhow::ensure!(other_minor % 4 == minor % 4, "devices 0:{minor} and 0:{other_minor}: the test shows nothing");

    let t0 = Instant::now();
    let mut held = held_under(daemon.pid(), other.dir());
    while !held.is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        held = held_under(daemon.pid(), other.dir());
    }
    // The server's death fails the FLUSH still waiting, so that the daemon
    // can stop.
    drop(stuck);
    drop(other);
    let log = daemon.stop()?;
    println!("devices 0:{minor} (its close stuck) and 0:{other_minor}: still held after 5 s: {held:?}");
    let streams = log.matches("stream ended").count();
    assert!(streams >= 2, "both writers should have streamed ({streams}):\n{log}");
    assert!(held.is_empty(), "the second device's file is held behind the first's close: {held:?}\n{log}");
    Ok(())
}
