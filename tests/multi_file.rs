//! Multi-file streaming writers (tar x, cp -r) and the costs write-behind
//! must not add: temp files and zero-then-overwrite written once.
//!
//! CI time: this file took 647 s with 2.5–3.2 GiB sources made per test on
//! 8 GiB devices and tar x on three filesystems; 140 s with the sizes below
//! and cp -r on three (219 s on a machine loaded by other work), each test
//! still failing without write-behind (measured one test at a time,
//! 2026-11-23).

use std::time::Instant;

use anyhow::Result;
use wb_tests::*;

/// Device dirty pages must stay under this with the daemon, and lie 1.5
/// times above it without.  With the daemon tar x stays near the burst
/// allowance (16 MiB, cache-only by design) plus the dirty cap below; cp -r
/// from the page cache outruns the device and is paced down to that cap
/// (with dirty_seconds 0.25: up to 172 MiB on ext4, the cap of a ~700 MB/s
/// device).  Measured with the policy below: 8–27 MiB with the daemon,
/// 641–836 MiB without.
const BOUND: u64 = 192 * MIB;

/// These tests check the multi-file mechanics, not the sizing (the bench
/// does that on a capped device).  Cap the windows, and hold the dirty cap
/// at the shipped default (0.1 s) whatever the default becomes, so the
/// bound holds on any machine.
const POLICY: &str = "max_window = \"16MiB\"\ndirty_seconds = 0.1\n";

/// The held copies' device writes at this rate: a disk the daemon caps at
/// a writer's first window.  One that has shown 1 GiB/s is left uncapped
/// until two budgets of its bandwidth are dirty (devices.rs, OUTRUN): on
/// this machine's uncapped loop device `cp -r` to btrfs reached 219 MiB,
/// as designed, which says nothing of the mechanics.  The guest's devices
/// (vmtest, no blkio cgroup to cap one) are slower than that under TCG.
const HELD_RATE: u64 = 400 * MIB;

fn held_device(mib: u64) -> Result<LoopDevice> {
    if scale() > 1 { LoopDevice::new(mib) } else { LoopDevice::throttled(mib, HELD_RATE) }
}

struct Source {
    tree: std::path::PathBuf,
    tarball: std::path::PathBuf,
    bytes: u64,
    _shm: Option<Scratch>,
}

/// `files` incompressible files of `min..=max` bytes from `seed` (and a
/// tarball of them), made once and shared by the tests and runs that ask
/// for the same: generating them took ~17 s of the test's CPU per 2.5 GiB.
fn source(files: u64, min: u64, max: u64, seed: u64, tar: bool) -> Result<Source> {
    let key = format!("tree-{files}x{min}-{max}-{seed}{}", if tar { "-tar" } else { "" });
    let (dir, shm) = cached_dir(&key, |dir| {
        let bytes = random_tree(&dir.join("tree"), files as u32, min, max, seed)?;
        if tar {
            sh(&format!("tar -cf {0}/src.tar -C {0}/tree .", dir.display()))?;
        }
        std::fs::write(dir.join("bytes"), bytes.to_string())?;
        Ok(())
    })?;
    let bytes = std::fs::read_to_string(dir.join("bytes"))?.trim().parse()?;
    // Read into the page cache first, as the tmpfs sources before were:
    // evicted (by other tests), cp -r read it from disk in 12 s, not 0.5 s.
    sh(&format!("find {} -type f -exec cat {{}} + >/dev/null", dir.display()))?;
    Ok(Source { tree: dir.join("tree"), tarball: dir.join("src.tar"), bytes, _shm: shm })
}

/// 20,000 files of 1–64 KiB (633 MiB) and a tarball of them.  The count is
/// what tar x is about (a close per file: a flush by handle, or on a paced
/// device a file left to the kernel's flusher); the
/// bytes need only lie well above the bound without the daemon: 633 MiB
/// peaked at 641–667 MiB dirty.  Files of 1–256 KiB (2.5 GiB, 1787–1834
/// MiB) cost the test 249 s on three filesystems, this 61 s on two.
/// Scaled (vmtest), 1–256 KiB files as measured there: 2,500, 312 MiB.
fn small_files() -> Result<Source> {
    let max = if scale() > 1 { 256 * 1024 } else { 64 * 1024 };
    source(scaled(20_000), 1024, max, 7, true)
}

/// 24 files of 0–64 MiB (859 MiB), like Khlebnikov's cp -r demo (100 of
/// them, 3.2 GiB, which cost cp -r 238 s and rsync 78 s): 19 larger than a
/// window (16 MiB), which stream while written, and 5 smaller, flushed by
/// handle once closed.  Without the daemon nearly all of it stays dirty
/// (measured 720–836 MiB; of 3.2 GiB, 1488–2403 MiB).
fn big_files() -> Result<Source> {
    source(24, 0, 64 * MIB, 11, false)
}

/// A device for `bytes` written twice (the second after removing the
/// first), with room for metadata.  The 8 GiB devices before were most of
/// concurrent_tar_and_dd's 67 s (5 s of work, ~17 s making its source);
/// 1.9–2.6 GiB ones take 5–12 s to fill and format.
fn device_mib(bytes: u64) -> u64 {
    (3 * bytes / MIB).max(1024)
}

