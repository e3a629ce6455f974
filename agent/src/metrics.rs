//! The metrics text: one family per counter and per gauge, named with
//! its unit (`_bytes`, `_seconds`), each with TYPE and HELP, per-device
//! families labelled by the device's number and name.  Two dialects that
//! differ only in how a counter's family is named: OpenMetrics 1.0 (the
//! HTTP endpoint; `# TYPE x counter`, samples `x_total`) and Prometheus's
//! text format 0.0.4 (`wbctl metrics`, for a textfile collector and
//! `promtool check metrics`, which read that format only: `# TYPE x_total
//! counter`).  A new family is one `Families::add` call.

use std::collections::BTreeSet;

use crate::{
    bdis::BdiState,
    status::{DeviceStatus, Status},
};

/// Which text format: see the module's comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenMetrics,
    Prometheus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One sample's labels, values as they are (escaped when written).
pub type Labels = Vec<(&'static str, String)>;

/// The text being written, and every name taken so far.
pub struct Families {
    out: String,
    dialect: Dialect,
    taken: BTreeSet<String>,
}

impl Families {
    pub fn new(dialect: Dialect) -> Self {
        Self { out: String::new(), dialect, taken: BTreeSet::new() }
    }

    /// Family `writebehindd_<name>` (a counter's name without `_total`,
    /// ending in `_<unit>` when it has one), its samples.  A name already
    /// taken (or an illegal one) is a bug: debug builds stop, release
    /// builds leave the family out rather than write text nobody parses.
    pub fn add(&mut self, name: &str, kind: Kind, unit: &str, help: &str, samples: Vec<(Labels, f64)>) {
        let family = format!("writebehindd_{name}");
        let sample = match kind {
            Kind::Counter => format!("{family}_total"),
            Kind::Gauge => family.clone(),
        };
        let legal = legal_name(&family) && (unit.is_empty() || family.ends_with(&format!("_{unit}")));
        if !legal || self.taken.contains(&family) || self.taken.contains(&sample) {
            debug_assert!(false, "metrics family {family}: illegal or taken");
            return;
        }
        self.taken.insert(family.clone());
        self.taken.insert(sample.clone());
        let (typed, kind) = match (kind, self.dialect) {
            (Kind::Counter, Dialect::OpenMetrics) => (&family, "counter"),
            (Kind::Counter, Dialect::Prometheus) => (&sample, "counter"),
            (Kind::Gauge, _) => (&family, "gauge"),
        };
        self.out += &format!("# TYPE {typed} {kind}\n");
        if !unit.is_empty() && self.dialect == Dialect::OpenMetrics {
            self.out += &format!("# UNIT {typed} {unit}\n");
        }
        self.out += &format!("# HELP {typed} {}\n", escape(help, false));
        for (labels, v) in samples {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v, true))).collect();
            let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
            self.out += &format!("{sample}{labels} {}\n", number(v));
        }
    }

    pub fn finish(mut self) -> String {
        self.out += "# EOF\n";
        self.out
    }
}

/// A metric name as both formats allow it.
fn legal_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A label value (`quote`: also `"`) or HELP text escaped as both formats
/// read it: backslash, newline (and double quote) as `\\`, `\n`, `\"`.
pub fn escape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// A sample's value: integers without a fraction, others as Rust writes them.
fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v}") }
}

/// Entries of Status.counters that are levels, with their unit and the
/// factor to it: bytes of flushes waiting now, and the longest an event
/// waited in the ring within the last second.
const GAUGES: [(&str, &str, &str, f64, &str); 2] = [
    ("flush_memory_bytes", "flush_memory_bytes", "bytes", 1.0, "Memory held by flushes waiting now."),
    (
        "intake_lag_ms",
        "intake_lag_seconds",
        "seconds",
        1e-3,
        "The longest an event waited in the ring buffer within the last second.",
    ),
];

