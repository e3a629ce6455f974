//! An observing daemon (`--observe`, or a policy's mode = "observe")
//! detects what an acting one would act on and changes nothing; one
//! cgroup may observe beside another that acts.  The same dd of 512 MiB to ext4 on a 100 MiB/s loop device, three ways: the kernel
//! default, an observing daemon, an acting one.  Only the test's cgroup is
//! streamed (the root policy is off), so that other writers on the host do
//! not enter the counts.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::Result;
use wb_tests::*;

const COPY_MIB: u32 = 512;
const RATE: u64 = 100 * MIB;

/// Every knob pacing could write: the device's bdi limits and the global
/// dirty limits.  Not max_bytes and min_bytes: they read as the ratios'
/// share of the dirty threshold of the moment, which moves with free
/// memory (4.85-4.90 GB over one copy here); writing max_bytes sets
/// max_ratio_fine, which is compared.
fn knobs(bdi: &str) -> Vec<(String, String)> {
    let dev = ["strict_limit", "max_ratio", "max_ratio_fine", "min_ratio", "min_ratio_fine"]
        .map(|k| format!("/sys/class/bdi/{bdi}/{k}"));
    let vm = ["dirty_bytes", "dirty_background_bytes", "dirty_ratio", "dirty_background_ratio"]
        .map(|k| format!("/proc/sys/vm/{k}"));
    dev.into_iter()
        .chain(vm)
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|v| (p, v.trim().to_owned())))
        .collect()
}

/// What one copy showed: its peak dirty, every knob sample that differed
/// from the knobs before it, and `wbctl status` as the dd ended.
struct Copy {
    peak: Peak,
    changed: Vec<(String, String)>,
    status: String,
}

/// The dd in `cg`, sampling the device's dirty pages and its knobs every
/// 50 ms until it is done, then asking `daemon` for its status.
fn copy(fs: &Mounted, cg: &Cgroup, name: &str, daemon: Option<&Daemon>) -> Result<Copy> {
    let bdi = fs.bdi()?;
    sh("sync")?;
    let before = knobs(&bdi);
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, bdi, before) = (stop.clone(), bdi.clone(), before.clone());
        thread::spawn(move || {
            let mut changed = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                changed.extend(knobs(&bdi).into_iter().filter(|k| !before.contains(k)));
                thread::sleep(Duration::from_millis(50));
            }
            changed
        })
    };
    let sampler = Sampler::every(&bdi, Duration::from_millis(50))?;
    cg.dd(&fs.path(name), COPY_MIB)?;
    let status = match daemon {
        Some(d) => String::from_utf8_lossy(&d.wbctl().arg("status").output()?.stdout).into_owned(),
        None => String::new(),
    };
    let peak = sampler.finish();
    stop.store(true, Ordering::Relaxed);
    let mut changed = watcher.join().expect("knob watcher");
    changed.extend(knobs(&bdi).into_iter().filter(|k| !before.contains(k)));
    sh("sync")?;
    std::fs::remove_file(fs.path(name))?;
    sh("sync")?;
    Ok(Copy { peak, changed, status })
}