/// Runs `work` on the filesystem, sampling its device, and syncs after it.
/// In `work`, {tree} is the source tree, {tar} its tarball, {dst} the output.
fn run_on(fs: &Mounted, src: &Source, dst: &str, work: &str) -> Result<Peak> {
    let out = fs.path(dst);
    sh(&format!("rm -rf {0} && sync", out.display()))?;
    let sampler = Sampler::start(&fs.bdi()?)?;
    let t = Instant::now();
    sh(&work
        .replace("{tree}", &src.tree.display().to_string())
        .replace("{tar}", &src.tarball.display().to_string())
        .replace("{dst}", &out.display().to_string()))?;
    let peak = sampler.finish();
    let took = t.elapsed().as_secs_f64();
    let t = Instant::now();
    sh("sync")?;
    println!(
        "    {dst} on {}: {took:.1} s, peak dirty {} MiB, sync after {:.2} s",
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

fn streaming_held(fstypes: &[&str], src: &Source, dst: &str, work: &str, bound: u64) -> Result<()> {
    for &fstype in fstypes {
        let fs = Mounted::new(held_device(device_mib(src.bytes))?, fstype)?;
        println!("  {fstype}, {} MiB in the source:", src.bytes / MIB);
        // Only the daemon's run is read back: the kernel's own writing of
        // a tree is not what these tests are about.
        let default = run_on(&fs, src, dst, work)?;
        let daemon = Daemon::start_with_policy(POLICY)?;
        let held = run_on(&fs, src, dst, work)?;
        let log = daemon.stop()?;
        let (flushed, left) =
            (stopped_counter(&log, "closed_files_flushed"), stopped_counter(&log, "closed_files_left"));
        println!("    closed files the daemon flushed: {flushed}, left to the kernel (paced): {left}");
        check(&fs, src, dst)?;
        assert!(
            held.dirty < bound,
            "{fstype}: dirty reached {} MiB with the daemon (bound {} MiB)\n{log}",
            held.dirty / MIB,
            bound / MIB
        );
        // Without the daemon the peak varies from run to run: the test
        // needs only that it lies clearly above the bound.
        assert!(
            default.dirty > bound + bound / 2,
            "{fstype}: without the daemon dirty stayed at {} MiB: the test shows nothing",
            default.dirty / MIB
        );
        // Every event reached its file: by the writer's fd or by handle.
        assert!(log.contains("errors=[]"), "{fstype}: some events reached no file\n{log}");
    }
    Ok(())
}

/// tar x on ext4 and xfs.  The device is paced (6.2+), so the files are
/// left to the kernel's flusher but for the latest ones, flushed by handle
/// when tar ends; 6.1 (vmtest) flushes each by handle.
/// Not btrfs: it flushes many small files itself (measured: tar x of
/// 20,000 files peaks at 42–50 MiB without the daemon), so there the test
/// could not fail; cp -r covers btrfs's handles.
#[test]
fn tar_x_of_20000_files_is_held() -> Result<()> {
    require_root();
    let src = small_files()?;
    // Scaled down (vmtest), the tree is smaller than the default's bound
    // allows to show: hold it to a quarter of the source instead.
    let bound = if scale() > 1 { src.bytes / 4 } else { BOUND };
    streaming_held(&["ext4", "xfs"], &src, "x", "mkdir -p {dst} && tar -xf {tar} -C {dst}", bound)
}

/// On xfs and btrfs (5–10 of the files flushed by handle there); ext4 gets
/// the same copy from rsync below, which writes each file as cp -r does
/// (cp -r on ext4 too cost 10–25 s of CI and showed nothing rsync does not).
#[test]
fn cp_r_of_big_files_is_held() -> Result<()> {
    require_root();
    let src = big_files()?;
    streaming_held(&["xfs", "btrfs"], &src, "copy", "cp -r {tree} {dst}", BOUND)
}

/// rsync's receiver writes each file under a temporary name and renames it:
/// a multi-file writer too, and the child of the process that was started.
/// ext4 only: the filesystems differ in nothing rsync does that cp -r does
/// not already show, and CI's time is bounded (measured on all three:
/// docs/measurements.md, 'multi-file tests with pacing, rsync'); it is
/// ext4's big-file copy.
#[test]
fn rsync_of_big_files_is_held() -> Result<()> {
    require_root();
    let src = big_files()?;
    streaming_held(&["ext4"], &src, "rsync", "rsync -a --whole-file {tree}/ {dst}/", BOUND)
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
    let fs = Mounted::new(LoopDevice::new((src.bytes / MIB + 1024) * 3 / 2)?, "ext4")?;
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

/// A writer that runs a command while one of its files is open (python's
/// `subprocess.run` between a write and the close): the child's copy of the
/// descriptor is closed before its `execve` (close_range) and at its exit.
/// BPF acted on that close as the file's: the child, within its burst,
/// reported nothing and the stream's record was dropped, so the writer's own
/// close went unreported and the file's tail was left to the kernel.
#[test]
fn a_writer_that_runs_a_command_keeps_its_file() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(512)?, "ext4")?;
    let daemon = Daemon::start_traced("window = \"1MiB\"\nburst = \"1MiB\"\n", &[], &[])?;
    // Past its burst first (2 MiB), then the file the command runs beside.
    let script = "import os,subprocess,sys\nd=sys.argv[1]\n\
                  fd=os.open(d+'/big',os.O_WRONLY|os.O_CREAT,0o644); os.write(fd,b'b'*(2<<20)); os.close(fd)\n\
                  fd=os.open(d+'/f',os.O_WRONLY|os.O_CREAT,0o644); os.write(fd,b'f'*65536)\n\
                  subprocess.run(['true'],check=True); os.close(fd)\n";
    run(std::process::Command::new("python3").args(["-c", script]).arg(&fs.dir))?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = daemon.stop()?;
    let closes = log.lines().filter(|l| l.contains("kind=Close") && l.contains("comm=python3")).count();
    println!("the writer's closes reported: {closes} of 2");
    assert_eq!(closes, 2, "the close after the command was lost:\n{log}");
    Ok(())
}