/// A counter of Status.counters as a family: its name, unit and help.
/// Counters of bytes carry the unit at the end (`bytes_flushed` is
/// `flushed_bytes_total`); any other is a count, named as it is.
fn counter_family(key: &str) -> (String, &'static str, String) {
    let clean: String =
        key.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    let (name, unit) = match clean.strip_prefix("bytes_") {
        Some(rest) => (format!("{rest}_bytes"), "bytes"),
        None if clean.ends_with("_bytes") => (clean.clone(), "bytes"),
        None => (clean.clone(), ""),
    };
    let help = match key {
        "events" => "Events read from the ring buffer.".into(),
        "streams_started" => "Streaming writers noticed.".into(),
        "spans_flushed" => "Spans whose writeback the agent started.".into(),
        "bytes_flushed" => "Bytes whose writeback the agent started.".into(),
        "closed_files_flushed" => "Files flushed after their writer closed them.".into(),
        "closed_files_by_path" => "Closed files flushed that were looked up by path.".into(),
        "closed_files_left" => "Closed files left to the kernel: their device was paced.".into(),
        "closes_shed_late" => "Closes that waited 0.5 s or more in the ring, left to the kernel.".into(),
        "events_left_by_policy" => "Events of devices the policy's leave_devices lists.".into(),
        "ring_buffer_drops" => "Events lost because the ring buffer was full.".into(),
        "untracked_map_full" => "Writes not tracked because the stream map was full.".into(),
        "closes_shed" => "Closes not reported: the ring buffer was half full.".into(),
        "left_self_synced" => "Streams left to a writer that syncs the file itself.".into(),
        "untracked_user_share" => "Files not tracked: their writer's owner holds its share.".into(),
        "journal_dropped" => "Journal entries dropped: the journal's socket was full.".into(),
        "streamed_pool_spent" => "Writes within a writer's burst written behind: its device's pool was spent.".into(),
        "control_refused" => "Control socket clients refused: their user held its slots.".into(),
        "metrics_refused" => "Metrics listener connections refused: their user or host held its slots.".into(),
        k if k.starts_with("error_") => format!("Events that led to no flush, or flushes that failed: {}.", &k[6..]),
        k => format!("The agent's {k} counter (wbctl status lists it)."),
    };
    (name, unit, help)
}

/// The labels of a device: its number and its name.
fn device(d: &DeviceStatus) -> Labels {
    let name = if d.name.is_empty() { d.bdi.clone() } else { d.name.clone() };
    vec![("bdi", d.bdi.clone()), ("name", name)]
}

/// The metrics text of a status snapshot and of every bdi's state (read
/// when scraped, `bdis`), without the units' families: the tests' view.
#[cfg(test)]
fn metrics(s: &Status, bdis: &[BdiState], dialect: Dialect) -> String {
    families(s, bdis, dialect).finish()
}

