//! Tests of the device table: idle devices forgotten, and the pacing rules
//! driven through a fake sysfs.

use super::{
    decide::{LINGER, NETWORK_WINDOW_SECONDS},
    shared::STALLED,
    *,
};

/// Every device `active` names, as having an acting writer.
fn acts(active: &HashMap<String, Active>) -> HashSet<String> {
    active.keys().cloned().collect()
}

/// An observing writer's device gets a "would" cap and no knob is written;
/// an acting writer of it then paces it for real, and a daemon that
/// observes everywhere never does.
#[test]
fn observing_writers_get_a_would_cap_and_no_knob_is_written() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("observe");
    // What a release restores (max_bytes follows max_ratio_fine in the
    // kernel, not in the fake).
    let knobs = |s: &crate::pacing::tests::FakeSysfs| (s.get("strict_limit"), s.get("max_ratio_fine"));
    let max_bytes = sysfs.get("max_bytes");
    let before = knobs(&sysfs);
    const MIB: u64 = 1 << 20;
    let writing = HashMap::from([("7:0".to_owned(), Active { writers: 1, windowed: 1 })]);
    let mut d = Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    disk_holding(&mut d, 100 * MIB, 8 * MIB);
    d.busy("7:0", false, false);
    d.tick(&writing, &HashSet::new(), false);
    assert_eq!(d.budget("7:0"), 0);
    assert!(d.would_budget("7:0") >= 4 * MIB, "room for two windows at least: {}", d.would_budget("7:0"));
    assert_eq!((knobs(&sysfs), sysfs.get("max_bytes")), (before.clone(), max_bytes.clone()), "nothing written");
    assert!(!sysfs.journaled(), "nothing journaled: nothing to restore");
    let status = &d.status()[0];
    assert_eq!(
        (status.paced_budget, status.would_budget, status.would_lever.as_str()),
        (0, d.would_budget("7:0"), "bdi")
    );
    assert_eq!(d.pace_counts(), [("pacing_started", 0), ("would_pace", 1), ("devices_shed_user", 0)]);
    // An acting writer comes: paced for real, the would-cap gone.
    d.tick(&writing, &acts(&writing), false);
    assert!(d.budget("7:0") > 0 && d.would_budget("7:0") == 0);
    assert_eq!(sysfs.get("strict_limit"), "1");
    // Only the observer left: released, a would again.
    d.tick(&writing, &HashSet::new(), false);
    assert_eq!((d.budget("7:0"), knobs(&sysfs)), (0, before.clone()));
    assert!(d.would_budget("7:0") > 0);
    assert_eq!(d.pace_counts(), [("pacing_started", 1), ("would_pace", 2), ("devices_shed_user", 0)]);
    d.shutdown();
    // The whole daemon observing: even acting writers' needs are a would.
    let observing = Policy { mode: crate::policy::Mode::Observe, ..Policy::embedded_default() };
    let sysfs = crate::pacing::tests::FakeSysfs::new("observe-all");
    let mut d = Devices::new(observing, None, sysfs.pacer());
    disk_holding(&mut d, 100 * MIB, 8 * MIB);
    d.busy("7:0", false, true);
    d.tick(&writing, &acts(&writing), false);
    assert_eq!((d.budget("7:0"), knobs(&sysfs), sysfs.get("max_bytes")), (0, before, max_bytes));
    assert!(d.would_budget("7:0") > 0);
}

