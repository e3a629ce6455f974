//! Who may steer the dirty limits.  Pacing lowers a limit other writers
//! share: a bdi's own, or on kernels before 6.2 the whole system's
//! `vm.dirty_bytes`.  A device whose speed a user sets (their own FUSE
//! server) must not let them hold it; no lever may raise a limit above
//! what the kernel enforced before; and a tool that saved the sysctls while
//! the lever held must not leave the daemon's values in force for good.
//! Every writer here is nobody (setpriv), as in tests/hardening.rs.

use std::{
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use wb_tests::{daemon, *};

/// Every write of 1 MiB crosses a window; every writer streams at once.
const POLICY: &str = "window = \"1MiB\"\nburst = \"1MiB\"\n";

/// /dev/fuse open to every user, as Debian's desktops have it (0666; this
/// host's is 0600), until dropped.
struct FuseForAll(u32);

impl FuseForAll {
    fn new() -> Result<Self> {
        let was = std::fs::metadata("/dev/fuse").context("/dev/fuse")?.permissions().mode() & 0o7777;
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666))?;
        Ok(Self(was))
    }
}

impl Drop for FuseForAll {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.0));
    }
}

/// What a daemon did while nobody copied `mib` MiB at 20 MiB/s into a FUSE
/// filesystem of its own, mounted in a user and mount namespace of its own
/// (`unshare -Urm`, no root, no fusermount): whether any device was
/// paced, and the largest max_ratio_fine its bdi held meanwhile.
fn nobodys_fuse_copy(daemon: &Daemon, mib: u64) -> Result<(bool, u64)> {
    let (paced, ratio, _) = nobodys_fuse_copy_on(daemon, mib)?;
    Ok((paced, ratio))
}

/// `nobodys_fuse_copy`, and the FUSE bdis ("0:N") status showed meanwhile.
fn nobodys_fuse_copy_on(daemon: &Daemon, mib: u64) -> Result<(bool, u64, Vec<String>)> {
    let mut seen = Vec::new();
    let dir = Scratch::new("nobodys-fuse")?;
    std::os::unix::fs::chown(&dir.0, Some(65534), Some(65534))?;
    let mut server = Background::spawn(
        as_nobody("unshare")
            .args(["-Urm", PYTHON, "-c", FUSE_SLOW])
            .arg(&dir.0)
            .args(["20", &mib.to_string()])
            .stdout(Stdio::piped()),
    )?;
    let (mut paced, mut ratio) = (false, 0u64);
    let deadline = Instant::now() + Duration::from_secs(mib / 20 * 3 + 10);
    while server.0.try_wait()?.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "nobody's FUSE copy did not end:\n{}", daemon.log_text());
        let out = daemon.wbctl().args(["status", "--json"]).output()?;
        if let Ok(s) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            for d in s["devices"].as_array().into_iter().flatten() {
                paced |= d["paced_budget"].as_u64() > Some(0);
                // A FUSE bdi is named for its anonymous device, "0:N".
                let bdi = d["bdi"].as_str().unwrap_or("?");
                if bdi.starts_with("0:") && !seen.iter().any(|s| s == bdi) {
                    seen.push(bdi.to_owned());
                }
                if bdi.starts_with("0:")
                    && let Ok(r) = std::fs::read_to_string(format!("/sys/class/bdi/{bdi}/max_ratio_fine"))
                {
                    ratio = ratio.max(r.trim().parse().unwrap_or(0));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(server.0.stdout.as_mut().context("stdout")?, &mut out)?;
    anyhow::ensure!(out.trim() == "done", "nobody's FUSE copy failed ({out:?}):\n{}", daemon.log_text());
    Ok((paced, ratio, seen))
}

/// A device's record outlives its mount by ten minutes (DEVICE_IDLE), and
/// the anonymous device number an unmount frees goes to the next mount.
/// Root's FUSE mount, written (and so found root's), unmounted; nobody's
/// own FUSE mount then took its number, and with it root's class: nobody's
/// copy was capped.  A superblock whose mount is no longer the one its class
/// was found from is looked at again at its next event.
#[test]
fn a_users_fuse_mount_on_the_number_roots_had_steers_no_limit() -> Result<()> {
    require_root();
    let _fuse = FuseForAll::new()?;
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(POLICY), &["--pacing-lever", "bdi"])?;
    let mut roots = RootFuse::spawn(FUSE_SLOW, &["20", "40"])?;
    await_line(&mut roots.server, "done")?;
    let number = mountinfo_dev(roots.dir())?;
    drop(roots);
    std::thread::sleep(Duration::from_secs(1));
    let (_, _, seen) = nobodys_fuse_copy_on(&daemon, 100)?;
    let log = daemon.stop()?;
    println!("root's FUSE mount was {number}; nobody's devices: {seen:?}");
    assert!(seen.contains(&number), "nobody's mount did not take root's number {number} ({seen:?}):\n{log}");
    // What the daemon did once nobody wrote (root's record may still be
    // paced from before: the same bdi name).
    let nobodys: Vec<&str> =
        log.lines().skip_while(|l| !(l.contains("owner=65534") && l.contains("stream started"))).collect();
    assert!(!nobodys.is_empty(), "nobody's copy was not seen:\n{log}");
    assert!(
        !nobodys.iter().any(|l| l.contains("capping the device")),
        "nobody's FUSE mount was capped as root's:\n{log}"
    );
    assert!(log.contains("a user sets this device's speed"), "not said:\n{log}");
    Ok(())
}

