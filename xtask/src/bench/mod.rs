//! `cargo xtask bench`: write-behind measured against the alternatives a user
//! would pick instead, side by side in one run, on a bandwidth-capped device
//! and on the raw one (the same stacked loop devices uncapped: the machine's
//! disk, 2.8 GB/s of O_DIRECT writes here, where a user's NVMe or SATA SSD
//! drains at 0.5–7 GB/s).  On the raw device the kernel default's own time
//! varied 3× between runs of the same work, so it runs more times (five in
//! the full bench), the modes interleaved, and reports medians with their
//! spread and the CPU each run cost: the agent's, the machine's, the
//! writers'.

mod args;
mod beside;
mod check;
mod cost;
mod db;
mod image;
pub(crate) mod modes;
mod probes;
mod report;
pub(crate) mod scenarios;
mod socket;
pub mod writer;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use wb_tests::{Knob, LoopDevice, MIB, Mounted, Scratch, device::Debugfs};

pub use args::Args;
use modes::Mode;
use report::Run;
use scenarios::{Ctx, Sizes};

struct Plan {
    sizes: Sizes,
    /// Sizes on the raw device.
    raw_sizes: Sizes,
    fs: Vec<String>,
    /// MiB/s caps; RAW is the uncapped device.
    rates: Vec<u64>,
    runs: u32,
    /// Runs per mode on the raw device.
    raw_runs: u32,
    scenarios: Vec<String>,
    modes: Vec<Mode>,
    out: PathBuf,
    /// copy files at the slow rate (fewer, to bound the run time)
    slow_copy_files: u32,
    cost: cost::CostSizes,
    /// cost's parts to run (--parts)
    cost_parts: Vec<String>,
    /// The image written to a device node, its writers and rates.
    image: image::ImageSizes,
    /// --check: compare with the baseline once run.
    check: Option<check::Baseline>,
}

/// What the bench runs on, unless --fs says otherwise: btrfs as mkfs makes
/// it and as Fedora mounts it (compress=zstd:1).
const FILESYSTEMS: [&str; 4] = ["ext4", "xfs", "btrfs", "btrfs-zstd"];

const SCENARIOS: [&str; 11] =
    ["copy", "tar", "multi", "many", "overwrite", "tempfile", "image", "overhead", "cost", "db", "beside"];
/// Left out of --quick and --smoke unless --only names them: a cluster and
/// pgbench's tables per run and mode are more than a quick look needs.
const FULL_ONLY: [&str; 2] = ["db", "beside"];

/// The rate that stands for the raw device: no cap.
pub(crate) const RAW: u64 = 0;
/// What runs on the raw device: the workloads a fast disk's user meets.
const RAW_SCENARIOS: [&str; 4] = ["copy", "tar", "multi", "many"];
/// Runs per mode on the raw device in --quick (and so --check): a median
/// of three, not five.  With three, the raw part of --check took 64 s on
/// three filesystems (16–19 s of runs and 3 s of set-up each; the whole
/// check 231 s); five would add about 35 s, and the bands in
/// xtask/bench-baseline.json are of medians of three.
const QUICK_RAW_RUNS: u32 = 3;
/// The raw device's speed for the estimate: 2.8 GB/s of O_DIRECT writes here.
const RAW_MIBPS: f64 = 2700.0;

/// "100MiB/s", or "raw".
fn rate_tag(rate_mib: u64) -> String {
    match rate_mib {
        RAW => "raw".into(),
        r => format!("{r}MiB/s"),
    }
}