/// Devices no event named for DEVICE_IDLE are forgotten; a recent one is kept.
#[test]
fn idle_devices_are_forgotten() {
    let dir = std::env::temp_dir().join(format!("wb-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let global = crate::pacing::Global::with_paths(dir.join("vm"), dir.join("vmstat"), dir.join("global"));
    let pacer = Pacer::with_paths(dir.clone(), dir.join("journal"), global, crate::pacing::Lever::Auto);
    let mut devices = Devices::new(Policy::embedded_default(), None, pacer);
    for (i, bdi) in [b"0:70", b"0:71"].iter().enumerate() {
        let mut ev = wb_event { sb_dev: 70 + i as u32, ..Default::default() };
        for (d, s) in ev.bdi.iter_mut().zip(bdi.iter()) {
            *d = *s as std::ffi::c_char;
        }
        devices.note(&ev);
    }
    // Ten minutes on (not back: the clock may not be ten minutes old),
    // with an event on 0:71 a moment before.
    let later = Instant::now() + DEVICE_IDLE;
    devices.devs.get_mut("0:71").unwrap().last_event = later - Duration::from_secs(1);
    devices.forget_idle(later, |bdi| bdi == "0:72");
    assert!(!devices.knows("0:70") && devices.knows("0:71"));
    // Nor one whose flusher thread is still there.
    devices.devs.get_mut("0:71").unwrap().last_event = later - DEVICE_IDLE;
    devices.forget_idle(later, |bdi| bdi == "0:71");
    assert!(devices.knows("0:71"));
    devices.forget_idle(later, |_| false);
    assert!(!devices.knows("0:71"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An event naming bdi "0:N", superblock N (no mount lists it: another
/// namespace's mount, a user's whose uid is not known).
fn unlisted(n: u32) -> wb_event {
    let mut ev = wb_event { sb_dev: n, ..Default::default() };
    for (d, s) in ev.bdi.iter_mut().zip(format!("0:{n}").as_bytes()) {
        *d = *s as std::ffi::c_char;
    }
    ev
}

/// A user's devices beyond bound::PER_USER get no record (counted); one
/// idle for EVICT_IDLE makes room, and a user's record goes after
/// USER_IDLE, not DEVICE_IDLE.
#[test]
fn a_users_devices_are_bounded() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("bound");
    let mut d = Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    let first = 900_000;
    for n in first..first + bound::PER_USER as u32 {
        assert!(d.admits(&unlisted(n)), "0:{n} below the bound");
        d.note(&unlisted(n));
    }
    let over = first + bound::PER_USER as u32;
    assert!(!d.admits(&unlisted(over)) && !d.knows(&format!("0:{over}")));
    assert!(!d.admits(&unlisted(over)), "asked again: still refused");
    assert_eq!(d.pace_counts()[2], ("devices_shed_user", 1), "one device, counted once");
    assert_eq!(d.devs.len(), bound::PER_USER);
    // One written EVICT_IDLE ago makes room (the clock may be younger).
    let Some(long_ago) = Instant::now().checked_sub(bound::EVICT_IDLE) else { return };
    d.devs.get_mut(&format!("0:{}", first + 5)).unwrap().last_event = long_ago;
    d.shed.clear();
    assert!(d.admits(&unlisted(over)));
    d.note(&unlisted(over));
    assert!(d.knows(&format!("0:{over}")) && !d.knows(&format!("0:{}", first + 5)));
    assert_eq!(d.devs.len(), bound::PER_USER);
    // USER_IDLE on, every one of them is forgotten.
    d.forget_idle(Instant::now() + bound::USER_IDLE, |_| false);
    assert!(d.devs.is_empty());
    d.shutdown();
}

/// A device on a fake sysfs, named by an event that says it holds
/// `dirty` bytes and writes at `bw` bytes a second.
fn disk_holding(devices: &mut Devices, bw: u64, dirty: u64) {
    device_holding(devices, "7:0", bw, dirty);
}

/// The same for `bdi` ("7:N", its superblock 9 + N).
fn device_holding(devices: &mut Devices, bdi: &str, bw: u64, dirty: u64) {
    let page = devices.page_size;
    let minor: u32 = bdi.strip_prefix("7:").unwrap().parse().unwrap();
    let mut ev =
        wb_event { sb_dev: 9 + minor, bdi_bw_pages: bw / page, bdi_dirty_pages: dirty / page, ..Default::default() };
    for (d, s) in ev.bdi.iter_mut().zip(bdi.as_bytes()) {
        *d = *s as std::ffi::c_char;
    }
    devices.note(&ev);
    *devices.devs.get_mut(bdi).unwrap().shared.backing.lock().unwrap() = Backing::Disk;
}

#[test]
fn a_fast_device_is_paced_once_its_writeback_falls_behind_or_small_files_come_even_if_first_thought_slow() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("outrun");
    let devices = || Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    const MIB: u64 = 1 << 20;
    const FAST: u64 = 2 << 30;
    // One writer's budget at 2 GiB/s: four windows of 61 MiB.
    let mut d = devices();
    disk_holding(&mut d, FAST, 8 * MIB);
    d.busy("7:0", false, true);
    assert_eq!(d.budget("7:0"), 0, "8 MiB dirty: its writeback keeps up");
    disk_holding(&mut d, FAST, 1024 * MIB);
    d.busy("7:0", false, true);
    assert_ne!(d.budget("7:0"), 0, "1 GiB dirty: it does not");
    d.shutdown();
    let mut d = devices();
    disk_holding(&mut d, FAST, 8 * MIB);
    d.busy("7:0", true, true);
    assert_ne!(d.budget("7:0"), 0, "a writer of small files: at once");
    d.shutdown();
    let mut d = devices();
    disk_holding(&mut d, 200 * MIB, 8 * MIB);
    d.busy("7:0", false, true);
    assert_ne!(d.budget("7:0"), 0, "a 200 MiB/s device: at once, as ever");
    // The next tick, the device measured fast since.
    let writing = HashMap::from([("7:0".to_owned(), Active { writers: 1, windowed: 1 })]);
    disk_holding(&mut d, FAST, 8 * MIB);
    d.tick(&writing, &acts(&writing), false);
    assert_eq!(d.budget("7:0"), 0, "measured fast since: uncapped");
    disk_holding(&mut d, 200 * MIB, 8 * MIB);
    d.tick(&writing, &acts(&writing), false);
    assert_eq!(d.budget("7:0"), 0, "fast once, fast still: contention slows an estimate");
    d.busy("7:0", true, true);
    assert_ne!(d.budget("7:0"), 0, "and capped once a writer of small files counts");
    d.shutdown();
}

#[test]
fn a_network_filesystems_windows_and_chunks_are_a_quarter_second_of_its_link_under_its_own_limit() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("network-floor");
    let mut d = Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    const MIB: u64 = 1 << 20;
    let writing = HashMap::from([("7:0".to_owned(), Active { writers: 1, windowed: 1 })]);
    disk_holding(&mut d, 26 * MIB, 8 * MIB);
    d.tick(&writing, &acts(&writing), false);
    let disk = d.devs["7:0"].shared.clone();
    let (bw, _) = disk.rates();
    assert!(disk.chunk() < bw / 4 && disk.window() < bw / 4, "a disk's: a fraction of that");
    *disk.backing.lock().unwrap() = Backing::Network;
    d.tick(&writing, &acts(&writing), false);
    let quarter = (bw as f64 * NETWORK_WINDOW_SECONDS) as u64;
    assert!(disk.chunk() < quarter, "a link the agent has not timed: as a disk");
    disk.sample(26 * MIB, Duration::from_secs(1));
    d.tick(&writing, &acts(&writing), false);
    let (bw, _) = disk.rates();
    let quarter = (bw as f64 * NETWORK_WINDOW_SECONDS) as u64;
    assert!(disk.chunk() >= quarter && disk.window() >= quarter, "a COMMIT per quarter second, at most");
    assert!(d.devs["7:0"].floor(bw) >= quarter, "BPF's windows too");
    // Under the global limit two such chunks in flight would fill it.
    assert!(d.devs["7:0"].own_limit, "the fake sysfs has the bdi's knobs");
    d.devs.get_mut("7:0").unwrap().own_limit = false;
    d.tick(&writing, &acts(&writing), false);
    assert!(disk.chunk() < quarter && d.devs["7:0"].floor(bw) < quarter, "the global limit: as a disk");
    d.shutdown();
}

#[test]
fn an_smb_share_is_paced_under_its_own_limit_and_the_global_one_paces_nobody_while_it_is_written() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("smb-lever");
    sysfs.add("7:1");
    let mut d = Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    const MIB: u64 = 1 << 20;
    let one = Active { writers: 1, windowed: 1 };
    let writing = HashMap::from([("7:0".to_owned(), one), ("7:1".to_owned(), one)]);
    disk_holding(&mut d, 26 * MIB, 8 * MIB);
    device_holding(&mut d, "7:1", 26 * MIB, 8 * MIB);
    *d.devs["7:0"].shared.backing.lock().unwrap() = Backing::Smb;
    d.busy("7:0", false, true);
    d.tick(&writing, &acts(&writing), false);
    assert!(d.budget("7:0") != 0 && d.budget("7:1") != 0, "under their own limits: both paced");
    // Both on the global lever (the fake sysfs has knobs: paced
    // through them all the same, which is not what is tested here).
    for dev in d.devs.values_mut() {
        dev.own_limit = false;
    }
    d.tick(&writing, &acts(&writing), false);
    assert_eq!((d.budget("7:0"), d.budget("7:1")), (0, 0), "the global limit: nobody while the share is written");
    assert!(!d.pacer.is_paced("7:0") && !d.pacer.is_paced("7:1"));
    d.tick(&writing, &acts(&writing), false);
    assert_eq!((d.budget("7:0"), d.budget("7:1")), (0, 0), "nor at the next tick");
    // The share's writer gone LINGER ago, its 8 MiB not yet drained
    // at 2 MiB/s: nothing paced yet.
    let disk_only = HashMap::from([("7:1".to_owned(), one)]);
    let share = d.devs["7:0"].shared.clone();
    share.sample(2 * MIB, Duration::from_secs(1));
    d.devs.get_mut("7:0").unwrap().last_busy = Instant::now().checked_sub(LINGER * 2);
    d.tick(&disk_only, &acts(&disk_only), false);
    assert_eq!(d.budget("7:1"), 0, "the share's pages still draining");
    // Nor while its server does not answer.
    d.devs.get_mut("7:0").unwrap().last_busy = Instant::now().checked_sub(LINGER * 10);
    let waiting = share.waiting();
    *share.waiting.lock().unwrap() = Instant::now().checked_sub(STALLED + Duration::from_secs(1));
    d.tick(&disk_only, &acts(&disk_only), false);
    assert_eq!(d.budget("7:1"), 0, "the share stalled");
    drop(waiting);
    d.tick(&disk_only, &acts(&disk_only), false);
    assert!(d.budget("7:0") == 0 && d.budget("7:1") != 0, "the share done: the disk paced again");
    *d.devs["7:0"].shared.backing.lock().unwrap() = Backing::Network;
    d.busy("7:0", false, true);
    d.tick(&writing, &acts(&writing), false);
    assert!(d.budget("7:0") != 0 && d.budget("7:1") != 0, "an NFS mount is paced like a disk");
    d.shutdown();
}

#[test]
fn what_a_devices_writers_dirty_together_is_its_rate_and_goes_with_its_record() {
    let sysfs = crate::pacing::tests::FakeSysfs::new("device-rate");
    let mut d = Devices::new(Policy::embedded_default(), None, sysfs.pacer());
    disk_holding(&mut d, 64 << 20, 0);
    // Twenty writers, each at a twentieth of what counts (an eighth of the
    // device's bandwidth over bandwidth::Rate's 2 s), count together.
    let (bw, now) = (d.bandwidth("7:0"), Instant::now());
    let each = bw.div_ceil(8 * 20);
    for _ in 0..19 {
        assert!(!d.dirtied("7:0", each, now));
    }
    assert!(!d.dirtying(now).contains("7:0"));
    assert!(d.dirtied("7:0", each, now), "the twentieth");
    assert!(d.dirtying(now).contains("7:0"));
    assert!(!d.dirtying(now + Duration::from_secs(10)).contains("7:0"), "forgotten within seconds");
    assert!(!d.dirtied("7:9", bw, now), "a device not known");
    // Forgotten with the device (idle), it starts again from nothing.
    let later = now + DEVICE_IDLE;
    d.forget_idle(later, |_| false);
    assert!(!d.knows("7:0"));
    disk_holding(&mut d, 64 << 20, 0);
    assert!(!d.dirtying(now).contains("7:0"));
    d.shutdown();
}
