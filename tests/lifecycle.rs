//! The daemon's life: it refuses to start without privileges, and once it
//! exits nothing of it stays in the kernel.

use std::process::Command;

use anyhow::Result;
use wb_tests::*;

/// Names of loaded BPF programs (bpftool prog list), to look for ours.
fn loaded_programs() -> Result<String> {
    run(Command::new("bpftool").args(["prog", "list"]))
}

#[test]
fn refuses_to_start_unprivileged() -> Result<()> {
    require_root();
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(bin_dir().join("writebehindd"))
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without privileges");
    assert!(stderr.contains("must run as root"), "unclear refusal: {stderr}");
    Ok(())
}

#[test]
fn leaves_nothing_attached_after_exit() -> Result<()> {
    require_root();
    let daemon = Daemon::start()?;
    let attached = loaded_programs()?;
    // wb_process_exit is attached on either backend.
    assert!(attached.contains("name wb_process_exit"), "programs not visible while running:\n{attached}");
    daemon.stop()?;
    // The kernel frees a program after its last reference goes, through
    // RCU: give it a moment, but not forever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let after = loaded_programs()?;
        if !after.contains("name wb_") {
            return Ok(());
        }
        assert!(std::time::Instant::now() < deadline, "left behind 5 s after exit:\n{after}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
