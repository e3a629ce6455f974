//! Debian guests with systemd as PID 1, for `cargo xtask systest`, and
//! Debian's stock kernels (kernels.rs) for them and for `vmtest`.
//!
//! mmdebstrap builds a minbase root of a suite (ROOTS: Debian 13 for its
//! own 6.12 and sid's 7.2, Debian 12 for its 6.1 and Debian 11's 5.10)
//! with systemd, udev, dbus and the kernels' packages, which make their
//! initrds inside the chroot.  The root becomes an ext4 image (`mkfs.ext4
//! -d`) cached under target/guest/<suite>-<hash of everything that goes
//! into it, the kernels' package versions too>/, so only a changed package
//! list, boot unit or kernel rebuilds it (measured: 51-98 s, mostly
//! downloads; 770 MiB).  qemu boots
//! it with -kernel/-initrd copied out of its /boot, the root disk in
//! snapshot mode so the cache stays clean, and a second, read-only disk
//! carrying the test (xtask/guest/ + what to install), which the image's
//! wb-systest.service runs once multi-user.target is up.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub mod kernels;
mod sticks;
pub use sticks::Sticks;

/// A root to build and the kernels it boots.
pub struct Root {
    pub suite: &'static str,
    sources: &'static [&'static str],
    kernels: &'static [&'static str],
}

/// Debian 13 is the main root; Debian 12's systemd 252 boots its own 6.1
/// and Debian 11's 5.10 (trixie's systemd 257 would too, but 5.10 is what
/// Debian 11 and 12 machines run, so it goes with the older root).
pub const ROOTS: &[Root] = &[
    Root { suite: "trixie", sources: kernels::TRIXIE, kernels: &["6.12", "7.2"] },
    Root { suite: "bookworm", sources: kernels::BOOKWORM, kernels: &["6.1", "5.10"] },
];

/// The root that boots kernel `version`.
pub fn root_for(version: &str) -> Result<&'static Root> {
    ROOTS.iter().find(|r| r.kernels.contains(&version)).with_context(|| format!("no root boots kernel {version}"))
}

/// Beyond minbase: systemd as init, initramfs-tools for the kernels (whose
/// packages, fetched by kernels.rs, are installed from their files at the
/// end), and what the test script uses (mkfs.ext4 for its loop filesystem, pv for a paced writer,
/// procps for pgrep; for the USB sticks mkfs.vfat, mkfs.exfat, mkfs.ntfs,
/// rsync and GLib's `gio copy`; for NFS (nfs.sh) Debian's server and
/// client, iproute2's tc to shape the link, strace to time the copy's
/// close).  systemd-analyze and journalctl come with systemd.  The NFS
/// packages are in every image, not a variant of their own as PostgreSQL
/// is: the quick run's NFS case needs them on CI's image, and they add a
/// few MiB (nfs-kernel-server, nfs-common, rpcbind, iproute2, strace and
/// their libraries; recommends are not installed).  dmsetup maps a user's
/// image as udisks would (systest.sh: dm over a loop device); autofs's
/// `-hosts` map mounts a server a user names (nfs.sh).
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "initramfs-tools",
    "e2fsprogs",
    "procps",
    "kmod",
    "pv",
    "dosfstools",
    "exfatprogs",
    "ntfs-3g",
    "rsync",
    "libglib2.0-bin",
    "nfs-kernel-server",
    "nfs-common",
    "iproute2",
    "strace",
    "dmsetup",
    "autofs",
];
/// The full systest's extras: Debian's postgresql, with pgbench, for the
/// database beside a copy (db.sh), and samba with cifs-utils for the SMB
/// copy (nfs.sh).  Their own image (`<suite>+full-`), so that the quick
/// run's, which CI builds on every run, stays as small and as quick to make
/// as it was.
const FULL_PACKAGES: &[&str] = &["postgresql", "samba", "cifs-utils"];
/// initramfs-tools' default (MODULES=most) makes 35 MiB initrds; the guest
/// needs only its root disk's drivers (6 MiB each, and faster to unpack
/// under TCG).
const INITRAMFS_HOOK: &str = r#"mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d" && echo MODULES=list > "$1/etc/initramfs-tools/conf.d/wb-guest" && printf 'virtio_pci\nvirtio_blk\next4\n' > "$1/usr/share/initramfs-tools/modules.d/wb-guest""#;
/// Units that would run at random moments during a test (timers), or
/// print a login prompt into the serial log the host parses.
const MASKED: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "serial-getty@ttyS0.service",
    "getty@tty1.service",
];
const TEST_TARGET: &str = include_str!("../guest/wb-systest.target");
const TEST_SERVICE: &str = include_str!("../guest/wb-systest.service");
const FSTAB: &str = "/dev/vda / ext4 defaults 0 0\n";
/// Free space in the root image for what the test installs and writes (its
/// loop device's backing file lives there, in the snapshot overlay).  The
/// full run's sources (512 MiB and 60 photos), the 1 GiB loop file, the
/// journal at debug level and PostgreSQL's cluster filled 2 GiB on 6.1: dpkg
/// then failed the purge.  Sparse: unused space costs nothing.
const HEADROOM: u64 = 4 << 30;