/// What a run does, from its options and, with --check, the baseline it
/// is compared with (whose filesystems it runs on unless --fs names some).
fn plan(args: &Args, check: Option<check::Baseline>) -> Result<Plan> {
    if args.check && !args.quick {
        bail!("--check compares quick runs: add --quick");
    }
    let full = Sizes {
        copy_files: 100,
        copy_max_mib: 64,
        tar_files: 20_000,
        tar_dd_mib: 1024,
        multi_writers: vec![1, 10, 30],
        multi_mib: 256,
        // The table (1.5 GiB in all but two), and the seed's 100 dd.
        many: vec![(1, 1536), (10, 154), (30, 51), (100, 24), (100, 15), (1000, 2)],
        overwrite_mib: 256,
        temp_files: 8,
        temp_mib: 64,
        read_probe_mib: 256,
        overhead_secs: 5.0,
    };
    // tar x of 30,000 files (the cost scenario's tarball count) beside the
    // 1 GiB dd, and 10 writers: what the first look at the raw device found
    // the daemon slower on (the tar 10-57 % on btrfs, the 10 writers held
    // near 1.5 GB/s).
    let raw_of = |s: &Sizes, tar_files: u32| Sizes { tar_files, multi_writers: vec![10], ..s.clone() };
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut plan = Plan {
        raw_sizes: raw_of(&full, 30_000),
        sizes: full,
        fs: FILESYSTEMS.iter().map(|f| f.to_string()).collect(),
        rates: vec![100, 30, RAW],
        runs: 3,
        raw_runs: 5,
        scenarios: SCENARIOS.iter().map(|s| s.to_string()).collect(),
        modes: modes::ALL.to_vec(),
        out: PathBuf::from(format!("target/bench/{stamp}")),
        slow_copy_files: 32,
        cost: cost::CostSizes::full(),
        cost_parts: cost::parts().into_iter().map(str::to_owned).collect(),
        image: image::ImageSizes::full(),
        check,
    };
    // --quick and --smoke first, whatever their place on the line: the
    // options below change what they set.
    if args.quick {
        plan.sizes = Sizes {
            copy_files: 30,
            tar_files: 2000,
            tar_dd_mib: 256,
            multi_writers: vec![1, 10],
            multi_mib: 64,
            // Beyond the burst allowance and within it.
            many: vec![(30, 24), (100, 8)],
            overwrite_mib: 64,
            temp_files: 4,
            temp_mib: 32,
            read_probe_mib: 64,
            overhead_secs: 2.0,
            ..plan.sizes
        };
        plan.raw_sizes = raw_of(&plan.sizes, plan.sizes.tar_files);
        plan.rates = vec![100, RAW];
        plan.runs = 1;
        plan.raw_runs = QUICK_RAW_RUNS;
        plan.cost = cost::CostSizes::quick();
        plan.image = image::ImageSizes::quick();
    }
    if args.smoke {
        plan.sizes = Sizes {
            copy_files: 4,
            copy_max_mib: 24,
            tar_files: 100,
            tar_dd_mib: 24,
            multi_writers: vec![2],
            multi_mib: 24,
            many: vec![(8, 2)],
            overwrite_mib: 24,
            temp_files: 2,
            temp_mib: 8,
            read_probe_mib: 16,
            overhead_secs: 0.3,
        };
        plan.raw_sizes = raw_of(&plan.sizes, plan.sizes.tar_files);
        plan.raw_sizes.multi_writers = vec![2];
        plan.fs = vec!["ext4".into()];
        plan.rates = vec![100, RAW];
        plan.runs = 1;
        plan.raw_runs = 1;
        plan.slow_copy_files = 4;
        plan.cost = cost::CostSizes::smoke();
        plan.image = image::ImageSizes::smoke();
    }
    let reduced = args.quick || args.smoke;
    if let Some(only) = &args.only {
        plan.scenarios = only.clone();
    }
    if let Some(parts) = &args.parts {
        plan.cost_parts = parts.clone();
    }
    if let Some(modes) = &args.modes {
        plan.modes = modes.clone();
    }
    if let Some(fs) = &args.fs {
        plan.fs = fs.clone();
    }
    if let Some(rates) = &args.rates {
        plan.rates = rates.clone();
        plan.image.rates = rates.clone();
    }
    if let Some(writers) = &args.writers {
        plan.sizes.multi_writers = writers.clone();
    }
    if let Some(out) = &args.out {
        plan.out = out.clone();
    }
    if reduced && args.only.is_none() {
        plan.scenarios.retain(|s| !FULL_ONLY.contains(&s.as_str()));
    }
    if args.writers.is_some() {
        plan.raw_sizes.multi_writers = plan.sizes.multi_writers.clone();
    }
    if let Some(n) = args.runs {
        (plan.runs, plan.raw_runs) = (n, n);
    }
    if let Some(base) = &plan.check {
        if args.fs.is_none() {
            plan.fs = base.fs.clone();
        }
        plan.scenarios = check::SCENARIOS.iter().map(|s| s.to_string()).collect();
        plan.modes = check::MODES.iter().map(|m| Mode::parse(m).expect("a known mode")).collect();
        // The bands were made from runs of exactly this.
        plan.rates = vec![100, RAW];
        (plan.runs, plan.raw_runs) = (1, QUICK_RAW_RUNS);
        plan.image = image::ImageSizes::quick();
    }
    Ok(plan)
}