/// A user's own FUSE filesystem, whose speed its server sets, drives no
/// lever: before, nobody writing to it at 20 MiB/s held the system's
/// `vm.dirty_bytes` (kernels before 6.2) or its bdi's cap for as long as
/// it liked.  With `pace_user_devices = true` the administrator opts such
/// devices in, and they are paced (which shows this test can tell).
#[test]
fn a_users_own_fuse_mount_steers_no_limit() -> Result<()> {
    require_root();
    let _fuse = FuseForAll::new()?;
    let before = VmLimits::now()?;
    for lever in ["global", "bdi"] {
        let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(POLICY), &["--pacing-lever", lever])?;
        let (paced, _) = nobodys_fuse_copy(&daemon, 100)?;
        let log = daemon.stop()?;
        assert!(!paced, "{lever}: nobody's own FUSE mount was paced:\n{log}");
        assert!(log.contains("a user sets this device's speed"), "{lever}: not said:\n{log}");
        assert_eq!(VmLimits::now()?, before);
    }
    let opted_in = format!("{POLICY}pace_user_devices = true\n");
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(&opted_in), &["--pacing-lever", "global"])?;
    let (paced, _) = nobodys_fuse_copy(&daemon, 100)?;
    let log = daemon.stop()?;
    assert!(paced, "opted in, nobody's FUSE mount was not paced:\n{log}");
    assert_eq!(VmLimits::now()?, before);
    Ok(())
}

