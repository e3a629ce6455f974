//! `bench --check`: a guard against regressions.  Each figure a change could
//! move is kept as a ratio to the kernel default in the same run (the device,
//! the machine's load and the filesystem's own mood move both alike), with a
//! band from several runs of the same code.  `--check` runs the quick bench
//! and names every figure outside its band, better or worse; `--baseline`
//! makes the bands from result directories.  Timings stay out of CI: this is
//! a check a developer runs before resolving work on `bpf/`, streams,
//! devices, bandwidth, pacing or the flusher.
//!
//! The raw device (groups ending in "raw") has figures of its own: the total
//! to `sync` done and the peak dirty, each the daemon's median over three
//! runs over the default's median in the same run.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::report::{self, Run, fmt};

/// Committed with the code it was measured on.
pub const BASELINE: &str = "xtask/bench-baseline.json";
/// What `--check` runs: the scenarios and modes the figures come from.
pub const SCENARIOS: [&str; 5] = ["copy", "tar", "multi", "many", "image"];
pub const MODES: [&str; 2] = ["default", "writebehindd"];
const DEFAULT: &str = "kernel default";
const DAEMON: &str = "writebehindd";

/// (group prefix, metric, the least change that counts, in the metric's
/// units, whether higher is better), on a capped device.  The floors are about what the same code
/// moved between runs here (plain btrfs's copy peak 12–22 MiB; read p99
/// bimodal, 3–58 ms), so that one run's luck is not named.  The copy's time
/// is kept as total/ideal, not as a ratio to the default: the default's own
/// total varied 10.9–12.6 s between runs (its `sync` does), which would widen
/// the band to ±10 %; the daemon's total/ideal on ext4 was 0.986–1.007 over
/// seven runs.
const FIGURES: [(&str, &str, f64, bool); 16] = [
    ("copy ", "peak MiB", 4.0, false),
    ("copy ", "sync s", 0.1, false),
    ("copy ", "total/ideal", 0.02, false),
    ("copy ", "fsync p99 ms", 50.0, false),
    ("copy ", "read p99 ms", 25.0, false),
    ("tar ", "peak MiB", 8.0, false),
    ("tar ", "to sync done s", 0.2, false),
    ("multi 10 ", "extents/file", 1.0, false),
    ("multi 10 ", "MiB/s", 3.0, true),
    // Many writers at once: three quick runs of the same code moved the
    // daemon's peak by up to 210 MiB (100 x 8 MiB on xfs: 126-337, the
    // writers' first burst), its total by 0.2 s, its sync by 1.3 s (ext4
    // 0.48-1.75 of the default's 8.0); the floors name less than that.
    ("many ", "peak MiB", 48.0, false),
    ("many ", "s", 0.3, false),
    ("many ", "sync s", 0.5, false),
    // The image's floors (three quick runs at 30 MiB/s: the daemon's close
    // 0.11-0.18 s, its peak 20-30 MiB, its total 8.54-8.58 s; the device's
    // count at exit the whole image in every run, so half a MiB names any
    // loss).
    ("image ", "close s", 0.3, false),
    ("image ", "peak MiB", 8.0, false),
    ("image ", "total s", 0.3, false),
    ("image ", "at close MiB", 0.5, true),
];
/// The same on the raw device.  Floors: what the daemon's medians moved
/// between three quick runs of the same code there: the copy's total by up
/// to 0.25 s on ext4 (0.48–0.73 s), tar's and multi's by up to 0.08 s (of
/// 0.2–0.45 s); its peaks by up to 41 MiB in the copy (xfs 103–144) and
/// multi, 10 MiB in tar (ext4 70–81).
const RAW_FIGURES: [(&str, &str, f64, bool); 11] = [
    ("copy ", "total s", 0.1, false),
    ("copy ", "peak MiB", 32.0, false),
    ("tar ", "to sync done s", 0.05, false),
    ("tar ", "peak MiB", 16.0, false),
    ("multi 10 ", "s", 0.05, false),
    ("multi 10 ", "peak MiB", 32.0, false),
    // Many writers: totals 0.29-1.1 s, moved by up to 0.09 s; peaks by
    // up to 52 MiB.
    ("many ", "s", 0.1, false),
    ("many ", "peak MiB", 48.0, false),
    // The image's totals moved by up to 0.04 s between three runs
    // (0.29-0.55 s), its peaks 6-22 MiB.
    ("image ", "total s", 0.1, false),
    ("image ", "peak MiB", 32.0, false),
    ("image ", "at close MiB", 0.5, true),
];

fn is_raw(group: &str) -> bool {
    group.ends_with(" raw")
}