/// Which scenarios run at a given rate: the slow (USB stick) rate runs only
/// the copy, which is what that case is about, and `beside`, which runs
/// only at the plan's slowest rate (the device paced beside a fast one);
/// the raw device runs copy, tar and multi.
fn scenarios_at(plan: &Plan, rate: u64) -> Vec<&str> {
    if rate == RAW {
        return plan.scenarios.iter().map(String::as_str).filter(|s| RAW_SCENARIOS.contains(s)).collect();
    }
    let capped = || plan.rates.iter().filter(|&&r| r != RAW);
    let slow = rate < 100 && capped().any(|&r| r >= 100);
    let slowest = capped().all(|&r| r >= rate);
    let device = |s: &&str| !matches!(*s, "overhead" | "cost" | "image");
    let here = |s: &&str| match *s {
        "beside" => slowest,
        other => !slow || other == "copy",
    };
    plan.scenarios.iter().map(String::as_str).filter(device).filter(here).collect()
}

/// Runs per mode at a rate.
fn runs_at(plan: &Plan, rate: u64) -> u32 {
    if rate == RAW { plan.raw_runs } else { plan.runs }
}

/// The modes that run at a rate: on the raw device all but strict_limit,
/// whose max_bytes is a second of the cap.
fn modes_at(plan: &Plan, rate: u64) -> Vec<Mode> {
    plan.modes.iter().copied().filter(|&m| rate != RAW || m != Mode::BdiStrict).collect()
}

/// A rough duration: every byte at the device rate, plus 30 % for syncs and
/// setup; on the raw device, where that is a second or two, 3 s per run
/// for the cleaning `rm` and `sync`, the daemon's start and stop.
fn estimate_secs(plan: &Plan) -> f64 {
    let mut secs = 0.0;
    for &rate in &plan.rates {
        let s = if rate == RAW { &plan.raw_sizes } else { &plan.sizes };
        let copy_files = if rate != RAW && rate < 100 { plan.slow_copy_files } else { s.copy_files };
        let mut bytes_at = 0.0;
        let mut runs = 0.0;
        let mibps = if rate == RAW { RAW_MIBPS } else { rate as f64 };
        for sc in scenarios_at(plan, rate) {
            let mib = match sc {
                "copy" => copy_files as f64 * s.copy_max_mib as f64 / 2.0,
                "tar" => s.tar_files as f64 * 0.075 + s.tar_dd_mib as f64,
                "multi" => s.multi_writers.iter().map(|&n| n as f64 * s.multi_mib as f64).sum(),
                "many" => s.many.iter().map(|&(n, mib)| n as f64 * mib as f64).sum(),
                "overwrite" => 2.0 * s.overwrite_mib as f64,
                "tempfile" => (s.temp_files as u64 * s.temp_mib) as f64,
                // pgbench's tables, twice (the load and its checkpoint),
                // and the copy, a second time for writebehindd's mode=off.
                "db" => {
                    let daemons = plan.modes.iter().filter(|m| matches!(m, Mode::Writebehindd(_))).count();
                    (copy_files as f64 * s.copy_max_mib as f64 / 2.0 + 320.0)
                        * (1.0 + daemons as f64 / plan.modes.len() as f64)
                }
                // About 25 s a run whatever the rate: two 1 GiB writes and
                // the bursts on the fast disk, the slow one fed meanwhile.
                "beside" => 25.0 * mibps,
                _ => 0.0,
            };
            bytes_at += mib / mibps;
            runs += match sc {
                "multi" => s.multi_writers.len() as f64,
                "many" => s.many.len() as f64,
                _ => 1.0,
            };
        }
        if runs == 0.0 {
            continue;
        }
        let fixed = if rate == RAW { 3.0 * runs } else { 0.0 };
        let per_mode = (bytes_at * 1.3 + fixed) * plan.fs.len() as f64 + 20.0;
        secs += per_mode * (modes_at(plan, rate).len() as u32 * runs_at(plan, rate)) as f64;
    }
    let cost = match plan.scenarios.iter().any(|s| s == "cost") {
        true => plan.cost.estimate_secs(cost_rate(plan), plan.runs),
        false => 0.0,
    };
    let image = match plan.scenarios.iter().any(|s| s == "image") {
        true => image::estimate_secs(plan),
        false => 0.0,
    };
    secs + cost + image
}

