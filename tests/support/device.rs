//! Loop devices and filesystems made for one test and removed after it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{Scratch, run};

/// A loop device over a fully written backing file, with direct I/O so its
/// writes reach the disk instead of a second page cache.
pub struct LoopDevice {
    pub dev: PathBuf,
    _scratch: Scratch,
}

impl LoopDevice {
    pub fn new(size_mib: u64) -> Result<Self> {
        let scratch = Scratch::new("loop")?;
        let backing = scratch.0.join("backing.img");
        // Fully written (not sparse): writes then cost what a disk's would.
        run(Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", backing.display()))
            .args(["bs=1M", &format!("count={size_mib}"), "status=none"]))?;
        let out = run(Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&backing))?;
        Ok(Self { dev: PathBuf::from(out.trim()), _scratch: scratch })
    }

    /// "major:minor", the name of its bdi in /sys/class/bdi and debugfs.
    pub fn bdi(&self) -> Result<String> {
        let name = self.dev.file_name().unwrap().to_string_lossy().into_owned();
        let s = std::fs::read_to_string(format!("/sys/block/{name}/dev"))?;
        Ok(s.trim().to_owned())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A filesystem made on a device and mounted on a fresh directory.
pub struct Mounted {
    pub dir: PathBuf,
    pub fstype: String,
    // Dropped after the unmount in Drop.
    pub device: LoopDevice,
}

impl Mounted {
    pub fn new(device: LoopDevice, fstype: &str) -> Result<Self> {
        let mkfs_force = match fstype {
            "ext4" => vec!["-q", "-F"],
            "xfs" | "btrfs" => vec!["-q", "-f"],
            other => anyhow::bail!("no mkfs recipe for {other}"),
        };
        run(Command::new(format!("mkfs.{fstype}")).args(&mkfs_force).arg(&device.dev))
            .with_context(|| format!("mkfs.{fstype} (install e2fsprogs/xfsprogs/btrfs-progs)"))?;
        let dir = PathBuf::from(format!(
            "/mnt/wb-{}-{}",
            device.dev.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        run(Command::new("mount").arg(&device.dev).arg(&dir))?;
        Ok(Self { dir, fstype: fstype.to_owned(), device })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Unmount and mount again: the next reads come from the device, not the cache.
    pub fn remount(&self) -> Result<()> {
        run(Command::new("umount").arg(&self.dir))?;
        run(Command::new("mount").arg(&self.device.dev).arg(&self.dir))?;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if Command::new("umount").arg(&self.dir).status().map(|s| !s.success()).unwrap_or(true) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// debugfs, mounted for a test if it was not; unmounted again after.
pub struct Debugfs {
    mounted: bool,
}

pub const DEBUGFS: &str = "/sys/kernel/debug";

impl Debugfs {
    pub fn ensure() -> Result<Self> {
        if Path::new(DEBUGFS).join("bdi").exists() {
            return Ok(Self { mounted: false });
        }
        run(Command::new("mount").args(["-t", "debugfs", "debugfs", DEBUGFS]))?;
        Ok(Self { mounted: true })
    }
}

impl Drop for Debugfs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(DEBUGFS).status();
        }
    }
}
