//! Test support: real loop devices, real filesystems, the real daemon.
//! Every guard here undoes what it did when dropped, also when a test fails.

pub mod cgroup;
pub mod daemon;
pub mod device;
pub mod fuse;
pub mod knob;
pub mod process;
pub mod sampler;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use cgroup::{Cgroup, V1Limit};
pub use daemon::{Daemon, log_field, stopped_counter, wait_child};
pub use device::{BindMount, LoopDevice, Mounted, mountinfo_dev};
pub use fuse::{FUSE_HANG, FUSE_IMAGE, FUSE_MANY, FUSE_NOFLUSH, FUSE_SLOW, PYTHON, RootFuse, await_line};
pub use knob::{BdiKnobs, Knob, VmLimits};
pub use process::{Background, cpu_secs, fio_write_fsync};
pub use sampler::{Peak, Sample, Sampler};

pub const MIB: u64 = 1 << 20;

/// These tests load BPF and make loop devices: without root they cannot run
/// at all, and saying so beats a confusing failure further in.
/// Also restores settings a killed earlier run left changed.
pub fn require_root() {
    assert!(unsafe { libc::geteuid() } == 0, "these tests must run as root (cargo xtask test)");
    Knob::recover().expect("restoring settings left by an interrupted run");
}

/// Test sizes are divided by WB_TEST_SCALE (default 1): `cargo xtask vmtest`
/// runs the tests under CPU emulation, about ten times slower.
pub fn scale() -> u64 {
    std::env::var("WB_TEST_SCALE").ok().and_then(|s| s.parse().ok()).filter(|&n| n >= 1).unwrap_or(1)
}

/// Polls `cond` every 100 ms until it holds; an error naming `what` if it
/// does not within `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + within;
    while !cond()? {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `n` divided by the scale.
pub fn scaled(n: u64) -> u64 {
    (n / scale()).max(1)
}

/// `program` as nobody (uid and gid 65534, no supplementary groups), the
/// unprivileged user of the tests.  setpriv execs it: the child's pid is
/// the program's.
pub fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(program);
    c
}

/// Runs a command, failing with its stderr when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn sh(script: &str) -> Result<String> {
    run(Command::new("sh").args(["-c", script]))
}

/// Where cargo put this workspace's binaries (target/<profile>/).
pub fn bin_dir() -> PathBuf {
    // Test binaries live in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

/// A scratch directory on a disk-backed filesystem (not tmpfs: loop backing
/// files must not live in memory), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Result<Self> {
        Self::new_in(&std::env::var("WB_TEST_SCRATCH").unwrap_or_else(|_| "/var/tmp".into()), tag)
    }

    /// In a chosen place, e.g. /dev/shm for sources that must not touch a disk.
    pub fn new_in(base: &str, tag: &str) -> Result<Self> {
        // Unique per call: a test may hold several (loop devices' backing files).
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from(base).join(format!("wb-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file in tmpfs with reproducible pseudo-random content, for writers to
/// copy from and for checksums to compare against.
pub fn random_file(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in block.chunks_mut(8) {
            // xorshift64*: fast, and incompressible enough for a filesystem.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// A directory of `files` incompressible files of `min..=max` bytes, spread
/// over subdirectories of 200, reproducible from `seed`.  Returns the total.
pub fn random_tree(dir: &Path, files: u32, min: u64, max: u64, seed: u64) -> Result<u64> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut total = 0;
    for i in 0..files {
        let sub = dir.join(format!("d{:03}", i / 200));
        std::fs::create_dir_all(&sub)?;
        let bytes = min + next() % (max - min + 1);
        random_file(&sub.join(format!("f{i:05}")), bytes, next())?;
        total += bytes;
    }
    Ok(total)
}

/// True when two trees have the same files with the same bytes (diff -r).
pub fn same_tree(a: &Path, b: &Path) -> Result<bool> {
    let st = Command::new("diff").arg("-rq").arg(a).arg(b).stdout(Stdio::null()).status()?;
    Ok(st.success())
}

/// True when two files have the same bytes (cmp -s).
pub fn same_content(a: &Path, b: &Path) -> Result<bool> {
    let st = Command::new("cmp").arg("-s").arg(a).arg(b).status()?;
    Ok(st.success())
}

/// A directory made once by `make` and kept under target/wb-cache/`key`, so
/// that tests (and runs) needing the same generated data share it: the key
/// must name everything `make` depends on.  Made in a temporary directory
/// and renamed into place, so a half-made one is never used; synced, so its
/// writeback does not run under a later measurement.  Where target/ cannot
/// be written (vmtest's guest sees the host read-only), it is made in
/// /dev/shm for this caller alone and removed with the returned guard.
pub fn cached_dir(key: &str, make: impl FnOnce(&Path) -> Result<()>) -> Result<(PathBuf, Option<Scratch>)> {
    let cache = bin_dir().parent().context("target/")?.join("wb-cache");
    let dir = cache.join(key);
    if dir.is_dir() {
        return Ok((dir, None));
    }
    let tmp = cache.join(format!(".{key}.{}", std::process::id()));
    if std::fs::create_dir_all(&tmp).is_err() {
        let shm = Scratch::new_in("/dev/shm", key)?;
        make(&shm.0)?;
        return Ok((shm.0.clone(), Some(shm)));
    }
    if let Err(e) = make(&tmp).and_then(|()| sh("sync").map(drop)) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process made it meanwhile: use that one.
        if !dir.is_dir() {
            return Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()));
        }
    }
    Ok((dir, None))
}
