//! Tests of a device tick's decision (decide.rs), one or more per rule it
//! applies, over the pure function alone: no sysfs, no device table.

use std::time::{Duration, Instant};

use super::decide::*;
use crate::{
    backing::Backing,
    bandwidth::{self, Active},
    policy::Policy,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const ONE: Active = Active { writers: 1, windowed: 1 };

/// A 200 MiB/s disk under its own limit, never capped, holding 8 MiB,
/// one writer counting, the embedded default policy.
fn disk() -> Inputs {
    let policy = Policy::embedded_default();
    let sizing = policy.sizing(false);
    Inputs {
        now: Instant::now(),
        figures: Figures {
            pacing: true,
            pace_user_devices: false,
            sizing,
            fixed_window: policy.initial_window(),
            in_flight_seconds: policy.in_flight_seconds,
            stream_dirty: policy.stream_dirty.0,
            burst: policy.burst.0,
        },
        yield_global: false,
        active: ONE,
        device: DeviceView {
            bw: 200 * MIB,
            capacity: 200 * MIB,
            sampled: true,
            backing: Backing::Disk,
            own_limit: true,
            max_request: 512 << 10,
            fast: false,
            capped_slow: false,
            dirty: 8 * MIB,
            last_event: Instant::now(),
            budget: 0,
            last_busy: None,
            last_small_files: None,
            stalled: false,
        },
        pacer: PacerView {
            dirty_seconds: sizing.map_or(policy.dirty_seconds, |z| z.dirty_seconds),
            is_stalled: false,
            is_paced: false,
        },
    }
}

/// A 2 GiB/s disk (its capacity; the estimate the same unless set).
fn fast_disk() -> Inputs {
    let mut i = disk();
    (i.device.bw, i.device.capacity) = (2 * GIB, 2 * GIB);
    i
}

/// The budget the decision gives `i`'s writers at `sized_by` bytes a second.
fn budget_at(i: &Inputs, sized_by: u64, active: Active) -> u64 {
    let window = decide(i).window;
    bandwidth::dirty_budget(sized_by, i.pacer.dirty_seconds, i.figures.stream_dirty, window, active)
}

fn action(i: &Inputs) -> Action {
    decide(i).action
}

/// A first cap's reason, or None for anything else.
fn capped_why(i: &Inputs) -> Option<&'static str> {
    match action(i) {
        Action::Cap { why, .. } => why,
        _ => None,
    }
}

#[test]
fn a_device_slower_than_fast_device_is_capped_at_a_counted_writers_first_window() {
    let i = disk();
    let budget = budget_at(&i, i.device.bw, ONE);
    assert_eq!(
        action(&i),
        Action::Cap { budget, why: Some("under 1 GiB/s: capped at a writer's first window"), capped_slow: true }
    );
    assert!(!decide(&i).fast);
    // No writer, none lately: nothing to pace.
    let mut idle = disk();
    idle.active = Active::default();
    assert_eq!(action(&idle), Action::Keep);
    // A writer that counted a moment ago (busy) paces it as well.
    idle.device.last_busy = Some(idle.now - Duration::from_millis(500));
    assert!(matches!(action(&idle), Action::Cap { why: Some(_), .. }));
    idle.device.last_busy = Some(idle.now - LINGER);
    assert_eq!(action(&idle), Action::Keep, "LINGER ago: no longer");
}

#[test]
fn a_fast_device_waits_until_its_dirty_pages_pass_outrun_budgets_of_one_writer() {
    let mut i = fast_disk();
    // Ten writers: their budget is not the one that decides.
    i.active = Active { writers: 10, windowed: 10 };
    let one = budget_at(&i, i.device.capacity, ONE);
    i.device.dirty = OUTRUN * one;
    assert_eq!(action(&i), Action::Keep, "its writeback keeps up");
    assert!(decide(&i).fast, "its capacity reached FAST_DEVICE");
    i.device.dirty = OUTRUN * one + 1;
    let budget = budget_at(&i, i.device.capacity, i.active);
    assert_eq!(action(&i), Action::Cap { budget, why: Some("its writeback fell behind"), capped_slow: false });
    // Fast once, fast still: its estimate and capacity may drop under
    // contention, its cap stays sized from what it has shown.
    let mut i = disk();
    i.device.fast = true;
    assert!(decide(&i).fast);
    assert_eq!(action(&i), Action::Keep, "8 MiB dirty: it keeps up");
}

