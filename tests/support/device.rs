//! Loop devices and filesystems made for one test and removed after it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{Knob, Scratch, run};

const BLKIO_WRITE_BPS: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";

fn attach(backing: &Path) -> Result<PathBuf> {
    attach_scanned(backing, false)
}

/// With `partitions`, the device may have partitions (loopNp1...): from
/// its table where the kernel parses one, or added by BLKPG.
fn attach_scanned(backing: &Path, partitions: bool) -> Result<PathBuf> {
    let mut cmd = Command::new("losetup");
    cmd.args(["--find", "--show", "--direct-io=on"]);
    if partitions {
        cmd.arg("--partscan");
    }
    let out = run(cmd.arg(backing))?;
    let dev = PathBuf::from(out.trim());
    kernel_defaults(&dev, "at its attach");
    Ok(dev)
}

/// The per-device dirty knobs a bdi has from the kernel: what a new disk
/// starts with.  A loop number's bdi outlives its detach, knobs included,
/// like its bandwidth estimate: a CI run found loop0's strict_limit=1 and
/// max_ratio_fine=1274 (a paced writer's ceiling) at the attach that began
/// a pacing test, which then took them for the administrator's.
const KERNEL_DEFAULTS: [(&str, &str); 3] =
    [("strict_limit", "0"), ("min_ratio_fine", "0"), ("max_ratio_fine", "1000000")];

/// Puts the knobs of `dev`'s bdi back to the kernel's defaults where they
/// are not, saying so (`when`: at its attach, at its detach): a test then
/// starts from a new disk's knobs, and one left paced is named in the log
/// of the test that left it.  Knobs this kernel lacks (before 6.2) are
/// skipped.
fn kernel_defaults(dev: &Path, when: &str) {
    let Some(name) = dev.file_name().map(|n| n.to_string_lossy().into_owned()) else { return };
    let Ok(bdi) = std::fs::read_to_string(format!("/sys/block/{name}/dev")) else { return };
    let dir = format!("/sys/class/bdi/{}", bdi.trim());
    for (knob, default) in KERNEL_DEFAULTS {
        let path = format!("{dir}/{knob}");
        let Ok(value) = std::fs::read_to_string(&path) else { continue };
        if value.trim() != default {
            eprintln!("tests: {name}'s bdi {} had {knob}={} {when}: set back to {default}", bdi.trim(), value.trim());
            let _ = std::fs::write(&path, default);
        }
    }
}

/// A loop device over a fully written backing file, with direct I/O so its
/// writes reach the disk instead of a second page cache.  A throttled one
/// is stacked on a lower loop device whose writes the root blkio cgroup caps.
pub struct LoopDevice {
    pub dev: PathBuf,
    // Dropped in this order after `dev` is detached: rule, lower device, file.
    _throttle: Option<Knob>,
    _lower: Option<Box<LoopDevice>>,
    _scratch: Option<Scratch>,
}

