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

/// The unit's CapabilityBoundingSet and NoNewPrivileges, applied by setpriv
/// (read from systemd/writebehindd.service, not copied): the daemon still
/// attaches and flushes a streaming writer.
#[test]
fn works_within_the_units_bounding_set() -> Result<()> {
    require_root();
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/writebehindd.service"))?;
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let bounding = format!("-all,{}", caps.join(","));
    let fs = Mounted::new(LoopDevice::new(512)?, "ext4")?;
    let daemon = Daemon::start_wrapped(
        &["setpriv", "--bounding-set", &bounding, "--inh-caps", "-all", "--no-new-privs", "--"],
        Some("window = \"8MiB\"\nburst = \"4MiB\"\n"),
    )?;
    sh(&format!("dd if=/dev/zero of={} bs=1M count=64 status=none", fs.path("f").display()))?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let log = daemon.stop()?;
    assert!(log.contains("stream started") && log.contains("errors=[]"), "bounding set {bounding}:\n{log}");
    Ok(())
}

/// A kernel without BTF (hidden here in a private mount namespace) gets a
/// refusal that names the cause and the fix, not a panic.
#[test]
fn missing_btf_is_a_clear_error() -> Result<()> {
    require_root();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("mount -t tmpfs none /sys/kernel/btf && exec {}", bin_dir().join("writebehindd").display()))
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without BTF");
    assert!(stderr.contains("CONFIG_DEBUG_INFO_BTF") && !stderr.contains("panicked"), "unclear: {stderr}");
    Ok(())
}
