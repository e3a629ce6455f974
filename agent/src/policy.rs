//! Policy: what the daemon does for a cgroup's writers, read from TOML.
//! Every key is declared once, in `policy_keys!`: the effective `Policy`
//! (every key set) and the `Layer` one TOML table gives (the keys it sets).
//! The embedded default (policies/default.toml) sets them all; files and
//! their `[[policy]]` tables are layers over it (see policies.rs).

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::bandwidth::Sizing;

/// The shipped default policy, compiled into the binary.
pub const DEFAULT_POLICY: &str = include_str!("../../policies/default.toml");

macro_rules! policy_keys {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty ),* $(,)?) => {
        /// The effective policy: every key has a value.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Policy {
            $( $(#[$doc])* pub $name: $ty, )*
        }

        /// The keys one policy table sets.  A file is a Layer for the root
        /// cgroup with its `[[policy]]` tables inside, each a Layer with
        /// `cgroup` set.
        #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Layer {
            $( pub(crate) $name: Option<$ty>, )*
            /// In a [[policy]] table: the cgroups it applies to.
            pub(crate) cgroup: Option<String>,
            /// At the top of a file: the per-cgroup tables.
            pub(crate) policy: Option<Vec<Layer>>,
        }

        impl Policy {
            /// Every key with its value as TOML would write it.
            pub fn lines(&self) -> Vec<(&'static str, String)> {
                vec![ $( (stringify!($name), Show::show(&self.$name)) ),* ]
            }
        }

        impl Layer {
            /// `base` with this layer's keys set.
            pub(crate) fn over(&self, base: &Policy) -> Policy {
                Policy { $( $name: self.$name.clone().unwrap_or_else(|| base.$name.clone()), )* }
            }

            fn complete(&self) -> Option<Policy> {
                Some(Policy { $( $name: self.$name.clone()?, )* })
            }

            /// The policy keys this layer sets.
            pub(crate) fn keys(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $( if self.$name.is_some() { v.push(stringify!($name)); } )*
                v
            }
        }
    };
}

policy_keys! {
    /// off, append (only writes ending at EOF stream), sequential, or
    /// observe (detected as sequential; reported, never acted on).
    mode: Mode,
    /// Per-stream window: sized from the device's bandwidth, or fixed.
    window: Window,
    /// With `window = "auto"`: this many seconds of the device's bandwidth...
    window_seconds: f64,
    /// ...within these bounds.  min_window is also the window of a device
    /// not measured yet (slow start).
    min_window: Size,
    max_window: Size,
    /// Flush the tails of files a streaming process closes (tar x, cp -r).
    multi_file: bool,
    /// Leave a file to its writer once it calls fsync, fdatasync or
    /// sync_file_range on it (databases, package managers).
    leave_synced: bool,
    /// Bytes a process may write before it counts as streaming.
    burst: Size,
    /// Idle time after which a process gets its burst allowance back.
    quiet: Duration,
    /// Seconds of the device's bandwidth the flusher keeps in flight: what
    /// an fsync elsewhere on the device waits behind.  Device-wide.
    in_flight_seconds: f64,
    /// Cap the dirty data of devices with streaming writers (bdi
    /// strict_limit).  Device-wide.
    pacing: bool,
    /// The cap: this many seconds of the device's bandwidth.  Device-wide.
    dirty_seconds: f64,
    /// Let devices whose speed a user sets (their FUSE mounts, loop devices
    /// over their files, mounts in their namespaces) drive the pacing
    /// levers too.  Device-wide.
    pace_user_devices: bool,
    /// ...but while several streams share the device, this much for each
    /// (their files' extents are as long as what is written back of them
    /// at once).  Device-wide.
    stream_dirty: Size,
    /// Devices left to the kernel: no windows, no pacing, for writers of
    /// their nodes and of the filesystems on them.  Device-wide.
    leave_devices: DeviceNames,
    on_battery: OnBattery,
}

/// A value as it would be written in a policy file.
trait Show {
    fn show(&self) -> String;
}

impl Show for f64 {
    fn show(&self) -> String {
        format!("{self}")
    }
}

impl Show for bool {
    fn show(&self) -> String {
        format!("{self}")
    }
}

