//! `cargo xtask bench`'s command line: its options, their help, and the
//! parsers that check each value as it is read.  What they add up to (the
//! sizes, rates and runs of a plan) is `super::plan`.

use std::path::PathBuf;

use clap::ArgAction::Set;

use super::{RAW, SCENARIOS, cost, fs_spec, modes::Mode};

/// measure write-behind against the alternatives, side by side with the kernel default
///
/// Runs each scenario once per mode and run, on a loop device whose writes are
/// capped by the root blkio cgroup, and prints a table per scenario (median and
/// min–max). Writes results.json and one SVG plot per copy group to --out
/// (default target/bench/<unix time>). Needs root.
///
/// The full bench (neither --quick nor --smoke): 100 MiB/s plus the 30 MiB/s
/// USB-stick copy, 3 runs, and raw, 5 runs (about 5 hours on the four
/// filesystems; the estimate is printed before it starts).
///
/// Forms:
///   cargo xtask bench [--quick | --smoke] [--only SCENARIOS] [--modes MODES]
///                     [--fs FSTYPES] [--rates MIBPS|raw,...] [--writers N,...]
///                     [--parts PARTS] [--runs N] [--out DIR]
///   cargo xtask bench --quick --check [--fs FSTYPES] [--out DIR]
///   cargo xtask bench --check-results DIR
///   cargo xtask bench --baseline DIR,DIR,DIR
#[derive(clap::Args, Debug, Default, PartialEq)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// 100 MiB/s, 1 run, reduced sizes, and raw, 3 runs (about 6
    /// minutes per filesystem, 20 s of it raw)
    #[arg(long, conflicts_with = "smoke", verbatim_doc_comment)]
    pub quick: bool,

    /// tiny sizes: checks the harness itself, capped and raw (about 2
    /// minutes; run by CI)
    #[arg(long, verbatim_doc_comment)]
    pub smoke: bool,

    /// the scenarios to run (default all; db and beside only in the full bench)
    ///
    /// Scenarios: copy (with fsync/read latency probes), tar, multi, many (N
    /// dd at once, within and beyond the burst allowance: 1 to 1,000 writers,
    /// --quick 30 x 24 MiB and 100 x 8 MiB), overwrite, tempfile, image (an image written to the device's node, nothing
    /// mounted: dd, dd status=progress, cat, pv, cp; 512 MiB at 30 and
    /// 10 MiB/s and raw, --quick dd and cat, 256 MiB at 30 and raw),
    /// overhead, cost (what watching costs, daemon vs none:
    /// ns per write and per unrelated syscall, agent CPU and RSS for a
    /// 3 GiB cp, tar x of 30,000 files, 1,000 streams on one
    /// device and on 32, events/s; about
    /// 9 minutes with 3 runs, 23 s of --smoke),
    /// db (PostgreSQL's pgbench during the copy; full bench or --only db),
    /// beside (a 400 MiB/s disk's writers while the device is paced,
    /// at the slowest rate, writebehindd on both pacing levers; full
    /// bench or --only beside --rates 30)
    #[arg(long, value_name = "SCENARIOS", value_delimiter = ',', action = Set, value_parser = scenario,
          verbatim_doc_comment)]
    pub only: Option<Vec<String>>,

    /// modes: default, global, strict, linus, dontcache, writebehindd, and
    /// writebehindd:KEY=VALUE+... (policy keys, e.g. window_seconds=0.25);
    /// default all
    #[arg(long, value_name = "MODES", value_delimiter = ',', action = Set, value_parser = mode,
          verbatim_doc_comment)]
    pub modes: Option<Vec<Mode>>,

    /// ext4, xfs, btrfs, btrfs-zstd; default all four
    ///
    /// btrfs-zstd is btrfs mounted compress=zstd:1, copying data that
    /// compresses: files cut from a tar of /usr. --smoke runs on ext4 only,
    /// --check on the filesystems of xtask/bench-baseline.json.
    #[arg(long, value_name = "FSTYPES", value_delimiter = ',', action = Set, value_parser = filesystem,
          verbatim_doc_comment)]
    pub fs: Option<Vec<String>>,

    /// MiB/s caps, and `raw` (or 0): the device uncapped
    ///
    /// `raw` (or 0) is the same stacked loop devices
    /// with no cap (2.8 GB/s here), discards off as on the capped
    /// ones. raw runs copy, tar, multi and many only, 10 writers unless
    /// --writers says otherwise, five runs in the full bench and three
    /// in --quick, the modes interleaved (the default's time varies 3x
    /// run to run there), every mode but strict (its limit is sized by
    /// the cap); tables give median (min–max), the writers' own time,
    /// the total to sync done, peak dirty, and CPU seconds: the
    /// agent's (every thread), the machine's, the writers'. Full sizes
    /// at raw: a 3.6 GiB cp -r, tar x of 30,000 files + 1 GiB dd,
    /// 10 x 256 MiB. Default 100,30,raw (--quick and --smoke: 100,raw).
    #[arg(long, value_name = "MIBPS|raw,...", value_delimiter = ',', action = Set, value_parser = rate,
          verbatim_doc_comment)]
    pub rates: Option<Vec<u64>>,

    /// concurrent dd writers in multi (default 1,10,30)
    #[arg(long, value_name = "N,...", value_delimiter = ',', action = Set)]
    pub writers: Option<Vec<u32>>,

    /// cost's parts: per-call, copy, tar, flood, streams, devices (the
    /// streams spread over 32 devices) (default all)
    #[arg(long, value_name = "PARTS", value_delimiter = ',', action = Set, value_parser = part)]
    pub parts: Option<Vec<String>>,

    /// runs per mode at every rate, raw included
    #[arg(long, value_name = "N")]
    pub runs: Option<u32>,

    /// where results.json and the plots go (default target/bench/<unix time>)
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// the writebehindd binary to run (default: this tree's, built
    /// --release): another commit's, for a before and after in one harness
    #[arg(long, value_name = "FILE")]
    pub daemon: Option<PathBuf>,

    /// the guard against regressions (with --quick)
    ///
    /// The guard against regressions: the quick copy, tar and multi at
    /// 100 MiB/s and raw, and the quick image at 30 MiB/s and raw,
    /// kernel default and writebehindd only, on the
    /// filesystems of xtask/bench-baseline.json; names every figure (a
    /// ratio to the default in the same run) outside its band there,
    /// better or worse, and fails if any is (about 4 minutes on
    /// three, 1 of them raw).
    #[arg(long, verbatim_doc_comment)]
    pub check: bool,

    /// the same comparison for a run already made
    #[arg(long, value_name = "DIR", conflicts_with = "baseline")]
    pub check_results: Option<PathBuf>,

    /// makes xtask/bench-baseline.json from the results of runs made as --check makes them
    ///
    /// Three runs: the bands are their spread, widened. The bands of
    /// groups the runs do not have are kept from the file as it was (raw
    /// bands can be made from raw-only runs: --quick --rates raw --only
    /// copy,tar,multi --modes default,writebehindd).
    #[arg(long, value_name = "DIRS", value_delimiter = ',', action = Set, verbatim_doc_comment)]
    pub baseline: Option<Vec<String>>,
}

/// A rate of --rates: MiB/s, or `raw` for the uncapped device.
pub(super) fn rate(r: &str) -> Result<u64, String> {
    match r {
        "raw" => Ok(RAW),
        n => n.parse().map_err(|_| format!("{n:?} is neither MiB/s nor raw")),
    }
}

fn mode(m: &str) -> Result<Mode, String> {
    let known = || super::modes::ALL.map(Mode::key).join(", ");
    Mode::parse(m).ok_or_else(|| format!("unknown mode {m:?} ({}, writebehindd:KEY=VALUE+...)", known()))
}

fn scenario(s: &str) -> Result<String, String> {
    match SCENARIOS.contains(&s) {
        true => Ok(s.to_owned()),
        false => Err(format!("unknown scenario {s:?} ({})", SCENARIOS.join(", "))),
    }
}

fn part(p: &str) -> Result<String, String> {
    match cost::parts().contains(&p) {
        true => Ok(p.to_owned()),
        false => Err(format!("unknown part of cost {p:?} ({})", cost::parts().join(", "))),
    }
}

fn filesystem(f: &str) -> Result<String, String> {
    fs_spec(f).map(|_| f.to_owned()).map_err(|e| e.to_string())
}