/// No lever raises a limit.  A budget grows with the device's bandwidth
/// and its writers; here `dirty_seconds = 600` makes one writer's budget
/// gigabytes, above the kernel's threshold.  The per-device lever on an
/// opted-in FUSE bdi, whose cap the kernel keeps at 1 % of the system's
/// limit (max_ratio_fine 10000), wrote `max_ratio_fine` 1000000 when the
/// kernel refused so large a max_bytes; the global lever wrote the budget
/// as `vm.dirty_bytes`, above the ratio's own threshold.
#[test]
fn no_lever_raises_a_limit_above_the_kernels() -> Result<()> {
    require_root();
    let policy = format!("{POLICY}pace_user_devices = true\ndirty_seconds = 600\n");
    let _fuse = FuseForAll::new()?;
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(&policy), &["--pacing-lever", "bdi"])?;
    let (paced, ratio) = nobodys_fuse_copy(&daemon, 100)?;
    let log = daemon.stop()?;
    println!("a FUSE bdi paced with a budget of 600 s: max_ratio_fine at most {ratio}");
    assert!(paced, "not paced at all:\n{log}");
    assert!(ratio > 0 && ratio <= 10_000, "the FUSE bdi's 1 % cap was raised to {ratio} ppm:\n{log}");

    let before = VmLimits::now()?;
    let vmstat = std::fs::read_to_string("/proc/vmstat")?;
    let threshold: u64 = vmstat
        .lines()
        .find_map(|l| l.strip_prefix("nr_dirty_threshold "))
        .context("nr_dirty_threshold")?
        .trim()
        .parse::<u64>()?
        * 4096;
    let fs = Mounted::new(LoopDevice::throttled(1024, 30 * MIB)?, "ext4")?;
    let dir = fs.nobodys_dir("nobody")?;
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(&policy), &["--pacing-lever", "global"])?;
    let mut w = Background::spawn(
        as_nobody("sh").arg("-c").arg(format!("head -c 256M /dev/zero | pv -qL 100m > {}", dir.join("f").display())),
    )?;
    let mut highest = 0u64;
    while w.0.try_wait()?.is_none() {
        highest = highest.max(knob::read("/proc/sys/vm/dirty_bytes")?.parse()?);
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = daemon.stop()?;
    println!(
        "global lever, a budget of 600 s: vm.dirty_bytes at most {} MiB, the threshold {} MiB",
        highest / MIB,
        threshold / MIB
    );
    assert!(highest <= threshold, "vm.dirty_bytes {highest} above the kernel's threshold {threshold}:\n{log}");
    assert_eq!(VmLimits::now()?, before);
    Ok(())
}

/// While the global lever holds, `vm.dirty_ratio` reads 0.  A tool that
/// saved the sysctls then (`sysctl -a > saved`) and writes them back later
/// (`sysctl -p saved`, tuned, laptop-mode-tools) left the daemon's few MiB
/// in force for good, or, writing the ratio alone, a threshold of 0.  The
/// daemon puts the administrator's values back, and leaves the
/// administrator's own later change alone.
#[test]
fn sysctls_a_tool_writes_back_do_not_stay() -> Result<()> {
    require_root();
    let before = VmLimits::now()?;
    let _guards = before.set()?;
    let fs = Mounted::new(LoopDevice::throttled(1024, 30 * MIB)?, "ext4")?;
    let dir = fs.nobodys_dir("nobody")?;
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(POLICY), &["--pacing-lever", "global"])?;
    let mut w = Background::spawn(
        as_nobody("sh").arg("-c").arg(format!("head -c 192M /dev/zero | pv -qL 100m > {}", dir.join("f").display())),
    )?;
    wait_until("the global lever holds", Duration::from_secs(10), || Ok(VmLimits::now()? != before))?;
    let saved = VmLimits::now()?;
    w.wait()?;
    wait_until("the administrator's values back", Duration::from_secs(20), || Ok(VmLimits::now()? == before))?;
    // `sysctl -p` of what `sysctl -a` printed: its order, alphabetical.
    let write_back = |limits: &VmLimits| -> Result<()> {
        for (k, v) in [
            ("vm.dirty_background_bytes", &limits.background_bytes),
            ("vm.dirty_background_ratio", &limits.background_ratio),
            ("vm.dirty_bytes", &limits.dirty_bytes),
            ("vm.dirty_ratio", &limits.dirty_ratio),
        ] {
            run(std::process::Command::new("sysctl").arg("-qw").arg(format!("{k}={v}")))?;
        }
        Ok(())
    };
    write_back(&saved)?;
    let written_back = VmLimits::now()?;
    let undone = wait_until("the saved limits undone", Duration::from_secs(3), || Ok(VmLimits::now()? == before));
    run(std::process::Command::new("sysctl").args(["-qw", "vm.dirty_ratio=0"]))?;
    let zero_undone = wait_until("a threshold of 0 undone", Duration::from_secs(3), || Ok(VmLimits::now()? == before));
    let mine = VmLimits { dirty_ratio: "30".into(), ..before.clone() };
    let _mine = mine.set()?;
    std::thread::sleep(Duration::from_secs(1));
    let kept = VmLimits::now()?;
    let log = daemon.stop()?;
    println!("saved while paced: {saved:?}; written back: {written_back:?}");
    assert_ne!(written_back, before, "the write-back changed nothing: the test cannot tell");
    undone.with_context(|| format!("the daemon's own limits stayed in force:\n{log}"))?;
    zero_undone.with_context(|| format!("a threshold of 0 stayed:\n{log}"))?;
    assert_eq!(kept, mine, "the administrator's own change was undone:\n{log}");
    Ok(())
}