impl Show for Size {
    fn show(&self) -> String {
        let units = [(1u64 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        match units.iter().find(|(u, _)| self.0 >= *u && self.0.is_multiple_of(*u)) {
            Some((u, name)) => format!("\"{}{name}\"", self.0 / u),
            None => format!("{}", self.0),
        }
    }
}

impl Show for Duration {
    fn show(&self) -> String {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) { format!("\"{}s\"", ms / 1000) } else { format!("\"{ms}ms\"") }
    }
}

impl Show for Window {
    fn show(&self) -> String {
        match self {
            Window::Auto => "\"auto\"".into(),
            Window::Fixed(s) => s.show(),
        }
    }
}

impl Show for Mode {
    fn show(&self) -> String {
        format!("\"{}\"", format!("{self:?}").to_lowercase())
    }
}

impl Show for OnBattery {
    fn show(&self) -> String {
        format!("\"{}\"", format!("{self:?}").to_lowercase())
    }
}

impl Show for DeviceNames {
    fn show(&self) -> String {
        format!("[{}]", self.0.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", "))
    }
}

/// Keys that act on a whole device, not on one cgroup's writers: only the
/// root policy (a file's top level) may set them.
pub const DEVICE_WIDE: [&str; 6] =
    ["in_flight_seconds", "pacing", "dirty_seconds", "stream_dirty", "pace_user_devices", "leave_devices"];

/// Block devices named as the administrator knows them: a kernel name
/// ("sdb", "nvme0n1p2", "mmcblk0"), its node ("/dev/sdb"), or its number
/// ("8:16"), for scripts and for mounts without a node (NFS, FUSE:
/// "0:53").  Kept as kernel names and numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceNames(pub Vec<String>);

impl DeviceNames {
    /// One entry, as kept: "/dev/" dropped; a number's parts as numbers.
    pub fn parse_one(s: &str) -> Result<String, String> {
        let name = s.strip_prefix("/dev/").unwrap_or(s);
        if let Some((maj, min)) = name.split_once(':') {
            return match (maj.parse::<u32>(), min.parse::<u32>()) {
                (Ok(a), Ok(b)) => Ok(format!("{a}:{b}")),
                _ => Err(format!("{s:?} is not a device number like \"8:16\"")),
            };
        }
        let kernel_name = |c: char| c.is_ascii_alphanumeric() || "-_.!".contains(c);
        if name.is_empty() || name.len() > 32 || name.starts_with('.') || !name.chars().all(kernel_name) {
            return Err(format!(
                "{s:?} is not a block device's kernel name (\"sdb\", \"/dev/nvme0n1\") or number (\"8:16\")"
            ));
        }
        Ok(name.to_owned())
    }

    /// Whether any of a device's names (its kernel name, its number) is
    /// listed.
    pub fn lists(&self, names: &[&str]) -> bool {
        self.0.iter().any(|n| names.contains(&n.as_str()))
    }
}

impl<'de> Deserialize<'de> for DeviceNames {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let list = Vec::<String>::deserialize(d)?;
        list.iter()
            .map(|s| DeviceNames::parse_one(s))
            .collect::<Result<Vec<_>, _>>()
            .map(DeviceNames)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Off,
    Append,
    Sequential,
    /// Streams are detected as `Sequential` would detect them; the daemon
    /// reports what it would do for them (windows, closes, pacing) and does
    /// none of it.
    Observe,
}

impl Mode {
    /// The mode under a daemon that observes everywhere (its root policy
    /// observes, or `--observe`): every acting mode observes, off stays off.
    pub fn observing(self) -> Mode {
        match self {
            Mode::Off => Mode::Off,
            Mode::Append | Mode::Sequential | Mode::Observe => Mode::Observe,
        }
    }
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

impl Policy {
    /// The root policy of one file over the embedded default (what
    /// PolicySet does with each file), for the tests below.
    #[cfg(test)]
    fn parse(text: &str) -> Result<Self> {
        crate::policies::PolicySet::from_texts(&[("policy.toml".into(), text.into())]).map(|s| s.root().clone())
    }