#[test]
fn a_device_capped_while_thought_slow_is_released_once_it_proves_fast() {
    let mut i = fast_disk();
    (i.device.budget, i.device.capped_slow) = (32 * MIB, true);
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Fast });
    // Its writeback behind, it stays capped.
    i.device.dirty = 4 * GIB;
    assert!(!matches!(action(&i), Action::Release { .. }));
    // Capped as a fast device (its writeback fell behind): not released
    // when it catches up, while a writer counts.
    let mut i = fast_disk();
    i.device.budget = budget_at(&i, i.device.capacity, ONE);
    assert_eq!(action(&i), Action::Keep);
}

#[test]
fn small_files_are_capped_at_once_on_a_fast_device_from_its_estimate_not_its_capacity() {
    let mut i = fast_disk();
    i.device.bw = 1536 * MIB;
    i.device.last_small_files = Some(i.now - Duration::from_secs(1));
    let budget = budget_at(&i, i.device.bw, ONE);
    assert_ne!(budget, budget_at(&i, i.device.capacity, ONE));
    assert_eq!(action(&i), Action::Cap { budget, why: Some("a writer of small files"), capped_slow: false });
    // A writer of small files LINGER ago no longer counts as one.
    i.device.last_small_files = Some(i.now - LINGER);
    assert_eq!(action(&i), Action::Keep);
}

#[test]
fn a_device_a_user_made_is_paced_only_under_pace_user_devices() {
    for backing in [Backing::Fuse { user: 1000 }, Backing::UserLoop { user: 1000 }, Backing::Unlisted] {
        let mut i = disk();
        i.device.backing = backing;
        let d = decide(&i);
        assert_eq!(d.action, Action::Keep, "{backing:?}");
        assert!(!d.pacing);
        i.device.budget = 16 * MIB;
        assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced }, "paced before: released");
        i.figures.pace_user_devices = true;
        assert!(matches!(action(&i), Action::Cap { .. } | Action::Keep));
        i.device.budget = 0;
        assert!(matches!(action(&i), Action::Cap { why: Some(_), .. }), "{backing:?} under pace_user_devices");
    }
    // root's FUSE server is not a user's.
    let mut i = disk();
    i.device.backing = Backing::Fuse { user: 0 };
    assert!(matches!(action(&i), Action::Cap { .. }));
}

#[test]
fn a_network_filesystems_windows_and_chunks_are_network_window_seconds_of_its_link_once_timed() {
    let mut i = disk();
    (i.device.bw, i.device.capacity, i.device.backing) = (26 * MIB, 26 * MIB, Backing::Network);
    let quarter = bandwidth::round_pages((26.0 * MIB as f64 * NETWORK_WINDOW_SECONDS) as u64);
    assert!(quarter >= 26 * MIB / 4);
    let d = decide(&i);
    assert_eq!(d.floor, quarter);
    assert!(d.chunk >= quarter && d.window >= quarter, "a COMMIT per quarter second, at most");
    i.device.sampled = false;
    assert_eq!(decide(&i).floor, i.device.max_request, "a link the agent has not timed: as a disk");
    i.device.sampled = true;
    i.device.own_limit = false;
    assert_eq!(decide(&i).floor, i.device.max_request, "under the global limit: as a disk");
    i.device.backing = Backing::Disk;
    i.device.own_limit = true;
    let d = decide(&i);
    assert_eq!(d.floor, i.device.max_request, "a disk: one request");
    assert!(d.chunk < quarter && d.window < quarter);
}

#[test]
fn a_network_filesystems_budget_is_at_least_network_dirty_seconds_of_its_link() {
    let mut i = disk();
    (i.device.bw, i.device.capacity) = (26 * MIB, 26 * MIB);
    // Not yet timed: a disk's windows (a link's are larger, and so is the
    // room for them in the budget).
    i.device.sampled = false;
    i.pacer.dirty_seconds = 0.1;
    let window = decide(&i).window;
    let at = |secs| bandwidth::dirty_budget(26 * MIB, secs, i.figures.stream_dirty, window, ONE);
    assert_ne!(at(0.1), at(NETWORK_DIRTY_SECONDS), "the figures tell the two apart");
    assert!(matches!(action(&i), Action::Cap { budget, .. } if budget == at(0.1)), "a disk: the lever's");
    for backing in [Backing::Network, Backing::Smb] {
        i.device.backing = backing;
        assert!(matches!(action(&i), Action::Cap { budget, .. } if budget == at(NETWORK_DIRTY_SECONDS)));
    }
    // More than that where the lever asks for more.
    i.pacer.dirty_seconds = 1.0;
    assert!(matches!(action(&i), Action::Cap { budget, .. } if budget == at(1.0)));
}

