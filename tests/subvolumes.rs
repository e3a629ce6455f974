//! Closed files are reached by file handle through a mount of their
//! filesystem, and distributions mount btrfs only by subvolume (subvol=root
//! on /, subvol=@home on /home).  Their files must be flushed there too, and
//! on a filesystem only a subdirectory of which is mounted (a bind mount).

use std::{path::Path, process::Command, time::Duration};

use anyhow::Result;
use wb_tests::*;

/// A streaming writer at once (1 MiB): nearly every file it closes is a
/// multi-file writer's, flushed by handle.  Not paced: a paced device's
/// closed files are left to the kernel's flusher.
const POLICY: &str = "burst = \"1MiB\"\npacing = false\n";

const FILES: u32 = 2000;

/// 2,000 files of 1–64 KiB in tmpfs, for user nobody to copy.
fn source() -> Result<(Scratch, std::path::PathBuf)> {
    let shm = Scratch::new_in("/dev/shm", "subvol")?;
    let tree = shm.0.join("tree");
    random_tree(&tree, FILES, 1024, 64 * 1024, 5)?;
    Ok((shm, tree))
}

/// `cp -r` of `src` as user nobody to `dst` (on the filesystem mounted,
/// in part, at `mount`) with the daemon running: its closed files must
/// have been flushed by handle.
fn copy_as_nobody(src: &Path, mount: &Path, dst: &Path) -> Result<()> {
    let mut daemon = Daemon::start_with_policy(POLICY)?;
    let mut cp = as_nobody("cp").arg("-r").arg(src).arg(dst).spawn()?;
    let pid = cp.id();
    assert!(cp.wait()?.success(), "cp as nobody failed");
    daemon.wait_log(&format!("multi-file writer ended pid={pid} "), Duration::from_secs(15))?;
    let log = daemon.stop()?;
    let flushed = stopped_counter(&log, "closed_files_flushed");
    println!("  {FILES} files copied to {}: {flushed} closed files flushed by handle", mount.display());
    let dev = mountinfo_dev(mount)?;
    let left = log.lines().find(|l| l.contains("left to the kernel") && l.contains(&format!("dev={dev}")));
    assert!(left.is_none(), "{left:?}\n{log}");
    assert!(log.contains(&format!("reached by file handle mount={}", mount.display())), "{log}");
    // The device is named by its mount, not only its anonymous number.
    let started =
        log.lines().find(|l| l.contains(&format!("multi-file writer started pid={pid} "))).unwrap_or_default();
    assert!(started.contains(&format!(" {}", mount.display())), "not named by its mount point: {started}");
    // Files closed before the writer counted as streaming (its first MiB)
    // are the only ones not flushed by handle.  The counter is the whole
    // host's (others' closed files add to it): the two checks above say
    // this mount's were among them.
    assert!(flushed >= FILES as u64 * 9 / 10, "{flushed} of {FILES} closed files flushed by handle:\n{log}");
    Ok(())
}

#[test]
fn btrfs_mounted_by_subvolume_only() -> Result<()> {
    require_root();
    let (_shm, src) = source()?;
    let fs = Mounted::btrfs_subvolume(LoopDevice::new(512)?, "@home")?;
    let dst = fs.nobodys_dir("user")?.join("copy");
    copy_as_nobody(&src, &fs.dir, &dst)?;
    // Read back from the device, not the cache.
    fs.remount_with("subvol=@home")?;
    assert!(same_tree(&src, &dst)?, "the copy differs from its source");
    Ok(())
}

/// ext4 and xfs seen only through a bind mount of a subdirectory: with
/// CAP_DAC_READ_SEARCH a handle opens through it as through a mount of
/// the filesystem's root, so the daemon uses it.
#[test]
fn ext4_and_xfs_seen_through_a_bind_mount_of_a_subdirectory() -> Result<()> {
    require_root();
    let (_shm, src) = source()?;
    for fstype in ["ext4", "xfs"] {
        let fs = Mounted::new(LoopDevice::new(512)?, fstype)?;
        let sub = fs.nobodys_dir("sub")?;
        let bind = BindMount::new(&sub, fstype)?;
        run(Command::new("umount").arg(&fs.dir))?;
        copy_as_nobody(&src, &bind.dir, &bind.dir.join("copy"))?;
        sh("sync")?;
        assert!(same_tree(&src, &bind.dir.join("copy"))?, "{fstype}: the copy differs from its source");
    }
    Ok(())
}

/// Kernels with btrfs as a module (Debian's) keep btrfs_inode out of
/// BPF's reach: a closed file's event then has fs_root 0 and the
/// superblock's device.  The agent tries each mounted subvolume; here a
/// file of the second of two mounted ones, neither the top level.
#[test]
fn a_closed_file_whose_subvolume_bpf_could_not_read() -> Result<()> {
    use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
    use writebehindd::handles::{ClosedFile, Handles};
    require_root();
    let fs = Mounted::btrfs_subvolume(LoopDevice::new(512)?, "@a")?;
    // @a holds no file of its own: none could share the inode number and
    // generation of b's file and be opened in its place.
    run(Command::new("btrfs").args(["subvolume", "create"]).arg(fs.path("b")))?;
    let b = BindMount::new(&fs.path("b"), "subvol-b")?;
    let file = b.dir.join("f");
    std::fs::write(&file, b"written, closed")?;
    let opened = std::fs::File::open(&file)?;
    let mut generation: u32 = 0;
    // FS_IOC_GETVERSION: the inode's i_generation, which handles carry.
    const FS_IOC_GETVERSION: libc::c_ulong = 0x8008_7601;
    assert_eq!(unsafe { libc::ioctl(opened.as_raw_fd(), FS_IOC_GETVERSION, &mut generation) }, 0);
    let dev = mountinfo_dev(&fs.dir)?;
    let (major, minor) = dev.split_once(':').expect("major:minor");
    let sb_dev = libc::makedev(major.parse()?, minor.parse()?);
    let st = opened.metadata()?;
    let event = ClosedFile { sb_dev, st_dev: sb_dev, ino: st.ino(), generation, fs_root: 0, fs_magic: 0, path: None };
    let (fd, _) = Handles::default().open(&event).map_err(|e| anyhow::anyhow!("not opened by handle: {e:?}"))?;
    let got = std::fs::File::from(fd).metadata()?;
    assert_eq!((got.dev(), got.ino()), (st.dev(), st.ino()), "another file was opened");
    Ok(())
}