#[test]
fn an_observing_daemon_reports_what_the_acting_one_does_and_changes_nothing() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(1024, RATE)?, "ext4")?;
    let cg = Cgroup::new("observe")?;
    // The same policy for both daemons: only --observe differs.
    let policy = format!("mode = \"off\"\n[[policy]]\ncgroup = \"{}\"\nmode = \"sequential\"\n", cg.path);

    let default = copy(&fs, &cg, "default", None)?;

    let observing = Daemon::start_exe_with(&daemon::daemon_exe(), Some(&policy), &["--observe"])?;
    let watched = copy(&fs, &cg, "observed", Some(&observing))?;
    let status = &watched.status;
    let would = |k: &str| observing.counter(k);
    let (would_streams, would_windows, would_closes, would_bytes, would_pace) = (
        would("would_streams_started")?,
        would("would_windows")?,
        would("would_close_files")?,
        would("would_write_bytes")?,
        would("would_pace")?,
    );
    let not_done = (observing.counter("streams_started")?, observing.counter("spans_flushed")?);
    let observing_log = observing.stop()?;

    let acting = Daemon::start_with_policy(&policy)?;
    let acted = copy(&fs, &cg, "acted", None)?;
    let (streams, spans, bytes, paced) = (
        acting.counter("streams_started")?,
        acting.counter("spans_flushed")?,
        acting.counter("bytes_flushed")?,
        acting.counter("pacing_started")?,
    );
    let acting_log = acting.stop()?;

    println!(
        "dd {COPY_MIB} MiB at {} MiB/s: peak dirty {} MiB default, {} MiB observing, {} MiB acting",
        RATE / MIB,
        default.peak.dirty / MIB,
        watched.peak.dirty / MIB,
        acted.peak.dirty / MIB
    );
    println!(
        "observing: would start {would_streams} streams, write {} MiB in {would_windows} windows and \
         {would_closes} closes, pace {would_pace} times; acting: {streams} streams, {} MiB in {spans} \
         flushes, paced {paced} times",
        would_bytes / MIB,
        bytes / MIB
    );

    // Observing changes nothing: no knob at any sample, no writeback (its
    // peak is the kernel default's, far above the acting daemon's).
    assert!(watched.changed.is_empty(), "knobs changed while observing: {:?}\n{observing_log}", watched.changed);
    assert!(!acted.changed.is_empty(), "the acting daemon changed no knob: the check above shows nothing");
    assert!(default.peak.dirty > 256 * MIB, "the kernel default held only {:?}", default.peak);
    assert!(acted.peak.dirty < default.peak.dirty / 4, "the acting daemon did not hold the copy: {:?}", acted.peak);
    assert!(
        watched.peak.dirty > default.peak.dirty / 2 && watched.peak.dirty > 4 * acted.peak.dirty,
        "the observing daemon held the copy ({:?}; default {:?}, acting {:?}): it acted\n{observing_log}",
        watched.peak,
        default.peak,
        acted.peak
    );
    assert_eq!(not_done, (0, 0), "the observing daemon started streams or flushed:\n{observing_log}");
    assert!(!observing_log.contains("pacing on"), "{observing_log}");
    // It says so, and reports what the acting daemon did.
    assert!(status.starts_with("mode: observe"), "{status}");
    assert!(status.contains("would pace: budget"), "no would-cap while the copy's pacing lingers:\n{status}");
    assert!(would_streams >= 1 && would_streams == streams, "streams: would {would_streams}, did {streams}");
    // Bytes within 10 %: both are about the whole copy (the first window
    // past the burst starts at the file's beginning; the acting daemon's
    // count is what sync_file_range took).
    let total = u64::from(COPY_MIB) * MIB;
    assert!(bytes > total / 2, "the acting daemon flushed only {bytes} bytes:\n{acting_log}");
    assert!(would_bytes.abs_diff(bytes) * 10 <= bytes, "would write {would_bytes} bytes, the acting daemon {bytes}");
    // Windows within a factor of two: they follow each daemon's bandwidth
    // estimate, which the acting daemon times from its own writeback and
    // an observing one takes from the kernel's.
    let flushes = would_windows + would_closes;
    assert!(flushes * 2 >= spans && flushes <= spans * 2, "would flush {flushes} times, the acting daemon {spans}");
    assert!(would_pace >= 1 && paced >= 1, "would pace {would_pace} times, paced {paced}\n{acting_log}");
    Ok(())
}

/// A child cgroup observing beside one that acts, writing the same device
/// at once: the acting writer's need paces the device for real, the
/// observing one's files are only counted.
#[test]
fn an_observing_cgroup_beside_an_acting_one_is_counted_and_the_device_paced() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(1024, RATE)?, "ext4")?;
    let (watch, act) = (Cgroup::new("watch")?, Cgroup::new("act")?);
    let policy = format!(
        "mode = \"off\"\n[[policy]]\ncgroup = \"{}\"\nmode = \"observe\"\n[[policy]]\ncgroup = \"{}\"\nmode = \"sequential\"\n",
        watch.path, act.path
    );
    let bdi = fs.bdi()?;
    let daemon = Daemon::start_with_policy(&policy)?;
    let observer = {
        let (cg, out) = (Cgroup::at(&watch.path)?, fs.path("watched"));
        thread::spawn(move || cg.dd(&out, 256))
    };
    let mut paced = false;
    let actor = {
        let (cg, out) = (Cgroup::at(&act.path)?, fs.path("acted"));
        thread::spawn(move || cg.dd(&out, 256))
    };
    while !actor.is_finished() {
        paced |= std::fs::read_to_string(format!("/sys/class/bdi/{bdi}/strict_limit"))?.trim() == "1";
        thread::sleep(Duration::from_millis(50));
    }
    actor.join().expect("acting dd")?;
    observer.join().expect("observing dd")?;
    let status = String::from_utf8_lossy(&daemon.wbctl().arg("status").output()?.stdout).into_owned();
    let counts = ["streams_started", "would_streams_started", "would_write_bytes", "bytes_flushed"]
        .map(|k| daemon.counter(k).unwrap_or(0));
    let log = daemon.stop()?;
    println!("  paced {paced}; streams, would-streams, would-write, flushed: {counts:?}");
    assert!(!status.starts_with("mode: observe"), "the daemon acts:\n{status}");
    assert!(paced, "the acting writer's device was not paced:\n{log}");
    assert!(counts[0] >= 1 && counts[1] >= 1, "{counts:?}\n{log}");
    // Each cgroup's 256 MiB counted on its side only (measured: 256 MiB
    // would be written, 238 MiB flushed).
    let side = 256 * MIB;
    assert!(counts[2] > side / 2 && counts[2] <= side, "would write {}:\n{log}", counts[2]);
    assert!(counts[3] > side / 2 && counts[3] <= side + side / 8, "flushed {}:\n{log}", counts[3]);
    Ok(())
}