#[test]
fn the_budget_is_not_rewritten_between_two_writers_nor_when_it_moved_within_budget_slack() {
    let mut i = disk();
    let budget = budget_at(&i, i.device.bw, ONE);
    // Moved by BUDGET_SLACK or less: kept, up or down.
    for held in [budget, budget + budget / 20, budget - budget / 20] {
        i.device.budget = held;
        assert_eq!(action(&i), Action::Keep, "held {held}, computed {budget}");
    }
    // More: rewritten, up or down, as the same cap (no first-cap log).
    for held in [budget / 2, budget * 2] {
        i.device.budget = held;
        assert_eq!(action(&i), Action::Cap { budget, why: None, capped_slow: false });
    }
    // Between two writers (LINGER): kept, however far it is from what no
    // writer would get.
    i.active = Active::default();
    i.device.last_busy = Some(i.now - Duration::from_secs(1));
    i.device.budget = budget * 10;
    assert_eq!(action(&i), Action::Keep);
    // Unless the global lever took it back from a stalled device.
    i.pacer.is_stalled = true;
    assert!(matches!(action(&i), Action::Cap { why: None, .. }));
    // The capped_slow it was capped with stays.
    i.device.capped_slow = true;
    assert!(matches!(action(&i), Action::Cap { capped_slow: true, .. }));
}

#[test]
fn a_capped_device_whose_flusher_thread_stalls_holds_its_dirty_pages_or_its_budget() {
    let mut i = disk();
    i.device.stalled = true;
    assert!(matches!(action(&i), Action::Cap { .. }), "not capped yet: capped as any");
    i.device.budget = 16 * MIB;
    assert_eq!(action(&i), Action::Stall { held: 16 * MIB });
    i.device.dirty = 40 * MIB;
    assert_eq!(action(&i), Action::Stall { held: 40 * MIB });
    // Stalled with no writer, still: its writers wait for it.
    i.active = Active::default();
    assert_eq!(action(&i), Action::Stall { held: 40 * MIB });
    i.figures.pacing = false;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced }, "pacing off: released");
}

#[test]
fn nothing_is_paced_through_the_global_limit_while_it_yields() {
    let mut i = disk();
    i.device.own_limit = false;
    assert!(matches!(action(&i), Action::Cap { .. }), "the global lever");
    i.yield_global = true;
    assert_eq!(action(&i), Action::Keep);
    i.pacer.is_paced = true;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced });
    // Its own limit is its own.
    i.device.own_limit = true;
    assert!(matches!(action(&i), Action::Cap { .. }));
    // An SMB share is never paced through the global limit.
    let mut i = disk();
    (i.device.own_limit, i.device.backing) = (false, Backing::Smb);
    assert_eq!(action(&i), Action::Keep);
    i.device.own_limit = true;
    assert!(matches!(action(&i), Action::Cap { .. }), "under its own limit");
}

#[test]
fn a_share_holds_the_global_limit_until_its_pages_could_have_drained() {
    let now = Instant::now() + Duration::from_secs(60);
    // 8 MiB at 2 MiB/s: LINGER and four seconds.
    let held = |ago: u64| not_drained(8 * MIB, 2 * MIB, Some(now - Duration::from_secs(ago)), now);
    assert!(held(0) && held(5));
    assert!(!held(6) && !held(60));
    assert!(!not_drained(8 * MIB, 2 * MIB, None, now), "never written");
    assert!(not_drained(8 * MIB, 0, Some(now - Duration::from_secs(60)), now), "no bandwidth yet");
}

#[test]
fn pacing_off_releases_a_paced_device_and_leaves_others_alone() {
    let mut i = disk();
    i.figures.pacing = false;
    let d = decide(&i);
    assert_eq!(d.action, Action::Keep);
    assert!(!d.pacing);
    i.pacer.is_paced = true;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced }, "paced by an earlier run's journal");
    i.pacer.is_paced = false;
    i.device.budget = 16 * MIB;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced });
    // The first cap of a device keeps the log line's reason.
    assert_eq!(capped_why(&disk()), Some("under 1 GiB/s: capped at a writer's first window"));
}

