//! Each writer's systemd unit, read from its cgroup: a dd in a cgroup named
//! like a service (systemd is not PID 1 on this host, so no systemd-run:
//! xtask/guest/systest.sh checks a real transient unit in a guest) shows
//! in `wbctl units --json` with what was written behind, and its journal
//! line names the unit and the cgroup.

use std::time::Duration;

use anyhow::{Context, Result};
use wb_tests::*;

#[test]
fn a_units_writer_is_accounted_and_logged_by_unit() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(512)?, "ext4")?;
    let mut daemon = Daemon::start()?;
    let cg = Cgroup::new("backup.service")?;
    let unit = cg.path.trim_start_matches('/').to_owned();
    cg.dd(&fs.path("backup"), 128)?;
    let line = daemon.wait_log("stream started", Duration::from_secs(10))?;
    let units = wait_units(&daemon, &unit)?;
    let mine = units
        .as_array()
        .context("units is a list")?
        .iter()
        .find(|u| u["unit"] == unit.as_str())
        .with_context(|| format!("no unit {unit} in {units}"))?;
    assert!(mine["written_behind_bytes"].as_u64().unwrap_or(0) > 0, "{mine}");
    assert!(mine["streams"].as_u64().unwrap_or(0) >= 1, "{mine}");
    assert_eq!(mine["cgroup"], cg.path.as_str(), "{mine}");
    eprintln!("wbctl units --json: {mine}");
    // The line of the dd's stream: the test's own may not be the first.
    let log = daemon.log_text();
    let ours = log
        .lines()
        .find(|l| l.contains("stream started") && log_field(l, "unit") == Some(unit.as_str()))
        .with_context(|| format!("no stream started line with unit={unit}; first was {line}\n{log}"))?;
    assert_eq!(log_field(ours, "cgroup"), Some(cg.path.as_str()), "{ours}");
    eprintln!("journal line: {ours}");
    // The table too.
    let text = String::from_utf8(daemon.wbctl().arg("units").output()?.stdout)?;
    assert!(text.lines().any(|l| l.starts_with(&unit)), "{text}");
    daemon.stop()?;
    Ok(())
}

/// `wbctl units --json`, once it lists `unit` with bytes written behind.
fn wait_units(daemon: &Daemon, unit: &str) -> Result<serde_json::Value> {
    let mut last = serde_json::Value::Null;
    let found = wait_until("the unit's bytes in wbctl units", Duration::from_secs(10), || {
        let out = daemon.wbctl().args(["units", "--json"]).output()?;
        last = serde_json::from_slice(&out.stdout)?;
        Ok(last
            .as_array()
            .is_some_and(|v| v.iter().any(|u| u["unit"] == unit && u["written_behind_bytes"].as_u64() > Some(0))))
    });
    found.with_context(|| format!("last answer: {last}"))?;
    Ok(last)
}
