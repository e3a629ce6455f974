//! Pacing through the bdi's own dirty limits (issue 5): set while a streaming
//! writer is active, the administrator's values back afterwards — after a
//! clean stop, and after kill -9 at the next start — and hands off once an
//! administrator changes them.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Result;
use wb_tests::*;

/// A streaming writer that lasts a while: 1.5 GiB at 150 MiB/s.
fn writer(fs: &Mounted) -> Result<Child> {
    let dst = fs.path("stream");
    Ok(Command::new("sh")
        .arg("-c")
        .arg(format!("head -c 1536M /dev/zero | pv -qL 150m > {}", dst.display()))
        .stdin(Stdio::null())
        .spawn()?)
}

#[test]
fn bdi_limits_are_set_while_streaming_and_restored() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    // Whatever happens below, the test leaves these as it found them.
    let original = knobs.values();
    let _guards = [
        Knob::set(&format!("{}/max_ratio_fine", knobs.dir), &original.0)?,
        Knob::set(&format!("{}/strict_limit", knobs.dir), &original.1)?,
    ];
    println!("  original max_ratio_fine={} strict_limit={}", original.0, original.1);

    // Set while streaming, restored by a clean stop (the writer still runs).
    let daemon = Daemon::start()?;
    let mut w = writer(&fs)?;
    knobs.wait_for("1", "while streaming")?;
    println!("  paced: max_bytes={}", knobs.get("max_bytes"));
    let log = daemon.stop()?;
    assert_eq!(knobs.values(), original, "a clean stop restores the limits:\n{log}");
    assert!(log.contains("pacing on") && log.contains("bdi limits restored"), "{log}");
    w.wait()?;

    // kill -9 leaves them set; the next start puts them back.
    let daemon = Daemon::start()?;
    let mut w = writer(&fs)?;
    knobs.wait_for("1", "second run")?;
    daemon.kill()?;
    w.wait()?;
    assert_eq!(knobs.get("strict_limit"), "1", "a killed daemon cannot restore");
    let daemon = Daemon::start()?;
    assert_eq!(knobs.values(), original, "the next start restores what a killed run left");
    let log = daemon.stop()?;
    assert!(log.contains("left set by a previous run"), "{log}");

    // An administrator's change wins: the daemon stops pacing and leaves it.
    let daemon = Daemon::start()?;
    let mut w = writer(&fs)?;
    knobs.wait_for("1", "third run")?;
    std::fs::write(format!("{}/strict_limit", knobs.dir), "0")?;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(knobs.get("strict_limit"), "0", "the daemon must not undo the administrator");
    let log = daemon.stop()?;
    w.wait()?;
    assert!(log.contains("changed by someone else"), "{log}");
    assert_eq!(knobs.get("strict_limit"), "0", "nor restore over the administrator at exit");
    Ok(())
}
