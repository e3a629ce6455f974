//! `cargo xtask systest [--quick] [--kernel V[,V...]]`: writebehindd as a
//! system service with systemd as PID 1, on each of Debian's stock kernels
//! under qemu (TCG: KVM here cannot run them): 5.10 and 6.1 on Debian 12,
//! 6.12 and 7.2 on Debian 13 (guest::ROOTS).
//!
//! The guest images come from guest.rs (cached); the test itself,
//! xtask/guest/systest.sh, and what it installs go on a second disk, so
//! changing either does not rebuild the image.  It installs the .deb with
//! apt from the local file (`cargo xtask deb`'s, built now, or --deb FILE;
//! --no-deb copies the debug binaries and the unit instead, without a
//! release build), then checks the service's life: enable --now,
//! READY, the fentry backend; after a reboot, that it started at boot (and
//! how long after the kernel), no watchdog restart over WATCH seconds, the
//! journal's decisions, kill -9 (restart, knobs back, a file written across
//! it intact), the security exposure score, purge.  Then USB sticks
//! (xtask/guest/usb.sh): vfat, exFAT and ntfs3 on a write-throttled
//! usb-storage device, copied with cp, cp -r, rsync and gio, with the kernel
//! default and with the daemon; surprise removal; a stick plugged in while
//! the daemon runs; a writer to another disk while the stick is paced.
//! In the full run, a real PostgreSQL (xtask/guest/db.sh) runs pgbench on
//! the stick beside a copy, with the kernel default, the root policy and
//! `mode = "off"` for the database; its image is the root with Debian's
//! postgresql (built only for it).  Then NFS (xtask/guest/nfs.sh): the
//! guest exports a disk of its own with Debian's nfs-kernel-server and
//! mounts it over `lo` shaped with netem (30 MiB/s, 4 ms; 110 MiB/s,
//! 0.2 ms), 4.2 and 3; a desktop user's copies with the kernel default and
//! with the daemon (close after the last write, stat, ls -l and another
//! writer's fsync beside the copy, the total to sync, dirty and writeback
//! of the client and of the server's disk, WRITE and COMMIT counts); a
//! server that stops answering mid-copy.  The quick run has one NFS copy
//! each way (128 MiB) on the newest kernel only: 51 s on 7.2.  `--only usb`, `--only db` or
//! `--only nfs` skips the second boot's other checks.  The quick run copies
//! to the sticks with the kernel default on the newest kernel only (77 s a
//! kernel); `--default-everywhere` does so on each, for a side-by-side per
//! kernel.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::ArgAction::Set;

use crate::guest::{self, kernels};

