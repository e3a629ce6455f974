//! lintian: the tags that stay, each with its reason, shipped as the
//! package's override file (lintian prints the comment with the tag); and
//! the check that nothing else is reported at warning level or above.

use std::{path::Path, process::Command};

use anyhow::{Result, ensure};

use super::PACKAGE;

/// (tag and context pattern, why it stays)
const OVERRIDES: &[(&str, &str)] = &[(
    "command-with-path-in-maintainer-script /usr/sbin/writebehindd *",
    "prerm runs the packaged daemon's --restore by its path on purpose: found on PATH, \
     /usr/local/bin/writebehindd (cargo xtask install) would come first.",
)];

/// /usr/share/lintian/overrides/writebehindd
pub const FILE: &str = "usr/share/lintian/overrides/writebehindd";

pub fn overrides() -> String {
    OVERRIDES.iter().map(|(tag, why)| format!("# {why}\n{PACKAGE}: {tag}\n")).collect()
}

/// Fails on any error or warning lintian reports (also clean at
/// --pedantic). Its info tags are printed only; they say:
/// * hardening-no-fortify-functions: Rust code calls no glibc functions
///   that _FORTIFY_SOURCE would check (its own bounds checks do that job);
/// * spelling-error-in-binary prefered: the kernel's own netlink names
///   (temp_prefered_lft), inside aya;
/// * package-supports-alternative-init-but-no-init.d-script: the daemon is
///   a systemd service (Type=notify, watchdog); without systemd it is run
///   by hand, as the README says, so there is no init.d script to ship.
pub fn check(deb: &Path) -> Result<()> {
    let out = Command::new("lintian").args(["--display-info", "--tag-display-limit", "0"]).arg(deb).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("lintian:\n{text}");
    let bad: Vec<&str> = text.lines().filter(|l| l.starts_with("E: ") || l.starts_with("W: ")).collect();
    ensure!(bad.is_empty(), "lintian: {} errors or warnings:\n{}", bad.len(), bad.join("\n"));
    // Exit 2 is lintian's own failure; tags are judged above.
    ensure!(out.status.code() != Some(2), "lintian failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
