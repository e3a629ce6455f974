//! Multi-file streaming writers (tar x, cp -r) and the costs write-behind
//! must not add (seed 004): temp files and zero-then-overwrite written once.

use std::time::Instant;

use anyhow::Result;
use wb_tests::*;

/// Device dirty pages must stay under these with the daemon.  tar x stays
/// near the burst allowance (16 MiB, cache-only by design) plus a window
/// or two.  cp -r from tmpfs writes faster than even this loop device, so
/// it peaks higher (it is paced only down to the device's dirty budget,
/// which is large on an uncapped loop device).
const TAR_BOUND: u64 = 192 * MIB;
const CP_BOUND: u64 = 512 * MIB;

/// These tests check the multi-file mechanics, not the sizing (the bench
/// does that on a capped device).  This uncapped loop device writes up to
/// ~1 GB/s, where the default policy allows 1 s of dirty data and 100 ms
/// windows; cap both so the bounds above hold on any machine.
const POLICY: &str = "max_window = \"16MiB\"\ndirty_seconds = 0.25\n";

struct Source {
    _shm: Scratch,
    tree: std::path::PathBuf,
    tarball: std::path::PathBuf,
    bytes: u64,
}

/// ≥ 20,000 incompressible files of 1 KiB–256 KiB (fewer when scaled), and
/// a tarball of them.
fn small_files() -> Result<Source> {
    let shm = Scratch::new_in("/dev/shm", "tar")?;
    let tree = shm.0.join("tree");
    let bytes = random_tree(&tree, scaled(20_000) as u32, 1024, 256 * 1024, 7)?;
    let tarball = shm.0.join("src.tar");
    sh(&format!("tar -cf {} -C {} .", tarball.display(), tree.display()))?;
    Ok(Source { _shm: shm, tree, tarball, bytes })
}

/// 100 files of 0–64 MiB, like Khlebnikov's cp -r demo.
fn big_files() -> Result<Source> {
    let shm = Scratch::new_in("/dev/shm", "cp")?;
    let tree = shm.0.join("tree");
    let bytes = random_tree(&tree, 100, 0, 64 * MIB, 11)?;
    Ok(Source { _shm: shm, tarball: tree.clone(), tree, bytes })
}

/// Runs `work` on the filesystem, sampling its device, and syncs after it.
fn run_on(fs: &Mounted, src: &Source, dst: &str, work: &str) -> Result<Peak> {
    let out = fs.path(dst);
    sh(&format!("rm -rf {0} && sync", out.display()))?;
    let sampler = Sampler::start(&fs.bdi()?)?;
    sh(&work.replace("{src}", &src.tarball.display().to_string()).replace("{dst}", &out.display().to_string()))?;
    let peak = sampler.finish();
    let t = Instant::now();
    sh("sync")?;
    println!(
        "    {dst} on {}: peak dirty {} MiB, sync after {:.2} s",
        fs.fstype,
        peak.dirty / MIB,
        t.elapsed().as_secs_f64()
    );
    Ok(peak)
}

/// The result, read back from the device (after a remount), is the source.
fn check(fs: &Mounted, src: &Source, dst: &str) -> Result<()> {
    fs.remount()?;
    assert!(same_tree(&src.tree, &fs.path(dst))?, "{dst} on {} differs from its source", fs.fstype);
    Ok(())
}

const ALL_FS: &[&str] = &["ext4", "xfs", "btrfs"];

fn streaming_held(fstypes: &[&str], src: &Source, dst: &str, work: &str, device_mib: u64, bound: u64) -> Result<()> {
    for &fstype in fstypes {
        let fs = Mounted::new(LoopDevice::new(device_mib)?, fstype)?;
        println!("  {fstype}, {} MiB in the source:", src.bytes / MIB);
        let default = run_on(&fs, src, dst, work)?;
        check(&fs, src, dst)?;
        let daemon = Daemon::start_with_policy(POLICY)?;
        let held = run_on(&fs, src, dst, work)?;
        let log = daemon.stop()?;
        check(&fs, src, dst)?;
        assert!(
            held.dirty < bound,
            "{fstype}: dirty reached {} MiB with the daemon (bound {} MiB)\n{log}",
            held.dirty / MIB,
            bound / MIB
        );
        // btrfs flushes many small files itself (measured: tar x of 20,000
        // files peaks at ~42 MiB without the daemon), so only ext4 and xfs
        // show what the daemon prevents. Without the daemon the peak varies
        // from run to run (1488–2403 MiB for cp -r of 3.2 GiB): the test
        // needs only that it lies clearly above the bound.
        if fstype != "btrfs" {
            assert!(
                default.dirty > bound + bound / 2,
                "{fstype}: without the daemon dirty stayed at {} MiB: the test shows nothing",
                default.dirty / MIB
            );
        }
        // Every event reached its file: by the writer's fd or by handle.
        assert!(log.contains("errors=[]"), "{fstype}: some events reached no file\n{log}");
    }
    Ok(())
}