/// The daemon's and the devices' families, open for more (the units',
/// units::metrics) before `finish`.
pub fn families(s: &Status, bdis: &[BdiState], dialect: Dialect) -> Families {
    use Kind::{Counter, Gauge};
    let mut f = Families::new(dialect);
    let one = |v: f64| vec![(Labels::new(), v)];
    let dev = |v: &dyn Fn(&DeviceStatus) -> f64| -> Vec<(Labels, f64)> {
        s.devices.iter().map(|d| (device(d), v(d))).collect()
    };
    f.add("uptime_seconds", Gauge, "seconds", "Seconds since the daemon started.", one(s.uptime_s));
    f.add("on_battery", Gauge, "", "1 while the host runs on battery.", one(s.on_battery as u8 as f64));
    f.add("streams", Gauge, "", "Active streaming writers.", one(s.streams.len() as f64));
    let global = s.global_limits.as_ref().map_or(0, |g| g.dirty_bytes) as f64;
    f.add("global_dirty_bytes", Gauge, "bytes", "vm.dirty_bytes set for pacing, 0 otherwise.", one(global));
    f.add(
        "device_bandwidth_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "Estimated write bandwidth of the device.",
        dev(&|d| d.bandwidth as f64),
    );
    f.add("device_window_bytes", Gauge, "bytes", "Window of the root policy on the device.", dev(&|d| d.window as f64));
    f.add("device_in_flight_bytes", Gauge, "bytes", "What the submitter keeps in flight.", dev(&|d| d.chunk as f64));
    f.add(
        "device_dirty_bytes",
        Gauge,
        "bytes",
        "Dirty and writeback bytes of the device at its last event.",
        dev(&|d| d.dirty as f64),
    );
    f.add(
        "device_budget_bytes",
        Gauge,
        "bytes",
        "The dirty cap set while pacing, 0 otherwise.",
        dev(&|d| d.paced_budget as f64),
    );
    f.add("device_paced", Gauge, "", "1 while the device is paced.", dev(&|d| (d.paced_budget > 0) as u8 as f64));
    f.add(
        "device_would_budget_bytes",
        Gauge,
        "bytes",
        "The dirty cap observing writers would have the device paced at, 0 otherwise; never set.",
        dev(&|d| d.would_budget as f64),
    );
    f.add("device_paced_seconds", Counter, "seconds", "Time the device was paced.", dev(&|d| d.paced_secs));
    f.add(
        "device_stalled_seconds",
        Gauge,
        "seconds",
        "How long writeback on the device has waited in one call, once 5 s or more; 0 otherwise.",
        dev(&|d| d.stalled_secs),
    );
    bdi_families(&mut f, bdis);
    for (key, name, unit, factor, help) in GAUGES {
        if let Some(v) = s.counters.get(key) {
            f.add(name, Gauge, unit, help, one(*v as f64 * factor));
        }
    }
    for (key, v) in s.counters.iter().filter(|(k, _)| !GAUGES.iter().any(|g| g.0 == k.as_str())) {
        let (name, unit, help) = counter_family(key);
        f.add(&name, Counter, unit, &help, one(*v as f64));
    }
    f
}