/// The cost scenario's cap: the plan's first, or 100 MiB/s if it names
/// only the raw device (cost compares with the capped figures).
fn cost_rate(plan: &Plan) -> u64 {
    plan.rates.iter().copied().find(|&r| r != RAW).unwrap_or(100)
}

pub fn main(args: &Args) -> Result<()> {
    if let Some(dirs) = &args.baseline {
        let made_on = format!("{}, {} quick runs as --check makes them", cost::daemon_source(), dirs.len());
        let old = check::load().ok();
        return check::save(&check::merge(check::make_baseline(dirs, &made_on)?, old));
    }
    if let Some(dir) = &args.check_results {
        return check::check(dir, &check::load()?);
    }
    let baseline = if args.check { Some(check::load()?) } else { None };
    let plan = plan(args, baseline)?;
    if unsafe { libc::geteuid() } != 0 {
        bail!("the bench makes loop devices, caps their rate and loads BPF: run it as root");
    }
    let daemon = match &args.daemon {
        Some(d) => std::fs::canonicalize(d).with_context(|| format!("--daemon {}", d.display()))?,
        None => {
            super::cargo(&["build", "--release", "-p", "writebehindd"])?;
            std::fs::canonicalize("target/release/writebehindd")?
        }
    };
    // Not current_exe(): `cargo xtask test` relinks target/debug/xtask while
    // this process runs it; /proc/self/exe is always this very binary.
    let xtask = PathBuf::from("/proc/self/exe");
    Knob::recover()?;
    let _debugfs = Debugfs::ensure()?;
    let _reporting = hold_freed_memory((plan.cost.copy_mib + 1024) * MIB)?;
    std::fs::create_dir_all(&plan.out)?;
    let rates: Vec<String> = plan.rates.iter().map(|&r| rate_tag(r)).collect();
    let raw = match plan.rates.contains(&RAW) {
        true => format!(" ({} on raw)", plan.raw_runs),
        false => String::new(),
    };
    println!(
        "bench: {} scenario(s) x {} mode(s) x {} run(s){raw} on {:?} at {}; expected about {:.0} min",
        plan.scenarios.len(),
        plan.modes.len(),
        plan.runs,
        plan.fs,
        rates.join(", "),
        estimate_secs(&plan) / 60.0
    );

    let shm = Scratch::new_in("/dev/shm", "bench")?;
    let mut runs: Vec<Run> = Vec::new();
    for fstype in &plan.fs {
        for &rate_mib in &plan.rates {
            if scenarios_at(&plan, rate_mib).is_empty() {
                continue;
            }
            bench_device(&plan, fstype, rate_mib, &shm.0, &daemon, &xtask, &mut runs)?;
        }
    }
    if plan.scenarios.iter().any(|s| s == "image") {
        image::bench(&plan, &shm.0, &daemon, &mut runs)?;
    }
    if plan.scenarios.iter().any(|s| s == "overhead") {
        overhead(&plan, &daemon, &mut runs)?;
    }
    if plan.scenarios.iter().any(|s| s == "cost") {
        cost::run(&plan, &daemon, &xtask, &mut runs)?;
    }
    report::write_json(&runs, &plan.out.join("results.json"))?;
    println!("\nresults: {}", plan.out.join("results.json").display());
    match &plan.check {
        Some(base) => check::check(&plan.out, base),
        None => Ok(()),
    }
}