/// The daemon's threads named for a device of an anonymous superblock
/// ("flush-0:N": a FUSE mount's).
fn fuse_flusher_threads(daemon: &Daemon) -> Result<usize> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid()))?;
    Ok(tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("flush-0:")))
        .count())
}

/// A flusher thread stuck in the kernel on a stalled device cannot be
/// ended, and every thread counts against the unit's TasksMax.  nobody
/// stalls ten FUSE servers of its own in the middle of their writeback:
/// each device's thread waits for ever.  With the daemon's tasks capped
/// (a v1 pids cgroup, as TasksMax does) at what it runs plus nine, the ten
/// took all nine; now devices users made get at most eight threads at
/// once, and root's disk still gets its own and is written back.
#[test]
fn stalled_user_devices_leave_threads_for_disks() -> Result<()> {
    require_root();
    let _fuse = FuseForAll::new()?;
    let fs = Mounted::new(LoopDevice::new(512)?, "ext4")?;
    let daemon = Daemon::start_with_policy(POLICY)?;
    let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid()))?.count();
    let cap = V1Limit::new("pids", daemon.pid(), "pids.max", &(tasks + 9).to_string())?;
    let mut stalled = Vec::new();
    for i in 0..10 {
        let dir = Scratch::new(&format!("stalled-fuse-{i}"))?;
        std::os::unix::fs::chown(&dir.0, Some(65534), Some(65534))?;
        let server = Background::spawn(
            as_nobody("unshare")
                .args(["-Urm", PYTHON, "-c", FUSE_SLOW])
                .arg(&dir.0)
                .args(["100", "16", "4"])
                .stdout(Stdio::null()),
        )?;
        stalled.push((server, dir));
    }
    let settled = wait_until("the stalled devices' threads", Duration::from_secs(15), || {
        Ok(daemon.counter("error_no_thread").unwrap_or(0) > 0 && fuse_flusher_threads(&daemon)? >= 8)
    });
    let user_threads = fuse_flusher_threads(&daemon)?;
    let before = fs.device.bytes_written()?;
    run(Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=32", "status=none"])
        .arg(format!("of={}", fs.path("root").display())))?;
    std::thread::sleep(Duration::from_secs(2));
    let flushed = fs.device.bytes_written()? - before;
    drop(stalled);
    drop(cap);
    let log = daemon.stop()?;
    println!("ten stalled FUSE devices: {user_threads} threads; root's 32 MiB: {} MiB written back", flushed / MIB);
    settled.with_context(|| format!("the stalled devices did not take their threads:\n{log}"))?;
    assert!(user_threads <= 8, "{user_threads} threads for devices a user made:\n{log}");
    assert!(flushed >= 16 * MIB, "root's disk got no thread: {} MiB written back:\n{log}", flushed / MIB);
    Ok(())
}

/// A loop device over an image file that nobody owns (as udisks attaches
/// a user's), and the image's path.
fn nobodys_image() -> Result<(LoopDevice, std::path::PathBuf)> {
    let device = LoopDevice::new(512)?;
    let backing = std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", device.name()))?;
    let backing = std::path::PathBuf::from(backing.trim_end());
    std::os::unix::fs::chown(&backing, Some(65534), Some(65534))?;
    Ok((device, backing))
}