/// Every bdi's writeback state, devices the daemon never paced included.
fn bdi_families(f: &mut Families, bdis: &[BdiState]) {
    let of = |v: &dyn Fn(&BdiState) -> Option<u64>| -> Vec<(Labels, f64)> {
        bdis.iter()
            .filter_map(|b| Some((vec![("bdi", b.bdi.clone()), ("name", b.name.clone())], v(b)? as f64)))
            .collect()
    };
    f.add(
        "bdi_dirty_bytes",
        Kind::Gauge,
        "bytes",
        "Dirty bytes of every bdi (debugfs's BdiReclaimable); without debugfs, dirty and writeback at the daemon's last event, for the devices it saw.",
        of(&|b| b.dirty),
    );
    f.add(
        "bdi_writeback_bytes",
        Kind::Gauge,
        "bytes",
        "Bytes under writeback of every bdi (debugfs's BdiWriteback; absent without debugfs).",
        of(&|b| b.writeback),
    );
    f.add(
        "bdi_written_bytes",
        Kind::Counter,
        "bytes",
        "Bytes written to every bdi (debugfs's BdiWritten, else a block device's sectors written).",
        of(&|b| b.written),
    );
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn sample() -> (Status, Vec<BdiState>) {
        let counters: BTreeMap<String, u64> = [
            ("events", 7),
            ("bytes_flushed", 1 << 20),
            ("streams_started", 2),
            ("error_sync_failed", 0),
            ("flush_memory_bytes", 104),
            ("intake_lag_ms", 96),
            ("would_pace", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let dev = |bdi: &str, name: &str| DeviceStatus {
            bdi: bdi.into(),
            name: name.into(),
            bandwidth: 30 << 20,
            dirty: 5 << 20,
            paced_budget: 8 << 20,
            paced_secs: 1.5,
            ..Default::default()
        };
        let status = Status {
            devices: vec![dev("8:16", "sdb1 /media/alice/STICK"), dev("0:53", "evil\"} 1\n/mnt\\x")],
            counters,
            ..Default::default()
        };
        let bdis = vec![
            BdiState {
                bdi: "8:16".into(),
                name: "sdb1 /media/alice/STICK".into(),
                dirty: Some(1),
                ..Default::default()
            },
            BdiState { bdi: "7:3".into(), name: "loop3".into(), written: Some(4096), ..Default::default() },
        ];
        (status, bdis)
    }

    /// Every sample's family, from its name: TYPE, HELP, no family twice,
    /// legal names, values that are numbers, and `# EOF` last.
    fn check(text: &str, dialect: Dialect) -> BTreeMap<String, String> {
        let mut types: BTreeMap<String, String> = BTreeMap::new();
        let mut helps = BTreeSet::new();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
        for line in &lines[..lines.len() - 1] {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(types.insert(name.to_owned(), kind.to_owned()).is_none(), "family {name} twice");
                assert!(legal_name(name), "{name}");
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(types.contains_key(name) && !help.is_empty(), "HELP before TYPE or empty: {line}");
                helps.insert(name.to_owned());
            } else if let Some(rest) = line.strip_prefix("# UNIT ") {
                let (name, unit) = rest.split_once(' ').unwrap();
                assert!(name.ends_with(&format!("_{unit}")), "{line}");
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = match dialect {
                    Dialect::OpenMetrics if !types.contains_key(name) => name.strip_suffix("_total").unwrap_or(name),
                    _ => name,
                };
                let kind = types.get(family).unwrap_or_else(|| panic!("{name}: no TYPE\n{text}"));
                assert!(helps.contains(family), "{family}: no HELP");
                assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
        types
    }

    #[test]
    fn every_family_once_with_type_and_help_in_both_dialects() {
        let (status, bdis) = sample();
        for dialect in [Dialect::OpenMetrics, Dialect::Prometheus] {
            let text = metrics(&status, &bdis, dialect);
            let types = check(&text, dialect);
            let counter = |n: &str| match dialect {
                Dialect::OpenMetrics => n.to_owned(),
                Dialect::Prometheus => format!("{n}_total"),
            };
            // One family per counter, bytes named by their unit; levels are gauges.
            for c in ["writebehindd_events", "writebehindd_flushed_bytes", "writebehindd_would_pace"] {
                assert_eq!(types.get(&counter(c)).map(String::as_str), Some("counter"), "{c}\n{text}");
            }
            assert_eq!(types["writebehindd_intake_lag_seconds"], "gauge");
            assert!(text.contains("writebehindd_intake_lag_seconds 0.096\n"), "{text}");
            assert!(!text.contains("what="), "{text}");
        }
    }

    #[test]
    fn devices_carry_their_number_and_escaped_name() {
        let (status, bdis) = sample();
        let text = metrics(&status, &bdis, Dialect::OpenMetrics);
        assert!(
            text.contains("writebehindd_device_dirty_bytes{bdi=\"8:16\",name=\"sdb1 /media/alice/STICK\"} 5242880\n")
        );
        // A name a user chose cannot end the label or the line.
        assert!(text.contains(r#"name="evil\"} 1\n/mnt\\x"}"#), "{text}");
        assert!(text.contains("writebehindd_device_paced_seconds_total{bdi=\"8:16\""), "{text}");
        // Bdis the daemon never saw, with what is known of them.
        assert!(text.contains("writebehindd_bdi_written_bytes_total{bdi=\"7:3\",name=\"loop3\"} 4096\n"), "{text}");
        assert!(!text.contains("writebehindd_bdi_dirty_bytes{bdi=\"7:3\""), "not known, not invented");
    }

    #[test]
    fn a_counter_is_typed_by_its_family_in_openmetrics_and_its_sample_in_text() {
        let (status, bdis) = sample();
        let om = metrics(&status, &bdis, Dialect::OpenMetrics);
        assert!(
            om.contains("# TYPE writebehindd_streams_started counter\n")
                && om.contains("writebehindd_streams_started_total 2\n")
        );
        assert!(om.contains("# UNIT writebehindd_flushed_bytes bytes\n"), "{om}");
        let text = metrics(&status, &bdis, Dialect::Prometheus);
        assert!(text.contains("# TYPE writebehindd_streams_started_total counter\n"), "{text}");
        assert!(!text.contains("# UNIT"), "{text}");
    }
}