/// Where free page reporting exists (a VM's balloon hands freed guest memory
/// back to the host), the next touch of a reported page faults in the host:
/// here a `cp` of 1 GiB into the page cache took 2.8-3.6 s of system CPU when
/// it started 5 s after the memory was freed and 0.34-0.41 s right after
/// (three runs each).  Every paced run lasts seconds and paid it; the kernel
/// default's short runs only sometimes, so writers' and the machine's CPU
/// compared noise.  Reporting is off while the bench runs (an order above the
/// largest reports nothing), and `bytes` of memory are touched once, so the
/// pages freed and reused next are the guest's own.
fn hold_freed_memory(bytes: u64) -> Result<Option<Knob>> {
    const ORDER: &str = "/sys/module/page_reporting/parameters/page_reporting_order";
    if !Path::new(ORDER).exists() {
        return Ok(None);
    }
    let knob = Knob::set(ORDER, "11")?;
    drop(std::hint::black_box(vec![1u8; bytes as usize]));
    Ok(Some(knob))
}

fn bench_device(
    plan: &Plan,
    fstype: &str,
    rate_mib: u64,
    shm: &Path,
    daemon: &Path,
    xtask: &Path,
    runs: &mut Vec<Run>,
) -> Result<()> {
    let set_up = std::time::Instant::now();
    let rate = rate_mib * MIB;
    let mut sizes = if rate_mib == RAW { plan.raw_sizes.clone() } else { plan.sizes.clone() };
    if rate_mib != RAW && rate_mib < 100 {
        sizes.copy_files = plan.slow_copy_files;
    }
    let (mkfs, options) = fs_spec(fstype)?;
    // Where the filesystem compresses, the copy is of data that compresses.
    let compressible = options.is_some();
    let (copy_src, copy_bytes, tarball) = scenarios::make_sources(shm, &sizes, compressible)?;
    let dev_mib = (copy_bytes / MIB + sizes.tar_files as u64 / 4 + sizes.tar_dd_mib) * 2 + 2048;
    let device = match rate_mib {
        RAW => LoopDevice::uncapped(dev_mib)?,
        _ => LoopDevice::throttled(dev_mib, rate)?,
    };
    let fs = Mounted::with_options(device, mkfs, options)?;
    println!("\n{fstype} {}: set up in {:.0} s", rate_tag(rate_mib), set_up.elapsed().as_secs_f64());
    probes::prepare_read_file(&fs.path("probe-read"), sizes.read_probe_mib)?;
    let ctx = Ctx { fs: &fs, rate, sizes: &sizes, xtask: xtask.to_owned(), copy_src, copy_bytes, tarball };

    let mut fs_modes = modes_at(plan, rate_mib);
    if fs_modes.contains(&Mode::DontCache) && !writer::dontcache_supported(&fs.dir)? {
        println!("\n{fstype}: no RWF_DONTCACHE here (EOPNOTSUPP); that mode is left out");
        fs_modes.retain(|&m| m != Mode::DontCache);
    }
    let tag = format!("{fstype} {}", rate_tag(rate_mib));
    for scenario in scenarios_at(plan, rate_mib) {
        if scenario == "db" {
            db::bench(&ctx, &fs_modes, plan.runs, daemon, &tag, runs)?;
            continue;
        }
        if scenario == "beside" {
            beside::bench(&ctx, &fs_modes, plan.runs, daemon, &tag, runs)?;
            continue;
        }
        // Writers at once and MiB each.
        let variants: Vec<Option<(u32, u64)>> = match scenario {
            "multi" => sizes.multi_writers.iter().map(|&n| Some((n, sizes.multi_mib))).collect(),
            "many" => sizes.many.iter().map(|&v| Some(v)).collect(),
            _ => vec![None],
        };
        for variant in variants {
            let group = match (scenario, variant) {
                ("copy", _) => format!("copy {:.1} GiB {tag}", copy_bytes as f64 / (1u64 << 30) as f64),
                (_, Some((n, mib))) => format!("{scenario} {n} x {mib} MiB {tag}"),
                _ => format!("{scenario} {tag}"),
            };
            let started = std::time::Instant::now();
            // Interleaved: default, daemon, default, daemon...
            for _ in 0..runs_at(plan, rate_mib) {
                for &mode in &fs_modes {
                    // A run that another writebehindd saw (it started and
                    // perhaps stopped meanwhile) is made again, up to twice.
                    for attempt in 0.. {
                        modes::wait_alone()?;
                        let active = modes::activate(mode, &fs.bdi()?, rate, daemon)?;
                        let seen = modes::LockSeen::now();
                        let agent = active.daemon().map(|d| d.pid());
                        let (metrics, series) = match (scenario, variant) {
                            ("copy", _) => scenarios::copy(&ctx, mode, agent)?,
                            ("tar", _) => (scenarios::tar(&ctx, mode, agent)?, vec![]),
                            ("multi", Some((n, _))) => (scenarios::multi(&ctx, mode, n, agent)?, vec![]),
                            ("many", Some((n, mib))) => {
                                let socket = active.daemon().map(|d| d.socket());
                                (scenarios::many(&ctx, mode, n, mib, agent.zip(socket.as_deref()))?, vec![])
                            }
                            ("overwrite", _) => (scenarios::overwrite(&ctx, mode)?, vec![]),
                            ("tempfile", _) => (scenarios::tempfile(&ctx, mode)?, vec![]),
                            _ => unreachable!("scenario list is checked in parse"),
                        };
                        let alone = modes::LockSeen::now() == seen;
                        active.stop()?;
                        if alone || attempt == 2 {
                            if !alone {
                                println!("({group}, {}: another writebehindd ran during the run; kept)", mode.name());
                            }
                            runs.push(Run::new(&group, &mode.name(), &metrics, &series));
                            break;
                        }
                        println!("({group}, {}: another writebehindd ran during the run; made again)", mode.name());
                    }
                }
            }
            print!("{}", report::table(runs, &group));
            println!("({} run(s) per mode in {:.0} s)", runs_at(plan, rate_mib), started.elapsed().as_secs_f64());
            if scenario == "copy" {
                let svg = plan.out.join(format!("{}.svg", group.replace([' ', '/'], "_")));
                report::plot(runs, &group, &svg)?;
                println!("plot: {}", svg.display());
            }
        }
    }
    Ok(())
}