const SCRIPT: &str = include_str!("../guest/systest.sh");
const USB_SCRIPT: &str = include_str!("../guest/usb.sh");
const DB_SCRIPT: &str = include_str!("../guest/db.sh");
const NFS_SCRIPT: &str = include_str!("../guest/nfs.sh");
/// The sticks: sparse images, big enough for the full run's copies.
const STICK_SIZE: u64 = 4 << 30;
/// A USB 2 stick's write bandwidth; the full run also throttles to 10 MiB/s.
const STICK_BPS: u64 = 30 << 20;
/// Seconds the service must keep its first process (the watchdog's
/// WatchdogSec is 10 s): the issue asks for a minute; without --quick, 5.
const WATCH_QUICK: u64 = 60;
const WATCH_FULL: u64 = 300;
/// One guest run, both boots to power-off (measured with --quick: about
/// 160-210 s per kernel, depending on the host's load; the full run
/// watches 4 minutes longer, and its NFS part alone, `--only nfs`, took
/// 985-998 s a kernel with both boots).
const TIMEOUT_QUICK: Duration = Duration::from_secs(12 * 60);
/// The kernels --quick boots (CI's): all but the oldest, which CI boots in
/// vmtest --quick (the compat BPF object, the fentry tests and the
/// tracepoint backend's lifecycle), so that each of CI's kernels is booted
/// once: 6.1, paced through the global limit (per-device knobs came in
/// 6.2), 6.12 and 7.2 per device, 7.2 with the NFS case.  All four here
/// and 5.10 and 7.2 in vmtest --quick made CI's run 63 min.  The full
/// systest boots all four.
const QUICK_KERNELS: &[&str] = &["6.1", "6.12", kernels::NEWEST];
/// Of those, what `cargo xtask test` boots beside the host tests once
/// vmtest's guest is done there (at idle priority, as that one): 6.12,
/// which goes from its boot checks to its sticks (LIFE_QUICK), 232 s alone.
/// The host tests take about 20 minutes and vmtest's guest about 15 of
/// them; the rest, after the host tests, took 27 minutes of a 49-minute CI
/// run with all three.  Its disks bypass the host's page cache
/// (guest::boot, guest::Sticks), which the host tests' daemons watch.
pub const QUICK_BESIDE: &[&str] = &["6.12"];
/// The quick run's kernels whose second boot checks the service's life
/// before the sticks: 6.1 (Debian 12, systemd 252, the global lever) and
/// the newest (Debian 13, systemd 257).  6.12 has the newest's Debian and
/// systemd, and its part of that took 126 s of a 425 s run: it goes from
/// the boot checks to its sticks (ntfs3 is built in 6.12 only).
const LIFE_QUICK: &[&str] = &["6.1", kernels::NEWEST];
/// The quick run's kernels that copy to the sticks: 6.1 (the global lever)
/// and 6.12 (the per-device lever, booted beside the host tests).  The
/// newest's sticks would repeat 6.12's lever, and took 160 s of its 520 s
/// run (measured beside four compiles); its quick run checks the service's
/// life and NFS.
const USB_QUICK: &[&str] = &["6.1", "6.12"];
const TIMEOUT_FULL: Duration = Duration::from_secs(60 * 60);

/// What the guest installs.
enum Payload {
    Deb(PathBuf),
    /// The debug writebehindd and wbctl and the unit, as `cargo xtask
    /// install` lays them out (/usr/local/bin, /etc/systemd/system).
    Files,
}

fn newest_deb() -> Result<Option<PathBuf>> {
    let Ok(dir) = fs::read_dir(guest::target_dir()?.join("deb")) else { return Ok(None) };
    let mut debs: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for e in dir {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "deb") {
            debs.push((fs::metadata(&p)?.modified()?, p));
        }
    }
    Ok(debs.into_iter().max().map(|d| d.1))
}

/// What runs in the second boot: everything, or one part (--only).
#[derive(Clone, Copy, PartialEq, Debug, clap::ValueEnum)]
pub enum Only {
    #[value(skip)]
    All,
    /// the USB sticks
    Usb,
    /// PostgreSQL beside a copy
    Db,
    /// NFS
    Nfs,
}

impl Only {
    /// The database beside a copy (db.sh): in the full run and --only db,
    /// never in the quick one (CI's images stay without PostgreSQL).
    fn db(self, quick: bool) -> bool {
        match self {
            Only::All => !quick,
            Only::Usb | Only::Nfs => false,
            Only::Db => true,
        }
    }

    /// The image with the full run's extras (guest::image): the database's,
    /// and Samba for the full NFS part's SMB copy.
    fn full_image(self, quick: bool) -> bool {
        self.db(quick) || (self == Only::Nfs && !quick)
    }
}

