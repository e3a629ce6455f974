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
}

impl Policy {
    pub fn parse(text: &str) -> Result<Self> {
        let p: Policy = toml::from_str(text)?;
        if p.window.0 < 4096 {
            bail!("window must be at least 4KiB, got {} bytes", p.window.0);
        }
        Ok(p)
    }

    pub fn embedded_default() -> Self {
        Self::parse(DEFAULT_POLICY).context("embedded default policy").expect("policies/default.toml is valid")
    }
}

/// A byte count written as "16MiB", "512KiB", "4096" or 4096.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num.parse().map_err(|_| format!("expected a size like \"16MiB\", got {s:?}"))?;
        let mult: u64 = match unit.trim() {
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
    fn embedded_default_is_16mib() {
        assert_eq!(Policy::embedded_default().window, Size(16 << 20));
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(Policy::parse("window = \"16MiB\"\nwindw = 1").is_err());
        assert!(Policy::parse("window = -5").is_err());
        assert!(Policy::parse("window = \"1KiB\"").is_err());
        assert!(Policy::parse("").is_err());
    }
}
