//! Policy: what the daemon does, read from TOML.  For now only the embedded
//! default (policies/default.toml) with a fixed window.

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The shipped default policy, compiled into the binary.
pub const DEFAULT_POLICY: &str = include_str!("../../policies/default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Unflushed sequential bytes per stream that trigger writeback.
    pub window: Size,
    /// Bytes a process may write before it counts as streaming.
    pub burst: Size,
    /// Idle time after which a process gets its burst allowance back.
    pub quiet: Duration,
}

impl Policy {
    pub fn parse(text: &str) -> Result<Self> {
        let p: Policy = toml::from_str(text)?;
        if p.window.0 < 4096 {
            bail!("window must be at least 4KiB, got {} bytes", p.window.0);
        }
        Ok(p)
    }

    /// What the BPF programs need of it.
    pub fn bpf_config(&self) -> crate::abi::wb_config {
        crate::abi::wb_config {
            window: self.window.0,
            burst: self.burst.0,
            quiet_ns: self.quiet.0.as_nanos() as u64,
        }
    }

    pub fn embedded_default() -> Self {
        Self::parse(DEFAULT_POLICY).context("embedded default policy").expect("policies/default.toml is valid")
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
            other => return Err(format!("unknown size unit {other:?} (use B, KiB, MiB, GiB or TiB)")),
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
        assert_eq!(p.window, Size(16 << 20));
        assert_eq!(p.burst, Size(64 << 20));
        assert_eq!(p.quiet, Duration(std::time::Duration::from_secs(5)));
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
        assert!(Policy::parse(&format!("{ok}windw = 1")).is_err());
        assert!(Policy::parse(&ok.replace("\"16MiB\"", "-5")).is_err());
        assert!(Policy::parse(&ok.replace("\"16MiB\"", "\"1KiB\"")).is_err());
        assert!(Policy::parse(&ok.replace("\"5s\"", "5")).is_err());
        assert!(Policy::parse("").is_err());
    }
}