pub struct Image {
    pub disk: PathBuf,
    dir: PathBuf,
}

pub struct Kernel {
    pub release: String,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// Runs `cmd`, its stderr shown; its stdout, or why it failed.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.stderr(Stdio::inherit()).output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `tool` is on PATH, else which package to install.
pub fn need(tool: &str, package: &str) -> Result<()> {
    if Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status()?.success() {
        return Ok(());
    }
    bail!("{tool} not found: install {package} (.ci/deps does)")
}

/// FNV-1a: a cache key stable across Rust releases (DefaultHasher is not).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The workspace's target directory, made if missing.
pub fn target_dir() -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    fs::create_dir_all(&target)?;
    Ok(fs::canonicalize(&target)?)
}

/// Where kernel packages are copied into the root to be installed.
const KERNEL_DEBS: &str = "/var/cache/wb-kernels";

/// `root`'s cached image, built first if nothing that goes into it is
/// cached (its kernels' newest packages are fetched first); `full`: with
/// the full run's extras (FULL_PACKAGES).
pub fn image(root: &Root, full: bool) -> Result<Image> {
    let suite = root.suite;
    let sources = root.sources;
    let debs = kernels::newest_of_each(&kernels::fetch(root.kernels)?)?;
    let names: Vec<String> = debs.iter().map(|d| d.file_name().unwrap().to_string_lossy().into_owned()).collect();
    let packages: Vec<&str> = PACKAGES.iter().chain(if full { FULL_PACKAGES } else { &[] }).copied().collect();
    let recipe = format!(
        "{suite}\n{sources:?}\n{packages:?}\n{names:?}\n{INITRAMFS_HOOK}\n{MASKED:?}\n{TEST_TARGET}{TEST_SERVICE}{FSTAB}{HEADROOM}"
    );
    let variant = if full { format!("{suite}+full") } else { suite.to_owned() };
    let dir = target_dir()?.join("guest").join(format!("{variant}-{:016x}", fnv(&recipe)));
    let image = Image { disk: dir.join("root.img"), dir: dir.clone() };
    if dir.join("ok").exists() {
        return Ok(image);
    }
    need("mmdebstrap", "mmdebstrap")?;
    let started = Instant::now();
    let build = dir.with_extension("build");
    let _ = fs::remove_dir_all(&build);
    let root = build.join("root");
    fs::create_dir_all(&build)?;
    println!("guest: building the Debian {variant} root with mmdebstrap (cached in {})", dir.display());
    // The kernels from their files, with what they need from the suite
    // (apt inside the chroot; mmdebstrap's own --include of a file wants it
    // at the same path inside and out).
    let mut copy_in = format!("copy-in {}", debs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" "));
    copy_in += &format!(" {KERNEL_DEBS}");
    let mmdebstrap = || {
        run(Command::new("mmdebstrap")
            .args(["--mode=root", "--variant=minbase", "--aptopt=APT::Install-Recommends \"false\""])
            .arg(format!("--include={}", packages.join(",")))
            .arg(format!("--essential-hook={INITRAMFS_HOOK}"))
            .arg(format!("--customize-hook=mkdir -p \"$1{KERNEL_DEBS}\""))
            .arg(format!("--customize-hook={copy_in}"))
            .arg(format!("--customize-hook=chroot \"$1\" sh -c 'apt-get install -y -q {KERNEL_DEBS}/*.deb'"))
            .arg(format!("--customize-hook=rm -r \"$1{KERNEL_DEBS}\""))
            .arg(suite)
            .arg(&root)
            .args(sources))
    };
    // Once in five builds here the essential packages' configuration
    // failed (base-files' postinst: "chown: invalid user: 'root:root'");
    // the next build succeeded.
    if let Err(e) = mmdebstrap() {
        // Never delete through a mount mmdebstrap left behind (its /proc,
        // /sys or /dev would be the host's).
        let mounts = fs::read_to_string("/proc/self/mounts")?;
        if mounts.lines().any(|l| l.split(' ').nth(1).is_some_and(|m| Path::new(m).starts_with(&root))) {
            bail!("{e:#}; {} still has mounts: not retrying", root.display());
        }
        println!("guest: {e:#}; once more");
        let _ = fs::remove_dir_all(&root);
        mmdebstrap()?;
    }
    customize(&root)?;
    for f in fs::read_dir(root.join("boot"))? {
        let f = f?.path();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("vmlinuz-") || name.starts_with("initrd.img-") {
            fs::copy(&f, build.join(&name))?;
        }
    }
    let used: u64 = run(Command::new("du").args(["-sb"]).arg(&root))?
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du -sb")?;
    let disk = build.join("root.img");
    fs::File::create(&disk)?.set_len(used + HEADROOM)?;
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-L", "wbroot", "-d"]).arg(&root).arg(&disk))?;
    fs::remove_dir_all(&root)?;
    fs::write(build.join("ok"), recipe)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&build, &dir)?;
    // This suite's images of other recipes are stale (about 800 MiB each
    // on disk); the other variant's (with or without the full run's extras) is not.
    for old in fs::read_dir(dir.parent().unwrap())? {
        let old = old?.path();
        let same_suite = old.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{variant}-")));
        if old != dir && same_suite && old.join("root.img").exists() {
            fs::remove_dir_all(&old)?;
        }
    }
    println!("guest: image built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(image)
}