/// The filesystem to make and its mount options, from a --fs name.
/// btrfs-zstd is btrfs as Fedora mounts it (compress=zstd:1).
fn fs_spec(name: &str) -> Result<(&'static str, Option<&'static str>)> {
    Ok(match name {
        "ext4" => ("ext4", None),
        "xfs" => ("xfs", None),
        "btrfs" => ("btrfs", None),
        "btrfs-zstd" => ("btrfs", Some("compress=zstd:1")),
        other => bail!("no filesystem {other:?} (ext4, xfs, btrfs, btrfs-zstd)"),
    })
}

/// The hook's cost where there is nothing to flush: only default vs daemon.
fn overhead(plan: &Plan, daemon: &Path, runs: &mut Vec<Run>) -> Result<()> {
    let group = "overhead: 4 KiB write() to tmpfs";
    for _ in 0..plan.runs {
        for mode in [Mode::Default, Mode::Writebehindd(None)] {
            if !plan.modes.contains(&mode) {
                continue;
            }
            modes::wait_alone()?;
            let active = modes::activate(mode, "", 0, daemon)?;
            let metrics = scenarios::overhead(plan.sizes.overhead_secs)?;
            active.stop()?;
            runs.push(Run::new(group, &mode.name(), &metrics, &[]));
        }
    }
    print!("{}", report::table(runs, group));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    #[command(args_override_self = true)]
    struct Bench {
        #[command(flatten)]
        args: Args,
    }

    fn plan(args: &[&str]) -> Plan {
        let args = Bench::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap().args;
        super::plan(&args, None).unwrap()
    }

    fn scenarios(args: &[&str]) -> Vec<String> {
        plan(args).scenarios
    }

    #[test]
    fn db_and_beside_run_in_the_full_bench_and_when_named_only() {
        for s in FULL_ONLY {
            assert!(scenarios(&[]).contains(&s.into()));
            assert!(!scenarios(&["--quick"]).contains(&s.into()));
            assert!(!scenarios(&["--smoke"]).contains(&s.into()));
            assert_eq!(scenarios(&["--quick", "--only", s]), [s]);
        }
    }

    #[test]
    fn the_raw_device_runs_copy_tar_multi_and_many_more_times() {
        let p = plan(&["--rates", "100,raw"]);
        assert_eq!(p.rates, [100, RAW]);
        assert_eq!(scenarios_at(&p, RAW), ["copy", "tar", "multi", "many"]);
        assert_eq!(p.sizes.many.iter().map(|m| m.0).max(), Some(1000), "up to a thousand writers");
        assert_eq!(plan(&["--quick"]).sizes.many, [(30, 24), (100, 8)], "beyond the burst and within it");
        assert_eq!((runs_at(&p, 100), runs_at(&p, RAW)), (3, 5));
        assert_eq!(p.raw_sizes.multi_writers, [10]);
        assert_eq!(p.raw_sizes.tar_files, 30_000);
        assert!(!modes_at(&p, RAW).contains(&Mode::BdiStrict) && modes_at(&p, 100).contains(&Mode::BdiStrict));
        assert_eq!(rate_tag(RAW), "raw");
        assert_eq!(plan(&["--rates", "0"]).rates, [RAW]);
        let q = plan(&["--quick", "--runs", "2", "--writers", "4"]);
        assert_eq!((q.rates.as_slice(), q.runs, q.raw_runs), (&[100, RAW][..], 2, 2));
        assert_eq!(q.raw_sizes.multi_writers, [4]);
        // raw does not count as the slowest rate.
        let b = plan(&["--only", "copy,beside", "--rates", "100,30,raw"]);
        assert_eq!(scenarios_at(&b, 30), ["copy", "beside"]);
        assert_eq!(scenarios_at(&b, RAW), ["copy"]);
        assert_eq!(cost_rate(&plan(&["--rates", "raw"])), 100);
    }

    #[test]
    fn quick_and_smoke_set_what_the_other_options_change_wherever_they_stand() {
        let q = plan(&["--writers", "4", "--rates", "30", "--quick"]);
        assert_eq!((q.sizes.multi_writers.as_slice(), q.raw_sizes.multi_writers.as_slice()), (&[4][..], &[4][..]));
        assert_eq!((q.rates.as_slice(), q.runs), (&[30][..], 1));
        let s = plan(&["--fs", "xfs", "--smoke"]);
        assert_eq!((s.fs.as_slice(), s.sizes.copy_files), (&["xfs".to_owned()][..], 4));
        assert_eq!(plan(&["--runs", "2", "--runs", "4"]).runs, 4);
        assert_eq!(plan(&["--only", "tar", "--only", "copy"]).scenarios, ["copy"]);
    }

    #[test]
    fn check_needs_quick() {
        let args = Bench::try_parse_from(["bench", "--check"]).unwrap().args;
        let e = super::plan(&args, None).err().unwrap();
        assert_eq!(e.to_string(), "--check compares quick runs: add --quick");
    }

    #[test]
    fn the_image_runs_on_its_own_devices_at_the_sticks_rates() {
        let full = plan(&[]);
        assert_eq!((full.image.mib, full.image.rates.as_slice(), full.image.tools.len()), (512, &[30, 10, RAW][..], 5));
        let quick = plan(&["--quick"]);
        assert_eq!((quick.image.mib, quick.image.rates.as_slice()), (256, &[30, RAW][..]));
        assert_eq!(quick.image.tools, ["dd", "cat"]);
        assert_eq!(plan(&["--quick", "--rates", "10"]).image.rates, [10]);
        // Not a filesystem's scenario: no device of its own per --fs.
        let only = plan(&["--only", "image"]);
        assert!(scenarios_at(&only, 100).is_empty() && scenarios_at(&only, RAW).is_empty());
        assert!(estimate_secs(&only) > 0.0);
        let smoke = plan(&["--smoke"]);
        assert!(smoke.scenarios.contains(&"image".to_owned()) && smoke.image.rates == [30]);
    }

    #[test]
    fn beside_runs_at_the_slowest_rate_only() {
        let plan = plan(&["--only", "copy,beside", "--rates", "100,30"]);
        assert_eq!(scenarios_at(&plan, 100), ["copy"]);
        assert_eq!(scenarios_at(&plan, 30), ["copy", "beside"]);
    }
}
