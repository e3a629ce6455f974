//! Policy: what the daemon does, read from TOML.  A file is a `Layer`: the
//! keys it sets, over the embedded default (policies/default.toml), which
//! sets them all.

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::bandwidth::Sizing;

/// The shipped default policy, compiled into the binary.
pub const DEFAULT_POLICY: &str = include_str!("../../policies/default.toml");

/// The effective policy: every key has a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Per-stream window: sized from the device's bandwidth, or fixed.
    pub window: Window,
    /// With `window = "auto"`: this many seconds of the device's bandwidth...
    pub window_seconds: f64,
    /// ...within these bounds.  min_window is also the window of a device
    /// not measured yet (slow start).
    pub min_window: Size,
    pub max_window: Size,
    /// Bytes a process may write before it counts as streaming.
    pub burst: Size,
    /// Idle time after which a process gets its burst allowance back.
    pub quiet: Duration,
    /// Seconds of the device's bandwidth the flusher keeps in flight: what
    /// an fsync elsewhere on the device waits behind.
    pub in_flight_seconds: f64,
    /// Cap the dirty data of devices with streaming writers (bdi strict_limit).
    pub pacing: bool,
    /// The cap: this many seconds of the device's bandwidth.
    pub dirty_seconds: f64,
    pub on_battery: OnBattery,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBattery {
    /// As on mains power.
    Same,
    /// Windows four times longer: fewer, larger bursts of writing let the
    /// device idle longer in between.
    Lazy,
    /// No write-behind, no pacing: the kernel's defaults.
    Off,
}

/// "auto" or a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Auto,
    Fixed(Size),
}

impl<'de> Deserialize<'de> for Window {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = toml::Value::deserialize(d)?;
        if v.as_str() == Some("auto") {
            return Ok(Window::Auto);
        }
        Size::deserialize(v).map(Window::Fixed).map_err(|e| serde::de::Error::custom(format!("{e} or \"auto\"")))
    }
}

/// The keys one policy file sets.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    window: Option<Window>,
    window_seconds: Option<f64>,
    min_window: Option<Size>,
    max_window: Option<Size>,
    in_flight_seconds: Option<f64>,
    burst: Option<Size>,
    quiet: Option<Duration>,
    pacing: Option<bool>,
    dirty_seconds: Option<f64>,
    on_battery: Option<OnBattery>,
}

impl Layer {
    /// `base` with this layer's keys set.
    fn over(&self, base: &Policy) -> Policy {
        Policy {
            window: self.window.unwrap_or(base.window),
            window_seconds: self.window_seconds.unwrap_or(base.window_seconds),
            min_window: self.min_window.unwrap_or(base.min_window),
            max_window: self.max_window.unwrap_or(base.max_window),
            in_flight_seconds: self.in_flight_seconds.unwrap_or(base.in_flight_seconds),
            burst: self.burst.unwrap_or(base.burst),
            quiet: self.quiet.unwrap_or(base.quiet),
            pacing: self.pacing.unwrap_or(base.pacing),
            dirty_seconds: self.dirty_seconds.unwrap_or(base.dirty_seconds),
            on_battery: self.on_battery.unwrap_or(base.on_battery),
        }
    }
}

impl Policy {
    /// A policy file's keys over the embedded default.
    pub fn parse(text: &str) -> Result<Self> {
        let layer: Layer = toml::from_str(text)?;
        if layer == Layer::default() {
            bail!("the file sets no policy key (an empty policy is almost certainly a mistake)");
        }
        layer.over(&Self::embedded_default()).validated()
    }

    fn validated(self) -> Result<Self> {
        let secs = |name: &str, v: f64| {
            if !(v.is_finite() && v > 0.0 && v <= 3600.0) {
                bail!("{name} must be a number of seconds above 0 (at most 3600), got {v}");
            }
            Ok(())
        };
        secs("window_seconds", self.window_seconds)?;
        secs("dirty_seconds", self.dirty_seconds)?;
        secs("in_flight_seconds", self.in_flight_seconds)?;
        if let Window::Fixed(w) = self.window
            && w.0 < 4096
        {
            bail!("window must be at least 4KiB, got {} bytes", w.0);
        }
        if self.min_window.0 < 4096 {
            bail!("min_window must be at least 4KiB, got {} bytes", self.min_window.0);
        }
        if self.min_window.0 > self.max_window.0 {
            bail!("min_window ({}) is larger than max_window ({})", self.min_window.0, self.max_window.0);
        }
        Ok(self)
    }

    /// What the BPF programs need of it.  `window` there is the window of
    /// devices the agent has no measured window for yet.
    pub fn bpf_config(&self, on_battery: bool) -> crate::abi::wb_config {
        let window = match (on_battery && self.on_battery == OnBattery::Off, self.window) {
            (true, _) => 0,
            (false, Window::Fixed(w)) => w.0,
            (false, Window::Auto) => self.min_window.0,
        };
        crate::abi::wb_config { window, burst: self.burst.0, quiet_ns: self.quiet.0.as_nanos() as u64 }
    }

    /// How windows follow bandwidth, or None for a fixed window.
    pub fn sizing(&self, on_battery: bool) -> Option<Sizing> {
        let lazy = if on_battery && self.on_battery == OnBattery::Lazy { 4.0 } else { 1.0 };
        (self.window == Window::Auto).then_some(Sizing {
            window_seconds: self.window_seconds * lazy,
            min_window: self.min_window.0,
            max_window: self.max_window.0,
            dirty_seconds: self.dirty_seconds * lazy,
        })
    }