/// The copies' sources, made on the host: 200 MiB from the guest's
/// /dev/urandom took TCG about 20 s a kernel, which the host makes in well
/// under one.  `src.bin`, 96 MiB, for the service's checks; `big.bin` and
/// `photos/` for the sticks and NFS, photo-sized files as a camera's folder
/// holds: quick, 128 MiB and 16 files of 1-8 MiB; full, 512 MiB and 60 files
/// of 2-12 MiB.  Each file a little more than whole MiB, as photos are.
fn sources(dir: &Path, quick: bool) -> Result<()> {
    use std::io::{Read, Write};
    const MIB: u64 = 1 << 20;
    let (big_mib, photos, min_mib, max_mib) = if quick { (128, 16, 1, 8) } else { (512, 60, 2, 12) };
    fs::create_dir_all(dir.join("photos"))?;
    let mut urandom = fs::File::open("/dev/urandom")?;
    let mut random = |path: PathBuf, bytes: u64| -> Result<()> {
        let mut out = std::io::BufWriter::new(fs::File::create(&path)?);
        std::io::copy(&mut (&mut urandom).take(bytes), &mut out)?;
        out.flush()?;
        Ok(())
    };
    random(dir.join("src.bin"), 96 * MIB)?;
    random(dir.join("big.bin"), big_mib * MIB)?;
    // A fixed sequence of sizes (an LCG's), so that runs compare.
    let mut x: u64 = 1000;
    for i in 0..photos {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mib = min_mib + (x >> 33) % (max_mib - min_mib + 1);
        random(dir.join(format!("photos/IMG_{}.JPG", 1000 + i)), mib * MIB + (x >> 17) % 32768)?;
    }
    Ok(())
}

/// The second disk's contents: the script, its config, the payload.
fn share(dir: &Path, payload: &Payload, watch: u64, quick: bool, only: Only, default_on_all: bool) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    fs::write(dir.join("systest.sh"), SCRIPT)?;
    fs::write(dir.join("usb.sh"), USB_SCRIPT)?;
    fs::write(dir.join("db.sh"), DB_SCRIPT)?;
    fs::write(dir.join("nfs.sh"), NFS_SCRIPT)?;
    sources(&dir.join("sources"), quick)?;
    let usb = if quick { "quick" } else { "full" };
    let part = match only {
        Only::All => "",
        Only::Usb => "usb",
        Only::Db => "db",
        Only::Nfs => "nfs",
    };
    // NFS_ON: the kernel line (or all) that runs the NFS part; the quick
    // run's is the newest.
    let nfs_on = if quick && only != Only::Nfs { kernels::NEWEST } else { "all" };
    let life_on = if quick { LIFE_QUICK.join(" ") } else { "all".into() };
    let usb_on = if quick && only != Only::Usb { USB_QUICK.join(" ") } else { "all".into() };
    fs::write(
        dir.join("config"),
        format!(
            "WATCH={watch}\nUSB={usb}\nUSB_DEFAULT_ON={}\nONLY={part}\nDB={}\nSTICK_BPS={STICK_BPS}\nNFS={usb}\nNFS_ON={nfs_on}\nLIFE_ON=\"{life_on}\"\nUSB_ON=\"{usb_on}\"\n",
            // The default's copies are a comparison, checked only for exit
            // status and contents: 77 s a kernel, none in the quick run.
            if quick && !default_on_all { "none" } else { "all" },
            only.db(quick) as u8
        ),
    )?;
    match payload {
        Payload::Deb(deb) => {
            fs::copy(deb, dir.join("writebehindd.deb")).with_context(|| format!("{}", deb.display()))?;
        }
        Payload::Files => {
            let files = dir.join("files");
            fs::create_dir_all(&files)?;
            let debug = guest::target_dir()?.join("debug");
            for bin in ["writebehindd", "wbctl"] {
                fs::copy(debug.join(bin), files.join(bin))?;
            }
            fs::copy("systemd/writebehindd.service", files.join("writebehindd.service"))?;
        }
    }
    Ok(())
}

/// One kernel's results, from the serial log.
struct Outcome {
    kernel: String,
    secs: f64,
    exit: Option<i32>,
    lines: Vec<String>,
}

