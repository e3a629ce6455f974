//! Cgroups made under the v2 hierarchy for one test and removed after it.
//!
//! On this hybrid host (v1 controllers) the v2 hierarchy is mounted at
//! /sys/fs/cgroup/unified with no controller enabled: mkdir, cgroup.procs
//! and chown (delegation) work there as on a unified host.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// A cgroup directory; removed on drop with every cgroup below it, if the
/// test made it (an existing one such as /system.slice stays).
pub struct Cgroup {
    pub dir: PathBuf,
    /// Its path as policies name it ("/system.slice/x.service").
    pub path: String,
    made: bool,
}

impl Cgroup {
    /// "/wb-test-<pid>-<tag>", a fresh cgroup below the v2 root.
    pub fn new(tag: &str) -> Result<Self> {
        let path = format!("/wb-test-{}-{tag}", std::process::id());
        let cg = Self::at(&path)?;
        if !cg.made {
            bail!("cgroup {path} existed already");
        }
        Ok(cg)
    }

    /// The cgroup at `path` ("/system.slice"), made if it does not exist.
    /// Its parent must exist (hold a guard for it first).
    pub fn at(path: &str) -> Result<Self> {
        let dir = v2_root()?.join(path.trim_start_matches('/'));
        let made = match std::fs::create_dir(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e).with_context(|| format!("creating cgroup {}", dir.display())),
        };
        Ok(Self { dir, path: path.to_owned(), made })
    }

    /// The child cgroup `name`, made if it does not exist.
    pub fn child(&self, name: &str) -> Result<Self> {
        Self::at(&format!("{}/{name}", self.path.trim_end_matches('/')))
    }

    /// Hands the cgroup to `uid` as systemd's `Delegate=yes` does: the
    /// directory and the files a delegate writes (it may then create
    /// cgroups below and move its processes between them).
    pub fn delegate_to(&self, uid: u32) -> Result<()> {
        for f in [".", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"] {
            let p = self.dir.join(f);
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
            if unsafe { libc::chown(c.as_ptr(), uid, uid) } != 0 {
                return Err(std::io::Error::last_os_error()).with_context(|| format!("chown {}", p.display()));
            }
        }
        Ok(())
    }

    /// dd of `mib` MiB into `out`, run inside this cgroup; returns its pid.
    pub fn dd(&self, out: &Path, mib: u32) -> Result<u32> {
        let procs = self.dir.join("cgroup.procs");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec dd if=/dev/zero of={} bs=1M count={mib} status=none",
                procs.display(),
                out.display()
            ))
            .stdin(Stdio::null())
            .spawn()?;
        let pid = child.id();
        if !child.wait()?.success() {
            bail!("dd in {} failed", self.path);
        }
        Ok(pid)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if self.made {
            remove_tree(&self.dir);
        }
    }
}

/// Removes a cgroup and every cgroup below it, deepest first.  Their
/// processes have exited; the kernel may take a moment to agree.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where the cgroup v2 hierarchy is mounted.
pub fn v2_root() -> Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    text.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2").then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .context("no cgroup v2 hierarchy mounted")
}

/// A process held in a cgroup of a v1 controller ("pids", "cpu") with one
/// limit set (pids.max, cpu.cfs_quota_us); moved back to the controller's
/// root and the cgroup removed when dropped.
pub struct V1Limit(PathBuf);

impl V1Limit {
    pub fn new(controller: &str, pid: u32, file: &str, value: &str) -> Result<Self> {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/{controller}/wb-test-{}-{controller}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let limit = Self(dir);
        std::fs::write(limit.0.join("cgroup.procs"), pid.to_string())?;
        std::fs::write(limit.0.join(file), value).with_context(|| format!("setting {file} to {value}"))?;
        Ok(limit)
    }
}

impl Drop for V1Limit {
    fn drop(&mut self) {
        let root = self.0.parent().expect("below a controller's root").join("cgroup.procs");
        for pid in std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default().lines() {
            let _ = std::fs::write(&root, pid);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}