/// nobody copies 256 MiB into `dir` at 200 MiB/s under a daemon with
/// POLICY; the daemon's log.
fn nobodys_copy_into(dir: &std::path::Path) -> Result<String> {
    let daemon = Daemon::start_exe_with(&daemon::daemon_exe(), Some(POLICY), &[])?;
    run(as_nobody("sh").arg("-c").arg(format!("head -c 256M /dev/zero | pv -qL 200m > {}", dir.join("f").display())))?;
    daemon.stop()
}

/// sysfs names a loop device's backing file by a path the kernel renders
/// when asked: "<name> (deleted)" once the file is removed.  nobody removes
/// their image once it is attached (as udisks attaches a user's) and puts a
/// symlink to root's /etc/passwd by that name.  The daemon looked the path
/// up, took passwd for the image and the device for root's disk, and paced
/// it for nobody.  Now the path is walked with no symlink and a deleted
/// file's name not at all: the device is a user's.
#[test]
fn a_users_deleted_image_named_after_roots_file_steers_no_limit() -> Result<()> {
    require_root();
    let (device, backing) = nobodys_image()?;
    std::os::unix::fs::chown(backing.parent().context("the image's directory")?, Some(65534), Some(65534))?;
    let fs = Mounted::new(device, "ext4")?;
    let dir = fs.nobodys_dir("nobody")?;
    run(as_nobody("sh").arg("-c").arg(format!("rm '{0}' && ln -s /etc/passwd '{0} (deleted)'", backing.display())))?;
    let log = nobodys_copy_into(&dir)?;
    assert!(!log.contains("pacing on"), "nobody's loop device was paced as root's disk:\n{log}");
    assert!(log.contains("a user sets this device's speed"), "not said:\n{log}");
    Ok(())
}

/// udisks mounts a user's NTFS image, a loop device over their file, with
/// ntfs-3g, which it runs as root: a fuseblk mount with user_id=0, as a
/// stick's NTFS is.  Taken for root's FUSE mount, nobody's copy into it at
/// 200 MiB/s was paced; now what is under a fuseblk mount is looked up
/// (its superblock is its block device's), and it is nobody's.
#[test]
fn a_users_ntfs_image_mounted_by_roots_ntfs_3g_steers_no_limit() -> Result<()> {
    require_root();
    let (device, _) = nobodys_image()?;
    run(Command::new("mkntfs").args(["--quick", "--force", "--quiet"]).arg(&device.dev))?;
    let dir = Scratch::new("ntfs")?;
    run(Command::new("ntfs-3g").arg(&device.dev).arg(&dir.0).args(["-o", "uid=65534,gid=65534"]))?;
    let mounted = Unmount(dir.0.clone());
    let log = nobodys_copy_into(&dir.0)?;
    drop(mounted);
    assert!(log.contains("stream started"), "nobody's copy was not seen:\n{log}");
    assert!(!log.contains("pacing on"), "nobody's NTFS image was paced as root's FUSE mount:\n{log}");
    assert!(log.contains("loop (uid 65534's file)"), "not said:\n{log}");
    Ok(())
}

/// A mount, unmounted when dropped.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A loop device over a user's own file (udisks sets one up for a user's
/// disk image) is a device whose speed that user sets, like their FUSE
/// mount: nobody streaming into it at 200 MiB/s was paced, now it is not.
#[test]
fn a_loop_device_over_a_users_file_steers_no_limit() -> Result<()> {
    require_root();
    let (device, _) = nobodys_image()?;
    let fs = Mounted::new(device, "ext4")?;
    let log = nobodys_copy_into(&fs.nobodys_dir("nobody")?)?;
    assert!(!log.contains("pacing on"), "a loop device over nobody's file was paced:\n{log}");
    assert!(log.contains("loop (uid 65534's file)"), "not said:\n{log}");
    Ok(())
}
