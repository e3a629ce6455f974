//! Policies per cgroup, with the real daemon and BPF: a cgroup whose policy
//! is off is left alone while its neighbour streams; SIGHUP brings a changed
//! window into force on the next span, and a broken file changes nothing.

use std::time::Duration;

use anyhow::Result;
use wb_tests::*;

/// (spans, bytes) of the stream the daemon logged for `pid`, if any.
fn stream_of(log: &str, pid: u32) -> Option<(u64, u64)> {
    let line = log.lines().find(|l| l.contains("stream ended") && l.contains(&format!("pid={pid} ")))?;
    Some((log_field(line, "spans")?.parse().ok()?, log_field(line, "bytes")?.parse().ok()?))
}

/// Spans the daemon logged for the stream of `pid`, once it has ended.
fn spans_of(d: &mut Daemon, pid: u32) -> Result<u64> {
    // The "ended" line itself: the "started" one comes first (waiting for
    // any line of the pid raced with the end of the stream).
    let log = d.wait_log(&format!("stream ended (closed) pid={pid} "), WAIT)?;
    Ok(stream_of(&log, pid).map_or(0, |s| s.0))
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_cgroup_with_mode_off_is_left_alone() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(1024)?, "ext4")?;
    let (on, off) = (Cgroup::new("on")?, Cgroup::new("off")?);
    let policy =
        format!("window = \"8MiB\"\nburst = \"1MiB\"\n[[policy]]\ncgroup = \"{}\"\nmode = \"off\"\n", off.path);
    let daemon = Daemon::start_with_policy(&policy)?;
    let on_pid = on.dd(&fs.path("on"), 128)?;
    let off_pid = off.dd(&fs.path("off"), 128)?;
    std::thread::sleep(Duration::from_millis(300));
    let log = daemon.stop()?;
    println!(
        "  dd in {}: {:?}; dd in {} (off): {:?}",
        on.path,
        stream_of(&log, on_pid),
        off.path,
        stream_of(&log, off_pid)
    );
    assert!(log.contains(&format!("cgroup={}", off.path)), "the off policy was not applied:\n{log}");
    assert!(
        stream_of(&log, on_pid).is_some_and(|(spans, _)| spans >= 8),
        "the streaming cgroup was not flushed:\n{log}"
    );
    assert!(!log.contains(&format!("pid={off_pid} ")), "the off cgroup's writer was acted on:\n{log}");
    Ok(())
}

#[test]
fn reload_changes_the_window_and_a_broken_file_changes_nothing() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(1024)?, "ext4")?;
    let cg = Cgroup::new("reload")?;
    let mut daemon = Daemon::start_with_policy("window = \"32MiB\"\nburst = \"1MiB\"\n")?;
    let before = spans_of(&mut daemon, cg.dd(&fs.path("a"), 256)?)?;

    std::fs::write(daemon.policy_file(), "window = \"8MiB\"\nburst = \"1MiB\"\n")?;
    daemon.reload();
    daemon.wait_log("policies reloaded", WAIT)?;
    let after = spans_of(&mut daemon, cg.dd(&fs.path("b"), 256)?)?;

    std::fs::write(daemon.policy_file(), "window = \"8MiB\"\nburst = \"1MiB\"\nwindw = 3\n")?;
    daemon.reload();
    daemon.wait_log("policy reload rejected", WAIT)?;
    let broken = spans_of(&mut daemon, cg.dd(&fs.path("c"), 256)?)?;
    let log = daemon.stop()?;
    println!(
        "  spans of 256 MiB: 32 MiB window {before}, after reload to 8 MiB {after}, after a broken reload {broken}"
    );
    assert!((6..=9).contains(&before), "{before} spans with a 32 MiB window:\n{log}");
    assert!((28..=33).contains(&after), "{after} spans after reloading an 8 MiB window:\n{log}");
    assert!((28..=33).contains(&broken), "{broken} spans after a broken reload:\n{log}");
    assert!(log.contains("unknown field `windw`"), "the rejection must say why:\n{log}");
    Ok(())
}
