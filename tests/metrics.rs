//! The metrics of a live daemon: `wbctl metrics` passes `promtool check
//! metrics` while a stream runs, and a device's families carry its name
//! (kernel name and mount point) beside its number.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use wb_tests::*;

/// `promtool check metrics` on `text`: its verdict and what it said.
fn promtool(text: &str) -> Result<(bool, String)> {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("promtool (apt install prometheus)")?;
    p.stdin.take().unwrap().write_all(text.as_bytes())?;
    let out = p.wait_with_output()?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), said))
}

#[test]
fn promtool_passes_the_metrics_of_a_stream_and_devices_are_named() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(1024)?, "ext4")?;
    let mut d = Daemon::start()?;
    let out = fs.path("copy");
    let dd = Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", out.display()), "bs=1M", "count=400", "status=none"])
        .status()?;
    assert!(dd.success());
    let log = d.wait_log("stream started", Duration::from_secs(10))?;

    let metrics = d.wbctl().arg("metrics").output()?;
    assert!(metrics.status.success(), "{}", String::from_utf8_lossy(&metrics.stderr));
    let text = String::from_utf8(metrics.stdout)?;
    let (ok, said) = promtool(&text)?;
    assert!(ok, "promtool check metrics:\n{said}\n{text}");

    // The device by its number and its name, in the daemon's families and
    // in the family of every bdi.
    let (bdi, name) = (fs.bdi()?, format!("{} {}", fs.device.name(), fs.dir.display()));
    let labels = format!("{{bdi=\"{bdi}\",name=\"{name}\"}}");
    for family in
        ["writebehindd_device_dirty_bytes", "writebehindd_device_paced", "writebehindd_bdi_written_bytes_total"]
    {
        assert!(text.contains(&format!("{family}{labels} ")), "no {family}{labels}:\n{text}");
    }
    // One family per counter, not one for all of them.
    assert!(text.contains("writebehindd_streams_started_total ") && !text.contains("what="), "{text}");
    // The dd's unit (whatever runs the test: "-" in no unit) by its bytes.
    let unit_bytes = text
        .lines()
        .filter_map(|l| l.strip_prefix("writebehindd_unit_written_behind_bytes_total{unit=\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(unit_bytes > 0.0, "no unit with bytes written behind:\n{text}");
    // Bdis the daemon never wrote to are listed too (the root disk's, others' loop devices).
    let bdis = text.lines().filter(|l| l.starts_with("writebehindd_bdi_written_bytes_total{")).count();
    assert!(bdis >= 2, "{text}");

    // The OpenMetrics dialect, for the HTTP endpoint, reads as OpenMetrics.
    let om = d.wbctl().args(["metrics", "--openmetrics"]).output()?;
    let om = String::from_utf8(om.stdout)?;
    assert!(om.contains("# TYPE writebehindd_streams_started counter\n"), "{om}");
    assert!(om.contains(&format!("writebehindd_device_dirty_bytes{labels} ")), "{om}");

    // wbctl's tables and the journal name it too.
    let status = String::from_utf8(d.wbctl().arg("status").output()?.stdout)?;
    let row = status.lines().find(|l| l.starts_with(&bdi)).unwrap_or_default();
    assert!(row.ends_with(&name), "{status}");
    let devices = String::from_utf8(d.wbctl().arg("devices").output()?.stdout)?;
    assert!(devices.contains(&name), "{devices}");
    let started = log.lines().find(|l| l.contains("stream started")).unwrap_or_default();
    assert!(started.contains(&format!("name={name}")), "{started}");

    // Mounted once more (a bind mount): the name follows the mount table.
    let bind = std::path::PathBuf::from(format!("/mnt/wb-names-bind-{}", std::process::id()));
    std::fs::create_dir_all(&bind)?;
    run(Command::new("mount").arg("--bind").arg(&fs.dir).arg(&bind))?;
    std::thread::sleep(Duration::from_millis(500));
    let devices = String::from_utf8(d.wbctl().arg("devices").output()?.stdout);
    let _ = Command::new("umount").arg(&bind).status();
    let _ = std::fs::remove_dir(&bind);
    let devices = devices?;
    assert!(devices.contains(&format!("{name} {}", bind.display())), "the bind mount not in the name:\n{devices}");
    d.stop()?;
    Ok(())
}