#[test]
fn bpf_batches_closes_of_a_device_paced_or_never_to_be_and_is_told_what_moved() {
    let asked = || -> bool { panic!("stepped_aside asked although decided") };
    assert!(batch_closes(16 * MIB, true, true, asked), "paced");
    assert!(batch_closes(0, false, true, asked), "not to be paced");
    assert!(batch_closes(0, true, false, asked), "no knobs");
    assert!(batch_closes(0, true, true, || true), "the agent stepped aside");
    assert!(!batch_closes(0, true, true, || false), "to be paced, not yet: closes go to the agent at once");
    let was = Pushed { bw: 100 * MIB, batch: false, floor: MIB, pool: 100 * MIB };
    let told = Some(was);
    assert_eq!(push(told, Pushed { bw: 105 * MIB, ..was }), None, "a twentieth: not worth a write");
    assert_eq!(push(told, Pushed { bw: 95 * MIB, pool: 95 * MIB, ..was }), None);
    let moved = 105 * MIB + 4096;
    assert_eq!(push(told, Pushed { bw: moved, ..was }), Some(Pushed { bw: moved, ..was }));
    assert_eq!(push(told, Pushed { pool: moved, ..was }), Some(Pushed { pool: moved, ..was }));
    assert_eq!(push(told, Pushed { batch: true, ..was }), Some(Pushed { batch: true, ..was }));
    assert_eq!(push(told, Pushed { floor: 2 * MIB, ..was }), Some(Pushed { floor: 2 * MIB, ..was }));
    let new = Some(Pushed::default());
    assert!(push(new, Pushed::default()).is_none() && push(new, Pushed { bw: 1, ..Pushed::default() }).is_some());
    assert_eq!(push(None, was), Some(was), "an insert failed: pushed again");
}

#[test]
fn the_burst_pool_is_half_a_second_of_the_device_and_at_least_one_burst() {
    let burst = Policy::embedded_default().burst.0;
    assert_eq!(pool(100 * MIB, burst), 50 * MIB, "half a second at 100 MiB/s");
    assert_eq!(pool(4 * MIB, burst), burst, "a slow stick: one process's burst");
    // What the tick decides from: its capacity, not its estimate.
    let mut i = fast_disk();
    i.device.bw = 200 * MIB;
    assert_eq!(decide(&i).pool, GIB);
    // Within the 2 s of bandwidth that pacing holds the device to.
    assert!(
        pool(100 * MIB, burst)
            <= bandwidth::dirty_budget(100 * MIB, 0.1, 32 * MIB, 3 * MIB, Active { writers: 30, windowed: 30 })
    );
}

#[test]
fn a_device_holding_more_than_its_pool_is_paced_whoever_wrote_it() {
    // A thousand short-lived writers: none counts at the tick.
    let mut i = disk();
    i.active = Active::default();
    let pool = decide(&i).pool;
    i.device.dirty = pool + MIB;
    let budget = budget_at(&i, i.device.bw, Active::default());
    assert_eq!(
        action(&i),
        Action::Cap { budget, why: Some("under 1 GiB/s: capped at a writer's first window"), capped_slow: true }
    );
    // Paced, it stays so while the device holds more than its pool.
    i.device.budget = budget;
    i.pacer.is_paced = true;
    assert_eq!(action(&i), Action::Keep);
    // Its writers wait under the cap and send no event: paced until what
    // the latest event counted could have drained at its bandwidth.
    i.device.last_event = i.now - LINGER;
    assert_eq!(action(&i), Action::Keep);
    let drain = Duration::from_secs_f64(i.device.dirty as f64 / i.device.bw as f64);
    i.device.last_event = i.now - LINGER - drain;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced });
    // Nor once it holds less.
    i.device.last_event = i.now;
    i.device.dirty = pool;
    assert_eq!(action(&i), Action::Release { why: ReleaseWhy::Unpaced });
}

#[test]
fn only_observing_writers_get_a_would_cap() {
    use super::decide::{Askers, observed};
    let acting = Askers { writers: 2, acting: true, last_acting: true, ..Default::default() };
    assert!(!observed(acting), "an acting writer among them: paced for real");
    assert!(observed(Askers { acting: false, ..acting }), "only observing writers: would pace");
    assert!(observed(Askers { observes_all: true, ..acting }), "a daemon that observes never paces");
    assert!(
        observed(Askers { acting: false, budget: 8 << 20, ..acting }),
        "a real cap ends once only observers need it"
    );
    // No writer counting: what is in force goes on, else the latest writer's way.
    let idle = Askers { writers: 0, ..acting };
    assert!(!observed(Askers { budget: 8 << 20, last_acting: false, ..idle }));
    assert!(observed(Askers { would: 8 << 20, ..idle }));
    assert!(!observed(idle));
    assert!(observed(Askers { last_acting: false, ..idle }));
}
