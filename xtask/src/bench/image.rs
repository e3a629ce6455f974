//! `image`: an image written to a block device through its node, with
//! nothing mounted on it (`dd of=/dev/sdb`, `cat image > /dev/sdb`, `pv`,
//! `cp image /dev/sdb`).  The writes land in the device's page cache and
//! its last close writes them all back, so with the kernel default the
//! writer's close() takes as long as the device needs for the image (17 s
//! for 512 MiB at 30 MiB/s).  Each run measures the writes, the close (from
//! the moment the writer has written the whole image, its /proc/PID/io
//! wchar, to its exit), the peak dirty + writeback, and what the device had
//! written (its own sectors counter) when the writer exited: the whole
//! image, with or without the daemon.

use std::{
    fs::File,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use wb_tests::{LoopDevice, MIB, Sampler, random_file};

use super::{
    Plan, RAW,
    modes::{self, Mode},
    rate_tag,
    report::{self, Run},
    scenarios::Metrics,
};

/// The writers of an image a user runs: dd (quiet, and with its progress
/// line), a shell's redirection of cat and of pv, and cp.
pub const TOOLS: [&str; 5] = ["dd", "dd-progress", "cat", "pv", "cp"];

/// The writer, spawned with the device open for writing where the shell
/// would open it (`> /dev/sdb`): this process's copy of that descriptor is
/// closed as soon as the writer has its own, so the writer's close is the
/// device's last.
fn spawn(tool: &str, src: &Path, dev: &Path) -> Result<Child> {
    let redirected = |program: &str, args: &[&str]| -> Result<Command> {
        let mut c = Command::new(program);
        c.args(args).arg(src).stdout(File::options().write(true).open(dev)?);
        Ok(c)
    };
    let (of, input) = (format!("of={}", dev.display()), format!("if={}", src.display()));
    let mut cmd = match tool {
        "dd" => {
            let mut c = Command::new("dd");
            c.args([&input, &of, "bs=4M", "status=none"]);
            c
        }
        "dd-progress" => {
            let mut c = Command::new("dd");
            c.args([&input, &of, "bs=4M", "status=progress"]);
            c
        }
        "cat" => redirected("cat", &[])?,
        "pv" => redirected("pv", &["-q"])?,
        "cp" => {
            let mut c = Command::new("cp");
            c.arg(src).arg(dev);
            c
        }
        other => bail!("no image writer {other:?} ({})", TOOLS.join(", ")),
    };
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    if !matches!(tool, "cat" | "pv") {
        cmd.stdout(Stdio::null());
    }
    let child = cmd.spawn().with_context(|| format!("spawning {tool}"))?;
    drop(cmd);
    Ok(child)
}

/// Bytes the process has passed to write(2) and its kin so far.
fn wchar(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("wchar: ")).and_then(|v| v.trim().parse().ok())
}

/// What one writer's image to the device measured.
fn write_once(device: &LoopDevice, tool: &str, src: &Path, bytes: u64) -> Result<Metrics> {
    wb_tests::sh("sync")?;
    // udev's probe of a device just closed holds it open a moment (where
    // there is a udev): the writer's close must be the device's last.
    let _ = Command::new("udevadm").arg("settle").status();
    let before = device.bytes_written()?;
    let sampler = Sampler::every(&device.bdi()?, Duration::from_millis(20))?;
    let t0 = Instant::now();
    let mut child = spawn(tool, src, &device.dev)?;
    let pid = child.id();
    let mut written_all = None;
    let status = loop {
        if written_all.is_none() && wchar(pid).is_some_and(|w| w >= bytes) {
            written_all = Some(t0.elapsed());
        }
        if let Some(st) = child.try_wait()? {
            break st;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let total = t0.elapsed();
    let at_close = device.bytes_written()? - before;
    let peak = sampler.finish();
    if !status.success() {
        bail!("{tool} writing the image failed: {status}");
    }
    // Written so fast that the poll missed the moment: the writes took
    // the whole run.
    let writes = written_all.unwrap_or(total);
    let secs = |d: Duration| d.as_secs_f64();
    Ok(vec![
        ("writes s", secs(writes)),
        ("close s", secs(total.saturating_sub(writes))),
        ("total s", secs(total)),
        ("peak MiB", peak.dirty_wb as f64 / MIB as f64),
        ("at close MiB", at_close as f64 / MIB as f64),
    ])
}

/// The modes that apply to a program's writes to a device: not the bench's
/// in-application writers (Linus's loop, RWF_DONTCACHE), nor strict_limit
/// on the raw device (its limit is a second of the cap).
fn modes_of(plan: &Plan, rate_mib: u64) -> Vec<Mode> {
    super::modes_at(plan, rate_mib).into_iter().filter(|m| m.flavor().is_none()).collect()
}

pub(super) fn bench(plan: &Plan, shm: &Path, daemon: &Path, runs: &mut Vec<Run>) -> Result<()> {
    let mib = plan.image.mib;
    let src = shm.join(format!("image-{mib}.img"));
    random_file(&src, mib * MIB, 47)?;
    for &rate_mib in &plan.image.rates {
        let device = match rate_mib {
            RAW => LoopDevice::uncapped(mib + 16)?,
            r => LoopDevice::throttled(mib + 16, r * MIB)?,
        };
        let bdi = device.bdi()?;
        for tool in &plan.image.tools {
            let group = format!("image {mib} MiB {tool} {}", rate_tag(rate_mib));
            let started = Instant::now();
            for _ in 0..super::runs_at(plan, rate_mib) {
                for mode in modes_of(plan, rate_mib) {
                    modes::wait_alone()?;
                    let active = modes::activate(mode, &bdi, rate_mib * MIB, daemon)?;
                    let metrics = write_once(&device, tool, &src, mib * MIB);
                    active.stop()?;
                    runs.push(Run::new(&group, &mode.name(), &metrics?, &[]));
                }
            }
            print!("{}", report::table(runs, &group));
            println!(
                "({} run(s) per mode in {:.0} s)",
                super::runs_at(plan, rate_mib),
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// What the image scenario writes, and where.
#[derive(Debug, Clone)]
pub struct ImageSizes {
    pub mib: u64,
    pub tools: Vec<String>,
    /// MiB/s caps and RAW.
    pub rates: Vec<u64>,
}

impl ImageSizes {
    /// The figures: 512 MiB at 30 and 10 MiB/s and on the raw
    /// device, every writer.
    pub fn full() -> Self {
        Self { mib: 512, tools: TOOLS.map(String::from).to_vec(), rates: vec![30, 10, RAW] }
    }

    /// dd's 4 MiB writes and cat's 128 KiB ones, 256 MiB (the default's
    /// close about 8.5 s at 30 MiB/s).
    pub fn quick() -> Self {
        Self { mib: 256, tools: vec!["dd".into(), "cat".into()], rates: vec![30, RAW] }
    }

    pub fn smoke() -> Self {
        Self { mib: 32, tools: vec!["dd".into()], rates: vec![30] }
    }
}

/// Seconds the scenario takes: each run the image at the device's rate
/// (both modes write it and wait for it) and 3 s for the daemon and sync.
pub(super) fn estimate_secs(plan: &Plan) -> f64 {
    let i = &plan.image;
    let per_run = |rate: u64| if rate == RAW { 3.0 } else { i.mib as f64 / rate as f64 + 3.0 };
    let runs = |rate: u64| (modes_of(plan, rate).len() as u32 * super::runs_at(plan, rate)) as f64;
    i.rates.iter().map(|&r| per_run(r) * runs(r) * i.tools.len() as f64).sum()
}