    pub fn embedded_default() -> Self {
        let layer: Layer = toml::from_str(DEFAULT_POLICY).expect("policies/default.toml parses");
        let complete = |l: &Layer| -> Option<Policy> {
            Some(Policy {
                window: l.window?,
                window_seconds: l.window_seconds?,
                min_window: l.min_window?,
                max_window: l.max_window?,
                in_flight_seconds: l.in_flight_seconds?,
                burst: l.burst?,
                quiet: l.quiet?,
                pacing: l.pacing?,
                dirty_seconds: l.dirty_seconds?,
                on_battery: l.on_battery?,
            })
        };
        complete(&layer)
            .context("policies/default.toml must set every key")
            .and_then(Policy::validated)
            .expect("policies/default.toml is a complete, valid policy")
    }
}

/// "16MiB" -> (16, "MiB"): leading digits, then the rest, trimmed.
fn number_and_unit<'a>(s: &'a str, expected: &str) -> Result<(u64, &'a str), String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n = num.parse().map_err(|_| format!("expected {expected}, got {s:?}"))?;
    Ok((n, unit.trim()))
}

/// A duration written as "500ms" or "5s".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a duration like \"500ms\" or \"5s\"")?;
        match unit {
            "ms" => Ok(Duration(std::time::Duration::from_millis(n))),
            "s" => Ok(Duration(std::time::Duration::from_secs(n))),
            other => Err(format!("unknown duration unit {other:?} (use ms or s)")),
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Duration::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A byte count written as "16MiB", "512KiB", "4096" or 4096.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a size like \"16MiB\"")?;
        let mult: u64 = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            other => {
                return Err(format!("unknown size unit {other:?} (use B, KiB, MiB, GiB or TiB)"));
            }
        };
        n.checked_mul(mult).map(Size).ok_or_else(|| format!("size {s:?} is too large"))
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n >= 0 => Ok(Size(n as u64)),
            Raw::Int(n) => Err(serde::de::Error::custom(format!("size must not be negative, got {n}"))),
            Raw::Str(s) => Size::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(Size::parse("16MiB"), Ok(Size(16 << 20)));
        assert_eq!(Size::parse("512KiB"), Ok(Size(512 << 10)));
        assert_eq!(Size::parse("4096"), Ok(Size(4096)));
        assert!(Size::parse("-1MiB").is_err());
        assert!(Size::parse("16MB").is_err());
        assert!(Size::parse("99999999999999GiB").is_err());
    }

    #[test]
    fn embedded_default() {
        let p = Policy::embedded_default();
        assert_eq!(p.window, Window::Auto);
        assert_eq!(p.burst, Size(16 << 20));
        assert_eq!(p.quiet, Duration(std::time::Duration::from_secs(5)));
        assert!(p.pacing);
    }

    #[test]
    fn a_file_sets_only_what_it_names() {
        let p = Policy::parse("window = \"8MiB\"\non_battery = \"off\"\n").unwrap();
        assert_eq!(p.window, Window::Fixed(Size(8 << 20)));
        assert_eq!(p.on_battery, OnBattery::Off);
        assert_eq!(p.burst, Policy::embedded_default().burst);
        assert_eq!(p.bpf_config(true).window, 0);
        assert_eq!(p.bpf_config(false).window, 8 << 20);
        assert!(p.sizing(false).is_none());
        let auto = Policy::parse("window_seconds = 1\non_battery = \"lazy\"").unwrap();
        assert_eq!(auto.sizing(false).unwrap().window_seconds, 1.0);
        assert_eq!(auto.sizing(true).unwrap().window_seconds, 4.0);
    }

    #[test]
    fn durations() {
        assert_eq!(Duration::parse("500ms").unwrap().0.as_millis(), 500);
        assert_eq!(Duration::parse("2s").unwrap().0.as_secs(), 2);
        assert!(Duration::parse("2").is_err());
        assert!(Duration::parse("-1s").is_err());
        assert!(Duration::parse("1h").is_err());
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        let ok = "window = \"16MiB\"\nburst = \"64MiB\"\nquiet = \"5s\"\n";
        assert!(Policy::parse(ok).is_ok());
        assert!(Policy::parse("# only a comment\n").unwrap_err().to_string().contains("sets no policy key"));
        let err = |t: &str| Policy::parse(t).unwrap_err().to_string();
        assert!(err(&format!("{ok}windw = 1")).contains("unknown field `windw`"));
        assert!(err(&ok.replace("\"16MiB\"", "-5")).contains("must not be negative"));
        assert!(err(&ok.replace("\"16MiB\"", "\"1KiB\"")).contains("at least 4KiB"));
        assert!(err(&ok.replace("\"5s\"", "5")).contains("invalid type"));
        assert!(err("window = \"fast\"").contains("or \"auto\""));
        assert!(err("window_seconds = -1").contains("above 0"));
        assert!(err("dirty_seconds = nan").contains("above 0"));
        assert!(err("min_window = \"8MiB\"\nmax_window = \"4MiB\"").contains("larger than max_window"));
        assert!(err("on_battery = \"sometimes\"").contains("unknown variant"));
        assert!(err("pacing = \"yes\"").contains("invalid type"));
    }
}