/// What the test needs of the root beyond packages: the test's boot
/// target, fstab, a hostname, quiet timers and no login prompt.
fn customize(root: &Path) -> Result<()> {
    let units = root.join("etc/systemd/system");
    fs::write(units.join("wb-systest.target"), TEST_TARGET)?;
    fs::write(units.join("wb-systest.service"), TEST_SERVICE)?;
    for unit in MASKED {
        let link = units.join(unit);
        let _ = fs::remove_file(&link);
        symlink("/dev/null", &link)?;
    }
    fs::write(root.join("etc/fstab"), FSTAB)?;
    fs::write(root.join("etc/hostname"), "wbguest\n")?;
    Ok(())
}

impl Image {
    /// The kernel of `version`'s line ("6.1" matches 6.1.0-56-amd64, not
    /// 6.12...).
    pub fn kernel(&self, version: &str) -> Result<Kernel> {
        for f in fs::read_dir(&self.dir)? {
            let name = f?.file_name().to_string_lossy().into_owned();
            let Some(release) = name.strip_prefix("vmlinuz-") else { continue };
            if kernels::is_of(release, version) {
                return Ok(Kernel {
                    release: release.to_owned(),
                    vmlinuz: self.dir.join(&name),
                    initrd: self.dir.join(format!("initrd.img-{release}")),
                });
            }
        }
        bail!("no {version} kernel in {}", self.dir.display())
    }
}