#[test]
fn tar_x_of_20000_files_is_held() -> Result<()> {
    require_root();
    let src = small_files()?;
    // Scaled down (vmtest), the tree is smaller than the default's bound
    // allows to show: hold it to a quarter of the source instead.
    let bound = if scale() > 1 { src.bytes / 4 } else { TAR_BOUND };
    streaming_held(ALL_FS, &src, "x", "mkdir -p {dst} && tar -xf {src} -C {dst}", scaled(8 * 1024), bound)
}

#[test]
fn cp_r_of_100_files_is_held() -> Result<()> {
    require_root();
    let src = big_files()?;
    streaming_held(ALL_FS, &src, "copy", "cp -r {src} {dst}", 8 * 1024, CP_BOUND)
}

/// rsync's receiver writes each file under a temporary name and renames it:
/// a multi-file writer too, and the child of the process that was started.
/// ext4 only: the filesystems differ in nothing rsync does that cp -r does
/// not already show, and CI's time is bounded (measured on all three:
/// docs/measurements.md, session 2).
#[test]
fn rsync_of_100_files_is_held() -> Result<()> {
    require_root();
    let src = big_files()?;
    streaming_held(&["ext4"], &src, "rsync", "rsync -a --whole-file {src}/ {dst}/", 8 * 1024, CP_BOUND)
}

/// Bytes `work` makes reach the device, including the sync after it.
fn bytes_written(fs: &Mounted, work: &str) -> Result<u64> {
    sh("sync")?;
    let before = fs.device.bytes_written()?;
    sh(&work.replace("{dir}", &fs.dir.display().to_string()))?;
    sh("sync")?;
    Ok(fs.device.bytes_written()? - before)
}

#[test]
fn temp_files_and_overwrites_are_written_once() -> Result<()> {
    require_root();
    let shm = Scratch::new_in("/dev/shm", "temp")?;
    // Both workloads stay under the default burst allowance (16 MiB): that
    // is the data write-behind promises to leave cache-only.
    random_tree(&shm.0.join("t"), 100, 1024, 200 * 1024, 3)?;
    let tarball = shm.0.join("t.tar");
    sh(&format!("tar -cf {} -C {} t", tarball.display(), shm.0.display()))?;
    let workloads = [
        // A job unpacks scratch files, then removes them before any sync.
        ("temp files", format!("tar -xf {} -C {{dir}} && rm -rf {{dir}}/t", tarball.display())),
        // A database initialises its file with zeros, then overwrites it.
        (
            "zero-then-overwrite",
            "dd if=/dev/zero of={dir}/db bs=1M count=12 status=none && \
             dd if=/dev/urandom of={dir}/db bs=1M count=12 conv=notrunc status=none && rm {dir}/db"
                .to_string(),
        ),
    ];
    for fstype in ["ext4", "xfs", "btrfs"] {
        let fs = Mounted::new(LoopDevice::new(scaled(1024).max(320))?, fstype)?;
        for (name, work) in &workloads {
            // btrfs sometimes commits a transaction mid-workload, with or
            // without the daemon (seen under emulation: ~10 MB either way):
            // a second pair of runs tells that noise from a real cost.
            for attempt in 1..=2 {
                let default = bytes_written(&fs, work)?;
                let daemon = Daemon::start()?;
                let with = bytes_written(&fs, work)?;
                daemon.stop()?;
                println!(
                    "  {name} on {fstype}: {} KiB reached the device without the daemon, {} KiB with it",
                    default / 1024,
                    with / 1024
                );
                let ok = with as f64 <= default as f64 * 1.05 + 256.0 * 1024.0;
                if ok {
                    break;
                }
                assert!(attempt < 2, "{name} on {fstype}: {with} bytes with the daemon vs {default} without");
            }
        }
    }
    Ok(())
}

#[test]
fn concurrent_tar_and_dd_both_progress() -> Result<()> {
    require_root();
    let src = small_files()?;
    let fs = Mounted::new(LoopDevice::new(8 * 1024)?, "ext4")?;
    let out = fs.path("x");
    std::fs::create_dir_all(&out)?;
    let daemon = Daemon::start_with_policy(POLICY)?;
    let t = Instant::now();
    let tar = std::process::Command::new("tar").arg("-xf").arg(&src.tarball).arg("-C").arg(&out).spawn()?;
    let dd = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1024", "status=none"])
        .arg(format!("of={}", fs.path("dd").display()))
        .spawn()?;
    let mut rates = Vec::new();
    for (name, mut child, mib) in [("tar", tar, src.bytes / MIB), ("dd", dd, 1024)] {
        assert!(child.wait()?.success(), "{name} failed");
        let secs = t.elapsed().as_secs_f64();
        rates.push((name, mib as f64 / secs));
    }
    sh("sync")?;
    let total = t.elapsed().as_secs_f64();
    let log = daemon.stop()?;
    println!(
        "  concurrent on ext4: tar {:.0} MiB/s, dd {:.0} MiB/s, all synced after {total:.1} s",
        rates[0].1, rates[1].1
    );
    for (name, rate) in rates {
        assert!(rate > 50.0, "{name} crawled at {rate:.0} MiB/s next to the other\n{log}");
    }
    assert!(log.contains("multi-file writer started") && log.contains("stream started"), "{log}");
    Ok(())
}
