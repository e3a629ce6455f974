//! FUSE servers for the tests: the scripts in tests/attacks/ (each after
//! fuse.py, the protocol they share), and a root-run mount of one of them.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use anyhow::{Context, Result};

pub const PYTHON: &str = "/usr/bin/python3";
/// A file that can be looked up but whose open never returns.
pub const FUSE_HANG: &str = concat!(include_str!("../attacks/fuse.py"), include_str!("../attacks/fuse_hang.py"));
/// Takes writes at a chosen rate, and may stop answering them.
pub const FUSE_SLOW: &str = concat!(include_str!("../attacks/fuse.py"), include_str!("../attacks/fuse_slow.py"));
/// A disk image in memory, "img", whose LOOKUPs go unanswered after SIGUSR1.
pub const FUSE_IMAGE: &str = concat!(include_str!("../attacks/fuse.py"), include_str!("../attacks/fuse_image.py"));
/// Many mounts in a namespace of the user's own, each written a little.
pub const FUSE_MANY: &str = concat!(include_str!("../attacks/fuse.py"), include_str!("../attacks/fuse_many.py"));
/// Answers FLUSH only from its own writer.
pub const FUSE_NOFLUSH: &str = concat!(include_str!("../attacks/fuse.py"), include_str!("../attacks/fuse_noflush.py"));

/// Waits for a child's first line of output to be `want`.
pub fn await_line(child: &mut Child, want: &str) -> Result<()> {
    let out = child.stdout.as_mut().context("stdout not piped")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    anyhow::ensure!(line.trim() == want, "expected {want:?}, got {line:?}");
    Ok(())
}

/// A FUSE server root runs (as it would a system sshfs), mounted at a
/// directory of its own, its file "f".  Dropping it kills the server, which
/// fails every request still waiting, and unmounts.
pub struct RootFuse {
    pub server: Child,
    dir: PathBuf,
}

impl RootFuse {
    /// `script` (after fuse.py) with the mount point and `args`.
    pub fn spawn(script: &str, args: &[&str]) -> Result<Self> {
        // Several at once in one test: each its own directory.
        static MOUNTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from(format!("/mnt/wb-fuse-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let server = Command::new(PYTHON)
            .arg("-c")
            .arg(script)
            .arg(&dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        Ok(Self { server, dir })
    }

    /// One whose file can be looked up but whose open never returns.
    pub fn hanging() -> Result<Self> {
        let mut me = Self::spawn(FUSE_HANG, &[])?;
        await_line(&mut me.server, "ready")?;
        Ok(me)
    }

    /// Its file named `name`.
    pub fn named(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn file(&self) -> PathBuf {
        self.dir.join("f")
    }

    /// Its mount point.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for RootFuse {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