/// What the guest's kernel prints as it reboots, and as it panics.
const RESTART: &str = "reboot: Restarting system";
const PANIC: &str = "Kernel panic";

/// Whether the guest's kernel panicked in a boot before the test's script
/// (its lines carry `marker`) printed anything in that boot: nothing of ours
/// had run, so a second try is fair.  Seen once in CI: 6.12 oopsed on an int3
/// in sched_clock_cpu 3 s into the second boot, a static key being patched
/// while the other vCPU ran (multi-threaded TCG); the same image booted
/// cleanly in every other run.
fn crashed_booting(log: &[String], marker: &str) -> bool {
    let boot = log.iter().rposition(|l| l.contains(RESTART)).map_or(0, |i| i + 1);
    let this = &log[boot..];
    this.iter().any(|l| l.contains(PANIC)) && !this.iter().any(|l| l.contains(marker))
}

/// What multi-threaded TCG makes of the kernel patching its own code (a
/// static key or a tracepoint turned on or off): an int3 the kernel had
/// written and already taken back, still executed by the other vCPU.  Seen at
/// boot (above) and once in the 7.2 systest, 3 s after `kill -9` of the
/// daemon, whose detaching turns tracepoints off (`__folio_mark_dirty`, the
/// writeback_dirty_folio tracepoint's site); that guest had passed the same
/// step in every run before, and 5.10, 6.1 and 6.12 passed it in the same
/// run.
const INT3_OOPS: &str = "Oops: int3";

/// Multi-threaded TCG's other fault: both vCPUs livelocked for the rest of
/// the run, the soft-lockup watchdog reporting each of them stuck longer
/// at every report.  Seen twice on 5.10, beside the host tests: 7 minutes
/// in temp_files_and_overwrites_are_written_once (2026-11-29, until the
/// guest was stopped), and 19 minutes from lifecycle's
/// works_in_the_units_namespace until the 1800 s timeout (a clean-clone
/// CI run, 2026-12-03); the same code passed on the next run both times.
/// One thread for both vCPUs (thread=single) avoids it but took 5.10's
/// quick run past its 900 s (it was 642 s). A vCPU stuck this long is no
/// test's doing: qemu is stopped there, and the run tried again.
fn livelocked(line: &str) -> bool {
    let Some((_, rest)) = line.split_once("soft lockup - CPU#") else { return false };
    let secs = rest.split_once("stuck for ").and_then(|(_, r)| r.split_once("s!")).map(|(n, _)| n.parse::<u32>());
    matches!(secs, Some(Ok(s)) if s >= LIVELOCK_SECS)
}

/// A vCPU reported stuck this long is livelocked: a guest at SCHED_IDLE
/// beside the host tests is slowed, not stopped, for minutes.
const LIVELOCK_SECS: u32 = 120;

/// Why a guest run deserves a second try, if it does: its kernel panicked
/// before the script marking its lines with `marker` ran
/// (`crashed_booting`), it oopsed on an int3 of its own code patching, or a
/// vCPU livelocked (`livelocked`).  Any other oops or panic is the test's
/// finding.
fn retry_reason(log: &[String], marker: &str) -> Option<&'static str> {
    if crashed_booting(log, marker) {
        Some("the kernel panicked while booting, before the test ran")
    } else if log.iter().any(|l| l.contains(INT3_OOPS)) {
        Some("the kernel oopsed on an int3 of its own code patching (multi-threaded TCG)")
    } else if log.iter().any(|l| livelocked(l)) {
        Some("a vCPU livelocked, stopped after its soft lockup of 120 s (multi-threaded TCG)")
    } else {
        None
    }
}

