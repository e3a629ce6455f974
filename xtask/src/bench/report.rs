//! Bench output: a table per scenario (median and min–max of every metric,
//! one row per mode), a JSON file of every run, an SVG plot per copy group.

use std::{collections::BTreeMap, path::Path};

use anyhow::Result;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use wb_tests::{MIB, Sample};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// e.g. "copy ext4 100MiB/s"
    pub group: String,
    pub mode: String,
    pub metrics: Vec<(String, f64)>,
    /// (seconds, dirty bytes, writeback bytes), for copy runs.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub series: Vec<(f64, u64, u64)>,
    /// The bytes written back by each sample of `series`, cumulative.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub written: Vec<u64>,
}

impl Run {
    pub fn new(group: &str, mode: &str, metrics: &[(&'static str, f64)], series: &[Sample]) -> Self {
        Self {
            group: group.into(),
            mode: mode.into(),
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            series: series.iter().map(|s| (s.t, s.dirty, s.writeback)).collect(),
            written: series.iter().map(|s| s.written).collect(),
        }
    }
}

pub fn fmt(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// "median (min–max)" over runs, or just the value for one run.
fn cell(mut vals: Vec<f64>) -> String {
    vals.sort_by(|a, b| a.total_cmp(b));
    match vals.len() {
        0 => "-".into(),
        1 => fmt(vals[0]),
        n => format!("{} ({}–{})", fmt(vals[n / 2]), fmt(vals[0]), fmt(vals[n - 1])),
    }
}

/// The median of one metric over a mode's runs in a group (the upper one
/// of an even count, as in the tables).
pub fn median(runs: &[Run], group: &str, mode: &str, metric: &str) -> Option<f64> {
    let mut vals: Vec<f64> = runs
        .iter()
        .filter(|r| r.group == group && r.mode == mode)
        .filter_map(|r| r.metrics.iter().find(|(k, _)| k == metric).map(|(_, v)| *v))
        .collect();
    vals.sort_by(|a, b| a.total_cmp(b));
    vals.get(vals.len() / 2).copied()
}

/// Prints one table for a group, modes in the order they ran.
pub fn table(runs: &[Run], group: &str) -> String {
    let runs: Vec<&Run> = runs.iter().filter(|r| r.group == group).collect();
    let mut modes: Vec<&str> = Vec::new();
    let mut metrics: Vec<&str> = Vec::new();
    for r in &runs {
        if !modes.contains(&r.mode.as_str()) {
            modes.push(&r.mode);
        }
        for (k, _) in &r.metrics {
            if !metrics.contains(&k.as_str()) {
                metrics.push(k);
            }
        }
    }
    let mut rows =
        vec![std::iter::once("mode".to_string()).chain(metrics.iter().map(|m| m.to_string())).collect::<Vec<_>>()];
    for mode in &modes {
        let mut row = vec![mode.to_string()];
        for m in &metrics {
            let vals = runs
                .iter()
                .filter(|r| r.mode == *mode)
                .filter_map(|r| r.metrics.iter().find(|(k, _)| k == m).map(|(_, v)| *v))
                .collect();
            row.push(cell(vals));
        }
        rows.push(row);
    }
    grid(group, &rows)
}

/// A titled table: the first row is the header, the first column left-aligned.
pub fn grid(title: &str, rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = format!("\n== {title} ==\n");
    for (i, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, s)| if c == 0 { format!("{s:<w$}", w = widths[c]) } else { format!("{s:>w$}", w = widths[c]) })
            .collect();
        out += &line.join("  ");
        out += "\n";
        if i == 0 {
            out += &"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1));
            out += "\n";
        }
    }
    out
}

pub fn write_json(runs: &[Run], path: &Path) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(runs)?)?;
    Ok(())
}

type Panel<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One plot of the figure: seconds across, `y_desc` up to `y_max`.
fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    caption: &str,
    font: u32,
    t_max: f64,
    y_max: f64,
    y_desc: &str,
) -> Result<Panel<'a>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", font))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max * 1.02, 0.0..y_max)?;
    chart.configure_mesh().x_desc("seconds").y_desc(y_desc).draw()?;
    Ok(chart)
}

/// The device's write throughput over time, MiB/s, from cumulative written
/// bytes: each point over the half second before it (a 100 ms sample
/// alone shows the writeback's bursts, not its rate).
fn throughput(r: &Run) -> Vec<(f64, f64)> {
    let points: Vec<(f64, u64)> = r.series.iter().map(|s| s.0).zip(r.written.iter().copied()).collect();
    let mut out = Vec::new();
    let mut from = 0;
    for (i, &(t, w)) in points.iter().enumerate() {
        while points[from].0 < t - 0.5 {
            from += 1;
        }
        let (t0, w0) = points[from];
        if i > from && t > t0 {
            out.push((t, w.saturating_sub(w0) as f64 / MIB as f64 / (t - t0)));
        }
    }
    out
}

/// Dirty + writeback of the device over time, and its write throughput
/// below, one line per mode (its first run).
pub fn plot(runs: &[Run], group: &str, path: &Path) -> Result<()> {
    let mut first: BTreeMap<usize, &Run> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for r in runs.iter().filter(|r| r.group == group && !r.series.is_empty()) {
        if !order.contains(&r.mode.as_str()) {
            order.push(&r.mode);
            first.insert(order.len() - 1, r);
        }
    }
    if first.is_empty() {
        return Ok(());
    }
    let mib = |b: u64| b as f64 / MIB as f64;
    let t_max = first.values().flat_map(|r| r.series.iter().map(|s| s.0)).fold(1.0, f64::max);
    let y_max = first.values().flat_map(|r| r.series.iter().map(|s| mib(s.1 + s.2))).fold(1.0, f64::max);
    let rates: BTreeMap<usize, Vec<(f64, f64)>> = first.iter().map(|(i, r)| (*i, throughput(r))).collect();
    let rate_max = rates.values().flatten().map(|p| p.1).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(480);
    let mut chart = panel(&top, &format!("{group}: device dirty + writeback"), 22, t_max, y_max * 1.05, "MiB")?;
    for (i, r) in &first {
        let color = Palette99::pick(*i).to_rgba();
        chart
            .draw_series(LineSeries::new(r.series.iter().map(|s| (s.0, mib(s.1 + s.2))), color.stroke_width(2)))?
            .label(r.mode.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    let mut chart = panel(&bottom, "written to the device", 18, t_max, rate_max * 1.1, "MiB/s")?;
    for (i, points) in &rates {
        let color = Palette99::pick(*i).to_rgba();
        chart.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?;
    }
    root.present()?;
    Ok(())
}