fn results(log: &[String]) -> (Option<i32>, Vec<String>) {
    let mut exit = None;
    let mut lines = Vec::new();
    for l in log {
        let Some((_, r)) = l.split_once("systest: ") else { continue };
        if let Some(rc) = r.strip_prefix("exit ") {
            // 100: the first boot's part is done, the guest reboots.
            exit = rc.trim().parse().ok().filter(|rc| *rc != 100);
        } else if ["PASS", "FAIL", "SKIP", "MEASURE"].iter().any(|k| r.starts_with(k)) {
            lines.push(r.to_owned());
        }
    }
    (exit, lines)
}

/// the service under systemd (PID 1) on each stock kernel under qemu
///
/// The service under systemd (PID 1) on each stock kernel under qemu, 5.10 and
/// 6.1 in a Debian 12 guest, 6.12 and 7.2 in a Debian 13 one, built with
/// mmdebstrap (cached in target/guest; --images: only build them):
/// apt install of the .deb (built first; --no-deb: debug binaries + unit
/// copied), enable --now, READY, fentry, no watchdog restart, journal,
/// kill -9, security exposure, purge; USB sticks (vfat, exFAT, ntfs3 on a
/// throttled usb-storage device: cp, cp -r, rsync, gio against the kernel
/// default, surprise removal, hotplug); NFS over a shaped `lo`; without
/// --quick, PostgreSQL's pgbench on the stick beside a copy (its own image,
/// with postgresql).
#[derive(clap::Args, Debug, Default, PartialEq)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// the quick run (what `test` runs): 6.1, 6.12 and 7.2, a minute's watch, smaller copies
    #[arg(long)]
    pub quick: bool,
    /// these kernels only (5.10, 6.1, 6.12, 7.2)
    #[arg(long, value_name = "V[,V...]", value_delimiter = ',', action = Set,
          value_parser = crate::vmtest::kernel_line)]
    pub kernel: Option<Vec<&'static str>>,
    /// install this package instead of building one
    #[arg(long, value_name = "FILE", conflicts_with = "no_deb")]
    pub deb: Option<PathBuf>,
    /// copy the debug binaries and the unit instead of installing a package
    #[arg(long)]
    pub no_deb: bool,
    /// the second boot runs only this part
    #[arg(long, value_enum, value_name = "usb|db|nfs")]
    pub only: Option<Only>,
    /// the quick run's sticks copied with the kernel default too, on each kernel (else with the daemon only)
    #[arg(long)]
    pub default_everywhere: bool,
    /// only build (or find) the guests' images, booting nothing
    #[arg(long)]
    pub images: bool,
    /// booted beside the host tests (`cargo xtask test`): qemu at idle
    /// priority, its console kept to its summary
    #[arg(skip)]
    pub beside: bool,
}

/// The quick run's kernels but those booted beside the host tests.
pub fn quick_after_host_tests() -> Vec<&'static str> {
    QUICK_KERNELS.iter().copied().filter(|k| !QUICK_BESIDE.contains(k)).collect()
}

pub fn main(args: &Args) -> Result<()> {
    match prepare(args)? {
        Some(run) => run.boot(),
        None => Ok(()),
    }
}

/// A run made ready to boot: its package, sources and second disk written
/// (and flushed) now, so that a run beside the host tests writes nothing
/// through the host's page cache while they run.
pub struct Prepared {
    dir: PathBuf,
    disk: PathBuf,
    versions: Vec<&'static str>,
    quick: bool,
    only: Only,
    beside: bool,
}

