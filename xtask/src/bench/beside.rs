//! `beside`: what pacing a slow device costs the writers of a fast one.
//! The bench's device is the slow one (a USB stick at `--rates 30`), fed by
//! a stream faster than it; a second device, capped at FAST_RATE, takes a
//! 1 GiB write and its fsync twice (the first after the mode started, then
//! once more), then 8 MiB bursts a quarter second apart, each its own `dd`
//! and below the burst allowance, so never a stream.  writebehindd runs on
//! both levers: the per-device one this kernel has, and the global
//! vm.dirty_bytes that kernels before 6.2 get (`--pacing-lever global`).

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Result;
use wb_tests::{Background, LoopDevice, MIB, Mounted, Sampler, fio_write_fsync, run, sh};

use super::{
    modes::{self, Mode},
    probes,
    report::{self, Run},
    scenarios::{Ctx, Metrics},
};

/// The fast disk: an SSD's order of magnitude, and a figure this VM's
/// loop devices reach steadily (uncapped they ran at 200-1300 MiB/s).
const FAST_RATE: u64 = 400 * MIB;
const WRITE_MIB: u64 = 1024;
const BURSTS: u32 = 24;
const BURST_MIB: u64 = 8;
/// The slow device's feed: faster than any rate the bench gives it.
const FEED: &str = "150m";

pub fn bench(ctx: &Ctx, modes: &[Mode], runs: u32, daemon: &Path, tag: &str, out: &mut Vec<Run>) -> Result<()> {
    let fast = Mounted::new(LoopDevice::throttled(WRITE_MIB * 3, FAST_RATE)?, "ext4")?;
    let group = format!("beside {tag}, a {} MiB/s disk's writers", FAST_RATE / MIB);
    for _ in 0..runs {
        for &mode in modes {
            let levers: &[Option<&str>] =
                if matches!(mode, Mode::Writebehindd(_)) { &[None, Some("global")] } else { &[None] };
            for &lever in levers {
                let args: Vec<&str> = lever.map(|l| vec!["--pacing-lever", l]).unwrap_or_default();
                let active = modes::activate_with(mode, &ctx.fs.bdi()?, ctx.rate, daemon, None, &args)?;
                let metrics = one(ctx, &fast)?;
                active.stop()?;
                let name = match lever {
                    Some(l) => format!("{} ({l} lever)", mode.name()),
                    None => mode.name(),
                };
                out.push(Run::new(&group, &name, &metrics, &[]));
            }
        }
    }
    print!("{}", report::table(out, &group));
    Ok(())
}

fn one(ctx: &Ctx, fast: &Mounted) -> Result<Metrics> {
    let stick = ctx.clean("beside")?;
    let sampler = Sampler::start(&ctx.fs.bdi()?)?;
    let _feed = Background::sh(&format!("head -c 1G /dev/zero | pv -qL {FEED} > {}", stick.display()))?;
    // Long enough for the daemon to pace the slow device.
    std::thread::sleep(Duration::from_secs(2));
    let (first, _) = write_and_fsync(fast)?;
    let (again, longest) = write_and_fsync(fast)?;
    let (p50, _, max) = bursts(fast)?;
    let stick_peak = sampler.finish();
    drop(_feed);
    // Unlinked, its dirty pages go without being written.
    std::fs::remove_file(&stick)?;
    sh("sync")?;
    Ok(vec![
        ("first write MiB/s", first),
        ("write MiB/s", again),
        ("longest write ms", longest),
        ("burst p50 ms", p50),
        ("burst max ms", max),
        ("slow peak MiB", stick_peak.dirty_wb as f64 / MIB as f64),
    ])
}

/// A WRITE_MIB write and its fsync (fio): MiB/s and the longest write()
/// in ms; the file is removed after it.
fn write_and_fsync(fast: &Mounted) -> Result<(f64, f64)> {
    let file = fast.path("write");
    let measured = fio_write_fsync(&file, WRITE_MIB)?;
    std::fs::remove_file(&file)?;
    sh(&format!("sync -f {}", fast.dir.display()))?;
    Ok(measured)
}

/// BURSTS files of BURST_MIB, each by its own dd: ms each took.
fn bursts(fast: &Mounted) -> Result<(f64, f64, f64)> {
    let mut took = Vec::new();
    for i in 0..BURSTS {
        let t = Instant::now();
        run(Command::new("dd").args([
            "if=/dev/zero",
            &format!("of={}", fast.path(&format!("burst{i}")).display()),
            "bs=1M",
            &format!("count={BURST_MIB}"),
            "status=none",
        ]))?;
        took.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(250));
    }
    for i in 0..BURSTS {
        std::fs::remove_file(fast.path(&format!("burst{i}")))?;
    }
    Ok(probes::percentiles(took))
}