/// The figures kept for a group: the raw device's or a capped one's.
fn figures_of(group: &str) -> impl Iterator<Item = &'static (&'static str, &'static str, f64, bool)> + '_ {
    let table: &'static [_] = if is_raw(group) { &RAW_FIGURES } else { &FIGURES };
    table.iter().filter(move |f| group.starts_with(f.0))
}
/// Figures kept as the daemon's own value, not as a ratio.
const ABSOLUTE: [&str; 1] = ["total/ideal"];

#[derive(Debug, Serialize, Deserialize)]
pub struct Baseline {
    /// The commit the runs were made on, and how.
    pub made_on: String,
    pub fs: Vec<String>,
    pub bands: Vec<Band>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Band {
    pub group: String,
    pub metric: String,
    /// writebehindd / kernel default in each run (total/ideal: the
    /// daemon's own).
    pub ratios: Vec<f64>,
    pub lo: f64,
    pub hi: f64,
    pub higher_is_better: bool,
    /// The commit and runs this band came from (bands of other groups can
    /// be kept from an earlier baseline: see merge).
    #[serde(default)]
    pub made_on: String,
}

/// Each kept figure of one run: (group, metric, ratio, default's value).
fn figures(runs: &[Run]) -> Vec<(String, String, f64, f64)> {
    // In the order they ran: the baseline's filesystems keep it.
    let mut groups: Vec<&str> = Vec::new();
    for r in runs {
        if !groups.contains(&r.group.as_str()) {
            groups.push(&r.group);
        }
    }
    let mut out = Vec::new();
    for g in groups {
        for (_, metric, _, _) in figures_of(g) {
            let (Some(d), Some(w)) =
                (report::median(runs, g, DEFAULT, metric), report::median(runs, g, DAEMON, metric))
            else {
                continue;
            };
            if ABSOLUTE.contains(metric) {
                out.push((g.to_string(), metric.to_string(), w, 1.0));
            } else if d > 0.0 {
                out.push((g.to_string(), metric.to_string(), w / d, d));
            }
        }
    }
    out
}

fn floor_of(group: &str, metric: &str) -> (f64, bool) {
    figures_of(group).find(|f| f.1 == metric).map(|f| (f.2, f.3)).unwrap_or((0.0, false))
}

fn load_runs(dir: &Path) -> Result<Vec<Run>> {
    let path = dir.join("results.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Bands from the runs in `dirs` (each a bench --out directory): each
/// figure's ratios, widened on each side by the larger of half their
/// spread and the figure's floor over the default's value.
pub fn make_baseline(dirs: &[String], made_on: &str) -> Result<Baseline> {
    if dirs.len() < 2 {
        bail!("--baseline needs the result directories of at least two runs (three make the bands)");
    }
    let runs = dirs.iter().map(|d| load_runs(Path::new(d)).map(|r| figures(&r))).collect::<Result<Vec<_>>>()?;
    bands(&runs, made_on)
}

/// Bands from each run's figures.
fn bands(runs: &[Vec<(String, String, f64, f64)>], made_on: &str) -> Result<Baseline> {
    let mut per: Vec<(String, String, Vec<f64>, Vec<f64>)> = Vec::new();
    for figs in runs {
        for (g, m, ratio, dflt) in figs.iter().cloned() {
            match per.iter_mut().find(|p| p.0 == g && p.1 == m) {
                Some(p) => {
                    p.2.push(ratio);
                    p.3.push(dflt);
                }
                None => per.push((g, m, vec![ratio], vec![dflt])),
            }
        }
    }
    let mut fs: Vec<String> = Vec::new();
    let mut bands = Vec::new();
    for (group, metric, ratios, dflts) in per {
        if ratios.len() != runs.len() {
            bail!("{group} / {metric} is not in every run");
        }
        let (floor, higher_is_better) = floor_of(&group, &metric);
        let (min, max) = ratios.iter().fold((f64::MAX, f64::MIN), |(a, b), &r| (a.min(r), b.max(r)));
        let dflt = dflts.iter().sum::<f64>() / dflts.len() as f64;
        let slack = ((max - min) / 2.0).max(floor / dflt);
        for word in group.split_whitespace() {
            if ["ext4", "xfs", "btrfs", "btrfs-zstd"].contains(&word) && !fs.iter().any(|f| f == word) {
                fs.push(word.to_string());
            }
        }
        bands.push(Band {
            group,
            metric,
            ratios,
            lo: (min - slack).max(0.0),
            hi: max + slack,
            higher_is_better,
            made_on: made_on.to_string(),
        });
    }
    Ok(Baseline { made_on: made_on.to_string(), fs, bands })
}

/// `new`, with the bands of `old` for the groups `new` has none of: bands
/// for the raw device added to capped ones made earlier (or the other way
/// round), each kept with the runs it came from.
pub fn merge(new: Baseline, old: Option<Baseline>) -> Baseline {
    let Some(old) = old else { return new };
    let kept: Vec<Band> = old.bands.into_iter().filter(|b| !new.bands.iter().any(|n| n.group == b.group)).collect();
    if kept.is_empty() {
        return new;
    }
    let mut fs = old.fs;
    for f in new.fs {
        if !fs.contains(&f) {
            fs.push(f);
        }
    }
    let bands: Vec<Band> = kept
        .into_iter()
        .map(|b| if b.made_on.is_empty() { Band { made_on: old.made_on.clone(), ..b } } else { b })
        .chain(new.bands)
        .collect();
    Baseline { made_on: provenance(&bands), fs, bands }
}

/// Where the bands came from, each source once: "X (N bands); Y (M bands)".
fn provenance(bands: &[Band]) -> String {
    let mut sources: Vec<(&str, usize)> = Vec::new();
    for b in bands {
        match sources.iter_mut().find(|s| s.0 == b.made_on) {
            Some(s) => s.1 += 1,
            None => sources.push((&b.made_on, 1)),
        }
    }
    sources.iter().map(|(m, n)| format!("{m} ({n} bands)")).collect::<Vec<_>>().join("; ")
}

pub fn load() -> Result<Baseline> {
    let text = std::fs::read_to_string(BASELINE)
        .with_context(|| format!("reading {BASELINE} (make one with `cargo xtask bench --baseline DIR,DIR,DIR`)"))?;
    Ok(serde_json::from_str(&text)?)
}

pub fn save(b: &Baseline) -> Result<()> {
    std::fs::write(BASELINE, serde_json::to_string_pretty(b)? + "\n")?;
    println!("baseline: {} figures on {:?} written to {BASELINE}", b.bands.len(), b.fs);
    Ok(())
}

/// Compares the runs in `dir` with the baseline; prints every figure and
/// fails naming those out of their band.
pub fn check(dir: &Path, base: &Baseline) -> Result<()> {
    let now = figures(&load_runs(dir)?);
    let mut rows = vec![["figure", "band", "now", "verdict"].map(String::from).to_vec()];
    let mut moved = Vec::new();
    for b in &base.bands {
        let name = format!("{}: {}", b.group, b.metric);
        let Some((_, _, ratio, _)) = now.iter().find(|n| n.0 == b.group && n.1 == b.metric) else {
            // A scenario that failed, or a figure renamed: the guard did
            // not look, which must not read as a pass.
            moved.push(format!("{name}: NOT RUN"));
            rows.push(vec![name, band_text(b), "-".into(), "NOT RUN".into()]);
            continue;
        };
        let verdict = verdict(b, *ratio);
        if verdict != "in band" {
            moved.push(format!("{name} {verdict}: {} (band {})", num(*ratio), band_text(b)));
        }
        rows.push(vec![name, band_text(b), num(*ratio), verdict.into()]);
    }
    let title = format!("check against {BASELINE} ({}): × the kernel default, total/ideal as is", base.made_on);
    print!("{}", report::grid(&title, &rows));
    if moved.is_empty() {
        println!("\ncheck: every figure within its band");
        return Ok(());
    }
    bail!("{} figure(s) out of band:\n  {}", moved.len(), moved.join("\n  "))
}

fn verdict(b: &Band, ratio: f64) -> &'static str {
    if (b.lo..=b.hi).contains(&ratio) {
        "in band"
    } else if (ratio > b.hi) == b.higher_is_better {
        "BETTER"
    } else {
        "WORSE"
    }
}

fn band_text(b: &Band) -> String {
    format!("{}–{}", num(b.lo), num(b.hi))
}

/// Ratios as small as a copy's peak (0.012 of the default's) keep their
/// digits.
fn num(v: f64) -> String {
    if v.abs() < 0.1 { format!("{v:.4}") } else { fmt(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(group: &str, mode: &str, metrics: &[(&str, f64)]) -> Run {
        Run {
            group: group.into(),
            mode: mode.into(),
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            series: Vec::new(),
            written: Vec::new(),
        }
    }

    #[test]
    fn figures_are_ratios_to_the_default_in_the_same_run() {
        let runs = vec![
            run("copy 1.0 GiB ext4 100MiB/s", DEFAULT, &[("peak MiB", 1000.0), ("sync s", 10.0)]),
            run("copy 1.0 GiB ext4 100MiB/s", DAEMON, &[("peak MiB", 13.0), ("sync s", 0.1)]),
            run("multi 1 x 64 MiB ext4 100MiB/s", DAEMON, &[("MiB/s", 100.0)]),
        ];
        let f = figures(&runs);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!((f[0].2 - 0.013).abs() < 1e-9 && (f[1].2 - 0.01).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn a_band_is_at_least_the_floor_wide_and_direction_decides_the_verdict() {
        let g = "copy 1.0 GiB ext4 100MiB/s";
        let m = |peak: f64| vec![(g.to_string(), "peak MiB".to_string(), peak / 1000.0, 1000.0)];
        let base = bands(&[m(13.0), m(14.0), m(13.5)], "test").unwrap();
        let b = &base.bands[0];
        // The spread is 1 MiB; the floor, 4 MiB of the default's 1000.
        assert!((b.lo - 0.009).abs() < 1e-9 && (b.hi - 0.018).abs() < 1e-9, "{b:?}");
        assert_eq!(base.fs, ["ext4"]);
        assert_eq!(verdict(b, 0.015), "in band");
        assert_eq!(verdict(b, 0.036), "WORSE", "36 MiB held instead of 13");
        assert_eq!(verdict(b, 0.005), "BETTER");
        let up = Band {
            group: g.into(),
            metric: "MiB/s".into(),
            ratios: vec![1.0],
            lo: 0.97,
            hi: 1.03,
            higher_is_better: true,
            made_on: String::new(),
        };
        assert_eq!(verdict(&up, 1.1), "BETTER");
        assert_eq!(verdict(&up, 0.9), "WORSE");
        assert!(bands(&[m(13.0), vec![]], "test").is_err(), "a figure missing from a run");
    }

    #[test]
    fn new_bands_replace_their_groups_and_keep_the_others() {
        let fig = |g: &str, r: f64| vec![(g.to_string(), "peak MiB".to_string(), r, 1000.0)];
        let capped = "copy 1.0 GiB ext4 100MiB/s";
        let raw = "copy 1.0 GiB xfs raw";
        let old = bands(&[[fig(capped, 0.01), fig(raw, 0.5)].concat()], "old").unwrap();
        let new = bands(&[fig(raw, 0.1)], "new").unwrap();
        let m = merge(new, Some(old));
        let groups: Vec<(&str, f64)> = m.bands.iter().map(|b| (b.group.as_str(), b.ratios[0])).collect();
        assert_eq!(groups, [(capped, 0.01), (raw, 0.1)]);
        assert_eq!(m.fs, ["ext4", "xfs"]);
        assert_eq!(m.made_on, "old (1 bands); new (1 bands)");
        // Merged again, each band still names its own source, not the
        // whole earlier chain.
        let newer = bands(&[fig(raw, 0.2)], "newer").unwrap();
        assert_eq!(merge(newer, Some(m)).made_on, "old (1 bands); newer (1 bands)");
    }

    #[test]
    fn the_raw_device_keeps_its_own_figures() {
        let g = "copy 1.0 GiB ext4 raw";
        let runs = vec![
            run(g, DEFAULT, &[("total s", 2.0), ("sync s", 1.2), ("peak MiB", 1000.0), ("fsync p99 ms", 9.0)]),
            run(g, DAEMON, &[("total s", 2.2), ("sync s", 0.1), ("peak MiB", 200.0), ("fsync p99 ms", 3.0)]),
            run(g, DEFAULT, &[("total s", 1.0), ("sync s", 0.2), ("peak MiB", 1000.0), ("fsync p99 ms", 9.0)]),
            run(g, DAEMON, &[("total s", 2.1), ("sync s", 0.1), ("peak MiB", 220.0), ("fsync p99 ms", 3.0)]),
            run(g, DEFAULT, &[("total s", 2.1), ("sync s", 1.2), ("peak MiB", 1000.0), ("fsync p99 ms", 9.0)]),
            run(g, DAEMON, &[("total s", 2.0), ("sync s", 0.1), ("peak MiB", 210.0), ("fsync p99 ms", 3.0)]),
        ];
        let f = figures(&runs);
        let names: Vec<&str> = f.iter().map(|f| f.1.as_str()).collect();
        assert_eq!(names, ["total s", "peak MiB"], "the capped copy's figures are not the raw one's");
        // Medians, then their ratio: 2.1 / 2.0 and 210 / 1000.
        assert!((f[0].2 - 1.05).abs() < 1e-9 && (f[1].2 - 0.21).abs() < 1e-9, "{f:?}");
        assert_eq!(floor_of(g, "total s"), (0.1, false));
        assert_eq!(floor_of("copy 1.0 GiB ext4 100MiB/s", "total s"), (0.0, false));
        assert_eq!(floor_of("multi 10 x 64 MiB xfs raw", "s"), (0.05, false));
    }
}