/// The kernels' images (built if not cached), the package and the second
/// disk; None with --images, which only builds the images.
pub fn prepare(args: &Args) -> Result<Option<Prepared>> {
    let Args { quick, images: images_only, default_everywhere: default_on_all, .. } = *args;
    let only = args.only.unwrap_or(Only::All);
    let versions = args.kernel.clone().unwrap_or_else(|| match quick {
        true => QUICK_KERNELS.to_vec(),
        false => kernels::LINES.iter().map(|l| l.version).collect(),
    });
    guest::need("qemu-system-x86_64", "qemu-system-x86")?;
    guest::need("qemu-img", "qemu-utils")?;
    guest::need("mkfs.ext4", "e2fsprogs")?;
    if images_only {
        // Only build (or find) the kernels' roots, booting nothing.
        for v in &versions {
            let image = guest::image(guest::root_for(v)?, only.full_image(quick))?;
            println!("systest: {} boots {}", image.disk.display(), image.kernel(v)?.release);
        }
        return Ok(None);
    }
    let payload = match &args.deb {
        Some(d) => Payload::Deb(d.clone()),
        None if args.no_deb => {
            crate::cargo(&["build", "--workspace", "--bins"])?;
            Payload::Files
        }
        None => {
            crate::deb::main(&Default::default())?;
            Payload::Deb(newest_deb()?.context("cargo xtask deb left no target/deb/*.deb")?)
        }
    };
    // A run beside the host tests has its own directory: the one after
    // them makes its disks while it may still be booting.
    let dir = guest::target_dir()?.join(if args.beside { "guest/systest-beside" } else { "guest/systest" });
    share(&dir.join("share"), &payload, if quick { WATCH_QUICK } else { WATCH_FULL }, quick, only, default_on_all)?;
    let disk = dir.join("share.img");
    guest::disk_of(&dir.join("share"), &disk)?;
    // The sources and the disk written back before anything boots.
    guest::run(&mut std::process::Command::new("sync"))?;
    if let Payload::Deb(d) = &payload {
        println!("systest: installing {}", d.display());
    }
    Ok(Some(Prepared { dir, disk, versions, quick, only, beside: args.beside }))
}

impl Prepared {
    /// Boots each kernel in turn; the summary of all, an error if one failed.
    pub fn boot(self) -> Result<()> {
        let Prepared { dir, disk, versions, quick, only, beside } = self;
        let mut outcomes = Vec::new();
        for v in &versions {
            let image = guest::image(guest::root_for(v)?, only.full_image(quick))?;
            let kernel = image.kernel(v)?;
            println!("systest: booting {} under qemu (TCG)", kernel.release);
            let started = Instant::now();
            // One reboot: the test's first boot installs, the second checks the
            // service starts at boot.
            // Beside the host tests its pace is what they leave it.
            let timeout = match (quick, beside) {
                (true, false) => TIMEOUT_QUICK,
                (true, true) => 2 * TIMEOUT_QUICK,
                (false, _) => TIMEOUT_FULL,
            };
            let (log, retry) = guest::boot_retrying("systest: ", || {
                let sticks = guest::Sticks::new(&dir.join("sticks"), STICK_SIZE, STICK_BPS)?;
                guest::boot(&image, &kernel, &disk, Some(&sticks), timeout, 1, beside)
            })?;
            let (exit, mut lines) = results(&log);
            if let Some(reason) = retry {
                lines.push(format!("MEASURE retried: {reason}"));
            }
            // Each kernel's time as it ends, as vmtest prints it: the summary
            // below is not reached if a later kernel's guest cannot be started.
            let secs = started.elapsed().as_secs_f64();
            println!("systest: {}: {secs:.0} s", kernel.release);
            outcomes.push(Outcome { kernel: kernel.release, secs, exit, lines });
        }
        let _ = fs::remove_file(&disk);
        let _ = fs::remove_dir_all(dir.join("sticks"));

        println!("\nsystest: summary");
        let mut ok = true;
        for o in &outcomes {
            let passed = o.lines.iter().filter(|l| l.starts_with("PASS")).count();
            let status = match o.exit {
                Some(rc) => format!("exit {rc}"),
                None => "no exit: crashed or timed out".into(),
            };
            println!("  {}: {passed} checks passed, {:.0} s, {status}", o.kernel, o.secs);
            for l in o.lines.iter().filter(|l| !l.starts_with("PASS")) {
                println!("    {l}");
            }
            ok &= o.exit == Some(0);
        }
        if !ok {
            bail!("the system test failed (or the guest stopped without reporting)");
        }
        Ok(())
    }
}