    pub(crate) fn validated(self) -> Result<Self> {
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

    /// What the BPF programs apply to writers under this policy.
    pub fn to_bpf(&self) -> crate::abi::wb_policy {
        use crate::abi::*;
        wb_policy {
            window: match self.window {
                Window::Fixed(w) => w.0,
                Window::Auto => 0,
            },
            min_window: self.min_window.0,
            max_window: self.max_window.0,
            burst: self.burst.0,
            quiet_ns: self.quiet.0.as_nanos() as u64,
            window_ms: (self.window_seconds * 1000.0).round() as u32,
            mode: match self.mode {
                Mode::Off => wb_mode_WB_MODE_OFF,
                Mode::Append => wb_mode_WB_MODE_APPEND,
                Mode::Sequential => wb_mode_WB_MODE_SEQUENTIAL,
                Mode::Observe => wb_mode_WB_MODE_OBSERVE,
            } as u8,
            multi_file: self.multi_file as u8,
            on_battery: match self.on_battery {
                OnBattery::Same => wb_battery_WB_BATTERY_SAME,
                OnBattery::Lazy => wb_battery_WB_BATTERY_LAZY,
                OnBattery::Off => wb_battery_WB_BATTERY_OFF,
            } as u8,
            leave_synced: self.leave_synced as u8,
        }
    }

    /// The window of a device not measured yet (fixed, or min_window).
    pub fn initial_window(&self) -> u64 {
        match self.window {
            Window::Fixed(w) => w.0,
            Window::Auto => self.min_window.0,
        }
    }

    /// How windows follow bandwidth, or None for a fixed window.
    pub fn sizing(&self, on_battery: bool) -> Option<Sizing> {
        let lazy = if on_battery && self.on_battery == OnBattery::Lazy {
            f64::from(crate::abi::WB_BATTERY_LAZY_FACTOR)
        } else {
            1.0
        };
        (self.window == Window::Auto).then_some(Sizing {
            window_seconds: self.window_seconds * lazy,
            min_window: self.min_window.0,
            max_window: self.max_window.0,
            dirty_seconds: self.dirty_seconds * lazy,
        })
    }

    pub fn embedded_default() -> Self {
        let layer: Layer = toml::from_str(DEFAULT_POLICY).expect("policies/default.toml parses");
        layer
            .complete()
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
        assert_eq!(p.to_bpf().window, 8 << 20);
        assert_eq!(p.to_bpf().on_battery, crate::abi::wb_battery_WB_BATTERY_OFF as u8);
        assert!(p.sizing(false).is_none());
        let auto = Policy::parse("window_seconds = 1\non_battery = \"lazy\"").unwrap();
        assert_eq!(auto.sizing(false).unwrap().window_seconds, 1.0);
        assert_eq!(auto.sizing(true).unwrap().window_seconds, 4.0);
    }

    #[test]
    fn devices_are_named_by_kernel_name_node_or_number() {
        let p = Policy::parse("leave_devices = [\"sdb\", \"/dev/nvme0n1p2\", \"8:032\", \"0:53\"]").unwrap();
        assert_eq!(p.leave_devices.0, ["sdb", "nvme0n1p2", "8:32", "0:53"]);
        assert!(p.leave_devices.lists(&["8:32", "sdc"]) && p.leave_devices.lists(&["7:0", "sdb"]));
        assert!(!p.leave_devices.lists(&["8:16", "sdb1"]), "a disk's entry is not its partition's");
        assert!(Policy::embedded_default().leave_devices.0.is_empty());
        assert_eq!(
            p.lines().iter().find(|l| l.0 == "leave_devices").unwrap().1,
            r#"["sdb", "nvme0n1p2", "8:32", "0:53"]"#
        );
        let err = |t: &str| format!("{:#}", Policy::parse(t).unwrap_err());
        assert!(err("leave_devices = [\"/dev/../etc\"]").contains("kernel name"));
        assert!(err("leave_devices = [\"\"]").contains("kernel name"));
        assert!(err("leave_devices = [\"8:x\"]").contains("device number"));
        assert!(err("leave_devices = \"sdb\"").contains("invalid type"));
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
        let err = |t: &str| format!("{:#}", Policy::parse(t).unwrap_err());
        assert!(err("# only a comment\n").contains("sets no policy key"));
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
