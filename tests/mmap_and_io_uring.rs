//! Writers no write hook sees (issue 18): stores through a shared mapping
//! and io_uring's buffered writes dirty pages without a write syscall.  The
//! dirtied-folio hook streams them like write() writers, held by pacing;
//! io_uring's O_DIRECT writes dirty no page and stay untouched.  The
//! writers are fio's mmap and io_uring engines on a device capped like a
//! real disk (the uncapped loop device's budget, 0.1 s of ~1 GB/s, would
//! hide what is held).

use anyhow::Result;
use wb_tests::*;

const DEVICE_BPS: u64 = 200 * MIB;
const FILE_MIB: u64 = 512;

/// fio writing FILE_MIB sequentially to `file` with `engine`, buffered
/// unless `extra` says otherwise; the device sampled while it runs.
fn fio(fs: &Mounted, engine: &str, extra: &str) -> Result<Peak> {
    let file = fs.path(engine);
    let _ = std::fs::remove_file(&file);
    sh("sync")?;
    let sampler = Sampler::start(&fs.bdi()?)?;
    sh(&format!(
        "fio --name={engine} --filename={} --ioengine={engine} --rw=write --bs=1M --size={FILE_MIB}M \
         --fallocate=none --end_fsync=0 {extra} --output=/dev/null",
        file.display()
    ))?;
    let peak = sampler.finish();
    sh("sync")?;
    Ok(peak)
}

/// The kernel default piles the whole file up as dirty pages; with the
/// daemon the writer streams, its windows are flushed and its device
/// paced: dirty stays near the budget (four windows of 6 MiB here).
fn held_like_write(engine: &str, extra: &str) -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(FILE_MIB + 512, DEVICE_BPS)?, "ext4")?;
    let default = fio(&fs, engine, extra)?;
    let daemon = Daemon::start()?;
    let held = fio(&fs, engine, extra)?;
    let log = daemon.stop()?;
    let spans = stopped_counter(&log, "spans_flushed");
    println!(
        "{engine} {extra}: {FILE_MIB} MiB at {} MiB/s: peak dirty {} MiB without the daemon, {} MiB with it \
         (dirty+writeback {} / {} MiB); {spans} spans flushed",
        DEVICE_BPS / MIB,
        default.dirty / MIB,
        held.dirty / MIB,
        default.dirty_wb / MIB,
        held.dirty_wb / MIB
    );
    assert!(default.dirty > FILE_MIB / 2 * MIB, "without the daemon the file should pile up: {default:?}");
    assert!(held.dirty < 64 * MIB, "with the daemon dirty must stay near the budget: {held:?}\n{log}");
    assert!(spans >= 8, "the writer's windows were not flushed:\n{log}");
    Ok(())
}

#[test]
fn mmap_writer_is_held() -> Result<()> {
    held_like_write("mmap", "")
}

#[test]
fn io_uring_buffered_writer_is_held() -> Result<()> {
    held_like_write("io_uring", "--iodepth=8")
}

/// O_DIRECT through io_uring dirties no page: nothing to flush, no stream.
#[test]
fn io_uring_direct_writer_is_untouched() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(FILE_MIB + 512)?, "ext4")?;
    let daemon = Daemon::start()?;
    fio(&fs, "io_uring", "--iodepth=8 --direct=1")?;
    let log = daemon.stop()?;
    assert_eq!(stopped_counter(&log, "spans_flushed"), 0, "O_DIRECT writes were flushed:\n{log}");
    assert!(!log.contains("stream started"), "{log}");
    Ok(())
}
