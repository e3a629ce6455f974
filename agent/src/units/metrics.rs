//! Per-unit metrics families with bounded cardinality: the TOP units by
//! bytes written behind by name, the rest summed as unit="other".

use super::{OTHER, sort};
use crate::{
    metrics::{Families, Kind, Labels},
    status::UnitStatus,
};

/// Units named in the metrics at most; the rest are "other".
pub const TOP: usize = 10;

/// The `top` units with the most bytes written behind, and OTHER summing
/// the rest (and the table's own OTHER) when there are any.
pub fn top(units: &[UnitStatus], top: usize) -> Vec<UnitStatus> {
    let mut v: Vec<UnitStatus> = units.iter().filter(|u| u.unit != OTHER).cloned().collect();
    sort(&mut v);
    let rest: Vec<UnitStatus> =
        v.split_off(top.min(v.len())).into_iter().chain(units.iter().filter(|u| u.unit == OTHER).cloned()).collect();
    if !rest.is_empty() {
        let mut other = UnitStatus { unit: OTHER.into(), ..Default::default() };
        for u in rest {
            other.streams += u.streams;
            other.streams_observed += u.streams_observed;
            other.written_behind_bytes += u.written_behind_bytes;
            other.files_flushed += u.files_flushed;
            other.paced_secs += u.paced_secs;
            other.peak_dirty_bytes = other.peak_dirty_bytes.max(u.peak_dirty_bytes);
        }
        v.push(other);
    }
    v
}

/// The per-unit families, into `f` (control.rs adds them to metrics::families).
pub fn unit_families(f: &mut Families, units: &[UnitStatus]) {
    use Kind::{Counter, Gauge};
    let shown = top(units, TOP);
    let of = |v: &dyn Fn(&UnitStatus) -> f64| -> Vec<(Labels, f64)> {
        shown.iter().map(|u| (vec![("unit", u.unit.clone())], v(u))).collect()
    };
    f.add(
        "unit_written_behind_bytes",
        Counter,
        "bytes",
        "Bytes of the systemd unit's writers handed to writeback; the top 10 units, the rest as unit=\"other\".",
        of(&|u| u.written_behind_bytes as f64),
    );
    f.add(
        "unit_streams_started",
        Counter,
        "",
        "Streams the unit's writers started (observing ones not included).",
        of(&|u| u.streams as f64),
    );
    f.add(
        "unit_files_flushed",
        Counter,
        "",
        "Closed files of the unit's writers flushed after close.",
        of(&|u| u.files_flushed as f64),
    );
    f.add(
        "unit_paced_seconds",
        Counter,
        "seconds",
        "Time a device was paced while the unit had a stream on it.",
        of(&|u| u.paced_secs),
    );
    f.add(
        "unit_peak_dirty_bytes",
        Gauge,
        "bytes",
        "Peak dirty and writeback bytes of the devices the unit wrote to, while it did.",
        of(&|u| u.peak_dirty_bytes as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Dialect;

    fn unit(name: &str, bytes: u64) -> UnitStatus {
        UnitStatus { unit: name.into(), written_behind_bytes: bytes, streams: 1, ..Default::default() }
    }

    #[test]
    fn the_top_units_by_bytes_and_the_rest_as_other() {
        let mut v: Vec<UnitStatus> = (0..30).map(|i| unit(&format!("u{i:02}.service"), i)).collect();
        v.push(unit(OTHER, 1000));
        let t = top(&v, 10);
        assert_eq!(t.len(), 11);
        assert_eq!(t[0].unit, "u29.service");
        assert_eq!(t[9].unit, "u20.service");
        let other = &t[10];
        assert_eq!(other.unit, OTHER);
        assert_eq!(other.written_behind_bytes, (0..20).sum::<u64>() + 1000);
        assert_eq!(other.streams, 21);
        // Few units: no other.
        assert!(top(&v[..3], 10).iter().all(|u| u.unit != OTHER));
    }

    #[test]
    fn families_are_typed_and_labelled_by_unit() {
        let mut v: Vec<UnitStatus> = (0..30).map(|i| unit(&format!("u{i:02}.service"), i)).collect();
        v.push(unit("evil\"}\n.scope", 99));
        let mut f = Families::new(Dialect::Prometheus);
        unit_families(&mut f, &v);
        let text = f.finish();
        assert!(text.contains("# TYPE writebehindd_unit_written_behind_bytes_total counter\n"), "{text}");
        assert!(text.contains("# HELP writebehindd_unit_written_behind_bytes_total "), "{text}");
        assert!(text.contains("writebehindd_unit_written_behind_bytes_total{unit=\"u29.service\"} 29\n"), "{text}");
        assert!(text.contains("writebehindd_unit_written_behind_bytes_total{unit=\"other\"} "), "{text}");
        assert!(text.contains("{unit=\"evil\\\"}\\n.scope\"} 99\n"), "{text}");
        assert!(text.contains("# TYPE writebehindd_unit_peak_dirty_bytes gauge\n"), "{text}");
        let samples = text.lines().filter(|l| l.starts_with("writebehindd_unit_written_behind")).count();
        assert_eq!(samples, 11);
    }
}
