//! btrfs mounted with `compress` (Fedora mounts it compress=zstd:1) marks a
//! file incompressible for good when one 128 KiB piece of a range it writes
//! back fails to save a block, and its writeback of a compressed file runs on
//! to the end of the dirty range.  Windows flushed right behind a writer
//! therefore ended where the writer was, often in a piece of a few KiB, which
//! cannot save a block: a big file was soon written uncompressed.  The daemon
//! now flushes such a filesystem in whole extents.

use std::process::Command;

use anyhow::Result;
use wb_tests::*;

const COPY_MIB: u64 = 1024;

#[test]
fn btrfs_keeps_compressing_a_file_written_behind() -> Result<()> {
    require_root();
    // base64 text: zstd -1 makes it 75 % of its size, enough for a whole
    // piece (128 KiB) and never for one of 16 KiB or less.
    let shm = Scratch::new_in("/dev/shm", "compress")?;
    let src = shm.0.join("text");
    sh(&format!("head -c {} /dev/urandom | base64 -w 0 > {}", COPY_MIB * MIB / 4 * 3, src.display()))?;
    let fs = Mounted::with_options(LoopDevice::throttled(2048, 100 * MIB)?, "btrfs", Some("compress=zstd:1"))?;
    // Not paced: under pacing the kernel's own writeback, started early
    // while the device's share of the dirty limit is still small, can end
    // at the writer too and mark the file in its first extent (1 of 4 runs
    // of a debug build).  This test is about the daemon's own flushes, so
    // the writer keeps to a pace the device can follow (pv, 80 MiB/s of
    // text that takes 60 MiB/s compressed), as a paced one would, and
    // windows are flushed right behind it.
    let daemon = Daemon::start_with_policy("pacing = false\n")?;
    let before = fs.device.bytes_written()?;
    let dst = fs.path("copy");
    sh(&format!("pv -q -L 80m {} > {}", src.display(), dst.display()))?;
    sh("sync")?;
    let written = fs.device.bytes_written()? - before;
    let log = daemon.stop()?;
    let attrs = run(Command::new("lsattr").arg(&dst))?;
    let flags = attrs.split_whitespace().next().unwrap_or_default().to_owned();
    println!("  {COPY_MIB} MiB written by pv: {} MiB reached the device, attributes {flags}", written / MIB);
    assert!(stopped_counter(&log, "spans_flushed") > 0, "nothing was written behind the writer:\n{log}");
    // Compressed, it takes 805 MiB; before the fix 1038 (the file was
    // marked incompressible, 'm' in lsattr, after its first windows).
    assert!(!flags.contains('m'), "the file was marked incompressible ({attrs}), {} MiB written", written / MIB);
    assert!(written < COPY_MIB * MIB * 7 / 8, "{} MiB written for {COPY_MIB} MiB ({attrs})", written / MIB);
    assert!(log.contains("btrfs compresses here"), "{log}");
    assert!(same_content(&src, &dst)?, "the file differs from its source");
    Ok(())
}