impl LoopDevice {
    pub fn new(size_mib: u64) -> Result<Self> {
        let scratch = Scratch::new("loop")?;
        let backing = scratch.0.join("backing.img");
        // Fully written (not sparse): writes then cost what a disk's would.
        run(Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", backing.display())).args([
            "bs=1M",
            &format!("count={size_mib}"),
            "status=none",
        ]))?;
        let dev = attach(&backing)?;
        Ok(Self { dev, _throttle: None, _lower: None, _scratch: Some(scratch) })
    }

    /// A device whose writes are capped at `bytes_per_sec`, like a real disk.
    ///
    /// The cap is a root-cgroup blkio v1 rule on a lower loop device: rules
    /// on other cgroups miss writeback (flusher threads issue it), and the
    /// upper loop device gives the filesystem a real, bounded request queue.
    pub fn throttled(size_mib: u64, bytes_per_sec: u64) -> Result<Self> {
        Self::stacked(size_mib, Some(bytes_per_sec), false)
    }

    /// `throttled`, with one partition from 1 MiB to the end: its node is
    /// `partition(1)`.
    pub fn throttled_partitioned(size_mib: u64, bytes_per_sec: u64) -> Result<Self> {
        Self::stacked(size_mib, Some(bytes_per_sec), true)
    }

    /// The node of partition `n` ("/dev/loop3p1").
    pub fn partition(&self, n: u32) -> PathBuf {
        PathBuf::from(format!("{}p{n}", self.dev.display()))
    }

    /// The same stack as `throttled` without the cap: the machine's own disk
    /// through two loop devices (2.8 GB/s of O_DIRECT writes here), the
    /// fast SSD a user's main disk is.  Discards stay off on the upper
    /// device, so the two compare alike.
    pub fn uncapped(size_mib: u64) -> Result<Self> {
        Self::stacked(size_mib, None, false)
    }

    fn stacked(size_mib: u64, cap: Option<u64>, partitioned: bool) -> Result<Self> {
        let lower = Self::new(size_mib)?;
        let throttle = match cap {
            Some(bytes_per_sec) => {
                let rule = format!("{} {bytes_per_sec}", lower.bdi()?);
                let undo = format!("{} 0", lower.bdi()?);
                Some(
                    Knob::set_restoring(BLKIO_WRITE_BPS, &rule, BLKIO_WRITE_BPS, &undo)
                        .context("capping the device's write rate (needs the cgroup v1 blkio controller)")?,
                )
            }
            None => None,
        };
        let dev = attach_scanned(&lower.dev, partitioned)?;
        if partitioned {
            // Added by BLKPG, not read from a table: this VM's kernel has no
            // partition table parsers (no CONFIG_MSDOS_PARTITION nor EFI).
            let sectors = (size_mib << 11) - 2048;
            run(Command::new("addpart").arg(&dev).args(["1", "2048", &sectors.to_string()]))?;
        }
        // No discards: the upper device passes one down as a write of zeroes,
        // which the cap counts like data.  btrfs discards deleted extents
        // (discard=async, its default since 6.2): a 3 GiB file removed
        // between two bench runs cost the next run 2440 MiB of capped writes,
        // 24 s at 100 MiB/s.  A disk's discards do not take its write
        // bandwidth.
        let name = dev.file_name().context("loop device name")?.to_string_lossy().into_owned();
        std::fs::write(format!("/sys/block/{name}/queue/discard_max_bytes"), "0")
            .context("turning discards off on the upper loop device")?;
        Ok(Self { dev, _throttle: throttle, _lower: Some(Box::new(lower)), _scratch: None })
    }

    /// Changes a throttled device's cap (bytes per second; 0 lifts it): a
    /// cap of a few KiB/s makes a device that hangs in writeback.
    pub fn set_write_rate(&self, bytes_per_sec: u64) -> Result<()> {
        let lower = self._lower.as_ref().context("not a throttled device")?;
        std::fs::write(BLKIO_WRITE_BPS, format!("{} {bytes_per_sec}", lower.bdi()?))?;
        Ok(())
    }

    /// The kernel name ("loop3").
    pub fn name(&self) -> String {
        self.dev.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Bytes written to the device so far (/sys/block/<dev>/stat, sectors).
    pub fn bytes_written(&self) -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/sys/block/{}/stat", self.name()))?;
        let sectors: u64 = stat.split_whitespace().nth(6).context("short stat")?.parse()?;
        Ok(sectors * 512)
    }

    /// "major:minor", the name of its bdi in /sys/class/bdi and debugfs.
    pub fn bdi(&self) -> Result<String> {
        let s = std::fs::read_to_string(format!("/sys/block/{}/dev", self.name()))?;
        Ok(s.trim().to_owned())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        kernel_defaults(&self.dev, "at its detach");
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A filesystem made on a device and mounted on a fresh directory.
pub struct Mounted {
    pub dir: PathBuf,
    pub fstype: String,
    /// `mount -o` options it was mounted with, kept by remount().
    options: Option<String>,
    // Dropped after the unmount in Drop.
    pub device: LoopDevice,
}

impl Mounted {
    pub fn new(device: LoopDevice, fstype: &str) -> Result<Self> {
        Self::with_options(device, fstype, None)
    }

    /// Made and mounted with `mount -o options` (compress=zstd:1).
    pub fn with_options(device: LoopDevice, fstype: &str, options: Option<&str>) -> Result<Self> {
        let mkfs_force = match fstype {
            // No lazy inode-table/journal init: ext4lazyinit would write in
            // the background and disturb every bytes-written measurement.
            "ext4" => vec!["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
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
        let fs = Self { dir, fstype: fstype.to_owned(), options: options.map(str::to_owned), device };
        fs.mount()?;
        Ok(fs)
    }

    fn mount(&self) -> Result<()> {
        let mut mount = Command::new("mount");
        if let Some(o) = &self.options {
            mount.args(["-o", o]);
        }
        run(mount.arg(&self.device.dev).arg(&self.dir))?;
        Ok(())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A new directory `name` that user nobody (65534) owns, for an
    /// unprivileged writer.
    pub fn nobodys_dir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.path(name);
        std::fs::create_dir(&dir)?;
        run(Command::new("chown").arg("65534:65534").arg(&dir))?;
        Ok(dir)
    }

    /// The bdi this filesystem writes back through: the device's, except on
    /// btrfs, which has one of its own (/sys/fs/btrfs/<fsid>/bdi).
    pub fn bdi(&self) -> Result<String> {
        if self.fstype != "btrfs" {
            return self.device.bdi();
        }
        let uuid = run(Command::new("blkid").args(["-s", "UUID", "-o", "value"]).arg(&self.device.dev))?;
        let link = std::fs::read_link(format!("/sys/fs/btrfs/{}/bdi", uuid.trim()))?;
        Ok(link.file_name().context("bdi link")?.to_string_lossy().into_owned())
    }

    /// Unmount and mount again: the next reads come from the device, not the cache.
    pub fn remount(&self) -> Result<()> {
        run(Command::new("umount").arg(&self.dir))?;
        self.mount()
    }
}

impl Mounted {
    /// btrfs with a subvolume `name` and only that mounted (`-o subvol=`),
    /// as Fedora, openSUSE and Ubuntu mount / and /home: the top-level
    /// subvolume is mounted nowhere.
    pub fn btrfs_subvolume(device: LoopDevice, name: &str) -> Result<Self> {
        let fs = Self::new(device, "btrfs")?;
        run(Command::new("btrfs").args(["subvolume", "create"]).arg(fs.path(name)))?;
        fs.remount_with(&format!("subvol={name}"))?;
        Ok(fs)
    }

    /// Unmount and mount again with `-o options`.
    pub fn remount_with(&self, options: &str) -> Result<()> {
        run(Command::new("umount").arg(&self.dir))?;
        run(Command::new("mount").args(["-o", options]).arg(&self.device.dev).arg(&self.dir))?;
        Ok(())
    }
}

/// The device mountinfo lists for the mount at `dir` ("major:minor"; on
/// btrfs the superblock's, not the one stat(2) reports).
pub fn mountinfo_dev(dir: &Path) -> Result<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dir = dir.to_string_lossy();
    info.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&&*dir))
        .and_then(|f| f.get(2).map(|d| d.to_string()))
        .with_context(|| format!("{dir} is not in mountinfo"))
}

/// A bind mount of a directory, unmounted on drop (before the filesystem
/// it shows: hold it after the `Mounted`).
pub struct BindMount {
    pub dir: PathBuf,
}

impl BindMount {
    pub fn new(source: &Path, tag: &str) -> Result<Self> {
        let dir = PathBuf::from(format!("/mnt/wb-bind-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let bind = Self { dir };
        run(Command::new("mount").arg("--bind").arg(source).arg(&bind.dir))?;
        Ok(bind)
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        if Command::new("umount").arg(&self.dir).status().map(|s| !s.success()).unwrap_or(true) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
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