/// Runs `boot` (one qemu, returning its console) a second time if the
/// first one's log gives a `retry_reason`; the log of the last try, and the
/// reason for the second if there was one.
pub fn boot_retrying(
    marker: &str,
    mut boot: impl FnMut() -> Result<Vec<String>>,
) -> Result<(Vec<String>, Option<&'static str>)> {
    let log = boot()?;
    let Some(reason) = retry_reason(&log, marker) else {
        return Ok((log, None));
    };
    println!("{marker}{reason}: once more");
    Ok((boot()?, Some(reason)))
}

/// A small ext4 disk holding `dir`'s files, for the guest to mount.
pub fn disk_of(dir: &Path, disk: &Path) -> Result<()> {
    let used: u64 = run(Command::new("du").args(["-sb"]).arg(dir))?
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du -sb")?;
    let _ = fs::remove_file(disk);
    fs::File::create(disk)?.set_len(used + (64 << 20))?;
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-L", "wbshare", "-d"]).arg(dir).arg(disk))?;
    Ok(())
}

/// Boots `kernel` on the image with `share` as its second disk (and
/// `sticks`, if any, on a USB controller), echoing the serial console
/// unless `beside` (then qemu runs under SCHED_IDLE, beside the host
/// tests, as vmtest's guest does); returns it once the guest powers off
/// (or at `timeout`).
/// The guest may reboot `reboots` times (the overlay lives as long as
/// qemu); a kernel panic (panic=-1 reboots at once) or one reboot more
/// ends the run.
pub fn boot(
    image: &Image,
    kernel: &Kernel,
    share: &Path,
    sticks: Option<&Sticks>,
    timeout: Duration,
    reboots: usize,
    beside: bool,
) -> Result<Vec<String>> {
    // The guest's writes to its root go to an overlay made here for this
    // boot (qemu's own snapshot=on overlay, in /var/tmp, was written
    // without O_DIRECT whatever the drive's cache mode: its fdinfo flags).
    let overlay = share.with_file_name("root-overlay.qcow2");
    let _ = fs::remove_file(&overlay);
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&image.disk)
        .arg(&overlay))?;
    let mut qemu = if beside {
        let mut c = Command::new("chrt");
        c.args(["--idle", "0", "timeout"]);
        c
    } else {
        Command::new("timeout")
    };
    let mut qemu = qemu
        .args(["--signal=KILL", &timeout.as_secs().to_string(), "qemu-system-x86_64"])
        .args(["-m", "2G", "-smp", "2", "-accel", "tcg,thread=multi", "-cpu", "max"])
        // No network: the test must not need one (and no iPXE ROM to run).
        .args(["-nographic", "-nic", "none", "-kernel"])
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&kernel.initrd)
        .arg("-append")
        // systemd 252 mounts cgroup2 alone by default; saying so keeps it so.
        .arg(
            "root=/dev/vda rw console=ttyS0 panic=-1 quiet systemd.unified_cgroup_hierarchy=1 \
             systemd.unit=wb-systest.target systemd.show_status=error",
        )
        .arg("-drive")
        // cache.direct: the overlay, like the sticks, bypasses the host's
        // page cache (O_DIRECT), so that a guest beside the host tests
        // dirties none of the pages their daemons measure and stream.
        .arg(format!("file={},if=virtio,format=qcow2,cache.direct=on,cache.no-flush=on", overlay.display()))
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw,readonly=on", share.display()))
        .args(sticks.map(Sticks::qemu_args).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu")?;
    let pid = qemu.id() as i32;
    let log = console(&mut qemu, |line, log| {
        if !beside {
            println!("{line}");
        }
        if let Some(Err(e)) = sticks.map(|s| s.relay(line)) {
            println!("sticks: {e:#}");
        }
        let restarts = log.iter().filter(|l| l.contains(RESTART)).count();
        if line.contains(PANIC) || restarts > reboots {
            // timeout passes SIGTERM on to qemu.
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    });
    let _ = fs::remove_file(&overlay);
    log
}

/// Reads a started qemu's serial console (its stdout) line by line, each
/// shown to `each` with the lines before it, until qemu exits; returns the
/// lines.  A livelocked guest is stopped: SIGTERM to `qemu` (`timeout`,
/// which passes it on to qemu).
pub fn console(qemu: &mut Child, mut each: impl FnMut(&str, &[String])) -> Result<Vec<String>> {
    let mut log = Vec::new();
    let mut stopped = false;
    for line in BufReader::new(qemu.stdout.take().context("qemu's stdout")?).lines() {
        // The firmware's screen control codes are noise in a CI log.
        let clean: String = line?.chars().filter(|c| !c.is_control() || *c == '\t').collect();
        if !stopped && livelocked(&clean) {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(qemu.id() as i32, libc::SIGTERM) };
            stopped = true;
        }
        each(&clean, &log);
        log.push(clean);
    }
    qemu.wait()?;
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::{crashed_booting, retry_reason};

    fn log(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn a_panic_counts_as_a_crashed_boot_only_before_the_tests_lines() {
        // The 6.12 CI run that oopsed while booting, abridged.
        let ci = log(&[
            "[   14.6] sh[296]: systest: kernel 6.12.117+deb12-amd64",
            "[   34.1] sh[287]: systest: exit 100",
            "[   38.2] reboot: Restarting system",
            "[    3.2] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI",
            "[    3.2] Kernel panic - not syncing: Fatal exception in interrupt",
        ]);
        assert!(crashed_booting(&ci, "systest: "));
        let ours = log(&["[   14.6] sh[296]: systest: kernel 6.12", "[   20.0] Kernel panic - not syncing: oops"]);
        assert!(!crashed_booting(&ours, "systest: "));
        let no_panic = log(&["[   38.2] reboot: Restarting system", "SeaBIOS"]);
        assert!(!crashed_booting(&no_panic, "systest: "));
    }

    #[test]
    fn an_int3_oops_is_retried_at_any_time_another_oops_is_not() {
        // The 7.2 systest that oopsed after kill -9, abridged.
        let patched = log(&[
            "[   83.9] sh[307]: systest: PASS paced-before-kill",
            "[   87.0] Oops: int3: 0000 [#1] SMP NOPTI",
            "[   87.0] RIP: 0010:__folio_mark_dirty+0x65/0x2e0",
            "[   87.1] Kernel panic - not syncing: Fatal exception in interrupt",
        ]);
        assert!(retry_reason(&patched, "systest: ").is_some_and(|r| r.contains("int3")));
        let ours = log(&[
            "[   83.9] sh[307]: systest: PASS paced-before-kill",
            "[   87.0] BUG: kernel NULL pointer dereference, address: 0000000000000000",
            "[   87.1] Kernel panic - not syncing: Fatal exception",
        ]);
        assert_eq!(retry_reason(&ours, "systest: "), None);
    }

    #[test]
    fn a_vcpu_stuck_for_minutes_is_retried_a_short_stall_is_not() {
        // The 5.10 CI run that livelocked, abridged.
        let stuck = |secs: u32| {
            format!("[  {secs}.1] watchdog: BUG: soft lockup - CPU#1 stuck for {secs}s! [writebehindd:412]")
        };
        let livelock = log(&[&stuck(22), &stuck(48), &stuck(127)]);
        assert!(retry_reason(&livelock, "vmtest: ").is_some_and(|r| r.contains("livelocked")));
        assert_eq!(retry_reason(&log(&[&stuck(22), &stuck(48)]), "vmtest: "), None);
        assert!(!super::livelocked("soft lockup - CPU#0 stuck for many seconds"));
    }
}
